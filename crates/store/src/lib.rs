//! Campanile's store seam.
//!
//! One trait, [`Store`], whose methods are noun-then-verb (`occurrence_claim`, `lease_renew`)
//! and take one params struct each. Every method that decides something by time takes
//! `now: Option<Timestamp>`: `Some` in tests, which step time exactly; `None` in production,
//! where the backend uses its one clock for all nodes — the database's clock on PostgreSQL,
//! the process clock on embedded SQLite. Workers never send timestamps.
//!
//! Each backend (`campanile-store-sqlite`, `campanile-store-postgres`) owns its SQL and
//! migrations (the suite every backend must pass is the `campanile-conformance` crate).

mod answer;
pub mod classes;
mod error;
pub mod fence;
mod params;
mod records;
pub mod rules;
pub mod upgrade;

pub use answer::{ClaimRoom, payload_answer_bytes};
pub use error::{Conflict, Quota, StoreError};
pub use params::*;
pub use records::*;

use async_trait::async_trait;
use jiff::Timestamp;

/// The durable store of tenants, schedules, occurrences and attempts.
///
/// The fencing contract: a completion or failure is accepted only when the occurrence is
/// `RUNNING`, its `owner` is the caller, its `epoch` is the caller's, and its lease is still
/// valid (`now < lease_until`). The affected-row count is the acknowledgement ([`Ack::rows`]).
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    // ── Tenants, their API keys, quotas, classes and queue limits ──

    /// Creates a tenant. Names are unique.
    async fn tenant_create(&self, p: TenantCreate) -> Result<Tenant, StoreError>;

    /// All tenants, by name.
    async fn tenant_list(&self) -> Result<Vec<Tenant>, StoreError>;

    /// A tenant by name.
    async fn tenant_by_name(&self, p: TenantByName) -> Result<Option<Tenant>, StoreError>;

    /// A tenant's quotas.
    async fn tenant_quota_get(&self, p: TenantQuotaGet) -> Result<TenantQuota, StoreError>;

    /// Sets a tenant's quotas.
    async fn tenant_quota_set(&self, p: TenantQuota) -> Result<(), StoreError>;

    /// The console's overview: the due backlog, the claims and finishes of a recent window,
    /// the planning shards and nodes ([`Overview`]).
    async fn overview(&self, p: OverviewGet) -> Result<Overview, StoreError>;

    /// Reserves `p.count` catch-up slots of a tenant with a catch-up rate
    /// (`max_catchup_per_sec`): the tenant's pace cursor moves on atomically, so that late
    /// runs paced by any planning pass, node, resume, outage check or backfill share one
    /// rate. `None` when the tenant has no catch-up rate (nothing is paced).
    async fn tenant_catchup_reserve(
        &self,
        p: CatchupReserve,
    ) -> Result<Option<CatchupSlots>, StoreError>;

    /// Sets a tenant's class (the label of its lag metrics). `Invalid` for a malformed class
    /// ([`classes::validate`]) or one that would make more than [`classes::MAX_CLASSES`]
    /// distinct classes; `NotFound` for an unknown tenant.
    async fn tenant_class_set(&self, p: TenantClassSet) -> Result<(), StoreError>;

    /// Sets (or with `None` removes) a per-queue concurrency limit.
    async fn queue_limit_set(&self, p: QueueLimitSet) -> Result<(), StoreError>;

    /// A tenant's per-queue concurrency limits, by queue name.
    async fn queue_limit_list(&self, p: QueueLimitList) -> Result<Vec<QueueLimit>, StoreError>;

    /// Stores a (hashed) API key.
    async fn api_key_create(&self, p: ApiKeyCreate) -> Result<ApiKeyRecord, StoreError>;

    /// The unrevoked key with this hash.
    async fn api_key_find(&self, p: ApiKeyFind) -> Result<Option<ApiKeyRecord>, StoreError>;

    /// Revokes the keys with this prefix; returns how many.
    async fn api_key_revoke(&self, p: ApiKeyRevoke) -> Result<u64, StoreError>;

    // ── Schedules: created, read, listed, changed ──

    /// Creates a schedule at version 1 with its first version's definition.
    async fn schedule_create(&self, p: ScheduleCreate) -> Result<(), StoreError>;

    /// Creates many schedules sharing one definition, in one transaction per call.
    async fn schedule_create_many(&self, p: ScheduleCreateMany) -> Result<u64, StoreError>;

    /// A schedule with its current version, if it belongs to the tenant.
    async fn schedule_get(&self, p: ScheduleGet) -> Result<Option<ScheduleRecord>, StoreError>;

    /// Every version of a schedule, oldest first: each definition and when it took effect
    /// (empty when the tenant has no such schedule). What `campanile reconcile` recomputes
    /// the expected occurrences from.
    async fn schedule_versions(&self, p: ScheduleGet) -> Result<Vec<ScheduleVersion>, StoreError>;

    /// A tenant's schedules, creation order, with their current version.
    async fn schedule_list(&self, p: ScheduleList) -> Result<Vec<ScheduleRecord>, StoreError>;

    /// Where an active schedule stands in the planner's queue: the next instant it will plan.
    /// (A scan of one shard's queue; [`ScheduleRecord::next_run_at`] is only a snapshot.)
    async fn schedule_position(&self, p: SchedulePosition)
    -> Result<Option<Timestamp>, StoreError>;

    /// Replaces the definition (optimistically, against `expected_version`), bumping the
    /// version. Unclaimed occurrences of older versions become `CANCELED`; claimed ones are
    /// left as they are, flagged for cancel, and reported.
    async fn schedule_update(&self, p: ScheduleUpdate) -> Result<ScheduleChange, StoreError>;

    /// Pause (version bump, unclaimed occurrences canceled and replanned on resume), resume,
    /// or cancel (version bump, unclaimed occurrences canceled, never planned again).
    async fn schedule_transition(
        &self,
        p: ScheduleTransition,
    ) -> Result<ScheduleChange, StoreError>;

    /// Runs a schedule now: one occurrence of its current version, `READY` at `now` (its
    /// instant), marked [`Origin::Manual`], under the schedule's policies (queue, priority,
    /// retries, lease, overlap). Serialized with changes to the schedule: a trigger that
    /// answered before a pause, update or cancel is canceled by it like any unclaimed
    /// occurrence. With [`ScheduleTrigger::payload`], the run is handed that payload instead of
    /// its version's. `NotFound` for a schedule the tenant does not have; `WrongState` for one
    /// that is paused or canceled; `Invalid` for a key sent again with another payload.
    async fn schedule_trigger(&self, p: ScheduleTrigger) -> Result<Triggered, StoreError>;

    /// Backfills a past range of a schedule's current version: one occurrence per instant in
    /// `p.instants` that has none of that version yet, and each `MISSED` one (it never ran)
    /// made `READY` again; the others are listed, not run again. What it makes or runs again
    /// is marked [`Origin::Backfill`] and made available at the tenant's catch-up pace
    /// ([`Store::tenant_catchup_reserve`], in the same transaction) or at once without one.
    /// Serialized with changes to the schedule like a trigger. With a key, a backfill sent
    /// again answers what the first made ([`Backfilled::replayed`]); the same key with another
    /// range is `Invalid`. `NotFound`, `WrongState` (paused, canceled), `VersionConflict`
    /// (`p.version` is no longer current), `Invalid` ([`rules::check_backfill`]).
    async fn schedule_backfill(&self, p: ScheduleBackfill) -> Result<Backfilled, StoreError>;

    // ── Idempotent creates ──

    /// A stored answer for `(tenant, key)`.
    async fn idempotency_get(
        &self,
        p: IdempotencyGet,
    ) -> Result<Option<IdempotentResponse>, StoreError>;

    /// Stores an answer or a reservation (status 0); false if the key is held (the caller
    /// then answers from [`Store::idempotency_get`]). A reservation of the same request that
    /// is older than `take_over_after` and has neither an answer nor a schedule is taken over
    /// (true): the request that made it died, or its create will be refused
    /// ([`ScheduleCreate::idempotency`]).
    async fn idempotency_put(&self, p: IdempotencyPut) -> Result<bool, StoreError>;

    /// Records the final answer for a reserved key (`Some`; only once), or releases the
    /// reservation `token` holds (`None`) when its request failed before creating anything,
    /// so that it can be retried. A reservation whose schedule was created is never released.
    async fn idempotency_finish(&self, p: IdempotencyFinish) -> Result<(), StoreError>;

    // ── Planning: due schedules, the planning commit, shard leases, missed ranges ──

    /// Active schedules of a shard with `next_run_at <= before`, earliest first.
    async fn schedule_due(&self, p: ScheduleDueList) -> Result<Vec<DueSchedule>, StoreError>;

    /// The earliest `next_run_at` among the active schedules of these shards.
    async fn schedule_next_due(&self, p: ScheduleNextDue) -> Result<Option<Timestamp>, StoreError>;

    /// Commits a planning batch in one transaction, fenced by the shard lease: for each item,
    /// advances `next_run_at` only if the schedule is still at `version` and
    /// `expected_next_run_at` (so racing planners never move it backwards), and inserts its
    /// occurrences (duplicates ignored by the unique key).
    async fn plan_commit(&self, p: PlanCommit) -> Result<PlanReport, StoreError>;

    /// Renews the node's liveness mark and shard leases and takes free or expired shards up
    /// to a fair share; returns the leases the node now holds.
    ///
    /// First, in the same transaction (serialized with the other nodes' acquisitions), the
    /// outage check: if no node's mark was valid (the whole control plane was down: stopped,
    /// crashed, or cut off from the database), it applies the misfire policy to what the outage
    /// left behind that the planner will not see again: occurrences planned before it (up to
    /// the planning horizon ahead), never claimed, that became claimable during it. `p.judge`
    /// decides, per schedule version, which become `MISSED`; the rest run. Of nodes coming
    /// back together exactly one sees the outage; the others see it handled. A node calls
    /// this before it serves claims, with the `now` of its first planning pass.
    async fn shard_acquire(&self, p: ShardAcquire) -> Result<ShardAcquired, StoreError>;

    /// Gives up every shard the node holds (graceful shutdown).
    async fn shard_release(&self, p: ShardRelease) -> Result<u64, StoreError>;

    /// Summaries of long misfire gaps of a schedule.
    async fn missed_range_list(&self, p: MissedRangeList) -> Result<Vec<MissedRange>, StoreError>;

    /// The deployment's planner shard count: records `shards` if none is recorded yet (the
    /// first node to start decides) and returns the recorded count, which every node must use.
    async fn deployment_shards(&self, p: DeploymentShards) -> Result<u32, StoreError>;

    // ── Occurrences: inserted, claimed, reported, read ──

    /// Inserts planned occurrences. Duplicates of `(schedule_id, version, scheduled_for)`
    /// are ignored (the unique key decides); returns how many rows were new.
    async fn occurrence_insert_many(&self, p: OccurrenceInsertMany) -> Result<u64, StoreError>;

    /// Claims up to `max` due occurrences of one tenant's queue — `READY` (or `RETRY_WAIT`)
    /// with `available_at <= now`, or `RUNNING` with an expired lease and attempts left —
    /// highest priority first, then earliest `available_at`. Each claimed occurrence gets
    /// `epoch + 1`, the caller as owner, `lease_until = now + lease` — the claim's `lease`,
    /// or when `None` the occurrence's own ([`NewOccurrence::lease`]) — (its new attempt, held
    /// on the occurrence row), all in one transaction; the attempt it takes over from an
    /// expired lease is recorded as `lease_expired` in the same transaction. The claim's
    /// [`ClaimKey`] is recorded on each (none: none). A claim whose key says `resent` first
    /// looks for what this worker claimed with that key in this queue and still holds
    /// (`RUNNING`, lease unexpired): if any, those are the answer (at most `max`, first
    /// things first), unchanged, and nothing is written. The store does not gate that on
    /// liveness, as it hands out nothing new (the HTTP API still answers a node that is not
    /// live as it answers any claim there).
    async fn occurrence_claim(&self, p: OccurrenceClaim) -> Result<Vec<Claimed>, StoreError>;

    /// Only the first step of [`Store::occurrence_claim`] for a claim sent again: what its key
    /// still holds (this worker's, this queue's, `RUNNING` under an unexpired lease, at most
    /// `max`), with payloads; nothing is claimed or written. Empty unless the claim's key says
    /// `resent`. For a node that hands out no new work but owes a worker its answer.
    async fn occurrence_claimed_with_key(
        &self,
        p: OccurrenceClaim,
    ) -> Result<Vec<Claimed>, StoreError>;

    /// Completes or fails occurrences, each fenced on its own, in one transaction.
    async fn occurrence_finish_many(&self, p: OccurrenceFinishMany)
    -> Result<Vec<Ack>, StoreError>;

    /// [`Store::occurrence_finish_many`], then [`Store::occurrence_claim`] for the same
    /// worker: what a worker reporting its outcomes and asking for more work in one request
    /// needs. The outcomes are decided and written first; the claim's own result comes back
    /// beside them (an error of the claim does not undo or hide the outcomes). A backend may
    /// run both in fewer round trips; the default runs one after the other.
    async fn occurrence_finish_and_claim(
        &self,
        finish: OccurrenceFinishMany,
        claim: OccurrenceClaim,
    ) -> Result<(Vec<Ack>, Result<Vec<Claimed>, StoreError>), StoreError> {
        let acks = self.occurrence_finish_many(finish).await?;
        Ok((acks, self.occurrence_claim(claim).await))
    }

    /// Requests cancellation: a pending occurrence becomes `CANCELED`; a running one gets the
    /// cancel flag, which its worker sees on renew.
    async fn occurrence_cancel(&self, p: OccurrenceCancel) -> Result<Ack, StoreError>;

    /// Re-readies a `DEAD` occurrence under the same id, with a fresh attempt budget and no
    /// owner or lease (no worker holds it until it is claimed again: a report at the dead
    /// attempt's epoch is refused as [`Conflict::NotClaimed`]); its attempt history is kept.
    async fn occurrence_redrive(&self, p: OccurrenceRedrive) -> Result<Ack, StoreError>;

    /// One occurrence with its attempts, if it belongs to the tenant.
    async fn occurrence_get(
        &self,
        p: OccurrenceGet,
    ) -> Result<Option<OccurrenceDetail>, StoreError>;

    /// Occurrences by schedule, state and planned-time range, in `(scheduled_for, id)` order.
    async fn occurrence_list(&self, p: OccurrenceList) -> Result<Vec<Occurrence>, StoreError>;

    /// How much work is waiting at `now` (`None`: the store's clock), across all tenants.
    async fn backlog(&self, p: BacklogGet) -> Result<Backlog, StoreError>;

    // ── Leases ──

    /// Extends the leases the worker still holds, in one statement; says for each whether
    /// it was renewed and whether a cancel was requested.
    async fn lease_renew(&self, p: LeaseRenew) -> Result<Vec<Renewal>, StoreError>;

    /// The recovery sweep: occurrences whose lease expired go back to `READY`, or to `DEAD`
    /// when their attempts are used up; at most `limit` per call.
    async fn lease_sweep(&self, p: LeaseSweep) -> Result<SweepReport, StoreError>;

    // ── The relay ──

    /// The relay's claim, across tenants, from the transactional outbox: up to `max` due
    /// externally targeted occurrences (`READY`/`RETRY_WAIT` due, or `RUNNING` with an expired
    /// lease and attempts left), claimed exactly as [`Store::occurrence_claim`] claims (new
    /// epoch, the node as owner, a lease by the store's clock), earliest first.
    /// In the same transaction it settles the outbox rows whose occurrence has ended
    /// (succeeded, dead, canceled) and moves the rows of occurrences that are not due yet
    /// (retry back-off, live lease) to when they will be. Completions go through
    /// [`Store::occurrence_finish_many`], fenced like any worker's.
    async fn relay_claim(&self, p: RelayClaim) -> Result<Vec<Relayed>, StoreError>;

    // ── Retention: finished history archived, then removed ──

    /// Sets a tenant's retention. `NotFound` for an unknown tenant.
    async fn tenant_retention_set(&self, p: TenantRetentionSet) -> Result<(), StoreError>;

    /// Opens the next retention batch, or hands back the one a node left open (its lease
    /// passed, or it is this node's): no batch when another node holds an open one or nothing
    /// in the window examined is due. One batch is open at a time across all nodes.
    ///
    /// A new batch takes, oldest first, up to `limit` occurrences that are final (`SUCCEEDED`,
    /// `DEAD`, `CANCELED`, `MISSED`, `SKIPPED_OVERLAP`), were planned and finished longer ago
    /// than their tenant's retention, are not their schedule's latest occurrence (its overlap
    /// decisions and its cursor need it), and have no delivery pending in the outbox. It looks
    /// at no more than `window` occurrences after `after`, all planned longer ago than the
    /// shortest retention in force; the answer says where the next call goes on from. Their
    /// ids are recorded with the batch in the same transaction; nothing is removed yet.
    async fn retention_batch_open(
        &self,
        p: RetentionBatchOpen,
    ) -> Result<RetentionScan, StoreError>;

    /// Closes a batch whose archive is written: in one transaction, removes its occurrences
    /// and their attempts, adds them to the per (schedule, version, day, state) rollups, and
    /// closes the batch. If any of them changed since the archive read it (not there, or
    /// another epoch, state or end: a redrive), or has a delivery pending again, nothing is
    /// removed and the batch is marked given up ([`RetentionClosed::abandoned`]): the caller
    /// deletes its archive files and closes it again, which forgets it; its occurrences are
    /// chosen again by a later batch if they are still due. `WrongState` if the batch is not
    /// open or not this node's.
    async fn retention_batch_close(
        &self,
        p: RetentionBatchClose,
    ) -> Result<RetentionClosed, StoreError>;

    /// Creates the day partitions of occurrences from yesterday to `ahead` days after today
    /// where the backend partitions them (PostgreSQL), moving into each the rows the default
    /// partition held for its day; how many it created. Nothing on a backend that does not.
    async fn occurrence_days_prepare(&self, p: OccurrenceDaysPrepare) -> Result<u32, StoreError> {
        let _ = p;
        Ok(0)
    }

    /// Takes the oldest day partition whose whole day is past the operator's default
    /// retention out of the hot store as a whole, one step per call, where the backend
    /// partitions occurrences (PostgreSQL; `None` elsewhere, and when no day is due or another
    /// node holds the day in progress). Steps: the day is sealed (its rows refuse any change
    /// from then on; a day with work still pending or a delivery pending is left to row-by-row
    /// retention), then decided (which rows stay — [`RetentionDay::survivors`] — and what the
    /// rest adds to the rollups). The caller archives the rest ([`Store::retention_day_read`])
    /// and closes the day ([`Store::retention_day_close`]). A day left by a node that stopped
    /// is handed back when its lease passes, at the step it reached.
    async fn retention_day_open(
        &self,
        p: RetentionDayOpen,
    ) -> Result<Option<RetentionDay>, StoreError> {
        let _ = p;
        Ok(None)
    }

    /// The next rows of an open day to archive (all but its survivors), in id order after
    /// `after`, at most `limit`, with their attempts and tenants; renews the node's hold on the
    /// day. `WrongState` if the day is not open or another node holds it; an error (nothing
    /// read) if a chosen row cannot be read whole.
    async fn retention_day_read(&self, p: RetentionDayRead) -> Result<Vec<Retired>, StoreError> {
        let _ = p;
        Ok(Vec::new())
    }

    /// Closes an archived day: detaches its partition, moves its survivors to the default
    /// partition and adds the rest to the rollups in one transaction, then removes the rest's
    /// attempts and settled deliveries and drops the partition. If a row was planned into the
    /// day after it was decided, nothing is removed and the day is decided again
    /// ([`RetentionDayClosed::redo`]): the caller archives it anew. `WrongState` if the day is
    /// not open or not this node's.
    async fn retention_day_close(
        &self,
        p: RetentionDayClose,
    ) -> Result<RetentionDayClosed, StoreError> {
        let _ = p;
        Ok(RetentionDayClosed::default())
    }

    /// What retention left of a schedule's history, by version, day and state.
    async fn rollup_list(&self, p: RollupList) -> Result<Vec<Rollup>, StoreError>;

    /// Where retention stands ([`RetentionStatus`]).
    async fn retention_status(&self) -> Result<RetentionStatus, StoreError>;

    // ── The store itself ──

    /// The store's clock: the database's on PostgreSQL, the process's on SQLite.
    async fn store_now(&self) -> Result<Timestamp, StoreError>;

    /// Answers when the database answers (readiness).
    async fn store_ping(&self) -> Result<(), StoreError>;
}
