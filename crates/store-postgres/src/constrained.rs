//! Claims of overlap-constrained occurrences, decided one by one under their schedules' locks.

use campanile_store::fence::{self};
use campanile_store::*;
use deadpool_postgres::GenericClient;
use uuid::Uuid;

use crate::claimed::claim_ids;
use crate::db::{R, execute, query, resolve_now};

/// The schedules of a claim's overlap-constrained candidates, read without locking (`$4` how
/// many candidates), so that their rows can be locked first, in id order.
pub(crate) const CONSTRAINED_SCHEDULES: &str = include_str!("sql/constrained_schedules.sql");

/// The candidates themselves, locked, of the schedules locked (`$6`), with their payloads'
/// sizes in bytes.
pub(crate) const CONSTRAINED_CANDIDATES: &str = include_str!("sql/constrained_candidates.sql");

/// For one candidate (`$1` its schedule, `$2` its seq, `$3` its priority, `$4` its
/// availability — when it came due, `$5` now), with its schedule's row locked, the facts of
/// [`fence::OverlapFacts`], in its order:
/// - had another occurrence of the schedule been claimed by `$4` and was it still running
///   then (`RUNNING` now under a lease that had not ended by `$4`, or its last run, from
///   `claimed_at` to `ran_until`, spans `$4`);
/// - had one ahead of it (higher priority, or come due before `$4` — a pending one by its
///   `available_at`, one claimed since by `due_at`, the instant it first came due — ties by
///   seq) not been claimed by `$4` (pending now, or claimed after `$4`: running now, or its
///   last run ended after `$4`). A retry comes due anew at its retry instant, and is judged
///   against what waited then;
/// - does another run now; is one ahead of it in claim order due and waiting now in the
///   claim's queue (`$6`: one left in a queue no worker reads any more must not keep the
///   schedule's later occurrences waiting for good).
///
/// Read from the database, so that a decision sees what earlier claims (and this one)
/// decided, not only this claim's own list. Each `EXISTS` is a seek in a partial index of the
/// schedule's constrained occurrences — running, pending in claim order, or by `ran_until`
/// (the short range of runs that ended since the candidate came due).
pub(crate) const OVERLAP_STATE: &str = "SELECT
    EXISTS (SELECT 1 FROM occurrences WHERE schedule_id = $1 AND state = 'RUNNING' AND overlap <> 0
               AND seq <> $2 AND claimed_at <= $4 AND lease_until > $4)
    OR EXISTS (SELECT 1 FROM occurrences
                WHERE schedule_id = $1 AND overlap <> 0 AND ran_until IS NOT NULL
                  AND ran_until > $4 AND claimed_at <= $4 AND seq <> $2),
    EXISTS (SELECT 1 FROM occurrences
             WHERE schedule_id = $1 AND state IN ('READY', 'RETRY_WAIT') AND overlap <> 0
               AND available_at <= $4 AND seq <> $2
               AND (priority > $3 OR (priority = $3 AND (available_at, seq) < ($4, $2))))
    OR EXISTS (SELECT 1 FROM occurrences WHERE schedule_id = $1 AND state = 'RUNNING' AND overlap <> 0
                  AND claimed_at > $4 AND COALESCE(due_at, available_at) <= $4 AND seq <> $2 AND (priority > $3 OR (priority = $3 AND (COALESCE(due_at, available_at), seq) < ($4, $2))))
    OR EXISTS (SELECT 1 FROM occurrences
                WHERE schedule_id = $1 AND overlap <> 0 AND ran_until IS NOT NULL
                  AND ran_until > $4 AND claimed_at > $4 AND COALESCE(due_at, available_at) <= $4
                  AND seq <> $2 AND (priority > $3 OR (priority = $3 AND (COALESCE(due_at, available_at), seq) < ($4, $2)))),
    EXISTS (SELECT 1 FROM occurrences WHERE schedule_id = $1 AND state = 'RUNNING' AND overlap <> 0 AND seq <> $2),
    EXISTS (SELECT 1 FROM occurrences
             WHERE schedule_id = $1 AND state IN ('READY', 'RETRY_WAIT') AND overlap <> 0
               AND available_at <= $5 AND seq <> $2 AND queue = $6
               AND (priority > $3 OR (priority = $3 AND (available_at, seq) < ($4, $2))))";

/// Claims of overlap-constrained occurrences, atomic with the state of each schedule's other
/// occurrences across nodes: the candidates' schedule rows are locked first, in id order, and
/// only then their occurrence rows (skipping those another claim holds) — the order a schedule
/// change takes its locks in (schedule, then occurrences), and one order among claimers, so
/// neither a change nor another claim can deadlock with it. Candidates of a schedule that
/// appeared between the two reads wait for the next claim. Runs in the caller's transaction;
/// returns the claims and how many were skipped.
pub(crate) async fn claim_constrained<C: GenericClient>(
    tx: &C,
    p: &OccurrenceClaim,
    now: i64,
    lease: Option<i64>,
    room: usize,
    bytes: &mut ClaimRoom,
) -> R<(Vec<Claimed>, u64)> {
    let schedules = lock_constrained_schedules(tx, p, now, room).await?;
    claim_constrained_locked(tx, p, lease, room, &schedules, bytes).await
}

/// How many constrained candidates a claim with `room` left looks at.
pub(crate) fn constrained_window(room: usize) -> i64 {
    (room + 64) as i64
}

/// Locks, in id order, the schedule rows of a claim's constrained candidates (those a claim
/// with `room` left would look at); returns their ids. Taken before any occurrence row is
/// locked in the transaction.
pub(crate) async fn lock_constrained_schedules<C: GenericClient>(
    tx: &C,
    p: &OccurrenceClaim,
    now: i64,
    room: usize,
) -> R<Vec<Uuid>> {
    let limit = constrained_window(room);
    let fixed = p.now.map(|t| t.as_millisecond());
    let mut schedules: Vec<Uuid> = query(
        tx,
        CONSTRAINED_SCHEDULES,
        &[&p.tenant.0, &p.queue, &now, &limit, &fixed],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    schedules.sort_unstable();
    schedules.dedup();
    if !schedules.is_empty() {
        execute(
            tx,
            "SELECT 1 FROM schedules WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE",
            &[&schedules],
        )
        .await?;
    }
    Ok(schedules)
}

/// The constrained claims of [`claim_constrained`], once [`lock_constrained_schedules`] has
/// locked `schedules`: only their candidates are looked at.
pub(crate) async fn claim_constrained_locked<C: GenericClient>(
    tx: &C,
    p: &OccurrenceClaim,
    lease: Option<i64>,
    room: usize,
    schedules: &[Uuid],
    bytes: &mut ClaimRoom,
) -> R<(Vec<Claimed>, u64)> {
    if schedules.is_empty() || room == 0 {
        return Ok((Vec::new(), 0));
    }
    let limit = constrained_window(room);
    let fixed = p.now.map(|t| t.as_millisecond());
    // The locks may have been waited for: the rest is dated from now (as the claims are).
    let now = resolve_now(tx, p.now).await?;
    let candidates = query(
        tx,
        CONSTRAINED_CANDIDATES,
        &[&p.tenant.0, &p.queue, &now, &limit, &fixed, &schedules],
    )
    .await?;
    let mut out = Vec::new();
    let mut skipped = 0u64;
    for cand in &candidates {
        if out.len() >= room {
            break;
        }
        let (seq, schedule, overlap, state, available_at, priority): (
            i64,
            Uuid,
            i32,
            String,
            i64,
            i32,
        ) = (
            cand.get(0),
            cand.get(1),
            cand.get(2),
            cand.get(3),
            cand.get(4),
            cand.get(5),
        );
        let id: Uuid = cand.get(7);
        let decision = if state == "RUNNING" {
            fence::OverlapDecision::Claim
        } else {
            let row = query(
                tx,
                OVERLAP_STATE,
                &[&schedule, &seq, &priority, &available_at, &now, &p.queue],
            )
            .await?;
            let facts =
                row.first()
                    .map_or(fence::OverlapFacts::default(), |r| fence::OverlapFacts {
                        ran_at_due: r.get(0),
                        waited_at_due: r.get(1),
                        running: r.get(2),
                        earlier_waiting: r.get(3),
                    });
            fence::overlap_decision(campanile_core::Overlap::from_code(overlap), facts)
        };
        match decision {
            fence::OverlapDecision::Claim => {
                let len: Option<i32> = cand.get(6);
                let size = payload_answer_bytes(len.map_or(0, |l| l.max(0) as usize));
                if !bytes.take(size) {
                    break;
                }
                out.extend(
                    claim_ids(tx, &[id], &p.worker_id, p.key.map(|k| k.id), now, lease).await?,
                );
            }
            fence::OverlapDecision::Wait => {}
            fence::OverlapDecision::Skip => {
                execute(tx, "UPDATE occurrences SET state = 'SKIPPED_OVERLAP', finished_at = $2 WHERE id = $1", &[&id, &now]).await?;
                skipped += 1;
            }
        }
    }
    Ok((out, skipped))
}
