//! The claim's write for occurrences already chosen and locked, and a claim's answer row.

use campanile_core::{OccurrenceId, ScheduleId};
use campanile_store::*;
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::db::{R, pg_err, query, ts, u32_of};

/// The claim of occurrences already chosen and locked by the caller's transaction (so this
/// statement's snapshot sees them as locked). `$1` their ids, `$2` owner, `$3` now, `$4`
/// lease length in ms (NULL: each occurrence's own), `$5` the claim's key or NULL.
pub(crate) const CLAIM_IDS: &str = include_str!("sql/claim_ids.sql");

/// Claims these occurrences (already chosen, and locked by the caller's transaction).
pub(crate) async fn claim_ids<C: GenericClient>(
    c: &C,
    ids: &[Uuid],
    owner: &str,
    key: Option<Uuid>,
    now: i64,
    lease: Option<i64>,
) -> R<Vec<Claimed>> {
    let rows = query(c, CLAIM_IDS, &[&ids, &owner, &now, &lease, &key]).await?;
    rows.iter().map(|r| claimed_row(r, now, 8)).collect()
}

/// A claimed occurrence from a claim's row; its lease end is in column `lease_col`.
pub(crate) fn claimed_row(r: &Row, now: i64, lease_col: usize) -> R<Claimed> {
    let lease_until: i64 = r.try_get(lease_col).map_err(pg_err)?;
    Ok(Claimed {
        id: OccurrenceId(r.get(0)),
        schedule_id: ScheduleId(r.get(1)),
        version: u32_of(r.get(2)),
        scheduled_for: ts(r.get(3))?,
        available_at: ts(r.get(4))?,
        epoch: r.get(5),
        lease_until: ts(lease_until)?,
        attempt: u32_of(r.get(6)),
        claimed_at: ts(now)?,
        payload: r.get(7),
        replayed: false,
    })
}
