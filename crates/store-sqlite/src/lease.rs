//! Leases: renewals and the sweep of expired ones.

use std::collections::HashMap;

use campanile_store::fence::{self};
use campanile_store::*;
use rusqlite::{Connection, params};
use uuid::Uuid;

use crate::attempt::record_attempt;
use crate::db::{R, db_err, dur_ms, ts};
use crate::fenced::fence_row;

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
