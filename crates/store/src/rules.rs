//! The rules a request to the store meets, decided once: each backend applies them at its front
//! door, so every caller of the [`crate::Store`] trait meets them, and the server only turns a
//! refusal into an answer that says what is wrong.

use jiff::SignedDuration;

use crate::{LeaseRenew, OccurrenceClaim, OccurrenceFinishMany, StoreError};

/// Most occurrences one claim may ask for.
pub const CLAIM_MAX: u32 = 1000;

/// The longest lease a claim or a renewal may ask for: a day.
pub const LEASE_MAX: SignedDuration = SignedDuration::from_secs(86_400);

/// Most bytes of a worker's id.
pub const WORKER_ID_MAX: usize = 200;

/// Most instants one backfill may make or list.
pub const BACKFILL_MAX: usize = 1000;

/// How far a tenant's catch-up pace cursor moves for `count` runs at `rate` per second:
/// rounded up, so that reservations made one after another never exceed the rate.
pub fn catchup_span_ms(count: u32, rate: i64) -> i64 {
    let rate = rate.max(1);
    (i64::from(count) * 1000 + rate - 1) / rate
}

/// A backfill's range and instants: `from < to`, `to` not after `now` (the planner plans the
/// future), at most [`BACKFILL_MAX`] instants.
///
/// # Errors
///
/// [`StoreError::Invalid`] saying what is wrong.
pub fn check_backfill(p: &crate::ScheduleBackfill, now: jiff::Timestamp) -> Result<(), StoreError> {
    if p.from >= p.to {
        return Err(invalid(format!(
            "from ({}) must be before to ({})",
            p.from, p.to
        )));
    }
    if p.to > now {
        return Err(invalid(format!(
            "to ({}) is in the future (now is {now}): a backfill covers past instants; the \
             planner plans the rest",
            p.to
        )));
    }
    if p.instants.len() > BACKFILL_MAX {
        return Err(invalid(format!(
            "the range holds more than {BACKFILL_MAX} instants of the schedule's calendar; one \
             backfill makes at most {BACKFILL_MAX}: split the range"
        )));
    }
    if p.instants.iter().any(|t| *t < p.from || *t >= p.to)
        || p.instants.windows(2).any(|w| w[0] >= w[1])
    {
        return Err(invalid(
            "backfill instants must be ascending, inside [from, to)",
        ));
    }
    Ok(())
}

/// What a backfill does with one instant, given the schedule's rows at that instant under
/// every version (`(version, state, attempts)`; `current` is the version backfilled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackfillKind {
    /// No row of the current version, and none that ever ran: a new occurrence.
    Create,
    /// The current version's row was recorded `MISSED` and never ran: it runs, under its id.
    Rerun,
    /// It ran (under any version), runs, waits, or the current version decided it otherwise
    /// (canceled by an operator, skipped by the overlap policy): listed, never run twice.
    Existing,
}

/// Decides one instant of a backfill (see [`BackfillKind`]). Rows of older versions that never
/// ran (canceled by the change that retired them, missed) do not stand in the way: the
/// instant runs under the current version.
pub fn backfill_kind(
    current: u32,
    rows: impl IntoIterator<Item = (u32, campanile_core::OccurrenceState, u32)>,
) -> BackfillKind {
    use campanile_core::OccurrenceState as S;
    let mut kind = BackfillKind::Create;
    for (version, state, attempts) in rows {
        if attempts > 0 {
            return BackfillKind::Existing;
        }
        if version == current {
            kind = match state {
                S::Missed => BackfillKind::Rerun,
                _ => return BackfillKind::Existing,
            };
        }
    }
    kind
}

/// Sorts a backfill's range rows (every version, ordered by instant then version, latest
/// first) into what it made and ran again (the current version's row) and what it found
/// (the latest row that ran, else the current version's).
pub fn backfill_answer(
    current: u32,
    rows: Vec<crate::Occurrence>,
    [created, rerun, existing]: [&[jiff::Timestamp]; 3],
) -> (
    Vec<crate::Occurrence>,
    Vec<crate::Occurrence>,
    Vec<crate::Occurrence>,
) {
    use std::collections::{BTreeMap, HashSet};
    let set = |v: &[jiff::Timestamp]| v.iter().copied().collect::<HashSet<_>>();
    let (made, again, found) = (set(created), set(rerun), set(existing));
    let mut by_at: BTreeMap<jiff::Timestamp, Vec<crate::Occurrence>> = BTreeMap::new();
    for o in rows {
        by_at.entry(o.scheduled_for).or_default().push(o);
    }
    let (mut c, mut r, mut e) = (Vec::new(), Vec::new(), Vec::new());
    for (at, mut rows) in by_at {
        let current_row = rows.iter().position(|o| o.version == current);
        if made.contains(&at) || again.contains(&at) {
            if let Some(i) = current_row {
                let o = rows.swap_remove(i);
                if made.contains(&at) {
                    c.push(o)
                } else {
                    r.push(o)
                }
            }
        } else if found.contains(&at) {
            let ran = rows.iter().position(|o| o.attempts > 0);
            if let Some(i) = ran.or(current_row) {
                e.push(rows.swap_remove(i));
            }
        }
    }
    (c, r, e)
}

/// A backfill's `Idempotency-Key` sent again with another range or overlap policy.
pub fn backfill_key_reused() -> StoreError {
    invalid(
        "this Idempotency-Key was used by a backfill of another range or overlap policy: use a \
         new key for a new backfill",
    )
}

/// Which instants an outage check keeps running late enough to pace by the tenant's catch-up
/// rate: those not `missed` and older than the misfire policy's lateness.
pub fn outage_paced(
    spec: &crate::ScheduleSpec,
    instants: &[jiff::Timestamp],
    missed: &[jiff::Timestamp],
    now: jiff::Timestamp,
) -> Vec<jiff::Timestamp> {
    let cutoff = now.checked_sub(spec.misfire.max_lateness()).unwrap_or(now);
    instants
        .iter()
        .copied()
        .filter(|t| *t < cutoff && !missed.contains(t))
        .collect()
}

fn invalid(message: impl Into<String>) -> StoreError {
    StoreError::Invalid(message.into())
}

/// A lease a claim or a renewal asks for (`None`: each occurrence's own): positive, at most
/// [`LEASE_MAX`].
///
/// # Errors
///
/// [`StoreError::Invalid`] saying which bound it breaks.
pub fn check_lease(lease: Option<SignedDuration>) -> Result<(), StoreError> {
    match lease {
        Some(l) if l <= SignedDuration::ZERO => Err(invalid("lease must be positive")),
        Some(l) if l > LEASE_MAX => Err(invalid(format!(
            "lease must be at most {} seconds (a day)",
            LEASE_MAX.as_secs()
        ))),
        _ => Ok(()),
    }
}

/// A worker's id: not blank, at most [`WORKER_ID_MAX`] bytes, no NUL (PostgreSQL cannot store
/// one in text; SQLite would).
///
/// # Errors
///
/// [`StoreError::Invalid`] saying what is wrong with it.
pub fn check_worker(worker_id: &str) -> Result<(), StoreError> {
    if worker_id.trim().is_empty() {
        return Err(invalid("worker_id must not be blank"));
    }
    if worker_id.len() > WORKER_ID_MAX {
        return Err(invalid(format!(
            "worker_id is at most {WORKER_ID_MAX} bytes of UTF-8 ({} given)",
            worker_id.len()
        )));
    }
    if worker_id.contains('\0') {
        return Err(invalid("worker_id must not contain NUL characters"));
    }
    Ok(())
}

/// A claim: its worker, a queue workers may claim from
/// ([`campanile_core::check_claimable_queue`]), `max` from 1 to [`CLAIM_MAX`], its lease.
///
/// # Errors
///
/// [`StoreError::Invalid`] for the first rule it breaks.
pub fn check_claim(p: &OccurrenceClaim) -> Result<(), StoreError> {
    check_worker(&p.worker_id)?;
    campanile_core::check_claimable_queue(&p.queue).map_err(|e| invalid(e.0))?;
    if !(1..=CLAIM_MAX).contains(&p.max) {
        return Err(invalid(format!("max must be between 1 and {CLAIM_MAX}")));
    }
    check_lease(p.lease)
}

/// A renewal: its worker and its lease.
///
/// # Errors
///
/// [`StoreError::Invalid`] for the first rule it breaks.
pub fn check_renew(p: &LeaseRenew) -> Result<(), StoreError> {
    check_worker(&p.worker_id)?;
    check_lease(p.lease)
}

/// A batch of reports: its worker.
///
/// # Errors
///
/// [`StoreError::Invalid`] when the worker's id breaks [`check_worker`].
pub fn check_finish(p: &OccurrenceFinishMany) -> Result<(), StoreError> {
    check_worker(&p.worker_id)
}

/// Whether a schedule in `state` may be run on demand ([`crate::Store::schedule_trigger`]):
/// not when paused (pausing says "nothing of this now") or canceled.
///
/// # Errors
///
/// [`StoreError::WrongState`] saying why.
pub fn check_trigger(state: crate::ScheduleState) -> Result<(), StoreError> {
    match state {
        crate::ScheduleState::Paused => Err(StoreError::WrongState(
            "the schedule is paused: resume it to run it".into(),
        )),
        crate::ScheduleState::Canceled => Err(StoreError::WrongState(
            "the schedule is canceled: nothing of it runs again".into(),
        )),
        _ => Ok(()),
    }
}

/// A trigger's `Idempotency-Key` sent again with another payload than the run it made.
pub fn trigger_key_reused() -> StoreError {
    invalid(
        "this Idempotency-Key was used by a trigger with another payload: use a new key for a \
         new run",
    )
}

/// A trigger refused because a planned occurrence of the same version holds its very
/// millisecond (the unique key would take it for that one).
pub fn trigger_collides() -> StoreError {
    StoreError::AlreadyExists(
        "an occurrence of this schedule is planned at this very millisecond; trigger it again"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backfill_runs_what_never_ran_and_nothing_twice() {
        use BackfillKind::*;
        use campanile_core::OccurrenceState as S;
        assert_eq!(backfill_kind(4, []), Create);
        // Ran under an older version (a pause or an update since): never again.
        assert_eq!(backfill_kind(4, [(3, S::Succeeded, 1)]), Existing);
        assert_eq!(backfill_kind(4, [(3, S::Dead, 3)]), Existing);
        // Retired by a change before it ran, then missed under the new version: it runs.
        assert_eq!(
            backfill_kind(4, [(3, S::Canceled, 0), (4, S::Missed, 0)]),
            Rerun
        );
        assert_eq!(backfill_kind(4, [(3, S::Canceled, 0)]), Create);
        assert_eq!(backfill_kind(4, [(3, S::Missed, 0)]), Create);
        // The current version's own decisions stand.
        assert_eq!(backfill_kind(4, [(4, S::Ready, 0)]), Existing);
        assert_eq!(backfill_kind(4, [(4, S::Canceled, 0)]), Existing);
        assert_eq!(backfill_kind(4, [(4, S::SkippedOverlap, 0)]), Existing);
        assert_eq!(
            backfill_kind(4, [(4, S::Missed, 0), (3, S::Succeeded, 1)]),
            Existing
        );
    }

    #[test]
    fn leases_are_positive_and_at_most_a_day() {
        assert!(check_lease(None).is_ok());
        assert!(check_lease(Some(SignedDuration::from_millis(1))).is_ok());
        assert!(check_lease(Some(LEASE_MAX)).is_ok());
        assert!(check_lease(Some(SignedDuration::ZERO)).is_err());
        assert!(check_lease(Some(LEASE_MAX + SignedDuration::from_millis(1))).is_err());
    }

    #[test]
    fn worker_ids_are_printable_and_bounded() {
        assert!(check_worker("w-1").is_ok());
        for bad in ["", "  ", "a\0b"] {
            assert!(check_worker(bad).is_err(), "{bad:?}");
        }
        assert!(check_worker(&"x".repeat(WORKER_ID_MAX)).is_ok());
        assert!(check_worker(&"x".repeat(WORKER_ID_MAX + 1)).is_err());
    }
}
