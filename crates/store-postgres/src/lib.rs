//! Campanile's PostgreSQL store.
//!
//! - tokio-postgres over a deadpool pool; every statement is prepared once per connection.
//! - Claims are one statement: two `FOR UPDATE SKIP LOCKED` index scans (due pending work,
//!   expired leases with attempts left), merged by priority, the attempts lost with those
//!   leases recorded, and the rows updated, all in one round trip.
//! - Time: when an operation's `now` is `None`, the database's own `clock_timestamp()` decides,
//!   so every node judges leases by one clock. Tests pass `now` and step it exactly.
//! - Batch operations ship their rows as arrays (`unnest`), one statement per batch.

mod api_key;
mod backfill;
mod claim;
mod claimed;
mod coalesce;
mod constrained;
mod db;
mod fenced;
mod finish;
mod idempotency;
mod lease;
mod migrate;
mod occurrence;
mod overview;
#[cfg(test)]
mod plan_tests;
mod planning;
mod queue;
mod relay;
mod retention;
mod retention_day;
mod schedule;
mod tenant;
mod trigger;
mod version;

use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use campanile_store::*;
use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod};
use jiff::Timestamp;

use crate::db::{pg_err, pool_err, resolve_now};

pub use migrate::MIGRATIONS;

/// The largest report, and claim, that shares one transaction with others
/// ([`Store::occurrence_finish_and_claim`]).
const SHARED_REPORT_MAX: usize = 16;

/// The PostgreSQL store.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    schema: Option<Arc<str>>,
    /// Concurrent claims of one queue share a statement.
    claims: Arc<coalesce::Coalescer<claim::ClaimBatch>>,
    /// Concurrent batches of successes of one tenant share a statement.
    successes: Arc<coalesce::Coalescer<finish::SuccessBatch>>,
    /// Concurrent reports that claim more work share a transaction.
    finish_claims: Arc<coalesce::Coalescer<finish::FinishClaimBatch>>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.schema)
            .field("pool", &self.pool.status())
            .finish()
    }
}

/// Options for [`PgStore::connect_with`].
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// Use this schema (created if missing) instead of the connection's default.
    pub schema: Option<String>,
    /// Most connections held.
    pub pool_size: usize,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            schema: None,
            pool_size: 16,
        }
    }
}

/// Every statement is prepared once per connection and is shaped for one plan; planning it
/// again at each execution (PostgreSQL's choice for most of them under `plan_cache_mode =
/// auto`) cost a third of the database's time at batch size 1 (docs/DESIGN.md, "Why generic
/// plans"). Set per session after connecting, rather than as a startup option, which
/// connection poolers such as PgBouncer refuse; a server that does not know the setting
/// (before PostgreSQL 12) keeps its default.
async fn generic_plans_on(client: &mut deadpool_postgres::ClientWrapper) -> Result<(), HookError> {
    if let Err(e) = client
        .batch_execute("SET plan_cache_mode = force_generic_plan")
        .await
    {
        tracing::warn!(error = %e, "cannot set plan_cache_mode; statements keep the server's default");
    }
    Ok(())
}

/// Where autovacuum is on for the occurrences table ([`PgStore::autovacuum`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Autovacuum {
    /// The server's `autovacuum` setting.
    pub server: bool,
    /// The table's `autovacuum_enabled` storage parameter (true when unset).
    pub table: bool,
}

/// Days after today whose partitions a store creates when it connects.
const DAYS_AHEAD: u32 = 3;

/// Whether autovacuum covers the occurrences table of the connection's schema: each of its
/// partitions.
async fn autovacuum(c: &tokio_postgres::Client) -> Result<Autovacuum, StoreError> {
    let row = c
        .query_one(
            "SELECT current_setting('autovacuum')::bool,
                    NOT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class k ON k.oid = i.inhrelid,
                                       pg_options_to_table(k.reloptions) AS o
                                 WHERE i.inhparent = 'occurrences'::regclass
                                   AND option_name = 'autovacuum_enabled'
                                   AND NOT option_value::bool)",
            &[],
        )
        .await
        .map_err(pg_err)?;
    Ok(Autovacuum {
        server: row.try_get(0).map_err(pg_err)?,
        table: row.try_get(1).map_err(pg_err)?,
    })
}

/// Drops its store's schema when dropped ([`PgStore::drop_schema_on_drop`]). Failures are
/// ignored: it runs during unwinding too.
#[derive(Debug)]
pub struct SchemaGuard(PgStore);

impl Drop for SchemaGuard {
    fn drop(&mut self) {
        let store = self.0.clone();
        // A fresh runtime on a plain thread: the drop may run inside another runtime, which
        // cannot be blocked on.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                let _ = rt.block_on(store.drop_schema());
            }
        })
        .join();
    }
}

fn valid_schema(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl PgStore {
    /// Connects to `url` (`postgres://user@host:port/db`) and applies pending migrations.
    ///
    /// # Errors
    ///
    /// [`StoreError::Invalid`] for a malformed URL, [`StoreError::Unavailable`] if the
    /// database cannot be reached, [`StoreError::Migration`] if migrations fail.
    pub async fn connect(url: &str) -> Result<PgStore, StoreError> {
        PgStore::connect_with(url, PgOptions::default()).await
    }

    /// [`PgStore::connect`] with options.
    ///
    /// # Errors
    ///
    /// As [`PgStore::connect`]; [`StoreError::Invalid`] for a schema name that is not
    /// lower-case letters, digits and underscores.
    pub async fn connect_with(url: &str, opts: PgOptions) -> Result<PgStore, StoreError> {
        let mut cfg = tokio_postgres::Config::from_str(url)
            .map_err(|e| StoreError::Invalid(format!("bad PostgreSQL URL: {e}")))?;
        if let Some(schema) = &opts.schema {
            if !valid_schema(schema) {
                return Err(StoreError::Invalid(format!("bad schema name '{schema}'")));
            }
            // After any options the URL carries, not instead of them.
            let options = match cfg.get_options() {
                Some(theirs) => format!("{theirs} -c search_path={schema}"),
                None => format!("-c search_path={schema}"),
            };
            cfg.options(options);
        }
        // A URL whose options set plan_cache_mode keeps its choice.
        let generic_plans = !cfg
            .get_options()
            .is_some_and(|o| o.contains("plan_cache_mode"));
        cfg.application_name("campanile");
        let mgr = Manager::from_config(
            cfg,
            tokio_postgres::NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let mut pool = Pool::builder(mgr).max_size(opts.pool_size.max(1));
        if generic_plans {
            pool = pool.post_create(Hook::async_fn(|client, _| {
                Box::pin(generic_plans_on(client))
            }));
        }
        let pool = pool
            .build()
            .map_err(|e| StoreError::Invalid(format!("cannot build the connection pool: {e}")))?;
        let store = PgStore {
            claims: coalesce::Coalescer::new(claim::ClaimBatch { pool: pool.clone() }),
            successes: coalesce::Coalescer::new(finish::SuccessBatch { pool: pool.clone() }),
            finish_claims: coalesce::Coalescer::new(finish::FinishClaimBatch {
                pool: pool.clone(),
            }),
            pool,
            schema: opts.schema.map(Arc::from),
        };
        let mut client = store.pool.get().await.map_err(pool_err)?;
        if let Some(schema) = &store.schema {
            client
                .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
                .await
                .map_err(pg_err)?;
        }
        migrate::apply(&mut client).await?;
        // The coming days' partitions, before any row is planned into them (a node's
        // retention keeps creating them ahead).
        retention_day::days_prepare(
            &mut client,
            OccurrenceDaysPrepare {
                ahead: DAYS_AHEAD,
                now: None,
            },
        )
        .await?;
        match autovacuum(&client).await {
            Ok(a) if a.server && a.table => {}
            Ok(_) => tracing::warn!(
                "autovacuum does not run on the occurrences table: every claim walks the index \
                 entries that earlier claims left behind, and claims slow down until the table \
                 is vacuumed (docs/DESIGN.md, \"Why warn when autovacuum is off?\")"
            ),
            Err(e) => tracing::debug!(error = %e, "cannot tell whether autovacuum runs"),
        }
        Ok(store)
    }

    /// Whether autovacuum covers the occurrences table: it must be on for the server and not
    /// turned off for the table ([`PgStore::connect`] warns when it is not).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the database cannot be reached.
    pub async fn autovacuum(&self) -> Result<Autovacuum, StoreError> {
        let client = self.pool.get().await.map_err(pool_err)?;
        autovacuum(&client).await
    }

    /// Drops this store's schema and everything in it (tests use one schema each).
    ///
    /// # Errors
    ///
    /// [`StoreError::Invalid`] when the store has no schema of its own.
    pub async fn drop_schema(&self) -> Result<(), StoreError> {
        let Some(schema) = &self.schema else {
            return Err(StoreError::Invalid(
                "this store uses the default schema; refusing to drop it".into(),
            ));
        };
        let client = self.pool.get().await.map_err(pool_err)?;
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await
            .map_err(pg_err)
    }

    /// A guard that drops this store's schema when it goes out of scope — for tests, which
    /// use one schema each and must not leave it behind when an assertion fails.
    #[must_use]
    pub fn drop_schema_on_drop(&self) -> SchemaGuard {
        SchemaGuard(self.clone())
    }

    /// Bytes on disk of the tables of this store's schema (the connection's current
    /// schema), with their indexes and TOAST: what storing this many records costs.
    ///
    /// # Errors
    ///
    /// A database failure.
    pub async fn schema_bytes(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0)::int8
                   FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'm')",
                &[],
            )
            .await
            .map_err(pg_err)?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }

    /// `VACUUM (ANALYZE)` of every table of this store's schema: what autovacuum does after a
    /// bulk load (sets hint bits and the visibility map, gathers statistics). Benchmarks call
    /// it after seeding, so that a database server with autovacuum off measures what one with
    /// autovacuum on would.
    ///
    /// # Errors
    ///
    /// A database failure.
    pub async fn vacuum_analyze(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        let tables = client
            .query(
                "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = current_schema()",
                &[],
            )
            .await
            .map_err(pg_err)?;
        for t in tables {
            let table: String = t.get(0);
            client
                .batch_execute(&format!("VACUUM (ANALYZE) {table}"))
                .await
                .map_err(pg_err)?;
        }
        Ok(())
    }

    /// `CHECKPOINT`: writes every dirty buffer out, as the checkpointer does within
    /// `checkpoint_timeout` of a bulk load. Benchmarks call it after seeding so that the
    /// measured pass does not also write out the seed's pages (a backend that finds the
    /// buffer pool full of dirty pages writes them itself before it can read). Returns false,
    /// with nothing done, when the role may not checkpoint (it needs superuser or
    /// `pg_checkpoint`).
    ///
    /// # Errors
    ///
    /// A database failure other than a missing privilege.
    pub async fn checkpoint(&self) -> Result<bool, StoreError> {
        let client = self.client().await?;
        match client.batch_execute("CHECKPOINT").await {
            Ok(()) => Ok(true),
            Err(e)
                if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) =>
            {
                Ok(false)
            }
            Err(e) => Err(pg_err(e)),
        }
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool.get().await.map_err(pool_err)
    }
}

#[async_trait]
impl Store for PgStore {
    async fn tenant_create(&self, p: TenantCreate) -> Result<Tenant, StoreError> {
        tenant::tenant_create(&self.client().await?, p).await
    }

    async fn schedule_create(&self, p: ScheduleCreate) -> Result<(), StoreError> {
        schedule::schedule_create(&mut self.client().await?, p).await
    }

    async fn schedule_create_many(&self, p: ScheduleCreateMany) -> Result<u64, StoreError> {
        schedule::schedule_create_many(&mut self.client().await?, p).await
    }

    async fn occurrence_insert_many(&self, p: OccurrenceInsertMany) -> Result<u64, StoreError> {
        occurrence::occurrence_insert_many(&mut self.client().await?, p).await
    }

    async fn occurrence_claim(&self, p: OccurrenceClaim) -> Result<Vec<Claimed>, StoreError> {
        rules::check_claim(&p)?;
        if p.key.is_some_and(|k| k.resent) {
            let held = self.occurrence_claimed_with_key(p.clone()).await?;
            if !held.is_empty() {
                return Ok(held);
            }
        }
        let key = (
            p.tenant.0,
            p.queue.clone(),
            p.now.map(|t| t.as_millisecond()),
        );
        let first = self.claims.call(key, p.clone()).await?;
        claim::claim_rest(&self.pool, p, first).await
    }

    async fn occurrence_claimed_with_key(
        &self,
        p: OccurrenceClaim,
    ) -> Result<Vec<Claimed>, StoreError> {
        let Some(key) = p.key.filter(|k| k.resent) else {
            return Ok(Vec::new());
        };
        claim::claimed_with_key(&self.client().await?, &p, key.id).await
    }

    async fn relay_claim(&self, p: RelayClaim) -> Result<Vec<Relayed>, StoreError> {
        rules::check_lease(Some(p.lease))?;
        if p.max == 0 {
            return Ok(Vec::new());
        }
        relay::relay_claim(&mut self.client().await?, p).await
    }

    async fn lease_renew(&self, p: LeaseRenew) -> Result<Vec<Renewal>, StoreError> {
        rules::check_renew(&p)?;
        lease::lease_renew(&self.client().await?, p).await
    }

    async fn occurrence_finish_many(
        &self,
        p: OccurrenceFinishMany,
    ) -> Result<Vec<Ack>, StoreError> {
        rules::check_finish(&p)?;
        if finish::only_successes(&p) {
            let key = (p.tenant.0, p.now.map(|t| t.as_millisecond()));
            return self.successes.call(key, p).await;
        }
        finish::occurrence_finish_many(&mut self.client().await?, p).await
    }

    async fn occurrence_finish_and_claim(
        &self,
        finish: OccurrenceFinishMany,
        claim: OccurrenceClaim,
    ) -> Result<(Vec<Ack>, Result<Vec<Claimed>, StoreError>), StoreError> {
        rules::check_finish(&finish)?;
        // Small reports of successes with a plain claim of the same tenant share one
        // transaction; anything else (failures, a lease the store must refuse, large batches)
        // goes the separate ways. Large batches gain nothing from saving a commit and lose
        // the parallelism of the two coalescers: at 100 per report the shared transaction
        // drained 5-25% slower. A report sent again goes apart too: its claim first looks for
        // what the first sending claimed.
        let shareable = finish::only_successes(&finish)
            && finish.items.len() <= SHARED_REPORT_MAX
            && claim.max as usize <= SHARED_REPORT_MAX
            && finish.tenant == claim.tenant
            && finish.now == claim.now
            && rules::check_claim(&claim).is_ok()
            && !claim.key.is_some_and(|k| k.resent);
        if !shareable {
            let acks = self.occurrence_finish_many(finish).await?;
            return Ok((acks, self.occurrence_claim(claim).await));
        }
        let key = (
            claim.tenant.0,
            claim.queue.clone(),
            claim.now.map(|t| t.as_millisecond()),
        );
        let (acks, first) = self
            .finish_claims
            .call(key, (finish, claim.clone()))
            .await?;
        let claimed = match first {
            Ok(first) => claim::claim_rest(&self.pool, claim, first).await,
            Err(e) => Err(e),
        };
        Ok((acks, claimed))
    }

    async fn occurrence_cancel(&self, p: OccurrenceCancel) -> Result<Ack, StoreError> {
        finish::occurrence_cancel(&mut self.client().await?, p).await
    }

    async fn occurrence_redrive(&self, p: OccurrenceRedrive) -> Result<Ack, StoreError> {
        finish::occurrence_redrive(&self.client().await?, p).await
    }

    async fn lease_sweep(&self, p: LeaseSweep) -> Result<SweepReport, StoreError> {
        lease::lease_sweep(&self.client().await?, p).await
    }

    async fn occurrence_get(
        &self,
        p: OccurrenceGet,
    ) -> Result<Option<OccurrenceDetail>, StoreError> {
        occurrence::occurrence_get(&self.client().await?, p).await
    }

    async fn occurrence_list(&self, p: OccurrenceList) -> Result<Vec<Occurrence>, StoreError> {
        occurrence::occurrence_list(&self.client().await?, p).await
    }

    async fn store_now(&self) -> Result<Timestamp, StoreError> {
        let ms = resolve_now(&self.client().await?, None).await?;
        Timestamp::from_millisecond(ms).map_err(|e| StoreError::Database(e.to_string()))
    }

    async fn schedule_position(
        &self,
        p: SchedulePosition,
    ) -> Result<Option<Timestamp>, StoreError> {
        let SchedulePosition { tenant, id } = p;
        schedule::schedule_position(&self.client().await?, tenant, id).await
    }

    async fn schedule_get(&self, p: ScheduleGet) -> Result<Option<ScheduleRecord>, StoreError> {
        version::schedule_get(&self.client().await?, p.tenant, p.id).await
    }

    async fn schedule_update(&self, p: ScheduleUpdate) -> Result<ScheduleChange, StoreError> {
        schedule::schedule_update(&mut self.client().await?, p).await
    }

    async fn schedule_transition(
        &self,
        p: ScheduleTransition,
    ) -> Result<ScheduleChange, StoreError> {
        schedule::schedule_transition(&mut self.client().await?, p).await
    }

    async fn schedule_due(&self, p: ScheduleDueList) -> Result<Vec<DueSchedule>, StoreError> {
        planning::schedule_due(&self.client().await?, p).await
    }

    async fn deployment_shards(&self, p: DeploymentShards) -> Result<u32, StoreError> {
        let DeploymentShards { shards } = p;
        planning::deployment_shards(&self.client().await?, shards).await
    }

    async fn backlog(&self, p: BacklogGet) -> Result<Backlog, StoreError> {
        let BacklogGet { now } = p;
        occurrence::backlog(&self.client().await?, now).await
    }

    async fn schedule_next_due(&self, p: ScheduleNextDue) -> Result<Option<Timestamp>, StoreError> {
        let ScheduleNextDue { shards } = p;
        planning::schedule_next_due(&self.client().await?, &shards).await
    }

    async fn plan_commit(&self, p: PlanCommit) -> Result<PlanReport, StoreError> {
        planning::plan_commit(&mut self.client().await?, p).await
    }

    async fn shard_acquire(&self, p: ShardAcquire) -> Result<ShardAcquired, StoreError> {
        planning::shard_acquire(&mut self.client().await?, p).await
    }

    async fn shard_release(&self, p: ShardRelease) -> Result<u64, StoreError> {
        planning::shard_release(&self.client().await?, p).await
    }

    async fn store_ping(&self) -> Result<(), StoreError> {
        self.client()
            .await?
            .simple_query("SELECT 1")
            .await
            .map(|_| ())
            .map_err(pg_err)
    }

    async fn tenant_list(&self) -> Result<Vec<Tenant>, StoreError> {
        tenant::tenant_list(&self.client().await?).await
    }

    async fn tenant_by_name(&self, p: TenantByName) -> Result<Option<Tenant>, StoreError> {
        let TenantByName { name } = p;
        tenant::tenant_by_name(&self.client().await?, &name).await
    }

    async fn api_key_create(&self, p: ApiKeyCreate) -> Result<ApiKeyRecord, StoreError> {
        api_key::api_key_create(&self.client().await?, p).await
    }

    async fn api_key_find(&self, p: ApiKeyFind) -> Result<Option<ApiKeyRecord>, StoreError> {
        let ApiKeyFind { hash } = p;
        api_key::api_key_find(&self.client().await?, &hash).await
    }

    async fn api_key_revoke(&self, p: ApiKeyRevoke) -> Result<u64, StoreError> {
        let ApiKeyRevoke { prefix, now } = p;
        api_key::api_key_revoke(&self.client().await?, &prefix, now).await
    }

    async fn schedule_list(&self, p: ScheduleList) -> Result<Vec<ScheduleRecord>, StoreError> {
        schedule::schedule_list(&self.client().await?, p).await
    }

    async fn idempotency_get(
        &self,
        p: IdempotencyGet,
    ) -> Result<Option<IdempotentResponse>, StoreError> {
        let IdempotencyGet { tenant, key } = p;
        idempotency::idempotency_get(&self.client().await?, tenant, &key).await
    }

    async fn idempotency_put(&self, p: IdempotencyPut) -> Result<bool, StoreError> {
        idempotency::idempotency_put(&self.client().await?, p).await
    }

    async fn idempotency_finish(&self, p: IdempotencyFinish) -> Result<(), StoreError> {
        let IdempotencyFinish {
            tenant,
            key,
            token,
            answer,
        } = p;
        idempotency::idempotency_finish(&self.client().await?, tenant, &key, &token, answer).await
    }

    async fn tenant_quota_get(&self, p: TenantQuotaGet) -> Result<TenantQuota, StoreError> {
        let TenantQuotaGet { tenant } = p;
        tenant::tenant_quota_get(&self.client().await?, tenant).await
    }

    async fn tenant_quota_set(&self, p: TenantQuota) -> Result<(), StoreError> {
        tenant::tenant_quota_set(&self.client().await?, p).await
    }

    async fn overview(&self, p: OverviewGet) -> Result<Overview, StoreError> {
        overview::overview(&self.client().await?, p).await
    }

    async fn tenant_catchup_reserve(
        &self,
        p: CatchupReserve,
    ) -> Result<Option<CatchupSlots>, StoreError> {
        let c = self.client().await?;
        let now = resolve_now(&c, p.now).await?;
        tenant::catchup_reserve(&c, p.tenant, p.count, now).await
    }

    async fn tenant_class_set(&self, p: TenantClassSet) -> Result<(), StoreError> {
        tenant::tenant_class_set(&mut self.client().await?, p).await
    }

    async fn queue_limit_set(&self, p: QueueLimitSet) -> Result<(), StoreError> {
        let QueueLimitSet {
            tenant,
            queue,
            max_running,
        } = p;
        tenant::queue_limit_set(&self.client().await?, tenant, &queue, max_running).await
    }

    async fn queue_limit_list(&self, p: QueueLimitList) -> Result<Vec<QueueLimit>, StoreError> {
        tenant::queue_limit_list(&self.client().await?, p.tenant).await
    }

    async fn missed_range_list(&self, p: MissedRangeList) -> Result<Vec<MissedRange>, StoreError> {
        planning::missed_range_list(&self.client().await?, p).await
    }

    async fn schedule_versions(&self, p: ScheduleGet) -> Result<Vec<ScheduleVersion>, StoreError> {
        version::schedule_versions(&self.client().await?, p.tenant, p.id).await
    }

    async fn schedule_trigger(&self, p: ScheduleTrigger) -> Result<Triggered, StoreError> {
        trigger::schedule_trigger(&mut self.client().await?, p).await
    }

    async fn schedule_backfill(&self, p: ScheduleBackfill) -> Result<Backfilled, StoreError> {
        backfill::schedule_backfill(&mut self.client().await?, p).await
    }

    async fn tenant_retention_set(&self, p: TenantRetentionSet) -> Result<(), StoreError> {
        retention::tenant_retention_set(&self.client().await?, p).await
    }

    async fn retention_batch_open(
        &self,
        p: RetentionBatchOpen,
    ) -> Result<RetentionScan, StoreError> {
        retention::batch_open(&mut self.client().await?, p).await
    }

    async fn retention_batch_close(
        &self,
        p: RetentionBatchClose,
    ) -> Result<RetentionClosed, StoreError> {
        retention::batch_close(&mut self.client().await?, p).await
    }

    async fn occurrence_days_prepare(&self, p: OccurrenceDaysPrepare) -> Result<u32, StoreError> {
        retention_day::days_prepare(&mut self.client().await?, p).await
    }

    async fn retention_day_open(
        &self,
        p: RetentionDayOpen,
    ) -> Result<Option<RetentionDay>, StoreError> {
        retention_day::day_open(&mut self.client().await?, p).await
    }

    async fn retention_day_read(&self, p: RetentionDayRead) -> Result<Vec<Retired>, StoreError> {
        retention_day::day_read(&self.client().await?, p).await
    }

    async fn retention_day_close(
        &self,
        p: RetentionDayClose,
    ) -> Result<RetentionDayClosed, StoreError> {
        retention_day::day_close(&mut self.client().await?, p).await
    }

    async fn rollup_list(&self, p: RollupList) -> Result<Vec<Rollup>, StoreError> {
        retention::rollup_list(&self.client().await?, p).await
    }

    async fn retention_status(&self) -> Result<RetentionStatus, StoreError> {
        retention::retention_status(&self.client().await?).await
    }
}
