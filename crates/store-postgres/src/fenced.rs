//! An occurrence's fencing columns as a report, a renewal or the relay reads them.

use campanile_store::fence::FenceView;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::db::{R, stored_state, u32_of};

/// An occurrence's fencing view from a row whose first columns are, in order: `seq, id,
/// state, owner, epoch, lease_until, available_at, attempts, max_attempts, backoff_initial_ms,
/// backoff_max_ms` (the statements that read one, e.g. `sql/cancel_lock_item.sql`).
pub(crate) fn fence_view(r: &Row) -> R<(i64, Uuid, FenceView)> {
    Ok((
        r.get(0),
        r.get(1),
        FenceView {
            state: stored_state(r.get(2))?,
            owner: r.get(3),
            epoch: r.get(4),
            lease_until: r.get(5),
            available_at: r.get(6),
            attempts: u32_of(r.get(7)),
            max_attempts: u32_of(r.get(8)),
            backoff_initial_ms: r.get(9),
            backoff_max_ms: r.get(10),
        },
    ))
}
