//! One params struct per store method.

use campanile_core::{ErrorClass, OccurrenceId, OccurrenceState, Overlap, ScheduleId};
use jiff::{SignedDuration, Timestamp};

use crate::{MissedRange, ScheduleSpec, ScheduleState, TenantId};

/// Params of [`crate::Store::tenant_create`].
#[derive(Debug, Clone)]
pub struct TenantCreate {
    /// Unique name.
    pub name: String,
    /// Creation instant (`None`: the store's clock).
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::schedule_create`].
#[derive(Debug, Clone)]
pub struct ScheduleCreate {
    /// Owner.
    pub tenant: TenantId,
    /// New schedule's id.
    pub id: ScheduleId,
    /// Version 1's definition.
    pub spec: ScheduleSpec,
    /// The planning shard, `hash(schedule_id) mod N`.
    pub shard: i32,
    /// First instant to plan, if any.
    pub next_run_at: Option<Timestamp>,
    /// How many times the definition fires in an hour (for the trigger-rate quota).
    pub fires_per_hour: u32,
    /// The `Idempotency-Key` reservation this create answers: the create commits only while
    /// the reservation is still this request's, and records the schedule on it in the same
    /// transaction ([`crate::Store::idempotency_put`]).
    pub idempotency: Option<IdempotencyToken>,
    /// Creation instant (`None`: the store's clock).
    pub now: Option<Timestamp>,
}

/// A request's hold on an `Idempotency-Key` ([`crate::Store::idempotency_put`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyToken {
    /// The client's key.
    pub key: String,
    /// The reserving request's own token.
    pub token: String,
}

/// One occurrence to insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOccurrence {
    /// Its schedule.
    pub schedule_id: ScheduleId,
    /// The schedule version that planned it.
    pub version: u32,
    /// The planned instant.
    pub scheduled_for: Timestamp,
    /// When it becomes claimable (`scheduled_for` plus any flexible-window offset).
    pub available_at: Timestamp,
    /// The tenant's queue it is claimed from.
    pub queue: String,
    /// Higher is claimed first.
    pub priority: i32,
    /// Claims allowed before it goes `DEAD`.
    pub max_attempts: u32,
    /// First retry delay ceiling.
    pub backoff_initial: SignedDuration,
    /// Largest retry delay ceiling.
    pub backoff_max: SignedDuration,
    /// `Ready` for a run; `Missed`, `SkippedOverlap` or `Canceled` to record one that will
    /// not run.
    pub state: OccurrenceState,
    /// The schedule's overlap policy, enforced at claim time.
    pub overlap: Overlap,
    /// The schedule's lease length: what a claim or renewal that names none grants.
    pub lease: SignedDuration,
}

impl NewOccurrence {
    /// The run of `rec`'s current version an operator triggers at `at`
    /// ([`crate::Store::schedule_trigger`]): ready at once, under its policies.
    pub fn manual(rec: &crate::ScheduleRecord, at: Timestamp) -> NewOccurrence {
        NewOccurrence {
            schedule_id: rec.id,
            version: rec.version,
            scheduled_for: at,
            available_at: at,
            queue: rec.spec.queue.clone(),
            priority: rec.spec.priority,
            max_attempts: rec.spec.max_attempts,
            backoff_initial: rec.spec.backoff_initial,
            backoff_max: rec.spec.backoff_max,
            state: OccurrenceState::Ready,
            overlap: rec.spec.overlap,
            lease: rec.spec.lease,
        }
    }

    /// The run of `rec`'s current version at its calendar instant `at`, made by a backfill
    /// ([`crate::Store::schedule_backfill`]): available at `available_at` (now, or its catch-up
    /// slot), under its policies but `overlap` if given.
    pub fn backfill(
        rec: &crate::ScheduleRecord,
        at: Timestamp,
        available_at: Timestamp,
        overlap: Option<Overlap>,
    ) -> NewOccurrence {
        NewOccurrence {
            available_at,
            overlap: overlap.unwrap_or(rec.spec.overlap),
            ..NewOccurrence::manual(rec, at)
        }
    }

    /// The state to store it in, checked for both backends: `SCHEDULED` and `READY` are
    /// stored `READY` (readers report `SCHEDULED` until it is due); a run that will not happen
    /// is stored as such; anything else cannot be inserted, nor a lease that is not positive
    /// (a claim naming none would grant an already expired one).
    ///
    /// # Errors
    ///
    /// [`crate::StoreError::Invalid`] naming what is wrong.
    pub fn stored_state(&self) -> Result<OccurrenceState, crate::StoreError> {
        if self.lease <= SignedDuration::ZERO {
            return Err(crate::StoreError::Invalid(format!(
                "an occurrence's lease must be positive, not {}",
                self.lease
            )));
        }
        match self.state {
            OccurrenceState::Scheduled | OccurrenceState::Ready => Ok(OccurrenceState::Ready),
            s @ (OccurrenceState::Missed
            | OccurrenceState::SkippedOverlap
            | OccurrenceState::Canceled) => Ok(s),
            other => Err(crate::StoreError::Invalid(format!(
                "cannot insert an occurrence as {other}"
            ))),
        }
    }
}

/// Params of [`crate::Store::occurrence_insert_many`].
#[derive(Debug, Clone)]
pub struct OccurrenceInsertMany {
    /// Owner of every item.
    pub tenant: TenantId,
    /// The occurrences.
    pub items: Vec<NewOccurrence>,
    /// Insertion instant (`None`: the store's clock).
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::occurrence_claim`].
#[derive(Debug, Clone)]
pub struct OccurrenceClaim {
    /// Whose queue.
    pub tenant: TenantId,
    /// Queue name (per tenant).
    pub queue: String,
    /// Who claims: becomes the owner.
    pub worker_id: String,
    /// At most this many.
    pub max: u32,
    /// Lease length, judged by the store's clock; `None`: each occurrence's own (its
    /// schedule's `lease`).
    pub lease: Option<SignedDuration>,
    /// The claim's own key, chosen by the worker: recorded on what it claims, so that the
    /// same claim sent again ([`ClaimKey::resent`]) gets what the first sending claimed.
    pub key: Option<ClaimKey>,
    /// The answer's size bound ([`OccurrenceClaim::answer_bytes_or_default`]): occurrences are
    /// claimed in claim order while their [`Claimed::answer_bytes`] add up to at most this;
    /// the first one always is, whatever its size. `None`: [`CLAIM_ANSWER_BYTES`].
    pub max_bytes: Option<u64>,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// The default size bound of one claim's answer ([`OccurrenceClaim::max_bytes`]), in bytes:
/// a claim of 1,000 occurrences whose payloads are 256 KiB each answers 31 of them, not
/// 256 MB.
pub const CLAIM_ANSWER_BYTES: u64 = 8 << 20;

/// What one claimed occurrence counts against a claim's size bound besides its payload: room
/// for its other fields as an answer carries them.
pub const CLAIM_RECORD_BYTES: u64 = 512;

impl OccurrenceClaim {
    /// The claim's size bound in bytes ([`OccurrenceClaim::max_bytes`]).
    pub fn answer_bytes_or_default(&self) -> u64 {
        self.max_bytes.unwrap_or(CLAIM_ANSWER_BYTES)
    }
}

/// A worker's key for one claim ([`OccurrenceClaim::key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimKey {
    /// Unique per claim the worker means to make (a random UUID); sent again only with the
    /// same claim.
    pub id: uuid::Uuid,
    /// This claim may have been made before and its answer lost: the occurrences still
    /// `RUNNING` under an unexpired lease that this worker claimed with this key, in this
    /// queue, are answered instead (at most the claim's `max`), as they are (same epochs,
    /// leases and claim instants), and nothing new is claimed; when there are none, the claim
    /// is made as usual.
    pub resent: bool,
}

/// A lease held by a worker: an occurrence at an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRef {
    /// The occurrence.
    pub occurrence_id: OccurrenceId,
    /// The epoch of the worker's claim.
    pub epoch: i64,
}

/// Params of [`crate::Store::lease_renew`].
#[derive(Debug, Clone)]
pub struct LeaseRenew {
    /// Whose leases.
    pub tenant: TenantId,
    /// The owner.
    pub worker_id: String,
    /// The leases to extend.
    pub leases: Vec<LeaseRef>,
    /// New lease length from now; `None`: each occurrence's own (its schedule's `lease`).
    pub lease: Option<SignedDuration>,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// What a worker reports for one occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// Success, with the handler's result (JSON text).
    Succeeded {
        /// JSON text, stored as given.
        result: Option<String>,
    },
    /// Failure.
    Failed {
        /// Transient (retry with backoff) or permanent (dead letter).
        class: ErrorClass,
        /// What went wrong, for people.
        message: String,
    },
}

impl Finish {
    /// Whether the worker reported a success.
    #[must_use]
    pub fn succeeded(&self) -> bool {
        matches!(self, Finish::Succeeded { .. })
    }
}

/// One fenced outcome in a [`OccurrenceFinishMany`].
#[derive(Debug, Clone)]
pub struct FinishItem {
    /// The lease the worker held.
    pub lease: LeaseRef,
    /// What happened.
    pub finish: Finish,
}

/// Params of [`crate::Store::occurrence_finish_many`].
#[derive(Debug, Clone)]
pub struct OccurrenceFinishMany {
    /// Whose occurrences.
    pub tenant: TenantId,
    /// The reporting worker (must be the owner).
    pub worker_id: String,
    /// Outcomes, each fenced on its own.
    pub items: Vec<FinishItem>,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::occurrence_cancel`].
#[derive(Debug, Clone)]
pub struct OccurrenceCancel {
    /// Owner.
    pub tenant: TenantId,
    /// Which occurrence.
    pub occurrence_id: OccurrenceId,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::occurrence_redrive`].
#[derive(Debug, Clone)]
pub struct OccurrenceRedrive {
    /// Owner.
    pub tenant: TenantId,
    /// Which occurrence.
    pub occurrence_id: OccurrenceId,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::lease_sweep`].
#[derive(Debug, Clone)]
pub struct LeaseSweep {
    /// At most this many occurrences per call.
    pub limit: u32,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// How to address one occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OccurrenceKey {
    /// By id.
    Id(OccurrenceId),
    /// By schedule and planned instant (the highest version that planned it).
    Planned {
        /// The schedule.
        schedule_id: ScheduleId,
        /// The planned instant.
        scheduled_for: Timestamp,
    },
}

/// Params of [`crate::Store::occurrence_get`].
#[derive(Debug, Clone)]
pub struct OccurrenceGet {
    /// Owner: other tenants' occurrences are not found.
    pub tenant: TenantId,
    /// Which occurrence.
    pub key: OccurrenceKey,
    /// For the reported state (`SCHEDULED` vs `READY`); `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::occurrence_list`].
#[derive(Debug, Clone, Default)]
pub struct OccurrenceList {
    /// Owner.
    pub tenant: TenantId,
    /// Only this schedule.
    pub schedule_id: Option<ScheduleId>,
    /// Only this (reported) state.
    pub state: Option<OccurrenceState>,
    /// `scheduled_for >= from`.
    pub from: Option<Timestamp>,
    /// `scheduled_for < to`.
    pub to: Option<Timestamp>,
    /// Resume after this `(scheduled_for, id)` (cursor pagination).
    pub after: Option<(Timestamp, OccurrenceId)>,
    /// Page size.
    pub limit: u32,
    /// For reported states; `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::schedule_get`].
#[derive(Debug, Clone)]
pub struct ScheduleGet {
    /// Owner: other tenants' schedules are not found.
    pub tenant: TenantId,
    /// Which schedule.
    pub id: ScheduleId,
}

/// Params of [`crate::Store::schedule_update`].
#[derive(Debug, Clone)]
pub struct ScheduleUpdate {
    /// Owner.
    pub tenant: TenantId,
    /// Which schedule.
    pub id: ScheduleId,
    /// The version the caller read; a different current version is a conflict.
    pub expected_version: u32,
    /// The new version's definition.
    pub spec: ScheduleSpec,
    /// The new version's first instant to plan.
    pub next_run_at: Option<Timestamp>,
    /// How many times the new definition fires in an hour (for the trigger-rate quota).
    pub fires_per_hour: u32,
    /// See [`ScheduleTransition::superseded`].
    pub superseded: Superseded,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::schedule_transition`].
#[derive(Debug, Clone)]
pub struct ScheduleTransition {
    /// Owner.
    pub tenant: TenantId,
    /// Which schedule.
    pub id: ScheduleId,
    /// Pause, resume (to `Active`) or cancel.
    pub to: ScheduleState,
    /// For an update or a cancel: what of the current version came due before the change
    /// and was never planned (the planner lagged behind, or the schedule was paused), to be
    /// recorded in the change's transaction so that what did not run is on record.
    pub superseded: Superseded,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// The instants a schedule change supersedes unplanned ([`ScheduleTransition::superseded`]).
/// All of one version: the one the change replaces (0 with nothing in it: no list, for a
/// pause or a resume). If the schedule's current version is another (the list was read before
/// a concurrent change), the change fails with [`crate::StoreError::VersionConflict`] and
/// writes nothing; the caller reads again.
#[derive(Debug, Clone, Default)]
pub struct Superseded {
    /// The version they belong to.
    pub version: u32,
    /// Written as `CANCELED` occurrences (each must be `CANCELED` and of `version`);
    /// duplicates of planned occurrences are ignored.
    pub rows: Vec<NewOccurrence>,
    /// Those past the rows' limit, summarized in one record (a missed range).
    pub rest: Option<crate::MissedRange>,
}

impl Superseded {
    /// Whether there is nothing to record.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.rest.is_none()
    }
}

/// Params of [`crate::Store::schedule_due`].
#[derive(Debug, Clone)]
pub struct ScheduleDueList {
    /// The shard to scan.
    pub shard: i32,
    /// Schedules whose `next_run_at <= before` (now + horizon).
    pub before: Timestamp,
    /// At most this many, earliest first.
    pub limit: u32,
}

/// One schedule's planning result, committed with the others of its batch.
#[derive(Debug, Clone)]
pub struct PlanItem {
    /// Owner.
    pub tenant: TenantId,
    /// Which schedule.
    pub schedule_id: ScheduleId,
    /// The version planned; if the schedule changed version, the item is stale.
    pub version: u32,
    /// The `next_run_at` the planner started from; if it moved, the item is stale.
    pub expected_next_run_at: Timestamp,
    /// Where planning continues next time (`None`: nothing left).
    pub next_run_at: Option<Timestamp>,
    /// Occurrences to insert (runs and records of what will not run).
    pub occurrences: Vec<NewOccurrence>,
    /// A summary of a very long misfire gap.
    pub missed: Option<MissedRange>,
}

/// Params of [`crate::Store::plan_commit`].
#[derive(Debug, Clone)]
pub struct PlanCommit {
    /// The planning node.
    pub node: String,
    /// The shard planned.
    pub shard: i32,
    /// The epoch of the node's lease on the shard; a different current epoch fences the batch.
    pub shard_epoch: i64,
    /// The items, in one transaction (shared: a planner whose batch failed commits parts of
    /// it again without copying them).
    pub items: std::sync::Arc<[PlanItem]>,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::shard_acquire`].
#[derive(Debug, Clone)]
pub struct ShardAcquire {
    /// The node.
    pub node: String,
    /// Number of shards in the deployment.
    pub total: u32,
    /// Lease length (of the shard leases and of the node's liveness mark).
    pub lease: SignedDuration,
    /// Decides, if no node was alive until now, which of the planned instants that came due
    /// meanwhile are recorded `MISSED` (the misfire policy; the store does not know calendars).
    pub judge: std::sync::Arc<dyn PrePlannedJudge>,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// What [`crate::Store::shard_acquire`] shows a [`PrePlannedJudge`]: one schedule's occurrences
/// that were planned before the control plane went down, came due while it was down, and
/// were never claimed.
#[derive(Debug, Clone)]
pub struct PrePlanned<'a> {
    /// The schedule.
    pub schedule_id: ScheduleId,
    /// The version they belong to (the current one: an update cancels older versions').
    pub version: u32,
    /// That version's definition.
    pub spec: &'a ScheduleSpec,
    /// The latest instant of this version planned so far (the planner goes on from the
    /// calendar's next instant after it).
    pub planned_through: Timestamp,
    /// Their `scheduled_for`, ascending.
    pub instants: &'a [Timestamp],
    /// The resuming node's clock.
    pub now: Timestamp,
}

/// The misfire decision for occurrences planned before an outage (implemented by the
/// planner, which knows calendars and policies).
pub trait PrePlannedJudge: Send + Sync {
    /// Which of `p.instants` to record `MISSED`; the others stay `READY` and run.
    fn missed(&self, p: &PrePlanned<'_>) -> Vec<Timestamp>;
}

impl std::fmt::Debug for dyn PrePlannedJudge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrePlannedJudge")
    }
}

/// Params of [`crate::Store::shard_release`].
#[derive(Debug, Clone)]
pub struct ShardRelease {
    /// The node giving up all its shards.
    pub node: String,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::missed_range_list`].
#[derive(Debug, Clone)]
pub struct MissedRangeList {
    /// Owner.
    pub tenant: TenantId,
    /// Which schedule.
    pub schedule_id: ScheduleId,
}

/// Params of [`crate::Store::schedule_create_many`]: many schedules sharing one definition
/// (bulk provisioning, benchmarks).
#[derive(Debug, Clone)]
pub struct ScheduleCreateMany {
    /// Owner of all.
    pub tenant: TenantId,
    /// The shared version-1 definition.
    pub spec: ScheduleSpec,
    /// `(id, shard, next_run_at)` per schedule.
    pub items: Vec<(ScheduleId, i32, Option<Timestamp>)>,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::api_key_create`].
#[derive(Debug, Clone)]
pub struct ApiKeyCreate {
    /// The tenant the key acts for; `None` for an admin key.
    pub tenant: Option<TenantId>,
    /// SHA-256 of the key; the key itself is never stored.
    pub hash: Vec<u8>,
    /// The key's first characters, to tell keys apart in lists and revoke them.
    pub prefix: String,
    /// Whether the key may manage tenants and keys.
    pub is_admin: bool,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::schedule_list`].
#[derive(Debug, Clone, Default)]
pub struct ScheduleList {
    /// Owner.
    pub tenant: TenantId,
    /// Only this state.
    pub state: Option<ScheduleState>,
    /// Only schedules whose current version targets this queue.
    pub queue: Option<String>,
    /// Only cron schedules in this zone (as stored: the name given at creation).
    pub timezone: Option<String>,
    /// Resume after this id (cursor pagination; ids are creation-ordered).
    pub after: Option<ScheduleId>,
    /// Page size.
    pub limit: u32,
}

/// Params of [`crate::Store::idempotency_put`].
#[derive(Debug, Clone)]
pub struct IdempotencyPut {
    /// Owner.
    pub tenant: TenantId,
    /// The client's `Idempotency-Key`.
    pub key: String,
    /// Hash of the request it answered.
    pub request_hash: Vec<u8>,
    /// The response status (0: a reservation, answered later).
    pub status: u16,
    /// The response body.
    pub body: String,
    /// The reserving request's own token ([`IdempotencyToken`]).
    pub token: String,
    /// A reservation of the same request that has neither an answer nor a schedule and was
    /// made at least this long ago is taken over (its request died, or still runs and will
    /// find its create refused).
    pub take_over_after: SignedDuration,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Sets a tenant's class: [`crate::Store::tenant_class_set`].
#[derive(Debug, Clone)]
pub struct TenantClassSet {
    /// The tenant.
    pub tenant: TenantId,
    /// Its class ([`crate::classes::validate`]).
    pub class: String,
}

/// Params of [`crate::Store::tenant_quota_set`]. `None` removes a limit.
#[derive(Debug, Clone, Default)]
pub struct TenantQuota {
    /// Which tenant.
    pub tenant: TenantId,
    /// Most `ACTIVE` schedules; creating one more is refused.
    pub max_active_schedules: Option<i64>,
    /// Most occurrences `RUNNING` at once across all its queues; claims are cut to fit.
    pub max_running: Option<i64>,
    /// Most fires per second summed over its active schedules; a schedule that would exceed
    /// it is refused.
    pub max_triggers_per_sec: Option<i64>,
    /// Most late (catch-up) runs made available per second, across its schedules.
    pub max_catchup_per_sec: Option<i64>,
}

/// Params of [`crate::Store::relay_claim`].
#[derive(Debug, Clone)]
pub struct RelayClaim {
    /// The relaying node: becomes the owner of what it claims.
    pub node: String,
    /// At most this many.
    pub max: u32,
    /// Lease length, judged by the store's clock.
    pub lease: SignedDuration,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::tenant_by_name`].
#[derive(Debug, Clone)]
pub struct TenantByName {
    /// The tenant's unique name.
    pub name: String,
}

/// Params of [`crate::Store::overview`].
#[derive(Debug, Clone, Copy)]
pub struct OverviewGet {
    /// Whose work (`None`: every tenant's, for an operator).
    pub tenant: Option<TenantId>,
    /// The window's start: claims and finishes from here to `now`.
    pub since: Timestamp,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::tenant_catchup_reserve`].
#[derive(Debug, Clone, Copy)]
pub struct CatchupReserve {
    /// Whose catch-up rate.
    pub tenant: TenantId,
    /// How many runs to pace.
    pub count: u32,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::schedule_backfill`].
#[derive(Debug, Clone)]
pub struct ScheduleBackfill {
    /// Whose schedule.
    pub tenant: TenantId,
    /// The schedule.
    pub id: ScheduleId,
    /// The version `instants` were computed from: another current version is a
    /// [`crate::StoreError::VersionConflict`] (nothing of an old version is made).
    pub version: u32,
    /// The range, `[from, to)`; `to` at most the store's `now`.
    pub from: Timestamp,
    /// The range's end (excluded).
    pub to: Timestamp,
    /// The version's calendar instants in `[from, to)`, ascending; at most
    /// [`crate::rules::BACKFILL_MAX`].
    pub instants: Vec<Timestamp>,
    /// Overlap policy for the occurrences made (`None`: the version's).
    pub overlap: Option<Overlap>,
    /// The backfill's idempotency key: sent again with it, the backfill makes nothing new
    /// and answers what the first made.
    pub key: Option<String>,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::tenant_quota_get`].
#[derive(Debug, Clone, Copy)]
pub struct TenantQuotaGet {
    /// Whose quota.
    pub tenant: TenantId,
}

/// Params of [`crate::Store::queue_limit_set`].
#[derive(Debug, Clone)]
pub struct QueueLimitSet {
    /// Whose queue.
    pub tenant: TenantId,
    /// The queue.
    pub queue: String,
    /// At most this many of its occurrences running at once; `None` lifts the limit.
    pub max_running: Option<i64>,
}

/// Params of [`crate::Store::api_key_find`].
#[derive(Debug, Clone)]
pub struct ApiKeyFind {
    /// The key's SHA-256 hash.
    pub hash: Vec<u8>,
}

/// Params of [`crate::Store::api_key_revoke`].
#[derive(Debug, Clone)]
pub struct ApiKeyRevoke {
    /// The key's prefix, as `campanile key list` shows it.
    pub prefix: String,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::schedule_position`].
#[derive(Debug, Clone, Copy)]
pub struct SchedulePosition {
    /// Whose schedule.
    pub tenant: TenantId,
    /// The schedule.
    pub id: campanile_core::ScheduleId,
}

/// Params of [`crate::Store::idempotency_get`].
#[derive(Debug, Clone)]
pub struct IdempotencyGet {
    /// Whose request.
    pub tenant: TenantId,
    /// The request's `Idempotency-Key`.
    pub key: String,
}

/// Params of [`crate::Store::idempotency_finish`].
#[derive(Debug, Clone)]
pub struct IdempotencyFinish {
    /// Whose request.
    pub tenant: TenantId,
    /// The request's `Idempotency-Key`.
    pub key: String,
    /// The reservation's token (only its holder finishes it).
    pub token: String,
    /// The answer to keep (status and body), or `None` to release the reservation.
    pub answer: Option<(u16, String)>,
}

/// Params of [`crate::Store::schedule_next_due`].
#[derive(Debug, Clone)]
pub struct ScheduleNextDue {
    /// The shards to look in.
    pub shards: Vec<i32>,
}

/// Params of [`crate::Store::deployment_shards`].
#[derive(Debug, Clone, Copy)]
pub struct DeploymentShards {
    /// The shard count this node runs with (recorded if none is yet).
    pub shards: u32,
}

/// Params of [`crate::Store::backlog`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BacklogGet {
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::tenant_retention_set`].
#[derive(Debug, Clone)]
pub struct TenantRetentionSet {
    /// The tenant.
    pub tenant: TenantId,
    /// Its retention.
    pub retention: crate::Retention,
}

/// Params of [`crate::Store::retention_batch_open`].
#[derive(Debug, Clone)]
pub struct RetentionBatchOpen {
    /// The node running retention: the batch's owner until it is closed or its lease ends.
    pub node: String,
    /// The operator's default retention, for tenants that have none of their own (`None`:
    /// kept forever).
    pub default_retention: Option<SignedDuration>,
    /// Most occurrences in one batch.
    pub limit: u32,
    /// Where the scan goes on from: the [`crate::RetentionScan::scanned_to`] of the previous
    /// call (`None`: from the oldest occurrence).
    pub after: Option<OccurrenceId>,
    /// Most occurrences examined (in id order, so oldest first) by one call, eligible or not:
    /// what bounds a call's cost whatever the history retention must step over (a tenant that
    /// keeps everything, schedules' latest runs).
    pub window: u32,
    /// How long the batch stays this node's before another node may finish it.
    pub lease: SignedDuration,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::occurrence_days_prepare`].
#[derive(Debug, Clone, Default)]
pub struct OccurrenceDaysPrepare {
    /// Days after today to prepare.
    pub ahead: u32,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::retention_day_open`].
#[derive(Debug, Clone)]
pub struct RetentionDayOpen {
    /// The node taking the day: its owner until it is closed or its lease ends.
    pub node: String,
    /// The operator's default retention (`None`: forever, and no day is ever taken whole).
    pub default_retention: Option<SignedDuration>,
    /// How long the day stays this node's.
    pub lease: SignedDuration,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::retention_day_read`].
#[derive(Debug, Clone)]
pub struct RetentionDayRead {
    /// The day ([`crate::RetentionDay::name`]).
    pub name: String,
    /// Rows after this id (`None`: from the first).
    pub after: Option<campanile_core::OccurrenceId>,
    /// At most this many.
    pub limit: u32,
    /// The node that holds the day: each read renews its hold for `lease`, and fails if
    /// another node took the day over.
    pub node: String,
    /// How long the hold lasts from this read.
    pub lease: SignedDuration,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::retention_day_close`].
#[derive(Debug, Clone)]
pub struct RetentionDayClose {
    /// The day ([`crate::RetentionDay::name`]).
    pub name: String,
    /// The node that holds it.
    pub node: String,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// Params of [`crate::Store::retention_batch_close`].
#[derive(Debug, Clone)]
pub struct RetentionBatchClose {
    /// The batch.
    pub batch: i64,
    /// The node that opened (or took over) it: a node whose hold on the batch passed to
    /// another, or whose batch another node closed, is refused ([`crate::StoreError::WrongState`]).
    pub node: String,
    /// Each occurrence as the archive holds it: one that changed since (a redrive, a cancel
    /// after it: another state, epoch or end) gives the batch up.
    pub items: Vec<ArchivedKey>,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}

/// What identifies an occurrence as an archive holds it ([`RetentionBatchClose::items`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchivedKey {
    /// The occurrence.
    pub id: OccurrenceId,
    /// The epoch of its last claim.
    pub epoch: i64,
    /// Its final state.
    pub state: OccurrenceState,
    /// When it reached it.
    pub finished_at: Option<Timestamp>,
}

impl ArchivedKey {
    /// The key of an occurrence as read.
    pub fn of(o: &crate::Occurrence) -> ArchivedKey {
        ArchivedKey {
            id: o.id,
            epoch: o.epoch,
            state: o.state,
            finished_at: o.finished_at,
        }
    }
}

/// Params of [`crate::Store::rollup_list`].
#[derive(Debug, Clone)]
pub struct RollupList {
    /// The tenant.
    pub tenant: TenantId,
    /// The schedule.
    pub schedule_id: ScheduleId,
}

/// Params of [`crate::Store::queue_limit_list`].
#[derive(Debug, Clone)]
pub struct QueueLimitList {
    /// Whose queues.
    pub tenant: TenantId,
}

/// Params of [`crate::Store::schedule_trigger`].
#[derive(Debug, Clone)]
pub struct ScheduleTrigger {
    /// Whose schedule.
    pub tenant: TenantId,
    /// The schedule.
    pub id: ScheduleId,
    /// The trigger's idempotency key: a trigger sent again with the same key makes nothing
    /// new and answers the occurrence the first made.
    pub key: Option<String>,
    /// The run's own payload (JSON text) in place of its version's; `None`: the version's.
    pub payload: Option<String>,
    /// `None`: the store's clock.
    pub now: Option<Timestamp>,
}
