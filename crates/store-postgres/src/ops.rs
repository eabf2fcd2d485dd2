//! The SQL of every store operation on PostgreSQL.

use std::collections::HashMap;

use campanile_core::{OccurrenceId, OccurrenceState, ScheduleId, occurrence_id};
use campanile_store::fence::{self, FenceView, reported};
use campanile_store::upgrade::CLOSE_RUNNING_ATTEMPT_ROW;
use campanile_store::*;
use deadpool_postgres::{Client, GenericClient, Pool};
use jiff::{SignedDuration, Timestamp};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::coalesce::Batch;
use crate::{pg_err, pool_err, resolve_now};

pub(crate) type R<T> = Result<T, StoreError>;

pub(crate) fn ts(ms: i64) -> R<Timestamp> {
    Timestamp::from_millisecond(ms)
        .map_err(|e| StoreError::Database(format!("bad instant {ms}: {e}")))
}

fn opt_ts(ms: Option<i64>) -> R<Option<Timestamp>> {
    ms.map(ts).transpose()
}

pub(crate) fn dur_ms(d: SignedDuration) -> i64 {
    d.as_millis()
        .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

pub(crate) fn i32_of(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

pub(crate) fn u32_of(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

fn stored_state(s: &str) -> R<OccurrenceState> {
    s.parse().map_err(|e| StoreError::Database(format!("{e}")))
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

pub(crate) async fn query<C: GenericClient>(
    c: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> R<Vec<Row>> {
    let stmt = c.prepare_cached(sql).await.map_err(pg_err)?;
    c.query(&stmt, params).await.map_err(pg_err)
}

pub(crate) async fn execute<C: GenericClient>(
    c: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> R<u64> {
    let stmt = c.prepare_cached(sql).await.map_err(pg_err)?;
    c.execute(&stmt, params).await.map_err(pg_err)
}

pub(crate) async fn tenant_create(c: &Client, p: TenantCreate) -> R<Tenant> {
    let now = resolve_now(c, p.now).await?;
    let rows = query(
        c,
        "INSERT INTO tenants (name, created_at) VALUES ($1, $2) RETURNING id",
        &[&p.name, &now],
    )
    .await
    .map_err(|e| match e {
        StoreError::AlreadyExists(_) => StoreError::AlreadyExists(format!("tenant '{}'", p.name)),
        other => other,
    })?;
    let id: i64 = rows
        .first()
        .ok_or_else(|| StoreError::Database("no id returned".into()))?
        .get(0);
    Ok(Tenant {
        id: TenantId(id),
        name: p.name,
        created_at: ts(now)?,
        class: classes::DEFAULT_CLASS.into(),
    })
}

pub(crate) async fn schedule_create(c: &mut Client, p: ScheduleCreate) -> R<()> {
    let tx = c.transaction().await.map_err(pg_err)?;
    let now = resolve_now(&tx, p.now).await?;
    crate::admin::check_schedule_quota(&tx, p.tenant, 1, i64::from(p.fires_per_hour), None).await?;
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
        crate::schedules::queue_insert(&tx, p.shard, p.id, 1, p.tenant, next.as_millisecond())
            .await?;
    }
    tx.commit().await.map_err(pg_err)
}

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

/// Claims of one queue that share a statement ([`crate::coalesce`]): same tenant, queue and
/// instant.
pub(crate) struct ClaimBatch {
    pub(crate) pool: Pool,
}

/// Most occurrences one shared claim statement asks for.
const SHARED_CLAIM_ROWS: u64 = 4096;

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
static CLAIMED_WITH_KEY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT o.id, o.schedule_id, o.version, o.scheduled_for, o.available_at, o.epoch, o.attempts,
                v.payload, o.lease_until, o.claimed_at
           FROM occurrences o
           LEFT JOIN schedule_versions v ON v.schedule_id = o.schedule_id AND v.version = o.version
          WHERE o.tenant_id = $1 AND o.queue = $2 AND o.state = 'RUNNING'
            AND o.lease_until > {now} AND o.owner = $4 AND o.claim_key = $5
          ORDER BY o.available_at, o.seq LIMIT $6",
        now = statement_now("$3")
    )
});

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
        &CLAIMED_WITH_KEY,
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

fn count_skipped(skipped: u64) {
    metrics::counter!("campanile_occurrences_skipped_overlap_total").increment(skipped);
}

/// The concurrency limits of the tenant and of the queue, if any.
async fn limits(c: &Client, p: &OccurrenceClaim) -> R<(Option<i64>, Option<i64>)> {
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
async fn limited_claim(c: &mut Client, p: &OccurrenceClaim, lease: Option<i64>) -> R<Vec<Claimed>> {
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

/// A statement's instant: the caller's (`param`, an `int8` parameter) or else the database's
/// clock as the statement runs. The liveness gate ([`fence::hands_out_work_sql`]) compares the
/// marks with this, not with an instant the claim read before it waited for a connection, a
/// lock or a stalled database, which could let it commit in an outage not yet judged.
fn statement_now(param: &str) -> String {
    format!("COALESCE({param}::int8, (extract(epoch FROM clock_timestamp()) * 1000)::int8)")
}

/// A claim statement: `pick` defines the CTE `pick(seq, lost_epoch, lost_owner, lost_started,
/// lost_lease, payload)` of the occurrences to claim (locked by it or by the caller) with their
/// versions' payloads, after any CTEs it needs; the `lost_` columns are those of the attempt being taken over, read from the row as
/// locked, when it is still `RUNNING` under an expired lease (else NULL). The rest records
/// those lost attempts and claims the occurrences — new epoch, the claimer as owner, the lease
/// — into the CTE `claimed` (the claimed occurrences with their payloads); an occurrence
/// taken over gets its lost lease's end as its availability (when it became claimable again,
/// [`fence::FenceView::claimable_since`]). The new attempt is
/// not a row of its own: the occurrence row holds it ([`OccurrenceDetail::assemble`]).
/// `owner`, `key`, `now` and `lease_until` are the statement's expressions for those values
/// (over `pick`'s columns, if they like; `key` is the claim's [`ClaimKey`] id or NULL); `tag`,
/// an `int8` expression over `pick`, is carried to `claimed` as its column `tag` (so the final `SELECT` never joins `pick` again: CTEs are
/// estimated at one row, so such a join is a nested loop, quadratic in the batch); `select` is
/// the statement's final `SELECT`. Every PostgreSQL claim goes through this one text.
fn claim_sql(
    pick: &str,
    owner: &str,
    key: &str,
    now: &str,
    lease_until: &str,
    tag: &str,
    select: &str,
) -> String {
    format!(
        "WITH {pick},
         lost AS (
             INSERT INTO attempts (occurrence_seq, epoch, owner, started_at, lease_until, finished_at, outcome)
             SELECT seq, lost_epoch, lost_owner, lost_started, lost_lease, {now}, 'lease_expired'
               FROM pick WHERE lost_epoch IS NOT NULL
             {CLOSE_RUNNING_ATTEMPT_ROW}),
         upd AS (
             UPDATE occurrences o
                SET state = 'RUNNING', owner = {owner}, epoch = o.epoch + 1, attempts = o.attempts + 1,
                    lease_until = {lease_until}, claimed_at = {now}, cancel_requested = false,
                    ran_until = NULL, claim_key = {key},
                    available_at = CASE WHEN pick.lost_epoch IS NOT NULL
                                        THEN GREATEST(o.available_at, pick.lost_lease)
                                        ELSE o.available_at END
               FROM pick WHERE o.seq = pick.seq
             RETURNING o.seq, o.id, o.schedule_id, o.version, o.scheduled_for, o.available_at, o.epoch, o.attempts,
                       o.lease_until, {tag} AS tag, pick.payload),
         claimed AS (
             SELECT id, schedule_id, version, scheduled_for, available_at, epoch, attempts, payload, seq, tag,
                    lease_until
               FROM upd)
         {select}"
    )
}

/// The final `SELECT` of a claim that returns only the claimed occurrences.
const CLAIMED_ROWS: &str =
    "SELECT id, schedule_id, version, scheduled_for, available_at, epoch, attempts, payload, lease_until
           FROM claimed ORDER BY available_at, seq";

/// The CTEs that pick a worker's occurrences: due or lease-expired occurrences of one queue
/// without an overlap constraint, at most `$4`, skipping rows another claimer holds, into the
/// CTE `name(seq, lost_epoch, lost_owner, lost_started, lost_lease, rn, ord, payload)`: `rn`
/// numbers them in claim order from 1, `ord` is the claimer each goes to (`ord`, an
/// expression over `rn`), `payload` its version's. Each claimer's answer is a prefix of its
/// share in claim order whose payloads and [`CLAIM_RECORD_BYTES`] each add up to at most
/// `budget` (an expression over `ord`), and holds at least one. `$1` tenant, `$2` queue; `now`
/// is the statement's current instant; `gate` a condition every candidate must meet (`true`
/// for none).
fn worker_pick(now: &str, gate: &str, name: &str, ord: &str, budget: &str) -> String {
    format!(
        "ready AS (
             SELECT seq, schedule_id, version, priority, available_at, NULL::int8 AS lost_epoch,
                    NULL::text AS lost_owner, NULL::int8 AS lost_started, NULL::int8 AS lost_lease
               FROM occurrences
              WHERE tenant_id = $1 AND queue = $2 AND state IN ('READY', 'RETRY_WAIT') AND available_at <= {now}
                AND overlap = 0 AND {gate}
              ORDER BY priority DESC, available_at LIMIT $4
              FOR UPDATE SKIP LOCKED),
         expired AS (
             SELECT seq, schedule_id, version, priority, available_at, epoch, owner, claimed_at, lease_until
               FROM occurrences
              WHERE tenant_id = $1 AND queue = $2 AND state = 'RUNNING' AND lease_until <= {now}
                AND attempts < max_attempts AND NOT cancel_requested AND overlap = 0 AND {gate}
              ORDER BY lease_until LIMIT $4
              FOR UPDATE SKIP LOCKED),
         ranked AS (
             SELECT seq, schedule_id, version, lost_epoch, lost_owner, lost_started, lost_lease,
                    row_number() OVER (ORDER BY priority DESC, available_at, seq) AS rn
               FROM (SELECT * FROM ready UNION ALL SELECT * FROM expired) c
              ORDER BY priority DESC, available_at, seq LIMIT $4),
         sized AS (
             SELECT s.*, sum(bytes) OVER (PARTITION BY ord ORDER BY rn) AS upto
               FROM (SELECT k.seq, k.lost_epoch, k.lost_owner, k.lost_started, k.lost_lease, k.rn,
                            {ord} AS ord, v.payload,
                            COALESCE(octet_length(v.payload), 0) + {CLAIM_RECORD_BYTES} AS bytes
                       FROM ranked k
                       LEFT JOIN schedule_versions v ON v.schedule_id = k.schedule_id AND v.version = k.version) s),
         {name} AS (
             SELECT seq, lost_epoch, lost_owner, lost_started, lost_lease, rn, ord, payload
               FROM sized WHERE upto = bytes OR upto <= {budget})"
    )
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
static WORKER_CLAIM: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let pick = format!(
        "clk0 AS (SELECT {now} AS now),
         clk AS (
             SELECT now, {live} AS live,
                    NOT EXISTS (SELECT 1 FROM tenants WHERE id = $1 AND max_running IS NOT NULL)
                    AND NOT EXISTS (SELECT 1 FROM queue_limits WHERE tenant_id = $1 AND queue = $2
                                       AND max_running IS NOT NULL) AS unlimited
               FROM clk0),
         cst AS (
             SELECT (SELECT live FROM clk) AND (EXISTS (SELECT 1 FROM occurrences
                             WHERE tenant_id = $1 AND queue = $2 AND state IN ('READY', 'RETRY_WAIT')
                               AND overlap <> 0 AND available_at <= (SELECT now FROM clk))
                    OR EXISTS (SELECT 1 FROM occurrences
                                WHERE tenant_id = $1 AND queue = $2 AND state = 'RUNNING'
                                  AND lease_until <= (SELECT now FROM clk) AND overlap <> 0
                                  AND attempts < max_attempts AND NOT cancel_requested)) AS due),
         {pick},
         pick AS (
             SELECT seq, lost_epoch, lost_owner, lost_started, lost_lease, ord, payload,
                    ($5::text[])[ord] AS claimant, ($6::int8[])[ord] AS lease_ms,
                    ($8::uuid[])[ord] AS claim_key
               FROM cand)",
        now = statement_now("$3"),
        live = fence::hands_out_work_sql("now"),
        pick = worker_pick(
            "(SELECT now FROM clk)",
            "(SELECT unlimited AND live FROM clk)",
            "cand",
            "($7::int8[])[k.rn]",
            "($9::int8[])[ord]",
        )
    );
    claim_sql(
        &pick,
        "pick.claimant",
        "pick.claim_key",
        "(SELECT now FROM clk)",
        "((SELECT now FROM clk) + COALESCE(pick.lease_ms, o.lease_ms))",
        "pick.ord",
        "SELECT c.id, c.schedule_id, c.version, c.scheduled_for, c.available_at, c.epoch, c.attempts,
                c.payload, clk.now, clk.unlimited, cst.due, c.tag, c.lease_until, clk.live
           FROM clk CROSS JOIN cst LEFT JOIN claimed c ON true
          ORDER BY c.available_at, c.seq",
    )
});

/// The worker claim: at most `$4` due or lease-expired occurrences of one queue, picked and
/// claimed in one statement. `$1` tenant, `$2` queue, `$3` now, `$4` max, `$5` owner, `$6`
/// lease length in ms (NULL: each occurrence's own), `$7` the caller's instant or NULL, for the
/// liveness gate ([`statement_now`]), `$8` the claim's key or NULL, `$9` the answer's size
/// bound in bytes ([`OccurrenceClaim::max_bytes`]).
static FAST_CLAIM: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    claim_sql(
        &worker_pick(
            "$3",
            &fence::hands_out_work_sql(&statement_now("$7")),
            "pick",
            "1::int8",
            "$9",
        ),
        "$5",
        "$8::uuid",
        "$3",
        "$3 + COALESCE($6::int8, o.lease_ms)",
        "NULL::int8",
        CLAIMED_ROWS,
    )
});

/// The claim of occurrences already chosen and locked by the caller's transaction (so this
/// statement's snapshot sees them as locked). `$1` their seqs, `$2` owner, `$3` now, `$4`
/// lease length in ms (NULL: each occurrence's own), `$5` the claim's key or NULL.
static CLAIM_SEQS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    claim_sql(
        "pick AS (
             SELECT o.seq, CASE WHEN o.state = 'RUNNING' THEN o.epoch END AS lost_epoch,
                    o.owner AS lost_owner, o.claimed_at AS lost_started, o.lease_until AS lost_lease,
                    v.payload
               FROM occurrences o
               LEFT JOIN schedule_versions v ON v.schedule_id = o.schedule_id AND v.version = o.version
              WHERE o.seq = ANY($1::int8[]))",
        "$2",
        "$5::uuid",
        "$3",
        "$3 + COALESCE($4::int8, o.lease_ms)",
        "NULL::int8",
        CLAIMED_ROWS,
    )
});

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
async fn worker_claims<C: GenericClient>(c: &C, reqs: &[OccurrenceClaim]) -> R<Vec<WorkerClaim>> {
    let rows = worker_claim_rows(c, reqs).await?;
    dealt_claims(reqs, &rows)
}

/// The rows of the claim statement for `reqs` (none for no request).
async fn worker_claim_rows<C: GenericClient>(c: &C, reqs: &[OccurrenceClaim]) -> R<Vec<Row>> {
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
        &WORKER_CLAIM,
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
fn dealt_claims(reqs: &[OccurrenceClaim], rows: &[Row]) -> R<Vec<WorkerClaim>> {
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
fn answer_bound(p: &OccurrenceClaim) -> i64 {
    i64::try_from(p.answer_bytes_or_default()).unwrap_or(i64::MAX)
}

/// What is left of a claim's size bound once `claimed` is in its answer.
fn room_after(p: &OccurrenceClaim, claimed: &[Claimed]) -> ClaimRoom {
    let mut room = ClaimRoom::new(p.answer_bytes_or_default());
    for c in claimed {
        room.take(c.answer_bytes());
    }
    room
}

/// The one-statement claim of up to `max` unconstrained occurrences.
async fn fast_claim<C: GenericClient>(
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
        &FAST_CLAIM,
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

/// Claims these occurrences (already chosen, and locked by the caller's transaction).
async fn claim_seqs<C: GenericClient>(
    c: &C,
    seqs: &[i64],
    owner: &str,
    key: Option<Uuid>,
    now: i64,
    lease: Option<i64>,
) -> R<Vec<Claimed>> {
    let rows = query(c, &CLAIM_SEQS, &[&seqs, &owner, &now, &lease, &key]).await?;
    rows.iter().map(|r| claimed_row(r, now, 8)).collect()
}

/// A claimed occurrence from a claim's row; its lease end is in column `lease_col`.
fn claimed_row(r: &Row, now: i64, lease_col: usize) -> R<Claimed> {
    let lease_until: i64 = r.try_get(lease_col).map_err(pg_err)?;
    Ok(Claimed {
        id: OccurrenceId(r.get(0)),
        schedule_id: ScheduleId(r.get(1)),
        version: u32_of(r.get(2)),
        scheduled_for: ts(r.get(3))?,
        available_at: ts(r.get(4))?,
        epoch: r.get(5),
        lease_until: ts(lease_until)?,
        attempt: u32_of(r.get(6)),
        claimed_at: ts(now)?,
        payload: r.get(7),
        replayed: false,
    })
}

/// Which rows of a claim's queue are overlap-constrained candidates: `$1` tenant, `$2` queue,
/// `$3` now, `$5` the caller's instant or NULL (for the liveness gate, [`statement_now`]).
fn constrained_where() -> String {
    format!(
        "tenant_id = $1 AND queue = $2 AND overlap <> 0
            AND ((state IN ('READY', 'RETRY_WAIT') AND available_at <= $3)
                 OR (state = 'RUNNING' AND lease_until <= $3 AND attempts < max_attempts
                     AND NOT cancel_requested))
            AND {}",
        fence::hands_out_work_sql(&statement_now("$5"))
    )
}

/// When a constrained candidate became claimable, its claim-order key: an expired lease from
/// when it ended, so that the occurrences of its schedule that came due during the lost
/// attempt are decided before its takeover overwrites that attempt's `claimed_at` (the value
/// the sweep and the takeover write as its `available_at`).
const CLAIMABLE_SINCE: &str =
    "CASE WHEN state = 'RUNNING' THEN GREATEST(available_at, lease_until) ELSE available_at END";

/// The schedules of a claim's overlap-constrained candidates, read without locking (`$4` how
/// many candidates), so that their rows can be locked first, in id order.
static CONSTRAINED_SCHEDULES: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT schedule_id FROM occurrences WHERE {}
          ORDER BY priority DESC, {CLAIMABLE_SINCE}, seq LIMIT $4",
        constrained_where()
    )
});

/// The candidates themselves, locked, of the schedules locked (`$6`), with their payloads'
/// sizes in bytes.
static CONSTRAINED_CANDIDATES: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT seq, schedule_id, overlap, state, available_at, priority,
                (SELECT octet_length(v.payload) FROM schedule_versions v
                  WHERE v.schedule_id = occurrences.schedule_id AND v.version = occurrences.version)
           FROM occurrences
          WHERE {} AND schedule_id = ANY($6::uuid[])
          ORDER BY priority DESC, {CLAIMABLE_SINCE}, seq LIMIT $4
          FOR UPDATE SKIP LOCKED",
        constrained_where()
    )
});

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
const OVERLAP_STATE: &str = "SELECT
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
async fn claim_constrained<C: GenericClient>(
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
fn constrained_window(room: usize) -> i64 {
    (room + 64) as i64
}

/// Locks, in id order, the schedule rows of a claim's constrained candidates (those a claim
/// with `room` left would look at); returns their ids. Taken before any occurrence row is
/// locked in the transaction.
async fn lock_constrained_schedules<C: GenericClient>(
    tx: &C,
    p: &OccurrenceClaim,
    now: i64,
    room: usize,
) -> R<Vec<Uuid>> {
    let limit = constrained_window(room);
    let fixed = p.now.map(|t| t.as_millisecond());
    let mut schedules: Vec<Uuid> = query(
        tx,
        &CONSTRAINED_SCHEDULES,
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
async fn claim_constrained_locked<C: GenericClient>(
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
        &CONSTRAINED_CANDIDATES,
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
                    claim_seqs(tx, &[seq], &p.worker_id, p.key.map(|k| k.id), now, lease).await?,
                );
            }
            fence::OverlapDecision::Wait => {}
            fence::OverlapDecision::Skip => {
                execute(tx, "UPDATE occurrences SET state = 'SKIPPED_OVERLAP', finished_at = $2 WHERE seq = $1", &[&seq, &now]).await?;
                skipped += 1;
            }
        }
    }
    Ok((out, skipped))
}

/// The relay's due outbox rows with their occurrences, locked: `$1` now, `$2` how many, `$3`
/// the caller's instant or NULL (for the liveness gate). The occurrence's columns first, in
/// FENCE_COLS order, for `fence_view`. Nothing while no node is live: the relay is a node's
/// own and waits, as its node's claims do.
static RELAY_DUE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT occ.seq, occ.id, occ.state, occ.owner, occ.epoch, occ.lease_until, occ.available_at,
                occ.attempts, occ.max_attempts, occ.backoff_initial_ms, occ.backoff_max_ms,
                o.seq, o.tenant_id, o.target
           FROM outbox o JOIN occurrences occ ON occ.id = o.occurrence_id
          WHERE o.settled_at IS NULL AND o.available_at <= $1
            AND NOT (occ.state = 'RUNNING' AND occ.cancel_requested) AND {}
          ORDER BY o.available_at LIMIT $2
          FOR UPDATE OF o, occ SKIP LOCKED",
        fence::hands_out_work_sql(&statement_now("$3"))
    )
});

pub(crate) async fn relay_claim(c: &mut Client, p: RelayClaim) -> R<Vec<Relayed>> {
    let now = resolve_now(c, p.now).await?;
    // Read a little more than `max`: rows to settle or postpone are handled on the way.
    let scan = i64::from(p.max).saturating_mul(2).max(16);
    let tx = c.transaction().await.map_err(pg_err)?;
    // Both rows locked, skipping what another relay holds: the decision below is atomic with
    // the occurrence's state (a cancel, the recovery sweep) across nodes.
    let fixed = p.now.map(|t| t.as_millisecond());
    let due = query(&tx, &RELAY_DUE, &[&now, &scan, &fixed]).await?;
    let (mut settle_seqs, mut settle_states) = (Vec::new(), Vec::new());
    let (mut later_seqs, mut later_ats) = (Vec::new(), Vec::new());
    let (mut pick_oseqs, mut pick_seqs) = (Vec::new(), Vec::new());
    let mut routes = RelayRoutes::new();
    for r in &due {
        let (seq, id, view) = fence_view(r)?;
        let oseq: i64 = r.get(11);
        match fence::relay_step(&view, now) {
            fence::RelayStep::Settle(state) => {
                settle_seqs.push(oseq);
                settle_states.push(state.as_str());
            }
            fence::RelayStep::Postpone(at) => {
                later_seqs.push(oseq);
                later_ats.push(at);
            }
            fence::RelayStep::Claim if pick_seqs.len() < p.max as usize => {
                pick_oseqs.push(oseq);
                pick_seqs.push(seq);
                routes.insert(id, (TenantId(r.get(12)), r.get(13)));
            }
            fence::RelayStep::Claim => {}
        }
    }
    if !settle_seqs.is_empty() {
        execute(
            &tx,
            "UPDATE outbox o SET settled_at = $1::int8, outcome = u.st,
                    delivered_at = CASE WHEN u.st = 'SUCCEEDED' THEN $1::int8 END
               FROM unnest($2::int8[], $3::text[]) AS u(seq, st) WHERE o.seq = u.seq",
            &[&now, &settle_seqs, &settle_states],
        )
        .await?;
    }
    if !later_seqs.is_empty() {
        execute(
            &tx,
            "UPDATE outbox o SET available_at = u.at
               FROM unnest($1::int8[], $2::int8[]) AS u(seq, at) WHERE o.seq = u.seq",
            &[&later_seqs, &later_ats],
        )
        .await?;
    }
    let rows = if pick_seqs.is_empty() {
        Vec::new()
    } else {
        execute(
            &tx,
            "UPDATE outbox SET attempts = attempts + 1 WHERE seq = ANY($1)",
            &[&pick_oseqs],
        )
        .await?;
        claim_seqs(&tx, &pick_seqs, &p.node, None, now, Some(dur_ms(p.lease))).await?
    };
    if rows.len() != pick_seqs.len() {
        return Err(StoreError::Database(format!(
            "relay claimed {} of {} locked occurrences",
            rows.len(),
            pick_seqs.len()
        )));
    }
    let out = Relayed::pair(rows, routes)?;
    tx.commit().await.map_err(pg_err)?;
    Ok(out)
}

pub(crate) async fn lease_renew(c: &Client, p: LeaseRenew) -> R<Vec<Renewal>> {
    let now = resolve_now(c, p.now).await?;
    let lease = p.lease.map(dur_ms);
    let ids: Vec<Uuid> = p.leases.iter().map(|l| l.occurrence_id.0).collect();
    let epochs: Vec<i64> = p.leases.iter().map(|l| l.epoch).collect();
    // The rows are locked in `seq` order first, as the success statement locks them: a
    // renewal and a (shared) batch of successes naming the same occurrences then queue behind
    // each other instead of deadlocking. The fence is tested on the rows as locked.
    let rows = query(
        c,
        "WITH l AS (SELECT * FROM unnest($4::uuid[], $6::int8[]) AS l(id, epoch)),
              cur AS (
                  SELECT o.seq, l.epoch AS sent FROM occurrences o JOIN l ON o.id = l.id
                   WHERE o.tenant_id = $1
                   ORDER BY o.seq
                     FOR UPDATE OF o)
         UPDATE occurrences o SET lease_until = $3 + COALESCE($5::int8, o.lease_ms)
           FROM cur
          WHERE o.seq = cur.seq AND o.epoch = cur.sent AND o.owner = $2
            AND o.state = 'RUNNING' AND o.lease_until > $3
         RETURNING o.id, o.epoch, o.cancel_requested, o.lease_until",
        &[&p.tenant.0, &p.worker_id, &now, &ids, &lease, &epochs],
    )
    .await?;
    let renewed: HashMap<(Uuid, i64), (bool, i64)> = rows
        .iter()
        .map(|r| ((r.get(0), r.get(1)), (r.get(2), r.get(3))))
        .collect();
    // Lost leases (rare) are explained from their rows as they are now, by the shared fence.
    let lost: Vec<Uuid> = p
        .leases
        .iter()
        .filter(|l| !renewed.contains_key(&(l.occurrence_id.0, l.epoch)))
        .map(|l| l.occurrence_id.0)
        .collect();
    let views: HashMap<Uuid, FenceView> = if lost.is_empty() {
        HashMap::new()
    } else {
        query(
            c,
            &format!("SELECT {FENCE_COLS} FROM occurrences WHERE tenant_id = $1 AND id = ANY($2)"),
            &[&p.tenant.0, &lost],
        )
        .await?
        .iter()
        .map(|r| fence_view(r).map(|(_, id, v)| (id, v)))
        .collect::<R<_>>()?
    };
    p.leases
        .iter()
        .map(|l| {
            let hit = renewed.get(&(l.occurrence_id.0, l.epoch));
            let lost = match hit {
                Some(_) => None,
                None => fence::lost(views.get(&l.occurrence_id.0), &p.worker_id, l.epoch, now)?,
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

const FENCE_COLS: &str =
    "seq, id, state, owner, epoch, lease_until, available_at, attempts, max_attempts,
    backoff_initial_ms, backoff_max_ms";

fn fence_view(r: &Row) -> R<(i64, Uuid, FenceView)> {
    Ok((
        r.get(0),
        r.get(1),
        FenceView {
            state: stored_state(r.get(2))?,
            owner: r.get(3),
            epoch: r.get(4),
            lease_until: r.get(5),
            available_at: r.get(6),
            attempts: u32_of(r.get(7)),
            max_attempts: u32_of(r.get(8)),
            backoff_initial_ms: r.get(9),
            backoff_max_ms: r.get(10),
        },
    ))
}

/// Successes in one statement: `clk` is the instant (the database's clock, or `$5`); `cur`
/// locks and reads the tenant's occurrences named by the batch (`$2` ids, `$3` epochs sent,
/// `$4` results, `$6` the reporting workers); `upd` writes SUCCEEDED where the fence holds
/// (RUNNING, owned by the worker reporting it, the epoch sent, lease not passed); the attempts
/// that succeeded stay on their occurrence rows ([`OccurrenceDetail::assemble`]), so no
/// attempt row is written. The fence is tested on `cur`, the rows as locked — their latest committed versions, which nobody can change before this
/// transaction ends — not on `o` as the statement's snapshot saw it: a renewal committed
/// between the snapshot and the lock must count, as it does for the shared fence's
/// explanation. One row per occurrence found (none found: one row of NULLs), each with its
/// fence columns as read, the instant, and whether the statement wrote it — `seq IN (SELECT
/// seq FROM upd)`, a hashed subplan, not a join of `upd` back to `cur`: CTEs are estimated at
/// one row, so that join was a nested loop, quadratic in the batch (and an aggregate of `upd`
/// repeated on every row would be as quadratic in bytes).
const FINISH_SUCCESSES: &str = "
    WITH clk AS (SELECT COALESCE($5::int8, (extract(epoch FROM clock_timestamp()) * 1000)::int8) AS now),
         items AS (SELECT * FROM unnest($2::uuid[], $3::int8[], $4::text[], $6::text[]) AS u(id, epoch, result, worker)),
         cur AS (
             SELECT o.seq, o.id, o.state, o.owner, o.epoch, o.lease_until, o.available_at, o.attempts,
                    o.max_attempts, o.backoff_initial_ms, o.backoff_max_ms, items.epoch AS sent, items.result,
                    items.worker
               FROM occurrences o JOIN items ON o.id = items.id
              WHERE o.tenant_id = $1
              ORDER BY o.seq
                FOR UPDATE OF o),
         upd AS (
             UPDATE occurrences o
                SET state = 'SUCCEEDED', result = COALESCE(cur.result, o.result), finished_at = clk.now,
                    ran_until = clk.now
               FROM cur, clk
              WHERE o.seq = cur.seq AND cur.state = 'RUNNING' AND cur.owner = cur.worker AND cur.epoch = cur.sent
                AND cur.lease_until > clk.now
             RETURNING o.seq, o.epoch)
    SELECT cur.seq, cur.id, cur.state, cur.owner, cur.epoch, cur.lease_until, cur.available_at, cur.attempts,
           cur.max_attempts, cur.backoff_initial_ms, cur.backoff_max_ms, clk.now,
           cur.seq IN (SELECT seq FROM upd)
      FROM clk LEFT JOIN cur ON true";

/// Whether a batch is all successes, for distinct occurrences — what workers and the relay
/// send almost always — and so may share [`FINISH_SUCCESSES`] with other such batches.
pub(crate) fn only_successes(p: &OccurrenceFinishMany) -> bool {
    let mut seen = std::collections::HashSet::with_capacity(p.items.len());
    !p.items.is_empty()
        && p.items.iter().all(|i| i.finish.succeeded())
        && p.items.iter().all(|i| seen.insert(i.lease.occurrence_id))
}

/// Batches of successes of one tenant that share a statement ([`crate::coalesce`]).
pub(crate) struct SuccessBatch {
    pub(crate) pool: Pool,
}

/// Most completions one shared statement carries.
const SHARED_SUCCESSES: usize = 4096;

impl Batch for SuccessBatch {
    type Key = (i64, Option<i64>);
    type Req = OccurrenceFinishMany;
    type Resp = Vec<Ack>;
    /// The occurrences named so far.
    type Load = std::collections::HashSet<OccurrenceId>;
    const SKIP_ABANDONED: bool = false;

    /// Fits while the statement stays bounded and names each occurrence once.
    fn admit(load: &mut Self::Load, req: &OccurrenceFinishMany, first: bool) -> bool {
        let fits = first
            || (load.len() + req.items.len() <= SHARED_SUCCESSES
                && req
                    .items
                    .iter()
                    .all(|i| !load.contains(&i.lease.occurrence_id)));
        if fits {
            load.extend(req.items.iter().map(|i| i.lease.occurrence_id));
        }
        fits
    }

    fn weight(req: &OccurrenceFinishMany) -> usize {
        req.items.len()
    }

    async fn run(&self, reqs: Vec<OccurrenceFinishMany>) -> R<Vec<Vec<Ack>>> {
        finish_successes(&self.pool.get().await.map_err(pool_err)?, &reqs).await
    }
}

/// Reports of successes that each carry a claim of the same worker (one tenant and queue),
/// sharing one transaction: the success statement, then the claim statement — one commit
/// where separate requests take two ([`crate::coalesce`]).
pub(crate) struct FinishClaimBatch {
    pub(crate) pool: Pool,
}

impl Batch for FinishClaimBatch {
    type Key = (i64, String, Option<i64>);
    type Req = (OccurrenceFinishMany, OccurrenceClaim);
    type Resp = (Vec<Ack>, Result<WorkerClaim, StoreError>);
    /// The occurrences named so far, and the occurrences asked for.
    type Load = (std::collections::HashSet<OccurrenceId>, u64);
    const SKIP_ABANDONED: bool = false;

    /// The outcomes of a caller that has gone are still written; its claim is not made (it
    /// would lease occurrences to no one, each using up an attempt).
    fn abandoned((finish, mut claim): Self::Req) -> Option<Self::Req> {
        claim.max = 0;
        Some((finish, claim))
    }

    fn admit(load: &mut Self::Load, req: &Self::Req, first: bool) -> bool {
        let (finish, claim) = req;
        let fits = first
            || (load.0.len() + finish.items.len() <= SHARED_SUCCESSES
                && load.1 + u64::from(claim.max) <= SHARED_CLAIM_ROWS
                && finish
                    .items
                    .iter()
                    .all(|i| !load.0.contains(&i.lease.occurrence_id)));
        if fits {
            load.0
                .extend(finish.items.iter().map(|i| i.lease.occurrence_id));
            load.1 += u64::from(claim.max);
        }
        fits
    }

    fn weight(req: &Self::Req) -> usize {
        req.0.items.len() + req.1.max as usize
    }

    async fn run(&self, reqs: Vec<Self::Req>) -> R<Vec<Self::Resp>> {
        let c = self.pool.get().await.map_err(pool_err)?;
        let (finishes, claims): (Vec<_>, Vec<_>) = reqs.into_iter().unzip();
        // The transaction is one round trip: `BEGIN`, both statements and `COMMIT` go out
        // together (tokio-postgres pipelines requests polled together, in the order polled),
        // where awaiting each took four. Both statements are prepared first, so each sends
        // its request on its first poll. Nothing is decided between them that could stop the
        // commit: a statement that fails aborts the transaction, and the `COMMIT` then rolls
        // it back. The rows are read only once the transaction has ended.
        c.prepare_cached(FINISH_SUCCESSES).await.map_err(pg_err)?;
        c.prepare_cached(&WORKER_CLAIM).await.map_err(pg_err)?;
        let (begun, written, dealt, ended) = tokio::join!(
            biased;
            c.batch_execute("BEGIN"),
            success_rows(&c, &finishes),
            worker_claim_rows(&c, &claims),
            c.batch_execute("COMMIT"),
        );
        begun.map_err(pg_err)?;
        let written = written?;
        match dealt {
            Ok(dealt) => {
                ended.map_err(pg_err)?;
                // Committed. Rows that cannot be read (a bug) are an error for what they
                // answer, not a reason to write the outcomes again: they are written.
                let acks = success_acks(&finishes, &written)?;
                let got: Vec<_> = match dealt_claims(&claims, &dealt) {
                    Ok(got) => got.into_iter().map(Ok).collect(),
                    Err(e) => claims.iter().map(|_| Err(e.clone())).collect(),
                };
                Ok(acks.into_iter().zip(got).collect())
            }
            Err(e) => {
                // The claim failed, so the `COMMIT` rolled the outcomes back: they are
                // written again on their own, and the claim's error is each request's claim
                // answer.
                ended.map_err(pg_err)?;
                let acks = finish_successes(&c, &finishes).await?;
                Ok(acks.into_iter().map(|a| (a, Err(e.clone()))).collect())
            }
        }
    }
}

/// Batches of successes of one tenant, for distinct occurrences, in one statement and one
/// round trip ([`FINISH_SUCCESSES`]); the shared fence still explains every refusal, from the
/// row as it was locked. One answer per batch, in order.
async fn finish_successes<C: GenericClient>(
    c: &C,
    reqs: &[OccurrenceFinishMany],
) -> R<Vec<Vec<Ack>>> {
    let rows = success_rows(c, reqs).await?;
    success_acks(reqs, &rows)
}

/// The rows of the success statement for `reqs` (none for no request).
async fn success_rows<C: GenericClient>(c: &C, reqs: &[OccurrenceFinishMany]) -> R<Vec<Row>> {
    let Some(p) = reqs.first() else {
        return Ok(Vec::new());
    };
    let items = || {
        reqs.iter()
            .flat_map(|r| r.items.iter().map(move |i| (r, i)))
    };
    let ids: Vec<Uuid> = items().map(|(_, i)| i.lease.occurrence_id.0).collect();
    let epochs: Vec<i64> = items().map(|(_, i)| i.lease.epoch).collect();
    let results: Vec<Option<&str>> = items()
        .map(|(_, i)| match &i.finish {
            Finish::Succeeded { result } => result.as_deref(),
            Finish::Failed { .. } => None,
        })
        .collect();
    let workers: Vec<&str> = items().map(|(r, _)| r.worker_id.as_str()).collect();
    let now_override = p.now.map(|t| t.as_millisecond());
    query(
        c,
        FINISH_SUCCESSES,
        &[
            &p.tenant.0,
            &ids,
            &epochs,
            &results,
            &now_override,
            &workers,
        ],
    )
    .await
}

/// Each request's acknowledgements from the success statement's `rows`, in request order.
fn success_acks(reqs: &[OccurrenceFinishMany], rows: &[Row]) -> R<Vec<Vec<Ack>>> {
    if reqs.is_empty() {
        return Ok(Vec::new());
    }
    let mut found: HashMap<Uuid, (bool, FenceView)> = HashMap::with_capacity(rows.len());
    let mut now = None;
    for r in rows {
        now = Some(r.try_get::<_, i64>(11).map_err(pg_err)?);
        if r.try_get::<_, Option<i64>>(0).map_err(pg_err)?.is_some() {
            let (_, id, view) = fence_view(r)?;
            found.insert(id, (r.try_get(12).map_err(pg_err)?, view));
        }
    }
    let now = now.ok_or_else(|| StoreError::Database("the completion returned no row".into()))?;
    // The row written is the acknowledgement; the shared fence explains, from the same
    // columns as locked, why a row was not written.
    let mut answers = Vec::with_capacity(reqs.len());
    for req in reqs {
        let mut acks = Vec::with_capacity(req.items.len());
        for item in &req.items {
            let id = item.lease.occurrence_id;
            let Some((written, view)) = found.get(&id.0) else {
                acks.push(refused(id, Conflict::NotFound));
                continue;
            };
            if *written {
                acks.push(Ack {
                    occurrence_id: id,
                    rows: 1,
                    conflict: None,
                    state: Some(OccurrenceState::Succeeded),
                    retry_at: None,
                });
            } else {
                // The fence and the statement's condition agree, so the fence names the
                // reason; if it ever finds none, say so honestly rather than accept.
                let conflict = fence::check(view, &req.worker_id, item.lease.epoch, now)
                    .ok()
                    .flatten()
                    .unwrap_or(Conflict::WrongState { state: view.state });
                acks.push(refused(id, conflict));
            }
        }
        answers.push(acks);
    }
    Ok(answers)
}

/// Attempt rows for the attempts a batch ended otherwise than in success, from the occurrence
/// rows just written: `$1` seqs, `$2` epochs, `$3` outcomes, `$4` now, `$5`/`$6` error class
/// and message, `$7` the seqs written.
static RECORD_ENDED_ATTEMPTS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "INSERT INTO attempts (occurrence_seq, epoch, owner, started_at, lease_until, finished_at,
                               outcome, error_class, error_message)
         SELECT o.seq, o.epoch, o.owner, o.claimed_at, o.lease_until, $4, u.outcome, u.class, u.message
           FROM unnest($1::int8[], $2::int8[], $3::text[], $5::text[], $6::text[])
                AS u(seq, epoch, outcome, class, message)
           JOIN occurrences o ON o.seq = u.seq AND o.epoch = u.epoch
          WHERE u.outcome <> 'succeeded' AND o.seq = ANY($7::int8[])
         {CLOSE_RUNNING_ATTEMPT_ROW}"
    )
});

/// A batch with failures, or naming an occurrence twice, item by item in one transaction
/// (batches of successes go through [`SuccessBatch`]).
pub(crate) async fn occurrence_finish_many(c: &mut Client, p: OccurrenceFinishMany) -> R<Vec<Ack>> {
    let tx = c.transaction().await.map_err(pg_err)?;
    let now = resolve_now(&tx, p.now).await?;
    let ids: Vec<Uuid> = p.items.iter().map(|i| i.lease.occurrence_id.0).collect();
    // Lock the rows, decide each item with the shared fence, then write all accepted items in
    // one conditional UPDATE whose returned rows are the acknowledgements.
    let rows = query(
        &tx,
        &format!("SELECT {FENCE_COLS}, cancel_requested FROM occurrences WHERE tenant_id = $1 AND id = ANY($2) ORDER BY seq FOR UPDATE"),
        &[&p.tenant.0, &ids],
    )
    .await?;
    let mut views: HashMap<Uuid, (i64, FenceView, bool)> = HashMap::with_capacity(rows.len());
    for r in &rows {
        let (seq, id, v) = fence_view(r)?;
        views.insert(id, (seq, v, r.get(11)));
    }
    let mut acks: Vec<Ack> = Vec::with_capacity(p.items.len());
    let mut plans: Vec<(usize, i64, fence::FinishPlan)> = Vec::new();
    for (i, item) in p.items.iter().enumerate() {
        let id = item.lease.occurrence_id;
        let Some((seq, view, cancel_requested)) = views.get_mut(&id.0) else {
            acks.push(refused(id, Conflict::NotFound));
            continue;
        };
        if let Some(conflict) = fence::check(view, &p.worker_id, item.lease.epoch, now)? {
            acks.push(refused(id, conflict));
            continue;
        }
        let plan = fence::plan(view, id, &item.finish, *cancel_requested, now)?;
        view.apply(&plan);
        acks.push(Ack {
            occurrence_id: id,
            rows: 0,
            conflict: None,
            state: Some(plan.state),
            retry_at: (plan.state == OccurrenceState::RetryWait)
                .then(|| ts(plan.available_at))
                .transpose()?,
        });
        plans.push((i, *seq, plan));
    }
    if !plans.is_empty() {
        let seqs: Vec<i64> = plans.iter().map(|(_, s, _)| *s).collect();
        let epochs: Vec<i64> = plans
            .iter()
            .map(|(i, _, _)| p.items[*i].lease.epoch)
            .collect();
        let states: Vec<&str> = plans.iter().map(|(_, _, pl)| pl.state.as_str()).collect();
        let results: Vec<Option<&str>> = plans
            .iter()
            .map(|(_, _, pl)| pl.result.as_deref())
            .collect();
        let avail: Vec<i64> = plans.iter().map(|(_, _, pl)| pl.available_at).collect();
        let finished: Vec<Option<i64>> = plans.iter().map(|(_, _, pl)| pl.finished_at).collect();
        let classes: Vec<Option<&str>> = plans.iter().map(|(_, _, pl)| pl.error_class).collect();
        let messages: Vec<Option<&str>> = plans
            .iter()
            .map(|(_, _, pl)| pl.error_message.as_deref())
            .collect();
        let outcomes: Vec<&str> = plans.iter().map(|(_, _, pl)| pl.outcome.as_str()).collect();
        let written = query(
            &tx,
            "UPDATE occurrences o
                SET state = u.state, result = COALESCE(u.result, o.result), available_at = u.available_at,
                    finished_at = u.finished_at, last_error_class = COALESCE(u.class, o.last_error_class),
                    last_error = COALESCE(u.message, o.last_error), ran_until = $10
               FROM unnest($1::int8[], $2::int8[], $3::text[], $4::text[], $5::int8[], $6::int8[], $7::text[], $8::text[])
                    AS u(seq, epoch, state, result, available_at, finished_at, class, message)
              WHERE o.seq = u.seq AND o.state = 'RUNNING' AND o.owner = $9 AND o.epoch = u.epoch
                AND o.lease_until > $10
             RETURNING o.seq",
            &[&seqs, &epochs, &states, &results, &avail, &finished, &classes, &messages, &p.worker_id, &now],
        )
        .await?;
        let written: std::collections::HashSet<i64> = written.iter().map(|r| r.get(0)).collect();
        // The attempts that ended otherwise than in success get their rows, from the occurrence
        // rows just written (a success stays on its occurrence row).
        execute(
            &tx,
            &RECORD_ENDED_ATTEMPTS,
            &[
                &seqs,
                &epochs,
                &outcomes,
                &now,
                &classes,
                &messages,
                &written.iter().copied().collect::<Vec<i64>>(),
            ],
        )
        .await?;
        // Outbox rows of relayed occurrences that failed (`FinishPlan::outbox_due`).
        let (retime_ids, retime_ats): (Vec<Uuid>, Vec<i64>) = plans
            .iter()
            .filter(|(_, seq, _)| written.contains(seq))
            .filter_map(|(i, _, pl)| Some((p.items[*i].lease.occurrence_id.0, pl.outbox_due(now)?)))
            .unzip();
        if !retime_ids.is_empty() {
            execute(
                &tx,
                "UPDATE outbox o SET available_at = u.at
                   FROM unnest($1::uuid[], $2::int8[]) AS u(id, at)
                  WHERE o.occurrence_id = u.id AND o.settled_at IS NULL",
                &[&retime_ids, &retime_ats],
            )
            .await?;
        }
        for (i, seq, _) in &plans {
            if written.contains(seq) {
                acks[*i].rows = 1;
            } else {
                // The row lock makes this unreachable; if it ever happens, say so honestly:
                // the row was RUNNING when its check passed (not the planned state, which a
                // worker reads as its outcome written when it is SUCCEEDED).
                let state = OccurrenceState::Running;
                acks[*i] = refused(acks[*i].occurrence_id, Conflict::WrongState { state });
            }
        }
    }
    tx.commit().await.map_err(pg_err)?;
    Ok(acks)
}

pub(crate) async fn occurrence_cancel(c: &mut Client, p: OccurrenceCancel) -> R<Ack> {
    let tx = c.transaction().await.map_err(pg_err)?;
    let now = resolve_now(&tx, p.now).await?;
    let id = p.occurrence_id;
    let rows = query(
        &tx,
        &format!(
            "SELECT {FENCE_COLS} FROM occurrences WHERE tenant_id = $1 AND id = $2 FOR UPDATE"
        ),
        &[&p.tenant.0, &id.0],
    )
    .await?;
    let Some(row) = rows.first() else {
        return Ok(refused(id, Conflict::NotFound));
    };
    let (seq, _, view) = fence_view(row)?;
    let (n, state) = match view.state {
        OccurrenceState::Ready | OccurrenceState::RetryWait => (
            execute(&tx, "UPDATE occurrences SET state = 'CANCELED', finished_at = $2 WHERE seq = $1 AND state IN ('READY', 'RETRY_WAIT')", &[&seq, &now]).await?,
            OccurrenceState::Canceled,
        ),
        OccurrenceState::Running => (
            execute(&tx, "UPDATE occurrences SET cancel_requested = true WHERE seq = $1 AND state = 'RUNNING'", &[&seq]).await?,
            OccurrenceState::Running,
        ),
        s => return Ok(refused(id, Conflict::WrongState { state: reported(s, view.available_at, now) })),
    };
    tx.commit().await.map_err(pg_err)?;
    Ok(Ack {
        occurrence_id: id,
        rows: n,
        conflict: None,
        state: Some(state),
        retry_at: None,
    })
}

pub(crate) async fn occurrence_redrive(c: &Client, p: OccurrenceRedrive) -> R<Ack> {
    let now = resolve_now(c, p.now).await?;
    let id = p.occurrence_id;
    // One statement, so atomic: an externally targeted occurrence goes back to the relay with
    // its outbox row reopened, never READY on a route nobody reads. Its owner and lease go: no
    // worker holds it until it is claimed again (the dead attempt stays in its attempt rows;
    // `claimed_at` and `ran_until` stay for the overlap history).
    let n: i64 = query(
        c,
        "WITH upd AS (
             UPDATE occurrences SET state = 'READY', attempts = 0, available_at = $3, finished_at = NULL,
                    due_at = CASE WHEN overlap <> 0 THEN $3::int8 END,
                    cancel_requested = false, owner = NULL, lease_until = NULL
              WHERE id = $1 AND tenant_id = $2 AND state = 'DEAD'
             RETURNING id),
         reopened AS (
             UPDATE outbox SET settled_at = NULL, outcome = NULL, delivered_at = NULL, available_at = $3
              WHERE occurrence_id IN (SELECT id FROM upd))
         SELECT count(*) FROM upd",
        &[&id.0, &p.tenant.0, &now],
    )
    .await?
    .first()
    .map_or(0, |r| r.get(0));
    if n == 1 {
        return Ok(Ack {
            occurrence_id: id,
            rows: 1,
            conflict: None,
            state: Some(OccurrenceState::Ready),
            retry_at: None,
        });
    }
    let rows = query(
        c,
        &format!("SELECT {FENCE_COLS} FROM occurrences WHERE tenant_id = $1 AND id = $2"),
        &[&p.tenant.0, &id.0],
    )
    .await?;
    Ok(match rows.first() {
        None => refused(id, Conflict::NotFound),
        Some(r) => {
            let (_, _, v) = fence_view(r)?;
            refused(
                id,
                Conflict::WrongState {
                    state: reported(v.state, v.available_at, now),
                },
            )
        }
    })
}

pub(crate) async fn lease_sweep(c: &Client, p: LeaseSweep) -> R<SweepReport> {
    let now = resolve_now(c, p.now).await?;
    let limit = i64::from(p.limit);
    let rows = query(c, &LEASE_SWEEP, &[&now, &limit]).await?;
    let r = rows
        .first()
        .ok_or_else(|| StoreError::Database("sweep returned nothing".into()))?;
    Ok(SweepReport {
        requeued: r.get::<_, i64>(0) as u64,
        dead: r.get::<_, i64>(1) as u64,
        canceled: r.get::<_, i64>(2) as u64,
    })
}

/// Expired leases, oldest first, at most `$2` at `$1`: `CANCELED` if their cancellation was
/// requested while they ran, else back to `READY` with attempts left, else `DEAD`; each lost
/// attempt recorded. Answers how many of each (requeued, dead, canceled).
static LEASE_SWEEP: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!("WITH exp AS (
             SELECT seq, epoch, owner, claimed_at, lease_until, attempts >= max_attempts AS dead,
                    cancel_requested AS canceled FROM occurrences
              WHERE state = 'RUNNING' AND lease_until <= $1
              ORDER BY lease_until LIMIT $2 FOR UPDATE SKIP LOCKED),
         upd AS (
             UPDATE occurrences o
                SET state = CASE WHEN exp.canceled THEN 'CANCELED' WHEN exp.dead THEN 'DEAD' ELSE 'READY' END,
                    finished_at = CASE WHEN exp.canceled OR exp.dead THEN $1 ELSE o.finished_at END,
                    available_at = CASE WHEN exp.canceled OR exp.dead THEN o.available_at
                                        ELSE GREATEST(o.available_at, exp.lease_until) END,
                    last_error = 'lease expired', ran_until = exp.lease_until
               FROM exp WHERE o.seq = exp.seq
             RETURNING exp.dead, exp.canceled),
         att AS (
             INSERT INTO attempts (occurrence_seq, epoch, owner, started_at, lease_until, finished_at, outcome)
             SELECT seq, epoch, owner, claimed_at, lease_until, $1, 'lease_expired' FROM exp
             {CLOSE_RUNNING_ATTEMPT_ROW})
         SELECT count(*) FILTER (WHERE NOT dead AND NOT canceled),
                count(*) FILTER (WHERE dead AND NOT canceled), count(*) FILTER (WHERE canceled) FROM upd")
});

const OCC_COLS: &str =
    "seq, id, schedule_id, version, scheduled_for, available_at, queue, priority, state,
    epoch, owner, lease_until, attempts, max_attempts, cancel_requested, result, last_error_class,
    last_error, finished_at";

fn occurrence_row(r: &Row, now: i64) -> R<(i64, Occurrence)> {
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
        },
    ))
}

pub(crate) async fn occurrence_get(c: &Client, p: OccurrenceGet) -> R<Option<OccurrenceDetail>> {
    let now = resolve_now(c, p.now).await?;
    let rows = match p.key {
        OccurrenceKey::Id(id) => {
            query(c, "SELECT seq FROM occurrences WHERE id = $1 AND tenant_id = $2", &[&id.0, &p.tenant.0]).await?
        }
        OccurrenceKey::Planned { schedule_id, scheduled_for } => {
            query(
                c,
                "SELECT seq FROM occurrences WHERE scheduled_for = $1 AND schedule_id = $2 AND tenant_id = $3
                  ORDER BY version DESC LIMIT 1",
                &[&scheduled_for.as_millisecond(), &schedule_id.0, &p.tenant.0],
            )
            .await?
        }
    };
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let seq: i64 = row.get(0);
    // The occurrence with its attempt rows, in one snapshot: the attempt in progress is
    // read from the one, the ended ones from the other.
    let rows = query(c, &OCC_WITH_ATTEMPTS, &[&seq]).await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let (_, occurrence) = occurrence_row(first, now)?;
    let claimed_at = opt_ts(first.get(19))?;
    let attempts = rows
        .iter()
        .filter(|r| r.get::<_, Option<i64>>(20).is_some())
        .map(|r| {
            let outcome: String = r.get(25);
            let class: Option<String> = r.get(26);
            Ok(Attempt {
                epoch: r.get(20),
                owner: r.get(21),
                started_at: ts(r.get(22))?,
                lease_until: ts(r.get(23))?,
                finished_at: opt_ts(r.get(24))?,
                outcome: AttemptOutcome::parse(&outcome).ok_or_else(|| {
                    StoreError::Database(format!("unknown attempt outcome '{outcome}'"))
                })?,
                error_class: class.as_deref().and_then(|c| c.parse().ok()),
                error_message: r.get(27),
            })
        })
        .collect::<R<Vec<_>>>()?;
    Ok(Some(OccurrenceDetail::assemble(
        occurrence, claimed_at, attempts,
    )))
}

/// One occurrence (`$1` its seq; [`OCC_COLS`], then `claimed_at`) joined with its attempt rows
/// (columns 20–27, NULL when it has none), oldest first.
static OCC_WITH_ATTEMPTS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let cols: Vec<String> = OCC_COLS
        .split(',')
        .map(|c| format!("o.{}", c.trim()))
        .collect();
    format!(
        "SELECT {}, o.claimed_at, a.epoch, a.owner, a.started_at, a.lease_until, a.finished_at, a.outcome,
                a.error_class, a.error_message
           FROM occurrences o LEFT JOIN attempts a ON a.occurrence_seq = o.seq
          WHERE o.seq = $1 ORDER BY a.epoch",
        cols.join(", ")
    )
});

pub(crate) async fn occurrence_list(c: &Client, p: OccurrenceList) -> R<Vec<Occurrence>> {
    let now = resolve_now(c, p.now).await?;
    let mut sql = format!("SELECT {OCC_COLS} FROM occurrences WHERE tenant_id = $1");
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

/// Inserts one schedule version row.
pub(crate) async fn version_insert<C: GenericClient>(
    tx: &C,
    id: ScheduleId,
    version: u32,
    s: &ScheduleSpec,
    now: i64,
) -> R<()> {
    let t = s.timing.columns();
    execute(
        tx,
        "INSERT INTO schedule_versions (schedule_id, version, kind, cron, timezone, dst_gap, dst_fold,
             at, every_ms, anchor, queue, payload, priority, lease_ms, max_attempts,
             backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms, created_at)
         VALUES ($1, $21, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)",
        &[
            &id.0,
            &t.kind,
            &t.cron,
            &t.timezone,
            &t.dst_gap,
            &t.dst_fold,
            &t.at,
            &t.every_ms,
            &t.anchor,
            &s.queue,
            &s.payload,
            &s.priority,
            &dur_ms(s.lease),
            &i32_of(s.max_attempts),
            &dur_ms(s.backoff_initial),
            &dur_ms(s.backoff_max),
            &s.misfire.to_json(),
            &s.overlap.as_str(),
            &dur_ms(s.flex_window),
            &now,
            &i32_of(version),
        ],
    )
    .await?;
    Ok(())
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

pub(crate) async fn deployment_shards(c: &Client, shards: u32) -> R<u32> {
    let n = i32::try_from(shards).map_err(|_| StoreError::Invalid("too many shards".into()))?;
    execute(
        c,
        "INSERT INTO deployment (id, shards, created_at)
         VALUES (1, $1, (extract(epoch FROM clock_timestamp()) * 1000)::bigint)
         ON CONFLICT (id) DO NOTHING",
        &[&n],
    )
    .await?;
    // A statement of its own, so its snapshot sees whichever node's row won.
    let rows = query(c, "SELECT shards FROM deployment WHERE id = 1", &[]).await?;
    let recorded: i32 = rows
        .first()
        .map(|r| r.get(0))
        .ok_or_else(|| StoreError::Database("no deployment row after recording one".into()))?;
    u32::try_from(recorded).map_err(|_| StoreError::Database(format!("bad shard count {recorded}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod plan_tests {
    use super::*;

    /// The plan PostgreSQL uses for `sql` as a prepared statement (generic plans forced by the
    /// caller), executed with `args`.
    async fn generic_plan(c: &tokio_postgres::Client, name: &str, sql: &str, args: &str) -> String {
        c.batch_execute(&format!("PREPARE {name} AS {sql}"))
            .await
            .expect("prepare");
        let plan: Vec<String> = c
            .query(&format!("EXPLAIN EXECUTE {name}{args}"), &[])
            .await
            .expect("explain")
            .iter()
            .map(|r| r.get(0))
            .collect();
        plan.join("\n")
    }

    /// The liveness gate is evaluated once per statement, even though it reads the clock (a
    /// volatile function): as a per-row filter, a refused claim or relay poll would walk all
    /// its candidates to return nothing. Generic plans, as the store runs them.
    // Multi-threaded: the schema guard's drop blocks this thread while the pool's connection
    // task must go on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_liveness_gate_is_a_one_time_filter() {
        let Ok(url) = std::env::var("CAMPANILE_TEST_PG_URL") else {
            eprintln!("skipped: CAMPANILE_TEST_PG_URL is not set (PostgreSQL plan test)");
            return;
        };
        let schema = format!("t_{}", Uuid::now_v7().simple());
        let store = crate::PgStore::connect_with(
            &url,
            crate::PgOptions {
                schema: Some(schema),
                pool_size: 1,
            },
        )
        .await
        .expect("connect");
        let _drop = store.drop_schema_on_drop();
        let c = store.client().await.expect("client");
        c.batch_execute("SET plan_cache_mode = force_generic_plan")
            .await
            .expect("generic plans");
        for (name, sql, args) in [
            ("relay_due", &*RELAY_DUE, "(0, 10, NULL)"),
            (
                "fast_claim",
                &*FAST_CLAIM,
                "(1, 'q', 0, 10, 'w', NULL, NULL, NULL, 8388608)",
            ),
            (
                "constrained_schedules",
                &*CONSTRAINED_SCHEDULES,
                "(1, 'q', 0, 10, NULL)",
            ),
            (
                "constrained",
                &*CONSTRAINED_CANDIDATES,
                "(1, 'q', 0, 10, NULL, ARRAY[]::uuid[])",
            ),
        ] {
            let plan = generic_plan(&c, name, sql, args).await;
            assert!(plan.contains("One-Time Filter"), "{name}:\n{plan}");
            assert!(
                !plan.contains("clock_timestamp"),
                "{name}, gate per row:\n{plan}"
            );
        }
        // The per-candidate overlap question seeks partial indexes (on empty tables the
        // planner picks either running index; the waiting question has one of its own).
        let plan = generic_plan(
            &c,
            "overlap_state",
            OVERLAP_STATE,
            "(gen_random_uuid(), 1, 0, 0, 0, 'q')",
        )
        .await;
        eprintln!("overlap state:\n{plan}");
        for index in [
            "occurrences_pending_constrained_schedule",
            "occurrences_ran_constrained_schedule",
        ] {
            assert!(plan.contains(index), "overlap state, {index}:\n{plan}");
        }
        // The key (schedule_id, scheduled_for, version) is the schedule's whole history.
        assert!(
            !plan.contains("Seq Scan") && !plan.contains("occurrences_key "),
            "overlap state:\n{plan}"
        );
        // A listing across schedules reads the id index in order (ids lead with their planned
        // instant), so a page stops at its limit instead of sorting the range first.
        let plan = generic_plan(
            &c,
            "listing",
            "SELECT seq FROM occurrences WHERE tenant_id = $1 AND scheduled_for >= $2
                AND scheduled_for < $3 AND id >= $4 AND id < $5 ORDER BY id LIMIT $6",
            "(1, 0, 10, gen_random_uuid(), gen_random_uuid(), 10)",
        )
        .await;
        eprintln!("listing:\n{plan}");
        assert!(plan.contains("occurrences_id_key"), "listing:\n{plan}");
        assert!(!plan.contains("Sort"), "listing:\n{plan}");
    }
}
