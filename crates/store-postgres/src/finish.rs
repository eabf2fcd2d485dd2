//! Reports: outcomes fenced by owner, epoch and lease (shared statements for batches of
//! successes, a report that claims), cancel and redrive.

use std::collections::HashMap;

use campanile_core::{OccurrenceId, OccurrenceState};
use campanile_store::fence::{self, FenceView, reported};
use campanile_store::*;
use deadpool_postgres::{Client, GenericClient, Pool};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::claim::{SHARED_CLAIM_ROWS, WORKER_CLAIM, WorkerClaim, dealt_claims, worker_claim_rows};
use crate::coalesce::Batch;
use crate::db::{R, execute, pg_err, pool_err, query, refused, resolve_now, ts};
use crate::fenced::fence_view;

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
pub(crate) const FINISH_SUCCESSES: &str = "
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
              WHERE o.seq = cur.seq AND o.id = cur.id AND cur.state = 'RUNNING' AND cur.owner = cur.worker AND cur.epoch = cur.sent
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
pub(crate) const SHARED_SUCCESSES: usize = 4096;

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
        c.prepare_cached(WORKER_CLAIM).await.map_err(pg_err)?;
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
pub(crate) async fn finish_successes<C: GenericClient>(
    c: &C,
    reqs: &[OccurrenceFinishMany],
) -> R<Vec<Vec<Ack>>> {
    let rows = success_rows(c, reqs).await?;
    success_acks(reqs, &rows)
}

/// The rows of the success statement for `reqs` (none for no request).
pub(crate) async fn success_rows<C: GenericClient>(
    c: &C,
    reqs: &[OccurrenceFinishMany],
) -> R<Vec<Row>> {
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
pub(crate) fn success_acks(reqs: &[OccurrenceFinishMany], rows: &[Row]) -> R<Vec<Vec<Ack>>> {
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
/// and message, `$7` the seqs written, `$8` the ids (in the order of `$1`).
pub(crate) const RECORD_ENDED_ATTEMPTS: &str = include_str!("sql/record_ended_attempts.sql");

/// The fencing columns of a batch's occurrences (`$2`) and whether each is asked to cancel, locked in seq order.
pub(crate) const FINISH_LOCK_ITEMS: &str = include_str!("sql/finish_lock_items.sql");

/// The accepted items of [`occurrence_finish_many`], written if the fence still holds: `$1`
/// seqs, `$2` epochs, `$3` states, `$4` results, `$5` availabilities, `$6` finish instants,
/// `$7`/`$8` error class and message, `$9` the worker, `$10` now, `$11` the ids (in the order
/// of `$1`). Returns the seqs written.
pub(crate) const FINISH_WRITE: &str = "UPDATE occurrences o
    SET state = u.state, result = COALESCE(u.result, o.result), available_at = u.available_at,
        finished_at = u.finished_at, last_error_class = COALESCE(u.class, o.last_error_class),
        last_error = COALESCE(u.message, o.last_error), ran_until = $10
   FROM unnest($1::int8[], $2::int8[], $3::text[], $4::text[], $5::int8[], $6::int8[], $7::text[],
               $8::text[], $11::uuid[])
        AS u(seq, epoch, state, result, available_at, finished_at, class, message, id)
  WHERE o.id = u.id AND o.seq = u.seq AND o.state = 'RUNNING' AND o.owner = $9 AND o.epoch = u.epoch
    AND o.lease_until > $10
 RETURNING o.seq";

/// A batch with failures, or naming an occurrence twice, item by item in one transaction
/// (batches of successes go through [`SuccessBatch`]).
pub(crate) async fn occurrence_finish_many(c: &mut Client, p: OccurrenceFinishMany) -> R<Vec<Ack>> {
    let tx = c.transaction().await.map_err(pg_err)?;
    let now = resolve_now(&tx, p.now).await?;
    let ids: Vec<Uuid> = p.items.iter().map(|i| i.lease.occurrence_id.0).collect();
    // Lock the rows, decide each item with the shared fence, then write all accepted items in
    // one conditional UPDATE whose returned rows are the acknowledgements.
    let rows = query(&tx, FINISH_LOCK_ITEMS, &[&p.tenant.0, &ids]).await?;
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
        let ids: Vec<Uuid> = plans
            .iter()
            .map(|(i, _, _)| p.items[*i].lease.occurrence_id.0)
            .collect();
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
            FINISH_WRITE,
            &[
                &seqs,
                &epochs,
                &states,
                &results,
                &avail,
                &finished,
                &classes,
                &messages,
                &p.worker_id,
                &now,
                &ids,
            ],
        )
        .await?;
        let written: std::collections::HashSet<i64> = written.iter().map(|r| r.get(0)).collect();
        // The attempts that ended otherwise than in success get their rows, from the occurrence
        // rows just written (a success stays on its occurrence row).
        execute(
            &tx,
            RECORD_ENDED_ATTEMPTS,
            &[
                &seqs,
                &epochs,
                &outcomes,
                &now,
                &classes,
                &messages,
                &written.iter().copied().collect::<Vec<i64>>(),
                &ids,
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

/// The fencing columns of a tenant's occurrence (`$2`), locked, for a cancel.
pub(crate) const CANCEL_LOCK_ITEM: &str = include_str!("sql/cancel_lock_item.sql");

pub(crate) async fn occurrence_cancel(c: &mut Client, p: OccurrenceCancel) -> R<Ack> {
    let tx = c.transaction().await.map_err(pg_err)?;
    let now = resolve_now(&tx, p.now).await?;
    let id = p.occurrence_id;
    let rows = query(&tx, CANCEL_LOCK_ITEM, &[&p.tenant.0, &id.0]).await?;
    let Some(row) = rows.first() else {
        return Ok(refused(id, Conflict::NotFound));
    };
    let (_, _, view) = fence_view(row)?;
    let (n, state) = match view.state {
        OccurrenceState::Ready | OccurrenceState::RetryWait => (
            execute(&tx, "UPDATE occurrences SET state = 'CANCELED', finished_at = $2 WHERE id = $1 AND state IN ('READY', 'RETRY_WAIT')", &[&id.0, &now]).await?,
            OccurrenceState::Canceled,
        ),
        OccurrenceState::Running => (
            execute(&tx, "UPDATE occurrences SET cancel_requested = true WHERE id = $1 AND state = 'RUNNING'", &[&id.0]).await?,
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

/// The fencing columns of a tenant's occurrence (`$2`) after a redrive.
pub(crate) const REDRIVE_ITEM: &str = include_str!("sql/redrive_item.sql");

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
    let rows = query(c, REDRIVE_ITEM, &[&p.tenant.0, &id.0]).await?;
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
