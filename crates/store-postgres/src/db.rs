//! What every statement module shares: the result type, conversions between the store's
//! types and PostgreSQL's columns, and running a statement with its error mapped.

use campanile_core::{OccurrenceId, OccurrenceState};
use campanile_store::*;
use deadpool_postgres::GenericClient;
use jiff::{SignedDuration, Timestamp};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

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

pub(crate) fn i32_of(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

pub(crate) fn u32_of(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
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

pub(crate) async fn query<C: GenericClient>(
    c: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> R<Vec<Row>> {
    let stmt = c.prepare_cached(sql).await.map_err(pg_err)?;
    c.query(&stmt, params).await.map_err(pg_err)
}

pub(crate) async fn execute<C: GenericClient>(
    c: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> R<u64> {
    let stmt = c.prepare_cached(sql).await.map_err(pg_err)?;
    c.execute(&stmt, params).await.map_err(pg_err)
}

/// What went wrong, in words: the server's message for an error it reported, or the client's
/// with its cause (`tokio_postgres::Error`'s own `Display` says only "db error" for the first
/// and leaves the cause out of the second).
pub(crate) fn pg_message(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return db.to_string();
    }
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

pub(crate) fn pg_err(e: tokio_postgres::Error) -> StoreError {
    use tokio_postgres::error::SqlState;
    let message = pg_message(&e);
    match e.code() {
        Some(c) if *c == SqlState::UNIQUE_VIOLATION => StoreError::AlreadyExists(message),
        // A row of a day retention is archiving (`campanile_sealed_day`).
        Some(c) if *c == SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE => {
            StoreError::WrongState(message)
        }
        Some(c)
            if *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
                || *c == SqlState::CONNECTION_FAILURE
                || *c == SqlState::TOO_MANY_CONNECTIONS =>
        {
            StoreError::Unavailable(message)
        }
        Some(_) => StoreError::Database(message),
        None => StoreError::Unavailable(message),
    }
}

pub(crate) fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => pg_err(e),
        other => StoreError::Unavailable(other.to_string()),
    }
}

/// `now` in Unix milliseconds: the caller's, or the database's clock.
pub(crate) async fn resolve_now<C: deadpool_postgres::GenericClient>(
    c: &C,
    now: Option<Timestamp>,
) -> Result<i64, StoreError> {
    match now {
        Some(t) => Ok(t.as_millisecond()),
        None => {
            let stmt = c
                .prepare_cached("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
                .await
                .map_err(pg_err)?;
            c.query_one(&stmt, &[])
                .await
                .map_err(pg_err)?
                .try_get(0)
                .map_err(pg_err)
        }
    }
}
