//! Planning: the due schedules of a shard, the planning commit, shard leases, the outage
//! check, missed ranges and the deployment's shard count.

use campanile_core::{OccurrenceId, ScheduleId, occurrence_id};
use campanile_store::fence::{self};
use campanile_store::*;
use jiff::Timestamp;
use rusqlite::{Connection, OptionalExtension, params};
use uuid::Uuid;

use crate::db::{R, db_err, ts};
use crate::occurrence::OccurrenceInsert;
use crate::queue::{QueueEntry, QueueInsert, missed_range_insert};
use crate::version::spec_row;

pub(crate) fn deployment_shards(c: &Connection, shards: u32, now: i64) -> R<u32> {
    c.prepare_cached(
        "INSERT INTO deployment (id, shards, created_at) VALUES (1, ?1, ?2) ON CONFLICT (id) DO NOTHING",
    )
    .and_then(|mut s| s.execute(params![shards, now]))
    .map_err(db_err)?;
    c.prepare_cached("SELECT shards FROM deployment WHERE id = 1")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(db_err)
}

/// The due queue entries of a shard (`?1`) at `?2`, with their versions' definitions, earliest first, at most `?3`.
pub(crate) const SCHEDULE_DUE: &str = include_str!("sql/schedule_due.sql");

pub(crate) fn schedule_due(c: &Connection, p: &ScheduleDueList) -> R<Vec<DueSchedule>> {
    c.prepare_cached(SCHEDULE_DUE)
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

pub(crate) fn check_shard(c: &Connection, shard: i32, node: &str, epoch: i64, now: i64) -> R<()> {
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

/// A schedule version's definition and how far it is planned, for the outage check.
pub(crate) const OUTAGE_VERSION: &str = include_str!("sql/outage_version.sql");

/// The outage check of [`Store::shard_acquire`], before the node writes its own mark: if no
/// mark is valid, judge what came due since a node was last seen.
pub(crate) fn outage_check(c: &Connection, p: &ShardAcquire, now: i64) -> R<Resumed> {
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
    // index's condition so that the scan is of pending rows, not of the history. Runs an
    // operator asked for (triggered, backfilled: `origin` set) are late on purpose and not
    // judged by the misfire policy.
    let rows: Vec<(Uuid, u32, i64, i64)> = c
        .prepare_cached(
            "SELECT schedule_id, version, scheduled_for, tenant_id FROM occurrences
              WHERE state IN ('READY', 'RETRY_WAIT') AND overlap = 0
                AND state = 'READY' AND attempts = 0 AND available_at >= ?1 AND available_at < ?2
                AND origin IS NULL
             UNION ALL
             SELECT schedule_id, version, scheduled_for, tenant_id FROM occurrences
              WHERE state IN ('READY', 'RETRY_WAIT') AND overlap <> 0
                AND state = 'READY' AND attempts = 0 AND available_at >= ?1 AND available_at < ?2
                AND origin IS NULL
             ORDER BY 1, 2, 3",
        )
        .and_then(|mut s| {
            s.query_map(params![since, now], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(db_err)?;
    let mut spec_of = c.prepare_cached(OUTAGE_VERSION).map_err(db_err)?;
    let mut kept: std::collections::BTreeMap<i64, Vec<(Timestamp, OccurrenceId)>> =
        std::collections::BTreeMap::new();
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
        let spec = spec?;
        let missed = p.judge.missed(&PrePlanned {
            schedule_id: ScheduleId(id),
            version,
            spec: &spec,
            planned_through: ts(through)?,
            instants: &instants,
            now: ts(now)?,
        });
        for at in &missed {
            out.missed += miss
                .execute(params![at.as_millisecond(), id, version, now])
                .map_err(db_err)? as u64;
        }
        let tenant = group[0].3;
        for at in rules::outage_paced(&spec, &instants, &missed, ts(now)?) {
            kept.entry(tenant)
                .or_default()
                .push((at, occurrence_id(ScheduleId(id), version, at)));
        }
    }
    // What runs late is paced by its tenant's catch-up rate, like the late runs a planning
    // pass makes: oldest instant first.
    let mut pace = c
        .prepare_cached(
            "UPDATE occurrences SET available_at = MAX(available_at, ?2),
                    due_at = CASE WHEN overlap <> 0 THEN MAX(available_at, ?2) END
              WHERE id = ?1 AND state = 'READY' AND attempts = 0",
        )
        .map_err(db_err)?;
    for (tenant, mut runs) in kept {
        runs.sort();
        let Some(slots) =
            crate::tenant::catchup_reserve(c, TenantId(tenant), runs.len() as u32, now)?
        else {
            continue;
        };
        for (i, (_, id)) in runs.iter().enumerate() {
            pace.execute(params![id.0, slots.slot(i as u32).as_millisecond()])
                .map_err(db_err)?;
        }
        out.paced += runs.len() as u64;
    }
    Ok(out)
}
