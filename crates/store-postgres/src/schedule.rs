//! Schedule changes: create, update, pause, resume, cancel, listing, and the lock a change takes
//! on its shard.

use campanile_core::{OccurrenceId, OccurrenceState, ScheduleId};
use campanile_store::fence::reported;
use campanile_store::*;
use deadpool_postgres::{Client, GenericClient};
use jiff::Timestamp;
use uuid::Uuid;

use crate::db::{R, execute, i32_of, pg_err, query, resolve_now, ts, u32_of};
use crate::queue::{QUEUE_SEED, queue_get, queue_set, record_superseded};
use crate::version::{schedule_get, state_of, version_insert};

pub(crate) async fn schedule_create(c: &mut Client, p: ScheduleCreate) -> R<()> {
    let tx = c.transaction().await.map_err(pg_err)?;
    let now = resolve_now(&tx, p.now).await?;
    crate::tenant::check_schedule_quota(&tx, p.tenant, 1, i64::from(p.fires_per_hour), None)
        .await?;
    if let Some(idem) = &p.idempotency {
        let held = execute(
            &tx,
            "UPDATE idempotency_keys SET schedule_id = $4
              WHERE tenant_id = $1 AND key = $2 AND token = $3 AND status = 0 AND schedule_id IS NULL",
            &[&p.tenant.0, &idem.key, &idem.token, &p.id.0],
        )
        .await?;
        if held == 0 {
            return Err(StoreError::superseded());
        }
    }
    execute(
        &tx,
        "INSERT INTO schedules (id, tenant_id, version, state, shard, next_run_at, created_at, updated_at, fires_per_hour)
         VALUES ($1, $2, 1, 'ACTIVE', $3, $4, $5, $5, $6)",
        &[&p.id.0, &p.tenant.0, &p.shard, &p.next_run_at.map(|t| t.as_millisecond()), &now, &i32_of(p.fires_per_hour)],
    )
    .await?;
    version_insert(&tx, p.id, 1, &p.spec, now).await?;
    if let Some(next) = p.next_run_at {
        crate::queue::queue_insert(&tx, p.shard, p.id, 1, p.tenant, next.as_millisecond()).await?;
    }
    tx.commit().await.map_err(pg_err)
}

pub(crate) async fn schedule_list(c: &Client, p: ScheduleList) -> R<Vec<ScheduleRecord>> {
    // The cursor as an index range whatever the plan (a generic plan cannot turn
    // `$2 IS NULL OR id > $2` into one, and would read every page from the tenant's first).
    let ids: Vec<Uuid> = query(
        c,
        "SELECT s.id FROM schedules s JOIN schedule_versions v ON v.schedule_id = s.id AND v.version = s.version
          WHERE s.tenant_id = $1 AND s.id > COALESCE($2::uuid, '00000000-0000-0000-0000-000000000000')
            AND ($3::text IS NULL OR s.state = $3)
            AND ($4::text IS NULL OR v.queue = $4)
            AND ($6::text IS NULL OR v.timezone = $6)
          ORDER BY s.id LIMIT $5",
        &[&p.tenant.0, &p.after.map(|a| a.0), &p.state.map(|st| st.as_str()), &p.queue, &i64::from(p.limit), &p.timezone],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(rec) = crate::version::schedule_get(c, p.tenant, ScheduleId(id)).await? {
            out.push(rec);
        }
    }
    Ok(out)
}

/// The pending occurrences of schedule `$1`'s versions before `$2`, canceled at `$3`: how many,
/// and the earliest planned instant among them.
pub(crate) const RETIRE_PENDING: &str = "WITH pick AS (
       SELECT seq, id FROM occurrences
        WHERE schedule_id = $1 AND version < $2 AND state IN ('READY', 'RETRY_WAIT')
        ORDER BY seq FOR UPDATE),
   gone AS (
       UPDATE occurrences o SET state = 'CANCELED', finished_at = $3
         FROM pick WHERE o.id = pick.id AND o.seq = pick.seq AND o.state IN ('READY', 'RETRY_WAIT')
       RETURNING o.scheduled_for)
   SELECT count(*), min(scheduled_for) FROM gone";

/// The running occurrences of schedule `$1`'s versions before `$2`, flagged for cancellation.
pub(crate) const RETIRE_RUNNING: &str = "WITH pick AS (
       SELECT seq, id FROM occurrences WHERE schedule_id = $1 AND version < $2 AND state = 'RUNNING'
        ORDER BY seq FOR UPDATE)
   UPDATE occurrences o SET cancel_requested = true
     FROM pick WHERE o.id = pick.id AND o.seq = pick.seq AND o.state = 'RUNNING'";

pub(crate) type Retired = (u64, Option<i64>, Vec<(OccurrenceId, OccurrenceState)>);

/// Retires what the replaced versions left: their unclaimed occurrences become `CANCELED`,
/// their running ones are flagged for cancellation. Rows are locked in `seq` order, as the
/// batched successes and renewals lock them: a change and a worker's report naming the same
/// occurrences queue behind each other instead of deadlocking (seen: PostgreSQL failing a
/// batch of successes with a deadlock while a schedule was updated).
pub(crate) async fn retire_old_versions<C: GenericClient>(
    c: &C,
    id: ScheduleId,
    version: u32,
    now: i64,
) -> R<Retired> {
    let v = i32_of(version);
    let rows = query(c, RETIRE_PENDING, &[&id.0, &v, &now]).await?;
    let (canceled, earliest): (i64, Option<i64>) =
        rows.first().map_or((0, None), |r| (r.get(0), r.get(1)));
    execute(c, RETIRE_RUNNING, &[&id.0, &v]).await?;
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

/// The shared side of [`PLANNING_LOCK`], taken by a change on its schedule's shard (a
/// schedule never changes shards), before it locks the schedule's row.
pub(crate) const CHANGE_LOCK: &str = "SELECT pg_advisory_xact_lock_shared(hashtext('campanile/planning/' || current_schema()), shard)
       FROM schedules WHERE id = $1 AND tenant_id = $2";

pub(crate) async fn current<C: GenericClient>(
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
        crate::tenant::check_schedule_quota(
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
            crate::tenant::check_schedule_quota(&tx, p.tenant, 1, fires, None).await?;
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
            QUEUE_SEED,
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
