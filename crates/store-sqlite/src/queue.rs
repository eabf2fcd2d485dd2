//! The planning queue (one entry per active schedule: its next fire and version) and the record
//! of what was missed or superseded.

use campanile_core::ScheduleId;
use campanile_store::*;
use rusqlite::{CachedStatement, Connection, OptionalExtension, params};

use crate::db::{R, db_err};
use crate::occurrence::insert_occurrences;

/// Where a schedule stands in its shard's planning queue (a scan of one shard).
pub(crate) fn queue_get(c: &Connection, shard: i32, id: ScheduleId) -> R<Option<i64>> {
    c.prepare_cached("SELECT next_run_at FROM schedule_queue WHERE shard = ?1 AND schedule_id = ?2")
        .and_then(|mut s| s.query_row(params![shard, id.0], |r| r.get(0)).optional())
        .map_err(db_err)
}

/// A schedule's place in its shard's planning queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueEntry {
    pub(crate) shard: i32,
    pub(crate) id: ScheduleId,
    pub(crate) version: u32,
    pub(crate) tenant: TenantId,
}

/// Enters a schedule in its shard's queue at `next`.
pub(crate) fn queue_insert(c: &Connection, e: QueueEntry, next: i64) -> R<()> {
    QueueInsert::new(c)?.insert(e, next)
}

/// The queue insert, prepared once for a planning batch (see [`OccurrenceInsert`]).
pub(crate) struct QueueInsert<'c>(CachedStatement<'c>);

impl<'c> QueueInsert<'c> {
    pub(crate) fn new(c: &'c Connection) -> R<Self> {
        c.prepare_cached(
            "INSERT INTO schedule_queue (shard, next_run_at, schedule_id, version, tenant_id)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map(QueueInsert)
        .map_err(db_err)
    }

    pub(crate) fn insert(&mut self, e: QueueEntry, next: i64) -> R<()> {
        self.0
            .execute(params![e.shard, next, e.id.0, e.version, e.tenant.0])
            .map(|_| ())
            .map_err(db_err)
    }
}

/// Puts a schedule at `next` in its shard's queue (or takes it out).
pub(crate) fn queue_set(c: &Connection, e: QueueEntry, next: Option<i64>) -> R<()> {
    c.prepare_cached("DELETE FROM schedule_queue WHERE shard = ?1 AND schedule_id = ?2")
        .and_then(|mut s| s.execute(params![e.shard, e.id.0]))
        .map_err(db_err)?;
    if let Some(next) = next {
        queue_insert(c, e, next)?;
    }
    Ok(())
}

/// Writes [`ScheduleTransition::superseded`] (or the update's), checked beforehand with
/// `fence::superseded_check`; how many occurrences were new (the summarized rest is not
/// counted).
pub(crate) fn record_superseded(
    c: &Connection,
    tenant: TenantId,
    superseded: &Superseded,
    now: i64,
) -> R<u64> {
    if superseded.is_empty() {
        return Ok(0);
    }
    if let Some(m) = &superseded.rest {
        missed_range_insert(c, tenant, m, now)?;
    }
    insert_occurrences(c, tenant, &superseded.rows, now)
}

/// A summary of instants that did not run, in one row.
pub(crate) fn missed_range_insert(
    c: &Connection,
    tenant: TenantId,
    m: &MissedRange,
    now: i64,
) -> R<()> {
    c.prepare_cached(
        "INSERT INTO missed_ranges (tenant_id, schedule_id, version, first_at, last_at, count, count_exact, recorded_at, superseded)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT DO NOTHING",
    )
    .and_then(|mut s| {
        s.execute(params![
            tenant.0,
            m.schedule_id.0,
            m.version,
            m.first_at.as_millisecond(),
            m.last_at.as_millisecond(),
            m.count as i64,
            m.count_exact,
            now,
            m.superseded
        ])
    })
    .map_err(db_err)?;
    Ok(())
}
