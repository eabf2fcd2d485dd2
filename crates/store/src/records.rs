//! What the store returns.

use campanile_calendar::{DstFold, DstGap};
use campanile_core::{ErrorClass, Misfire, OccurrenceId, OccurrenceState, Overlap, ScheduleId};
use jiff::{SignedDuration, Timestamp};

use crate::Conflict;

/// A tenant's internal id. Never shown to other tenants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct TenantId(pub i64);

/// A tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Internal id.
    pub id: TenantId,
    /// Unique name.
    pub name: String,
    /// When it was created.
    pub created_at: Timestamp,
    /// Its class: the label its lag metrics carry (`default` unless set; see
    /// [`crate::classes`]).
    pub class: String,
    /// How long its finished occurrences stay in the hot store.
    pub retention: Retention,
}

/// How long a tenant's finished occurrences stay in the hot store before retention archives
/// and removes them (docs/DESIGN.md, "Why is history archived and removed?").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retention {
    /// The operator's default (`campanile serve --retention-days`).
    #[default]
    Default,
    /// Kept forever.
    Forever,
    /// Kept this long after they were planned and finished.
    For(SignedDuration),
}

impl Retention {
    /// The stored column: NULL for the default, 0 for forever, else milliseconds.
    pub fn to_ms(self) -> Option<i64> {
        match self {
            Retention::Default => None,
            Retention::Forever => Some(0),
            Retention::For(d) => Some(d.as_millis().clamp(1, i64::MAX as i128) as i64),
        }
    }

    /// From the stored column ([`Retention::to_ms`]).
    pub fn from_ms(ms: Option<i64>) -> Retention {
        match ms {
            None => Retention::Default,
            Some(ms) if ms <= 0 => Retention::Forever,
            Some(ms) => Retention::For(SignedDuration::from_millis(ms)),
        }
    }
}

/// One occurrence a retention batch takes out of the hot store, with what its archive line
/// needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retired {
    /// Its tenant.
    pub tenant: TenantId,
    /// The tenant's name (the archive's directory).
    pub tenant_name: String,
    /// The occurrence and its attempts, as stored when the batch read them.
    pub detail: OccurrenceDetail,
    /// The run's own payload, when it was triggered with one.
    pub payload: Option<String>,
}

/// A retention batch: occurrences chosen to leave the hot store, recorded (by id) before
/// anything is archived, so that a node that dies mid-batch leaves it to be finished, not
/// chosen again ([`crate::Store::retention_batch_open`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionBatch {
    /// Its number: the archive files of this batch are named by it, so writing them again
    /// after a crash replaces them instead of adding copies.
    pub id: i64,
    /// Whether it was left open by a node that stopped (and is being finished now).
    pub resumed: bool,
    /// Whether it was given up ([`RetentionClosed::abandoned`]) and its archive files may
    /// still be there: the caller deletes every file of the batch, then closes it again,
    /// which forgets it. Such a batch has no items.
    pub abandoned: bool,
    /// Its occurrences, in `(tenant, id)` order. Empty when every one of them changed
    /// after the batch chose it (a redrive): the batch is then closed with nothing removed.
    pub items: Vec<Retired>,
}

/// What [`crate::Store::retention_batch_open`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RetentionScan {
    /// The batch to archive and close, if any.
    pub batch: Option<RetentionBatch>,
    /// Where the next call goes on from ([`crate::RetentionBatchOpen::after`]); `None` when
    /// this call reached the youngest occurrence any retention could take (the next starts
    /// again from the oldest).
    pub scanned_to: Option<OccurrenceId>,
    /// Whether another node holds the open batch (nothing was looked at).
    pub busy: bool,
}

/// A day of occurrences retention takes out as a whole ([`crate::Store::retention_day_open`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionDay {
    /// Its partition's name (`occurrences_YYYYMMDD`), which reads and the close name.
    pub name: String,
    /// Its UTC midnight.
    pub day: Timestamp,
    /// Whether a node that stopped left it open.
    pub resumed: bool,
    /// Whether it is archived and detached already (only its clean-up is left: nothing to
    /// archive again).
    pub detached: bool,
    /// Rows to archive.
    pub leaving: u64,
    /// Rows that stay (moved to the default partition): their schedule's latest, or their
    /// tenant keeps history longer than the operator's default (or forever).
    pub survivors: u64,
}

/// What [`crate::Store::retention_day_close`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionDayClosed {
    /// Occurrences that left with the day, each counted in the rollups.
    pub removed: u64,
    /// Occurrences moved to the default partition.
    pub kept: u64,
    /// Attempt rows removed with them.
    pub attempts_removed: u64,
    /// Whether a row was planned into the day after it was decided: nothing was removed, and
    /// the day is decided again, to be archived anew.
    pub redo: bool,
}

/// What [`crate::Store::retention_batch_close`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionClosed {
    /// Occurrences removed (with their attempts), each counted in the rollups.
    pub removed: u64,
    /// Attempt rows removed with them.
    pub attempts_removed: u64,
    /// Whether the batch was given up instead: one of its occurrences changed since it was
    /// read (redriven), or one has a delivery pending again, so nothing was removed. The batch
    /// stays open, marked, until its archive files are deleted and it is closed again.
    pub abandoned: bool,
}

/// What retention left behind of a schedule's history: per version, UTC day and final state,
/// how many occurrences were archived and removed, and the range of their planned instants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollup {
    /// The version.
    pub version: u32,
    /// The UTC day (its midnight) of the planned instants.
    pub day: Timestamp,
    /// Their final state.
    pub state: OccurrenceState,
    /// How many.
    pub count: u64,
    /// The earliest planned instant among them.
    pub first_at: Timestamp,
    /// The latest.
    pub last_at: Timestamp,
}

/// Where retention stands: what the hot store holds that retention has not reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionStatus {
    /// The planned instant of the oldest occurrence in the hot store, if any.
    pub oldest: Option<Timestamp>,
}

/// When a schedule version fires.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Timing {
    /// A cron expression in an IANA zone.
    Cron {
        /// The expression as written.
        expr: String,
        /// IANA zone name.
        timezone: String,
        /// Gap policy.
        dst_gap: DstGap,
        /// Fold policy.
        dst_fold: DstFold,
    },
    /// A one-off instant.
    At(Timestamp),
    /// A fixed interval from an anchor.
    Every {
        /// The interval.
        period: SignedDuration,
        /// The first instant.
        anchor: Timestamp,
    },
}

/// Everything one schedule version keeps: timing, target, payload and policies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleSpec {
    /// When it fires.
    pub timing: Timing,
    /// Target queue (per tenant).
    pub queue: String,
    /// Payload (JSON text), handed to workers on claim.
    pub payload: Option<String>,
    /// Higher is claimed first.
    pub priority: i32,
    /// Default lease length for its occurrences.
    pub lease: SignedDuration,
    /// Claims allowed per occurrence.
    pub max_attempts: u32,
    /// First retry delay ceiling.
    pub backoff_initial: SignedDuration,
    /// Largest retry delay ceiling.
    pub backoff_max: SignedDuration,
    /// What to do with instants that are already late when planned.
    pub misfire: Misfire,
    /// What to do when an occurrence comes due while another of the schedule runs.
    pub overlap: Overlap,
    /// Flexible window; zero for strict schedules.
    pub flex_window: SignedDuration,
}

/// A claimed occurrence, as handed to a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The occurrence id: the handler's idempotency key.
    pub id: OccurrenceId,
    /// Its schedule.
    pub schedule_id: ScheduleId,
    /// The version that planned it.
    pub version: u32,
    /// The planned instant.
    pub scheduled_for: Timestamp,
    /// When it became claimable.
    pub available_at: Timestamp,
    /// The fencing token for this claim.
    pub epoch: i64,
    /// The lease ends here, by the store's clock.
    pub lease_until: Timestamp,
    /// Which attempt this is (1-based; reset by redrive).
    pub attempt: u32,
    /// When it was claimed, by the store's clock.
    pub claimed_at: Timestamp,
    /// The schedule version's payload.
    pub payload: Option<String>,
    /// Claimed earlier, by a claim with the same key whose answer was lost, and answered
    /// again ([`crate::ClaimKey::resent`]): nothing was claimed now.
    pub replayed: bool,
}

impl Claimed {
    /// What this occurrence counts against a claim's size bound
    /// ([`crate::OccurrenceClaim::max_bytes`]): its payload's bytes and
    /// [`crate::CLAIM_RECORD_BYTES`].
    pub fn answer_bytes(&self) -> u64 {
        crate::answer::payload_answer_bytes(self.payload.as_ref().map_or(0, String::len))
    }

    /// The lease this claim holds: what its renewals and its report name.
    pub fn lease(&self) -> crate::LeaseRef {
        crate::LeaseRef {
            occurrence_id: self.id,
            epoch: self.epoch,
        }
    }
}

/// The result of renewing one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    /// Which lease.
    pub lease: crate::LeaseRef,
    /// Whether it was extended. If not, the worker has lost it and should stop.
    pub renewed: bool,
    /// The new end of the lease, when renewed.
    pub lease_until: Option<Timestamp>,
    /// Whether someone asked to cancel this occurrence.
    pub cancel_requested: bool,
    /// Why it was not renewed (re-claimed, another owner, lease already passed, finished, no
    /// such occurrence), as the fence explains a refused completion; `None` when renewed.
    pub lost: Option<crate::Conflict>,
}

/// The acknowledgement of a fenced write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// Which occurrence.
    pub occurrence_id: OccurrenceId,
    /// Rows the conditional write changed: 1 when accepted, 0 when refused.
    pub rows: u64,
    /// Why it was refused, when `rows == 0`.
    pub conflict: Option<Conflict>,
    /// The occurrence's state after an accepted write.
    pub state: Option<OccurrenceState>,
    /// For a transient failure: when it becomes claimable again.
    pub retry_at: Option<Timestamp>,
}

impl Ack {
    /// Whether the write was accepted.
    pub fn accepted(&self) -> bool {
        self.rows == 1 && self.conflict.is_none()
    }
}

/// How much work is waiting, for the backlog gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Backlog {
    /// Occurrences due now and not claimed (`READY`, or `RETRY_WAIT` whose wait is over),
    /// counted up to [`BACKLOG_COUNT_CAP`].
    pub due: u64,
    /// When the longest-waiting of them became available.
    pub oldest_due_at: Option<Timestamp>,
    /// Outbox rows due and not yet settled (delivered, or closed because their occurrence
    /// ended otherwise).
    pub outbox_pending: u64,
}

/// The due backlog is counted up to this many, so that sampling it stays bounded at a peak.
pub const BACKLOG_COUNT_CAP: u64 = 1_000_000;

/// What the recovery sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SweepReport {
    /// Expired leases returned to `READY`.
    pub requeued: u64,
    /// Expired leases that used the last attempt: now `DEAD`.
    pub dead: u64,
    /// Expired leases of occurrences whose cancellation was requested while they ran: now
    /// `CANCELED`, never handed out again.
    pub canceled: u64,
}

impl SweepReport {
    /// How many expired leases the sweep ended, whatever became of them.
    pub fn expired(&self) -> u64 {
        self.requeued + self.dead + self.canceled
    }
}

/// One occurrence as stored, with its reported state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Occurrence {
    /// Id (deterministic from the key).
    pub id: OccurrenceId,
    /// Schedule.
    pub schedule_id: ScheduleId,
    /// Version that planned it.
    pub version: u32,
    /// Planned instant.
    pub scheduled_for: Timestamp,
    /// When it is (or was, or will again be) claimable.
    pub available_at: Timestamp,
    /// Queue.
    pub queue: String,
    /// Priority.
    pub priority: i32,
    /// Reported state: a pending occurrence not yet due is `SCHEDULED`; a retry whose backoff
    /// has passed is `READY`.
    pub state: OccurrenceState,
    /// Fencing token of the latest claim (0: never claimed).
    pub epoch: i64,
    /// Current or last owner (none before the first claim, and after a redrive: no worker
    /// holds an occurrence that is not `RUNNING`).
    pub owner: Option<String>,
    /// End of the current or last lease (none before the first claim, and after a redrive).
    pub lease_until: Option<Timestamp>,
    /// Claims so far (reset by redrive).
    pub attempts: u32,
    /// Claims allowed.
    pub max_attempts: u32,
    /// Whether a cancel was requested while it ran.
    pub cancel_requested: bool,
    /// The accepted result (JSON text).
    pub result: Option<String>,
    /// Last error class.
    pub last_error_class: Option<ErrorClass>,
    /// Last error message.
    pub last_error: Option<String>,
    /// When it reached a final state.
    pub finished_at: Option<Timestamp>,
    /// Where it came from.
    pub origin: Origin,
}

/// Where an occurrence came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Origin {
    /// Planned from its schedule's calendar.
    #[default]
    Planned,
    /// Triggered by an operator ([`crate::Store::schedule_trigger`]): not an instant of the
    /// calendar, and not expected by `campanile reconcile`.
    Manual,
    /// Made by a backfill ([`crate::Store::schedule_backfill`]): an instant of its version's
    /// calendar in a past range, run after the fact.
    Backfill,
}

impl Origin {
    /// The API's and the store's name (`planned`, `manual`, `backfill`).
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Planned => "planned",
            Origin::Manual => "manual",
            Origin::Backfill => "backfill",
        }
    }

    /// From the stored column (NULL: planned).
    pub fn from_column(s: Option<&str>) -> Origin {
        match s {
            Some("manual") => Origin::Manual,
            Some("backfill") => Origin::Backfill,
            _ => Origin::Planned,
        }
    }
}

/// What [`crate::Store::schedule_trigger`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Triggered {
    /// The occurrence.
    pub occurrence_id: OccurrenceId,
    /// Its instant: when it was triggered.
    pub scheduled_for: Timestamp,
    /// False when the trigger's key had already made it (nothing new was made).
    pub created: bool,
}

/// What the console's overview shows ([`crate::Store::overview`]): the due backlog, and the
/// claims and finishes of a recent window. The window reads occurrences planned from an hour
/// before its start on (ids lead with the planned instant), so its cost does not grow with
/// history; a claim of an occurrence planned longer ago than that is not counted.
#[derive(Debug, Clone, Default)]
pub struct Overview {
    /// Occurrences due now and not claimed, counted up to [`BACKLOG_COUNT_CAP`].
    pub due: u64,
    /// When the longest-waiting of them became available.
    pub oldest_due_at: Option<Timestamp>,
    /// Per claim in the window (the latest [`OVERVIEW_SAMPLES`]): claimed at minus available
    /// at, in milliseconds.
    pub claim_lag_ms: Vec<i64>,
    /// The same claims: claimed at minus the planned instant, in milliseconds.
    pub schedule_lag_ms: Vec<i64>,
    /// Occurrences that reached a final state in the window, per state.
    pub finished: Vec<(campanile_core::OccurrenceState, u64)>,
    /// Of those, how many per minute (the minute's start), oldest first.
    pub per_minute: Vec<(Timestamp, u64)>,
    /// The planning shards and who holds them.
    pub shards: Vec<ShardHold>,
    /// Planner nodes and until when each is marked alive.
    pub nodes: Vec<(String, Timestamp)>,
}

/// Most claims an [`Overview`] samples.
pub const OVERVIEW_SAMPLES: u32 = 10_000;

/// A planning shard's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardHold {
    /// The shard.
    pub shard: i32,
    /// The node holding it, if any.
    pub owner: Option<String>,
    /// Its lease epoch.
    pub epoch: i64,
    /// Until when.
    pub lease_until: Option<Timestamp>,
}

/// Catch-up slots reserved for a tenant ([`crate::Store::tenant_catchup_reserve`]): `count`
/// runs, the `i`-th available from [`CatchupSlots::slot`], spaced by the tenant's rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatchupSlots {
    /// The first slot.
    pub start: Timestamp,
    /// The tenant's catch-up rate (runs per second, positive).
    pub rate: i64,
    /// How many slots were reserved.
    pub count: u32,
}

impl CatchupSlots {
    /// When the `i`-th reserved run (from 0) may become available.
    pub fn slot(&self, i: u32) -> Timestamp {
        let ms = i64::from(i) * 1000 / self.rate.max(1);
        self.start
            .checked_add(jiff::SignedDuration::from_millis(ms))
            .unwrap_or(self.start)
    }
}

/// What [`crate::Store::schedule_backfill`] did.
#[derive(Debug, Clone)]
pub struct Backfilled {
    /// The backfill's id (the same when answered again by its key).
    pub backfill_id: uuid::Uuid,
    /// The version whose instants were backfilled.
    pub version: u32,
    /// The range, `[from, to)`.
    pub from: Timestamp,
    /// The range's end (excluded).
    pub to: Timestamp,
    /// How many instants of the version's calendar the range holds.
    pub instants: u32,
    /// The occurrences it made, by instant (their current state).
    pub created: Vec<Occurrence>,
    /// Occurrences the misfire policy had recorded `MISSED` (they never ran): made `READY`
    /// again, marked [`Origin::Backfill`], under the same id.
    pub rerun: Vec<Occurrence>,
    /// Instants that already had an occurrence of the version that ran, runs, waits, or was
    /// canceled or skipped on purpose: listed, not run again.
    pub existing: Vec<Occurrence>,
    /// True when answered from an earlier backfill with the same `Idempotency-Key`.
    pub replayed: bool,
}

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// Still holding (or silently lost) its lease.
    Running,
    /// Completed and accepted.
    Succeeded,
    /// Failed, reported by the worker.
    Failed,
    /// The lease ran out and the occurrence was re-claimed or swept.
    LeaseExpired,
}

impl AttemptOutcome {
    /// Stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Running => "running",
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::LeaseExpired => "lease_expired",
        }
    }

    /// Parses a stable name.
    pub fn parse(s: &str) -> Option<AttemptOutcome> {
        Some(match s {
            "running" => AttemptOutcome::Running,
            "succeeded" => AttemptOutcome::Succeeded,
            "failed" => AttemptOutcome::Failed,
            "lease_expired" => AttemptOutcome::LeaseExpired,
            _ => return None,
        })
    }
}

/// One claim of an occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The claim's epoch.
    pub epoch: i64,
    /// Who claimed.
    pub owner: String,
    /// When.
    pub started_at: Timestamp,
    /// The end of the last lease granted to this attempt: its claim's, or its last renewal's.
    pub lease_until: Timestamp,
    /// When it ended, if it did.
    pub finished_at: Option<Timestamp>,
    /// How.
    pub outcome: AttemptOutcome,
    /// Error class, for failures.
    pub error_class: Option<ErrorClass>,
    /// Error message, for failures.
    pub error_message: Option<String>,
}

/// An occurrence with its attempt history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OccurrenceDetail {
    /// The occurrence.
    pub occurrence: Occurrence,
    /// Its attempts, oldest first.
    pub attempts: Vec<Attempt>,
    /// The run's own payload, when it was triggered with one ([`crate::ScheduleTrigger`]);
    /// `None` otherwise (it runs with its version's). Read by
    /// [`crate::Store::occurrence_get`].
    pub payload: Option<String>,
}

impl OccurrenceDetail {
    /// The occurrence with its attempts: the attempt rows, which record the attempts that
    /// failed or lost their lease, and the attempt the occurrence row itself holds while it
    /// runs and after it succeeded (owner, epoch, `claimed_at`, lease, `finished_at`), so that
    /// the common path, claim then success, writes no attempt row. A `running` row for the
    /// current epoch, written by an older version at claim time, gives way to the occurrence
    /// row, which is newer.
    pub fn assemble(
        occurrence: Occurrence,
        claimed_at: Option<Timestamp>,
        mut attempts: Vec<Attempt>,
    ) -> OccurrenceDetail {
        let outcome = match occurrence.state {
            OccurrenceState::Running => Some(AttemptOutcome::Running),
            OccurrenceState::Succeeded => Some(AttemptOutcome::Succeeded),
            _ => None,
        };
        let held = (
            outcome,
            occurrence.owner.clone(),
            claimed_at,
            occurrence.lease_until,
        );
        if let (Some(outcome), Some(owner), Some(started_at), Some(lease_until)) = held {
            let current = Attempt {
                epoch: occurrence.epoch,
                owner,
                started_at,
                lease_until,
                finished_at: match outcome {
                    AttemptOutcome::Running => None,
                    _ => occurrence.finished_at,
                },
                outcome,
                error_class: None,
                error_message: None,
            };
            match attempts.iter_mut().find(|a| a.epoch == current.epoch) {
                Some(a) if a.outcome == AttemptOutcome::Running => *a = current,
                Some(_) => {}
                None => attempts.push(current),
            }
            attempts.sort_by_key(|a| a.epoch);
        }
        OccurrenceDetail {
            occurrence,
            attempts,
            payload: None,
        }
    }
}

/// A [`Timing`] flattened into the columns both backends store it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimingColumns<'a> {
    /// `cron`, `at` or `every`.
    pub kind: &'static str,
    /// The cron expression.
    pub cron: Option<&'a str>,
    /// The cron zone.
    pub timezone: Option<&'a str>,
    /// The cron gap policy.
    pub dst_gap: Option<String>,
    /// The cron fold policy.
    pub dst_fold: Option<String>,
    /// The one-off instant, Unix ms.
    pub at: Option<i64>,
    /// The interval, ms.
    pub every_ms: Option<i64>,
    /// The interval's anchor, Unix ms.
    pub anchor: Option<i64>,
}

impl Timing {
    /// The columns this timing is stored in.
    pub fn columns(&self) -> TimingColumns<'_> {
        let none = TimingColumns {
            kind: "",
            cron: None,
            timezone: None,
            dst_gap: None,
            dst_fold: None,
            at: None,
            every_ms: None,
            anchor: None,
        };
        match self {
            Timing::Cron {
                expr,
                timezone,
                dst_gap,
                dst_fold,
            } => TimingColumns {
                kind: "cron",
                cron: Some(expr),
                timezone: Some(timezone),
                dst_gap: Some(dst_gap.to_string()),
                dst_fold: Some(dst_fold.to_string()),
                ..none
            },
            Timing::At(t) => TimingColumns {
                kind: "at",
                at: Some(t.as_millisecond()),
                ..none
            },
            Timing::Every { period, anchor } => TimingColumns {
                kind: "every",
                every_ms: Some(period.as_millis().clamp(0, i128::from(i64::MAX)) as i64),
                anchor: Some(anchor.as_millisecond()),
                ..none
            },
        }
    }
}

/// A schedule's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum ScheduleState {
    /// Planned by the planner.
    Active,
    /// Not planned; instants passed while paused are misfires on resume.
    Paused,
    /// Never planned again.
    Canceled,
    /// Nothing left to plan: a one-off whose instant has been planned, or a definition with no
    /// instant after the last one planned. Its occurrences run as usual; it no longer counts
    /// against the tenant's active-schedule quotas. An update that gives it an instant to plan
    /// makes it `ACTIVE` again; pause and cancel act on it as on an `ACTIVE` one (retiring
    /// what it planned and has not run yet).
    Finished,
}

impl ScheduleState {
    /// Stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ScheduleState::Active => "ACTIVE",
            ScheduleState::Paused => "PAUSED",
            ScheduleState::Canceled => "CANCELED",
            ScheduleState::Finished => "FINISHED",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<ScheduleState> {
        Some(match s {
            "ACTIVE" => ScheduleState::Active,
            "PAUSED" => ScheduleState::Paused,
            "CANCELED" => ScheduleState::Canceled,
            "FINISHED" => ScheduleState::Finished,
            _ => return None,
        })
    }
}

/// A schedule with its current version's definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleRecord {
    /// Id.
    pub id: ScheduleId,
    /// Owner.
    pub tenant: TenantId,
    /// Current version.
    pub version: u32,
    /// Lifecycle state.
    pub state: ScheduleState,
    /// Planning shard.
    pub shard: i32,
    /// Where planning stood at the last lifecycle change (creation, update, pause, resume):
    /// where a paused schedule resumes from. The live position of an active schedule is in the
    /// planner's queue: [`crate::Store::schedule_position`].
    pub next_run_at: Option<Timestamp>,
    /// The current version's definition.
    pub spec: ScheduleSpec,
    /// Creation instant.
    pub created_at: Timestamp,
    /// Last change.
    pub updated_at: Timestamp,
}

/// What a version change did to the schedule's occurrences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleChange {
    /// The schedule after the change.
    pub schedule: ScheduleRecord,
    /// Occurrences of older versions no worker held (pending, or waiting to retry) that
    /// became `CANCELED`.
    pub canceled: u64,
    /// Running occurrences of older versions, left to their workers, who see the cancel flag
    /// on renew (a lapsed lease ends them `CANCELED`), with their actual state.
    pub in_flight: Vec<(OccurrenceId, OccurrenceState)>,
}

/// A due schedule, as the planner needs it (payload omitted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueSchedule {
    /// Id.
    pub id: ScheduleId,
    /// Owner.
    pub tenant: TenantId,
    /// Current version.
    pub version: u32,
    /// The next instant to plan.
    pub next_run_at: Timestamp,
    /// The current version's definition (without payload).
    pub spec: ScheduleSpec,
}

/// One version of a schedule: a definition and when it took effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleVersion {
    /// Version number (1 at creation; each update, pause and cancel adds one).
    pub version: u32,
    /// The definition.
    pub spec: ScheduleSpec,
    /// When it was written: the update, pause or cancel that made it, or the creation.
    pub created_at: Timestamp,
}

/// Misfired instants summarized in one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissedRange {
    /// Schedule.
    pub schedule_id: ScheduleId,
    /// Version.
    pub version: u32,
    /// First missed instant.
    pub first_at: Timestamp,
    /// Last missed instant.
    pub last_at: Timestamp,
    /// How many instants were missed (a lower bound when `count_exact` is false).
    pub count: u64,
    /// Whether `count` is exact.
    pub count_exact: bool,
    /// Instants a schedule change (an update or a cancel) superseded before they were planned,
    /// recorded as canceled — not instants the misfire policy judged late.
    pub superseded: bool,
}

/// A planner shard lease held by a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardLease {
    /// The shard.
    pub shard: i32,
    /// Fencing token of this holding.
    pub epoch: i64,
    /// Valid while `now < lease_until`.
    pub lease_until: Timestamp,
}

/// What [`crate::Store::shard_acquire`] holds afterwards, and found of an outage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardAcquired {
    /// The leases the node holds.
    pub leases: Vec<ShardLease>,
    /// What the outage check found and did.
    pub resumed: Resumed,
}

/// What the outage check of [`crate::Store::shard_acquire`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resumed {
    /// `Some(t)`: no node was alive until now; `t` is the last instant a node was seen alive
    /// (the outage began after it). `None`: a node was alive (this one, or another), or this
    /// is the deployment's first start.
    pub down_since: Option<Timestamp>,
    /// Occurrences planned before the outage, due during it and never claimed, looked at.
    pub examined: u64,
    /// Of those, recorded `MISSED` by the misfire policy.
    pub missed: u64,
    /// Of those kept, run late at the tenant's catch-up pace
    /// ([`crate::Store::tenant_catchup_reserve`]).
    pub paced: u64,
}

impl Resumed {
    /// The end (epoch milliseconds) of the leases and liveness mark an acquisition at `now`
    /// writes after this check, which started at `checking`: one lease from `now`, plus the
    /// time the check spent judging an outage's leftovers (seconds, at the top of the hour),
    /// so that what is written lasts a whole lease from when it is written.
    #[must_use]
    pub fn lease_end(&self, now: i64, lease: SignedDuration, checking: std::time::Instant) -> i64 {
        let judging = if self.examined > 0 {
            i64::try_from(checking.elapsed().as_millis()).unwrap_or(i64::MAX)
        } else {
            0
        };
        now.saturating_add(lease.as_millis() as i64)
            .saturating_add(judging)
    }
}

/// What a [`crate::Store::plan_commit`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PlanReport {
    /// Items whose schedule advanced.
    pub applied: u64,
    /// Items refused because another planner (or an update) moved the schedule first.
    pub stale: u64,
    /// Occurrences inserted (runs and MISSED/SKIPPED records).
    pub inserted: u64,
    /// The schedules of the stale items (usually none): what they planned was not written.
    pub refused: Vec<ScheduleId>,
}

impl Timing {
    /// Rebuilds a timing from its stored columns.
    ///
    /// # Errors
    ///
    /// [`crate::StoreError::Database`] if the columns are inconsistent.
    #[allow(clippy::too_many_arguments)]
    pub fn from_columns(
        kind: &str,
        cron: Option<String>,
        timezone: Option<String>,
        dst_gap: Option<String>,
        dst_fold: Option<String>,
        at: Option<i64>,
        every_ms: Option<i64>,
        anchor: Option<i64>,
    ) -> Result<Timing, crate::StoreError> {
        let bad = |what: &str| crate::StoreError::Database(format!("schedule version row: {what}"));
        let ts = |ms: Option<i64>| {
            ms.ok_or_else(|| bad("missing instant")).and_then(|ms| {
                Timestamp::from_millisecond(ms).map_err(|_| bad("instant out of range"))
            })
        };
        Ok(match kind {
            "cron" => Timing::Cron {
                expr: cron.ok_or_else(|| bad("missing cron"))?,
                timezone: timezone.ok_or_else(|| bad("missing timezone"))?,
                dst_gap: dst_gap
                    .as_deref()
                    .unwrap_or("skip")
                    .parse()
                    .map_err(|e: String| bad(&e))?,
                dst_fold: dst_fold
                    .as_deref()
                    .unwrap_or("once")
                    .parse()
                    .map_err(|e: String| bad(&e))?,
            },
            "at" => Timing::At(ts(at)?),
            "every" => Timing::Every {
                period: SignedDuration::from_millis(
                    every_ms.ok_or_else(|| bad("missing interval"))?,
                ),
                anchor: ts(anchor)?,
            },
            other => return Err(bad(&format!("unknown kind '{other}'"))),
        })
    }
}

/// An API key, without the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    /// Internal id.
    pub id: i64,
    /// The tenant it acts for (`None`: admin).
    pub tenant: Option<TenantId>,
    /// Its first characters.
    pub prefix: String,
    /// Whether it manages tenants and keys.
    pub is_admin: bool,
    /// Creation instant.
    pub created_at: Timestamp,
    /// When it was revoked.
    pub revoked_at: Option<Timestamp>,
}

/// A stored answer to an idempotent request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotentResponse {
    /// Hash of the request it answered; a different request with the same key is a conflict.
    pub request_hash: Vec<u8>,
    /// Status (0: reserved, not answered yet).
    pub status: u16,
    /// Body.
    pub body: String,
    /// The schedule the reserved request created, once its create committed (the answer may
    /// still be missing: its request ended before recording it).
    pub schedule_id: Option<ScheduleId>,
}

/// An externally targeted occurrence claimed by the relay from the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relayed {
    /// Its tenant (complete it with [`crate::Store::occurrence_finish_many`] as this tenant).
    pub tenant: TenantId,
    /// Its route, a reserved queue name such as `$nats:<subject>`.
    pub target: String,
    /// The claim, fenced like a worker's, with the version's payload.
    pub claim: Claimed,
}

/// The outbox routes a relay claim read, by occurrence id: its tenant and route.
pub type RelayRoutes = std::collections::HashMap<uuid::Uuid, (TenantId, String)>;

impl Relayed {
    /// Pairs each claim with the outbox route read for its occurrence.
    ///
    /// # Errors
    ///
    /// [`crate::StoreError::Database`] for a claim without a route: the store claimed an
    /// occurrence it had not read from the outbox.
    pub fn pair(
        claims: Vec<Claimed>,
        mut routes: RelayRoutes,
    ) -> Result<Vec<Relayed>, crate::StoreError> {
        claims
            .into_iter()
            .map(|claim| {
                let (tenant, target) = routes.remove(&claim.id.0).ok_or_else(|| {
                    crate::StoreError::Database(format!(
                        "relay claimed {} without its outbox row",
                        claim.id
                    ))
                })?;
                Ok(Relayed {
                    tenant,
                    target,
                    claim,
                })
            })
            .collect()
    }
}

/// A per-queue concurrency limit ([`crate::Store::queue_limit_set`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueLimit {
    /// The queue.
    pub queue: String,
    /// At most this many of its occurrences running at once.
    pub max_running: i64,
}
