//! The planning queue (one entry per active schedule: its next fire, its version and definition)
//! and the record of what was missed or superseded.

use campanile_core::ScheduleId;
use campanile_store::*;
use deadpool_postgres::GenericClient;

use crate::db::{R, execute, i32_of, query};
use crate::occurrence::insert_occurrences;

/// Where an active schedule stands in its shard's planning queue.
pub(crate) async fn queue_get<C: GenericClient>(
    c: &C,
    shard: i32,
    id: ScheduleId,
) -> R<Option<i64>> {
    Ok(query(
        c,
        "SELECT next_run_at FROM schedule_queue WHERE shard = $1 AND schedule_id = $2",
        &[&shard, &id.0],
    )
    .await?
    .first()
    .map(|r| r.get(0)))
}

/// Puts a schedule at `next` in its shard's queue (or takes it out).
pub(crate) async fn queue_set<C: GenericClient>(
    c: &C,
    shard: i32,
    id: ScheduleId,
    version: u32,
    tenant: TenantId,
    next: Option<i64>,
) -> R<()> {
    execute(
        c,
        "DELETE FROM schedule_queue WHERE shard = $1 AND schedule_id = $2",
        &[&shard, &id.0],
    )
    .await?;
    if let Some(next) = next {
        queue_insert(c, shard, id, version, tenant, next).await?;
    }
    Ok(())
}

pub(crate) const QUEUE_INSERT: &str = include_str!("sql/queue_insert.sql");

/// Bulk-created schedules ($2 ids, $3 shards, $4 positions, of tenant $1) entered in the queue
/// with the definition of version 1 of schedule $5, which they all share.
pub(crate) const QUEUE_SEED: &str = include_str!("sql/queue_seed.sql");

/// Enters a schedule in its shard's queue at `next`, with the definition of `version` (whose
/// row must be written first).
pub(crate) async fn queue_insert<C: GenericClient>(
    c: &C,
    shard: i32,
    id: ScheduleId,
    version: u32,
    tenant: TenantId,
    next: i64,
) -> R<()> {
    let n = execute(
        c,
        QUEUE_INSERT,
        &[&shard, &next, &id.0, &i32_of(version), &tenant.0],
    )
    .await?;
    if n == 1 {
        Ok(())
    } else {
        Err(StoreError::Database(format!(
            "schedule {id} has no version {version} to enter in the planning queue"
        )))
    }
}

/// Writes [`ScheduleTransition::superseded`] (or the update's), checked beforehand with
/// `fence::superseded_check`; how many occurrences were new (the summarized rest is not
/// counted).
pub(crate) async fn record_superseded<C: GenericClient>(
    c: &C,
    tenant: TenantId,
    superseded: &Superseded,
    now: i64,
) -> R<u64> {
    if superseded.is_empty() {
        return Ok(0);
    }
    if let Some(m) = &superseded.rest {
        missed_range_insert(c, tenant, m, now).await?;
    }
    insert_occurrences(c, tenant, &superseded.rows, now).await
}

/// A summary of instants that did not run, in one row.
pub(crate) async fn missed_range_insert<C: GenericClient>(
    c: &C,
    tenant: TenantId,
    m: &MissedRange,
    now: i64,
) -> R<()> {
    execute(
        c,
        "INSERT INTO missed_ranges (tenant_id, schedule_id, version, first_at, last_at, count, count_exact, recorded_at, superseded)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
        &[
            &tenant.0,
            &m.schedule_id.0,
            &i32_of(m.version),
            &m.first_at.as_millisecond(),
            &m.last_at.as_millisecond(),
            &(m.count as i64),
            &m.count_exact,
            &now,
            &m.superseded,
        ],
    )
    .await?;
    Ok(())
}
