//! The planner loop and the recovery sweep in real time, on the system clock.

use std::time::{Duration, Instant};

use campanile_calendar::DstPolicy;
use campanile_core::OccurrenceState;
use campanile_planner::{Engine, PlannerConfig, SweepConfig};
use campanile_store::*;
use jiff::{SignedDuration, Timestamp};

use crate::harness::*;

async fn wait_for<F: std::future::Future<Output = bool>>(mut f: impl FnMut() -> F, what: &str) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn engine_plans_and_sweeps_in_real_time(env: Env) {
    let mut cfg = PlannerConfig::new("live");
    cfg.shards = 4; // as the harness's Schedules spreads them
    cfg.horizon = SignedDuration::from_secs(3);
    let engine = Engine::start(
        env.store.clone(),
        cfg,
        SweepConfig {
            interval: Duration::from_millis(100),
            batch: 100,
        },
    );
    let mut sp = cron("* * * * * *", "UTC", DstPolicy::default());
    sp.max_attempts = 5;
    let id = schedules(&env)
        .create(env.tenant, sp, None)
        .await
        .unwrap()
        .record
        .id;
    engine.planner().notify();
    // Planned ahead by the loop, without a tick from the test.
    wait_for(
        || async { occurrences(&env, id).await.len() >= 3 },
        "the planner loop to plan",
    )
    .await;
    // Claim one with a 1 s lease and abandon it: the sweep puts it back.
    let claimed = loop {
        let c = env
            .store
            .occurrence_claim(OccurrenceClaim {
                max_bytes: None,
                tenant: env.tenant,
                queue: "jobs".into(),
                worker_id: "ghost".into(),
                max: 1,
                lease: Some(SignedDuration::from_secs(1)),
                key: None,
                now: None,
            })
            .await
            .unwrap();
        if let Some(c) = c.into_iter().next() {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    wait_for(
        || async {
            let d = env
                .store
                .occurrence_get(OccurrenceGet {
                    tenant: env.tenant,
                    key: OccurrenceKey::Id(claimed.id),
                    now: None,
                })
                .await
                .unwrap()
                .unwrap();
            d.attempts
                .first()
                .is_some_and(|a| a.outcome == AttemptOutcome::LeaseExpired)
                && d.occurrence.state != OccurrenceState::Running
        },
        "the sweep to recover the abandoned lease",
    )
    .await;
    // It keeps planning as time passes.
    let horizon_end = |occ: &[Occurrence]| occ.iter().map(|o| o.scheduled_for).max().unwrap();
    let first = horizon_end(&occurrences(&env, id).await);
    wait_for(
        || async { horizon_end(&occurrences(&env, id).await) > first },
        "planning to keep going",
    )
    .await;
    let latest = horizon_end(&occurrences(&env, id).await);
    assert!(
        latest
            <= Timestamp::now()
                .checked_add(SignedDuration::from_secs(4))
                .unwrap(),
        "never beyond the horizon"
    );
    engine.shutdown().await;
    // Shutdown released the shards: another node takes them at once.
    let other = planner(&env, "next");
    assert_eq!(other.tick(None).await.unwrap().shards, 4);
}
crate::both!(engine_plans_and_sweeps_in_real_time);

/// A running node stays live (it hands out work) through its own renewal cadence, from its
/// first pass on, and is no longer live once it has stopped and given up its mark.
async fn a_running_node_stays_live_through_its_renewals(env: Env) {
    let mut cfg = PlannerConfig::new("live");
    cfg.shards = 4;
    cfg.shard_lease = SignedDuration::from_millis(900);
    let engine = Engine::start_after_first_pass(env.store.clone(), cfg, SweepConfig::default())
        .await
        .unwrap();
    let planner = engine.planner().clone();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        assert!(planner.is_live(), "lapsed after {:?}", start.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    engine.shutdown().await;
    assert!(!planner.is_live(), "a stopped node hands out nothing");
}
crate::both!(a_running_node_stays_live_through_its_renewals);
