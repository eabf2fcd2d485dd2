//! Occurrences as records: inserted, read one with its attempts, listed, and the due backlog.

use campanile_core::{OccurrenceId, OccurrenceState, ScheduleId, occurrence_id};
use campanile_store::fence::reported;
use campanile_store::*;
use deadpool_postgres::{Client, GenericClient};
use jiff::Timestamp;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::db::{
    R, dur_ms, execute, i32_of, opt_ts, pg_err, query, resolve_now, stored_state, ts, u32_of,
};

pub(crate) async fn occurrence_insert_many(c: &mut Client, p: OccurrenceInsertMany) -> R<u64> {
    let tx = c.transaction().await.map_err(pg_err)?;
    let now = resolve_now(&tx, p.now).await?;
    let inserted = insert_occurrences(&tx, p.tenant, &p.items, now).await?;
    tx.commit().await.map_err(pg_err)?;
    Ok(inserted)
}

/// Inserts occurrences as arrays, 5,000 per statement; duplicates of the unique key are
/// ignored. Returns how many were new.
pub(crate) async fn insert_occurrences<C: GenericClient>(
    tx: &C,
    tenant: TenantId,
    items: &[NewOccurrence],
    now: i64,
) -> R<u64> {
    let mut inserted = 0;
    for chunk in items.chunks(5_000) {
        let n = chunk.len();
        let (mut ids, mut sids, mut vers, mut sfs, mut avs) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut queues, mut prios, mut states, mut maxes) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut bis, mut bms, mut overlaps, mut leases) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for o in chunk {
            let state = o.stored_state()?;
            ids.push(occurrence_id(o.schedule_id, o.version, o.scheduled_for).0);
            sids.push(o.schedule_id.0);
            vers.push(i32_of(o.version));
            sfs.push(o.scheduled_for.as_millisecond());
            avs.push(o.available_at.as_millisecond());
            queues.push(o.queue.as_str());
            prios.push(o.priority);
            states.push(state.as_str());
            maxes.push(i32_of(o.max_attempts));
            bis.push(dur_ms(o.backoff_initial));
            bms.push(dur_ms(o.backoff_max));
            overlaps.push(o.overlap.code());
            leases.push(dur_ms(o.lease));
        }
        let relayed = queues
            .iter()
            .zip(&states)
            .any(|(q, st)| *st == "READY" && campanile_core::is_reserved_queue(q));
        inserted += execute(
            tx,
            "INSERT INTO occurrences (id, tenant_id, schedule_id, version, scheduled_for, available_at,
                 queue, priority, state, max_attempts, backoff_initial_ms, backoff_max_ms, created_at, finished_at, overlap,
                 lease_ms, due_at)
             SELECT u.id, $1, u.sid, u.ver, u.sf, u.av, u.q, u.pr, u.st, u.ma, u.bi, u.bm, $2::int8,
                    CASE WHEN u.st = 'READY' THEN NULL ELSE $2::int8 END, u.ov, u.lease,
                    CASE WHEN u.ov <> 0 THEN u.av END
               FROM unnest($3::uuid[], $4::uuid[], $5::int4[], $6::int8[], $7::int8[], $8::text[],
                           $9::int4[], $10::text[], $11::int4[], $12::int8[], $13::int8[], $14::int4[],
                           $15::int8[])
                    AS u(id, sid, ver, sf, av, q, pr, st, ma, bi, bm, ov, lease)
             ON CONFLICT DO NOTHING",
            &[&tenant.0, &now, &ids, &sids, &vers, &sfs, &avs, &queues, &prios, &states, &maxes, &bis, &bms, &overlaps, &leases],
        )
        .await?;
        if relayed {
            // The outbox rows of externally targeted occurrences, in the same transaction;
            // one per occurrence (a duplicate is ignored like the occurrence's).
            execute(
                tx,
                "INSERT INTO outbox (tenant_id, occurrence_id, target, created_at, available_at)
                 SELECT $1, u.id, u.q, $2, u.av
                   FROM unnest($3::uuid[], $4::text[], $5::int8[], $6::text[]) AS u(id, q, av, st)
                  WHERE u.st = 'READY' AND left(u.q, 1) = '$'
                 ON CONFLICT DO NOTHING",
                &[&tenant.0, &now, &ids, &queues, &avs, &states],
            )
            .await?;
        }
    }
    Ok(inserted)
}

pub(crate) const OCC_COLS: &str =
    "seq, id, schedule_id, version, scheduled_for, available_at, queue, priority, state,
    epoch, owner, lease_until, attempts, max_attempts, cancel_requested, result, last_error_class,
    last_error, finished_at";

pub(crate) fn occurrence_row(r: &Row, now: i64) -> R<(i64, Occurrence)> {
    let available_at: i64 = r.get(5);
    let class: Option<String> = r.get(16);
    Ok((
        r.get(0),
        Occurrence {
            id: OccurrenceId(r.get(1)),
            schedule_id: ScheduleId(r.get(2)),
            version: u32_of(r.get(3)),
            scheduled_for: ts(r.get(4))?,
            available_at: ts(available_at)?,
            queue: r.get(6),
            priority: r.get(7),
            state: reported(stored_state(r.get(8))?, available_at, now),
            epoch: r.get(9),
            owner: r.get(10),
            lease_until: opt_ts(r.get(11))?,
            attempts: u32_of(r.get(12)),
            max_attempts: u32_of(r.get(13)),
            cancel_requested: r.get(14),
            result: r.get(15),
            last_error_class: class.as_deref().and_then(|c| c.parse().ok()),
            last_error: r.get(17),
            finished_at: opt_ts(r.get(18))?,
            // By name: each statement read here ends with `origin`, after its own columns.
            origin: Origin::from_column(
                r.try_get::<_, Option<String>>("origin")
                    .ok()
                    .flatten()
                    .as_deref(),
            ),
        },
    ))
}

pub(crate) async fn occurrence_get(c: &Client, p: OccurrenceGet) -> R<Option<OccurrenceDetail>> {
    let now = resolve_now(c, p.now).await?;
    let rows = match p.key {
        OccurrenceKey::Id(id) => {
            query(c, "SELECT seq, id FROM occurrences WHERE id = $1 AND tenant_id = $2", &[&id.0, &p.tenant.0]).await?
        }
        OccurrenceKey::Planned { schedule_id, scheduled_for } => {
            query(
                c,
                "SELECT seq, id FROM occurrences WHERE scheduled_for = $1 AND schedule_id = $2 AND tenant_id = $3
                  ORDER BY version DESC LIMIT 1",
                &[&scheduled_for.as_millisecond(), &schedule_id.0, &p.tenant.0],
            )
            .await?
        }
    };
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let (seq, id): (i64, uuid::Uuid) = (row.get(0), row.get(1));
    // The occurrence with its attempt rows, in one snapshot: the attempt in progress is
    // read from the one, the ended ones from the other.
    let rows = query(c, OCC_WITH_ATTEMPTS, &[&seq, &id]).await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let (_, occurrence) = occurrence_row(first, now)?;
    let claimed_at = opt_ts(first.get(19))?;
    let attempts = rows
        .iter()
        .filter(|r| r.get::<_, Option<i64>>(20).is_some())
        .map(attempt_row)
        .collect::<R<Vec<_>>>()?;
    let payload: Option<String> = first.get(29);
    Ok(Some(OccurrenceDetail {
        payload,
        ..OccurrenceDetail::assemble(occurrence, claimed_at, attempts)
    }))
}

/// The attempt in columns 20–27 of a row of [`OCC_WITH_ATTEMPTS`]'s shape.
pub(crate) fn attempt_row(r: &Row) -> R<Attempt> {
    let outcome: String = r.get(25);
    let class: Option<String> = r.get(26);
    Ok(Attempt {
        epoch: r.get(20),
        owner: r.get(21),
        started_at: ts(r.get(22))?,
        lease_until: ts(r.get(23))?,
        finished_at: opt_ts(r.get(24))?,
        outcome: AttemptOutcome::parse(&outcome)
            .ok_or_else(|| StoreError::Database(format!("unknown attempt outcome '{outcome}'")))?,
        error_class: class.as_deref().and_then(|c| c.parse().ok()),
        error_message: r.get(27),
    })
}

/// One occurrence (`$1` its seq; [`OCC_COLS`], then `claimed_at`) joined with its attempt rows
/// (columns 20–27, NULL when it has none), oldest first.
pub(crate) const OCC_WITH_ATTEMPTS: &str = include_str!("sql/occ_with_attempts.sql");

pub(crate) async fn occurrence_list(c: &Client, p: OccurrenceList) -> R<Vec<Occurrence>> {
    let now = resolve_now(c, p.now).await?;
    let mut sql = format!("SELECT {OCC_COLS}, origin FROM occurrences WHERE tenant_id = $1");
    let mut params: Vec<Box<dyn ToSql + Sync + Send>> = vec![Box::new(p.tenant.0)];
    let mut push = |clause: &str, v: Box<dyn ToSql + Sync + Send>, sql: &mut String| {
        params.push(v);
        sql.push_str(&clause.replace('?', &format!("${}", params.len())));
    };
    if let Some(s) = p.schedule_id {
        push(" AND schedule_id = ?", Box::new(s.0), &mut sql);
    }
    if let Some(f) = p.from {
        push(
            " AND scheduled_for >= ?",
            Box::new(f.as_millisecond()),
            &mut sql,
        );
    }
    if let Some(t) = p.to {
        push(
            " AND scheduled_for < ?",
            Box::new(t.as_millisecond()),
            &mut sql,
        );
    }
    // Across schedules, planned order is id order (ids lead with their planned instant,
    // `campanile_core::occurrence_id`), so the id index reads a range of planned instants in
    // order: the same rows, bounded by ids as well, and the cursor is the id alone (a row an
    // older version planned before 1970 sorts last, and is still listed once).
    let by_id = p.schedule_id.is_none();
    if let Some((t, id)) = p.after.filter(|_| !by_id) {
        push(
            " AND (scheduled_for, id) > (?",
            Box::new(t.as_millisecond()),
            &mut sql,
        );
        push(", ?)", Box::new(id.0), &mut sql);
    }
    if by_id {
        if let Some(f) = p.from {
            push(" AND id >= ?", Box::new(OccurrenceId::floor(f).0), &mut sql);
        }
        if let Some(t) = p.to {
            push(" AND id < ?", Box::new(OccurrenceId::floor(t).0), &mut sql);
        }
        if let Some((_, id)) = p.after {
            push(" AND id > ?", Box::new(id.0), &mut sql);
        }
    }
    if let Some(state) = p.state {
        match state {
            OccurrenceState::Scheduled => push(
                " AND state = 'READY' AND available_at > ?",
                Box::new(now),
                &mut sql,
            ),
            OccurrenceState::Ready => push(
                " AND state IN ('READY', 'RETRY_WAIT') AND available_at <= ?",
                Box::new(now),
                &mut sql,
            ),
            OccurrenceState::RetryWait => push(
                " AND state = 'RETRY_WAIT' AND available_at > ?",
                Box::new(now),
                &mut sql,
            ),
            s => push(" AND state = ?", Box::new(s.as_str().to_string()), &mut sql),
        }
    }
    push(
        if by_id {
            " ORDER BY id LIMIT ?"
        } else {
            " ORDER BY scheduled_for, id LIMIT ?"
        },
        Box::new(i64::from(p.limit)),
        &mut sql,
    );
    let refs: Vec<&(dyn ToSql + Sync)> = params
        .iter()
        .map(|b| b.as_ref() as &(dyn ToSql + Sync))
        .collect();
    query(c, &sql, &refs)
        .await?
        .iter()
        .map(|r| occurrence_row(r, now).map(|(_, o)| o))
        .collect()
}

pub(crate) async fn backlog(c: &Client, now: Option<Timestamp>) -> R<Backlog> {
    let now = resolve_now(c, now).await?;
    // Bounded: at most BACKLOG_COUNT_CAP rows are read.
    let rows = query(
        c,
        "SELECT count(*), min(available_at) FROM (
             SELECT available_at FROM occurrences
              WHERE state IN ('READY', 'RETRY_WAIT') AND available_at <= $1 LIMIT $2) d",
        &[&now, &(BACKLOG_COUNT_CAP as i64)],
    )
    .await?;
    let outbox = query(
        c,
        "SELECT count(*) FROM outbox WHERE settled_at IS NULL AND available_at <= $1",
        &[&now],
    )
    .await?;
    let (due, oldest): (i64, Option<i64>) =
        rows.first().map_or((0, None), |r| (r.get(0), r.get(1)));
    Ok(Backlog {
        due: due as u64,
        oldest_due_at: oldest.map(ts).transpose()?,
        outbox_pending: outbox.first().map_or(0, |r| r.get::<_, i64>(0)) as u64,
    })
}
