//! Campanile's embedded store on SQLite.
//!
//! - WAL mode, `synchronous = FULL`: a commit that returned is on disk.
//! - **One writer thread** owns the only write connection. Callers send it jobs; it takes
//!   every job waiting in its queue and runs them together in one `BEGIN IMMEDIATE`
//!   transaction, each job inside its own savepoint, then commits once and answers every
//!   caller after the commit. Many small requests thus cost one fsync (group commit), and no
//!   two writers ever contend for SQLite's lock inside the process.
//! - Read-only connections serve queries concurrently.
//!
//! Time: an operation's `now` is the caller's (tests) or this process's [`Clock`].

mod admin;
mod migrate;
mod ops;
mod pool;
mod schedules;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use campanile_core::{Clock, SystemClock};
use campanile_store::*;
use jiff::Timestamp;
use rusqlite::Connection;
use rusqlite::config::DbConfig;

pub use migrate::MIGRATIONS;
/// The constrained claim's overlap question, for the plan test.
#[doc(hidden)]
pub use ops::OVERLAP_STATE;

/// The embedded SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    writer: writer::Writer,
    readers: pool::ReadPool,
    clock: Arc<dyn Clock>,
    /// The keys of the writer's latest claims that claimed something (used by the writer's
    /// jobs only).
    claim_keys: Arc<std::sync::Mutex<RecentKeys>>,
}

/// The keys of the latest keyed claims that claimed something, at most [`RecentKeys::CAP`]:
/// what a claim sent again asks the writer before it reads what its key holds there.
#[derive(Debug, Default)]
struct RecentKeys {
    keys: std::collections::HashSet<uuid::Uuid>,
    order: std::collections::VecDeque<uuid::Uuid>,
}

impl RecentKeys {
    /// Far more claims than can be queued in the writer between a claim sent again's look-up
    /// on a reader and its own job (one per request waiting): 16 bytes and a hash entry each.
    const CAP: usize = 16_384;

    fn insert(&mut self, key: uuid::Uuid) {
        if self.keys.insert(key) {
            self.order.push_back(key);
            if self.order.len() > Self::CAP
                && let Some(old) = self.order.pop_front()
            {
                self.keys.remove(&old);
            }
        }
    }

    fn contains(&self, key: &uuid::Uuid) -> bool {
        self.keys.contains(key)
    }
}

/// Options for [`SqliteStore::open_with`].
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// The clock used when an operation's `now` is `None`.
    pub clock: Arc<dyn Clock>,
    /// Most jobs the writer folds into one transaction.
    pub max_group: usize,
    /// WAL pages beyond which the writer checkpoints what the background checkpointer has
    /// not copied yet, so that the WAL starts over from its beginning (its size on disk).
    pub wal_restart_pages: i64,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            clock: Arc::new(SystemClock),
            max_group: 512,
            wal_restart_pages: 4096,
        }
    }
}

pub(crate) fn db_err(e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    match e.sqlite_error_code() {
        Some(ErrorCode::ConstraintViolation) => StoreError::AlreadyExists(e.to_string()),
        Some(
            ErrorCode::CannotOpen
            | ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::SystemIoFailure
            | ErrorCode::DiskFull
            | ErrorCode::ReadOnly,
        ) => StoreError::Unavailable(e.to_string()),
        _ => StoreError::Database(e.to_string()),
    }
}

/// Turns on SQLite's query planner stability guarantee: a statement's plan does not depend on
/// the values bound to it. Without it, SQLite marks a statement whose `LIMIT ?` (or a
/// parameter compared with a partial index's condition) it planned with the bound value as
/// expired whenever its bindings are cleared — which rusqlite's statement cache does each time
/// a statement goes back — so every claim would be parsed and planned again on every use, 13%
/// of all CPU samples in a batch-1 drain (docs/DESIGN.md, "Why the query planner stability
/// guarantee on SQLite?").
pub(crate) fn stable_plans(conn: &Connection) -> Result<(), StoreError> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map(drop)
        .map_err(db_err)
}

pub(crate) fn configure(conn: &Connection) -> Result<(), StoreError> {
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(db_err)?;
    stable_plans(conn)?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = FULL;
         PRAGMA foreign_keys = OFF;
         PRAGMA temp_store = MEMORY;
         PRAGMA cache_size = -65536;
         PRAGMA mmap_size = 1073741824;",
    )
    .map_err(db_err)
}

/// Creates the database file, if there is none, readable and writable by its owner only
/// (mode 0600): it holds API key hashes and every payload. SQLite gives its `-wal` and `-shm`
/// files the main file's mode. A file that exists keeps its mode; a name SQLite does not read
/// as a file path (`:memory:`, a `file:` URI) is left to SQLite, as is any failure here (SQLite
/// then reports its own).
fn create_private(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let name = path.as_os_str();
        let special =
            name.is_empty() || name == ":memory:" || name.as_encoded_bytes().starts_with(b"file:");
        if !special {
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path);
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

impl SqliteStore {
    /// Opens (creating if needed, mode 0600 on Unix) the database at `path` and applies pending migrations.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] if the file cannot be opened; [`StoreError::Migration`] if
    /// the schema is newer than this binary or a migration fails.
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(path, SqliteOptions::default())
    }

    /// [`SqliteStore::open`] with options.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::open`].
    pub fn open_with(
        path: impl AsRef<Path>,
        opts: SqliteOptions,
    ) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        if opts.wal_restart_pages <= 0 {
            // Zero or less would turn the writer's checkpoint off: the WAL would grow forever.
            return Err(StoreError::Invalid(format!(
                "wal_restart_pages must be positive, not {}",
                opts.wal_restart_pages
            )));
        }
        create_private(&path);
        let mut conn = Connection::open(&path).map_err(db_err)?;
        configure(&conn)?;
        migrate::apply(&mut conn)?;
        let checkpoints = Connection::open(&path).map_err(db_err)?;
        configure(&checkpoints)?;
        let writer =
            writer::Writer::start(conn, checkpoints, opts.max_group, opts.wal_restart_pages)?;
        let readers = pool::ReadPool::new(path.clone());
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                writer,
                readers,
                clock: opts.clock,
                claim_keys: Arc::default(),
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    fn now(&self, now: Option<Timestamp>) -> i64 {
        now.unwrap_or_else(|| self.inner.clock.now())
            .as_millisecond()
    }

    /// [`SqliteStore::now`], read when the returned function is called — in the writer, for a
    /// claim: one that waited (behind a long job) is judged by the liveness gate, and leased,
    /// as of when it runs, not when it was queued.
    fn now_when_run(&self, now: Option<Timestamp>) -> impl FnOnce() -> i64 + Send + 'static {
        let clock = self.inner.clock.clone();
        move || now.unwrap_or_else(|| clock.now()).as_millisecond()
    }

    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.inner.writer.run(f).await
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let readers = self.inner.readers.clone();
        tokio::task::spawn_blocking(move || readers.with(f))
            .await
            .map_err(|e| StoreError::Database(format!("reader task failed: {e}")))?
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn tenant_create(&self, p: TenantCreate) -> Result<Tenant, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| ops::tenant_create(c, &p.name, now))
            .await
    }

    async fn schedule_create(&self, p: ScheduleCreate) -> Result<(), StoreError> {
        let now = self.now(p.now);
        self.write(move |c| ops::schedule_create(c, &p, now)).await
    }

    async fn schedule_create_many(&self, p: ScheduleCreateMany) -> Result<u64, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| schedules::schedule_create_many(c, &p, now))
            .await
    }

    async fn occurrence_insert_many(&self, p: OccurrenceInsertMany) -> Result<u64, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| ops::occurrence_insert_many(c, &p, now))
            .await
    }

    async fn occurrence_claim(&self, p: OccurrenceClaim) -> Result<Vec<Claimed>, StoreError> {
        if p.lease.is_some_and(|l| l <= jiff::SignedDuration::ZERO) {
            return Err(StoreError::Invalid("lease must be positive".into()));
        }
        if p.max == 0 {
            return Ok(Vec::new());
        }
        // A claim sent again: what its key holds comes first, read on a reader (a first
        // sending that has committed is visible there) so that the writer does not pay for it.
        let resent = p.key.filter(|k| k.resent);
        if resent.is_some() {
            let held = self.occurrence_claimed_with_key(p.clone()).await?;
            if !held.is_empty() {
                return Ok(held);
            }
        }
        let now = self.now_when_run(p.now);
        let recent = Arc::clone(&self.inner.claim_keys);
        let claims = self
            .write(move |c| {
                let now = now();
                let mut recent = recent.lock().unwrap_or_else(|e| e.into_inner());
                // The reader found nothing, but the first sending may have been waiting for
                // the writer then (the worker gave up on its answer while it was queued behind
                // a long planning commit, say) and have claimed since, ahead of this job: if
                // its key claimed lately, look again here, where that claim is visible.
                // Otherwise what it claimed would lie leased to nobody until its lease ended.
                if let Some(key) = resent.filter(|k| recent.contains(&k.id)) {
                    let held = ops::claimed_with_key(c, &p, key.id, now)?;
                    if !held.is_empty() {
                        return Ok(held);
                    }
                }
                let claims = ops::occurrence_claim(c, &p, now)?;
                if let Some(key) = p.key.filter(|_| !claims.is_empty()) {
                    recent.insert(key.id);
                }
                Ok(claims)
            })
            .await?;
        if claims.is_empty() {
            return Ok(claims);
        }
        // Payloads on a reader, in parallel with the writer's next job (the writer bounds the
        // peak's drain, so it does not wait for them). Should this read fail, the claims are committed but not
        // delivered: their leases expire and they run again, as after a lost response.
        self.read(move |c| {
            let mut claims = claims;
            ops::fill_payloads(c, &mut claims)?;
            Ok(claims)
        })
        .await
    }

    async fn occurrence_claimed_with_key(
        &self,
        p: OccurrenceClaim,
    ) -> Result<Vec<Claimed>, StoreError> {
        let Some(key) = p.key.filter(|k| k.resent) else {
            return Ok(Vec::new());
        };
        let now = self.now(p.now);
        // A reader sees every committed claim: the key's rows, if any, are in.
        self.read(move |c| {
            let mut held = ops::claimed_with_key(c, &p, key.id, now)?;
            ops::fill_payloads(c, &mut held)?;
            Ok(held)
        })
        .await
    }

    async fn relay_claim(&self, p: RelayClaim) -> Result<Vec<Relayed>, StoreError> {
        if p.lease <= jiff::SignedDuration::ZERO {
            return Err(StoreError::Invalid("lease must be positive".into()));
        }
        if p.max == 0 {
            return Ok(Vec::new());
        }
        let now = self.now_when_run(p.now);
        let relayed = self.write(move |c| ops::relay_claim(c, &p, now())).await?;
        if relayed.is_empty() {
            return Ok(relayed);
        }
        // Payloads on a reader, as for worker claims.
        let (routes, mut claims): (Vec<_>, Vec<_>) = relayed
            .into_iter()
            .map(|r| ((r.tenant, r.target), r.claim))
            .unzip();
        self.read(move |c| {
            ops::fill_payloads(c, &mut claims)?;
            Ok(routes
                .into_iter()
                .zip(claims)
                .map(|((tenant, target), claim)| Relayed {
                    tenant,
                    target,
                    claim,
                })
                .collect())
        })
        .await
    }

    async fn lease_renew(&self, p: LeaseRenew) -> Result<Vec<Renewal>, StoreError> {
        let now = self.now(p.now);
        if p.lease.is_some_and(|l| l <= jiff::SignedDuration::ZERO) {
            return Err(StoreError::Invalid("lease must be positive".into()));
        }
        self.write(move |c| ops::lease_renew(c, &p, now)).await
    }

    async fn occurrence_finish_many(
        &self,
        p: OccurrenceFinishMany,
    ) -> Result<Vec<Ack>, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| ops::occurrence_finish_many(c, &p, now))
            .await
    }

    async fn occurrence_cancel(&self, p: OccurrenceCancel) -> Result<Ack, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| ops::occurrence_cancel(c, &p, now))
            .await
    }

    async fn occurrence_redrive(&self, p: OccurrenceRedrive) -> Result<Ack, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| ops::occurrence_redrive(c, &p, now))
            .await
    }

    async fn lease_sweep(&self, p: LeaseSweep) -> Result<SweepReport, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| ops::lease_sweep(c, p.limit, now)).await
    }

    async fn occurrence_get(
        &self,
        p: OccurrenceGet,
    ) -> Result<Option<OccurrenceDetail>, StoreError> {
        let now = self.now(p.now);
        self.read(move |c| ops::occurrence_get(c, &p, now)).await
    }

    async fn occurrence_list(&self, p: OccurrenceList) -> Result<Vec<Occurrence>, StoreError> {
        let now = self.now(p.now);
        self.read(move |c| ops::occurrence_list(c, &p, now)).await
    }

    async fn store_now(&self) -> Result<Timestamp, StoreError> {
        Ok(self.inner.clock.now())
    }

    async fn schedule_position(
        &self,
        tenant: TenantId,
        id: campanile_core::ScheduleId,
    ) -> Result<Option<Timestamp>, StoreError> {
        self.read(move |c| schedules::schedule_position(c, tenant, id))
            .await
    }

    async fn schedule_get(&self, p: ScheduleGet) -> Result<Option<ScheduleRecord>, StoreError> {
        self.read(move |c| schedules::schedule_get(c, p.tenant, p.id))
            .await
    }

    async fn schedule_update(&self, p: ScheduleUpdate) -> Result<ScheduleChange, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| schedules::schedule_update(c, &p, now))
            .await
    }

    async fn schedule_transition(
        &self,
        p: ScheduleTransition,
    ) -> Result<ScheduleChange, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| schedules::schedule_transition(c, &p, now))
            .await
    }

    async fn schedule_due(&self, p: ScheduleDueList) -> Result<Vec<DueSchedule>, StoreError> {
        self.read(move |c| schedules::schedule_due(c, &p)).await
    }

    async fn deployment_shards(&self, shards: u32) -> Result<u32, StoreError> {
        let now = self.now(None);
        self.write(move |c| ops::deployment_shards(c, shards, now))
            .await
    }

    async fn backlog(&self, now: Option<Timestamp>) -> Result<Backlog, StoreError> {
        let now = self.now(now);
        self.read(move |c| ops::backlog(c, now)).await
    }

    async fn schedule_next_due(&self, shards: &[i32]) -> Result<Option<Timestamp>, StoreError> {
        let shards = shards.to_vec();
        self.read(move |c| schedules::schedule_next_due(c, &shards))
            .await
    }

    async fn plan_commit(&self, p: PlanCommit) -> Result<PlanReport, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| schedules::plan_commit(c, &p, now))
            .await
    }

    async fn shard_acquire(&self, p: ShardAcquire) -> Result<ShardAcquired, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| schedules::shard_acquire(c, &p, now))
            .await
    }

    async fn shard_release(&self, p: ShardRelease) -> Result<u64, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| schedules::shard_release(c, &p, now))
            .await
    }

    async fn store_ping(&self) -> Result<(), StoreError> {
        self.read(|c| c.query_row("SELECT 1", [], |_| Ok(())).map_err(db_err))
            .await
    }

    async fn tenant_list(&self) -> Result<Vec<Tenant>, StoreError> {
        self.read(admin::tenant_list).await
    }

    async fn tenant_by_name(&self, name: &str) -> Result<Option<Tenant>, StoreError> {
        let name = name.to_string();
        self.read(move |c| admin::tenant_by_name(c, &name)).await
    }

    async fn api_key_create(&self, p: ApiKeyCreate) -> Result<ApiKeyRecord, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| admin::api_key_create(c, &p, now)).await
    }

    async fn api_key_find(&self, hash: &[u8]) -> Result<Option<ApiKeyRecord>, StoreError> {
        let hash = hash.to_vec();
        self.read(move |c| admin::api_key_find(c, &hash)).await
    }

    async fn api_key_revoke(
        &self,
        prefix: &str,
        now: Option<Timestamp>,
    ) -> Result<u64, StoreError> {
        let now = self.now(now);
        let prefix = prefix.to_string();
        self.write(move |c| admin::api_key_revoke(c, &prefix, now))
            .await
    }

    async fn schedule_list(&self, p: ScheduleList) -> Result<Vec<ScheduleRecord>, StoreError> {
        self.read(move |c| admin::schedule_list(c, &p)).await
    }

    async fn idempotency_get(
        &self,
        tenant: TenantId,
        key: &str,
    ) -> Result<Option<IdempotentResponse>, StoreError> {
        let key = key.to_string();
        self.read(move |c| admin::idempotency_get(c, tenant, &key))
            .await
    }

    async fn idempotency_put(&self, p: IdempotencyPut) -> Result<bool, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| admin::idempotency_put(c, &p, now))
            .await
    }

    async fn idempotency_finish(
        &self,
        tenant: TenantId,
        key: &str,
        token: &str,
        answer: Option<(u16, String)>,
    ) -> Result<(), StoreError> {
        let (key, token) = (key.to_string(), token.to_string());
        self.write(move |c| admin::idempotency_finish(c, tenant, &key, &token, answer))
            .await
    }

    async fn tenant_quota_get(&self, tenant: TenantId) -> Result<TenantQuota, StoreError> {
        self.read(move |c| admin::tenant_quota_get(c, tenant)).await
    }

    async fn tenant_quota_set(&self, p: TenantQuota) -> Result<(), StoreError> {
        self.write(move |c| admin::tenant_quota_set(c, &p)).await
    }

    async fn tenant_class_set(&self, p: TenantClassSet) -> Result<(), StoreError> {
        self.write(move |c| admin::tenant_class_set(c, &p)).await
    }

    async fn queue_limit_set(
        &self,
        tenant: TenantId,
        queue: &str,
        max_running: Option<i64>,
    ) -> Result<(), StoreError> {
        let queue = queue.to_string();
        self.write(move |c| admin::queue_limit_set(c, tenant, &queue, max_running))
            .await
    }

    async fn missed_range_list(&self, p: MissedRangeList) -> Result<Vec<MissedRange>, StoreError> {
        self.read(move |c| schedules::missed_range_list(c, &p))
            .await
    }

    async fn schedule_versions(&self, p: ScheduleGet) -> Result<Vec<ScheduleVersion>, StoreError> {
        self.read(move |c| schedules::schedule_versions(c, p.tenant, p.id))
            .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::task::{Context, Poll, Waker};

    use campanile_core::OccurrenceState;
    use campanile_store::conformance::{claim_params, fixture, insert, new_occ, secs, spec};

    use super::*;

    /// Holds the writer with a job that waits until the returned sender is used; the handle
    /// ends with that job.
    async fn hold_writer(
        store: &SqliteStore,
    ) -> (
        std::sync::mpsc::Sender<()>,
        tokio::task::JoinHandle<Result<(), StoreError>>,
    ) {
        let (let_go, wait) = std::sync::mpsc::channel::<()>();
        let (running, is_running) = tokio::sync::oneshot::channel::<()>();
        let holder = store.clone();
        let held = tokio::spawn(async move {
            holder
                .write(move |_| {
                    let _ = running.send(());
                    let _ = wait.recv();
                    Ok(())
                })
                .await
        });
        is_running.await.unwrap();
        (let_go, held)
    }

    /// The writer remembers the latest keys only: past the cap the oldest is forgotten (a key
    /// entered twice counts once).
    #[test]
    fn recent_claim_keys_are_bounded() {
        let mut recent = RecentKeys::default();
        let keys: Vec<uuid::Uuid> = (0..=RecentKeys::CAP as u128)
            .map(uuid::Uuid::from_u128)
            .collect();
        recent.insert(keys[0]);
        for k in &keys {
            recent.insert(*k);
        }
        assert!(!recent.contains(&keys[0]), "the oldest is forgotten");
        assert!(recent.contains(&keys[1]) && recent.contains(&keys[RecentKeys::CAP]));
        assert_eq!(
            (recent.keys.len(), recent.order.len()),
            (RecentKeys::CAP, RecentKeys::CAP)
        );
    }

    /// A claim sent again while its first sending still waits for the writer (the worker gave
    /// up on the answer first, as a client whose timeout ran out behind a long planning commit
    /// does) answers what that first sending claimed, once it has claimed it, and claims
    /// nothing more: nothing lies leased to a worker that never heard of it.
    #[test]
    fn a_claim_sent_again_behind_its_first_sending_answers_what_that_claimed() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let store = SqliteStore::open(dir.path().join("k.db")).unwrap();
            let f = fixture(&store, "t", "q").await;
            let ids = insert(
                &store,
                &f,
                (0..4).map(|i| new_occ(&f, "q", secs(i), 3)).collect(),
            )
            .await;

            // The writer is held up by a job that waits to be let go.
            let (let_go, held) = hold_writer(&store).await;
            let key = uuid::Uuid::new_v4();
            let claim = |resent| {
                let key = Some(ClaimKey { id: key, resent });
                claim_params(&f, "q", "w", 2, None, key, secs(10))
            };
            // Polled once each: the first sending's job is queued behind the held writer,
            // then the worker, having had no answer, sends the claim again.
            let mut cx = Context::from_waker(Waker::noop());
            let mut first = store.occurrence_claim(claim(false));
            assert!(matches!(first.as_mut().poll(&mut cx), Poll::Pending));
            let mut again = store.occurrence_claim(claim(true));
            assert!(matches!(again.as_mut().poll(&mut cx), Poll::Pending));
            let_go.send(()).unwrap();
            held.await.unwrap().unwrap();
            let (first, again) = tokio::join!(first, again);
            let (first, again) = (first.unwrap(), again.unwrap());
            let terms = |c: &[Claimed]| -> Vec<_> {
                c.iter().map(|c| (c.id, c.epoch, c.lease_until)).collect()
            };
            assert_eq!(first.iter().map(|c| c.id).collect::<Vec<_>>(), ids[..2]);
            assert_eq!(
                terms(&again),
                terms(&first),
                "the same occurrences, as claimed"
            );
            assert!(again.iter().all(|c| c.replayed) && first.iter().all(|c| !c.replayed));
            assert!(again.iter().all(|c| c.payload == spec("q").payload));
            let running = store
                .occurrence_list(OccurrenceList {
                    tenant: f.tenant,
                    state: Some(OccurrenceState::Running),
                    limit: 10,
                    ..Default::default()
                })
                .await
                .unwrap();
            assert_eq!(running.len(), 2, "nothing more was claimed: {running:?}");
        });
    }

    /// Judges nothing missed (the tests below start no outage).
    struct NoMisses;

    impl PrePlannedJudge for NoMisses {
        fn missed(&self, _: &PrePlanned<'_>) -> Vec<jiff::Timestamp> {
            Vec::new()
        }
    }

    /// A schedule change and a planning commit sent while the writer is busy never
    /// interleave: the writer runs each job whole, in the order they were sent. A commit
    /// queued first is retired by the pause after it (its occurrence canceled, its queue entry
    /// taken out); a commit queued after the pause is refused, and writes nothing.
    #[test]
    fn a_pause_and_a_planning_commit_never_interleave() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for commit_first in [true, false] {
                let dir = tempfile::tempdir().unwrap();
                let store = SqliteStore::open(dir.path().join("p.db")).unwrap();
                let tenant = store
                    .tenant_create(TenantCreate {
                        name: "t".into(),
                        now: Some(secs(0)),
                    })
                    .await
                    .unwrap()
                    .id;
                let id = campanile_core::ScheduleId(uuid::Uuid::now_v7());
                store
                    .schedule_create(ScheduleCreate {
                        tenant,
                        id,
                        spec: spec("q"),
                        shard: 0,
                        next_run_at: Some(secs(60)),
                        fires_per_hour: 60,
                        idempotency: None,
                        now: Some(secs(0)),
                    })
                    .await
                    .unwrap();
                let lease = store
                    .shard_acquire(ShardAcquire {
                        node: "n".into(),
                        total: 1,
                        lease: jiff::SignedDuration::from_hours(1),
                        judge: std::sync::Arc::new(NoMisses),
                        now: Some(secs(1)),
                    })
                    .await
                    .unwrap()
                    .leases[0];
                let fixture = campanile_store::conformance::Fixture {
                    tenant,
                    schedule: id,
                };
                let commit = PlanCommit {
                    node: "n".into(),
                    shard: 0,
                    shard_epoch: lease.epoch,
                    items: std::sync::Arc::from(vec![PlanItem {
                        tenant,
                        schedule_id: id,
                        version: 1,
                        expected_next_run_at: secs(60),
                        next_run_at: Some(secs(120)),
                        occurrences: vec![new_occ(&fixture, "q", secs(60), 3)],
                        missed: None,
                    }]),
                    now: Some(secs(2)),
                };
                let pause = ScheduleTransition {
                    tenant,
                    id,
                    to: ScheduleState::Paused,
                    superseded: Superseded::default(),
                    now: Some(secs(3)),
                };

                let (let_go, held) = hold_writer(&store).await;
                // Each sent (queued behind the held writer) in the order under test.
                let mut cx = Context::from_waker(Waker::noop());
                let (mut planning, mut pausing) = if commit_first {
                    let mut planning = store.plan_commit(commit);
                    assert!(planning.as_mut().poll(&mut cx).is_pending());
                    let mut pausing = store.schedule_transition(pause);
                    assert!(pausing.as_mut().poll(&mut cx).is_pending());
                    (planning, pausing)
                } else {
                    let mut pausing = store.schedule_transition(pause);
                    assert!(pausing.as_mut().poll(&mut cx).is_pending());
                    let mut planning = store.plan_commit(commit);
                    assert!(planning.as_mut().poll(&mut cx).is_pending());
                    (planning, pausing)
                };
                let_go.send(()).unwrap();
                held.await.unwrap().unwrap();
                let (planned, paused) = tokio::join!(planning.as_mut(), pausing.as_mut());
                let (planned, paused) = (planned.unwrap(), paused.unwrap());
                assert_eq!(paused.schedule.version, 2);
                let occurrences = store
                    .occurrence_list(OccurrenceList {
                        tenant,
                        schedule_id: Some(id),
                        limit: 10,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                if commit_first {
                    assert_eq!((planned.applied, paused.canceled), (1, 1));
                    assert_eq!(occurrences.len(), 1);
                    assert_eq!(occurrences[0].state, OccurrenceState::Canceled);
                } else {
                    assert_eq!((planned.applied, planned.refused), (0, vec![id]));
                    assert!(occurrences.is_empty(), "{occurrences:?}");
                }
                let queued: i64 = store
                    .read(move |c| {
                        c.query_row(
                            "SELECT count(*) FROM schedule_queue WHERE schedule_id = ?1",
                            [id.0],
                            |r| r.get(0),
                        )
                        .map_err(db_err)
                    })
                    .await
                    .unwrap();
                assert_eq!(queued, 0, "a paused schedule has no queue entry");
            }
        });
    }
}
