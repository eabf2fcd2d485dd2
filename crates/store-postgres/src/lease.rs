//! Leases: renewals and the sweep of expired ones.

use campanile_store::fence::{self, FenceView};
use campanile_store::upgrade::CLOSE_RUNNING_ATTEMPT_ROW;
use campanile_store::*;
use deadpool_postgres::Client;
use std::collections::HashMap;
use uuid::Uuid;

use crate::db::{R, dur_ms, query, resolve_now, ts};
use crate::fenced::{FENCE_COLS, fence_view};

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
pub(crate) static LEASE_SWEEP: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
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
