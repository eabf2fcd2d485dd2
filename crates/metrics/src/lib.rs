//! The occurrence series the edges record (the server as it answers workers, the relay as it
//! delivers), from what the store answered: the store itself records none.

use campanile_core::OccurrenceState;
use campanile_store::{Ack, Claimed};

/// Counts one tenant's claims in the claimed counter and the claim-lag histogram
/// (`claimed_at − available_at`, labelled with the tenant's class), the same for every
/// path that claims (the HTTP API, the relay).
/// An answer given again (`replayed`) was counted when it was claimed: it counts only in
/// `campanile_occurrences_replayed_total`, so a lost answer is seen, not counted twice.
pub fn record_claims<'a>(class: &str, claims: impl Iterator<Item = &'a Claimed>) {
    // One pass, no allocation: this runs for every claim answered.
    let (mut claimed, mut replayed) = (0u64, 0u64);
    let mut lag = None;
    for c in claims {
        if c.replayed {
            replayed += 1;
            continue;
        }
        claimed += 1;
        let ms = (c.claimed_at.as_millisecond() - c.available_at.as_millisecond()).max(0);
        lag.get_or_insert_with(|| {
            metrics::histogram!("campanile_claim_lag_seconds", "tenant_class" => class.to_owned())
        })
        .record(ms as f64 / 1000.0);
    }
    metrics::counter!("campanile_occurrences_claimed_total").increment(claimed);
    if replayed > 0 {
        metrics::counter!("campanile_occurrences_replayed_total").increment(replayed);
    }
}

/// Counts the outcomes of a batch of finishes in the occurrence counters (completed,
/// failed, retried, dead, stale refusals), the same for every path that finishes work
/// (the HTTP API, the relay). `succeeded` says, per ack, whether the worker reported a
/// success ([`campanile_store::Finish::succeeded`]). Returns how many were refused by the fence.
pub fn record_outcomes(acks: &[Ack], succeeded: impl IntoIterator<Item = bool>) -> u64 {
    let mut stale = 0;
    for (a, ok) in acks.iter().zip(succeeded) {
        match a.state {
            Some(OccurrenceState::RetryWait) => {
                metrics::counter!("campanile_occurrences_retried_total").increment(1);
            }
            Some(OccurrenceState::Dead) => {
                metrics::counter!("campanile_occurrences_dead_total").increment(1);
            }
            // A failure reported after a cancel was requested ends the occurrence.
            Some(OccurrenceState::Canceled) => {
                metrics::counter!("campanile_occurrences_canceled_total").increment(1);
            }
            _ => {}
        }
        match (&a.conflict, ok) {
            (Some(_), _) => {
                stale += 1;
                metrics::counter!("campanile_stale_completions_refused_total").increment(1);
            }
            (None, true) => {
                metrics::counter!("campanile_occurrences_completed_total").increment(1);
            }
            (None, false) => {
                metrics::counter!("campanile_occurrences_failed_total").increment(1);
            }
        }
    }
    stale
}
