//! The fencing decision, shared by every backend so that they cannot drift apart.
//!
//! A backend reads the occurrence's row ([`FenceView`]), asks [`check`] which of the three
//! checks fails (epoch, owner, lease) and how to name the refusal, and if none does, asks
//! [`plan`] what to write. It then writes **conditionally** on the same three checks, and the
//! affected-row count is the acknowledgement — the read is only for the explanation and the
//! plan.

use campanile_core::{Backoff, ErrorClass, OccurrenceId, OccurrenceState};
use jiff::{SignedDuration, Timestamp};

use crate::{AttemptOutcome, Conflict, Finish, ScheduleState, StoreError};

/// What the fence needs to know about an occurrence (instants in Unix milliseconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceView {
    /// The stored state (`READY` covers not-yet-due).
    pub state: OccurrenceState,
    /// Current or last owner (none before the first claim, and after a redrive).
    pub owner: Option<String>,
    /// Current epoch.
    pub epoch: i64,
    /// End of the current or last lease (none before the first claim, and after a redrive).
    pub lease_until: Option<i64>,
    /// When it is (or will again be) claimable.
    pub available_at: i64,
    /// Claims so far.
    pub attempts: u32,
    /// Claims allowed.
    pub max_attempts: u32,
    /// Backoff ceiling of the first retry.
    pub backoff_initial_ms: i64,
    /// Largest backoff ceiling.
    pub backoff_max_ms: i64,
}

/// When a claim made now finds an occurrence claimable since: for a row still `RUNNING`
/// (`running`) under an expired lease (taken over), the lease's end; else `available_at`. A
/// claim stores and reports this as the occurrence's availability, so that claim lag
/// (`claimed_at − available_at`) does not count a lost run as time spent waiting for a worker.
#[must_use]
pub fn claimable_since(running: bool, available_at: i64, lease_until: Option<i64>) -> i64 {
    match lease_until {
        Some(until) if running => available_at.max(until),
        _ => available_at,
    }
}

impl FenceView {
    /// [`claimable_since`] for this row.
    #[must_use]
    pub fn claimable_since(&self) -> i64 {
        let running = self.state == OccurrenceState::Running;
        claimable_since(running, self.available_at, self.lease_until)
    }

    /// Who made the claim of the current epoch, if it still stands on the row: its owner,
    /// except for a pending row with no attempt since it was planned or redriven. A redrive
    /// clears the owner; one made before it did left the dead attempt's owner on the row,
    /// and that worker holds nothing here either.
    #[must_use]
    pub fn claimant(&self) -> Option<&str> {
        let pending = matches!(
            self.state,
            OccurrenceState::Ready | OccurrenceState::RetryWait
        );
        if pending && self.attempts == 0 {
            None
        } else {
            self.owner.as_deref()
        }
    }
}

fn ts(ms: i64) -> Result<Timestamp, StoreError> {
    Timestamp::from_millisecond(ms)
        .map_err(|e| StoreError::Database(format!("bad instant {ms}: {e}")))
}

/// The state readers see: pending-but-not-due is `SCHEDULED`; a retry past its backoff is
/// `READY`.
pub fn reported(stored: OccurrenceState, available_at: i64, now: i64) -> OccurrenceState {
    match stored {
        OccurrenceState::Ready if available_at > now => OccurrenceState::Scheduled,
        OccurrenceState::RetryWait if available_at <= now => OccurrenceState::Ready,
        s => s,
    }
}

/// Which check fails for `worker` finishing at `epoch` at `now`, if any.
///
/// The epoch first (`stale_epoch`). A `RUNNING` occurrence is held: by another worker
/// (`not_owner`), or by the caller, whose lease may have passed (`lease_expired`). Any other
/// occurrence is held by no worker, and the refusal says whether the caller held it at this
/// epoch: its lease ran out and the sweep took it back (`lease_expired`), or its claim ended
/// otherwise — its report was written, or it was canceled (`wrong_state`, naming the state);
/// else it never held it (`not_claimed`: never claimed, released by a redrive, or another
/// worker's claim that has ended). So a `wrong_state` refusal always means the caller's own
/// claim of this epoch, which a worker whose success was written but whose answer was lost
/// relies on.
///
/// # Errors
///
/// [`StoreError::Database`] if a stored instant is out of range.
pub fn check(
    v: &FenceView,
    worker: &str,
    epoch: i64,
    now: i64,
) -> Result<Option<Conflict>, StoreError> {
    if v.epoch != epoch {
        return Ok(Some(Conflict::StaleEpoch {
            sent: epoch,
            current: v.epoch,
        }));
    }
    let lease_end = v.lease_until.unwrap_or(i64::MIN);
    let expired = lease_end <= now;
    if v.state == OccurrenceState::Running {
        if v.owner.as_deref() != Some(worker) {
            return Ok(Some(Conflict::NotOwner {
                owner: v.owner.clone(),
            }));
        }
        return Ok(if expired {
            Some(Conflict::LeaseExpired {
                lease_until: ts(lease_end)?,
            })
        } else {
            None
        });
    }
    let state = reported(v.state, v.available_at, now);
    if v.claimant() != Some(worker) {
        return Ok(Some(Conflict::NotClaimed { state }));
    }
    Ok(Some(match v.state {
        // Swept back to READY, or DEAD, after its lease ran out.
        OccurrenceState::Ready | OccurrenceState::Dead if expired => Conflict::LeaseExpired {
            lease_until: ts(lease_end)?,
        },
        _ => Conflict::WrongState { state },
    }))
}

/// Why a lease named by `worker` at `epoch` was not renewed, from its row as it is now
/// (`None`: no such occurrence of the tenant), as [`check`] explains a refused completion.
///
/// # Errors
///
/// As [`check`].
pub fn lost(
    v: Option<&FenceView>,
    worker: &str,
    epoch: i64,
    now: i64,
) -> Result<Option<Conflict>, StoreError> {
    match v {
        None => Ok(Some(Conflict::NotFound)),
        Some(v) => check(v, worker, epoch, now),
    }
}

/// What an accepted finish writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishPlan {
    /// New state.
    pub state: OccurrenceState,
    /// Result to store (success only).
    pub result: Option<String>,
    /// New `available_at` (the retry instant for `RETRY_WAIT`).
    pub available_at: i64,
    /// Set for final states.
    pub finished_at: Option<i64>,
    /// Error class name, for failures.
    pub error_class: Option<&'static str>,
    /// Error message, for failures.
    pub error_message: Option<String>,
    /// How the attempt ended.
    pub outcome: AttemptOutcome,
}

/// The write for an accepted finish: success; transient failure with attempts left →
/// `RETRY_WAIT` after full-jitter backoff — unless its cancellation was requested while it
/// ran (`cancel_requested`), which ends it `CANCELED` (its worker stopped as asked; a retry
/// would run a canceled job again); otherwise `DEAD`.
///
/// # Errors
///
/// [`StoreError::Database`] if the stored backoff is inconsistent.
pub fn plan(
    v: &FenceView,
    id: OccurrenceId,
    finish: &Finish,
    cancel_requested: bool,
    now: i64,
) -> Result<FinishPlan, StoreError> {
    Ok(match finish {
        Finish::Succeeded { result } => FinishPlan {
            state: OccurrenceState::Succeeded,
            result: result.clone(),
            available_at: v.available_at,
            finished_at: Some(now),
            error_class: None,
            error_message: None,
            outcome: AttemptOutcome::Succeeded,
        },
        Finish::Failed { class, message } => {
            let retry = *class == ErrorClass::Transient && v.attempts < v.max_attempts;
            if retry && cancel_requested {
                return Ok(FinishPlan {
                    state: OccurrenceState::Canceled,
                    result: None,
                    available_at: v.available_at,
                    finished_at: Some(now),
                    error_class: Some(class.as_str()),
                    error_message: Some(message.clone()),
                    outcome: AttemptOutcome::Failed,
                });
            }
            let available_at = if retry {
                let initial = v.backoff_initial_ms.max(1);
                let backoff = Backoff::new(
                    SignedDuration::from_millis(initial),
                    SignedDuration::from_millis(v.backoff_max_ms.max(initial)),
                )
                .map_err(|e| StoreError::Database(e.to_string()))?;
                // Schedules validate their backoff (at most 30 days); a row stored before that
                // check still gets an instant that exists, not an error that fails its batch.
                let delay =
                    i64::try_from(backoff.delay(id, v.attempts).as_millis()).unwrap_or(i64::MAX);
                now.saturating_add(delay)
                    .min(Timestamp::MAX.as_second() * 1000)
            } else {
                v.available_at
            };
            FinishPlan {
                state: if retry {
                    OccurrenceState::RetryWait
                } else {
                    OccurrenceState::Dead
                },
                result: None,
                available_at,
                finished_at: (!retry).then_some(now),
                error_class: Some(class.as_str()),
                error_message: Some(message.clone()),
                outcome: AttemptOutcome::Failed,
            }
        }
    })
}

impl FinishPlan {
    /// When the outbox row of a relayed occurrence is due again after this write, if it must
    /// move. While the occurrence was in flight, a relay's scan may have put the row off to the
    /// lease's end; a failure makes it due at the retry instant, or now for a dead letter, so
    /// that a short back-off is not stretched to the lease. A success needs nothing: the row
    /// settles whenever a relay next meets it.
    #[must_use]
    pub fn outbox_due(&self, now: i64) -> Option<i64> {
        match (self.outcome, self.state) {
            (AttemptOutcome::Failed, OccurrenceState::RetryWait) => Some(self.available_at),
            (AttemptOutcome::Failed, _) => Some(now),
            _ => None,
        }
    }
}

impl FenceView {
    /// The view after `plan` was written (for a later item of the same batch).
    pub fn apply(&mut self, plan: &FinishPlan) {
        self.state = plan.state;
        self.available_at = plan.available_at;
    }
}

/// What a claim does with a due occurrence of an overlap-constrained schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverlapDecision {
    /// Claim it.
    Claim,
    /// Leave it pending: it is the one allowed to wait (`QUEUE_ONE`).
    Wait,
    /// Record it as `SKIPPED_OVERLAP`.
    Skip,
}

/// What a claim knows about an overlap-constrained candidate's schedule: what its other
/// occurrences did when this one came due (its `available_at`, read from their recorded
/// `claimed_at` and `finished_at`), and what they do now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OverlapFacts {
    /// Another occurrence had been claimed by then and was still running then.
    pub ran_at_due: bool,
    /// One ahead of it in claim order was due by then and had not been claimed then (it is
    /// still pending, or it was claimed later).
    pub waited_at_due: bool,
    /// Another occurrence is running now.
    pub running: bool,
    /// One ahead of it in claim order is due and pending now.
    pub earlier_waiting: bool,
}

/// Decides an overlap-constrained candidate. A skip follows only from what happened when the
/// candidate came due, so any claim, however late (a lone worker that claims only after its
/// run has ended), decides it the same; whether it runs now or waits follows from now.
///
/// - `SKIP_IF_RUNNING`: skipped when another run was in progress at its due time.
/// - `QUEUE_ONE`: skipped when another run was in progress and another one already waited at
///   its due time (it would have been the second in line).
/// - Otherwise it waits while another one runs or one ahead of it waits, and is claimed when
///   neither holds: occurrences that all came due while nothing ran (a backlog after a pause)
///   run one after the other.
pub fn overlap_decision(policy: campanile_core::Overlap, f: OverlapFacts) -> OverlapDecision {
    use campanile_core::Overlap;
    let skip = match policy {
        Overlap::SkipIfRunning => f.ran_at_due,
        Overlap::QueueOne => f.ran_at_due && f.waited_at_due,
        _ => false,
    };
    if skip {
        OverlapDecision::Skip
    } else if policy != Overlap::Allow && (f.running || f.earlier_waiting) {
        OverlapDecision::Wait
    } else {
        OverlapDecision::Claim
    }
}

#[cfg(test)]
mod overlap_tests {
    use super::{OverlapDecision::*, OverlapFacts, overlap_decision};
    use campanile_core::Overlap::*;

    #[test]
    fn overlap_decisions() {
        let f = |ran_at_due, waited_at_due, running, earlier_waiting| OverlapFacts {
            ran_at_due,
            waited_at_due,
            running,
            earlier_waiting,
        };
        for (policy, facts, want) in [
            // Nothing ran or waited when it came due, nothing runs or waits now.
            (SkipIfRunning, f(false, false, false, false), Claim),
            (QueueOne, f(false, false, false, false), Claim),
            // A run was in progress when it came due: skipped, even if that run has ended
            // since (the claim came late).
            (SkipIfRunning, f(true, false, true, false), Skip),
            (SkipIfRunning, f(true, false, false, false), Skip),
            // It came due while nothing ran, but something runs now (the backlog of a pause):
            // it waits its turn.
            (SkipIfRunning, f(false, false, true, false), Wait),
            (SkipIfRunning, f(false, true, false, true), Wait),
            // QUEUE_ONE: the first to come due behind a run waits, and is claimed once the
            // run has ended, however late the claim.
            (QueueOne, f(true, false, true, false), Wait),
            (QueueOne, f(true, false, false, false), Claim),
            // The second behind a run is skipped, whether or not the first is still waiting.
            (QueueOne, f(true, true, true, true), Skip),
            (QueueOne, f(true, true, false, false), Skip),
            // An earlier one waits while nothing runs (a claim could not lock it): this one is
            // left for a later claim, not skipped.
            (QueueOne, f(false, true, false, true), Wait),
            (QueueOne, f(false, false, false, true), Wait),
            (Allow, f(true, true, true, true), Claim),
        ] {
            assert_eq!(
                overlap_decision(policy, facts),
                want,
                "{policy:?} {facts:?}"
            );
        }
    }
}

/// What the relay does with one due outbox row, decided from its occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayStep {
    /// Claim the occurrence and publish it.
    Claim,
    /// The occurrence has ended: settle the row with this outcome.
    Settle(OccurrenceState),
    /// Not claimable yet (retry back-off, a live lease): look again at this instant (ms).
    Postpone(i64),
}

/// Re-examine a row whose expired lease has no attempts left after this long (ms): the
/// recovery sweep is about to make its occurrence `DEAD`, and the row then settles.
pub const RELAY_RECHECK_MS: i64 = 1_000;

/// The relay's decision for the occurrence of a due outbox row, at `now` (ms). The view is
/// the occurrence's row as read in the relay's transaction.
#[must_use]
pub fn relay_step(v: &FenceView, now: i64) -> RelayStep {
    match v.state {
        s if s.is_final() => RelayStep::Settle(s),
        OccurrenceState::Ready | OccurrenceState::RetryWait | OccurrenceState::Scheduled => {
            if v.available_at <= now {
                RelayStep::Claim
            } else {
                RelayStep::Postpone(v.available_at)
            }
        }
        _ => match v.lease_until {
            Some(until) if until > now => RelayStep::Postpone(until),
            _ if v.attempts < v.max_attempts => RelayStep::Claim,
            _ => RelayStep::Postpone(now.saturating_add(RELAY_RECHECK_MS)),
        },
    }
}

/// Whether the control plane was down until `now`, from the latest liveness mark's end
/// (`last_alive`) and the latest instant a node was seen (`last_seen`), both `None` before any
/// node ever started: `Some(last seen)` when no mark is valid (alive means `alive_until >
/// now`, as for the planners' fair share).
#[must_use]
pub fn down_since(last_alive: Option<i64>, last_seen: Option<i64>, now: i64) -> Option<i64> {
    match (last_alive, last_seen) {
        (Some(until), Some(since)) if until <= now => Some(since),
        _ => None,
    }
}

/// A schedule's state after an update that leaves `has_next` (whether the new definition has
/// an instant to plan): a paused one stays paused (it plans on resume); an active or finished
/// one is `ACTIVE` with an instant to plan and `FINISHED` without. The caller refuses updates
/// of a canceled schedule before asking.
#[must_use]
pub fn updated_state(state: ScheduleState, has_next: bool) -> ScheduleState {
    match state {
        ScheduleState::Paused | ScheduleState::Canceled => state,
        _ if has_next => ScheduleState::Active,
        _ => ScheduleState::Finished,
    }
}

#[cfg(test)]
mod updated_state_tests {
    use super::*;

    #[test]
    fn an_update_finishes_or_revives_only_what_is_not_paused() {
        use ScheduleState::*;
        assert_eq!(updated_state(Active, true), Active);
        assert_eq!(updated_state(Active, false), Finished);
        assert_eq!(updated_state(Finished, true), Active);
        assert_eq!(updated_state(Finished, false), Finished);
        assert_eq!(updated_state(Paused, true), Paused);
        assert_eq!(updated_state(Paused, false), Paused);
    }
}

/// Checks a change's [`crate::Superseded`] against the schedule's current `version`, before
/// the change writes anything: `Ok(())` for no list (version 0: a pause or a resume) or a list
/// of that version, empty or not; a [`StoreError::VersionConflict`] for a list read for another
/// version (before a concurrent change: even an empty one, since the versions in between may
/// have left instants to record); [`StoreError::Invalid`] for a row that is not a `CANCELED`
/// occurrence of its version.
///
/// # Errors
///
/// As above.
pub fn superseded_check(s: &crate::Superseded, version: u32) -> Result<(), StoreError> {
    if s.version == 0 && s.is_empty() {
        return Ok(());
    }
    if s.version != version {
        return Err(StoreError::VersionConflict { current: version });
    }
    let stray = s
        .rows
        .iter()
        .any(|o| o.version != version || o.state != OccurrenceState::Canceled)
        || s.rest.as_ref().is_some_and(|r| r.version != version);
    if stray {
        return Err(StoreError::Invalid(
            "superseded instants must be CANCELED occurrences of the replaced version".into(),
        ));
    }
    Ok(())
}

/// Whether the store may hand out work (worker and relay claims) at `now`, from the latest
/// liveness mark's end (`last_alive`, `None` before any node ever started): not while no mark
/// is valid. Then the control plane is down (as [`down_since`] says), and what came due
/// meanwhile waits for the next node's acquisition, which judges it against its misfire policy
/// before that node's mark makes claims possible again. Checked inside each claim, so a claim
/// that waited out an outage (a stalled database, a pool wait) cannot take such work first.
#[must_use]
pub fn hands_out_work(last_alive: Option<i64>, now: i64) -> bool {
    last_alive.is_none_or(|until| until > now)
}

/// How long after its end a node's liveness mark is dropped (by another node's acquisition,
/// which has just written the latest mark): a day, far longer than any lease.
pub const STALE_MARK_MS: i64 = 86_400_000;

/// [`hands_out_work`] as an SQL boolean over `planner_nodes`, for a claim statement; `now` is
/// the statement's expression for its instant (PostgreSQL's claims; SQLite's writer calls
/// [`hands_out_work`] itself). A scalar subquery of its own, so that PostgreSQL evaluates it
/// once per statement (a one-time filter) even when `now` reads the clock, a volatile
/// function: as a plain condition it would be a filter on every row scanned, and a statement
/// refused by it would walk its whole candidate range to return nothing.
#[must_use]
pub fn hands_out_work_sql(now: &str) -> String {
    format!("(SELECT COALESCE((SELECT MAX(alive_until) FROM planner_nodes) > {now}, TRUE))")
}

#[cfg(test)]
mod relay_tests {
    use super::*;

    fn view(state: OccurrenceState, available_at: i64, lease_until: Option<i64>) -> FenceView {
        FenceView {
            state,
            owner: None,
            epoch: 0,
            lease_until,
            available_at,
            attempts: 1,
            max_attempts: 2,
            backoff_initial_ms: 1,
            backoff_max_ms: 1,
        }
    }

    #[test]
    fn work_is_handed_out_unless_every_mark_has_lapsed() {
        assert!(hands_out_work(None, 10), "no node ever started");
        assert!(hands_out_work(Some(11), 10));
        // At alive_until exactly the mark has lapsed, as for the outage check.
        assert!(!hands_out_work(Some(10), 10));
        assert!(!hands_out_work(Some(3), 10));
        for (last_alive, now) in [(None, 10), (Some(11), 10), (Some(10), 10), (Some(3), 10)] {
            assert_eq!(
                hands_out_work(last_alive, now),
                down_since(last_alive, last_alive, now).is_none(),
                "the claim gate and the outage check agree on what 'down' is"
            );
        }
    }

    #[test]
    fn relay_claims_due_work_settles_ended_work_and_postpones_the_rest() {
        use OccurrenceState::*;
        assert_eq!(relay_step(&view(Ready, 10, None), 10), RelayStep::Claim);
        assert_eq!(
            relay_step(&view(Ready, 11, None), 10),
            RelayStep::Postpone(11)
        );
        assert_eq!(
            relay_step(&view(RetryWait, 50, None), 10),
            RelayStep::Postpone(50)
        );
        assert_eq!(
            relay_step(&view(Running, 0, Some(15)), 10),
            RelayStep::Postpone(15)
        );
        // At lease_until exactly the lease has expired.
        assert_eq!(
            relay_step(&view(Running, 0, Some(10)), 10),
            RelayStep::Claim
        );
        let mut spent = view(Running, 0, Some(5));
        spent.attempts = 2;
        assert_eq!(
            relay_step(&spent, 10),
            RelayStep::Postpone(10 + RELAY_RECHECK_MS)
        );
        for s in [Succeeded, Dead, Canceled, Missed, SkippedOverlap] {
            assert_eq!(relay_step(&view(s, 0, None), 10), RelayStep::Settle(s));
        }
    }
}

#[cfg(test)]
mod plan_tests {
    use super::*;
    use campanile_core::ScheduleId;

    /// A refusal names the actual reason: a report for an occurrence nobody claimed says so
    /// and gives its state, not "no owner"; an epoch above the current one was never issued,
    /// so the occurrence was not "re-claimed".
    #[test]
    fn refusals_say_what_actually_happened() {
        let mut v = FenceView {
            state: OccurrenceState::Canceled,
            owner: None,
            epoch: 0,
            lease_until: None,
            available_at: 0,
            attempts: 0,
            max_attempts: 3,
            backoff_initial_ms: 1,
            backoff_max_ms: 1,
        };
        let c = check(&v, "w", 0, 10).unwrap();
        assert_eq!(
            c,
            Some(Conflict::NotClaimed {
                state: OccurrenceState::Canceled
            })
        );
        v.state = OccurrenceState::Running;
        v.owner = Some("w".into());
        v.epoch = 1;
        v.lease_until = Some(100);
        let ahead = check(&v, "w", 2, 10).unwrap().unwrap().to_string();
        assert!(ahead.contains("never issued"), "{ahead}");
        v.epoch = 3;
        let behind = check(&v, "w", 2, 10).unwrap().unwrap().to_string();
        assert!(behind.contains("re-claimed (epoch 3)"), "{behind}");
    }

    /// Only a `RUNNING` occurrence is held: a refusal for any other says whether the caller
    /// held it at this epoch (its lease ran out: `lease_expired`; its claim ended otherwise:
    /// `wrong_state`) or not (`not_claimed`), never that another worker holds a lease.
    #[test]
    fn an_occurrence_no_worker_holds_is_refused_as_not_claimed() {
        use OccurrenceState::*;
        let row = |state, owner: Option<&str>, lease_until, attempts| FenceView {
            state,
            owner: owner.map(Into::into),
            epoch: 1,
            lease_until,
            available_at: 0,
            attempts,
            max_attempts: 3,
            backoff_initial_ms: 1,
            backoff_max_ms: 1,
        };
        let checks = |v: &FenceView, now| {
            ["w", "x"].map(|worker| check(v, worker, 1, now).unwrap().map(|c| c.check()))
        };
        for (what, v, now, want) in [
            (
                "running, w's lease",
                row(Running, Some("w"), Some(100), 1),
                10,
                [None, Some("not_owner")],
            ),
            (
                "running, w's lease passed",
                row(Running, Some("w"), Some(100), 1),
                100,
                [Some("lease_expired"), Some("not_owner")],
            ),
            (
                "redriven (owner and lease cleared)",
                row(Ready, None, None, 0),
                10,
                [Some("not_claimed"), Some("not_claimed")],
            ),
            (
                "redriven, the dead attempt's owner left on the row",
                row(Ready, Some("w"), Some(100), 0),
                10,
                [Some("not_claimed"), Some("not_claimed")],
            ),
            (
                "redriven, the dead attempt's owner and a passed lease left on the row",
                row(Ready, Some("w"), Some(5), 0),
                10,
                [Some("not_claimed"), Some("not_claimed")],
            ),
            (
                "swept back after w's lease ran out",
                row(Ready, Some("w"), Some(5), 1),
                10,
                [Some("lease_expired"), Some("not_claimed")],
            ),
            (
                "w's transient failure written",
                row(RetryWait, Some("w"), Some(100), 1),
                10,
                [Some("wrong_state"), Some("not_claimed")],
            ),
            (
                "w's success written",
                row(Succeeded, Some("w"), Some(100), 1),
                10,
                [Some("wrong_state"), Some("not_claimed")],
            ),
            (
                "swept DEAD after w's lease ran out",
                row(Dead, Some("w"), Some(5), 3),
                10,
                [Some("lease_expired"), Some("not_claimed")],
            ),
        ] {
            assert_eq!(checks(&v, now), want, "{what}");
        }
        let c = check(&row(Ready, None, None, 0), "w", 1, 10).unwrap();
        assert_eq!(c, Some(Conflict::NotClaimed { state: Ready }));
        let said = c.unwrap().to_string();
        assert!(!said.contains("held by"), "{said}");
    }

    /// A row whose backoff was stored before schedules were checked for it (up to i64::MAX
    /// ms) still gets a retry instant that exists: the latest one, not an error that would
    /// fail the worker's whole batch.
    #[test]
    fn an_overlong_stored_backoff_retries_at_the_last_instant_not_an_error() {
        let v = FenceView {
            state: OccurrenceState::Running,
            owner: Some("w".into()),
            epoch: 1,
            lease_until: Some(2_000),
            available_at: 0,
            attempts: 1,
            max_attempts: 5,
            backoff_initial_ms: i64::MAX,
            backoff_max_ms: i64::MAX,
        };
        let id =
            campanile_core::occurrence_id(ScheduleId(uuid::Uuid::nil()), 1, Timestamp::UNIX_EPOCH);
        let failed = Finish::Failed {
            class: ErrorClass::Transient,
            message: "later".into(),
        };
        for now in [1_000, 1_001, 1_999] {
            let p = plan(&v, id, &failed, false, now).expect("a plan, not an error");
            assert_eq!(p.state, OccurrenceState::RetryWait);
            assert!(p.available_at >= now);
            assert!(
                ts(p.available_at).is_ok(),
                "{} is no instant",
                p.available_at
            );
        }
    }
}

#[cfg(test)]
mod superseded_tests {
    use super::*;
    use crate::{NewOccurrence, Superseded};

    fn row(version: u32, state: OccurrenceState) -> NewOccurrence {
        NewOccurrence {
            schedule_id: campanile_core::ScheduleId(uuid::Uuid::nil()),
            version,
            scheduled_for: Timestamp::UNIX_EPOCH,
            available_at: Timestamp::UNIX_EPOCH,
            queue: "q".into(),
            priority: 0,
            max_attempts: 1,
            backoff_initial: SignedDuration::from_secs(1),
            backoff_max: SignedDuration::from_secs(1),
            state,
            overlap: campanile_core::Overlap::Allow,
            lease: SignedDuration::from_secs(30),
        }
    }

    #[test]
    fn a_superseded_list_is_written_only_for_the_version_it_was_read_for() {
        // No list (a pause, a resume).
        assert!(superseded_check(&Superseded::default(), 3).is_ok());
        let ok = Superseded {
            version: 3,
            rows: vec![row(3, OccurrenceState::Canceled)],
            rest: None,
        };
        assert!(superseded_check(&ok, 3).is_ok());
        // Read before a concurrent change: a conflict, so that the caller reads again — an
        // empty list too (the change in between may have left instants to record).
        assert!(matches!(
            superseded_check(&ok, 4),
            Err(StoreError::VersionConflict { current: 4 })
        ));
        let empty = Superseded {
            version: 3,
            ..Superseded::default()
        };
        assert!(superseded_check(&empty, 3).is_ok());
        assert!(matches!(
            superseded_check(&empty, 4),
            Err(StoreError::VersionConflict { current: 4 })
        ));
        let stray = Superseded {
            version: 3,
            rows: vec![row(3, OccurrenceState::Ready)],
            rest: None,
        };
        assert!(matches!(
            superseded_check(&stray, 3),
            Err(StoreError::Invalid(_))
        ));
        let other = Superseded {
            version: 3,
            rows: vec![row(2, OccurrenceState::Canceled)],
            rest: None,
        };
        assert!(superseded_check(&other, 3).is_err());
    }
}
