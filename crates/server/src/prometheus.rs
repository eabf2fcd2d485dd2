//! The node's Prometheus metrics: every series it exports, registered with its help text.

use std::sync::OnceLock;

use campanile_store::Quota;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Installs the process-wide Prometheus recorder (once), so that what a node does before it
/// serves (its first planning pass) is counted.
pub fn install_metrics() {
    let _ = metrics_handle();
}

/// This process's metrics in the Prometheus text format, as `/metrics` serves them (for an
/// embedding program such as `campanile bench`).
pub fn metrics_text() -> String {
    metrics_handle().render()
}

/// The process-wide Prometheus recorder (installed once).
pub(crate) fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let lag_buckets = [
                0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
            ];
            // A histogram series not observed for 15 minutes is dropped from the exposition
            // (and starts again from zero if it comes back): the `tenant_class` label's values
            // are then those of classes active lately, not every class the node ever saw
            // (renamed classes would otherwise add series until a restart).
            let recorder = PrometheusBuilder::new()
                .idle_timeout(
                    metrics_util::MetricKindMask::HISTOGRAM,
                    Some(std::time::Duration::from_secs(15 * 60)),
                )
                .set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Suffix("_lag_seconds".into()),
                    &lag_buckets,
                )
                .map(|b| b.build_recorder())
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
            let handle = recorder.handle();
            // Another recorder may already be installed (tests embedding several servers).
            let _ = metrics::set_global_recorder(recorder);
            register_metrics();
            handle
        })
        .clone()
}

/// Every metric Campanile exports, described and present from the start (at zero), so that
/// dashboards and alerts see them before the first event. Label sets are bounded: no tenant
/// or occurrence ids.
pub const METRICS: &[(&str, &str)] = &[
    (
        "campanile_occurrences_planned_total",
        "Occurrences materialized by the planner.",
    ),
    (
        "campanile_occurrences_claimed_total",
        "Occurrences handed to workers.",
    ),
    (
        "campanile_occurrences_replayed_total",
        "Occurrences answered again to a claim sent again with its key after its answer was lost (not counted again as claimed).",
    ),
    (
        "campanile_occurrences_completed_total",
        "Completions accepted.",
    ),
    (
        "campanile_occurrences_failed_total",
        "Failures accepted (transient and permanent).",
    ),
    (
        "campanile_occurrences_retried_total",
        "Transient failures scheduled for another attempt.",
    ),
    (
        "campanile_occurrences_dead_total",
        "Occurrences that became dead letters.",
    ),
    (
        "campanile_occurrences_missed_total",
        "Instants recorded as MISSED by the misfire policy.",
    ),
    (
        "campanile_occurrences_canceled_total",
        "Unclaimed occurrences canceled by a schedule change.",
    ),
    (
        "campanile_occurrences_backfilled_total",
        "Occurrences a backfill made, or made READY again after they were MISSED.",
    ),
    (
        "campanile_stale_completions_refused_total",
        "Completions or failures refused by the fence.",
    ),
    (
        "campanile_leases_expired_total",
        "Leases that ran out (found by the recovery sweep).",
    ),
    (
        "campanile_leases_recovered_total",
        "Expired leases returned to READY.",
    ),
    (
        "campanile_lease_renewals_failed_total",
        "Leases a worker asked to renew that were already lost.",
    ),
    (
        "campanile_throttled_requests_total",
        "Requests refused by a quota (429), by quota (max_active_schedules, max_triggers_per_sec).",
    ),
    (
        "campanile_occurrences_skipped_overlap_total",
        "Occurrences skipped at claim time because their schedule was still running (SKIP_IF_RUNNING).",
    ),
    (
        "campanile_relay_publish_failures_total",
        "Publishes to an external target (NATS JetStream) that failed; recorded as failed attempts.",
    ),
    (
        "campanile_planner_shards_held",
        "Planner shards held by this node.",
    ),
    (
        "campanile_planner_consecutive_failed_passes",
        "Planning passes in a row that failed to plan all of one of this node's shards (the worst shard; 0 when the last pass planned everything).",
    ),
    (
        "campanile_planner_schedules_isolated_total",
        "Schedules left out of a planning pass because committing them failed (the rest of their batch was planned; they are tried again next pass).",
    ),
    (
        "campanile_due_backlog",
        "Occurrences due and not claimed, all tenants (counted up to 1,000,000; sampled every 10 s).",
    ),
    (
        "campanile_due_backlog_oldest_age_seconds",
        "How long the longest-waiting due occurrence has been available (sampled every 10 s).",
    ),
    (
        "campanile_backlog_sampled_timestamp_seconds",
        "When the backlog gauges were last sampled (Unix seconds): they keep their last value while sampling fails, e.g. in a database outage.",
    ),
    (
        "campanile_outbox_backlog",
        "Outbox rows due for the relay and not yet delivered or settled (sampled every 10 s).",
    ),
    (
        "campanile_retention_archived_total",
        "Finished occurrences written to the retention archive (none when the archive is off).",
    ),
    (
        "campanile_retention_removed_total",
        "Finished occurrences removed from the hot store by retention (each archived first, and counted in the rollups).",
    ),
    (
        "campanile_retention_abandoned_batches_total",
        "Retention batches given up because an occurrence in them changed (a redrive) after it was archived; their archive files are deleted and the rest is chosen again.",
    ),
    (
        "campanile_retention_days_dropped_total",
        "Days of occurrences taken out whole by retention (PostgreSQL): archived, survivors moved to the default partition, partition dropped.",
    ),
    (
        "campanile_retention_days_held_total",
        "Attempts to take a day out whole that found work or a delivery still pending in it (PostgreSQL); the day is then left to row-by-row retention.",
    ),
    (
        "campanile_retention_failures_total",
        "Retention passes that failed (archive not writable, database errors); nothing is removed by a failed pass.",
    ),
    (
        "campanile_retention_oldest_age_seconds",
        "Age of the oldest occurrence in the hot store, by its planned instant (sampled after each retention pass): levels off at the retention when retention keeps up.",
    ),
    (
        "campanile_schedule_lag_seconds",
        "visible_at - scheduled_for of planned occurrences, by tenant class.",
    ),
    (
        "campanile_claim_lag_seconds",
        "claimed_at - available_at of claimed occurrences, by tenant class.",
    ),
];

pub(crate) fn register_metrics() {
    for (name, help) in METRICS {
        let name: &'static str = name;
        if name.ends_with("_lag_seconds") {
            metrics::describe_histogram!(name, metrics::Unit::Seconds, *help);
        } else if name == "campanile_throttled_requests_total" {
            // One series per quota that refuses requests, each from zero.
            metrics::describe_counter!(name, *help);
            for quota in Quota::ALL {
                metrics::counter!(name, "quota" => quota.as_str()).absolute(0);
            }
        } else if name.ends_with("_total") {
            metrics::describe_counter!(name, *help);
            metrics::counter!(name).absolute(0);
        } else {
            metrics::describe_gauge!(name, *help);
            metrics::gauge!(name).set(0.0);
        }
    }
}
