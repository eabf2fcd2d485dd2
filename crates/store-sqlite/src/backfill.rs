//! A past range of a schedule's current version run after the fact: one occurrence per
//! calendar instant that has none, paced by the tenant's catch-up rate.

use std::collections::HashMap;

use campanile_core::{Overlap, ScheduleId, occurrence_id};
use campanile_store::*;
use rusqlite::{Connection, OptionalExtension, params};
use uuid::Uuid;

use crate::db::{R, db_err, ts};
use crate::occurrence::{OCC_COLS, occurrence_row};

pub(crate) fn schedule_backfill(c: &Connection, p: &ScheduleBackfill, now: i64) -> R<Backfilled> {
    rules::check_backfill(p, ts(now)?)?;
    let rec = crate::version::schedule_get(c, p.tenant, p.id)?
        .ok_or_else(|| StoreError::NotFound(format!("schedule {}", p.id.0)))?;
    if let Some(key) = &p.key
        && let Some(done) = by_key(c, p, key, now)?
    {
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
    let mut by_at: HashMap<i64, Vec<(u32, campanile_core::OccurrenceState, u32)>> = HashMap::new();
    {
        let mut s = c
            .prepare_cached(
                "SELECT scheduled_for, version, state, attempts FROM occurrences
                  WHERE schedule_id = ?1 AND scheduled_for >= ?2 AND scheduled_for < ?3",
            )
            .map_err(db_err)?;
        let rows = s
            .query_map(
                params![p.id.0, p.from.as_millisecond(), p.to.as_millisecond()],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, u32>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, u32>(3)?,
                    ))
                },
            )
            .map_err(db_err)?;
        for row in rows {
            let (at, version, state, attempts) = row.map_err(db_err)?;
            by_at.entry(at).or_default().push((
                version,
                crate::db::stored_state(&state)?,
                attempts,
            ));
        }
    }
    let (mut wanted, mut rerun, mut existing) = (Vec::new(), Vec::new(), Vec::new());
    for at in &p.instants {
        let rows = by_at.remove(&at.as_millisecond()).unwrap_or_default();
        match rules::backfill_kind(p.version, rows) {
            rules::BackfillKind::Create => wanted.push(*at),
            rules::BackfillKind::Rerun => rerun.push(*at),
            rules::BackfillKind::Existing => existing.push(*at),
        }
    }
    // One pace for both, oldest instant first.
    let mut paced: Vec<(jiff::Timestamp, bool)> = wanted
        .iter()
        .map(|t| (*t, true))
        .chain(rerun.iter().map(|t| (*t, false)))
        .collect();
    paced.sort();
    let slots = crate::tenant::catchup_reserve(c, p.tenant, paced.len() as u32, now)?;
    let at_now = ts(now)?;
    let mut insert = crate::occurrence::OccurrenceInsert::new(c)?;
    let mut mark = c
        .prepare_cached("UPDATE occurrences SET origin = 'backfill' WHERE id = ?1")
        .map_err(db_err)?;
    let mut again = c
        .prepare_cached(
            "UPDATE occurrences
                SET state = 'READY', available_at = ?2, finished_at = NULL, origin = 'backfill',
                    due_at = CASE WHEN COALESCE(?3, overlap) <> 0 THEN ?2 END,
                    overlap = COALESCE(?3, overlap)
              WHERE id = ?1 AND state = 'MISSED' AND attempts = 0",
        )
        .map_err(db_err)?;
    let mut reopen = c
        .prepare_cached(
            "UPDATE outbox SET settled_at = NULL, outcome = NULL, delivered_at = NULL,
                               available_at = ?2
              WHERE occurrence_id = ?1",
        )
        .map_err(db_err)?;
    for (i, (at, new)) in paced.iter().enumerate() {
        let available = slots.map_or(at_now, |s| s.slot(i as u32).max(at_now));
        let id = occurrence_id(p.id, rec.version, *at);
        if *new {
            let item = NewOccurrence::backfill(&rec, *at, available, p.overlap);
            if insert.insert(p.tenant, std::slice::from_ref(&item), now)? == 1 {
                mark.execute(params![id.0]).map_err(db_err)?;
            }
        } else {
            let ms = available.as_millisecond();
            again
                .execute(params![id.0, ms, p.overlap.map(Overlap::code)])
                .map_err(db_err)?;
            // An externally targeted occurrence goes to the relay: its outbox row (re)opens.
            if campanile_core::is_reserved_queue(&rec.spec.queue) {
                crate::occurrence::outbox_insert(c, p.tenant, id, &rec.spec.queue, ms, now)?;
                reopen.execute(params![id.0, ms]).map_err(db_err)?;
            }
        }
    }
    let id = Uuid::now_v7();
    c.prepare_cached(
        "INSERT INTO backfills (id, tenant_id, schedule_id, version, idem_key, range_from,
             range_to, overlap, instants, created, rerun, existing, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )
    .and_then(|mut s| {
        s.execute(params![
            id,
            p.tenant.0,
            p.id.0,
            p.version,
            p.key,
            p.from.as_millisecond(),
            p.to.as_millisecond(),
            p.overlap.map(Overlap::code),
            p.instants.len() as i64,
            pack(&wanted),
            pack(&rerun),
            pack(&existing),
            now
        ])
    })
    .map_err(db_err)?;
    answer(
        c,
        (p.tenant, p.id, p.version, id),
        (p.from, p.to),
        p.instants.len(),
        [&wanted, &rerun, &existing],
        false,
        now,
    )
}

/// The backfill an earlier request with this key made, answered again; `Invalid` if that one
/// asked for another range or overlap policy.
fn by_key(c: &Connection, p: &ScheduleBackfill, key: &str, now: i64) -> R<Option<Backfilled>> {
    type Row = (Uuid, u32, i64, i64, Option<i32>, i64, [Vec<u8>; 3]);
    let row: Option<Row> = c
        .prepare_cached(
            "SELECT id, version, range_from, range_to, overlap, instants, created, rerun, existing
               FROM backfills WHERE schedule_id = ?1 AND idem_key = ?2 AND tenant_id = ?3",
        )
        .and_then(|mut s| {
            s.query_row(params![p.id.0, key, p.tenant.0], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    [r.get(6)?, r.get(7)?, r.get(8)?],
                ))
            })
            .optional()
        })
        .map_err(db_err)?;
    let Some((id, version, from, to, overlap, instants, [created, rerun, existing])) = row else {
        return Ok(None);
    };
    if from != p.from.as_millisecond()
        || to != p.to.as_millisecond()
        || overlap != p.overlap.map(Overlap::code)
    {
        return Err(rules::backfill_key_reused());
    }
    let (created, rerun, existing) = (unpack(&created)?, unpack(&rerun)?, unpack(&existing)?);
    answer(
        c,
        (p.tenant, p.id, version, id),
        (ts(from)?, ts(to)?),
        instants as usize,
        [&created, &rerun, &existing],
        true,
        now,
    )
    .map(Some)
}

/// The answer: the occurrences of the range, sorted into what was made, run again and found
/// (for an instant found, the latest version's row that ran, or the current version's).
fn answer(
    c: &Connection,
    (tenant, schedule, version, id): (TenantId, ScheduleId, u32, Uuid),
    (from, to): (jiff::Timestamp, jiff::Timestamp),
    instants: usize,
    [created, rerun, existing]: [&[jiff::Timestamp]; 3],
    replayed: bool,
    now: i64,
) -> R<Backfilled> {
    let rows = c
        .prepare_cached(&format!(
            "SELECT {OCC_COLS}, origin FROM occurrences
              WHERE schedule_id = ?1 AND tenant_id = ?2
                AND scheduled_for >= ?3 AND scheduled_for < ?4
              ORDER BY scheduled_for, version DESC"
        ))
        .and_then(|mut s| {
            s.query_map(
                params![
                    schedule.0,
                    tenant.0,
                    from.as_millisecond(),
                    to.as_millisecond()
                ],
                |r| occurrence_row(r, now),
            )?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(db_err)?;
    let mut all = Vec::with_capacity(rows.len());
    for row in rows {
        all.push(row?.1);
    }
    let (created, rerun, existing) =
        rules::backfill_answer(version, all, [created, rerun, existing]);
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

fn pack(instants: &[jiff::Timestamp]) -> Vec<u8> {
    instants
        .iter()
        .flat_map(|t| t.as_millisecond().to_be_bytes())
        .collect()
}

fn unpack(bytes: &[u8]) -> R<Vec<jiff::Timestamp>> {
    bytes
        .chunks_exact(8)
        .map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            ts(i64::from_be_bytes(a))
        })
        .collect()
}
