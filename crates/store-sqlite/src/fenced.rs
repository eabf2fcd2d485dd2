//! An occurrence's fencing view as reports, renewals and the relay read it, and whether work is
//! handed out at all (some node's liveness mark is valid).

use campanile_core::OccurrenceId;
use campanile_store::fence::{self, FenceView};
use campanile_store::*;
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::db::{R, db_err, stored_state};

/// [`fence::hands_out_work`] for this database at `now` (in the writer: atomic with the claim
/// that follows, and ordered after any node's acquisition and its outage check).
pub(crate) fn hands_out_work(c: &Connection, now: i64) -> R<bool> {
    let last_alive: Option<i64> = c
        .prepare_cached("SELECT MAX(alive_until) FROM planner_nodes")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(db_err)?;
    Ok(fence::hands_out_work(last_alive, now))
}

/// An occurrence's `seq` and fence columns as read, in this order: `seq, state, owner, epoch,
/// lease_until, available_at, attempts, max_attempts, backoff_initial_ms, backoff_max_ms`.
pub(crate) type RawFence = (
    i64,
    String,
    Option<String>,
    i64,
    Option<i64>,
    i64,
    u32,
    u32,
    i64,
    i64,
);

/// Reads the fence columns from the first ten columns of a row.
pub(crate) fn raw_fence(r: &Row<'_>) -> rusqlite::Result<RawFence> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
        r.get(9)?,
    ))
}

pub(crate) fn fence_of(raw: RawFence) -> R<(i64, FenceView)> {
    let (seq, state, owner, epoch, lease_until, available_at, attempts, max_attempts, bi, bm) = raw;
    Ok((
        seq,
        FenceView {
            state: stored_state(&state)?,
            owner,
            epoch,
            lease_until,
            available_at,
            attempts,
            max_attempts,
            backoff_initial_ms: bi,
            backoff_max_ms: bm,
        },
    ))
}

/// The fence columns of one occurrence, and whether its cancellation was requested.
pub(crate) fn fence_row(
    c: &Connection,
    tenant: TenantId,
    id: OccurrenceId,
) -> R<Option<(i64, FenceView, bool)>> {
    c.prepare_cached(
        "SELECT seq, state, owner, epoch, lease_until, available_at, attempts, max_attempts,
                backoff_initial_ms, backoff_max_ms, cancel_requested
           FROM occurrences WHERE id = ?1 AND tenant_id = ?2",
    )
    .and_then(|mut s| {
        s.query_row(params![id.0, tenant.0], |r| Ok((raw_fence(r)?, r.get(10)?)))
            .optional()
    })
    .map_err(db_err)?
    .map(|(raw, cancel)| fence_of(raw).map(|(seq, view)| (seq, view, cancel)))
    .transpose()
}
