//! Update, pause, resume and cancel, alone and racing with claims.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use campanile_calendar::DstPolicy;
use campanile_core::OccurrenceState;
use campanile_store::*;
use jiff::{SignedDuration, Timestamp};

use crate::both;
use crate::harness::*;

async fn update_makes_a_new_version_and_retires_the_old(env: Env) {
    let s = schedules(&env);
    let p = planner(&env, "n");
    let t0 = ts("2026-06-01T00:00:00Z");
    let v = s
        .create(
            env.tenant,
            cron("*/5 * * * *", "UTC", DstPolicy::default()),
            Some(t0),
        )
        .await
        .unwrap();
    let id = v.record.id;
    p.tick(Some(t0)).await.unwrap(); // 00:00 … 00:15
    let running = env
        .store
        .occurrence_claim(OccurrenceClaim {
            max_bytes: None,
            tenant: env.tenant,
            queue: "jobs".into(),
            worker_id: "w".into(),
            max: 1,
            lease: Some(SignedDuration::from_secs(600)),
            key: None,
            now: Some(t0),
        })
        .await
        .unwrap();
    assert_eq!(running.len(), 1);
    // A stale version is a conflict that names the current one.
    let err = s
        .update(
            env.tenant,
            id,
            7,
            cron("0 * * * *", "UTC", DstPolicy::default()),
            Some(plus(t0, 60)),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("version 1"), "{err}");
    let (view, change) = s
        .update(
            env.tenant,
            id,
            1,
            cron("*/10 * * * *", "Europe/Paris", DstPolicy::default()),
            Some(plus(t0, 60)),
        )
        .await
        .unwrap();
    assert_eq!(view.record.version, 2);
    assert_eq!(change.canceled, 3, "00:05, 00:10, 00:15 of version 1");
    assert_eq!(
        change.in_flight,
        vec![(running[0].id, OccurrenceState::Running)]
    );
    // The worker sees the cancel request on its next renew.
    let r = env
        .store
        .lease_renew(LeaseRenew {
            tenant: env.tenant,
            worker_id: "w".into(),
            leases: vec![LeaseRef {
                occurrence_id: running[0].id,
                epoch: 1,
            }],
            lease: Some(SignedDuration::from_secs(60)),
            now: Some(plus(t0, 61)),
        })
        .await
        .unwrap();
    assert!(r[0].renewed && r[0].cancel_requested);
    p.tick(Some(plus(t0, 60))).await.unwrap();
    let occ = occurrences(&env, id).await;
    let v2: Vec<Timestamp> = occ
        .iter()
        .filter(|o| o.version == 2)
        .map(|o| o.scheduled_for)
        .collect();
    assert_eq!(
        v2,
        vec![plus(t0, 600)],
        "the new version plans from now (00:01 + 15 min horizon), every 10 minutes"
    );
    assert!(
        occ.iter()
            .filter(|o| o.version == 1 && o.state == OccurrenceState::Canceled)
            .all(|o| o.attempts == 0)
    );
    // Cancel: nothing is planned again, and history stays.
    let (view, change) = s
        .transition(env.tenant, id, ScheduleState::Canceled, Some(plus(t0, 120)))
        .await
        .unwrap();
    assert_eq!(
        (
            view.record.state,
            view.record.version,
            view.record.next_run_at
        ),
        (ScheduleState::Canceled, 3, None)
    );
    assert_eq!(change.canceled, 1);
    p.tick(Some(plus(t0, 7200))).await.unwrap();
    assert_eq!(
        occurrences(&env, id).await.len(),
        occ.len(),
        "nothing deleted, nothing new"
    );
    assert!(
        s.transition(env.tenant, id, ScheduleState::Active, None)
            .await
            .is_err(),
        "a canceled schedule stays canceled"
    );
    // Other tenants cannot see or touch it.
    let other = env
        .store
        .tenant_create(TenantCreate {
            name: "other".into(),
            now: None,
        })
        .await
        .unwrap()
        .id;
    assert!(s.get(other, id, None).await.unwrap().is_none());
    assert!(
        s.transition(other, id, ScheduleState::Paused, None)
            .await
            .is_err()
    );
}
both!(update_makes_a_new_version_and_retires_the_old);

/// Four workers claim and complete while the schedule is updated, paused, resumed and
/// finally canceled, and the planner keeps planning. Afterwards: no canceled occurrence was
/// ever claimed, every claimed one finished or is still held, nothing was planned after the
/// cancel, and each instant has at most one occurrence per version. Under `SKIP_IF_RUNNING`
/// the claims take the constrained path (schedule row locked) while the changes lock the same
/// schedule and cancel its occurrences: neither deadlocks the other.
async fn races_with_claims(env: Env, overlap: campanile_core::Overlap) {
    let with = |mut spec: ScheduleSpec| {
        spec.overlap = overlap;
        spec
    };
    let s = schedules(&env);
    let p = Arc::new(planner(&env, "n"));
    let t0 = ts("2026-06-01T00:00:00Z");
    let id = s
        .create(
            env.tenant,
            with(cron("* * * * * *", "UTC", DstPolicy::default())),
            Some(t0),
        )
        .await
        .unwrap()
        .record
        .id;
    let clock = Arc::new(AtomicI64::new(t0.as_millisecond()));
    let stop = Arc::new(AtomicBool::new(false));
    let now = |c: &AtomicI64| Timestamp::from_millisecond(c.load(Ordering::SeqCst)).unwrap();
    p.tick(Some(t0)).await.unwrap();
    let mut workers = Vec::new();
    for w in 0..4 {
        let (store, clock, stop, tenant) =
            (env.store.clone(), clock.clone(), stop.clone(), env.tenant);
        workers.push(tokio::spawn(async move {
            let worker = format!("w{w}");
            while !stop.load(Ordering::SeqCst) {
                let got = store
                    .occurrence_claim(OccurrenceClaim {
                        max_bytes: None,
                        tenant,
                        queue: "jobs".into(),
                        worker_id: worker.clone(),
                        max: 5,
                        lease: Some(SignedDuration::from_secs(30)),
                        key: None,
                        now: Some(now(&clock)),
                    })
                    .await
                    .unwrap();
                let items: Vec<FinishItem> = got
                    .iter()
                    .map(|c| FinishItem {
                        lease: LeaseRef {
                            occurrence_id: c.id,
                            epoch: c.epoch,
                        },
                        finish: Finish::Succeeded { result: None },
                    })
                    .collect();
                if !items.is_empty() {
                    store
                        .occurrence_finish_many(OccurrenceFinishMany {
                            tenant,
                            worker_id: worker.clone(),
                            items,
                            now: Some(now(&clock)),
                        })
                        .await
                        .unwrap();
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut version = 1;
    for step in 0..40 {
        clock.fetch_add(3_000, Ordering::SeqCst);
        let t = now(&clock);
        p.tick(Some(t)).await.unwrap();
        match step % 8 {
            2 => {
                let (v, _) = s
                    .update(
                        env.tenant,
                        id,
                        version,
                        with(cron(
                            if step % 16 == 2 {
                                "*/2 * * * * *"
                            } else {
                                "* * * * * *"
                            },
                            "UTC",
                            DstPolicy::default(),
                        )),
                        Some(t),
                    )
                    .await
                    .unwrap();
                version = v.record.version;
            }
            4 => {
                version = s
                    .transition(env.tenant, id, ScheduleState::Paused, Some(t))
                    .await
                    .unwrap()
                    .0
                    .record
                    .version
            }
            6 => {
                version = s
                    .transition(env.tenant, id, ScheduleState::Active, Some(t))
                    .await
                    .unwrap()
                    .0
                    .record
                    .version
            }
            _ => {}
        }
        tokio::task::yield_now().await;
    }
    let canceled_at = now(&clock);
    s.transition(env.tenant, id, ScheduleState::Canceled, Some(canceled_at))
        .await
        .unwrap();
    clock.fetch_add(5_000, Ordering::SeqCst);
    p.tick(Some(now(&clock))).await.unwrap();
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    let occ = occurrences(&env, id).await;
    assert!(
        occ.len() > 50,
        "the race must have planned work: {}",
        occ.len()
    );
    let mut keys = std::collections::BTreeSet::new();
    for o in &occ {
        assert!(keys.insert((o.version, o.scheduled_for)), "duplicate {o:?}");
        match o.state {
            OccurrenceState::Canceled => assert_eq!(
                o.attempts, 0,
                "a canceled occurrence was never claimed: {o:?}"
            ),
            OccurrenceState::Succeeded => assert!(o.attempts >= 1 && o.epoch >= 1),
            OccurrenceState::Missed | OccurrenceState::Running => {}
            OccurrenceState::SkippedOverlap if overlap != campanile_core::Overlap::Allow => {}
            other => panic!("unexpected {other} for {o:?}"),
        }
    }
    let latest = occ.iter().map(|o| o.version).max().unwrap();
    assert!(
        occ.iter()
            .all(|o| o.version < latest || o.state != OccurrenceState::Ready),
        "nothing pending of the canceled schedule"
    );
    assert!(
        occ.iter()
            .filter(|o| o.state == OccurrenceState::Succeeded)
            .count()
            > 10
    );
}
async fn lifecycle_races_with_claims(env: Env) {
    races_with_claims(env, campanile_core::Overlap::Allow).await;
}
both!(lifecycle_races_with_claims);

async fn lifecycle_races_with_constrained_claims(env: Env) {
    races_with_claims(env, campanile_core::Overlap::SkipIfRunning).await;
}
both!(lifecycle_races_with_constrained_claims);

async fn resuming_is_held_to_the_quotas_of_creating(env: Env) {
    let s = schedules(&env);
    let t0 = ts("2026-06-01T00:00:00Z");
    let first = s
        .create(
            env.tenant,
            cron("* * * * *", "UTC", DstPolicy::default()),
            Some(t0),
        )
        .await
        .unwrap()
        .record
        .id;
    limit_active_schedules(&env, 1).await;
    // Pausing frees the only slot, another schedule takes it, and resuming is refused.
    s.transition(env.tenant, first, ScheduleState::Paused, Some(plus(t0, 1)))
        .await
        .unwrap();
    s.create(
        env.tenant,
        cron("* * * * *", "UTC", DstPolicy::default()),
        Some(plus(t0, 2)),
    )
    .await
    .unwrap();
    let refused = s
        .transition(env.tenant, first, ScheduleState::Active, Some(plus(t0, 3)))
        .await;
    assert!(
        matches!(
            refused,
            Err(campanile_planner::PlannerError::Store(
                StoreError::QuotaExceeded { .. }
            ))
        ),
        "{refused:?}"
    );
    let view = env
        .store
        .schedule_get(ScheduleGet {
            tenant: env.tenant,
            id: first,
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        view.state,
        ScheduleState::Paused,
        "a refused resume leaves it paused"
    );
}
both!(resuming_is_held_to_the_quotas_of_creating);

async fn state_of(env: &Env, id: campanile_core::ScheduleId) -> ScheduleState {
    record(env, id).await.state
}

/// Waiting to run (read by the real clock, a test's instants are all past: `READY`).
fn pending(s: OccurrenceState) -> bool {
    matches!(s, OccurrenceState::Scheduled | OccurrenceState::Ready)
}

fn refused_by_quota<T: std::fmt::Debug>(r: &Result<T, campanile_planner::PlannerError>) -> bool {
    matches!(
        r,
        Err(campanile_planner::PlannerError::Store(
            StoreError::QuotaExceeded { .. }
        ))
    )
}

/// A one-off whose instant is planned has nothing left to plan: it is `FINISHED`, its
/// occurrence runs as usual, and its slot in the active-schedules quota is free again. Pause,
/// resume, update and cancel act on it as on an active one, and bringing it back to planning
/// is held to the quota.
async fn a_planned_one_off_finishes_and_frees_its_quota_slot(env: Env) {
    let s = schedules(&env);
    let p = planner(&env, "n");
    let t0 = ts("2026-06-01T00:00:00Z");
    limit_active_schedules(&env, 2).await;
    let one_off = |at: Timestamp| spec(Timing::At(at));
    let a = s
        .create(env.tenant, one_off(plus(t0, 60)), Some(t0))
        .await
        .unwrap()
        .record
        .id;
    let every = cron("*/5 * * * *", "UTC", DstPolicy::default());
    let b = s
        .create(env.tenant, every.clone(), Some(t0))
        .await
        .unwrap()
        .record
        .id;
    let full = s.create(env.tenant, one_off(plus(t0, 90)), Some(t0)).await;
    assert!(refused_by_quota(&full), "two active: {full:?}");

    // Planning A's only instant finishes it (and nothing else); its slot is free.
    p.tick(Some(t0)).await.unwrap();
    assert_eq!(state_of(&env, a).await, ScheduleState::Finished);
    assert_eq!(state_of(&env, b).await, ScheduleState::Active);
    let a_occ = occurrences(&env, a).await;
    assert_eq!(a_occ.len(), 1);
    assert_eq!(a_occ[0].scheduled_for, plus(t0, 60));
    assert!(pending(a_occ[0].state), "{:?}", a_occ[0].state);
    // Finished, its instant is still ahead: it is listed until it has passed.
    let view = s.get(env.tenant, a, Some(t0)).await.unwrap().unwrap();
    assert_eq!(view.next_fires, vec![plus(t0, 60)]);
    let view = s
        .get(env.tenant, a, Some(plus(t0, 61)))
        .await
        .unwrap()
        .unwrap();
    assert!(view.next_fires.is_empty(), "{:?}", view.next_fires);
    let c = s
        .create(env.tenant, one_off(plus(t0, 600)), Some(plus(t0, 1)))
        .await
        .unwrap()
        .record
        .id;

    // Pausing the finished A before its instant retires its pending occurrence; resuming
    // would plan that instant again, so it counts again, and the quota (B and C) refuses it.
    let (_, paused) = s
        .transition(env.tenant, a, ScheduleState::Paused, Some(plus(t0, 10)))
        .await
        .unwrap();
    assert_eq!(paused.canceled, 1);
    assert_eq!(paused.schedule.state, ScheduleState::Paused);
    let refused = s
        .transition(env.tenant, a, ScheduleState::Active, Some(plus(t0, 20)))
        .await;
    assert!(refused_by_quota(&refused), "{refused:?}");
    assert_eq!(state_of(&env, a).await, ScheduleState::Paused);
    s.transition(env.tenant, c, ScheduleState::Canceled, Some(plus(t0, 25)))
        .await
        .unwrap();
    let (resumed, _) = s
        .transition(env.tenant, a, ScheduleState::Active, Some(plus(t0, 30)))
        .await
        .unwrap();
    assert_eq!(resumed.record.state, ScheduleState::Active);
    p.tick(Some(plus(t0, 30))).await.unwrap();
    assert_eq!(state_of(&env, a).await, ScheduleState::Finished);

    // It runs as planned, once, under the version that planned it.
    let claimed = claim_jobs(&env, "w", 60, plus(t0, 61)).await;
    let mine: Vec<&Claimed> = claimed.iter().filter(|c| c.schedule_id == a).collect();
    assert_eq!(mine.len(), 1, "{claimed:?}");
    assert_eq!(mine[0].scheduled_for, plus(t0, 60));
    let acks = env
        .store
        .occurrence_finish_many(OccurrenceFinishMany {
            tenant: env.tenant,
            worker_id: "w".into(),
            items: claimed
                .iter()
                .map(|c| FinishItem {
                    lease: LeaseRef {
                        occurrence_id: c.id,
                        epoch: c.epoch,
                    },
                    finish: Finish::Succeeded { result: None },
                })
                .collect(),
            now: Some(plus(t0, 62)),
        })
        .await
        .unwrap();
    assert!(acks.iter().all(|a| a.accepted()));

    // Paused after it ran, it has nothing to plan: resuming finishes it again, and that needs
    // no slot (fill the quota first).
    let d = s
        .create(env.tenant, one_off(plus(t0, 3600)), Some(plus(t0, 63)))
        .await
        .unwrap()
        .record
        .id;
    s.transition(env.tenant, a, ScheduleState::Paused, Some(plus(t0, 64)))
        .await
        .unwrap();
    let (back, _) = s
        .transition(env.tenant, a, ScheduleState::Active, Some(plus(t0, 65)))
        .await
        .unwrap();
    assert_eq!(back.record.state, ScheduleState::Finished);

    // An update giving it a new instant plans again and so counts: refused while B and D
    // are active, accepted once D is canceled, and finished again once planned.
    let version = back.record.version;
    let refused = s
        .update(
            env.tenant,
            a,
            version,
            one_off(plus(t0, 1800)),
            Some(plus(t0, 66)),
        )
        .await;
    assert!(refused_by_quota(&refused), "{refused:?}");
    assert_eq!(state_of(&env, a).await, ScheduleState::Finished);
    s.transition(env.tenant, d, ScheduleState::Canceled, Some(plus(t0, 67)))
        .await
        .unwrap();
    let (updated, _) = s
        .update(
            env.tenant,
            a,
            version,
            one_off(plus(t0, 1800)),
            Some(plus(t0, 68)),
        )
        .await
        .unwrap();
    assert_eq!(updated.record.state, ScheduleState::Active);
    assert_eq!(updated.next_fires, vec![plus(t0, 1800)]);
    p.tick(Some(plus(t0, 1700))).await.unwrap();
    assert_eq!(state_of(&env, a).await, ScheduleState::Finished);
    assert_eq!(
        occurrences(&env, a)
            .await
            .iter()
            .filter(|o| pending(o.state))
            .map(|o| o.scheduled_for)
            .collect::<Vec<_>>(),
        vec![plus(t0, 1800)]
    );

    // Canceling the finished A retires that pending occurrence.
    let (_, canceled) = s
        .transition(env.tenant, a, ScheduleState::Canceled, Some(plus(t0, 1710)))
        .await
        .unwrap();
    assert_eq!(canceled.canceled, 1);
    assert_eq!(canceled.schedule.state, ScheduleState::Canceled);
    assert_eq!(state_of(&env, b).await, ScheduleState::Active);
}
both!(a_planned_one_off_finishes_and_frees_its_quota_slot);

/// Planning the last instant of many one-offs while each of them is updated, paused or
/// canceled at the same time: no change or pass fails (on PostgreSQL the planner locks a
/// finishing schedule's row before its queue entry, as a change does; the other order
/// deadlocks), and every schedule ends in the state its last change implies.
async fn finishing_races_with_changes(env: Env) {
    let s = Arc::new(schedules(&env));
    let t0 = ts("2026-06-01T00:00:00Z");
    let n = 240;
    let mut ids = Vec::new();
    for _ in 0..n {
        let v = s
            .create(env.tenant, spec(Timing::At(plus(t0, 60))), Some(t0))
            .await
            .unwrap();
        ids.push(v.record.id);
    }
    // Two passes of one node racing each other too (its shard leases last the whole test).
    let p = Arc::new(planner(&env, "n"));
    const ROUNDS: i64 = 6;
    // Which change round `r` makes to schedule `i`: 0 update, 1 pause, 2 resume, 3 none.
    let change = |i: usize, r: i64| (i * 5 + r as usize * 3) % 4;
    for round in 0..ROUNDS {
        let at = plus(t0, 1 + round);
        let planners: Vec<_> = (0..2)
            .map(|_| {
                let p = p.clone();
                tokio::spawn(async move { p.tick(Some(at)).await.map(|_| ()) })
            })
            .collect();
        let mut changes = Vec::new();
        for (i, id) in ids.iter().copied().enumerate() {
            let (s, tenant) = (s.clone(), env.tenant);
            changes.push(tokio::spawn(async move {
                match change(i, round) {
                    0 => {
                        let v = s.get(tenant, id, Some(at)).await?.map(|v| v.record.version);
                        s.update(
                            tenant,
                            id,
                            v.unwrap_or(0),
                            spec(Timing::At(plus(t0, 120))),
                            Some(at),
                        )
                        .await
                        .map(|_| ())
                    }
                    1 => s
                        .transition(tenant, id, ScheduleState::Paused, Some(at))
                        .await
                        .map(|_| ()),
                    2 => s
                        .transition(tenant, id, ScheduleState::Active, Some(at))
                        .await
                        .map(|_| ()),
                    _ => Ok(()),
                }
            }));
        }
        for c in changes {
            match c.await.unwrap() {
                // A concurrent pass never changes the version; nothing else changes it here.
                Ok(()) => {}
                Err(e) => panic!("a change failed: {e}"),
            }
        }
        for t in planners {
            t.await.unwrap().unwrap();
        }
    }
    // Plan what the changes left to plan, then check each schedule.
    p.tick(Some(plus(t0, ROUNDS + 1))).await.unwrap();
    for (i, id) in ids.iter().copied().enumerate() {
        let record = record(&env, id).await;
        let occ = occurrences(&env, id).await;
        let live: Vec<&Occurrence> = occ.iter().filter(|o| pending(o.state)).collect();
        // Paused by its last pause or resume (an update leaves a paused schedule paused).
        let paused = (0..ROUNDS).fold(false, |paused, r| match change(i, r) {
            1 => true,
            2 => false,
            _ => paused,
        });
        if paused {
            assert_eq!(record.state, ScheduleState::Paused, "{i}");
            assert!(live.is_empty(), "{i}: {occ:?}");
        } else {
            assert_eq!(record.state, ScheduleState::Finished, "{i}: {occ:?}");
            assert_eq!(live.len(), 1, "{i}: {occ:?}");
            assert_eq!(live[0].version, record.version, "{i}: {occ:?}");
        }
    }
}
both!(finishing_races_with_changes);

/// An occurrence no worker holds is retired by a pause, an update or a cancel whether it has
/// never run or waits to retry: a failed run waiting out its backoff (and one put back after a
/// lost lease) is not "in flight", and must not run again while its schedule is paused. Its
/// failed attempt stays on record.
async fn a_change_retires_occurrences_waiting_to_retry(env: Env) {
    let s = schedules(&env);
    let p = planner(&env, "n");
    let t0 = ts("2026-06-01T00:00:00Z");
    let mut sp = cron("0 * * * *", "UTC", DstPolicy::default());
    sp.backoff_initial = SignedDuration::from_secs(20);
    sp.backoff_max = SignedDuration::from_secs(20);
    let id = s.create(env.tenant, sp, Some(t0)).await.unwrap().record.id;
    p.tick(Some(t0)).await.unwrap();
    let first = claim_jobs(&env, "a", 5, plus(t0, 1)).await;
    assert_eq!(first.len(), 1);
    let acks = env
        .store
        .occurrence_finish_many(OccurrenceFinishMany {
            tenant: env.tenant,
            worker_id: "a".into(),
            items: vec![FinishItem {
                lease: first[0].lease(),
                finish: Finish::Failed {
                    class: campanile_core::ErrorClass::Transient,
                    message: "flaky".into(),
                },
            }],
            now: Some(plus(t0, 2)),
        })
        .await
        .unwrap();
    assert_eq!(acks[0].state, Some(OccurrenceState::RetryWait));

    let (view, change) = s
        .transition(env.tenant, id, ScheduleState::Paused, Some(plus(t0, 3)))
        .await
        .unwrap();
    assert_eq!(view.record.state, ScheduleState::Paused);
    assert_eq!(change.canceled, 1, "{change:?}");
    assert!(change.in_flight.is_empty(), "{change:?}");
    // Its backoff over, nothing is handed out: the paused schedule's retry does not run.
    assert!(claim_jobs(&env, "b", 5, plus(t0, 60)).await.is_empty());
    let detail = env
        .store
        .occurrence_get(OccurrenceGet {
            tenant: env.tenant,
            key: OccurrenceKey::Id(first[0].id),
            now: Some(plus(t0, 60)),
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(detail.occurrence.state, OccurrenceState::Canceled);
    assert_eq!(detail.attempts.len(), 1, "{:?}", detail.attempts);

    // Resumed within its lateness, the instant is planned again under the new version and
    // runs once, as any instant a pause retired.
    s.transition(env.tenant, id, ScheduleState::Active, Some(plus(t0, 61)))
        .await
        .unwrap();
    p.tick(Some(plus(t0, 61))).await.unwrap();
    let again = claim_jobs(&env, "b", 5, plus(t0, 62)).await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].scheduled_for, t0);
    assert_ne!(again[0].id, first[0].id);
}
both!(a_change_retires_occurrences_waiting_to_retry);
