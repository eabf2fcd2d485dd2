//! The SQL of every store operation. Writes run on the writer thread inside its transaction;
//! reads on a read-only connection.

use std::collections::HashMap;

use campanile_core::{OccurrenceId, OccurrenceState, Overlap, ScheduleId, occurrence_id};
use campanile_store::fence::{self, FenceView, reported};
use campanile_store::*;
use jiff::{SignedDuration, Timestamp};
use rusqlite::{CachedStatement, Connection, OptionalExtension, Row, params};
use uuid::Uuid;

use crate::db_err;

type R<T> = Result<T, StoreError>;

fn ts(ms: i64) -> R<Timestamp> {
    Timestamp::from_millisecond(ms)
        .map_err(|e| StoreError::Database(format!("bad instant {ms}: {e}")))
}

fn opt_ts(ms: Option<i64>) -> R<Option<Timestamp>> {
    ms.map(ts).transpose()
}

fn dur_ms(d: SignedDuration) -> i64 {
    d.as_millis()
        .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

fn stored_state(s: &str) -> R<OccurrenceState> {
    s.parse().map_err(|e| StoreError::Database(format!("{e}")))
}

pub(crate) fn tenant_create(c: &Connection, name: &str, now: i64) -> R<Tenant> {
    let id = c
        .prepare_cached("INSERT INTO tenants (name, created_at) VALUES (?1, ?2) RETURNING id")
        .and_then(|mut s| s.query_row(params![name, now], |r| r.get::<_, i64>(0)))
        .map_err(|e| match db_err(e) {
            StoreError::AlreadyExists(_) => StoreError::AlreadyExists(format!("tenant '{name}'")),
            other => other,
        })?;
    Ok(Tenant {
        id: TenantId(id),
        name: name.to_string(),
        created_at: ts(now)?,
        class: classes::DEFAULT_CLASS.into(),
    })
}

pub(crate) fn schedule_create(c: &Connection, p: &ScheduleCreate, now: i64) -> R<()> {
    crate::admin::check_schedule_quota(c, p.tenant, 1, i64::from(p.fires_per_hour), None)?;
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
        let entry = crate::schedules::QueueEntry {
            shard: p.shard,
            id: p.id,
            version: 1,
            tenant: p.tenant,
        };
        crate::schedules::queue_insert(c, entry, next.as_millisecond())?;
    }
    version_insert(c, p.id, 1, &p.spec, now)
}

pub(crate) fn version_insert(
    c: &Connection,
    id: ScheduleId,
    version: u32,
    spec: &ScheduleSpec,
    now: i64,
) -> R<()> {
    let t = spec.timing.columns();
    c.prepare_cached(
        "INSERT INTO schedule_versions (schedule_id, version, kind, cron, timezone, dst_gap, dst_fold,
             at, every_ms, anchor, queue, payload, priority, lease_ms, max_attempts,
             backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)",
    )
    .and_then(|mut s| {
        s.execute(params![
            id.0,
            version,
            t.kind,
            t.cron,
            t.timezone,
            t.dst_gap,
            t.dst_fold,
            t.at,
            t.every_ms,
            t.anchor,
            spec.queue,
            spec.payload,
            spec.priority,
            dur_ms(spec.lease),
            spec.max_attempts,
            dur_ms(spec.backoff_initial),
            dur_ms(spec.backoff_max),
            spec.misfire.to_json(),
            spec.overlap.as_str(),
            dur_ms(spec.flex_window),
            now
        ])
    })
    .map_err(db_err)?;
    Ok(())
}

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
fn outbox_insert(
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

/// `(seq, id, schedule_id, version, scheduled_for, available_at, epoch, attempts, lease_ms)`
/// (`lease_ms`: the occurrence's own lease length, granted when the claim names none).
type ClaimRow = (i64, Uuid, Uuid, u32, i64, i64, i64, u32, i64);

pub(crate) fn occurrence_claim(c: &Connection, p: &OccurrenceClaim, now: i64) -> R<Vec<Claimed>> {
    if !hands_out_work(c, now)? {
        return Err(StoreError::NoLiveNode);
    }
    let allowed = crate::admin::claim_allowance(c, p.tenant, &p.queue, p.max)?;
    if allowed == 0 {
        return Ok(Vec::new());
    }
    let limited;
    let p = if allowed < p.max {
        limited = OccurrenceClaim {
            max: allowed,
            ..p.clone()
        };
        &limited
    } else {
        p
    };
    let lease = p.lease.map(dur_ms);
    // Fast path, for schedules without an overlap policy: due pending work (one priority at a
    // time) and expired leases with attempts left, merged by priority and availability, then
    // claimed in one statement. The single writer makes the read-then-write atomic.
    let max = p.max as usize;
    let mut room = AnswerRoom::new(c, p.answer_bytes_or_default())?;
    let mut picked = pending_candidates(c, p, now, false, max)?;
    picked.extend(expired_candidates(c, p, now, false, max)?);
    best_first(&mut picked, max);
    let fit = room.take(c, picked.iter().map(|c| (c.row.2, c.row.3)))?;
    picked.truncate(fit);
    let reclaims = picked.iter().any(|c| c.running);
    let picked = picked.into_iter().map(Candidate::claim_row).collect();
    let key = p.key.map(|k| k.id);
    let mut rows = claim_rows(c, &p.worker_id, key, now, lease, picked, reclaims)?;
    let left = max - rows.len().min(max);
    if left > 0 && !room.room.is_full() {
        rows.extend(claim_constrained(c, p, now, lease, left, &mut room)?);
    }
    finish_claim(rows, now, lease)
}

/// What is left of a claim's size bound ([`OccurrenceClaim::max_bytes`]) as the writer picks
/// occurrences. Payload sizes are looked up only when the largest payload any version holds
/// (`payload_bound`, kept by a trigger) could pass what is left: a claim of small payloads
/// costs the writer one read of one row.
struct AnswerRoom {
    room: ClaimRoom,
    /// What the largest payload counts ([`payload_answer_bytes`]).
    largest: u64,
    sizes: HashMap<(Uuid, u32), u64>,
}

impl AnswerRoom {
    fn new(c: &Connection, max_bytes: u64) -> R<AnswerRoom> {
        let largest: i64 = c
            .prepare_cached("SELECT max_bytes FROM payload_bound WHERE id = 1")
            .and_then(|mut s| s.query_row([], |r| r.get(0)))
            .map_err(db_err)?;
        Ok(AnswerRoom {
            room: ClaimRoom::new(max_bytes),
            largest: payload_answer_bytes(usize::try_from(largest).unwrap_or(0)),
            sizes: HashMap::new(),
        })
    }

    /// How many of the occurrences of these `(schedule, version)`s, in claim order, fit in
    /// what is left; counts them.
    fn take(
        &mut self,
        c: &Connection,
        versions: impl ExactSizeIterator<Item = (Uuid, u32)>,
    ) -> R<usize> {
        let n = versions.len();
        if self.room.take_all(n, self.largest) {
            return Ok(n);
        }
        let mut q = c
            .prepare_cached(
                "SELECT length(CAST(payload AS BLOB)) FROM schedule_versions
                  WHERE schedule_id = ?1 AND version = ?2",
            )
            .map_err(db_err)?;
        let mut taken = 0;
        for key in versions {
            let size = match self.sizes.get(&key) {
                Some(size) => *size,
                None => {
                    let len: Option<i64> = q
                        .query_row(params![key.0, key.1], |r| r.get(0))
                        .optional()
                        .map_err(db_err)?
                        .flatten();
                    let size = payload_answer_bytes(
                        len.and_then(|l| usize::try_from(l).ok()).unwrap_or(0),
                    );
                    self.sizes.insert(key, size);
                    size
                }
            };
            if !self.room.take(size) {
                break;
            }
            taken += 1;
        }
        Ok(taken)
    }
}

/// What this worker claimed with `key` in the claim's queue and still holds (`RUNNING`, lease
/// unexpired at `now`), as that claim answered it: a claim sent again after its answer was
/// lost ([`campanile_store::ClaimKey::resent`]). Reads the running index's range of the queue's
/// unexpired leases; only a claim sent again pays for it.
pub(crate) fn claimed_with_key(
    c: &Connection,
    p: &OccurrenceClaim,
    key: Uuid,
    now: i64,
) -> R<Vec<Claimed>> {
    let rows = c
        .prepare_cached(
            "SELECT id, schedule_id, version, scheduled_for, available_at, epoch, attempts,
                    lease_until, claimed_at
               FROM occurrences INDEXED BY occurrences_running
              WHERE tenant_id = ?1 AND queue = ?2 AND state = 'RUNNING' AND lease_until > ?3
                AND owner = ?4 AND claim_key = ?5
              ORDER BY available_at, seq LIMIT ?6",
        )
        .and_then(|mut s| {
            s.query_map(
                params![p.tenant.0, p.queue, now, p.worker_id, key, p.max],
                |r| {
                    Ok((
                        r.get::<_, Uuid>(0)?,
                        r.get::<_, Uuid>(1)?,
                        r.get::<_, u32>(2)?,
                        r.get::<_, i64>(3)?,
                        r.get::<_, i64>(4)?,
                        r.get::<_, i64>(5)?,
                        r.get::<_, u32>(6)?,
                        r.get::<_, i64>(7)?,
                        r.get::<_, i64>(8)?,
                    ))
                },
            )?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(db_err)?;
    rows.into_iter()
        .map(
            |(id, sid, version, sf, av, epoch, attempts, lease_until, claimed_at)| {
                Ok(Claimed {
                    id: OccurrenceId(id),
                    schedule_id: ScheduleId(sid),
                    version,
                    scheduled_for: ts(sf)?,
                    available_at: ts(av)?,
                    epoch,
                    lease_until: ts(lease_until)?,
                    attempt: attempts,
                    claimed_at: ts(claimed_at)?,
                    payload: None,
                    replayed: true,
                })
            },
        )
        .collect()
}

/// A claim candidate: its row as it is before the claim, and what choosing it needs.
struct Candidate {
    priority: i64,
    /// The overlap policy code (0: ALLOW).
    overlap: i32,
    /// Re-claimed after its lease expired (else due pending work).
    running: bool,
    /// The lease end stored on the row (meaningful only when `running`: when it became
    /// claimable again).
    lease_until: Option<i64>,
    row: ClaimRow,
}

impl Candidate {
    /// The row to claim, its availability as the claim reports it
    /// ([`fence::claimable_since`]). Candidates are ordered by the stored availability before
    /// this.
    fn claim_row(self) -> ClaimRow {
        let mut row = self.row;
        row.5 = fence::claimable_since(self.running, row.5, self.lease_until);
        row
    }
}

fn candidate(r: &Row<'_>) -> rusqlite::Result<Candidate> {
    Ok(Candidate {
        priority: r.get(0)?,
        overlap: r.get(1)?,
        running: r.get(2)?,
        lease_until: r.get(12)?,
        row: (
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
            r.get(7)?,
            r.get(8)?,
            r.get(9)?,
            r.get(10)?,
            r.get(11)?,
        ),
    })
}

/// The claim's candidate queries for one kind of occurrence (unconstrained or
/// overlap-constrained), built once: they are on the hottest path.
struct ClaimSql {
    /// The next pending priority below `?3`.
    probe: String,
    /// The due range of priority `?3` at `?4`, up to `?5`.
    range: String,
    /// Expired leases with attempts left at `?3`, up to `?4`.
    expired: String,
}

impl ClaimSql {
    fn new(overlap: &str) -> ClaimSql {
        // In `candidate` order; the row's columns in `ClaimRow` order.
        let columns = "priority, overlap, state = 'RUNNING', seq, id, schedule_id, version, \
                       scheduled_for, available_at, epoch, attempts, lease_ms, lease_until";
        ClaimSql {
            probe: format!(
                "SELECT priority FROM occurrences
                  WHERE tenant_id = ?1 AND queue = ?2 AND state IN ('READY', 'RETRY_WAIT')
                    AND {overlap} AND priority < ?3
                  ORDER BY priority DESC LIMIT 1"
            ),
            range: format!(
                "SELECT {columns} FROM occurrences
                  WHERE tenant_id = ?1 AND queue = ?2 AND state IN ('READY', 'RETRY_WAIT')
                    AND {overlap} AND priority = ?3 AND available_at <= ?4
                  ORDER BY available_at LIMIT ?5"
            ),
            expired: format!(
                "SELECT {columns} FROM occurrences
                  WHERE tenant_id = ?1 AND queue = ?2 AND state = 'RUNNING' AND lease_until <= ?3
                    AND attempts < max_attempts AND cancel_requested = 0 AND {overlap}
                  ORDER BY lease_until LIMIT ?4"
            ),
        }
    }

    /// The queries for unconstrained (`false`) or overlap-constrained (`true`) occurrences.
    fn get(constrained: bool) -> &'static ClaimSql {
        static SQL: std::sync::LazyLock<[ClaimSql; 2]> = std::sync::LazyLock::new(|| {
            [ClaimSql::new("overlap = 0"), ClaimSql::new("overlap <> 0")]
        });
        &SQL[usize::from(constrained)]
    }
}

/// Keeps the `max` best candidates: highest priority first, then earliest claimable (an
/// expired lease from when it ended: the occurrences of its schedule that came due during the
/// lost attempt are decided before its takeover erases that attempt's `claimed_at`).
fn best_first(c: &mut Vec<Candidate>, max: usize) {
    c.sort_unstable_by_key(|c| {
        let since = fence::claimable_since(c.running, c.row.5, c.lease_until);
        (std::cmp::Reverse(c.priority), since, c.row.0)
    });
    c.truncate(max);
}

/// Claims the picked candidates in one statement (the single writer makes the earlier read
/// and this write atomic) and returns their rows as they are now. No `RETURNING`: in SQLite it
/// costs more than the update itself, and the new epoch and attempt count are known.
///
/// The new attempts are not rows of their own: the occurrence row holds the attempt in
/// progress ([`OccurrenceDetail::assemble`]). When `reclaims` says that some picked rows are
/// still `RUNNING` under an expired lease, their lost attempts are recorded first, from the
/// occurrence rows that the claim is about to overwrite.
fn claim_rows(
    c: &Connection,
    worker: &str,
    key: Option<Uuid>,
    now: i64,
    lease: Option<i64>,
    picked: Vec<ClaimRow>,
    reclaims: bool,
) -> R<Vec<ClaimRow>> {
    if picked.is_empty() {
        return Ok(Vec::new());
    }
    let seqs = serde_json::Value::from(picked.iter().map(|r| r.0).collect::<Vec<_>>()).to_string();
    if reclaims {
        c.prepare_cached(&RECORD_LOST)
            .and_then(|mut s| {
                s.execute(params![
                    AttemptOutcome::LeaseExpired.as_str(),
                    now,
                    Option::<&str>::None,
                    Option::<&str>::None,
                    seqs
                ])
            })
            .map_err(db_err)?;
    }
    let updated = c
        .prepare_cached(
            "UPDATE occurrences
                SET state = 'RUNNING', owner = ?1, epoch = epoch + 1, attempts = attempts + 1,
                    lease_until = ?2 + COALESCE(?3, lease_ms), claimed_at = ?2, cancel_requested = 0,
                    ran_until = NULL, claim_key = ?5,
                    available_at = CASE WHEN state = 'RUNNING' THEN MAX(available_at, lease_until)
                                        ELSE available_at END
              WHERE seq IN (SELECT value FROM json_each(?4))",
        )
        .and_then(|mut stmt| stmt.execute(params![worker, now, lease, seqs, key]))
        .map_err(db_err)?;
    if updated != picked.len() {
        return Err(StoreError::Database(format!(
            "claim updated {updated} of {} picked occurrences",
            picked.len()
        )));
    }
    Ok(picked
        .into_iter()
        .map(|row| {
            let (seq, id, sid, version, sf, av, epoch, attempts, lease_ms) = row;
            (
                seq,
                id,
                sid,
                version,
                sf,
                av,
                epoch + 1,
                attempts + 1,
                lease_ms,
            )
        })
        .collect())
}

/// Up to `limit` due pending occurrences of the claim's queue, best first, from the
/// unconstrained or the constrained pending index. A loose index scan: for each distinct
/// pending priority (highest first, one seek each), the due range of that priority. A poll
/// that finds nothing due costs a few seeks, however many future occurrences are waiting.
fn pending_candidates(
    c: &Connection,
    p: &OccurrenceClaim,
    now: i64,
    constrained: bool,
    limit: usize,
) -> R<Vec<Candidate>> {
    let sql = ClaimSql::get(constrained);
    let mut out: Vec<Candidate> = Vec::new();
    let mut below = i64::MAX;
    while out.len() < limit {
        let priority: Option<i64> = c
            .prepare_cached(&sql.probe)
            .and_then(|mut s| {
                s.query_row(params![p.tenant.0, p.queue, below], |r| r.get(0))
                    .optional()
            })
            .map_err(db_err)?;
        let Some(priority) = priority else { break };
        let want = (limit - out.len()) as i64;
        let rows = c
            .prepare_cached(&sql.range)
            .and_then(|mut s| {
                s.query_map(params![p.tenant.0, p.queue, priority, now, want], candidate)?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(db_err)?;
        out.extend(rows);
        below = priority;
    }
    Ok(out)
}

/// Up to `limit` occurrences of the claim's queue whose lease expired with attempts left.
fn expired_candidates(
    c: &Connection,
    p: &OccurrenceClaim,
    now: i64,
    constrained: bool,
    limit: usize,
) -> R<Vec<Candidate>> {
    c.prepare_cached(&ClaimSql::get(constrained).expired)
        .and_then(|mut s| {
            s.query_map(params![p.tenant.0, p.queue, now, limit as i64], candidate)?
                .collect()
        })
        .map_err(db_err)
}

/// For one candidate (`?1` its schedule, `?2` its seq, `?3` its priority, `?4` its
/// availability — when it came due), the history facts of [`fence::OverlapFacts`] and
/// whether another runs now, as PostgreSQL's `OVERLAP_STATE` reads them (see there). The
/// running index is named: with no statistics, SQLite's planner preferred the `ran_until`
/// index for "running", which holds the schedule's whole history.
pub const OVERLAP_STATE: &str = "SELECT
    EXISTS (SELECT 1 FROM occurrences INDEXED BY occurrences_running_schedule WHERE schedule_id = ?1 AND state = 'RUNNING' AND overlap <> 0
               AND seq <> ?2 AND claimed_at <= ?4 AND lease_until > ?4)
    OR EXISTS (SELECT 1 FROM occurrences
                WHERE schedule_id = ?1 AND overlap <> 0 AND ran_until IS NOT NULL
                  AND ran_until > ?4 AND claimed_at <= ?4 AND seq <> ?2),
    EXISTS (SELECT 1 FROM occurrences
             WHERE schedule_id = ?1 AND state IN ('READY', 'RETRY_WAIT') AND overlap <> 0
               AND available_at <= ?4 AND seq <> ?2
               AND (priority > ?3 OR (priority = ?3 AND (available_at, seq) < (?4, ?2))))
    OR EXISTS (SELECT 1 FROM occurrences INDEXED BY occurrences_running_schedule WHERE schedule_id = ?1 AND state = 'RUNNING' AND overlap <> 0
                  AND claimed_at > ?4 AND COALESCE(due_at, available_at) <= ?4 AND seq <> ?2 AND (priority > ?3 OR (priority = ?3 AND (COALESCE(due_at, available_at), seq) < (?4, ?2))))
    OR EXISTS (SELECT 1 FROM occurrences
                WHERE schedule_id = ?1 AND overlap <> 0 AND ran_until IS NOT NULL
                  AND ran_until > ?4 AND claimed_at > ?4 AND COALESCE(due_at, available_at) <= ?4
                  AND seq <> ?2 AND (priority > ?3 OR (priority = ?3 AND (COALESCE(due_at, available_at), seq) < (?4, ?2)))),
    EXISTS (SELECT 1 FROM occurrences INDEXED BY occurrences_running_schedule WHERE schedule_id = ?1 AND state = 'RUNNING' AND overlap <> 0 AND seq <> ?2)";

/// Claims of overlap-constrained occurrences, each decided with what its schedule's other
/// occurrences did when it came due and do now ([`fence::overlap_decision`]; the single writer
/// makes this atomic).
fn claim_constrained(
    c: &Connection,
    p: &OccurrenceClaim,
    now: i64,
    lease: Option<i64>,
    room: usize,
    bytes: &mut AnswerRoom,
) -> R<Vec<ClaimRow>> {
    let mut picked = pending_candidates(c, p, now, true, room + 64)?;
    picked.extend(expired_candidates(c, p, now, true, room + 64)?);
    best_first(&mut picked, room + 64);
    let mut out = Vec::new();
    let mut waiting: std::collections::HashSet<Uuid> = std::collections::HashSet::new();
    for cand in picked {
        if out.len() >= room {
            break;
        }
        let (seq, schedule, running) = (cand.row.0, cand.row.2, cand.running);
        let decision = if running {
            // The run itself is being retried after its lease expired.
            fence::OverlapDecision::Claim
        } else {
            let (ran_at_due, waited_at_due, running): (bool, bool, bool) = c
                .prepare_cached(OVERLAP_STATE)
                .and_then(|mut s| {
                    s.query_row(params![schedule, seq, cand.priority, cand.row.5], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })
                })
                .map_err(db_err)?;
            fence::overlap_decision(
                Overlap::from_code(cand.overlap),
                fence::OverlapFacts {
                    ran_at_due,
                    waited_at_due,
                    running,
                    // The candidates come in claim order, and the single writer decides them
                    // all: one ahead waits now only if this claim left it waiting.
                    earlier_waiting: waiting.contains(&schedule),
                },
            )
        };
        match decision {
            fence::OverlapDecision::Claim => {
                if bytes.take(c, std::iter::once((schedule, cand.row.3)))? == 0 {
                    break;
                }
                out.extend(claim_rows(
                    c,
                    &p.worker_id,
                    p.key.map(|k| k.id),
                    now,
                    lease,
                    vec![cand.claim_row()],
                    running,
                )?);
            }
            fence::OverlapDecision::Wait => {
                waiting.insert(schedule);
            }
            fence::OverlapDecision::Skip => {
                // Counted as decided; the single writer's commit follows in the same group.
                metrics::counter!("campanile_occurrences_skipped_overlap_total").increment(1);
                c.prepare_cached(
                    "UPDATE occurrences SET state = 'SKIPPED_OVERLAP', finished_at = ?2 WHERE seq = ?1",
                )
                .and_then(|mut s| s.execute(params![seq, now]))
                .map_err(db_err)?;
            }
        }
    }
    Ok(out)
}

/// The claimed rows as the claim answers them, each lease `lease` ms or, when `None`, the
/// occurrence's own (as `claim_rows` wrote it). Payloads are joined afterwards, on a reader
/// ([`fill_payloads`]), to keep the single writer short.
fn finish_claim(rows: Vec<ClaimRow>, now: i64, lease: Option<i64>) -> R<Vec<Claimed>> {
    let mut out = Vec::with_capacity(rows.len());
    for (_seq, id, schedule_id, version, scheduled_for, available_at, epoch, attempts, own) in rows
    {
        let lease_until = now.saturating_add(lease.unwrap_or(own));
        out.push(Claimed {
            id: OccurrenceId(id),
            schedule_id: ScheduleId(schedule_id),
            version,
            scheduled_for: ts(scheduled_for)?,
            available_at: ts(available_at)?,
            epoch,
            lease_until: ts(lease_until)?,
            attempt: attempts,
            claimed_at: ts(now)?,
            payload: None,
            replayed: false,
        });
    }
    out.sort_by_key(|c| c.available_at);
    Ok(out)
}

/// Joins the payloads of claimed occurrences. Schedule versions are immutable and written
/// before any of their occurrences, so any snapshot after the claim has them.
pub(crate) fn fill_payloads(c: &Connection, claims: &mut [Claimed]) -> R<()> {
    // One read transaction for all the lookups: each autocommit read would begin its own, and
    // a reader's page cache is dropped whenever the writer committed since its last one.
    let tx = c.unchecked_transaction().map_err(db_err)?;
    fill_payloads_in(&tx, claims)?;
    tx.commit().map_err(db_err)
}

fn fill_payloads_in(c: &Connection, claims: &mut [Claimed]) -> R<()> {
    let mut q = c
        .prepare_cached(
            "SELECT payload FROM schedule_versions WHERE schedule_id = ?1 AND version = ?2",
        )
        .map_err(db_err)?;
    let mut seen: HashMap<(Uuid, u32), Option<String>> = HashMap::new();
    for claim in claims {
        let key = (claim.schedule_id.0, claim.version);
        claim.payload = match seen.get(&key) {
            Some(p) => p.clone(),
            None => {
                let p: Option<String> = q
                    .query_row(params![key.0, key.1], |r| r.get(0))
                    .optional()
                    .map_err(db_err)?
                    .flatten();
                seen.insert(key, p.clone());
                p
            }
        };
    }
    Ok(())
}

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

/// One due outbox row with its occurrence: `(outbox seq, tenant, target, fence view, row)`.
type RelayRow = (i64, i64, String, FenceView, ClaimRow);

/// [`fence::hands_out_work`] for this database at `now` (in the writer: atomic with the claim
/// that follows, and ordered after any node's acquisition and its outage check).
fn hands_out_work(c: &Connection, now: i64) -> R<bool> {
    let last_alive: Option<i64> = c
        .prepare_cached("SELECT MAX(alive_until) FROM planner_nodes")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(db_err)?;
    Ok(fence::hands_out_work(last_alive, now))
}

pub(crate) fn relay_claim(c: &Connection, p: &RelayClaim, now: i64) -> R<Vec<Relayed>> {
    if !hands_out_work(c, now)? {
        // The relay is the node's own: it waits, as its node's claims do.
        return Ok(Vec::new());
    }
    let lease = dur_ms(p.lease);
    // Read a little more than `max`: rows to settle or postpone are handled on the way.
    let scan = i64::from(p.max).saturating_mul(2).max(16);
    let due: Vec<RelayRow> = c
        .prepare_cached(
            "SELECT occ.seq, occ.state, occ.owner, occ.epoch, occ.lease_until, occ.available_at,
                    occ.attempts, occ.max_attempts, occ.backoff_initial_ms, occ.backoff_max_ms,
                    occ.id, occ.schedule_id, occ.version, occ.scheduled_for,
                    o.seq, o.tenant_id, o.target
               FROM outbox o JOIN occurrences occ ON occ.id = o.occurrence_id
              WHERE o.settled_at IS NULL AND o.available_at <= ?1
                AND NOT (occ.state = 'RUNNING' AND occ.cancel_requested)
              ORDER BY o.available_at LIMIT ?2",
        )
        .and_then(|mut s| {
            s.query_map(params![now, scan], |r| {
                Ok((
                    raw_fence(r)?,
                    (r.get(10)?, r.get(11)?, r.get(12)?, r.get(13)?),
                    (r.get(14)?, r.get(15)?, r.get(16)?),
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(db_err)?
        .into_iter()
        .map(
            |(raw, (id, schedule_id, version, scheduled_for), (oseq, tenant, target))| {
                let (seq, view) = fence_of(raw)?;
                let row = (
                    seq,
                    id,
                    schedule_id,
                    version,
                    scheduled_for,
                    view.claimable_since(),
                    view.epoch,
                    view.attempts,
                    lease,
                );
                Ok((oseq, tenant, target, view, row))
            },
        )
        .collect::<R<_>>()?;
    let mut picked: Vec<ClaimRow> = Vec::new();
    let mut reclaims = false;
    let mut routes = RelayRoutes::new();
    let mut settle = c
        .prepare_cached(
            "UPDATE outbox SET settled_at = ?2, outcome = ?3,
                    delivered_at = CASE WHEN ?3 = 'SUCCEEDED' THEN ?2 END
              WHERE seq = ?1",
        )
        .map_err(db_err)?;
    let mut postpone = c
        .prepare_cached("UPDATE outbox SET available_at = ?2 WHERE seq = ?1")
        .map_err(db_err)?;
    let mut attempted = c
        .prepare_cached("UPDATE outbox SET attempts = attempts + 1 WHERE seq = ?1")
        .map_err(db_err)?;
    for (oseq, tenant, target, view, row) in due {
        match fence::relay_step(&view, now) {
            fence::RelayStep::Settle(state) => {
                settle
                    .execute(params![oseq, now, state.as_str()])
                    .map_err(db_err)?;
            }
            fence::RelayStep::Postpone(at) => {
                postpone.execute(params![oseq, at]).map_err(db_err)?;
            }
            fence::RelayStep::Claim if picked.len() < p.max as usize => {
                attempted.execute(params![oseq]).map_err(db_err)?;
                reclaims |= view.state == OccurrenceState::Running;
                routes.insert(row.1, (TenantId(tenant), target));
                picked.push(row);
            }
            fence::RelayStep::Claim => {}
        }
    }
    let rows = claim_rows(c, &p.node, None, now, Some(lease), picked, reclaims)?;
    Relayed::pair(finish_claim(rows, now, Some(lease))?, routes)
}

pub(crate) fn lease_renew(c: &Connection, p: &LeaseRenew, now: i64) -> R<Vec<Renewal>> {
    let lease = p.lease.map(dur_ms);
    let arr = serde_json::Value::from(
        p.leases
            .iter()
            .map(|l| serde_json::json!([l.occurrence_id.0.simple().to_string(), l.epoch]))
            .collect::<Vec<_>>(),
    )
    .to_string();
    let mut stmt = c
        .prepare_cached(
            "UPDATE occurrences SET lease_until = ?3 + COALESCE(?5, lease_ms)
              WHERE tenant_id = ?1 AND owner = ?2 AND state = 'RUNNING' AND lease_until > ?3
                AND (id, epoch) IN (SELECT unhex(json_extract(value, '$[0]')), json_extract(value, '$[1]')
                                      FROM json_each(?4))
             RETURNING id, epoch, cancel_requested, lease_until",
        )
        .map_err(db_err)?;
    let renewed: HashMap<(Uuid, i64), (bool, i64)> = stmt
        .query_map(params![p.tenant.0, p.worker_id, now, arr, lease], |r| {
            Ok((
                (r.get::<_, Uuid>(0)?, r.get::<_, i64>(1)?),
                (r.get::<_, bool>(2)?, r.get::<_, i64>(3)?),
            ))
        })
        .and_then(|it| it.collect())
        .map_err(db_err)?;
    p.leases
        .iter()
        .map(|l| {
            let hit = renewed.get(&(l.occurrence_id.0, l.epoch));
            // A lost lease is explained from its row as it is now (the same transaction).
            let lost = match hit {
                Some(_) => None,
                None => {
                    let view = fence_row(c, p.tenant, l.occurrence_id)?.map(|(_, v, _)| v);
                    fence::lost(view.as_ref(), &p.worker_id, l.epoch, now)?
                }
            };
            Ok(Renewal {
                lease: *l,
                renewed: hit.is_some(),
                lease_until: hit.map(|(_, until)| ts(*until)).transpose()?,
                cancel_requested: hit.is_some_and(|(cancel, _)| *cancel),
                lost,
            })
        })
        .collect()
}

/// An occurrence's `seq` and fence columns as read, in this order: `seq, state, owner, epoch,
/// lease_until, available_at, attempts, max_attempts, backoff_initial_ms, backoff_max_ms`.
type RawFence = (
    i64,
    String,
    Option<String>,
    i64,
    Option<i64>,
    i64,
    u32,
    u32,
    i64,
    i64,
);

/// Reads the fence columns from the first ten columns of a row.
fn raw_fence(r: &Row<'_>) -> rusqlite::Result<RawFence> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
        r.get(9)?,
    ))
}

fn fence_of(raw: RawFence) -> R<(i64, FenceView)> {
    let (seq, state, owner, epoch, lease_until, available_at, attempts, max_attempts, bi, bm) = raw;
    Ok((
        seq,
        FenceView {
            state: stored_state(&state)?,
            owner,
            epoch,
            lease_until,
            available_at,
            attempts,
            max_attempts,
            backoff_initial_ms: bi,
            backoff_max_ms: bm,
        },
    ))
}

/// The fence columns of one occurrence, and whether its cancellation was requested.
fn fence_row(
    c: &Connection,
    tenant: TenantId,
    id: OccurrenceId,
) -> R<Option<(i64, FenceView, bool)>> {
    c.prepare_cached(
        "SELECT seq, state, owner, epoch, lease_until, available_at, attempts, max_attempts,
                backoff_initial_ms, backoff_max_ms, cancel_requested
           FROM occurrences WHERE id = ?1 AND tenant_id = ?2",
    )
    .and_then(|mut s| {
        s.query_row(params![id.0, tenant.0], |r| Ok((raw_fence(r)?, r.get(10)?)))
            .optional()
    })
    .map_err(db_err)?
    .map(|(raw, cancel)| fence_of(raw).map(|(seq, view)| (seq, view, cancel)))
    .transpose()
}

fn refused(id: OccurrenceId, conflict: Conflict) -> Ack {
    Ack {
        occurrence_id: id,
        rows: 0,
        conflict: Some(conflict),
        state: None,
        retry_at: None,
    }
}

pub(crate) fn occurrence_finish_many(
    c: &Connection,
    p: &OccurrenceFinishMany,
    now: i64,
) -> R<Vec<Ack>> {
    let mut out = Vec::with_capacity(p.items.len());
    // Prepared once for the batch (as the planner's inserts are): a cache lookup and return
    // per item was about 7% of a success's instructions.
    let mut succeed = c
        .prepare_cached(
            "UPDATE occurrences SET state = 'SUCCEEDED', result = COALESCE(?1, result), finished_at = ?2,
                    ran_until = ?2
              WHERE id = ?3 AND tenant_id = ?6 AND state = 'RUNNING' AND owner = ?4 AND epoch = ?5
                AND lease_until > ?2",
        )
        .map_err(db_err)?;
    for item in &p.items {
        out.push(finish_one(
            c,
            &mut succeed,
            p.tenant,
            &p.worker_id,
            item,
            now,
        )?);
    }
    Ok(out)
}

fn finish_one(
    c: &Connection,
    succeed: &mut CachedStatement<'_>,
    tenant: TenantId,
    worker: &str,
    item: &FinishItem,
    now: i64,
) -> R<Ack> {
    let id = item.lease.occurrence_id;
    // A success needs nothing from the row but the fence itself: write first, conditionally,
    // and read the row only to explain a refusal (the slow path below).
    if let Finish::Succeeded { result } = &item.finish {
        let rows = succeed
            .execute(params![
                result,
                now,
                id.0,
                worker,
                item.lease.epoch,
                tenant.0
            ])
            .map_err(db_err)?;
        // The attempt that succeeded is the occurrence row's own: no attempt row to write.
        if rows == 1 {
            return Ok(Ack {
                occurrence_id: id,
                rows: 1,
                conflict: None,
                state: Some(OccurrenceState::Succeeded),
                retry_at: None,
            });
        }
    }
    let Some((seq, view, cancel_requested)) = fence_row(c, tenant, id)? else {
        return Ok(refused(id, Conflict::NotFound));
    };
    if let Some(conflict) = fence::check(&view, worker, item.lease.epoch, now)? {
        return Ok(refused(id, conflict));
    }
    let plan = fence::plan(&view, id, &item.finish, cancel_requested, now)?;
    // The fenced write: its affected-row count is the acknowledgement.
    let rows = c
        .prepare_cached(
            "UPDATE occurrences
                SET state = ?1, result = COALESCE(?2, result), available_at = ?3, finished_at = ?4,
                    last_error_class = COALESCE(?5, last_error_class), last_error = COALESCE(?6, last_error),
                    ran_until = ?10
              WHERE seq = ?7 AND state = 'RUNNING' AND owner = ?8 AND epoch = ?9 AND lease_until > ?10",
        )
        .and_then(|mut s| {
            s.execute(params![
                plan.state.as_str(),
                plan.result,
                plan.available_at,
                plan.finished_at,
                plan.error_class,
                plan.error_message,
                seq,
                worker,
                item.lease.epoch,
                now
            ])
        })
        .map_err(db_err)? as u64;
    if rows == 0 {
        // Cannot happen under the single writer; answer honestly if it ever does.
        return Ok(refused(id, Conflict::WrongState { state: view.state }));
    }
    if let Some(at) = plan.outbox_due(now) {
        c.prepare_cached(
            "UPDATE outbox SET available_at = ?1 WHERE occurrence_id = ?2 AND settled_at IS NULL",
        )
        .and_then(|mut s| s.execute(params![at, id.0]))
        .map_err(db_err)?;
    }
    record_attempt(
        c,
        seq,
        plan.outcome,
        now,
        plan.error_class,
        plan.error_message.as_deref(),
    )?;
    Ok(Ack {
        occurrence_id: id,
        rows,
        conflict: None,
        state: Some(plan.state),
        retry_at: (plan.state == OccurrenceState::RetryWait)
            .then(|| ts(plan.available_at))
            .transpose()?,
    })
}

/// Writes an attempt row from the occurrence row's current attempt (owner, epoch,
/// `claimed_at`, lease), ended at `?2` with outcome `?1` and error `?3`/`?4`; the caller adds
/// which occurrences, then [`upgrade::CLOSE_RUNNING_ATTEMPT_ROW`].
const RECORD_ATTEMPT: &str =
    "INSERT INTO attempts (occurrence_seq, epoch, owner, started_at, lease_until, finished_at,
                           outcome, error_class, error_message)
     SELECT seq, epoch, owner, claimed_at, lease_until, ?2, ?1, ?3, ?4 FROM occurrences";

/// [`RECORD_ATTEMPT`] for occurrence `?5`.
static RECORD_ONE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "{RECORD_ATTEMPT} WHERE seq = ?5 {}",
        upgrade::CLOSE_RUNNING_ATTEMPT_ROW
    )
});

/// [`RECORD_ATTEMPT`] for those of the occurrences `?5` (a JSON array of seqs) still running.
static RECORD_LOST: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "{RECORD_ATTEMPT} WHERE seq IN (SELECT value FROM json_each(?5)) AND state = 'RUNNING'
         {}",
        upgrade::CLOSE_RUNNING_ATTEMPT_ROW
    )
});

/// Records how the current attempt of occurrence `seq` ended, unless it succeeded: a
/// successful attempt stays on the occurrence row, which is final
/// ([`OccurrenceDetail::assemble`]).
fn record_attempt(
    c: &Connection,
    seq: i64,
    outcome: AttemptOutcome,
    now: i64,
    error_class: Option<&str>,
    error_message: Option<&str>,
) -> R<()> {
    if outcome == AttemptOutcome::Succeeded {
        return Ok(());
    }
    c.prepare_cached(&RECORD_ONE)
        .and_then(|mut s| {
            s.execute(params![
                outcome.as_str(),
                now,
                error_class,
                error_message,
                seq
            ])
        })
        .map_err(db_err)?;
    Ok(())
}

pub(crate) fn occurrence_cancel(c: &Connection, p: &OccurrenceCancel, now: i64) -> R<Ack> {
    let id = p.occurrence_id;
    let Some((seq, f, _)) = fence_row(c, p.tenant, id)? else {
        return Ok(refused(id, Conflict::NotFound));
    };
    let (sql, state) = match f.state {
        OccurrenceState::Ready | OccurrenceState::RetryWait => (
            "UPDATE occurrences SET state = 'CANCELED', finished_at = ?2
              WHERE seq = ?1 AND state IN ('READY', 'RETRY_WAIT')",
            OccurrenceState::Canceled,
        ),
        OccurrenceState::Running => (
            "UPDATE occurrences SET cancel_requested = 1 WHERE seq = ?1 AND state = 'RUNNING' AND ?2 = ?2",
            OccurrenceState::Running,
        ),
        s => {
            return Ok(refused(
                id,
                Conflict::WrongState {
                    state: reported(s, f.available_at, now),
                },
            ));
        }
    };
    let rows = c
        .prepare_cached(sql)
        .and_then(|mut s| s.execute(params![seq, now]))
        .map_err(db_err)? as u64;
    Ok(Ack {
        occurrence_id: id,
        rows,
        conflict: None,
        state: Some(state),
        retry_at: None,
    })
}

/// Re-readies a dead letter. Its owner and lease go: no worker holds it until it is claimed
/// again (the dead attempt stays in its attempt rows; `claimed_at` and `ran_until` stay for
/// the overlap history).
pub(crate) fn occurrence_redrive(c: &Connection, p: &OccurrenceRedrive, now: i64) -> R<Ack> {
    let id = p.occurrence_id;
    let rows = c
        .prepare_cached(
            "UPDATE occurrences
                SET state = 'READY', attempts = 0, available_at = ?3, finished_at = NULL,
                    due_at = CASE WHEN overlap <> 0 THEN ?3 END,
                    cancel_requested = 0, owner = NULL, lease_until = NULL
              WHERE id = ?1 AND tenant_id = ?2 AND state = 'DEAD'",
        )
        .and_then(|mut s| s.execute(params![id.0, p.tenant.0, now]))
        .map_err(db_err)? as u64;
    if rows == 1 {
        // An externally targeted occurrence goes back to the relay: its outbox row reopens.
        c.prepare_cached(
            "UPDATE outbox SET settled_at = NULL, outcome = NULL, delivered_at = NULL,
                               available_at = ?2
              WHERE occurrence_id = ?1",
        )
        .and_then(|mut s| s.execute(params![id.0, now]))
        .map_err(db_err)?;
        return Ok(Ack {
            occurrence_id: id,
            rows,
            conflict: None,
            state: Some(OccurrenceState::Ready),
            retry_at: None,
        });
    }
    Ok(match fence_row(c, p.tenant, id)? {
        None => refused(id, Conflict::NotFound),
        Some((_, f, _)) => refused(
            id,
            Conflict::WrongState {
                state: reported(f.state, f.available_at, now),
            },
        ),
    })
}

pub(crate) fn lease_sweep(c: &Connection, limit: u32, now: i64) -> R<SweepReport> {
    let expired: Vec<(i64, u32, u32, bool)> = c
        .prepare_cached(
            "SELECT seq, attempts, max_attempts, cancel_requested FROM occurrences
              WHERE state = 'RUNNING' AND lease_until <= ?1 ORDER BY lease_until LIMIT ?2",
        )
        .and_then(|mut s| {
            s.query_map(params![now, limit], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect()
        })
        .map_err(db_err)?;
    let mut report = SweepReport::default();
    let mut requeue = c
        .prepare_cached(
            "UPDATE occurrences SET state = 'READY', last_error = 'lease expired',
                    available_at = MAX(available_at, lease_until), ran_until = lease_until
              WHERE seq = ?1 AND state = 'RUNNING' AND lease_until <= ?2",
        )
        .map_err(db_err)?;
    let mut bury = c
        .prepare_cached(
            "UPDATE occurrences SET state = 'DEAD', finished_at = ?2, last_error = 'lease expired',
                    ran_until = lease_until
              WHERE seq = ?1 AND state = 'RUNNING' AND lease_until <= ?2",
        )
        .map_err(db_err)?;
    let mut cancel = c
        .prepare_cached(
            "UPDATE occurrences SET state = 'CANCELED', finished_at = ?2, last_error = 'lease expired',
                    ran_until = lease_until
              WHERE seq = ?1 AND state = 'RUNNING' AND lease_until <= ?2",
        )
        .map_err(db_err)?;
    for (seq, attempts, max, cancel_requested) in expired {
        record_attempt(c, seq, AttemptOutcome::LeaseExpired, now, None, None)?;
        // Its cancellation was asked for while it ran: the run is over, and it ends canceled
        // rather than being handed out again.
        if cancel_requested {
            report.canceled += cancel.execute(params![seq, now]).map_err(db_err)? as u64;
        } else if attempts >= max {
            report.dead += bury.execute(params![seq, now]).map_err(db_err)? as u64;
        } else {
            report.requeued += requeue.execute(params![seq, now]).map_err(db_err)? as u64;
        }
    }
    Ok(report)
}

const OCC_COLS: &str =
    "seq, id, schedule_id, version, scheduled_for, available_at, queue, priority, state,
    epoch, owner, lease_until, attempts, max_attempts, cancel_requested, result, last_error_class,
    last_error, finished_at";

fn occurrence_row(r: &Row<'_>, now: i64) -> rusqlite::Result<R<(i64, Occurrence)>> {
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
            },
        ))
    })())
}

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
        Ok((occurrence_row(r, now)?, r.get::<_, Option<i64>>(19)?))
    };
    let found = match p.key {
        OccurrenceKey::Id(id) => c
            .prepare_cached(&format!(
                "SELECT {OCC_COLS}, claimed_at FROM occurrences WHERE id = ?1 AND tenant_id = ?2"
            ))
            .and_then(|mut s| {
                s.query_row(params![id.0, p.tenant.0], with_claimed_at)
                    .optional()
            }),
        OccurrenceKey::Planned {
            schedule_id,
            scheduled_for,
        } => c
            .prepare_cached(&format!(
                "SELECT {OCC_COLS}, claimed_at FROM occurrences
                  WHERE scheduled_for = ?1 AND schedule_id = ?2 AND tenant_id = ?3
                  ORDER BY version DESC LIMIT 1"
            ))
            .and_then(|mut s| {
                s.query_row(
                    params![scheduled_for.as_millisecond(), schedule_id.0, p.tenant.0],
                    with_claimed_at,
                )
                .optional()
            }),
    }
    .map_err(db_err)?;
    let Some((row, claimed_at)) = found else {
        return Ok(None);
    };
    let (seq, occurrence) = row?;
    let attempts = c
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
        .collect::<R<Vec<_>>>()?;
    Ok(Some(OccurrenceDetail::assemble(
        occurrence,
        opt_ts(claimed_at)?,
        attempts,
    )))
}

pub(crate) fn occurrence_list(c: &Connection, p: &OccurrenceList, now: i64) -> R<Vec<Occurrence>> {
    let mut sql = format!("SELECT {OCC_COLS} FROM occurrences WHERE tenant_id = :tenant");
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
    // with bound values: `crate::stable_plans`).
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use rusqlite::StatementStatus;

    use super::*;

    /// The claim's statements are planned once per connection: a new `LIMIT` or priority bound
    /// to a cached statement does not send it through the parser and planner again (without
    /// the query planner stability guarantee, every claim did — [`crate::stable_plans`]).
    #[test]
    fn cached_claim_statements_are_not_planned_again_for_new_bindings() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("plans.db")).unwrap();
        crate::configure(&conn).unwrap();
        crate::migrate::apply(&mut conn).unwrap();
        // Runs a cached statement once and says how often it was prepared again.
        let reprepared = |sql: &str, params: &[&dyn rusqlite::ToSql]| {
            let mut s = conn.prepare_cached(sql).unwrap();
            s.query_map(params, |_| Ok(())).unwrap().for_each(drop);
            s.get_status(StatementStatus::RePrepare)
        };
        for constrained in [false, true] {
            let sql = ClaimSql::get(constrained);
            for n in 1..=4i64 {
                assert_eq!(
                    reprepared(&sql.probe, params![1i64, "q", n]),
                    0,
                    "probe, {n}"
                );
                let range = reprepared(&sql.range, params![1i64, "q", n, n, n]);
                assert_eq!(range, 0, "range, {n}");
                let expired = reprepared(&sql.expired, params![1i64, "q", n, n]);
                assert_eq!(expired, 0, "expired, {n}");
            }
        }
    }
}
