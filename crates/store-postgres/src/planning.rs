//! Planning: the due schedules of a shard, the planning commit under the shard's lock, shard
//! leases, the outage check, missed ranges and the deployment's shard count.

use campanile_core::{ScheduleId, occurrence_id};
use campanile_store::fence::{self};
use campanile_store::*;
use deadpool_postgres::{Client, GenericClient};
use jiff::Timestamp;
use uuid::Uuid;

use crate::db::{R, execute, i32_of, pg_err, query, resolve_now, ts, u32_of};
use crate::occurrence::insert_occurrences;
use crate::queue::missed_range_insert;
use crate::version::spec_row;

pub(crate) async fn deployment_shards(c: &Client, shards: u32) -> R<u32> {
    let n = i32::try_from(shards).map_err(|_| StoreError::Invalid("too many shards".into()))?;
    execute(
        c,
        "INSERT INTO deployment (id, shards, created_at)
         VALUES (1, $1, (extract(epoch FROM clock_timestamp()) * 1000)::bigint)
         ON CONFLICT (id) DO NOTHING",
        &[&n],
    )
    .await?;
    // A statement of its own, so its snapshot sees whichever node's row won.
    let rows = query(c, "SELECT shards FROM deployment WHERE id = 1", &[]).await?;
    let recorded: i32 = rows
        .first()
        .map(|r| r.get(0))
        .ok_or_else(|| StoreError::Database("no deployment row after recording one".into()))?;
    u32::try_from(recorded).map_err(|_| StoreError::Database(format!("bad shard count {recorded}")))
}

/// Serializes a schedule change with the planning commits of its shard: a commit takes it
/// exclusively (`$1`: the shard), a change shares it ([`CHANGE_LOCK`]), each before anything
/// else it writes. Whichever comes second waits for the first to commit and then, in its next
/// statement (a new snapshot under READ COMMITTED), sees everything the first wrote: a change
/// retires the occurrences a commit planned and removes its queue entry; a commit finds the
/// changed schedule's queue entry gone and refuses the item (docs/DESIGN.md, "Why do a
/// planning commit and a schedule change take a lock on the shard?"). One lock per
/// transaction, in memory: no row is written for it. Keyed by the schema, so deployments in
/// other schemas of the database never wait for each other on it.
pub(crate) const PLANNING_LOCK: &str =
    "SELECT pg_advisory_xact_lock(hashtext('campanile/planning/' || current_schema()), $1)";

/// The front of a shard's queue, each entry with the definition it carries (migration 0006):
/// the pass reads nothing but the queue, so its cost follows the number of schedules due and
/// not the number stored. The payload is not read: planning does not need it.
pub(crate) const SCHEDULE_DUE: &str = include_str!("sql/schedule_due.sql");

pub(crate) async fn schedule_due(c: &Client, p: ScheduleDueList) -> R<Vec<DueSchedule>> {
    query(
        c,
        SCHEDULE_DUE,
        &[&p.shard, &p.before.as_millisecond(), &i64::from(p.limit)],
    )
    .await?
    .iter()
    .map(|r| {
        let mut spec = spec_row(r, 4)?;
        spec.payload = None;
        Ok(DueSchedule {
            id: ScheduleId(r.get(0)),
            tenant: TenantId(r.get(1)),
            version: u32_of(r.get(2)),
            next_run_at: ts(r.get(3))?,
            spec,
        })
    })
    .collect()
}

pub(crate) async fn schedule_next_due(c: &Client, shards: &[i32]) -> R<Option<Timestamp>> {
    let shards = shards.to_vec();
    let rows = query(
        c,
        "SELECT min(m) FROM unnest($1::int4[]) AS sh(shard),
                LATERAL (SELECT min(next_run_at) AS m FROM schedule_queue WHERE shard = sh.shard) x",
        &[&shards],
    )
    .await?;
    rows.first()
        .and_then(|r| r.get::<_, Option<i64>>(0))
        .map(ts)
        .transpose()
}

/// A planning batch's queue entries moved back to their next instants (or out), each only if
/// still where the planner found it, with the definition it carries.
pub(crate) const QUEUE_MOVE: &str = include_str!("sql/queue_move.sql");

pub(crate) async fn plan_commit(c: &mut Client, p: PlanCommit) -> R<PlanReport> {
    let tx = c.transaction().await.map_err(pg_err)?;
    let now = resolve_now(&tx, p.now).await?;
    // Fence the whole batch on the shard lease; FOR SHARE keeps a takeover from committing
    // in between.
    let lease = query(
        &tx,
        "SELECT owner, epoch, lease_until FROM shard_leases WHERE shard = $1 FOR SHARE",
        &[&p.shard],
    )
    .await?;
    let ok = lease.first().is_some_and(|r| {
        r.get::<_, Option<String>>(0).as_deref() == Some(p.node.as_str())
            && r.get::<_, i64>(1) == p.shard_epoch
            && r.get::<_, Option<i64>>(2).is_some_and(|u| u > now)
    });
    if !ok {
        return Err(StoreError::Fenced(format!(
            "node {} no longer holds shard {} at epoch {}",
            p.node, p.shard, p.shard_epoch
        )));
    }
    // Changes of this shard's schedules wait while this commit runs, and it waits for those
    // in flight: see [`PLANNING_LOCK`].
    execute(&tx, PLANNING_LOCK, &[&p.shard]).await?;
    // Advance every schedule still at the planned version and position, in one statement;
    // the rows it returns are the items that apply.
    let ids: Vec<Uuid> = p.items.iter().map(|i| i.schedule_id.0).collect();
    let tenants: Vec<i64> = p.items.iter().map(|i| i.tenant.0).collect();
    let versions: Vec<i32> = p.items.iter().map(|i| i32_of(i.version)).collect();
    let expected: Vec<i64> = p
        .items
        .iter()
        .map(|i| i.expected_next_run_at.as_millisecond())
        .collect();
    let next: Vec<Option<i64>> = p
        .items
        .iter()
        .map(|i| i.next_run_at.map(|t| t.as_millisecond()))
        .collect();
    // Schedules whose last instant this batch plans finish. Their rows are locked first, in
    // id order, as a schedule change locks its row before its queue entry: locking them after
    // the queue entries could deadlock with a change of the same schedule.
    let mut last: Vec<(Uuid, i32)> = p
        .items
        .iter()
        .filter(|i| i.next_run_at.is_none())
        .map(|i| (i.schedule_id.0, i32_of(i.version)))
        .collect();
    last.sort_unstable();
    if !last.is_empty() {
        let ids: Vec<Uuid> = last.iter().map(|(id, _)| *id).collect();
        execute(
            &tx,
            "SELECT 1 FROM schedules WHERE id = ANY($1) ORDER BY id FOR UPDATE",
            &[&ids],
        )
        .await?;
    }
    // The fence per item: the queue entry the planner started from must still be there, at
    // the planned version; it moves further back (or out, when nothing is left to plan).
    let moved = query(
        &tx,
        QUEUE_MOVE,
        &[&ids, &tenants, &versions, &expected, &next, &p.shard],
    )
    .await?;
    let applied: std::collections::HashSet<Uuid> = moved.iter().map(|r| r.get(0)).collect();
    last.retain(|(id, _)| applied.contains(id));
    if !last.is_empty() {
        let (ids, versions): (Vec<Uuid>, Vec<i32>) = last.into_iter().unzip();
        execute(
            &tx,
            "UPDATE schedules s SET state = 'FINISHED', updated_at = $3
               FROM unnest($1::uuid[], $2::int4[]) AS u(id, version)
              WHERE s.id = u.id AND s.version = u.version AND s.state = 'ACTIVE'",
            &[&ids, &versions, &now],
        )
        .await?;
    }
    let refused: Vec<ScheduleId> = p
        .items
        .iter()
        .map(|i| i.schedule_id)
        .filter(|id| !applied.contains(&id.0))
        .collect();
    let mut report = PlanReport {
        applied: applied.len() as u64,
        stale: refused.len() as u64,
        inserted: 0,
        refused,
    };
    let mut by_tenant: std::collections::BTreeMap<i64, Vec<NewOccurrence>> =
        std::collections::BTreeMap::new();
    for item in p
        .items
        .iter()
        .filter(|i| applied.contains(&i.schedule_id.0))
    {
        by_tenant
            .entry(item.tenant.0)
            .or_default()
            .extend(item.occurrences.iter().cloned());
        if let Some(m) = &item.missed {
            missed_range_insert(&tx, item.tenant, m, now).await?;
        }
    }
    for (tenant, occurrences) in by_tenant {
        report.inserted += insert_occurrences(&tx, TenantId(tenant), &occurrences, now).await?;
    }
    tx.commit().await.map_err(pg_err)?;
    Ok(report)
}

pub(crate) const SHARD_LOCK: i64 = 0x0063_616d_7368_6172; // "camshar"

pub(crate) async fn shard_acquire(c: &mut Client, p: ShardAcquire) -> R<ShardAcquired> {
    let tx = c.transaction().await.map_err(pg_err)?;
    let now = resolve_now(&tx, p.now).await?;
    // Nodes take turns: of nodes coming back together, the second sees the first's mark.
    execute(&tx, "SELECT pg_advisory_xact_lock($1)", &[&SHARD_LOCK]).await?;
    let checking = std::time::Instant::now();
    let resumed = outage_check(&tx, &p, now).await?;
    let total = i64::from(p.total.max(1));
    let until = resumed.lease_end(now, p.lease, checking);
    execute(
        &tx,
        "INSERT INTO shard_leases (shard, epoch) SELECT g, 0 FROM generate_series(0, $1::int4 - 1) g ON CONFLICT DO NOTHING",
        &[&(total as i32)],
    )
    .await?;
    execute(
        &tx,
        "INSERT INTO planner_nodes (node, alive_until, seen_at) VALUES ($1, $2, $3)
         ON CONFLICT (node) DO UPDATE SET alive_until = excluded.alive_until, seen_at = excluded.seen_at",
        &[&p.node, &until, &now],
    )
    .await?;
    // Marks of nodes gone for a day tell nothing any more (this node's mark, written above,
    // is the latest seen): without this, the table grows by a row per node start.
    execute(
        &tx,
        "DELETE FROM planner_nodes WHERE alive_until < $1 AND node <> $2",
        &[&(now - fence::STALE_MARK_MS), &p.node],
    )
    .await?;
    let others: i64 = query(
        &tx,
        "SELECT count(*) FROM planner_nodes WHERE node <> $1 AND alive_until > $2",
        &[&p.node, &now],
    )
    .await?
    .first()
    .map_or(0, |r| r.get(0));
    let target = (total + others) / (others + 1);
    execute(
        &tx,
        "UPDATE shard_leases SET lease_until = $3 WHERE shard < $1 AND owner = $2 AND lease_until > $4",
        &[&(total as i32), &p.node, &until, &now],
    )
    .await?;
    let held: i64 = query(
        &tx,
        "SELECT count(*) FROM shard_leases WHERE shard < $1 AND owner = $2 AND lease_until > $3",
        &[&(total as i32), &p.node, &now],
    )
    .await?
    .first()
    .map_or(0, |r| r.get(0));
    if held < target {
        execute(
            &tx,
            "UPDATE shard_leases SET owner = $2, epoch = epoch + 1, lease_until = $3
              WHERE shard IN (SELECT shard FROM shard_leases
                               WHERE shard < $1 AND (owner IS NULL OR lease_until IS NULL OR lease_until <= $4)
                               ORDER BY shard LIMIT $5)",
            &[&(total as i32), &p.node, &until, &now, &(target - held)],
        )
        .await?;
    } else if held > target {
        execute(
            &tx,
            "UPDATE shard_leases SET owner = NULL, lease_until = $3
              WHERE shard IN (SELECT shard FROM shard_leases WHERE shard < $1 AND owner = $2 ORDER BY shard DESC LIMIT $4)",
            &[&(total as i32), &p.node, &now, &(held - target)],
        )
        .await?;
    }
    let leases = query(
        &tx,
        "SELECT shard, epoch, lease_until FROM shard_leases WHERE shard < $1 AND owner = $2 AND lease_until > $3 ORDER BY shard",
        &[&(total as i32), &p.node, &now],
    )
    .await?
    .iter()
    .map(|r| Ok(ShardLease { shard: r.get(0), epoch: r.get(1), lease_until: ts(r.get(2))? }))
    .collect::<R<Vec<_>>>()?;
    tx.commit().await.map_err(pg_err)?;
    Ok(ShardAcquired { leases, resumed })
}

pub(crate) async fn shard_release(c: &Client, p: ShardRelease) -> R<u64> {
    let now = resolve_now(c, p.now).await?;
    execute(
        c,
        // Only a valid mark is moved: a node whose mark lapsed (it was cut off) must not hide,
        // by stopping, an outage the next node to start should judge.
        "UPDATE planner_nodes SET alive_until = $2, seen_at = $2 WHERE node = $1 AND alive_until > $2",
        &[&p.node, &now],
    )
    .await?;
    execute(
        c,
        "UPDATE shard_leases SET owner = NULL, lease_until = $2 WHERE owner = $1",
        &[&p.node, &now],
    )
    .await
}

pub(crate) async fn missed_range_list(c: &Client, p: MissedRangeList) -> R<Vec<MissedRange>> {
    query(
        c,
        "SELECT schedule_id, version, first_at, last_at, count, count_exact, superseded FROM missed_ranges
          WHERE tenant_id = $1 AND schedule_id = $2 ORDER BY first_at",
        &[&p.tenant.0, &p.schedule_id.0],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(MissedRange {
            schedule_id: ScheduleId(r.get::<_, Uuid>(0)),
            version: u32_of(r.get(1)),
            first_at: ts(r.get(2))?,
            last_at: ts(r.get(3))?,
            count: r.get::<_, i64>(4) as u64,
            count_exact: r.get(5),
            superseded: r.get(6),
        })
    })
    .collect()
}

/// The never-claimed occurrences that became claimable inside an outage (`$1` to `$2`), grouped per schedule version with its definition and how far it is planned.
pub(crate) const OUTAGE_GROUPS: &str = include_str!("sql/outage_groups.sql");

/// The outage check of [`Store::shard_acquire`], under its lock and before the node writes
/// its own mark: if no mark is valid, judge what came due since a node was last seen.
pub(crate) async fn outage_check<C: GenericClient>(
    tx: &C,
    p: &ShardAcquire,
    now: i64,
) -> R<Resumed> {
    // `seen_at` is when a mark was written (a renewal, or a graceful stop). A mark from before
    // it existed (migration 8) counts as seen until it ends: it may be a graceful stop's, and
    // taking it for a crash's would judge the backlog left before the stop.
    let row = query(
        tx,
        "SELECT max(alive_until), max(COALESCE(seen_at, alive_until)) FROM planner_nodes",
        &[],
    )
    .await?;
    let (last_alive, last_seen): (Option<i64>, Option<i64>) =
        row.first().map_or((None, None), |r| (r.get(0), r.get(1)));
    let Some(since) = fence::down_since(last_alive, last_seen, now) else {
        return Ok(Resumed::default());
    };
    let mut out = Resumed {
        down_since: Some(ts(since)?),
        ..Resumed::default()
    };
    // Never claimed, and claimable only from inside the outage (a scan of the pending index,
    // not of the history), grouped per schedule version with its definition and how far it
    // is planned.
    let groups = query(tx, OUTAGE_GROUPS, &[&since, &now]).await?;
    let mut kept: std::collections::BTreeMap<i64, Vec<(Timestamp, Uuid)>> =
        std::collections::BTreeMap::new();
    let (mut at_col, mut id_col, mut version_col) = (Vec::new(), Vec::new(), Vec::new());
    for r in &groups {
        let id: Uuid = r.get(0);
        let version: i32 = r.get(1);
        let instants = r
            .get::<_, Vec<i64>>(2)
            .into_iter()
            .map(ts)
            .collect::<R<Vec<_>>>()?;
        out.examined += instants.len() as u64;
        let spec = spec_row(r, 4)?;
        let missed = p.judge.missed(&PrePlanned {
            schedule_id: ScheduleId(id),
            version: u32_of(version),
            spec: &spec,
            planned_through: ts(r.get(3))?,
            instants: &instants,
            now: ts(now)?,
        });
        let tenant: i64 = r.get(22);
        for at in rules::outage_paced(&spec, &instants, &missed, ts(now)?) {
            kept.entry(tenant)
                .or_default()
                .push((at, occurrence_id(ScheduleId(id), u32_of(version), at).0));
        }
        for at in missed {
            at_col.push(at.as_millisecond());
            id_col.push(id);
            version_col.push(version);
        }
    }
    if !at_col.is_empty() {
        out.missed = execute(
            tx,
            "UPDATE occurrences o SET state = 'MISSED', finished_at = $4
               FROM unnest($1::int8[], $2::uuid[], $3::int4[]) AS m(at, id, version)
              WHERE o.scheduled_for = m.at AND o.schedule_id = m.id AND o.version = m.version
                AND o.state = 'READY' AND o.attempts = 0",
            &[&at_col, &id_col, &version_col, &now],
        )
        .await?;
    }
    // What runs late is paced by its tenant's catch-up rate, like the late runs a planning
    // pass makes: oldest instant first.
    for (tenant, mut runs) in kept {
        runs.sort();
        let Some(slots) =
            crate::tenant::catchup_reserve(tx, TenantId(tenant), runs.len() as u32, now).await?
        else {
            continue;
        };
        let ids: Vec<Uuid> = runs.iter().map(|r| r.1).collect();
        let at: Vec<i64> = (0..runs.len() as u32)
            .map(|i| slots.slot(i).as_millisecond())
            .collect();
        execute(
            tx,
            "UPDATE occurrences o SET available_at = GREATEST(o.available_at, u.at),
                    due_at = CASE WHEN o.overlap <> 0 THEN GREATEST(o.available_at, u.at) END
               FROM unnest($1::uuid[], $2::int8[]) AS u(id, at)
              WHERE o.id = u.id AND o.state = 'READY' AND o.attempts = 0",
            &[&ids, &at],
        )
        .await?;
        out.paced += runs.len() as u64;
    }
    Ok(out)
}
