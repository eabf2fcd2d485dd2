//! The relay's claim of due outbox rows across tenants.

use campanile_store::fence::{self};
use campanile_store::*;
use deadpool_postgres::{Client, GenericClient};

use crate::claimed::claim_ids;
use crate::db::{R, dur_ms, execute, pg_err, query, resolve_now};
use crate::fenced::fence_view;

/// The relay's due outbox rows with their occurrences, locked: `$1` now, `$2` how many, `$3`
/// the caller's instant or NULL (for the liveness gate). The occurrence's columns first, in
/// order `fence_view` reads. Nothing while no node is live: the relay is a node's
/// own and waits, as its node's claims do.
pub(crate) const RELAY_DUE: &str = include_str!("sql/relay_due.sql");

pub(crate) async fn relay_claim(c: &mut Client, p: RelayClaim) -> R<Vec<Relayed>> {
    let now = resolve_now(c, p.now).await?;
    // Read a little more than `max`: rows to settle or postpone are handled on the way.
    let scan = i64::from(p.max).saturating_mul(2).max(16);
    let tx = c.transaction().await.map_err(pg_err)?;
    // Both rows locked, skipping what another relay holds: the decision below is atomic with
    // the occurrence's state (a cancel, the recovery sweep) across nodes.
    let fixed = p.now.map(|t| t.as_millisecond());
    let due = query(&tx, RELAY_DUE, &[&now, &scan, &fixed]).await?;
    let (mut settle_seqs, mut settle_states) = (Vec::new(), Vec::new());
    let (mut later_seqs, mut later_ats) = (Vec::new(), Vec::new());
    let (mut pick_oseqs, mut pick_ids) = (Vec::new(), Vec::new());
    let mut routes = RelayRoutes::new();
    for r in &due {
        let (_, id, view) = fence_view(r)?;
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
            fence::RelayStep::Claim if pick_ids.len() < p.max as usize => {
                pick_oseqs.push(oseq);
                pick_ids.push(id);
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
    let rows = if pick_ids.is_empty() {
        Vec::new()
    } else {
        execute(
            &tx,
            "UPDATE outbox SET attempts = attempts + 1 WHERE seq = ANY($1)",
            &[&pick_oseqs],
        )
        .await?;
        claim_ids(&tx, &pick_ids, &p.node, None, now, Some(dur_ms(p.lease))).await?
    };
    if rows.len() != pick_ids.len() {
        return Err(StoreError::Database(format!(
            "relay claimed {} of {} locked occurrences",
            rows.len(),
            pick_ids.len()
        )));
    }
    let out = Relayed::pair(rows, routes)?;
    tx.commit().await.map_err(pg_err)?;
    Ok(out)
}
