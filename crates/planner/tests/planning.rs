//! Stepping the clock through DST transitions: exactly the calendar's instants, no more.

use std::collections::BTreeSet;

use campanile_calendar::{DstFold, DstGap, DstPolicy};
use campanile_planner::{Planner, PlannerConfig, calendar_of};
use campanile_store::*;
use jiff::{SignedDuration, Timestamp};

use crate::both;
use crate::harness::*;

async fn dst_days_materialize_exactly_the_calendar(env: Env) {
    let s = schedules(&env);
    let p = planner(&env, "node-a");
    for (start, end) in [
        ("2026-03-07T00:00:00Z", "2026-03-10T00:00:00Z"),
        ("2026-10-31T00:00:00Z", "2026-11-03T00:00:00Z"),
    ] {
        let (start, end) = (ts(start), ts(end));
        let specs = vec![
            cron("30 2 * * *", "America/New_York", DstPolicy::default()),
            cron(
                "*/30 1-2 * * *",
                "America/New_York",
                DstPolicy {
                    gap: DstGap::Shift,
                    fold: DstFold::Twice,
                },
            ),
            cron(
                "15 2 * * *",
                "Australia/Lord_Howe",
                DstPolicy {
                    gap: DstGap::Shift,
                    fold: DstFold::Once,
                },
            ),
            cron("0 9 * * *", "Europe/Paris", DstPolicy::default()),
            cron("0 0 * * *", "America/Santiago", DstPolicy::default()),
            spec(Timing::At(plus(start, 30_000))),
            spec(Timing::Every {
                period: SignedDuration::from_mins(47),
                anchor: start,
            }),
        ];
        let mut created = Vec::new();
        for sp in specs {
            let v = s.create(env.tenant, sp.clone(), Some(start)).await.unwrap();
            created.push((v.record.id, calendar_of(&sp).unwrap()));
        }
        let mut now = start;
        while now < end {
            p.tick(Some(now)).await.unwrap();
            now = plus(now, 600);
        }
        let last_planned = plus(plus(now, -600), 15 * 60); // horizon of the last tick
        for (id, cal) in created {
            let want: BTreeSet<Timestamp> = cal
                .iter_after(start.checked_sub(SignedDuration::from_nanos(1)).unwrap())
                .take_while(|t| *t <= last_planned)
                .collect();
            let got = instants(&env, id).await;
            assert_eq!(got, want, "schedule {id}");
            let occ = occurrences(&env, id).await;
            assert!(
                occ.iter()
                    .all(|o| o.available_at == o.scheduled_for && o.version == 1)
            );
        }
    }
}
both!(dst_days_materialize_exactly_the_calendar);

async fn next_fires_and_first_instant(env: Env) {
    let s = schedules(&env);
    let now = ts("2026-03-07T00:00:00Z");
    let v = s
        .create(
            env.tenant,
            cron("30 2 * * *", "America/New_York", DstPolicy::default()),
            Some(now),
        )
        .await
        .unwrap();
    let fires: Vec<String> = v.next_fires.iter().map(|t| t.to_string()).collect();
    assert_eq!(
        &fires[..3],
        [
            "2026-03-07T07:30:00Z",
            "2026-03-09T06:30:00Z",
            "2026-03-10T06:30:00Z"
        ]
    );
    assert_eq!(v.record.next_run_at, Some(ts("2026-03-07T07:30:00Z")));
    assert_eq!(
        (v.record.version, v.record.state),
        (1, ScheduleState::Active)
    );
    // A one-off later than SKIP's max_lateness (600 s here) is refused, saying by how much;
    // one not late yet (a client's clock a minute behind) is accepted and runs.
    let err = s
        .create(env.tenant, spec(Timing::At(plus(now, -700))), Some(now))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("11m 40s in the past"), "{err}");
    let recent = s
        .create(env.tenant, spec(Timing::At(plus(now, -60))), Some(now))
        .await
        .unwrap();
    assert_eq!(recent.record.next_run_at, Some(plus(now, -60)));
    // Accepted under FIRE_ONCE however late.
    let past = spec(Timing::At(plus(now, -700)));
    let mut fire_once = past;
    fire_once.misfire = campanile_core::Misfire::FireOnce {
        max_lateness: SignedDuration::from_secs(30),
    };
    let v = s.create(env.tenant, fire_once, Some(now)).await.unwrap();
    planner(&env, "n").tick(Some(now)).await.unwrap();
    let occ = occurrences(&env, v.record.id).await;
    assert_eq!(occ.len(), 1);
    assert_eq!(
        (occ[0].state, occ[0].available_at),
        (campanile_core::OccurrenceState::Ready, now)
    );
    // Bad definitions say what is wrong.
    let bad = s
        .create(
            env.tenant,
            cron("0 25 * * *", "UTC", DstPolicy::default()),
            Some(now),
        )
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("hour"), "{bad}");
    let bad = s
        .create(
            env.tenant,
            cron("0 1 * * *", "Mars/Base", DstPolicy::default()),
            Some(now),
        )
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("Mars/Base"), "{bad}");

    // An interval anchored at "now" fires at its anchor, and says so. The API anchors it at
    // the store's clock, finer than the millisecond instants are stored in: the first fire is
    // in next_fires, as its occurrence is planned.
    let fine = ts("2026-03-08T00:00:00.000500Z");
    let v = s
        .create(
            env.tenant,
            spec(Timing::Every {
                period: SignedDuration::from_hours(1),
                anchor: fine,
            }),
            Some(fine),
        )
        .await
        .unwrap();
    let whole = ts("2026-03-08T00:00:00Z");
    assert_eq!(v.next_fires.first(), Some(&whole), "{:?}", v.next_fires);
    planner(&env, "n").tick(Some(fine)).await.unwrap();
    let occ = occurrences(&env, v.record.id).await;
    assert_eq!(occ.first().map(|o| o.scheduled_for), Some(whole));
}
both!(next_fires_and_first_instant);

/// A pass on the store's clock that outlasts a third of the shard lease renews the leases
/// (and the node's liveness mark) as it goes: a long top-of-the-hour pass neither loses its
/// shards to a node starting meanwhile nor makes that node think the cluster was down.
async fn a_long_pass_renews_its_leases_as_it_goes(env: Env) {
    let mut cfg = PlannerConfig::new("node-a");
    cfg.shards = 4;
    cfg.shard_lease = SignedDuration::from_millis(1_200);
    // Small batches, many schedules: the pass must last well past a renewal (a third of the
    // lease) on a fast day too (5,000 in batches of 20 took 355 ms on one, too short).
    cfg.batch = 10;
    let p = Planner::new(env.store.clone(), cfg);
    // The pass must outlast a renewal whatever the machine's speed: a pass that turns out too
    // short proves nothing, and the next round plans twice as many.
    let mut n: u32 = 10_000;
    let before = loop {
        let now = env.store.store_now().await.unwrap();
        let items: Vec<_> = (0..n)
            .map(|_| {
                let id = campanile_core::ScheduleId(uuid::Uuid::now_v7());
                (id, campanile_planner::shard_of(id, 4), Some(now))
            })
            .collect();
        env.store
            .schedule_create_many(ScheduleCreateMany {
                tenant: env.tenant,
                spec: spec(Timing::At(now)),
                items,
                now: None,
            })
            .await
            .unwrap();
        // Leases are stored to the millisecond: compare with the start truncated to one.
        let before = env.store.store_now().await.unwrap();
        let before = jiff::Timestamp::from_millisecond(before.as_millisecond()).unwrap();
        let started = std::time::Instant::now();
        let report = p.tick(None).await.unwrap();
        let took = started.elapsed();
        assert_eq!(report.planned, u64::from(n));
        assert_eq!(report.fenced, 0, "no batch lost its shard");
        if took.as_millis() >= 500 {
            break before;
        }
        assert!(
            n < 160_000,
            "passes stay shorter than a renewal: {took:?} for {n}"
        );
        n *= 2;
    };
    // A node starting right after the pass finds this one alive: no outage to judge.
    let other = env
        .store
        .shard_acquire(ShardAcquire {
            node: "node-b".into(),
            total: 4,
            lease: SignedDuration::from_millis(1_200),
            judge: std::sync::Arc::new(campanile_planner::CalendarJudge::default()),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(other.resumed, Resumed::default());
    for lease in p.shards_held() {
        assert!(
            lease.lease_until >= before + SignedDuration::from_millis(1_200 + 400),
            "renewed during the pass: {lease:?} (pass started {before})"
        );
    }
}
both!(a_long_pass_renews_its_leases_as_it_goes);
