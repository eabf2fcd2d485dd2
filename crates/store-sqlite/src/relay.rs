//! The relay's claim of due outbox rows across tenants.

use campanile_core::OccurrenceState;
use campanile_store::fence::{self, FenceView};
use campanile_store::*;
use rusqlite::{Connection, params};

use crate::claim::{ClaimRow, claim_rows, finish_claim};
use crate::db::{R, db_err, dur_ms};
use crate::fenced::{fence_of, hands_out_work, raw_fence};

/// One due outbox row with its occurrence: `(outbox seq, tenant, target, fence view, row)`.
pub(crate) type RelayRow = (i64, i64, String, FenceView, ClaimRow);

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
