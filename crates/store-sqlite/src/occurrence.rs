//! Occurrences as records: inserted (with their outbox rows), read one with its attempts,
//! listed, and the due backlog.

use campanile_core::{OccurrenceId, OccurrenceState, ScheduleId, occurrence_id};
use campanile_store::fence::reported;
use campanile_store::*;
use rusqlite::{CachedStatement, Connection, OptionalExtension, Row, params};
use uuid::Uuid;

use crate::db::{R, db_err, dur_ms, opt_ts, stored_state, ts};

pub(crate) fn occurrence_insert_many(c: &Connection, p: &OccurrenceInsertMany, now: i64) -> R<u64> {
    insert_occurrences(c, p.tenant, &p.items, now)
}

/// Inserts occurrences; duplicates of the unique key are ignored. Returns how many were new.
pub(crate) fn insert_occurrences(
    c: &Connection,
    tenant: TenantId,
    items: &[NewOccurrence],
    now: i64,
) -> R<u64> {
    OccurrenceInsert::new(c)?.insert(tenant, items, now)
}

/// The occurrence insert, prepared once for a whole planning batch: looking a statement up in
/// rusqlite's cache (hashing its text) and handing it back cost about 9% of the writer's instructions
/// per planned schedule when done per schedule.
pub(crate) struct OccurrenceInsert<'c> {
    c: &'c Connection,
    stmt: CachedStatement<'c>,
}

impl<'c> OccurrenceInsert<'c> {
    pub(crate) fn new(c: &'c Connection) -> R<Self> {
        let stmt = c
            .prepare_cached(
                "INSERT INTO occurrences (id, tenant_id, schedule_id, version, scheduled_for, available_at,
                     queue, priority, state, max_attempts, backoff_initial_ms, backoff_max_ms,
                     created_at, finished_at, overlap, lease_ms, due_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                         CASE WHEN ?15 <> 0 THEN ?6 END)
                 ON CONFLICT DO NOTHING",
            )
            .map_err(db_err)?;
        Ok(OccurrenceInsert { c, stmt })
    }

    /// Inserts `items` for `tenant`; returns how many were new.
    pub(crate) fn insert(&mut self, tenant: TenantId, items: &[NewOccurrence], now: i64) -> R<u64> {
        let mut inserted = 0;
        for o in items {
            let id = occurrence_id(o.schedule_id, o.version, o.scheduled_for);
            let state = o.stored_state()?;
            let finished = (state != OccurrenceState::Ready).then_some(now);
            let relayed =
                state == OccurrenceState::Ready && campanile_core::is_reserved_queue(&o.queue);
            inserted += self
                .stmt
                .execute(params![
                    id.0,
                    tenant.0,
                    o.schedule_id.0,
                    o.version,
                    o.scheduled_for.as_millisecond(),
                    o.available_at.as_millisecond(),
                    o.queue,
                    o.priority,
                    state.as_str(),
                    o.max_attempts,
                    dur_ms(o.backoff_initial),
                    dur_ms(o.backoff_max),
                    now,
                    finished,
                    o.overlap.code(),
                    dur_ms(o.lease)
                ])
                .map_err(db_err)? as u64;
            if relayed {
                outbox_insert(
                    self.c,
                    tenant,
                    id,
                    &o.queue,
                    o.available_at.as_millisecond(),
                    now,
                )?;
            }
        }
        Ok(inserted)
    }
}

/// The outbox row of an externally targeted occurrence, written in the same transaction as
/// the occurrence; one per occurrence (a duplicate insert is ignored like the occurrence's).
pub(crate) fn outbox_insert(
    c: &Connection,
    tenant: TenantId,
    id: OccurrenceId,
    target: &str,
    available_at: i64,
    now: i64,
) -> R<()> {
    c.prepare_cached(
        "INSERT INTO outbox (tenant_id, occurrence_id, target, created_at, available_at)
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
    )
    .and_then(|mut s| s.execute(params![tenant.0, id.0, target, now, available_at]))
    .map_err(db_err)?;
    Ok(())
}

pub(crate) fn backlog(c: &Connection, now: i64) -> R<Backlog> {
    // Bounded: at most BACKLOG_COUNT_CAP rows are read, from the two pending indexes.
    let (due, oldest): (i64, Option<i64>) = c
        .prepare_cached(
            "SELECT COUNT(*), MIN(available_at) FROM (
                 SELECT available_at FROM occurrences
                  WHERE state IN ('READY', 'RETRY_WAIT') AND overlap = 0 AND available_at <= ?1
                 UNION ALL
                 SELECT available_at FROM occurrences
                  WHERE state IN ('READY', 'RETRY_WAIT') AND overlap <> 0 AND available_at <= ?1
                 LIMIT ?2)",
        )
        .and_then(|mut s| {
            s.query_row(params![now, BACKLOG_COUNT_CAP as i64], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
        })
        .map_err(db_err)?;
    let outbox: i64 = c
        .prepare_cached(
            "SELECT COUNT(*) FROM outbox WHERE settled_at IS NULL AND available_at <= ?1",
        )
        .and_then(|mut s| s.query_row([now], |r| r.get(0)))
        .map_err(db_err)?;
    Ok(Backlog {
        due: due as u64,
        oldest_due_at: oldest.map(ts).transpose()?,
        outbox_pending: outbox as u64,
    })
}

pub(crate) const OCC_COLS: &str =
    "seq, id, schedule_id, version, scheduled_for, available_at, queue, priority, state,
    epoch, owner, lease_until, attempts, max_attempts, cancel_requested, result, last_error_class,
    last_error, finished_at";

pub(crate) fn occurrence_row(r: &Row<'_>, now: i64) -> rusqlite::Result<R<(i64, Occurrence)>> {
    let state: String = r.get(8)?;
    let available_at: i64 = r.get(5)?;
    let class: Option<String> = r.get(16)?;
    let raw = (
        r.get::<_, i64>(0)?,
        r.get::<_, Uuid>(1)?,
        r.get::<_, Uuid>(2)?,
        r.get::<_, u32>(3)?,
        r.get::<_, i64>(4)?,
        r.get::<_, String>(6)?,
        r.get::<_, i32>(7)?,
        r.get::<_, i64>(9)?,
        r.get::<_, Option<String>>(10)?,
        r.get::<_, Option<i64>>(11)?,
    );
    let more = (
        r.get::<_, u32>(12)?,
        r.get::<_, u32>(13)?,
        r.get::<_, bool>(14)?,
        r.get::<_, Option<String>>(15)?,
        r.get::<_, Option<String>>(17)?,
        r.get::<_, Option<i64>>(18)?,
    );
    // By name: each statement read here ends with `origin`, after its own columns.
    let origin = Origin::from_column(
        r.get::<_, Option<String>>("origin")
            .ok()
            .flatten()
            .as_deref(),
    );
    Ok((|| {
        let (
            seq,
            id,
            schedule_id,
            version,
            scheduled_for,
            queue,
            priority,
            epoch,
            owner,
            lease_until,
        ) = raw;
        let (attempts, max_attempts, cancel_requested, result, last_error, finished_at) = more;
        Ok((
            seq,
            Occurrence {
                id: OccurrenceId(id),
                schedule_id: ScheduleId(schedule_id),
                version,
                scheduled_for: ts(scheduled_for)?,
                available_at: ts(available_at)?,
                queue,
                priority,
                state: reported(stored_state(&state)?, available_at, now),
                epoch,
                owner,
                lease_until: opt_ts(lease_until)?,
                attempts,
                max_attempts,
                cancel_requested,
                result,
                last_error_class: class.as_deref().and_then(|c| c.parse().ok()),
                last_error,
                finished_at: opt_ts(finished_at)?,
                origin,
            },
        ))
    })())
}

/// A tenant's occurrence by id (`?1` the id, `?2` the tenant) with its claim instant.
pub(crate) const OCCURRENCE_BY_ID: &str = include_str!("sql/occurrence_by_id.sql");

/// A tenant's occurrence by its planned instant (`?1`) and schedule (`?2`; `?3` the tenant): the latest version's.
pub(crate) const OCCURRENCE_BY_PLANNED: &str = include_str!("sql/occurrence_by_planned.sql");

pub(crate) fn occurrence_get(
    c: &Connection,
    p: &OccurrenceGet,
    now: i64,
) -> R<Option<OccurrenceDetail>> {
    // One snapshot for the occurrence row and its attempt rows: the attempt in progress is
    // read from the one, the ended ones from the other.
    let snapshot = c.unchecked_transaction().map_err(db_err)?;
    let c: &Connection = &snapshot;
    // The occurrence row ([`OCC_COLS`]) and its `claimed_at` (column 19).
    let with_claimed_at = |r: &Row<'_>| -> rusqlite::Result<_> {
        Ok((
            occurrence_row(r, now)?,
            r.get::<_, Option<i64>>(19)?,
            r.get::<_, Option<String>>("payload")?,
        ))
    };
    let found = match p.key {
        OccurrenceKey::Id(id) => c.prepare_cached(OCCURRENCE_BY_ID).and_then(|mut s| {
            s.query_row(params![id.0, p.tenant.0], with_claimed_at)
                .optional()
        }),
        OccurrenceKey::Planned {
            schedule_id,
            scheduled_for,
        } => c.prepare_cached(OCCURRENCE_BY_PLANNED).and_then(|mut s| {
            s.query_row(
                params![scheduled_for.as_millisecond(), schedule_id.0, p.tenant.0],
                with_claimed_at,
            )
            .optional()
        }),
    }
    .map_err(db_err)?;
    let Some((row, claimed_at, payload)) = found else {
        return Ok(None);
    };
    let (seq, occurrence) = row?;
    let attempts = attempts_of(c, seq)?;
    Ok(Some(OccurrenceDetail {
        payload,
        ..OccurrenceDetail::assemble(occurrence, opt_ts(claimed_at)?, attempts)
    }))
}

/// The attempt rows of the occurrence `seq`, oldest first.
pub(crate) fn attempts_of(c: &Connection, seq: i64) -> R<Vec<Attempt>> {
    c
        .prepare_cached(
            "SELECT epoch, owner, started_at, lease_until, finished_at, outcome, error_class, error_message
               FROM attempts WHERE occurrence_seq = ?1 ORDER BY epoch",
        )
        .and_then(|mut s| {
            s.query_map(params![seq], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, Option<i64>>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, Option<String>>(6)?,
                    r.get::<_, Option<String>>(7)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(db_err)?
        .into_iter()
        .map(|(epoch, owner, started, lease, finished, outcome, class, message)| {
            Ok(Attempt {
                epoch,
                owner,
                started_at: ts(started)?,
                lease_until: ts(lease)?,
                finished_at: opt_ts(finished)?,
                outcome: AttemptOutcome::parse(&outcome)
                    .ok_or_else(|| StoreError::Database(format!("unknown attempt outcome '{outcome}'")))?,
                error_class: class.as_deref().and_then(|c| c.parse().ok()),
                error_message: message,
            })
        })
        .collect::<R<Vec<_>>>()
}

pub(crate) fn occurrence_list(c: &Connection, p: &OccurrenceList, now: i64) -> R<Vec<Occurrence>> {
    let mut sql = format!("SELECT {OCC_COLS}, origin FROM occurrences WHERE tenant_id = :tenant");
    let sid = p.schedule_id.map(|s| s.0);
    if sid.is_some() {
        sql.push_str(" AND schedule_id = :sid");
    }
    if p.from.is_some() {
        sql.push_str(" AND scheduled_for >= :from");
    }
    if p.to.is_some() {
        sql.push_str(" AND scheduled_for < :to");
    }
    // Across schedules, planned order is id order (ids lead with their planned instant,
    // `campanile_core::occurrence_id`), so the id index reads a range of planned instants in
    // order: the same rows, bounded by ids as well, and the cursor is the id alone (a row an
    // older version planned before 1970 sorts last, and is still listed once).
    let by_id = sid.is_none();
    if p.after.is_some() && !by_id {
        sql.push_str(" AND (scheduled_for, id) > (:after_t, :after_id)");
    }
    if by_id {
        if p.from.is_some() {
            sql.push_str(" AND id >= :id_from");
        }
        if p.to.is_some() {
            sql.push_str(" AND id < :id_to");
        }
        if p.after.is_some() {
            sql.push_str(" AND id > :after_id");
        }
    }
    // The state is written into the statement, not bound: only a literal lets the planner see
    // that `RUNNING` may use the partial index of running occurrences (plans are not made
    // with bound values: `crate::connection::stable_plans`).
    if let Some(state) = p.state {
        match state {
            OccurrenceState::Scheduled => {
                sql.push_str(" AND state = 'READY' AND available_at > :now");
            }
            OccurrenceState::Ready => {
                sql.push_str(" AND state IN ('READY', 'RETRY_WAIT') AND available_at <= :now");
            }
            OccurrenceState::RetryWait => {
                sql.push_str(" AND state = 'RETRY_WAIT' AND available_at > :now");
            }
            s => sql.push_str(&format!(" AND state = '{}'", s.as_str())),
        }
    }
    sql.push_str(if by_id {
        " ORDER BY id LIMIT :limit"
    } else {
        " ORDER BY scheduled_for, id LIMIT :limit"
    });
    let mut stmt = c.prepare_cached(&sql).map_err(db_err)?;
    let mut named: Vec<(&str, Box<dyn rusqlite::ToSql>)> = vec![
        (":tenant", Box::new(p.tenant.0)),
        (":limit", Box::new(p.limit)),
    ];
    if let Some(s) = sid {
        named.push((":sid", Box::new(s)));
    }
    if let Some(f) = p.from {
        named.push((":from", Box::new(f.as_millisecond())));
        if by_id {
            named.push((":id_from", Box::new(OccurrenceId::floor(f).0)));
        }
    }
    if let Some(t) = p.to {
        named.push((":to", Box::new(t.as_millisecond())));
        if by_id {
            named.push((":id_to", Box::new(OccurrenceId::floor(t).0)));
        }
    }
    if let Some((t, id)) = p.after {
        if !by_id {
            named.push((":after_t", Box::new(t.as_millisecond())));
        }
        named.push((":after_id", Box::new(id.0)));
    }
    if let Some(OccurrenceState::Scheduled | OccurrenceState::Ready | OccurrenceState::RetryWait) =
        p.state
    {
        named.push((":now", Box::new(now)));
    }
    let refs: Vec<(&str, &dyn rusqlite::ToSql)> =
        named.iter().map(|(k, v)| (*k, v.as_ref())).collect();
    let rows = stmt
        .query_map(refs.as_slice(), |r| occurrence_row(r, now))
        .and_then(|it| it.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(db_err)?;
    rows.into_iter().map(|r| r.map(|(_, o)| o)).collect()
}
