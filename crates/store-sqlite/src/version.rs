//! Schedule versions and schedule records as read: the definition's columns and their rows.

use campanile_core::{Misfire, ScheduleId};
use campanile_store::*;
use jiff::SignedDuration;
use rusqlite::{Connection, OptionalExtension, Row, params};
use uuid::Uuid;

use crate::db::{R, db_err, dur_ms, ts};

pub(crate) fn version_insert(
    c: &Connection,
    id: ScheduleId,
    version: u32,
    spec: &ScheduleSpec,
    now: i64,
) -> R<()> {
    let t = spec.timing.columns();
    c.prepare_cached(
        "INSERT INTO schedule_versions (schedule_id, version, kind, cron, timezone, dst_gap, dst_fold,
             at, every_ms, anchor, queue, payload, priority, lease_ms, max_attempts,
             backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)",
    )
    .and_then(|mut s| {
        s.execute(params![
            id.0,
            version,
            t.kind,
            t.cron,
            t.timezone,
            t.dst_gap,
            t.dst_fold,
            t.at,
            t.every_ms,
            t.anchor,
            spec.queue,
            spec.payload,
            spec.priority,
            dur_ms(spec.lease),
            spec.max_attempts,
            dur_ms(spec.backoff_initial),
            dur_ms(spec.backoff_max),
            spec.misfire.to_json(),
            spec.overlap.as_str(),
            dur_ms(spec.flex_window),
            now
        ])
    })
    .map_err(db_err)?;
    Ok(())
}

/// Reads a version's definition from the columns starting at `at`, in this order: `kind, cron,
/// timezone, dst_gap, dst_fold, at, every_ms, anchor, queue, payload, priority, lease_ms,
/// max_attempts, backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms`.
pub(crate) fn spec_row(r: &Row<'_>, at: usize) -> rusqlite::Result<R<ScheduleSpec>> {
    let kind: String = r.get(at)?;
    let timing = (
        r.get::<_, Option<String>>(at + 1)?,
        r.get::<_, Option<String>>(at + 2)?,
        r.get::<_, Option<String>>(at + 3)?,
        r.get::<_, Option<String>>(at + 4)?,
        r.get::<_, Option<i64>>(at + 5)?,
        r.get::<_, Option<i64>>(at + 6)?,
        r.get::<_, Option<i64>>(at + 7)?,
    );
    let queue: String = r.get(at + 8)?;
    let payload: Option<String> = r.get(at + 9)?;
    let nums = (
        r.get::<_, i32>(at + 10)?,
        r.get::<_, i64>(at + 11)?,
        r.get::<_, u32>(at + 12)?,
        r.get::<_, i64>(at + 13)?,
        r.get::<_, i64>(at + 14)?,
    );
    let misfire: String = r.get(at + 15)?;
    let overlap: String = r.get(at + 16)?;
    let flex: i64 = r.get(at + 17)?;
    Ok((|| {
        let (cron, tz, gap, fold, at_ms, every, anchor) = timing;
        let (priority, lease_ms, max_attempts, bi, bm) = nums;
        Ok(ScheduleSpec {
            timing: Timing::from_columns(&kind, cron, tz, gap, fold, at_ms, every, anchor)?,
            queue,
            payload,
            priority,
            lease: SignedDuration::from_millis(lease_ms),
            max_attempts,
            backoff_initial: SignedDuration::from_millis(bi),
            backoff_max: SignedDuration::from_millis(bm),
            misfire: Misfire::from_json(&misfire).map_err(StoreError::Database)?,
            overlap: overlap
                .parse()
                .map_err(|e| StoreError::Database(format!("{e}")))?,
            flex_window: SignedDuration::from_millis(flex),
        })
    })())
}

/// Every version of a tenant's schedule (`?1` the schedule, `?2` the tenant), oldest first.
pub(crate) const VERSIONS_OF_SCHEDULE: &str = include_str!("sql/versions_of_schedule.sql");

pub(crate) fn schedule_versions(
    c: &Connection,
    tenant: TenantId,
    id: ScheduleId,
) -> R<Vec<ScheduleVersion>> {
    let rows = c
        .prepare_cached(VERSIONS_OF_SCHEDULE)
        .and_then(|mut s| {
            s.query_map(params![id.0, tenant.0], |r| {
                Ok((r.get::<_, u32>(0)?, r.get::<_, i64>(1)?, spec_row(r, 2)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(db_err)?;
    rows.into_iter()
        .map(|(version, created, spec)| {
            Ok(ScheduleVersion {
                version,
                spec: spec?,
                created_at: ts(created)?,
            })
        })
        .collect()
}

/// A tenant's schedule (`?1` the schedule, `?2` the tenant) with its current version's definition.
pub(crate) const SCHEDULE_BY_ID: &str = include_str!("sql/schedule_by_id.sql");

pub(crate) fn schedule_get(
    c: &Connection,
    tenant: TenantId,
    id: ScheduleId,
) -> R<Option<ScheduleRecord>> {
    let row = c
        .prepare_cached(SCHEDULE_BY_ID)
        .and_then(|mut s| {
            s.query_row(params![id.0, tenant.0], |r| {
                let head = (
                    r.get::<_, Uuid>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, u32>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, i32>(4)?,
                    r.get::<_, Option<i64>>(5)?,
                    r.get::<_, i64>(6)?,
                    r.get::<_, i64>(7)?,
                );
                Ok((head, spec_row(r, 8)?))
            })
            .optional()
        })
        .map_err(db_err)?;
    let Some(((id, tenant, version, state, shard, next, created, updated), spec)) = row else {
        return Ok(None);
    };
    Ok(Some(ScheduleRecord {
        id: ScheduleId(id),
        tenant: TenantId(tenant),
        version,
        state: ScheduleState::parse(&state)
            .ok_or_else(|| StoreError::Database(format!("unknown schedule state '{state}'")))?,
        shard,
        next_run_at: next.map(ts).transpose()?,
        spec: spec?,
        created_at: ts(created)?,
        updated_at: ts(updated)?,
    }))
}
