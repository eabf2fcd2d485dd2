//! Reports: outcomes fenced by owner, epoch and lease; cancel and redrive.

use std::collections::HashMap;

use campanile_core::OccurrenceState;
use campanile_store::fence::{self, reported};
use campanile_store::*;
use rusqlite::{CachedStatement, Connection, params};
use uuid::Uuid;

use crate::attempt::record_attempt;
use crate::db::{R, db_err, refused, ts};
use crate::fenced::fence_row;

/// The row numbers (`seq`) of occurrences the writer's claims handed out, by id, so that a
/// report, which names its occurrences by id, finds each row by its number instead of seeking
/// the id index: the ids of one instant's occurrences follow a hash of their key, not the
/// order a claim takes them in, so at the top of the hour each of those seeks lands on a leaf
/// of the id index at random (BENCHMARKS.md, "Where the gaps are"). An occurrence keeps its
/// number for as long as its row exists, so an entry is never wrong about a row that exists;
/// the update still checks the id, and one that finds no row by the number is looked up by id
/// as before. At most [`RowNumbers::CAP`] entries (emptied when full: what a worker never
/// reports stays only until then); an entry goes when its report is accepted.
#[derive(Debug, Default)]
pub(crate) struct RowNumbers(pub(crate) HashMap<Uuid, i64>);

impl RowNumbers {
    /// Far more than the leases one node's workers hold at once in normal operation; 24 bytes
    /// and a hash entry each (about 8 MiB when full).
    pub(crate) const CAP: usize = 1 << 18;

    /// Notes the numbers of claimed occurrences, `(id, seq)`.
    pub(crate) fn note(&mut self, rows: impl Iterator<Item = (Uuid, i64)>) {
        for (id, seq) in rows {
            if self.0.len() >= Self::CAP {
                self.0.clear();
            }
            self.0.insert(id, seq);
        }
    }
}

pub(crate) fn occurrence_finish_many(
    c: &Connection,
    p: &OccurrenceFinishMany,
    now: i64,
    numbers: &mut RowNumbers,
) -> R<Vec<Ack>> {
    let mut out = Vec::with_capacity(p.items.len());
    // Prepared once for the batch (as the planner's inserts are): a cache lookup and return
    // per item was about 7% of a success's instructions.
    let mut succeed = Succeed {
        by_id: c
            .prepare_cached(
                "UPDATE occurrences SET state = 'SUCCEEDED', result = COALESCE(?1, result), finished_at = ?2,
                        ran_until = ?2
                  WHERE id = ?3 AND tenant_id = ?6 AND state = 'RUNNING' AND owner = ?4 AND epoch = ?5
                    AND lease_until > ?2",
            )
            .map_err(db_err)?,
        by_number: c
            .prepare_cached(
                "UPDATE occurrences SET state = 'SUCCEEDED', result = COALESCE(?1, result), finished_at = ?2,
                        ran_until = ?2
                  WHERE seq = ?7 AND id = ?3 AND tenant_id = ?6 AND state = 'RUNNING' AND owner = ?4
                    AND epoch = ?5 AND lease_until > ?2",
            )
            .map_err(db_err)?,
        numbers,
    };
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

/// A success's fenced write, by row number when the writer knows it, else by id.
pub(crate) struct Succeed<'c, 'n> {
    by_id: CachedStatement<'c>,
    by_number: CachedStatement<'c>,
    numbers: &'n mut RowNumbers,
}

impl Succeed<'_, '_> {
    /// Writes the success if the fence holds; the affected-row count (0 or 1).
    fn write(
        &mut self,
        tenant: TenantId,
        worker: &str,
        id: Uuid,
        epoch: i64,
        result: Option<&str>,
        now: i64,
    ) -> R<usize> {
        if let Some(&seq) = self.numbers.0.get(&id) {
            let rows = self
                .by_number
                .execute(params![result, now, id, worker, epoch, tenant.0, seq])
                .map_err(db_err)?;
            if rows == 1 {
                self.numbers.0.remove(&id);
                return Ok(rows);
            }
        }
        let rows = self
            .by_id
            .execute(params![result, now, id, worker, epoch, tenant.0])
            .map_err(db_err)?;
        if rows == 1 {
            self.numbers.0.remove(&id);
        }
        Ok(rows)
    }
}

pub(crate) fn finish_one(
    c: &Connection,
    succeed: &mut Succeed<'_, '_>,
    tenant: TenantId,
    worker: &str,
    item: &FinishItem,
    now: i64,
) -> R<Ack> {
    let id = item.lease.occurrence_id;
    // A success needs nothing from the row but the fence itself: write first, conditionally,
    // and read the row only to explain a refusal (the slow path below).
    if let Finish::Succeeded { result } = &item.finish {
        let rows = succeed.write(
            tenant,
            worker,
            id.0,
            item.lease.epoch,
            result.as_deref(),
            now,
        )?;
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
    succeed.numbers.0.remove(&id.0);
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
