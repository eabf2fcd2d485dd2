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

mod api_key;
mod attempt;
mod backfill;
mod claim;
mod connection;
mod db;
mod fenced;
mod finish;
mod idempotency;
mod lease;
mod migrate;
mod occurrence;
mod overview;
mod planning;
mod pool;
mod queue;
mod relay;
mod retention;
mod schedule;
mod tenant;
mod trigger;
mod version;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use campanile_core::{Clock, SystemClock};
use campanile_store::*;
use jiff::Timestamp;
use rusqlite::Connection;

use crate::connection::{configure, create_private};
use crate::db::db_err;

/// The constrained claim's overlap question, for the plan test.
#[doc(hidden)]
pub use claim::OVERLAP_STATE;
pub use migrate::MIGRATIONS;

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
    /// The row numbers of occurrences the writer's claims handed out (used by the writer's
    /// jobs only).
    row_numbers: Arc<std::sync::Mutex<finish::RowNumbers>>,
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
        // Room for every statement the writer runs on its hot paths (a claim's and a report's
        // alone are about 16, rusqlite's default) without evicting one another.
        conn.set_prepared_statement_cache_capacity(64);
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
                row_numbers: Arc::default(),
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
        self.write(move |c| tenant::tenant_create(c, &p.name, now))
            .await
    }

    async fn schedule_create(&self, p: ScheduleCreate) -> Result<(), StoreError> {
        let now = self.now(p.now);
        self.write(move |c| schedule::schedule_create(c, &p, now))
            .await
    }

    async fn schedule_create_many(&self, p: ScheduleCreateMany) -> Result<u64, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| schedule::schedule_create_many(c, &p, now))
            .await
    }

    async fn occurrence_insert_many(&self, p: OccurrenceInsertMany) -> Result<u64, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| occurrence::occurrence_insert_many(c, &p, now))
            .await
    }

    async fn occurrence_claim(&self, p: OccurrenceClaim) -> Result<Vec<Claimed>, StoreError> {
        rules::check_claim(&p)?;
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
        let numbers = Arc::clone(&self.inner.row_numbers);
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
                    let held = claim::claimed_with_key(c, &p, key.id, now)?;
                    if !held.is_empty() {
                        return Ok(held);
                    }
                }
                let mut numbers = numbers.lock().unwrap_or_else(|e| e.into_inner());
                let claims = claim::occurrence_claim(c, &p, now, &mut numbers)?;
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
            claim::fill_payloads(c, &mut claims)?;
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
            let mut held = claim::claimed_with_key(c, &p, key.id, now)?;
            claim::fill_payloads(c, &mut held)?;
            Ok(held)
        })
        .await
    }

    async fn relay_claim(&self, p: RelayClaim) -> Result<Vec<Relayed>, StoreError> {
        rules::check_lease(Some(p.lease))?;
        if p.max == 0 {
            return Ok(Vec::new());
        }
        let now = self.now_when_run(p.now);
        let relayed = self
            .write(move |c| relay::relay_claim(c, &p, now()))
            .await?;
        if relayed.is_empty() {
            return Ok(relayed);
        }
        // Payloads on a reader, as for worker claims.
        let (routes, mut claims): (Vec<_>, Vec<_>) = relayed
            .into_iter()
            .map(|r| ((r.tenant, r.target), r.claim))
            .unzip();
        self.read(move |c| {
            claim::fill_payloads(c, &mut claims)?;
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
        rules::check_renew(&p)?;
        self.write(move |c| lease::lease_renew(c, &p, now)).await
    }

    async fn occurrence_finish_many(
        &self,
        p: OccurrenceFinishMany,
    ) -> Result<Vec<Ack>, StoreError> {
        rules::check_finish(&p)?;
        let now = self.now(p.now);
        let numbers = Arc::clone(&self.inner.row_numbers);
        self.write(move |c| {
            let mut numbers = numbers.lock().unwrap_or_else(|e| e.into_inner());
            finish::occurrence_finish_many(c, &p, now, &mut numbers)
        })
        .await
    }

    async fn occurrence_cancel(&self, p: OccurrenceCancel) -> Result<Ack, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| finish::occurrence_cancel(c, &p, now))
            .await
    }

    async fn occurrence_redrive(&self, p: OccurrenceRedrive) -> Result<Ack, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| finish::occurrence_redrive(c, &p, now))
            .await
    }

    async fn lease_sweep(&self, p: LeaseSweep) -> Result<SweepReport, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| lease::lease_sweep(c, p.limit, now))
            .await
    }

    async fn occurrence_get(
        &self,
        p: OccurrenceGet,
    ) -> Result<Option<OccurrenceDetail>, StoreError> {
        let now = self.now(p.now);
        self.read(move |c| occurrence::occurrence_get(c, &p, now))
            .await
    }

    async fn occurrence_list(&self, p: OccurrenceList) -> Result<Vec<Occurrence>, StoreError> {
        let now = self.now(p.now);
        self.read(move |c| occurrence::occurrence_list(c, &p, now))
            .await
    }

    async fn store_now(&self) -> Result<Timestamp, StoreError> {
        Ok(self.inner.clock.now())
    }

    async fn schedule_position(
        &self,
        p: SchedulePosition,
    ) -> Result<Option<Timestamp>, StoreError> {
        let SchedulePosition { tenant, id } = p;
        self.read(move |c| schedule::schedule_position(c, tenant, id))
            .await
    }

    async fn schedule_get(&self, p: ScheduleGet) -> Result<Option<ScheduleRecord>, StoreError> {
        self.read(move |c| version::schedule_get(c, p.tenant, p.id))
            .await
    }

    async fn schedule_update(&self, p: ScheduleUpdate) -> Result<ScheduleChange, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| schedule::schedule_update(c, &p, now))
            .await
    }

    async fn schedule_transition(
        &self,
        p: ScheduleTransition,
    ) -> Result<ScheduleChange, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| schedule::schedule_transition(c, &p, now))
            .await
    }

    async fn schedule_due(&self, p: ScheduleDueList) -> Result<Vec<DueSchedule>, StoreError> {
        self.read(move |c| planning::schedule_due(c, &p)).await
    }

    async fn deployment_shards(&self, p: DeploymentShards) -> Result<u32, StoreError> {
        let DeploymentShards { shards } = p;
        let now = self.now(None);
        self.write(move |c| planning::deployment_shards(c, shards, now))
            .await
    }

    async fn backlog(&self, p: BacklogGet) -> Result<Backlog, StoreError> {
        let BacklogGet { now } = p;
        let now = self.now(now);
        self.read(move |c| occurrence::backlog(c, now)).await
    }

    async fn schedule_next_due(&self, p: ScheduleNextDue) -> Result<Option<Timestamp>, StoreError> {
        let ScheduleNextDue { shards } = p;
        self.read(move |c| planning::schedule_next_due(c, &shards))
            .await
    }

    async fn plan_commit(&self, p: PlanCommit) -> Result<PlanReport, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| planning::plan_commit(c, &p, now)).await
    }

    async fn shard_acquire(&self, p: ShardAcquire) -> Result<ShardAcquired, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| planning::shard_acquire(c, &p, now))
            .await
    }

    async fn shard_release(&self, p: ShardRelease) -> Result<u64, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| planning::shard_release(c, &p, now))
            .await
    }

    async fn store_ping(&self) -> Result<(), StoreError> {
        self.read(|c| c.query_row("SELECT 1", [], |_| Ok(())).map_err(db_err))
            .await
    }

    async fn tenant_list(&self) -> Result<Vec<Tenant>, StoreError> {
        self.read(tenant::tenant_list).await
    }

    async fn tenant_by_name(&self, p: TenantByName) -> Result<Option<Tenant>, StoreError> {
        let TenantByName { name } = p;
        self.read(move |c| tenant::tenant_by_name(c, &name)).await
    }

    async fn api_key_create(&self, p: ApiKeyCreate) -> Result<ApiKeyRecord, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| api_key::api_key_create(c, &p, now))
            .await
    }

    async fn api_key_find(&self, p: ApiKeyFind) -> Result<Option<ApiKeyRecord>, StoreError> {
        let ApiKeyFind { hash } = p;
        self.read(move |c| api_key::api_key_find(c, &hash)).await
    }

    async fn api_key_revoke(&self, p: ApiKeyRevoke) -> Result<u64, StoreError> {
        let ApiKeyRevoke { prefix, now } = p;
        let now = self.now(now);
        self.write(move |c| api_key::api_key_revoke(c, &prefix, now))
            .await
    }

    async fn schedule_list(&self, p: ScheduleList) -> Result<Vec<ScheduleRecord>, StoreError> {
        self.read(move |c| schedule::schedule_list(c, &p)).await
    }

    async fn idempotency_get(
        &self,
        p: IdempotencyGet,
    ) -> Result<Option<IdempotentResponse>, StoreError> {
        let IdempotencyGet { tenant, key } = p;
        self.read(move |c| idempotency::idempotency_get(c, tenant, &key))
            .await
    }

    async fn idempotency_put(&self, p: IdempotencyPut) -> Result<bool, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| idempotency::idempotency_put(c, &p, now))
            .await
    }

    async fn idempotency_finish(&self, p: IdempotencyFinish) -> Result<(), StoreError> {
        let IdempotencyFinish {
            tenant,
            key,
            token,
            answer,
        } = p;
        self.write(move |c| idempotency::idempotency_finish(c, tenant, &key, &token, answer))
            .await
    }

    async fn tenant_quota_get(&self, p: TenantQuotaGet) -> Result<TenantQuota, StoreError> {
        let TenantQuotaGet { tenant } = p;
        self.read(move |c| tenant::tenant_quota_get(c, tenant))
            .await
    }

    async fn tenant_quota_set(&self, p: TenantQuota) -> Result<(), StoreError> {
        self.write(move |c| tenant::tenant_quota_set(c, &p)).await
    }

    async fn overview(&self, p: OverviewGet) -> Result<Overview, StoreError> {
        let now = self.now(p.now);
        self.read(move |c| overview::overview(c, &p, now)).await
    }

    async fn tenant_catchup_reserve(
        &self,
        p: CatchupReserve,
    ) -> Result<Option<CatchupSlots>, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| tenant::catchup_reserve(c, p.tenant, p.count, now))
            .await
    }

    async fn tenant_class_set(&self, p: TenantClassSet) -> Result<(), StoreError> {
        self.write(move |c| tenant::tenant_class_set(c, &p)).await
    }

    async fn queue_limit_set(&self, p: QueueLimitSet) -> Result<(), StoreError> {
        let QueueLimitSet {
            tenant,
            queue,
            max_running,
        } = p;
        self.write(move |c| tenant::queue_limit_set(c, tenant, &queue, max_running))
            .await
    }

    async fn queue_limit_list(&self, p: QueueLimitList) -> Result<Vec<QueueLimit>, StoreError> {
        self.read(move |c| tenant::queue_limit_list(c, p.tenant))
            .await
    }

    async fn missed_range_list(&self, p: MissedRangeList) -> Result<Vec<MissedRange>, StoreError> {
        self.read(move |c| planning::missed_range_list(c, &p)).await
    }

    async fn schedule_versions(&self, p: ScheduleGet) -> Result<Vec<ScheduleVersion>, StoreError> {
        self.read(move |c| version::schedule_versions(c, p.tenant, p.id))
            .await
    }

    async fn schedule_trigger(&self, p: ScheduleTrigger) -> Result<Triggered, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| trigger::schedule_trigger(c, &p, now))
            .await
    }

    async fn schedule_backfill(&self, p: ScheduleBackfill) -> Result<Backfilled, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| backfill::schedule_backfill(c, &p, now))
            .await
    }

    async fn tenant_retention_set(&self, p: TenantRetentionSet) -> Result<(), StoreError> {
        self.write(move |c| retention::tenant_retention_set(c, &p))
            .await
    }

    async fn retention_batch_open(
        &self,
        p: RetentionBatchOpen,
    ) -> Result<RetentionScan, StoreError> {
        let now = self.now(p.now);
        // Chosen (and recorded) on the writer; read on a reader, off the writer.
        let (opened, scanned_to, busy) = self
            .write(move |c| retention::batch_open(c, &p, now))
            .await?;
        let Some(open) = opened else {
            return Ok(RetentionScan {
                batch: None,
                scanned_to,
                busy,
            });
        };
        let ids = open.ids;
        let items = self
            .read(move |c| retention::read_retired(c, &ids, now))
            .await?;
        Ok(RetentionScan {
            batch: Some(RetentionBatch {
                id: open.id,
                resumed: open.resumed,
                abandoned: open.abandoned,
                items,
            }),
            scanned_to,
            busy,
        })
    }

    async fn retention_batch_close(
        &self,
        p: RetentionBatchClose,
    ) -> Result<RetentionClosed, StoreError> {
        let now = self.now(p.now);
        self.write(move |c| retention::batch_close(c, &p, now))
            .await
    }

    async fn rollup_list(&self, p: RollupList) -> Result<Vec<Rollup>, StoreError> {
        self.read(move |c| retention::rollup_list(c, &p)).await
    }

    async fn retention_status(&self) -> Result<RetentionStatus, StoreError> {
        self.read(retention::retention_status).await
    }
}

#[cfg(test)]
mod tests;
