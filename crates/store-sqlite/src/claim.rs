//! A worker's claim on the single writer: due and lease-expired candidates by priority, the
//! claim's write, overlap-constrained claims, a claim sent again, and payloads filled in on a
//! reader.

use std::collections::HashMap;

use campanile_core::{OccurrenceId, Overlap, ScheduleId};
use campanile_store::fence::{self};
use campanile_store::*;
use rusqlite::{Connection, OptionalExtension, Row, params};
use uuid::Uuid;

use crate::attempt::RECORD_LOST;
use crate::db::{R, db_err, dur_ms, ts};
use crate::fenced::hands_out_work;
use crate::finish::RowNumbers;

/// `(seq, id, schedule_id, version, scheduled_for, available_at, epoch, attempts, lease_ms)`
/// (`lease_ms`: the occurrence's own lease length, granted when the claim names none).
pub(crate) type ClaimRow = (i64, Uuid, Uuid, u32, i64, i64, i64, u32, i64);

pub(crate) fn occurrence_claim(
    c: &Connection,
    p: &OccurrenceClaim,
    now: i64,
    numbers: &mut RowNumbers,
) -> R<Vec<Claimed>> {
    if !hands_out_work(c, now)? {
        return Err(StoreError::NoLiveNode);
    }
    let allowed = crate::tenant::claim_allowance(c, p.tenant, &p.queue, p.max)?;
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
    let fit = room.take(c, picked.iter().map(|c| (c.row.0, c.row.2, c.row.3)))?;
    picked.truncate(fit);
    let reclaims = picked.iter().any(|c| c.running);
    let picked = picked.into_iter().map(Candidate::claim_row).collect();
    let key = p.key.map(|k| k.id);
    let mut rows = claim_rows(c, &p.worker_id, key, now, lease, picked, reclaims)?;
    let left = max - rows.len().min(max);
    if left > 0 && !room.room.is_full() {
        rows.extend(claim_constrained(c, p, now, lease, left, &mut room)?);
    }
    numbers.note(rows.iter().map(|r| (r.1, r.0)));
    finish_claim(rows, now, lease)
}

/// What is left of a claim's size bound ([`OccurrenceClaim::max_bytes`]) as the writer picks
/// occurrences. Payload sizes are looked up only when the largest payload any version or
/// triggered run holds (`payload_bound`, kept by triggers) could pass what is left: a claim of
/// small payloads costs the writer one read of one row.
pub(crate) struct AnswerRoom {
    room: ClaimRoom,
    /// What the largest payload counts ([`payload_answer_bytes`]).
    largest: u64,
    /// Whether some occurrences hold their own payload (a run triggered with one): sizes are
    /// then looked up per occurrence, not per version.
    overrides: bool,
    sizes: HashMap<(Uuid, u32), u64>,
}

impl AnswerRoom {
    fn new(c: &Connection, max_bytes: u64) -> R<AnswerRoom> {
        let (largest, overrides): (i64, i64) = c
            .prepare_cached("SELECT max_bytes, overrides FROM payload_bound WHERE id = 1")
            .and_then(|mut s| s.query_row([], |r| Ok((r.get(0)?, r.get(1)?))))
            .map_err(db_err)?;
        Ok(AnswerRoom {
            room: ClaimRoom::new(max_bytes),
            largest: payload_answer_bytes(usize::try_from(largest).unwrap_or(0)),
            overrides: overrides > 0,
            sizes: HashMap::new(),
        })
    }

    /// How many of these occurrences (`(seq, schedule, version)`), in claim order, fit in
    /// what is left; counts them.
    fn take(
        &mut self,
        c: &Connection,
        versions: impl ExactSizeIterator<Item = (i64, Uuid, u32)>,
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
        let mut own = c
            .prepare_cached("SELECT length(CAST(payload AS BLOB)) FROM occurrences WHERE seq = ?1")
            .map_err(db_err)?;
        let mut taken = 0;
        for (seq, schedule, version) in versions {
            let key = (schedule, version);
            let own_len: Option<i64> = if self.overrides {
                own.query_row(params![seq], |r| r.get(0))
                    .optional()
                    .map_err(db_err)?
                    .flatten()
            } else {
                None
            };
            let size = match (own_len, self.sizes.get(&key)) {
                (Some(len), _) => payload_answer_bytes(usize::try_from(len).unwrap_or(0)),
                (None, Some(size)) => *size,
                (None, None) => {
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
pub(crate) struct Candidate {
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

pub(crate) fn candidate(r: &Row<'_>) -> rusqlite::Result<Candidate> {
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
/// overlap-constrained): they are on the hottest path, each a cached statement.
pub(crate) struct ClaimSql {
    /// The next pending priority below `?3`.
    pub(crate) probe: &'static str,
    /// The due range of priority `?3` at `?4`, up to `?5`.
    pub(crate) range: &'static str,
    /// Expired leases with attempts left at `?3`, up to `?4`.
    pub(crate) expired: &'static str,
}

impl ClaimSql {
    /// The queries for unconstrained (`false`) or overlap-constrained (`true`) occurrences.
    pub(crate) fn get(constrained: bool) -> &'static ClaimSql {
        const SQL: [ClaimSql; 2] = [
            ClaimSql {
                probe: include_str!("sql/pending_priority_below.sql"),
                range: include_str!("sql/pending_due_range.sql"),
                expired: include_str!("sql/expired_leases.sql"),
            },
            ClaimSql {
                probe: include_str!("sql/constrained_pending_priority_below.sql"),
                range: include_str!("sql/constrained_pending_due_range.sql"),
                expired: include_str!("sql/constrained_expired_leases.sql"),
            },
        ];
        &SQL[usize::from(constrained)]
    }
}

/// Keeps the `max` best candidates: highest priority first, then earliest claimable (an
/// expired lease from when it ended: the occurrences of its schedule that came due during the
/// lost attempt are decided before its takeover erases that attempt's `claimed_at`).
pub(crate) fn best_first(c: &mut Vec<Candidate>, max: usize) {
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
pub(crate) fn claim_rows(
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
        c.prepare_cached(RECORD_LOST)
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
pub(crate) fn pending_candidates(
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
            .prepare_cached(sql.probe)
            .and_then(|mut s| {
                s.query_row(params![p.tenant.0, p.queue, below], |r| r.get(0))
                    .optional()
            })
            .map_err(db_err)?;
        let Some(priority) = priority else { break };
        let want = (limit - out.len()) as i64;
        let rows = c
            .prepare_cached(sql.range)
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
pub(crate) fn expired_candidates(
    c: &Connection,
    p: &OccurrenceClaim,
    now: i64,
    constrained: bool,
    limit: usize,
) -> R<Vec<Candidate>> {
    c.prepare_cached(ClaimSql::get(constrained).expired)
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
pub(crate) fn claim_constrained(
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
                if bytes.take(c, std::iter::once((cand.row.0, schedule, cand.row.3)))? == 0 {
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
pub(crate) fn finish_claim(rows: Vec<ClaimRow>, now: i64, lease: Option<i64>) -> R<Vec<Claimed>> {
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

pub(crate) fn fill_payloads_in(c: &Connection, claims: &mut [Claimed]) -> R<()> {
    let mut q = c
        .prepare_cached(
            "SELECT payload FROM schedule_versions WHERE schedule_id = ?1 AND version = ?2",
        )
        .map_err(db_err)?;
    // Runs triggered with their own payload: looked up one by one, only while there are some.
    let overrides: i64 = c
        .prepare_cached("SELECT overrides FROM payload_bound WHERE id = 1")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(db_err)?;
    let mut own = c
        .prepare_cached("SELECT payload FROM occurrences WHERE id = ?1")
        .map_err(db_err)?;
    let mut seen: HashMap<(Uuid, u32), Option<String>> = HashMap::new();
    for claim in claims {
        if overrides > 0 {
            let payload: Option<String> = own
                .query_row(params![claim.id.0], |r| r.get(0))
                .optional()
                .map_err(db_err)?
                .flatten();
            if payload.is_some() {
                claim.payload = payload;
                continue;
            }
        }
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use rusqlite::StatementStatus;

    use super::*;

    /// The claim's statements are planned once per connection: a new `LIMIT` or priority bound
    /// to a cached statement does not send it through the parser and planner again (without
    /// the query planner stability guarantee, every claim did — [`crate::connection::stable_plans`]).
    #[test]
    fn cached_claim_statements_are_not_planned_again_for_new_bindings() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("plans.db")).unwrap();
        crate::connection::configure(&conn).unwrap();
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
                    reprepared(sql.probe, params![1i64, "q", n]),
                    0,
                    "probe, {n}"
                );
                let range = reprepared(sql.range, params![1i64, "q", n, n, n]);
                assert_eq!(range, 0, "range, {n}");
                let expired = reprepared(sql.expired, params![1i64, "q", n, n]);
                assert_eq!(expired, 0, "expired, {n}");
            }
        }
    }
}
