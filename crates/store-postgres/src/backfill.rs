//! A past range of a schedule's current version run after the fact: one occurrence per
//! calendar instant that has none, paced by the tenant's catch-up rate.

use campanile_core::{Overlap, ScheduleId, occurrence_id};
use campanile_store::*;
use deadpool_postgres::{Client, GenericClient};
use jiff::Timestamp;
use uuid::Uuid;

use crate::db::{R, execute, pg_err, query, resolve_now, stored_state, ts, u32_of};
use crate::occurrence::{OCC_COLS, occurrence_row};

pub(crate) async fn schedule_backfill(c: &mut Client, p: ScheduleBackfill) -> R<Backfilled> {
    let tx = c.transaction().await.map_err(pg_err)?;
    let now = resolve_now(&tx, p.now).await?;
    rules::check_backfill(&p, ts(now)?)?;
    // Serialized with changes to the schedule, which lock its row for update: a pause or an
    // update that answered first is seen; one that comes after cancels what this makes.
    let locked = query(
        &tx,
        "SELECT state FROM schedules WHERE id = $1 AND tenant_id = $2 FOR SHARE",
        &[&p.id.0, &p.tenant.0],
    )
    .await?;
    if locked.is_empty() {
        return Err(StoreError::NotFound(format!("schedule {}", p.id.0)));
    }
    let rec = crate::version::schedule_get(&tx, p.tenant, p.id)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("schedule {}", p.id.0)))?;
    if let Some(done) = by_key(&tx, &p, now).await? {
        return Ok(done);
    }
    rules::check_trigger(rec.state)?;
    if rec.version != p.version {
        return Err(StoreError::VersionConflict {
            current: rec.version,
        });
    }
    // Every version's rows in the range, per instant: what ran (under any version) or what the
    // current version decided is listed; a MISSED row of the current version runs again; the
    // rest is made ([`rules::backfill_kind`]).
    let mut by_at: std::collections::HashMap<
        i64,
        Vec<(u32, campanile_core::OccurrenceState, u32)>,
    > = std::collections::HashMap::new();
    for r in query(
        &tx,
        "SELECT scheduled_for, version, state, attempts FROM occurrences
          WHERE schedule_id = $1 AND scheduled_for >= $2 AND scheduled_for < $3",
        &[&p.id.0, &p.from.as_millisecond(), &p.to.as_millisecond()],
    )
    .await?
    {
        by_at.entry(r.get::<_, i64>(0)).or_default().push((
            u32_of(r.get(1)),
            stored_state(r.get::<_, &str>(2))?,
            u32_of(r.get(3)),
        ));
    }
    let (mut wanted, mut rerun, mut existing) = (Vec::new(), Vec::new(), Vec::new());
    for t in p.instants.iter().map(|t| t.as_millisecond()) {
        match rules::backfill_kind(p.version, by_at.remove(&t).unwrap_or_default()) {
            rules::BackfillKind::Create => wanted.push(t),
            rules::BackfillKind::Rerun => rerun.push(t),
            rules::BackfillKind::Existing => existing.push(t),
        }
    }
    // One pace for both, oldest instant first.
    let mut paced: Vec<(i64, bool)> = wanted
        .iter()
        .map(|t| (*t, true))
        .chain(rerun.iter().map(|t| (*t, false)))
        .collect();
    paced.sort();
    let slots = crate::tenant::catchup_reserve(&tx, p.tenant, paced.len() as u32, now).await?;
    let at_now = ts(now)?;
    let (mut items, mut again_ids, mut again_at) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (at, new)) in paced.iter().enumerate() {
        let available = slots.map_or(at_now, |s| s.slot(i as u32).max(at_now));
        if *new {
            items.push(NewOccurrence::backfill(
                &rec,
                ts(*at)?,
                available,
                p.overlap,
            ));
        } else {
            again_ids.push(occurrence_id(p.id, rec.version, ts(*at)?).0);
            again_at.push(available.as_millisecond());
        }
    }
    crate::occurrence::insert_occurrences(&tx, p.tenant, &items, now).await?;
    // Only the rows this transaction inserted (`xmin` is its id, modulo the epoch; no
    // savepoint is open on this path): an instant a lagging planner inserted meanwhile is
    // left as the planner's, and the answer says what was made, not what was meant.
    let ids: Vec<Uuid> = items
        .iter()
        .map(|o| occurrence_id(p.id, rec.version, o.scheduled_for).0)
        .collect();
    let made: std::collections::HashSet<i64> = query(
        &tx,
        "UPDATE occurrences SET origin = 'backfill'
          WHERE id = ANY($1) AND xmin::text::int8 = (txid_current() & 4294967295)
          RETURNING scheduled_for",
        &[&ids],
    )
    .await?
    .iter()
    .map(|r| r.get::<_, i64>(0))
    .collect();
    let mut again: std::collections::HashSet<i64> = std::collections::HashSet::new();
    if !again_ids.is_empty() {
        let overlap = p.overlap.map(Overlap::code);
        let flipped = query(
            &tx,
            "UPDATE occurrences o
                SET state = 'READY', available_at = u.at, finished_at = NULL, origin = 'backfill',
                    overlap = COALESCE($3, o.overlap),
                    due_at = CASE WHEN COALESCE($3, o.overlap) <> 0 THEN u.at END
               FROM unnest($1::uuid[], $2::int8[]) AS u(id, at)
              WHERE o.id = u.id AND o.state = 'MISSED' AND o.attempts = 0
              RETURNING o.id, o.scheduled_for, u.at",
            &[&again_ids, &again_at, &overlap],
        )
        .await?;
        // An externally targeted occurrence goes to the relay: its outbox row (re)opens, for
        // the rows actually made READY again.
        let ids: Vec<Uuid> = flipped.iter().map(|r| r.get(0)).collect();
        let at: Vec<i64> = flipped.iter().map(|r| r.get(2)).collect();
        again = flipped.iter().map(|r| r.get::<_, i64>(1)).collect();
        if campanile_core::is_reserved_queue(&rec.spec.queue) && !ids.is_empty() {
            execute(
                &tx,
                "INSERT INTO outbox (tenant_id, occurrence_id, target, created_at, available_at)
                 SELECT $1, u.id, $3, $4, u.at FROM unnest($2::uuid[], $5::int8[]) AS u(id, at)
                 ON CONFLICT (occurrence_id) DO UPDATE
                    SET settled_at = NULL, outcome = NULL, delivered_at = NULL,
                        available_at = EXCLUDED.available_at",
                &[&p.tenant.0, &ids, &rec.spec.queue, &now, &at],
            )
            .await?;
        }
    }
    // What a concurrent writer took first (a lagging planner's row, a rerun another backfill
    // made) is found, not made.
    existing.extend(wanted.iter().filter(|t| !made.contains(t)));
    existing.extend(rerun.iter().filter(|t| !again.contains(t)));
    existing.sort_unstable();
    wanted.retain(|t| made.contains(t));
    rerun.retain(|t| again.contains(t));
    let id = Uuid::now_v7();
    let inserted = execute(
        &tx,
        "INSERT INTO backfills (id, tenant_id, schedule_id, version, idem_key, range_from,
             range_to, overlap, instants, created, rerun, existing, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        &[
            &id,
            &p.tenant.0,
            &p.id.0,
            &(p.version as i32),
            &p.key,
            &p.from.as_millisecond(),
            &p.to.as_millisecond(),
            &p.overlap.map(Overlap::code),
            &(p.instants.len() as i32),
            &wanted,
            &rerun,
            &existing,
            &now,
        ],
    )
    .await;
    match inserted {
        Ok(_) => {}
        // The same key, backfilled at the same time by another request that committed first.
        Err(StoreError::AlreadyExists(_)) => {
            drop(tx);
            return by_key(&*c, &p, now)
                .await?
                .ok_or_else(|| StoreError::Database("a backfill's key vanished".into()));
        }
        Err(e) => return Err(e),
    }
    let out = answer(
        &tx,
        (p.tenant, p.id, p.version, id),
        (p.from, p.to),
        p.instants.len(),
        [&wanted, &rerun, &existing],
        false,
        now,
    )
    .await?;
    tx.commit().await.map_err(pg_err)?;
    Ok(out)
}

/// The backfill an earlier request with this key made, answered again; `Invalid` if that one
/// asked for another range or overlap policy.
async fn by_key<C: GenericClient>(c: &C, p: &ScheduleBackfill, now: i64) -> R<Option<Backfilled>> {
    let Some(key) = &p.key else {
        return Ok(None);
    };
    let rows = query(
        c,
        "SELECT id, version, range_from, range_to, overlap, instants, created, rerun, existing
           FROM backfills WHERE schedule_id = $1 AND idem_key = $2 AND tenant_id = $3",
        &[&p.id.0, key, &p.tenant.0],
    )
    .await?;
    let Some(r) = rows.first() else {
        return Ok(None);
    };
    let (from, to, overlap): (i64, i64, Option<i32>) = (r.get(2), r.get(3), r.get(4));
    if from != p.from.as_millisecond()
        || to != p.to.as_millisecond()
        || overlap != p.overlap.map(Overlap::code)
    {
        return Err(rules::backfill_key_reused());
    }
    let (created, rerun, existing): (Vec<i64>, Vec<i64>, Vec<i64>) = (r.get(6), r.get(7), r.get(8));
    answer(
        c,
        (p.tenant, p.id, r.get::<_, i32>(1) as u32, r.get(0)),
        (ts(from)?, ts(to)?),
        r.get::<_, i32>(5) as usize,
        [&created, &rerun, &existing],
        true,
        now,
    )
    .await
    .map(Some)
}

async fn answer<C: GenericClient>(
    c: &C,
    (tenant, schedule, version, id): (TenantId, ScheduleId, u32, Uuid),
    (from, to): (Timestamp, Timestamp),
    instants: usize,
    [created, rerun, existing]: [&[i64]; 3],
    replayed: bool,
    now: i64,
) -> R<Backfilled> {
    let rows = query(
        c,
        &format!(
            "SELECT {OCC_COLS}, origin FROM occurrences
              WHERE schedule_id = $1 AND tenant_id = $2
                AND scheduled_for >= $3 AND scheduled_for < $4
              ORDER BY scheduled_for, version DESC"
        ),
        &[
            &schedule.0,
            &tenant.0,
            &from.as_millisecond(),
            &to.as_millisecond(),
        ],
    )
    .await?;
    let all = rows
        .iter()
        .map(|r| occurrence_row(r, now).map(|(_, o)| o))
        .collect::<R<Vec<_>>>()?;
    let stamps = |v: &[i64]| v.iter().map(|t| ts(*t)).collect::<R<Vec<_>>>();
    let (c_, r_, e_) = (stamps(created)?, stamps(rerun)?, stamps(existing)?);
    let (created, rerun, existing) = rules::backfill_answer(version, all, [&c_, &r_, &e_]);
    Ok(Backfilled {
        backfill_id: id,
        version,
        from,
        to,
        instants: instants as u32,
        created,
        rerun,
        existing,
        replayed,
    })
}
