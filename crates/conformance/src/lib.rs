//! The conformance suite: behaviour every store backend must show, run by each backend's tests
//! through [`conformance_tests!`]. Organised by what the store does: claims (`claim`), their
//! answers' size (`answers`), reports and fencing (`fencing`), races between workers (`races`),
//! the relay (`relay`), resumes after an outage (`resume`), crashes (`crash`) and retention (`retention`).
//!
//! Everything here steps time explicitly (`now: Some(..)`), so lease expiry is exact.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod answers;
mod backfill;
mod claims;
mod crash;
mod fencing;
mod outcomes;
mod races;
mod records;
mod relay;
mod resent;
mod resume;
mod retention;

pub use answers::*;
pub use backfill::*;
pub use claims::*;
pub use crash::*;
pub use fencing::*;
pub use outcomes::*;
pub use races::*;
pub use records::*;
pub use relay::*;
pub use resent::*;
pub use resume::*;
pub use retention::*;

use std::sync::Arc;

use campanile_core::{OccurrenceId, OccurrenceState, ScheduleId, occurrence_id};
use jiff::{SignedDuration, Timestamp};
use uuid::Uuid;

use campanile_store::*;

/// A store under test, plus whatever keeps its database alive (a temp dir, a schema).
pub struct Harness {
    pub store: Arc<dyn Store>,
    pub guard: Box<dyn std::any::Any + Send + Sync>,
}

/// Instantiates every conformance test for a backend. `$factory` is an `async fn() ->
/// Option<Harness>`; `None` skips the test (e.g. PostgreSQL not configured).
#[macro_export]
macro_rules! conformance_tests {
    ($factory:path) => {
        $crate::conformance_tests!(@each $factory;
            reference_scenario, lease_boundaries_to_the_millisecond, due_boundary,
            max_attempts_boundary, transient_failure_backs_off_then_retries,
            permanent_failure_is_dead_and_redrive_keeps_history, cancel_pending_and_running,
            a_canceled_run_that_fails_is_not_retried,
            sweep_is_bounded_and_counts_attempts, duplicate_keys_are_ignored,
            tenants_are_isolated, list_filters_and_cursor, renew_reports_lost_leases,
            a_redriven_occurrence_is_held_by_no_worker,
            claim_orders_by_priority_then_availability, batch_finish_fences_each_item,
            racing_workers_never_overwrite_a_successor, quotas_and_queue_limits_cap_claims,
            backlog_counts_due_unclaimed_work, the_first_shard_count_recorded_is_kept,
            relay_claims_due_outbox_work_across_tenants,
            relay_lease_expiry_hands_over_and_fences_the_stale_relay,
            relay_retries_settles_cancels_and_reopens_on_redrive,
            attempt_history_records_every_attempt_exactly, constrained_lease_expiry_is_reclaimed,
            a_lone_worker_keeps_overlap_policies, overlap_history_is_the_runs_themselves,
            simultaneous_claimers_and_reporters_keep_their_own_terms,
            renewals_and_reports_of_the_same_leases_never_deadlock,
            claims_and_renewals_without_a_lease_grant_each_occurrences_own,
            resume_judges_what_came_due_while_no_node_was_alive,
            claims_wait_for_the_first_node_back_after_an_outage, tenant_classes_are_bounded,
            racing_claimers_keep_overlap_policies,
            idempotency_reservations_are_taken_over_only_when_nothing_was_created,
            reports_that_claim_more_work_run_each_occurrence_once,
            a_claim_sent_again_answers_what_it_claimed, a_claim_answer_keeps_to_its_size_bound,
            requests_breaking_the_rules_are_refused_by_every_backend,
            retention_takes_exactly_the_eligible_occurrences,
            a_retention_batch_left_open_is_finished_not_chosen_again,
            a_retention_batch_with_a_redriven_occurrence_is_given_up,
            retention_steps_over_kept_history_a_window_at_a_time,
            a_triggered_schedule_runs_once_now_and_its_key_answers_again,
            a_triggered_run_carries_its_own_payload,
            catch_up_slots_are_shared_by_every_reservation,
            a_backfill_makes_each_missing_instant_once_at_the_tenant_pace,
            an_outage_check_leaves_operators_runs_alone);
    };
    (@each $factory:path; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                let rt = ::tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(4)
                    .enable_all()
                    .build()
                    .expect("runtime");
                let Some(h) = rt.block_on($factory()) else { return };
                $crate::$name(&rt, h);
            }
        )*
    };
}

pub(crate) const T0: i64 = 1_800_000_000_000; // 2027-01-15T08:00:00Z

pub(crate) fn at(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(T0 + ms).unwrap()
}

pub fn secs(s: i64) -> Timestamp {
    at(s * 1000)
}

pub fn spec(queue: &str) -> ScheduleSpec {
    ScheduleSpec {
        timing: Timing::At(secs(10)),
        queue: queue.into(),
        payload: Some("{\"report\":\"daily\"}".into()),
        priority: 0,
        lease: SignedDuration::from_secs(5),
        max_attempts: 3,
        backoff_initial: SignedDuration::from_secs(1),
        backoff_max: SignedDuration::from_secs(60),
        misfire: campanile_core::Misfire::default(),
        overlap: campanile_core::Overlap::Allow,
        flex_window: SignedDuration::ZERO,
    }
}

/// A tenant and a schedule to hang occurrences on.
pub struct Fixture {
    pub tenant: TenantId,
    pub schedule: ScheduleId,
}

pub async fn fixture(store: &dyn Store, name: &str, queue: &str) -> Fixture {
    let tenant = store
        .tenant_create(TenantCreate {
            name: name.into(),
            now: Some(at(0)),
        })
        .await
        .expect("tenant")
        .id;
    let schedule = new_schedule(store, tenant, queue).await;
    Fixture { tenant, schedule }
}

/// A new schedule of `tenant` (the spec of [`spec`]) to hang occurrences on.
pub(crate) async fn new_schedule(store: &dyn Store, tenant: TenantId, queue: &str) -> ScheduleId {
    let schedule = ScheduleId(Uuid::now_v7());
    store
        .schedule_create(ScheduleCreate {
            tenant,
            id: schedule,
            spec: spec(queue),
            shard: 0,
            next_run_at: None,
            fires_per_hour: 0,
            idempotency: None,
            now: Some(at(0)),
        })
        .await
        .expect("schedule");
    schedule
}

/// Every occurrence of `schedule`, in the list's order.
pub(crate) async fn schedule_occurrences(
    store: &dyn Store,
    tenant: TenantId,
    schedule: ScheduleId,
) -> Vec<Occurrence> {
    store
        .occurrence_list(OccurrenceList {
            tenant,
            schedule_id: Some(schedule),
            limit: 1000,
            ..Default::default()
        })
        .await
        .expect("list")
}

pub fn new_occ(f: &Fixture, queue: &str, due: Timestamp, max_attempts: u32) -> NewOccurrence {
    NewOccurrence {
        schedule_id: f.schedule,
        version: 1,
        scheduled_for: due,
        available_at: due,
        queue: queue.into(),
        priority: 0,
        max_attempts,
        backoff_initial: SignedDuration::from_secs(1),
        backoff_max: SignedDuration::from_secs(60),
        state: OccurrenceState::Ready,
        overlap: campanile_core::Overlap::Allow,
        lease: SignedDuration::from_secs(30),
    }
}

pub async fn insert(
    store: &dyn Store,
    f: &Fixture,
    items: Vec<NewOccurrence>,
) -> Vec<OccurrenceId> {
    let ids = items
        .iter()
        .map(|o| occurrence_id(o.schedule_id, o.version, o.scheduled_for))
        .collect();
    store
        .occurrence_insert_many(OccurrenceInsertMany {
            tenant: f.tenant,
            items,
            now: Some(at(0)),
        })
        .await
        .expect("insert");
    ids
}

/// Every occurrence `list` names, walked page by page with the cursor (each page `list.limit`
/// long), in the order the pages give them.
pub(crate) async fn list_pages(store: &dyn Store, list: OccurrenceList) -> Vec<Occurrence> {
    let mut all = Vec::new();
    let mut after = list.after;
    loop {
        let page = store
            .occurrence_list(OccurrenceList {
                after,
                ..list.clone()
            })
            .await
            .expect("list");
        let Some(last) = page.last() else {
            return all;
        };
        after = Some((last.scheduled_for, last.id));
        all.extend(page);
    }
}

pub(crate) async fn claim(
    store: &dyn Store,
    f: &Fixture,
    queue: &str,
    worker: &str,
    max: u32,
    lease_s: i64,
    now: Timestamp,
) -> Vec<Claimed> {
    let lease = Some(SignedDuration::from_secs(lease_s));
    claim_leased(store, f, queue, worker, max, lease, now).await
}

/// [`claim`] with the lease as the API takes it: `None` grants each occurrence its own.
pub(crate) async fn claim_leased(
    store: &dyn Store,
    f: &Fixture,
    queue: &str,
    worker: &str,
    max: u32,
    lease: Option<SignedDuration>,
    now: Timestamp,
) -> Vec<Claimed> {
    store
        .occurrence_claim(claim_params(f, queue, worker, max, lease, None, now))
        .await
        .expect("claim")
}

/// The params of a claim at `now`.
pub fn claim_params(
    f: &Fixture,
    queue: &str,
    worker: &str,
    max: u32,
    lease: Option<SignedDuration>,
    key: Option<ClaimKey>,
    now: Timestamp,
) -> OccurrenceClaim {
    OccurrenceClaim {
        max_bytes: None,
        tenant: f.tenant,
        queue: queue.into(),
        worker_id: worker.into(),
        max,
        lease,
        key,
        now: Some(now),
    }
}

pub(crate) async fn finish(
    store: &dyn Store,
    f: &Fixture,
    worker: &str,
    id: OccurrenceId,
    epoch: i64,
    finish: Finish,
    now: Timestamp,
) -> Ack {
    let mut acks = store
        .occurrence_finish_many(OccurrenceFinishMany {
            tenant: f.tenant,
            worker_id: worker.into(),
            items: vec![FinishItem {
                lease: LeaseRef {
                    occurrence_id: id,
                    epoch,
                },
                finish,
            }],
            now: Some(now),
        })
        .await
        .expect("finish");
    assert_eq!(acks.len(), 1);
    acks.remove(0)
}

/// Renews one lease.
pub(crate) async fn renew(
    store: &dyn Store,
    tenant: TenantId,
    worker: &str,
    id: OccurrenceId,
    epoch: i64,
    lease_s: i64,
    now: Timestamp,
) -> Renewal {
    let mut r = store
        .lease_renew(LeaseRenew {
            tenant,
            worker_id: worker.into(),
            leases: vec![LeaseRef {
                occurrence_id: id,
                epoch,
            }],
            lease: Some(SignedDuration::from_secs(lease_s)),
            now: Some(now),
        })
        .await
        .expect("renew");
    assert_eq!(r.len(), 1);
    r.remove(0)
}

pub(crate) fn ok(result: &str) -> Finish {
    Finish::Succeeded {
        result: Some(result.into()),
    }
}

pub(crate) async fn get(
    store: &dyn Store,
    f: &Fixture,
    id: OccurrenceId,
    now: Timestamp,
) -> OccurrenceDetail {
    store
        .occurrence_get(OccurrenceGet {
            tenant: f.tenant,
            key: OccurrenceKey::Id(id),
            now: Some(now),
        })
        .await
        .expect("get")
        .expect("occurrence exists")
}
