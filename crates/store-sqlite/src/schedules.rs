//! Schedules, planning batches and shard leases on SQLite.

use campanile_core::{Misfire, OccurrenceId, OccurrenceState, ScheduleId};
use campanile_store::*;
use jiff::{SignedDuration, Timestamp};
use rusqlite::{CachedStatement, Connection, OptionalExtension, Row, params};
use uuid::Uuid;

use crate::db_err;
use crate::ops::{OccurrenceInsert, insert_occurrences, version_insert};

type R<T> = Result<T, StoreError>;

fn ts(ms: i64) -> R<Timestamp> {
    Timestamp::from_millisecond(ms)
        .map_err(|e| StoreError::Database(format!("bad instant {ms}: {e}")))
}

const SPEC_COLS: &str = "v.kind, v.cron, v.timezone, v.dst_gap, v.dst_fold, v.at, v.every_ms, v.anchor,
    v.queue, v.payload, v.priority, v.lease_ms, v.max_attempts, v.backoff_initial_ms, v.backoff_max_ms,
    v.misfire, v.overlap, v.flex_window_ms";

/// Reads the spec columns starting at `at`.
fn spec_row(r: &Row<'_>, at: usize) -> rusqlite::Result<R<ScheduleSpec>> {
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

/// Where a schedule stands in its shard's planning queue (a scan of one shard).
fn queue_get(c: &Connection, shard: i32, id: ScheduleId) -> R<Option<i64>> {
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
struct QueueInsert<'c>(CachedStatement<'c>);

impl<'c> QueueInsert<'c> {
    fn new(c: &'c Connection) -> R<Self> {
        c.prepare_cached(
            "INSERT INTO schedule_queue (shard, next_run_at, schedule_id, version, tenant_id)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map(QueueInsert)
        .map_err(db_err)
    }

    fn insert(&mut self, e: QueueEntry, next: i64) -> R<()> {
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
fn record_superseded(
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
fn missed_range_insert(c: &Connection, tenant: TenantId, m: &MissedRange, now: i64) -> R<()> {
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

pub(crate) fn schedule_versions(
    c: &Connection,
    tenant: TenantId,
    id: ScheduleId,
) -> R<Vec<ScheduleVersion>> {
    let rows = c
        .prepare_cached(&format!(
            "SELECT v.version, v.created_at, {SPEC_COLS}
               FROM schedule_versions v JOIN schedules s ON s.id = v.schedule_id
              WHERE v.schedule_id = ?1 AND s.tenant_id = ?2
              ORDER BY v.version"
        ))
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

pub(crate) fn schedule_get(
    c: &Connection,
    tenant: TenantId,
    id: ScheduleId,
) -> R<Option<ScheduleRecord>> {
    let row = c
        .prepare_cached(&format!(
            "SELECT s.id, s.tenant_id, s.version, s.state, s.shard, s.next_run_at, s.created_at, s.updated_at, {SPEC_COLS}
               FROM schedules s JOIN schedule_versions v ON v.schedule_id = s.id AND v.version = s.version
              WHERE s.id = ?1 AND s.tenant_id = ?2"
        ))
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

/// `(canceled, earliest canceled instant, in flight)`.
type Retired = (u64, Option<i64>, Vec<(OccurrenceId, OccurrenceState)>);

/// Cancels the occurrences of versions below `version` that no worker holds — pending, or
/// waiting to retry (or to be claimed again after a lost lease): left alone, a paused or
/// canceled schedule's retry would run again — flags running ones, and reports those. Returns
/// (canceled, earliest canceled instant, in flight).
fn retire_old_versions(c: &Connection, id: ScheduleId, version: u32, now: i64) -> R<Retired> {
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

fn fence_reported(st: OccurrenceState, avail: i64, now: i64) -> OccurrenceState {
    campanile_store::fence::reported(st, avail, now)
}

/// `(version, state, shard, next_run_at)`, the latter from the queue while active.
fn current(
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
        crate::admin::check_schedule_quota(
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
            crate::admin::check_schedule_quota(c, p.tenant, 1, fires, None)?;
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

pub(crate) fn schedule_due(c: &Connection, p: &ScheduleDueList) -> R<Vec<DueSchedule>> {
    c.prepare_cached(&format!(
        "SELECT q.schedule_id, q.tenant_id, q.version, q.next_run_at, {SPEC_COLS}
           FROM schedule_queue q
           JOIN schedule_versions v ON v.schedule_id = q.schedule_id AND v.version = q.version
          WHERE q.shard = ?1 AND q.next_run_at <= ?2
          ORDER BY q.next_run_at LIMIT ?3"
    ))
    .and_then(|mut s| {
        s.query_map(params![p.shard, p.before.as_millisecond(), p.limit], |r| {
            Ok((
                r.get::<_, Uuid>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, u32>(2)?,
                r.get::<_, i64>(3)?,
                spec_row(r, 4)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()
    })
    .map_err(db_err)?
    .into_iter()
    .map(|(id, tenant, version, next, spec)| {
        let mut spec = spec?;
        spec.payload = None;
        Ok(DueSchedule {
            id: ScheduleId(id),
            tenant: TenantId(tenant),
            version,
            next_run_at: ts(next)?,
            spec,
        })
    })
    .collect()
}

pub(crate) fn schedule_next_due(c: &Connection, shards: &[i32]) -> R<Option<Timestamp>> {
    let mut best: Option<i64> = None;
    let mut stmt = c
        .prepare_cached("SELECT MIN(next_run_at) FROM schedule_queue WHERE shard = ?1")
        .map_err(db_err)?;
    for shard in shards {
        let m: Option<i64> = stmt
            .query_row(params![shard], |r| r.get(0))
            .map_err(db_err)?;
        best = match (best, m) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    best.map(ts).transpose()
}

fn check_shard(c: &Connection, shard: i32, node: &str, epoch: i64, now: i64) -> R<()> {
    let row: Option<(Option<String>, i64, Option<i64>)> = c
        .prepare_cached("SELECT owner, epoch, lease_until FROM shard_leases WHERE shard = ?1")
        .and_then(|mut s| {
            s.query_row(params![shard], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()
        })
        .map_err(db_err)?;
    match row {
        Some((Some(owner), e, Some(until))) if owner == node && e == epoch && until > now => Ok(()),
        other => Err(StoreError::Fenced(format!(
            "node {node} no longer holds shard {shard} at epoch {epoch} ({other:?})"
        ))),
    }
}

pub(crate) fn plan_commit(c: &Connection, p: &PlanCommit, now: i64) -> R<PlanReport> {
    check_shard(c, p.shard, &p.node, p.shard_epoch, now)?;
    let mut report = PlanReport::default();
    // In key order: the schedules touched share B-tree pages as much as they can.
    let mut items: Vec<&PlanItem> = p.items.iter().collect();
    items.sort_by_key(|i| i.schedule_id);
    // Prepared once for the batch, not looked up in the statement cache per schedule. (One
    // UPDATE of the queue entry's key instead of the DELETE and INSERT costs more: SQLite
    // checks the new key for a conflict with a seek of its own.)
    let mut remove = c
        .prepare_cached(
            "DELETE FROM schedule_queue
              WHERE shard = ?1 AND next_run_at = ?2 AND schedule_id = ?3 AND version = ?4 AND tenant_id = ?5",
        )
        .map_err(db_err)?;
    let mut requeue = QueueInsert::new(c)?;
    let mut insert = OccurrenceInsert::new(c)?;
    for item in items {
        // The fence per item: the queue entry the planner started from must still be there
        // and the schedule still at the planned version; then it moves further back.
        let moved = remove
            .execute(params![
                p.shard,
                item.expected_next_run_at.as_millisecond(),
                item.schedule_id.0,
                item.version,
                item.tenant.0
            ])
            .map_err(db_err)?;
        if moved == 1 {
            if let Some(next) = item.next_run_at {
                let entry = QueueEntry {
                    shard: p.shard,
                    id: item.schedule_id,
                    version: item.version,
                    tenant: item.tenant,
                };
                requeue.insert(entry, next.as_millisecond())?;
            } else {
                // Its last instant is planned: the schedule has finished (its queue entry
                // was at this version, so the schedule is too, and active).
                c.prepare_cached(
                    "UPDATE schedules SET state = 'FINISHED', updated_at = ?3
                      WHERE id = ?1 AND version = ?2 AND state = 'ACTIVE'",
                )
                .and_then(|mut s| s.execute(params![item.schedule_id.0, item.version, now]))
                .map_err(db_err)?;
            }
        }
        if moved == 0 {
            report.stale += 1;
            report.refused.push(item.schedule_id);
            continue;
        }
        report.applied += 1;
        report.inserted += insert.insert(item.tenant, &item.occurrences, now)?;
        if let Some(m) = &item.missed {
            missed_range_insert(c, item.tenant, m, now)?;
        }
    }
    Ok(report)
}

pub(crate) fn shard_acquire(c: &Connection, p: &ShardAcquire, now: i64) -> R<ShardAcquired> {
    let checking = std::time::Instant::now();
    let resumed = outage_check(c, p, now)?;
    let total = p.total.max(1) as i64;
    let until = resumed.lease_end(now, p.lease, checking);
    {
        let mut ins = c
            .prepare_cached("INSERT OR IGNORE INTO shard_leases (shard, epoch) VALUES (?1, 0)")
            .map_err(db_err)?;
        for shard in 0..total {
            ins.execute(params![shard]).map_err(db_err)?;
        }
    }
    c.prepare_cached(
        "INSERT INTO planner_nodes (node, alive_until, seen_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (node) DO UPDATE SET alive_until = excluded.alive_until, seen_at = excluded.seen_at",
    )
    .and_then(|mut s| s.execute(params![p.node, until, now]))
    .map_err(db_err)?;
    // Marks of nodes gone for a day tell nothing any more (this node's mark, written above,
    // is the latest seen): without this, the table grows by a row per node start.
    c.prepare_cached("DELETE FROM planner_nodes WHERE alive_until < ?1 AND node <> ?2")
        .and_then(|mut s| s.execute(params![now - fence::STALE_MARK_MS, p.node]))
        .map_err(db_err)?;
    let others: i64 = c
        .prepare_cached("SELECT COUNT(*) FROM planner_nodes WHERE node <> ?1 AND alive_until > ?2")
        .and_then(|mut s| s.query_row(params![p.node, now], |r| r.get(0)))
        .map_err(db_err)?;
    let target = (total + others) / (others + 1); // ceil(total / nodes)
    // Renew what we still hold.
    c.prepare_cached("UPDATE shard_leases SET lease_until = ?3 WHERE shard < ?1 AND owner = ?2 AND lease_until > ?4")
        .and_then(|mut s| s.execute(params![total, p.node, until, now]))
        .map_err(db_err)?;
    let held: i64 = c
        .prepare_cached("SELECT COUNT(*) FROM shard_leases WHERE shard < ?1 AND owner = ?2 AND lease_until > ?3")
        .and_then(|mut s| s.query_row(params![total, p.node, now], |r| r.get(0)))
        .map_err(db_err)?;
    if held < target {
        // Take free or expired shards; a takeover bumps the epoch, fencing the old holder.
        c.prepare_cached(
            "UPDATE shard_leases SET owner = ?2, epoch = epoch + 1, lease_until = ?3
              WHERE shard IN (SELECT shard FROM shard_leases
                               WHERE shard < ?1 AND (owner IS NULL OR lease_until IS NULL OR lease_until <= ?4)
                               ORDER BY shard LIMIT ?5)",
        )
        .and_then(|mut s| s.execute(params![total, p.node, until, now, target - held]))
        .map_err(db_err)?;
    } else if held > target {
        // More than a fair share now that others are alive: let the excess go.
        c.prepare_cached(
            "UPDATE shard_leases SET lease_until = ?3, owner = NULL
              WHERE shard IN (SELECT shard FROM shard_leases WHERE shard < ?1 AND owner = ?2
                               ORDER BY shard DESC LIMIT ?4)",
        )
        .and_then(|mut s| s.execute(params![total, p.node, now, held - target]))
        .map_err(db_err)?;
    }
    let leases = c.prepare_cached("SELECT shard, epoch, lease_until FROM shard_leases WHERE shard < ?1 AND owner = ?2 AND lease_until > ?3 ORDER BY shard")
        .and_then(|mut s| {
            s.query_map(params![total, p.node, now], |r| Ok((r.get::<_, i32>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(db_err)?
        .into_iter()
        .map(|(shard, epoch, until)| Ok(ShardLease { shard, epoch, lease_until: ts(until)? }))
        .collect::<R<_>>()?;
    Ok(ShardAcquired { leases, resumed })
}

pub(crate) fn shard_release(c: &Connection, p: &ShardRelease, now: i64) -> R<u64> {
    // Only a valid mark is moved: a node whose mark lapsed (it was cut off) must not hide,
    // by stopping, an outage the next node to start should judge.
    c.prepare_cached("UPDATE planner_nodes SET alive_until = ?2, seen_at = ?2 WHERE node = ?1 AND alive_until > ?2")
        .and_then(|mut s| s.execute(params![p.node, now]))
        .map_err(db_err)?;
    c.prepare_cached("UPDATE shard_leases SET owner = NULL, lease_until = ?2 WHERE owner = ?1")
        .and_then(|mut s| s.execute(params![p.node, now]))
        .map(|n| n as u64)
        .map_err(db_err)
}

pub(crate) fn missed_range_list(c: &Connection, p: &MissedRangeList) -> R<Vec<MissedRange>> {
    c.prepare_cached(
        "SELECT schedule_id, version, first_at, last_at, count, count_exact, superseded FROM missed_ranges
          WHERE tenant_id = ?1 AND schedule_id = ?2 ORDER BY first_at",
    )
    .and_then(|mut s| {
        s.query_map(params![p.tenant.0, p.schedule_id.0], |r| {
            Ok((
                r.get::<_, Uuid>(0)?,
                r.get::<_, u32>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, bool>(5)?,
                r.get::<_, bool>(6)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()
    })
    .map_err(db_err)?
    .into_iter()
    .map(|(sid, version, first, last, count, exact, superseded)| {
        Ok(MissedRange {
            schedule_id: ScheduleId(sid),
            version,
            first_at: ts(first)?,
            last_at: ts(last)?,
            count: count as u64,
            count_exact: exact,
            superseded,
        })
    })
    .collect()
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

/// The outage check of [`Store::shard_acquire`], before the node writes its own mark: if no
/// mark is valid, judge what came due since a node was last seen.
fn outage_check(c: &Connection, p: &ShardAcquire, now: i64) -> R<Resumed> {
    // `seen_at` is when a mark was written (a renewal, or a graceful stop). A mark from before
    // it existed (migration 7) counts as seen until it ends: it may be a graceful stop's, and
    // taking it for a crash's would judge the backlog left before the stop.
    let (last_alive, last_seen): (Option<i64>, Option<i64>) = c
        .prepare_cached(
            "SELECT MAX(alive_until), MAX(COALESCE(seen_at, alive_until)) FROM planner_nodes",
        )
        .and_then(|mut s| s.query_row([], |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(db_err)?;
    let Some(since) = fence::down_since(last_alive, last_seen, now) else {
        return Ok(Resumed::default());
    };
    let mut out = Resumed {
        down_since: Some(ts(since)?),
        ..Resumed::default()
    };
    // Never claimed, and claimable only from inside the outage. Each half names its partial
    // index's condition so that the scan is of pending rows, not of the history.
    let rows: Vec<(Uuid, u32, i64)> = c
        .prepare_cached(
            "SELECT schedule_id, version, scheduled_for FROM occurrences
              WHERE state IN ('READY', 'RETRY_WAIT') AND overlap = 0
                AND state = 'READY' AND attempts = 0 AND available_at >= ?1 AND available_at < ?2
             UNION ALL
             SELECT schedule_id, version, scheduled_for FROM occurrences
              WHERE state IN ('READY', 'RETRY_WAIT') AND overlap <> 0
                AND state = 'READY' AND attempts = 0 AND available_at >= ?1 AND available_at < ?2
             ORDER BY 1, 2, 3",
        )
        .and_then(|mut s| {
            s.query_map(params![since, now], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(db_err)?;
    let mut spec_of = c
        .prepare_cached(&format!(
            "SELECT {},
                    (SELECT MAX(o.scheduled_for) FROM occurrences o
                      WHERE o.schedule_id = v.schedule_id AND o.version = v.version)
               FROM schedule_versions v WHERE v.schedule_id = ?1 AND v.version = ?2",
            SPEC_COLS.replace("v.payload", "NULL")
        ))
        .map_err(db_err)?;
    let mut miss = c
        .prepare_cached(
            "UPDATE occurrences SET state = 'MISSED', finished_at = ?4
              WHERE scheduled_for = ?1 AND schedule_id = ?2 AND version = ?3
                AND state = 'READY' AND attempts = 0",
        )
        .map_err(db_err)?;
    for group in rows.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
        let (id, version) = (group[0].0, group[0].1);
        // A version row cannot be missing (a foreign key in all but name); if it were, the
        // group is left as it is, as on PostgreSQL.
        let Some((spec, through)) = spec_of
            .query_row(params![id, version], |r| {
                Ok((spec_row(r, 0)?, r.get::<_, i64>(18)?))
            })
            .optional()
            .map_err(db_err)?
        else {
            continue;
        };
        let instants = group.iter().map(|r| ts(r.2)).collect::<R<Vec<_>>>()?;
        out.examined += instants.len() as u64;
        let missed = p.judge.missed(&PrePlanned {
            schedule_id: ScheduleId(id),
            version,
            spec: &spec?,
            planned_through: ts(through)?,
            instants: &instants,
            now: ts(now)?,
        });
        for at in missed {
            out.missed += miss
                .execute(params![at.as_millisecond(), id, version, now])
                .map_err(db_err)? as u64;
        }
    }
    Ok(out)
}
