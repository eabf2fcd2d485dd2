//! Schedule changes: create, update, pause, resume, cancel, and listing.

use campanile_core::{OccurrenceId, OccurrenceState, ScheduleId};
use campanile_store::fence::{self};
use campanile_store::*;
use jiff::Timestamp;
use rusqlite::{Connection, OptionalExtension, params};
use uuid::Uuid;

use crate::db::{R, db_err, ts};
use crate::queue::{QueueEntry, queue_get, queue_insert, queue_set, record_superseded};
use crate::version::{schedule_get, version_insert};

pub(crate) fn schedule_create(c: &Connection, p: &ScheduleCreate, now: i64) -> R<()> {
    crate::tenant::check_schedule_quota(c, p.tenant, 1, i64::from(p.fires_per_hour), None)?;
    if let Some(idem) = &p.idempotency {
        let held = c
            .prepare_cached(
                "UPDATE idempotency_keys SET schedule_id = ?4
                  WHERE tenant_id = ?1 AND key = ?2 AND token = ?3 AND status = 0 AND schedule_id IS NULL",
            )
            .and_then(|mut s| s.execute(params![p.tenant.0, idem.key, idem.token, p.id.0]))
            .map_err(db_err)?;
        if held == 0 {
            return Err(StoreError::superseded());
        }
    }
    c.prepare_cached(
        "INSERT INTO schedules (id, tenant_id, version, state, shard, next_run_at, created_at, updated_at, fires_per_hour)
         VALUES (?1, ?2, 1, 'ACTIVE', ?3, ?4, ?5, ?5, ?6)",
    )
    .and_then(|mut s| {
        s.execute(params![
            p.id.0,
            p.tenant.0,
            p.shard,
            p.next_run_at.map(|t| t.as_millisecond()),
            now,
            p.fires_per_hour
        ])
    })
    .map_err(db_err)?;
    if let Some(next) = p.next_run_at {
        let entry = crate::queue::QueueEntry {
            shard: p.shard,
            id: p.id,
            version: 1,
            tenant: p.tenant,
        };
        crate::queue::queue_insert(c, entry, next.as_millisecond())?;
    }
    version_insert(c, p.id, 1, &p.spec, now)
}

pub(crate) fn schedule_list(c: &Connection, p: &ScheduleList) -> R<Vec<ScheduleRecord>> {
    // The cursor as a range of the (tenant, id) index whatever it is: `?2 IS NULL OR s.id > ?2`
    // would scan the tenant's schedules from its first on every page (x'' is the least blob).
    let ids: Vec<Uuid> = c
        .prepare_cached(
            "SELECT s.id FROM schedules s JOIN schedule_versions v ON v.schedule_id = s.id AND v.version = s.version
              WHERE s.tenant_id = ?1 AND s.id > COALESCE(?2, x'') AND (?3 IS NULL OR s.state = ?3)
                AND (?4 IS NULL OR v.queue = ?4) AND (?6 IS NULL OR v.timezone = ?6)
              ORDER BY s.id LIMIT ?5",
        )
        .and_then(|mut s| {
            s.query_map(params![p.tenant.0, p.after.map(|a| a.0), p.state.map(|st| st.as_str()), p.queue, p.limit, p.timezone], |r| r.get(0))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(db_err)?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(rec) = crate::version::schedule_get(c, p.tenant, ScheduleId(id))? {
            out.push(rec);
        }
    }
    Ok(out)
}

/// `(canceled, earliest canceled instant, in flight)`.
pub(crate) type Retired = (u64, Option<i64>, Vec<(OccurrenceId, OccurrenceState)>);

/// Cancels the occurrences of versions below `version` that no worker holds — pending, or
/// waiting to retry (or to be claimed again after a lost lease): left alone, a paused or
/// canceled schedule's retry would run again — flags running ones, and reports those. Returns
/// (canceled, earliest canceled instant, in flight).
pub(crate) fn retire_old_versions(
    c: &Connection,
    id: ScheduleId,
    version: u32,
    now: i64,
) -> R<Retired> {
    let earliest: Option<i64> = c
        .prepare_cached(
            "SELECT MIN(scheduled_for) FROM occurrences
              WHERE schedule_id = ?1 AND version < ?2 AND state IN ('READY', 'RETRY_WAIT')",
        )
        .and_then(|mut s| s.query_row(params![id.0, version], |r| r.get(0)))
        .map_err(db_err)?;
    let canceled = c
        .prepare_cached(
            "UPDATE occurrences SET state = 'CANCELED', finished_at = ?3
              WHERE schedule_id = ?1 AND version < ?2 AND state IN ('READY', 'RETRY_WAIT')",
        )
        .and_then(|mut s| s.execute(params![id.0, version, now]))
        .map_err(db_err)? as u64;
    c.prepare_cached(
        "UPDATE occurrences SET cancel_requested = 1
          WHERE schedule_id = ?1 AND version < ?2 AND state = 'RUNNING'",
    )
    .and_then(|mut s| s.execute(params![id.0, version]))
    .map_err(db_err)?;
    let in_flight = c
        .prepare_cached(
            "SELECT id, state, available_at FROM occurrences
              WHERE schedule_id = ?1 AND version < ?2 AND state = 'RUNNING'",
        )
        .and_then(|mut s| {
            s.query_map(params![id.0, version], |r| {
                Ok((
                    r.get::<_, Uuid>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(db_err)?
        .into_iter()
        .map(|(oid, st, avail)| {
            let st: OccurrenceState = st
                .parse()
                .map_err(|e| StoreError::Database(format!("{e}")))?;
            Ok((OccurrenceId(oid), fence_reported(st, avail, now)))
        })
        .collect::<R<Vec<_>>>()?;
    Ok((canceled, earliest, in_flight))
}

pub(crate) fn fence_reported(st: OccurrenceState, avail: i64, now: i64) -> OccurrenceState {
    campanile_store::fence::reported(st, avail, now)
}

/// `(version, state, shard, next_run_at)`, the latter from the queue while active.
pub(crate) fn current(
    c: &Connection,
    tenant: TenantId,
    id: ScheduleId,
) -> R<(u32, ScheduleState, i32, Option<i64>)> {
    let row: Option<(u32, String, i32, Option<i64>)> = c
        .prepare_cached("SELECT version, state, shard, next_run_at FROM schedules WHERE id = ?1 AND tenant_id = ?2")
        .and_then(|mut s| s.query_row(params![id.0, tenant.0], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))).optional())
        .map_err(db_err)?;
    let (v, st, shard, next) = row.ok_or_else(|| StoreError::NotFound(format!("schedule {id}")))?;
    let st = ScheduleState::parse(&st)
        .ok_or_else(|| StoreError::Database(format!("unknown schedule state '{st}'")))?;
    // Active: where the queue stands; finished: nothing left (the column is the snapshot
    // taken before it finished); paused: where it resumes.
    let next = match st {
        ScheduleState::Active => queue_get(c, shard, id)?,
        ScheduleState::Finished => None,
        _ => next,
    };
    Ok((v, st, shard, next))
}

pub(crate) fn schedule_update(c: &Connection, p: &ScheduleUpdate, now: i64) -> R<ScheduleChange> {
    let (version, state, shard, _) = current(c, p.tenant, p.id)?;
    if version != p.expected_version {
        return Err(StoreError::VersionConflict { current: version });
    }
    fence::superseded_check(&p.superseded, version)?;
    if state == ScheduleState::Canceled {
        return Err(StoreError::WrongState(format!(
            "schedule {} is canceled",
            p.id
        )));
    }
    let new = version + 1;
    let to = fence::updated_state(state, p.next_run_at.is_some());
    if to == ScheduleState::Active {
        // A finished schedule given an instant to plan counts again, as when created.
        let adding = i64::from(state != ScheduleState::Active);
        crate::tenant::check_schedule_quota(
            c,
            p.tenant,
            adding,
            i64::from(p.fires_per_hour),
            Some(p.id),
        )?;
    }
    version_insert(c, p.id, new, &p.spec, now)?;
    c.prepare_cached(
        "UPDATE schedules SET version = ?2, next_run_at = ?3, updated_at = ?4, fires_per_hour = ?5, state = ?6 WHERE id = ?1",
    )
    .and_then(|mut s| {
        s.execute(params![
            p.id.0,
            new,
            p.next_run_at.map(|t| t.as_millisecond()),
            now,
            p.fires_per_hour,
            to.as_str()
        ])
    })
    .map_err(db_err)?;
    if to != ScheduleState::Paused {
        let entry = QueueEntry {
            shard,
            id: p.id,
            version: new,
            tenant: p.tenant,
        };
        queue_set(c, entry, p.next_run_at.map(|t| t.as_millisecond()))?;
    }
    let (canceled, _, in_flight) = retire_old_versions(c, p.id, new, now)?;
    let canceled = canceled + record_superseded(c, p.tenant, &p.superseded, now)?;
    let schedule = schedule_get(c, p.tenant, p.id)?
        .ok_or_else(|| StoreError::NotFound(format!("schedule {}", p.id)))?;
    Ok(ScheduleChange {
        schedule,
        canceled,
        in_flight,
    })
}

pub(crate) fn schedule_transition(
    c: &Connection,
    p: &ScheduleTransition,
    now: i64,
) -> R<ScheduleChange> {
    let (version, state, shard, next) = current(c, p.tenant, p.id)?;
    fence::superseded_check(&p.superseded, version)?;
    let (canceled, in_flight) = match (state, p.to) {
        (ScheduleState::Canceled, _) => {
            return Err(StoreError::WrongState(format!(
                "schedule {} is canceled",
                p.id
            )));
        }
        (ScheduleState::Active | ScheduleState::Finished, ScheduleState::Paused)
        | (_, ScheduleState::Canceled) => {
            // A new version with the same definition: what was planned under the old one is
            // retired; on resume, planning restarts from the earliest retired instant.
            let new = version + 1;
            c.prepare_cached(
                "INSERT INTO schedule_versions (schedule_id, version, kind, cron, timezone, dst_gap, dst_fold,
                     at, every_ms, anchor, queue, payload, priority, lease_ms, max_attempts,
                     backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms, created_at)
                 SELECT schedule_id, ?2, kind, cron, timezone, dst_gap, dst_fold, at, every_ms, anchor, queue,
                        payload, priority, lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms, misfire,
                        overlap, flex_window_ms, ?3
                   FROM schedule_versions WHERE schedule_id = ?1 AND version = ?4",
            )
            .and_then(|mut s| s.execute(params![p.id.0, new, now, version]))
            .map_err(db_err)?;
            let (mut canceled, earliest, in_flight) = retire_old_versions(c, p.id, new, now)?;
            let next = if p.to == ScheduleState::Canceled {
                canceled += record_superseded(c, p.tenant, &p.superseded, now)?;
                None
            } else {
                match (earliest, next) {
                    (Some(e), Some(n)) => Some(e.min(n)),
                    (e, n) => e.or(n),
                }
            };
            c.prepare_cached("UPDATE schedules SET version = ?2, state = ?3, next_run_at = ?4, updated_at = ?5 WHERE id = ?1")
                .and_then(|mut s| s.execute(params![p.id.0, new, p.to.as_str(), next, now]))
                .map_err(db_err)?;
            queue_set(
                c,
                QueueEntry {
                    shard,
                    id: p.id,
                    version: new,
                    tenant: p.tenant,
                },
                None,
            )?;
            (canceled, in_flight)
        }
        // Nothing left to plan (a one-off paused after its occurrence ran): finished.
        (ScheduleState::Paused, ScheduleState::Active) if next.is_none() => {
            c.prepare_cached(
                "UPDATE schedules SET state = 'FINISHED', updated_at = ?2 WHERE id = ?1",
            )
            .and_then(|mut s| s.execute(params![p.id.0, now]))
            .map_err(db_err)?;
            (0, Vec::new())
        }
        (ScheduleState::Paused, ScheduleState::Active) => {
            // Resuming makes the schedule count again: the same quotas as creating it.
            let fires: i64 = c
                .prepare_cached("SELECT fires_per_hour FROM schedules WHERE id = ?1")
                .and_then(|mut s| s.query_row(params![p.id.0], |r| r.get(0)))
                .map_err(db_err)?;
            crate::tenant::check_schedule_quota(c, p.tenant, 1, fires, None)?;
            c.prepare_cached(
                "UPDATE schedules SET state = 'ACTIVE', updated_at = ?2 WHERE id = ?1",
            )
            .and_then(|mut s| s.execute(params![p.id.0, now]))
            .map_err(db_err)?;
            queue_set(
                c,
                QueueEntry {
                    shard,
                    id: p.id,
                    version,
                    tenant: p.tenant,
                },
                next,
            )?;
            (0, Vec::new())
        }
        // Already in the requested state: nothing to do.
        _ => (0, Vec::new()),
    };
    let schedule = schedule_get(c, p.tenant, p.id)?
        .ok_or_else(|| StoreError::NotFound(format!("schedule {}", p.id)))?;
    Ok(ScheduleChange {
        schedule,
        canceled,
        in_flight,
    })
}

pub(crate) fn schedule_create_many(c: &Connection, p: &ScheduleCreateMany, now: i64) -> R<u64> {
    let mut sched = c
        .prepare_cached(
            "INSERT INTO schedules (id, tenant_id, version, state, shard, next_run_at, created_at, updated_at)
             VALUES (?1, ?2, 1, 'ACTIVE', ?3, ?4, ?5, ?5)",
        )
        .map_err(db_err)?;
    let mut n = 0;
    for (id, shard, next) in &p.items {
        n += sched
            .execute(params![
                id.0,
                p.tenant.0,
                shard,
                next.map(|t| t.as_millisecond()),
                now
            ])
            .map_err(db_err)? as u64;
        version_insert(c, *id, 1, &p.spec, now)?;
        if let Some(next) = next {
            let entry = QueueEntry {
                shard: *shard,
                id: *id,
                version: 1,
                tenant: p.tenant,
            };
            queue_insert(c, entry, next.as_millisecond())?;
        }
    }
    Ok(n)
}

pub(crate) fn schedule_position(
    c: &Connection,
    tenant: TenantId,
    id: ScheduleId,
) -> R<Option<Timestamp>> {
    let shard: Option<(i32, String)> = c
        .prepare_cached("SELECT shard, state FROM schedules WHERE id = ?1 AND tenant_id = ?2")
        .and_then(|mut s| {
            s.query_row(params![id.0, tenant.0], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(db_err)?;
    match shard {
        Some((shard, state)) if state == "ACTIVE" => queue_get(c, shard, id)?.map(ts).transpose(),
        _ => Ok(None),
    }
}
