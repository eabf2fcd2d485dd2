//! Schedule versions and schedule records as read: the definition's columns and their rows.

use campanile_core::{Misfire, ScheduleId};
use campanile_store::*;
use deadpool_postgres::GenericClient;
use jiff::SignedDuration;
use tokio_postgres::Row;

use crate::db::{R, dur_ms, execute, i32_of, query, ts, u32_of};

/// Inserts one schedule version row.
pub(crate) async fn version_insert<C: GenericClient>(
    tx: &C,
    id: ScheduleId,
    version: u32,
    s: &ScheduleSpec,
    now: i64,
) -> R<()> {
    let t = s.timing.columns();
    execute(
        tx,
        "INSERT INTO schedule_versions (schedule_id, version, kind, cron, timezone, dst_gap, dst_fold,
             at, every_ms, anchor, queue, payload, priority, lease_ms, max_attempts,
             backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms, created_at)
         VALUES ($1, $21, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)",
        &[
            &id.0,
            &t.kind,
            &t.cron,
            &t.timezone,
            &t.dst_gap,
            &t.dst_fold,
            &t.at,
            &t.every_ms,
            &t.anchor,
            &s.queue,
            &s.payload,
            &s.priority,
            &dur_ms(s.lease),
            &i32_of(s.max_attempts),
            &dur_ms(s.backoff_initial),
            &dur_ms(s.backoff_max),
            &s.misfire.to_json(),
            &s.overlap.as_str(),
            &dur_ms(s.flex_window),
            &now,
            &i32_of(version),
        ],
    )
    .await?;
    Ok(())
}

pub(crate) fn spec_row(r: &Row, at: usize) -> R<ScheduleSpec> {
    let misfire: String = r.get(at + 15);
    let overlap: String = r.get(at + 16);
    Ok(ScheduleSpec {
        timing: Timing::from_columns(
            r.get::<_, &str>(at),
            r.get(at + 1),
            r.get(at + 2),
            r.get(at + 3),
            r.get(at + 4),
            r.get(at + 5),
            r.get(at + 6),
            r.get(at + 7),
        )?,
        queue: r.get(at + 8),
        payload: r.get(at + 9),
        priority: r.get(at + 10),
        lease: SignedDuration::from_millis(r.get(at + 11)),
        max_attempts: u32_of(r.get(at + 12)),
        backoff_initial: SignedDuration::from_millis(r.get(at + 13)),
        backoff_max: SignedDuration::from_millis(r.get(at + 14)),
        misfire: Misfire::from_json(&misfire).map_err(StoreError::Database)?,
        overlap: overlap
            .parse()
            .map_err(|e| StoreError::Database(format!("{e}")))?,
        flex_window: SignedDuration::from_millis(r.get(at + 17)),
    })
}

pub(crate) fn state_of(s: &str) -> R<ScheduleState> {
    ScheduleState::parse(s)
        .ok_or_else(|| StoreError::Database(format!("unknown schedule state '{s}'")))
}

/// Every version of a tenant's schedule (`$1` the schedule, `$2` the tenant), oldest first.
pub(crate) const VERSIONS_OF_SCHEDULE: &str = include_str!("sql/versions_of_schedule.sql");

pub(crate) async fn schedule_versions<C: GenericClient>(
    c: &C,
    tenant: TenantId,
    id: ScheduleId,
) -> R<Vec<ScheduleVersion>> {
    query(c, VERSIONS_OF_SCHEDULE, &[&id.0, &tenant.0])
        .await?
        .iter()
        .map(|r| {
            Ok(ScheduleVersion {
                version: u32_of(r.get(0)),
                created_at: ts(r.get(1))?,
                spec: spec_row(r, 2)?,
            })
        })
        .collect()
}

/// A tenant's schedule (`$1` the schedule, `$2` the tenant) with its current version's definition.
pub(crate) const SCHEDULE_BY_ID: &str = include_str!("sql/schedule_by_id.sql");

pub(crate) async fn schedule_get<C: GenericClient>(
    c: &C,
    tenant: TenantId,
    id: ScheduleId,
) -> R<Option<ScheduleRecord>> {
    let rows = query(c, SCHEDULE_BY_ID, &[&id.0, &tenant.0]).await?;
    let Some(r) = rows.first() else {
        return Ok(None);
    };
    let state = state_of(r.get(3))?;
    let next: Option<i64> = r.get(5);
    Ok(Some(ScheduleRecord {
        id: ScheduleId(r.get(0)),
        tenant: TenantId(r.get(1)),
        version: u32_of(r.get(2)),
        state,
        shard: r.get(4),
        next_run_at: next.map(ts).transpose()?,
        created_at: ts(r.get(6))?,
        updated_at: ts(r.get(7))?,
        spec: spec_row(r, 8)?,
    }))
}
