//! Leases: renewals and the sweep of expired ones.

use std::collections::HashMap;

use campanile_store::fence::{self, FenceView};
use campanile_store::*;
use deadpool_postgres::Client;
use uuid::Uuid;

use crate::db::{R, dur_ms, query, resolve_now, ts};
use crate::fenced::fence_view;

/// The fencing columns of the occurrences (`$2`) whose renewal was refused.
pub(crate) const RENEW_LOST_VIEWS: &str = include_str!("sql/renew_lost_views.sql");

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
                  SELECT o.seq, o.id, l.epoch AS sent FROM occurrences o JOIN l ON o.id = l.id
                   WHERE o.tenant_id = $1
                   ORDER BY o.seq
                     FOR UPDATE OF o)
         UPDATE occurrences o SET lease_until = $3 + COALESCE($5::int8, o.lease_ms)
           FROM cur
          WHERE o.seq = cur.seq AND o.id = cur.id AND o.epoch = cur.sent AND o.owner = $2
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
        query(c, RENEW_LOST_VIEWS, &[&p.tenant.0, &lost])
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
    let rows = query(c, LEASE_SWEEP, &[&now, &limit]).await?;
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
pub(crate) const LEASE_SWEEP: &str = include_str!("sql/lease_sweep.sql");
