//! A worker's claim: one statement shared by the claims of a queue, the claim of a limited
//! tenant or queue, and a claim sent again.

use campanile_store::*;
use deadpool_postgres::{Client, GenericClient, Pool};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::claimed::claimed_row;
use crate::coalesce::Batch;
use crate::constrained::{claim_constrained, claim_constrained_locked, lock_constrained_schedules};
use crate::db::{R, dur_ms, execute, pg_err, pool_err, query, resolve_now};

/// Claims of one queue that share a statement ([`crate::coalesce`]): same tenant, queue and
/// instant.
pub(crate) struct ClaimBatch {
    pub(crate) pool: Pool,
}

/// Most occurrences one shared claim statement asks for.
pub(crate) const SHARED_CLAIM_ROWS: u64 = 4096;

impl Batch for ClaimBatch {
    type Key = (i64, String, Option<i64>);
    type Req = OccurrenceClaim;
    type Resp = WorkerClaim;
    /// Occurrences asked for so far.
    type Load = u64;
    const SKIP_ABANDONED: bool = true;

    fn admit(load: &mut u64, req: &OccurrenceClaim, first: bool) -> bool {
        let fits = first || *load + u64::from(req.max) <= SHARED_CLAIM_ROWS;
        if fits {
            *load += u64::from(req.max);
        }
        fits
    }

    fn weight(req: &OccurrenceClaim) -> usize {
        req.max as usize
    }

    async fn run(&self, reqs: Vec<OccurrenceClaim>) -> R<Vec<WorkerClaim>> {
        worker_claims(&self.pool.get().await.map_err(pool_err)?, &reqs).await
    }
}

/// The rest of a worker's claim after its share of the claim statement (`first`): the claim
/// of a tenant or queue with a concurrency limit, which the statement left to this, or the
/// overlap-constrained work it saw due, with the room left.
pub(crate) async fn claim_rest(
    pool: &Pool,
    p: OccurrenceClaim,
    first: WorkerClaim,
) -> R<Vec<Claimed>> {
    let WorkerClaim {
        now,
        unlimited,
        constrained_due,
        live,
        claimed: mut out,
    } = first;
    if !live {
        return Err(StoreError::NoLiveNode);
    }
    let lease = p.lease.map(dur_ms);
    if !unlimited {
        let mut c = pool.get().await.map_err(pool_err)?;
        return limited_claim(&mut c, &p, lease).await;
    }
    let room = (p.max as usize).saturating_sub(out.len());
    // Overlap-constrained work, when the claim statement saw some due: each is decided under
    // its schedule's lock, in a transaction of its own. (Work that became due since is found
    // by the next poll, as any work is.)
    let mut bytes = room_after(&p, &out);
    if room > 0 && constrained_due && !bytes.is_full() {
        let mut c = pool.get().await.map_err(pool_err)?;
        let tx = c.transaction().await.map_err(pg_err)?;
        let (got, skipped) = claim_constrained(&tx, &p, now, lease, room, &mut bytes).await?;
        tx.commit().await.map_err(pg_err)?;
        count_skipped(skipped);
        out.extend(got);
    }
    Ok(out)
}

/// What a worker claimed with a key in a queue and still holds: `$1` tenant, `$2` queue, `$3`
/// the caller's instant or NULL, `$4` the worker, `$5` the key, `$6` at most this many (the
/// claim's `max`). The queue's unexpired leases are a range of `occurrences_running_queue`.
pub(crate) const CLAIMED_WITH_KEY: &str = include_str!("sql/claimed_with_key.sql");

/// What this worker claimed with `key` in the claim's queue and still holds (`RUNNING`, lease
/// unexpired), as that claim answered it: a claim sent again after its answer was lost
/// ([`ClaimKey::resent`]). Only a claim sent again pays for this read.
pub(crate) async fn claimed_with_key<C: GenericClient>(
    c: &C,
    p: &OccurrenceClaim,
    key: Uuid,
) -> R<Vec<Claimed>> {
    let fixed = p.now.map(|t| t.as_millisecond());
    let rows = query(
        c,
        CLAIMED_WITH_KEY,
        &[
            &p.tenant.0,
            &p.queue,
            &fixed,
            &p.worker_id,
            &key,
            &i64::from(p.max),
        ],
    )
    .await?;
    rows.iter()
        .map(|r| {
            let claimed_at: i64 = r.try_get(9).map_err(pg_err)?;
            Ok(Claimed {
                replayed: true,
                ..claimed_row(r, claimed_at, 8)?
            })
        })
        .collect()
}

pub(crate) fn count_skipped(skipped: u64) {
    metrics::counter!("campanile_occurrences_skipped_overlap_total").increment(skipped);
}

/// The concurrency limits of the tenant and of the queue, if any.
pub(crate) async fn limits(c: &Client, p: &OccurrenceClaim) -> R<(Option<i64>, Option<i64>)> {
    let limits = query(
        c,
        "SELECT (SELECT max_running FROM tenants WHERE id = $1), (SELECT max_running FROM queue_limits WHERE tenant_id = $1 AND queue = $2)",
        &[&p.tenant.0, &p.queue],
    )
    .await?;
    Ok(limits
        .first()
        .map_or((None, None), |r| (r.get(0), r.get(1))))
}

/// The claim of a tenant or queue with a concurrency limit: count and claim under one lock per
/// limit, so the limit holds across nodes.
pub(crate) async fn limited_claim(
    c: &mut Client,
    p: &OccurrenceClaim,
    lease: Option<i64>,
) -> R<Vec<Claimed>> {
    let (tenant_limit, queue_limit) = limits(c, p).await?;
    let tx = c.transaction().await.map_err(pg_err)?;
    let mut allowed = i64::from(p.max);
    if let Some(limit) = tenant_limit {
        execute(
            &tx,
            "SELECT pg_advisory_xact_lock(hashtextextended('campanile/tenant/' || $1::text, 0))",
            &[&p.tenant.0.to_string()],
        )
        .await?;
        let running: i64 = query(
            &tx,
            "SELECT count(*) FROM occurrences WHERE tenant_id = $1 AND state = 'RUNNING'",
            &[&p.tenant.0],
        )
        .await?
        .first()
        .map_or(0, |r| r.get(0));
        allowed = allowed.min(limit - running);
    }
    if let Some(limit) = queue_limit {
        let key = format!("{}/{}", p.tenant.0, p.queue);
        execute(
            &tx,
            "SELECT pg_advisory_xact_lock(hashtextextended('campanile/queue/' || $1, 0))",
            &[&key],
        )
        .await?;
        let running: i64 = query(&tx, "SELECT count(*) FROM occurrences WHERE tenant_id = $1 AND queue = $2 AND state = 'RUNNING'", &[&p.tenant.0, &p.queue])
            .await?
            .first()
            .map_or(0, |r| r.get(0));
        allowed = allowed.min(limit - running);
    }
    // Read after the locks above, which may have been waited for: the claim is dated (and
    // its lease runs) from then, not from the claim statement's instant.
    let now = resolve_now(&tx, p.now).await?;
    let allowed_n = usize::try_from(allowed).unwrap_or(0);
    // The schedules of constrained candidates are locked before the fast claim locks any
    // occurrence: the order a schedule change takes (schedule, then its occurrences).
    let schedules = if allowed_n > 0 {
        lock_constrained_schedules(&tx, p, now, allowed_n).await?
    } else {
        Vec::new()
    };
    let mut got = if allowed > 0 {
        fast_claim(&tx, p, now, lease, allowed as u32).await?
    } else {
        Vec::new()
    };
    // Overlap-constrained occurrences count against the same limits, under the same locks.
    let room = allowed_n.saturating_sub(got.len());
    let mut bytes = room_after(p, &got);
    let (more, skipped) =
        claim_constrained_locked(&tx, p, lease, room, &schedules, &mut bytes).await?;
    got.extend(more);
    tx.commit().await.map_err(pg_err)?;
    count_skipped(skipped);
    Ok(got)
}

/// The worker claim in one statement, for one or several claimers of a queue
/// ([`crate::coalesce`]): `clk` reads the database's clock (or takes `$3`, a caller's instant)
/// and whether the tenant and the queue are free of concurrency limits; only then are
/// occurrences picked and claimed, and dealt in claim order to the claimers in turn — each its
/// own count, as owner with its own lease. One row always comes back: the claimed occurrences
/// (columns 0–7, all NULL when none) with the instant (8), the no-limit flag (9), whether
/// overlap-constrained work of the queue is due (10: pending, by the index
/// `occurrences_pending_constrained`, or under an expired lease), the claimer (11, from 1), the
/// lease end (12) and whether work is handed out at all (13: some node's liveness mark is
/// valid, [`fence::hands_out_work`]; else nothing is picked).
/// `$1` tenant, `$2` queue, `$3` now or NULL, `$4` the claimers' total count, `$5` their
/// owners, `$6` their leases in ms, `$7` for each slot of the total, in claim order, its
/// claimer's number (slot `rn` is the `rn`-th occurrence picked), `$8` their claim keys, `$9`
/// their answers' size bounds in bytes ([`OccurrenceClaim::max_bytes`]). Subscripts keep the dealing
/// linear: a join of rows to claimers by ranges would be a nested loop, and a per-slot `text[]`
/// would be walked from its start at every subscript (variable-width elements); `int8[]`
/// subscripts are direct.
pub(crate) const WORKER_CLAIM: &str = include_str!("sql/worker_claim.sql");

/// The worker claim: at most `$4` due or lease-expired occurrences of one queue, picked and
/// claimed in one statement. `$1` tenant, `$2` queue, `$3` now, `$4` max, `$5` owner, `$6`
/// lease length in ms (NULL: each occurrence's own), `$7` the caller's instant or NULL, for the
/// liveness gate (sql/README.md), `$8` the claim's key or NULL, `$9` the answer's size
/// bound in bytes ([`OccurrenceClaim::max_bytes`]).
pub(crate) const FAST_CLAIM: &str = include_str!("sql/fast_claim.sql");

/// What [`WORKER_CLAIM`] answers one claimer.
pub(crate) struct WorkerClaim {
    /// The instant used.
    now: i64,
    /// Neither the tenant nor the queue has a concurrency limit (else nothing was claimed).
    unlimited: bool,
    /// Overlap-constrained work of the queue was due.
    constrained_due: bool,
    /// Some node's liveness mark was valid (else nothing was claimed).
    live: bool,
    claimed: Vec<Claimed>,
}

/// Runs [`WORKER_CLAIM`] for claimers of one queue (one tenant, queue and instant; at least
/// one): one answer each, in order.
pub(crate) async fn worker_claims<C: GenericClient>(
    c: &C,
    reqs: &[OccurrenceClaim],
) -> R<Vec<WorkerClaim>> {
    let rows = worker_claim_rows(c, reqs).await?;
    dealt_claims(reqs, &rows)
}

/// The rows of the claim statement for `reqs` (none for no request).
pub(crate) async fn worker_claim_rows<C: GenericClient>(
    c: &C,
    reqs: &[OccurrenceClaim],
) -> R<Vec<Row>> {
    let Some(p) = reqs.first() else {
        return Ok(Vec::new());
    };
    let total: i64 = reqs.iter().map(|r| i64::from(r.max)).sum();
    let owners: Vec<&str> = reqs.iter().map(|r| r.worker_id.as_str()).collect();
    let leases: Vec<Option<i64>> = reqs.iter().map(|r| r.lease.map(dur_ms)).collect();
    let keys: Vec<Option<Uuid>> = reqs.iter().map(|r| r.key.map(|k| k.id)).collect();
    let budgets: Vec<i64> = reqs.iter().map(answer_bound).collect();
    let ords: Vec<i64> = (1i64..)
        .zip(reqs)
        .flat_map(|(ord, r)| std::iter::repeat_n(ord, r.max as usize))
        .collect();
    let now_override = p.now.map(|t| t.as_millisecond());
    query(
        c,
        WORKER_CLAIM,
        &[
            &p.tenant.0,
            &p.queue,
            &now_override,
            &total,
            &owners,
            &leases,
            &ords,
            &keys,
            &budgets,
        ],
    )
    .await
}

/// Each request's share of the claim statement's `rows`, in request order.
pub(crate) fn dealt_claims(reqs: &[OccurrenceClaim], rows: &[Row]) -> R<Vec<WorkerClaim>> {
    if reqs.is_empty() {
        return Ok(Vec::new());
    }
    let first = rows
        .first()
        .ok_or_else(|| StoreError::Database("the claim returned no row".into()))?;
    let now: i64 = first.try_get(8).map_err(pg_err)?;
    let unlimited: bool = first.try_get(9).map_err(pg_err)?;
    let constrained_due: bool = first.try_get(10).map_err(pg_err)?;
    let live: bool = first.try_get(13).map_err(pg_err)?;
    let mut out: Vec<WorkerClaim> = reqs
        .iter()
        .map(|_| WorkerClaim {
            now,
            unlimited,
            constrained_due,
            live,
            claimed: Vec::new(),
        })
        .collect();
    for r in rows {
        if r.try_get::<_, Option<Uuid>>(0).map_err(pg_err)?.is_none() {
            continue;
        }
        let ord: i64 = r.try_get(11).map_err(pg_err)?;
        let i = usize::try_from(ord - 1)
            .ok()
            .filter(|i| *i < reqs.len())
            .ok_or_else(|| StoreError::Database(format!("the claim dealt to claimer {ord}")))?;
        out[i].claimed.push(claimed_row(r, now, 12)?);
    }
    Ok(out)
}

/// A claim's size bound as a statement parameter.
pub(crate) fn answer_bound(p: &OccurrenceClaim) -> i64 {
    i64::try_from(p.answer_bytes_or_default()).unwrap_or(i64::MAX)
}

/// What is left of a claim's size bound once `claimed` is in its answer.
pub(crate) fn room_after(p: &OccurrenceClaim, claimed: &[Claimed]) -> ClaimRoom {
    let mut room = ClaimRoom::new(p.answer_bytes_or_default());
    for c in claimed {
        room.take(c.answer_bytes());
    }
    room
}

/// The one-statement claim of up to `max` unconstrained occurrences.
pub(crate) async fn fast_claim<C: GenericClient>(
    c: &C,
    p: &OccurrenceClaim,
    now: i64,
    lease: Option<i64>,
    max: u32,
) -> R<Vec<Claimed>> {
    let max = i64::from(max);
    let budget = answer_bound(p);
    let fixed = p.now.map(|t| t.as_millisecond());
    let rows = query(
        c,
        FAST_CLAIM,
        &[
            &p.tenant.0,
            &p.queue,
            &now,
            &max,
            &p.worker_id,
            &lease,
            &fixed,
            &p.key.map(|k| k.id),
            &budget,
        ],
    )
    .await?;
    rows.iter().map(|r| claimed_row(r, now, 8)).collect()
}
