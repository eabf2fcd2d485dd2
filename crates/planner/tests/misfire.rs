//! Misfire policies after a 10-minute and a 3-day outage.

use campanile_core::{Misfire, OccurrenceState};
use campanile_store::*;
use jiff::SignedDuration;

use crate::both;
use crate::harness::*;

fn every_minute(misfire: Misfire) -> ScheduleSpec {
    let mut s = spec(Timing::Cron {
        expr: "* * * * *".into(),
        timezone: "UTC".into(),
        dst_gap: Default::default(),
        dst_fold: Default::default(),
    });
    s.misfire = misfire;
    s
}

async fn misfire_policies_after_outages(env: Env) {
    let s = schedules(&env);
    let p = planner(&env, "node-a");
    let lateness = SignedDuration::from_secs(90);
    let t0 = ts("2026-06-01T00:00:00Z");
    for (outage, label) in [(600, "10 minutes"), (3 * 86_400, "3 days")] {
        let start = plus(t0, if outage == 600 { 0 } else { 86_400 });
        let skip = s
            .create(
                env.tenant,
                every_minute(Misfire::Skip {
                    max_lateness: lateness,
                }),
                Some(start),
            )
            .await
            .unwrap()
            .record
            .id;
        let once = s
            .create(
                env.tenant,
                every_minute(Misfire::FireOnce {
                    max_lateness: lateness,
                }),
                Some(start),
            )
            .await
            .unwrap()
            .record
            .id;
        let catchup = s
            .create(
                env.tenant,
                every_minute(Misfire::Catchup {
                    max_lateness: lateness,
                    max: 3,
                    interval: SignedDuration::from_secs(10),
                }),
                Some(start),
            )
            .await
            .unwrap()
            .record
            .id;
        // The planner is down from `start` (nothing planned) until `start + outage`.
        let back = plus(start, outage);
        p.tick(Some(back)).await.unwrap();
        // Instants start+60 … : late are those older than back - 90 s.
        let late = (outage - 90 - 1) / 60; // minute instants in (start, back - 90)
        let late = late + 1; // `start` itself is an instant (created at a whole minute)
        for (id, runs) in [(skip, 0u64), (once, 1), (catchup, 3)] {
            let occ = occurrences(&env, id).await;
            let missed_rows = occ
                .iter()
                .filter(|o| o.state == OccurrenceState::Missed)
                .count() as u64;
            let summary = env
                .store
                .missed_range_list(MissedRangeList {
                    tenant: env.tenant,
                    schedule_id: id,
                })
                .await
                .unwrap();
            let summarized: u64 = summary.iter().map(|m| m.count).sum();
            assert!(
                summary.iter().all(|m| !m.superseded),
                "{label}: judged late, not superseded"
            );
            assert_eq!(
                missed_rows + summarized,
                late as u64 - runs,
                "{label}: every late instant is on record"
            );
            let late_runs: Vec<_> = occ
                .iter()
                .filter(|o| o.state != OccurrenceState::Missed && o.scheduled_for < plus(back, -90))
                .collect();
            assert_eq!(late_runs.len() as u64, runs, "{label}");
            // The runs are the latest late instants, available from now on, spaced for catch-up.
            for (j, r) in late_runs.iter().enumerate() {
                assert_eq!(
                    r.scheduled_for,
                    plus(start, (late - runs as i64 + j as i64) * 60),
                    "{label}"
                );
                let spacing = if runs == 3 { 10 * j as i64 } else { 0 };
                assert_eq!(r.available_at, plus(back, spacing));
            }
            if outage == 600 {
                assert!(summary.is_empty(), "short gaps are recorded row by row");
            } else {
                assert_eq!(summary.len(), 1, "a 3-day gap is one summary record");
                assert!(missed_rows == 0 && summary[0].count_exact);
            }
            // Instants after the cutoff run normally, up to the horizon.
            let timely = occ
                .iter()
                .filter(|o| o.scheduled_for >= plus(back, -90))
                .count();
            assert!(timely >= 16, "{label}: {timely}");
        }
    }
}
both!(misfire_policies_after_outages);

/// The whole node stops after planning (its horizon is 15 minutes here): the occurrences it
/// planned come due while nobody can claim them. When it starts again they are judged by the
/// same misfire rule as the instants it had not planned yet, over both together: late ones
/// are recorded `MISSED` but the policy's latest runs, whichever side they fall on.
async fn preplanned_occurrences_follow_the_misfire_policy(env: Env) {
    let s = schedules(&env);
    // A 15 s mark: the outage after `start` is one.
    let p = planner_leased(&env, "node-a", SignedDuration::from_secs(15));
    let lateness = SignedDuration::from_secs(90);
    let t0 = ts("2026-06-01T00:00:00Z");
    let policies = [
        (
            Misfire::Skip {
                max_lateness: lateness,
            },
            0u64,
        ),
        (
            Misfire::FireOnce {
                max_lateness: lateness,
            },
            1,
        ),
        (
            Misfire::Catchup {
                max_lateness: lateness,
                max: 3,
                interval: SignedDuration::from_secs(10),
            },
            3,
        ),
    ];
    // 10 minutes: every late instant was planned before. 3 days: the planner adds its own.
    for (outage, label) in [(600, "10 minutes"), (3 * 86_400, "3 days")] {
        let start = plus(t0, if outage == 600 { 0 } else { 7 * 86_400 });
        let mut ids = Vec::new();
        for (misfire, runs) in policies {
            let id = s
                .create(env.tenant, every_minute(misfire), Some(start))
                .await
                .unwrap()
                .record
                .id;
            ids.push((id, runs));
        }
        p.tick(Some(start)).await.unwrap();
        for (id, _) in &ids {
            assert_eq!(
                occurrences(&env, *id).await.len(),
                16,
                "{label}: planned ahead"
            );
        }
        // Down from just after `start` (planner, API, workers: nothing claims) until `back`.
        let back = plus(start, outage);
        let r = p.tick(Some(back)).await.unwrap();
        assert_eq!(r.resumed.down_since, Some(start), "{label}");
        let cutoff = plus(back, -90);
        let late = (outage - 90 - 1) / 60 + 1; // whole minutes from `start` before the cutoff
        for (id, runs) in &ids {
            let occ = occurrences(&env, *id).await;
            let missed_rows = occ
                .iter()
                .filter(|o| o.state == OccurrenceState::Missed)
                .count() as u64;
            let summarized: u64 = env
                .store
                .missed_range_list(MissedRangeList {
                    tenant: env.tenant,
                    schedule_id: *id,
                })
                .await
                .unwrap()
                .iter()
                .map(|m| m.count)
                .sum();
            assert_eq!(
                missed_rows + summarized,
                late as u64 - runs,
                "{label}, {runs} runs: every late instant not run is on record"
            );
            let late_runs: Vec<_> = occ
                .iter()
                .filter(|o| o.state != OccurrenceState::Missed && o.scheduled_for < cutoff)
                .map(|o| o.scheduled_for)
                .collect();
            let want: Vec<_> = (late - *runs as i64..late)
                .map(|k| plus(start, k * 60))
                .collect();
            assert_eq!(late_runs, want, "{label}: the latest late instants run");
        }
    }
}
both!(preplanned_occurrences_follow_the_misfire_policy);

async fn pause_then_resume_applies_the_misfire_policy(env: Env) {
    let s = schedules(&env);
    let p = planner(&env, "node-a");
    let t0 = ts("2026-06-01T00:00:00Z");
    let id = s
        .create(
            env.tenant,
            every_minute(Misfire::FireOnce {
                max_lateness: SignedDuration::from_secs(30),
            }),
            Some(t0),
        )
        .await
        .unwrap()
        .record
        .id;
    p.tick(Some(t0)).await.unwrap(); // plans 00:00 .. 00:15
    let (view, change) = s
        .transition(env.tenant, id, ScheduleState::Paused, Some(plus(t0, 1)))
        .await
        .unwrap();
    assert_eq!(
        (view.record.state, view.record.version),
        (ScheduleState::Paused, 2)
    );
    assert_eq!(
        change.canceled, 16,
        "00:00 … 00:15 were planned and never claimed"
    );
    assert!(change.in_flight.is_empty());
    p.tick(Some(plus(t0, 3600))).await.unwrap();
    assert!(
        occurrences(&env, id)
            .await
            .iter()
            .all(|o| o.scheduled_for <= plus(t0, 900)),
        "nothing planned while paused"
    );
    let (view, _) = s
        .transition(env.tenant, id, ScheduleState::Active, Some(plus(t0, 3600)))
        .await
        .unwrap();
    assert_eq!(view.record.state, ScheduleState::Active);
    p.tick(Some(plus(t0, 3600))).await.unwrap();
    let occ = occurrences(&env, id).await;
    let v2: Vec<_> = occ.iter().filter(|o| o.version == 2).collect();
    // Planning restarts at the first canceled instant: 00:00 … 00:59 are late (60), FIRE_ONCE
    // runs 00:59 and records 59 MISSED; then 01:00 … 01:15 run on time.
    assert_eq!(
        v2.iter()
            .filter(|o| o.state == OccurrenceState::Missed)
            .count(),
        59
    );
    assert!(
        occ.iter()
            .filter(|o| o.version == 1)
            .all(|o| o.state == OccurrenceState::Canceled)
    );
    assert!(
        v2.iter()
            .any(|o| o.scheduled_for == plus(t0, 59 * 60) && o.available_at == plus(t0, 3600))
    );
    assert_eq!(
        v2.iter()
            .filter(|o| o.scheduled_for >= plus(t0, 3600))
            .count(),
        16
    );
}
both!(pause_then_resume_applies_the_misfire_policy);

/// A tenant's catch-up rate paces late runs across all its schedules.
async fn tenant_catchup_rate_paces_late_runs(env: Env) {
    let s = schedules(&env);
    let p = planner(&env, "node-a");
    let t0 = ts("2026-06-01T00:00:00Z");
    env.store
        .tenant_quota_set(TenantQuota {
            tenant: env.tenant,
            max_catchup_per_sec: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
    let m = Misfire::Catchup {
        max_lateness: SignedDuration::from_secs(60),
        max: 4,
        interval: SignedDuration::ZERO,
    };
    for _ in 0..2 {
        s.create(env.tenant, every_minute(m), Some(t0))
            .await
            .unwrap();
    }
    let back = plus(t0, 600);
    p.tick(Some(back)).await.unwrap();
    let all = env
        .store
        .occurrence_list(OccurrenceList {
            tenant: env.tenant,
            limit: 1000,
            now: Some(back),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut late: Vec<i64> = all
        .iter()
        .filter(|o| o.state != OccurrenceState::Missed && o.scheduled_for < plus(back, -60))
        .map(|o| o.available_at.as_millisecond() - back.as_millisecond())
        .collect();
    late.sort();
    assert_eq!(
        late,
        vec![0, 500, 1000, 1500, 2000, 2500, 3000, 3500],
        "8 late runs, 2 per second across both schedules"
    );
}
both!(tenant_catchup_rate_paces_late_runs);

/// The offsets from `back`, in milliseconds and ascending, at which the tenant's late runs
/// (not missed, older than `cutoff`) become available.
async fn late_offsets(env: &Env, back: jiff::Timestamp, cutoff: jiff::Timestamp) -> Vec<i64> {
    let mut late: Vec<i64> = occurrences_of(env, None)
        .await
        .iter()
        .filter(|o| {
            matches!(o.state, OccurrenceState::Ready | OccurrenceState::Scheduled)
                && o.scheduled_for < cutoff
        })
        .map(|o| o.available_at.as_millisecond() - back.as_millisecond())
        .collect();
    late.sort();
    late
}

async fn set_catchup_rate(env: &Env, rate: i64) {
    env.store
        .tenant_quota_set(TenantQuota {
            tenant: env.tenant,
            max_catchup_per_sec: Some(rate),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// Two schedules resumed one after the other, each planned by its own pass: their late runs
/// share the tenant's catch-up rate (the pace is the tenant's, not a pass's).
async fn the_catchup_rate_holds_across_resumes_and_passes(env: Env) {
    let s = schedules(&env);
    let p = planner(&env, "node-a");
    let t0 = ts("2026-06-01T00:00:00Z");
    set_catchup_rate(&env, 2).await;
    let m = Misfire::Catchup {
        max_lateness: SignedDuration::from_secs(60),
        max: 4,
        interval: SignedDuration::ZERO,
    };
    let mut ids = Vec::new();
    for _ in 0..2 {
        let id = s
            .create(env.tenant, every_minute(m), Some(t0))
            .await
            .unwrap()
            .record
            .id;
        s.transition(env.tenant, id, ScheduleState::Paused, Some(t0))
            .await
            .unwrap();
        ids.push(id);
    }
    let back = plus(t0, 600);
    // The first is resumed and planned; then the second, planned by another pass.
    s.transition(env.tenant, ids[0], ScheduleState::Active, Some(back))
        .await
        .unwrap();
    p.tick(Some(back)).await.unwrap();
    assert_eq!(late_offsets(&env, back, plus(back, -60)).await.len(), 4);
    s.transition(env.tenant, ids[1], ScheduleState::Active, Some(back))
        .await
        .unwrap();
    p.tick(Some(back)).await.unwrap();
    assert_eq!(
        late_offsets(&env, back, plus(back, -60)).await,
        vec![0, 500, 1000, 1500, 2000, 2500, 3000, 3500],
        "8 late runs, 2 per second across both resumes"
    );
    // Later, the pace starts again from the present, not from where it stopped.
    let later = plus(back, 3600);
    let slots = env
        .store
        .tenant_catchup_reserve(CatchupReserve {
            tenant: env.tenant,
            count: 3,
            now: Some(later),
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!((slots.start, slots.slot(2)), (later, plus(later, 1)));
}
both!(the_catchup_rate_holds_across_resumes_and_passes);

/// The whole cluster is down for ten minutes after planning ahead: what the outage check keeps
/// of the pre-planned runs is paced by the tenant's catch-up rate, across its schedules.
async fn runs_kept_after_a_cluster_outage_are_paced(env: Env) {
    let s = schedules(&env);
    let p = planner_leased(&env, "node-a", SignedDuration::from_secs(15));
    let t0 = ts("2026-06-01T00:00:00Z");
    set_catchup_rate(&env, 2).await;
    let m = Misfire::Catchup {
        max_lateness: SignedDuration::from_secs(60),
        max: 3,
        interval: SignedDuration::ZERO,
    };
    for _ in 0..3 {
        s.create(env.tenant, every_minute(m), Some(t0))
            .await
            .unwrap();
    }
    p.tick(Some(t0)).await.unwrap(); // plans 00:00 … 00:15 of each
    let back = plus(t0, 600);
    let r = p.tick(Some(back)).await.unwrap();
    assert_eq!(r.resumed.down_since, Some(t0));
    assert_eq!(r.resumed.paced, 9, "3 late runs kept per schedule");
    assert_eq!(
        late_offsets(&env, back, plus(back, -60)).await,
        (0..9).map(|k| k * 500).collect::<Vec<_>>(),
        "9 kept runs, 2 per second across the three schedules"
    );
}
both!(runs_kept_after_a_cluster_outage_are_paced);
