//! What every statement module shares: the result type, conversions between the store's
//! types and SQLite's columns, and SQLite's errors as the store's.

use campanile_core::{OccurrenceId, OccurrenceState};
use campanile_store::*;
use jiff::{SignedDuration, Timestamp};

pub(crate) type R<T> = Result<T, StoreError>;

pub(crate) fn ts(ms: i64) -> R<Timestamp> {
    Timestamp::from_millisecond(ms)
        .map_err(|e| StoreError::Database(format!("bad instant {ms}: {e}")))
}

pub(crate) fn opt_ts(ms: Option<i64>) -> R<Option<Timestamp>> {
    ms.map(ts).transpose()
}

pub(crate) fn dur_ms(d: SignedDuration) -> i64 {
    d.as_millis()
        .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

pub(crate) fn stored_state(s: &str) -> R<OccurrenceState> {
    s.parse().map_err(|e| StoreError::Database(format!("{e}")))
}

pub(crate) fn refused(id: OccurrenceId, conflict: Conflict) -> Ack {
    Ack {
        occurrence_id: id,
        rows: 0,
        conflict: Some(conflict),
        state: None,
        retry_at: None,
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
