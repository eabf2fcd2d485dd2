//! Several planners on one database: threads racing, a lost shard lease, a SIGKILLed planner.

use std::sync::Arc;

use campanile_calendar::DstPolicy;
use campanile_store::*;
use jiff::SignedDuration;

use crate::both;
use crate::harness::*;

/// Two and three planners tick concurrently (each on its own thread) with short shard leases
/// that expire between ticks, so shards change hands all the time.
async fn racing_planners_leave_one_occurrence_per_instant(env: Env) {
    for n in [2usize, 3] {
        // Each round on its own day, long after the previous round's leases ended.
        let t0 = plus(ts("2026-06-01T00:00:00Z"), 86_400 * n as i64);
        let s = schedules(&env);
        let mut ids = Vec::new();
        for i in 0..60 {
            let expr = format!("{} * * * *", i % 7);
            ids.push(
                s.create(
                    env.tenant,
                    cron(&expr, "UTC", DstPolicy::default()),
                    Some(t0),
                )
                .await
                .unwrap()
                .record
                .id,
            );
        }
        let planners: Vec<Arc<campanile_planner::Planner>> = (0..n)
            .map(|i| {
                let mut p = planner(&env, &format!("race{n}-{i}"));
                let mut cfg = p.config().clone();
                cfg.shard_lease = SignedDuration::from_secs(20);
                cfg.batch = 7;
                p = campanile_planner::Planner::new(env.store.clone(), cfg);
                Arc::new(p)
            })
            .collect();
        let handle = tokio::runtime::Handle::current();
        let threads: Vec<_> = planners
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let (p, handle) = (p.clone(), handle.clone());
                std::thread::spawn(move || {
                    let mut fenced = 0;
                    for step in 0..40i64 {
                        // Skewed clocks: planner i runs 7 s behind planner 0.
                        let now = plus(t0, step * 30 - 7 * i as i64);
                        fenced += handle.block_on(p.tick(Some(now))).unwrap().fenced;
                    }
                    fenced
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let until = plus(plus(t0, 39 * 30 - 7 * (n as i64 - 1)), 15 * 60);
        for id in ids {
            let got = instants(&env, id).await;
            let want = calendar_instants(&env, id, t0, until).await;
            assert!(
                want.is_subset(&got),
                "{n} planners: missing {:?}",
                want.difference(&got).collect::<Vec<_>>()
            );
            let max_horizon = plus(plus(t0, 39 * 30), 15 * 60);
            assert!(got.iter().all(|t| *t <= max_horizon));
            let all = calendar_instants(&env, id, t0, max_horizon).await;
            assert!(got.is_subset(&all), "only calendar instants");
            assert!(
                env.store
                    .schedule_position(SchedulePosition {
                        tenant: env.tenant,
                        id
                    })
                    .await
                    .unwrap()
                    .unwrap()
                    > *got.iter().last().unwrap(),
                "next_run_at never behind what was planned"
            );
        }
    }
}
both!(racing_planners_leave_one_occurrence_per_instant);

/// A planner whose shard lease passed is fenced: its batch is refused whole, and the node that
/// took the shard plans it.
async fn a_planner_that_lost_its_shard_is_fenced(env: Env) {
    let t0 = ts("2026-06-01T00:00:00Z");
    let id = schedules(&env)
        .create(
            env.tenant,
            cron("* * * * *", "UTC", DstPolicy::default()),
            Some(t0),
        )
        .await
        .unwrap()
        .record
        .id;
    let a = planner_leased(&env, "a", SignedDuration::from_secs(15));
    a.tick(Some(t0)).await.unwrap();
    let held = a.shards_held();
    assert_eq!(held.len(), 4, "a single node holds every shard");
    let shard = campanile_planner::shard_of(id, 4);
    let a_lease = held.iter().find(|l| l.shard == shard).copied().unwrap();
    // A stalls past its lease; B takes the shards over.
    let b = planner_leased(&env, "b", SignedDuration::from_secs(15));
    let later = plus(t0, 60);
    assert_eq!(b.tick(Some(later)).await.unwrap().shards, 4);
    // A comes back and commits with its old epoch: refused, nothing inserted.
    let before = occurrences(&env, id).await.len();
    let position = env
        .store
        .schedule_position(SchedulePosition {
            tenant: env.tenant,
            id,
        })
        .await
        .unwrap();
    assert!(position.is_some());
    let err = env
        .store
        .plan_commit(PlanCommit {
            node: "a".into(),
            shard,
            shard_epoch: a_lease.epoch,
            items: std::sync::Arc::from(vec![PlanItem {
                tenant: env.tenant,
                schedule_id: id,
                version: 1,
                expected_next_run_at: position.unwrap(),
                next_run_at: Some(plus(position.unwrap(), 86_400)),
                occurrences: vec![],
                missed: None,
            }]),
            now: Some(later),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Fenced(_)), "{err}");
    assert_eq!(occurrences(&env, id).await.len(), before);
    // A stale item (next_run_at moved) is counted, not applied, even by the lease holder.
    let b_lease = b
        .shards_held()
        .into_iter()
        .find(|l| l.shard == shard)
        .unwrap();
    let r = env
        .store
        .plan_commit(PlanCommit {
            node: "b".into(),
            shard,
            shard_epoch: b_lease.epoch,
            items: std::sync::Arc::from(vec![PlanItem {
                tenant: env.tenant,
                schedule_id: id,
                version: 1,
                expected_next_run_at: t0,
                next_run_at: Some(t0),
                occurrences: vec![],
                missed: None,
            }]),
            now: Some(later),
        })
        .await
        .unwrap();
    assert_eq!((r.applied, r.stale, r.refused), (0, 1, vec![id]));
    assert_eq!(
        env.store
            .schedule_position(SchedulePosition {
                tenant: env.tenant,
                id
            })
            .await
            .unwrap(),
        position,
        "never moved backwards"
    );
    // A node that stops renewing loses its shards within one lease period; graceful release
    // hands them over at once.
    // A is alive again: B gives up the excess over a fair share, and A takes it.
    assert_eq!(
        a.tick(Some(plus(later, 1))).await.unwrap().shards,
        0,
        "B's leases are valid"
    );
    assert_eq!(b.tick(Some(plus(later, 2))).await.unwrap().shards, 2);
    assert_eq!(
        a.tick(Some(plus(later, 3))).await.unwrap().shards,
        2,
        "A and B split the shards fairly"
    );
    env.store
        .shard_release(ShardRelease {
            node: "b".into(),
            now: Some(plus(later, 4)),
        })
        .await
        .unwrap();
    assert_eq!(
        a.tick(Some(plus(later, 5))).await.unwrap().shards,
        4,
        "a released shard is taken at once"
    );
}
both!(a_planner_that_lost_its_shard_is_fenced);
