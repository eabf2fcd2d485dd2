//! Schedules, planning batches and shard leases on PostgreSQL.

use campanile_core::{Misfire, OccurrenceId, OccurrenceState, ScheduleId};
use campanile_store::fence::reported;
use campanile_store::*;
use deadpool_postgres::{Client, GenericClient};
use jiff::{SignedDuration, Timestamp};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::ops::{R, execute, i32_of, insert_occurrences, query, ts, u32_of, version_insert};
use crate::{pg_err, resolve_now};

const SPEC_COLS: &str = "v.kind, v.cron, v.timezone, v.dst_gap, v.dst_fold, v.at, v.every_ms, v.anchor,
    v.queue, v.payload, v.priority, v.lease_ms, v.max_attempts, v.backoff_initial_ms, v.backoff_max_ms,
    v.misfire, v.overlap, v.flex_window_ms";

/// What a queue entry carries of the version that will plan it: every column of
/// [`SPEC_COLS`] but the payload (migration 0006).
const QUEUE_DEF: &str =
    "kind, cron, timezone, dst_gap, dst_fold, at, every_ms, anchor, queue, priority,
    lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms";

/// [`QUEUE_DEF`] with each column qualified by `alias`.
fn queue_def(alias: &str) -> String {
    QUEUE_DEF
        .split(',')
        .map(|c| format!("{alias}.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn spec_row(r: &Row, at: usize) -> R<ScheduleSpec> {
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

fn state_of(s: &str) -> R<ScheduleState> {
    ScheduleState::parse(s)
        .ok_or_else(|| StoreError::Database(format!("unknown schedule state '{s}'")))
}

/// Where an active schedule stands in its shard's planning queue.
async fn queue_get<C: GenericClient>(c: &C, shard: i32, id: ScheduleId) -> R<Option<i64>> {
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

static QUEUE_INSERT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "INSERT INTO schedule_queue (shard, next_run_at, schedule_id, version, tenant_id, {QUEUE_DEF})
         SELECT $1, $2, $3, $4, $5, {} FROM schedule_versions v
          WHERE v.schedule_id = $3 AND v.version = $4",
        queue_def("v")
    )
});

/// Bulk-created schedules ($2 ids, $3 shards, $4 positions, of tenant $1) entered in the queue
/// with the definition of version 1 of schedule $5, which they all share.
static QUEUE_SEED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "INSERT INTO schedule_queue (shard, next_run_at, schedule_id, version, tenant_id, {QUEUE_DEF})
         SELECT u.shard, u.next, u.id, 1, $1, {}
           FROM unnest($2::uuid[], $3::int4[], $4::int8[]) AS u(id, shard, next), schedule_versions v
          WHERE u.next IS NOT NULL AND v.schedule_id = $5 AND v.version = 1",
        queue_def("v")
    )
});

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
        &QUEUE_INSERT,
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
async fn record_superseded<C: GenericClient>(
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
async fn missed_range_insert<C: GenericClient>(
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

pub(crate) async fn schedule_versions<C: GenericClient>(
    c: &C,
    tenant: TenantId,
    id: ScheduleId,
) -> R<Vec<ScheduleVersion>> {
    query(
        c,
        &format!(
            "SELECT v.version, v.created_at, {SPEC_COLS}
               FROM schedule_versions v JOIN schedules s ON s.id = v.schedule_id
              WHERE v.schedule_id = $1 AND s.tenant_id = $2
              ORDER BY v.version"
        ),
        &[&id.0, &tenant.0],
    )
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

pub(crate) async fn schedule_get<C: GenericClient>(
    c: &C,
    tenant: TenantId,
    id: ScheduleId,
) -> R<Option<ScheduleRecord>> {
    let rows = query(
        c,
        &format!(
            "SELECT s.id, s.tenant_id, s.version, s.state, s.shard, s.next_run_at, s.created_at, s.updated_at, {SPEC_COLS}
               FROM schedules s JOIN schedule_versions v ON v.schedule_id = s.id AND v.version = s.version
              WHERE s.id = $1 AND s.tenant_id = $2"
        ),
        &[&id.0, &tenant.0],
    )
    .await?;
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

type Retired = (u64, Option<i64>, Vec<(OccurrenceId, OccurrenceState)>);

/// Retires what the replaced versions left: their unclaimed occurrences become `CANCELED`,
/// their running ones are flagged for cancellation. Rows are locked in `seq` order, as the
/// batched successes and renewals lock them: a change and a worker's report naming the same
/// occurrences queue behind each other instead of deadlocking (seen: PostgreSQL failing a
/// batch of successes with a deadlock while a schedule was updated).
async fn retire_old_versions<C: GenericClient>(
    c: &C,
    id: ScheduleId,
    version: u32,
    now: i64,
) -> R<Retired> {
    let v = i32_of(version);
    let rows = query(
        c,
        "WITH pick AS (
             SELECT seq FROM occurrences
              WHERE schedule_id = $1 AND version < $2 AND state IN ('READY', 'RETRY_WAIT')
              ORDER BY seq FOR UPDATE),
         gone AS (
             UPDATE occurrences o SET state = 'CANCELED', finished_at = $3
               FROM pick WHERE o.seq = pick.seq AND o.state IN ('READY', 'RETRY_WAIT')
             RETURNING o.scheduled_for)
         SELECT count(*), min(scheduled_for) FROM gone",
        &[&id.0, &v, &now],
    )
    .await?;
    let (canceled, earliest): (i64, Option<i64>) =
        rows.first().map_or((0, None), |r| (r.get(0), r.get(1)));
    execute(
        c,
        "WITH pick AS (
             SELECT seq FROM occurrences WHERE schedule_id = $1 AND version < $2 AND state = 'RUNNING'
              ORDER BY seq FOR UPDATE)
         UPDATE occurrences o SET cancel_requested = true
           FROM pick WHERE o.seq = pick.seq AND o.state = 'RUNNING'",
        &[&id.0, &v],
    )
    .await?;
    let in_flight = query(
        c,
        "SELECT id, state, available_at FROM occurrences
          WHERE schedule_id = $1 AND version < $2 AND state = 'RUNNING'",
        &[&id.0, &v],
    )
    .await?
    .iter()
    .map(|r| {
        let st: OccurrenceState = r
            .get::<_, &str>(1)
            .parse()
            .map_err(|e| StoreError::Database(format!("{e}")))?;
        Ok((OccurrenceId(r.get(0)), reported(st, r.get(2), now)))
    })
    .collect::<R<Vec<_>>>()?;
    Ok((canceled as u64, earliest, in_flight))
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

/// The shared side of [`PLANNING_LOCK`], taken by a change on its schedule's shard (a
/// schedule never changes shards), before it locks the schedule's row.
const CHANGE_LOCK: &str = "SELECT pg_advisory_xact_lock_shared(hashtext('campanile/planning/' || current_schema()), shard)
       FROM schedules WHERE id = $1 AND tenant_id = $2";

async fn current<C: GenericClient>(
    c: &C,
    tenant: TenantId,
    id: ScheduleId,
) -> R<(u32, ScheduleState, i32, Option<i64>)> {
    execute(c, CHANGE_LOCK, &[&id.0, &tenant.0]).await?;
    let rows = query(
        c,
        "SELECT version, state, shard, next_run_at FROM schedules WHERE id = $1 AND tenant_id = $2 FOR UPDATE",
        &[&id.0, &tenant.0],
    )
    .await?;
    let r = rows
        .first()
        .ok_or_else(|| StoreError::NotFound(format!("schedule {id}")))?;
    let state = state_of(r.get(1))?;
    let shard: i32 = r.get(2);
    // Active: where the queue stands; finished: nothing left (the column is the snapshot
    // taken before it finished); paused: where it resumes.
    let next: Option<i64> = match state {
        ScheduleState::Active => queue_get(c, shard, id).await?,
        ScheduleState::Finished => None,
        _ => r.get(3),
    };
    Ok((u32_of(r.get(0)), state, shard, next))
}

pub(crate) async fn schedule_update(c: &mut Client, p: ScheduleUpdate) -> R<ScheduleChange> {
    let tx = c.transaction().await.map_err(pg_err)?;
    let now = resolve_now(&tx, p.now).await?;
    let (version, state, shard, _) = current(&tx, p.tenant, p.id).await?;
    if version != p.expected_version {
        return Err(StoreError::VersionConflict { current: version });
    }
    campanile_store::fence::superseded_check(&p.superseded, version)?;
    if state == ScheduleState::Canceled {
        return Err(StoreError::WrongState(format!(
            "schedule {} is canceled",
            p.id
        )));
    }
    let new = version + 1;
    version_insert(&tx, p.id, new, &p.spec, now).await?;
    let to = campanile_store::fence::updated_state(state, p.next_run_at.is_some());
    if to == ScheduleState::Active {
        // A finished schedule given an instant to plan counts again, as when created.
        let adding = i64::from(state != ScheduleState::Active);
        crate::admin::check_schedule_quota(
            &tx,
            p.tenant,
            adding,
            i64::from(p.fires_per_hour),
            Some(p.id),
        )
        .await?;
    }
    execute(
        &tx,
        "UPDATE schedules SET version = $2, next_run_at = $3, updated_at = $4, fires_per_hour = $5, state = $6 WHERE id = $1",
        &[
            &p.id.0,
            &i32_of(new),
            &p.next_run_at.map(|t| t.as_millisecond()),
            &now,
            &i32_of(p.fires_per_hour),
            &to.as_str(),
        ],
    )
    .await?;
    if to != ScheduleState::Paused {
        queue_set(
            &tx,
            shard,
            p.id,
            new,
            p.tenant,
            p.next_run_at.map(|t| t.as_millisecond()),
        )
        .await?;
    }
    let (canceled, _, in_flight) = retire_old_versions(&tx, p.id, new, now).await?;
    let canceled = canceled + record_superseded(&tx, p.tenant, &p.superseded, now).await?;
    let schedule = schedule_get(&tx, p.tenant, p.id)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("schedule {}", p.id)))?;
    tx.commit().await.map_err(pg_err)?;
    Ok(ScheduleChange {
        schedule,
        canceled,
        in_flight,
    })
}

pub(crate) async fn schedule_transition(
    c: &mut Client,
    p: ScheduleTransition,
) -> R<ScheduleChange> {
    let tx = c.transaction().await.map_err(pg_err)?;
    let now = resolve_now(&tx, p.now).await?;
    let (version, state, shard, next) = current(&tx, p.tenant, p.id).await?;
    campanile_store::fence::superseded_check(&p.superseded, version)?;
    let (canceled, in_flight) = match (state, p.to) {
        (ScheduleState::Canceled, _) => {
            return Err(StoreError::WrongState(format!(
                "schedule {} is canceled",
                p.id
            )));
        }
        (ScheduleState::Active | ScheduleState::Finished, ScheduleState::Paused)
        | (_, ScheduleState::Canceled) => {
            let new = version + 1;
            execute(
                &tx,
                "INSERT INTO schedule_versions (schedule_id, version, kind, cron, timezone, dst_gap, dst_fold,
                     at, every_ms, anchor, queue, payload, priority, lease_ms, max_attempts,
                     backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms, created_at)
                 SELECT schedule_id, $2, kind, cron, timezone, dst_gap, dst_fold, at, every_ms, anchor, queue,
                        payload, priority, lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms, misfire,
                        overlap, flex_window_ms, $3
                   FROM schedule_versions WHERE schedule_id = $1 AND version = $4",
                &[&p.id.0, &i32_of(new), &now, &i32_of(version)],
            )
            .await?;
            let (mut canceled, earliest, in_flight) =
                retire_old_versions(&tx, p.id, new, now).await?;
            let next = if p.to == ScheduleState::Canceled {
                canceled += record_superseded(&tx, p.tenant, &p.superseded, now).await?;
                None
            } else {
                match (earliest, next) {
                    (Some(e), Some(n)) => Some(e.min(n)),
                    (e, n) => e.or(n),
                }
            };
            execute(
                &tx,
                "UPDATE schedules SET version = $2, state = $3, next_run_at = $4, updated_at = $5 WHERE id = $1",
                &[&p.id.0, &i32_of(new), &p.to.as_str(), &next, &now],
            )
            .await?;
            queue_set(&tx, shard, p.id, new, p.tenant, None).await?;
            (canceled, in_flight)
        }
        // Nothing left to plan (a one-off paused after its occurrence ran): finished.
        (ScheduleState::Paused, ScheduleState::Active) if next.is_none() => {
            execute(
                &tx,
                "UPDATE schedules SET state = 'FINISHED', updated_at = $2 WHERE id = $1",
                &[&p.id.0, &now],
            )
            .await?;
            (0, Vec::new())
        }
        (ScheduleState::Paused, ScheduleState::Active) => {
            // Resuming makes the schedule count again: the same quotas as creating it.
            let fires: i64 = query(
                &tx,
                "SELECT fires_per_hour FROM schedules WHERE id = $1",
                &[&p.id.0],
            )
            .await?
            .first()
            .map_or(0, |r| i64::from(r.get::<_, i32>(0)));
            crate::admin::check_schedule_quota(&tx, p.tenant, 1, fires, None).await?;
            execute(
                &tx,
                "UPDATE schedules SET state = 'ACTIVE', updated_at = $2 WHERE id = $1",
                &[&p.id.0, &now],
            )
            .await?;
            queue_set(&tx, shard, p.id, version, p.tenant, next).await?;
            (0, Vec::new())
        }
        _ => (0, Vec::new()),
    };
    let schedule = schedule_get(&tx, p.tenant, p.id)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("schedule {}", p.id)))?;
    tx.commit().await.map_err(pg_err)?;
    Ok(ScheduleChange {
        schedule,
        canceled,
        in_flight,
    })
}

/// The front of a shard's queue, each entry with the definition it carries (migration 0006):
/// the pass reads nothing but the queue, so its cost follows the number of schedules due and
/// not the number stored. The payload is not read: planning does not need it.
static SCHEDULE_DUE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let cols = SPEC_COLS.replace("v.payload", "NULL::text");
    format!(
        "SELECT v.schedule_id, v.tenant_id, v.version, v.next_run_at, {cols}
           FROM schedule_queue v
          WHERE v.shard = $1 AND v.next_run_at <= $2
          ORDER BY v.next_run_at LIMIT $3"
    )
});

pub(crate) async fn schedule_due(c: &Client, p: ScheduleDueList) -> R<Vec<DueSchedule>> {
    query(
        c,
        &SCHEDULE_DUE,
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
static QUEUE_MOVE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH gone AS (
             DELETE FROM schedule_queue q
              USING unnest($1::uuid[], $2::int8[], $3::int4[], $4::int8[], $5::int8[]) AS u(id, tenant, version, expected, next)
              WHERE q.shard = $6 AND q.next_run_at = u.expected AND q.schedule_id = u.id
                AND q.version = u.version AND q.tenant_id = u.tenant
             RETURNING q.schedule_id, q.version, q.tenant_id, u.next, {}),
         back AS (
             INSERT INTO schedule_queue (shard, next_run_at, schedule_id, version, tenant_id, {QUEUE_DEF})
             SELECT $6, next, schedule_id, version, tenant_id, {QUEUE_DEF} FROM gone WHERE next IS NOT NULL)
         SELECT schedule_id FROM gone",
        queue_def("q")
    )
});

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
        &QUEUE_MOVE,
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

const SHARD_LOCK: i64 = 0x0063_616d_7368_6172; // "camshar"

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

pub(crate) async fn schedule_create_many(c: &mut Client, p: ScheduleCreateMany) -> R<u64> {
    let tx = c.transaction().await.map_err(pg_err)?;
    let now = resolve_now(&tx, p.now).await?;
    let mut n = 0;
    for chunk in p.items.chunks(10_000) {
        let ids: Vec<Uuid> = chunk.iter().map(|(id, _, _)| id.0).collect();
        let shards: Vec<i32> = chunk.iter().map(|(_, s, _)| *s).collect();
        let nexts: Vec<Option<i64>> = chunk
            .iter()
            .map(|(_, _, t)| t.map(|t| t.as_millisecond()))
            .collect();
        n += execute(
            &tx,
            "INSERT INTO schedules (id, tenant_id, version, state, shard, next_run_at, created_at, updated_at)
             SELECT u.id, $1, 1, 'ACTIVE', u.shard, u.next, $2, $2
               FROM unnest($3::uuid[], $4::int4[], $5::int8[]) AS u(id, shard, next)",
            &[&p.tenant.0, &now, &ids, &shards, &nexts],
        )
        .await?;
        // Version rows: the first one written normally, the rest copied from it; then the
        // queue entries, carrying that definition.
        let (first, rest) = ids
            .split_first()
            .ok_or_else(|| StoreError::Invalid("empty chunk".into()))?;
        version_insert(&tx, ScheduleId(*first), 1, &p.spec, now).await?;
        execute(
            &tx,
            "INSERT INTO schedule_versions (schedule_id, version, kind, cron, timezone, dst_gap, dst_fold,
                 at, every_ms, anchor, queue, payload, priority, lease_ms, max_attempts,
                 backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms, created_at)
             SELECT u.id, 1, kind, cron, timezone, dst_gap, dst_fold, at, every_ms, anchor, queue, payload,
                    priority, lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms, misfire, overlap,
                    flex_window_ms, created_at
               FROM schedule_versions v, unnest($2::uuid[]) AS u(id)
              WHERE v.schedule_id = $1 AND v.version = 1",
            &[first, &rest.to_vec()],
        )
        .await?;
        execute(
            &tx,
            &QUEUE_SEED,
            &[&p.tenant.0, &ids, &shards, &nexts, first],
        )
        .await?;
    }
    tx.commit().await.map_err(pg_err)?;
    Ok(n)
}

pub(crate) async fn schedule_position(
    c: &Client,
    tenant: TenantId,
    id: ScheduleId,
) -> R<Option<Timestamp>> {
    let rows = query(
        c,
        "SELECT shard, state FROM schedules WHERE id = $1 AND tenant_id = $2",
        &[&id.0, &tenant.0],
    )
    .await?;
    match rows.first() {
        Some(r) if r.get::<_, &str>(1) == "ACTIVE" => {
            queue_get(c, r.get(0), id).await?.map(ts).transpose()
        }
        _ => Ok(None),
    }
}

/// The outage check of [`Store::shard_acquire`], under its lock and before the node writes
/// its own mark: if no mark is valid, judge what came due since a node was last seen.
async fn outage_check<C: GenericClient>(tx: &C, p: &ShardAcquire, now: i64) -> R<Resumed> {
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
    let groups = query(
        tx,
        &format!(
            "WITH c AS (
                SELECT schedule_id, version, scheduled_for FROM occurrences
                 WHERE state IN ('READY', 'RETRY_WAIT') AND state = 'READY' AND attempts = 0
                   AND available_at >= $1 AND available_at < $2)
             SELECT c.schedule_id, c.version, array_agg(c.scheduled_for ORDER BY c.scheduled_for),
                    (SELECT max(o.scheduled_for) FROM occurrences o
                      WHERE o.schedule_id = c.schedule_id AND o.version = c.version),
                    {}
               FROM c JOIN schedule_versions v ON v.schedule_id = c.schedule_id AND v.version = c.version
              GROUP BY c.schedule_id, c.version, v.schedule_id, v.version",
            SPEC_COLS.replace("v.payload", "NULL::text")
        ),
        &[&since, &now],
    )
    .await?;
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
    Ok(out)
}
