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
