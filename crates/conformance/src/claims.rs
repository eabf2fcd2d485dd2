//! Claims: their order, quotas and per-queue limits, and overlap policies kept by one worker
//! and by racing ones.

use campanile_core::{ErrorClass, OccurrenceState};
use jiff::SignedDuration;
use tokio::runtime::Runtime;

use super::*;

pub fn claim_orders_by_priority_then_availability(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let mut items = Vec::new();
        // A higher priority that is not due yet must not hide the due work of lower ones,
        // and negative priorities come last.
        for (i, prio) in [(0, 0), (1, 5), (2, 0), (3, 5), (4, 9), (5, -3), (100, 20)] {
            let mut o = new_occ(&f, "q", secs(i), 3);
            o.priority = prio;
            items.push(o);
        }
        let ids = insert(s, &f, items).await;
        let order: Vec<OccurrenceId> = {
            let mut v = Vec::new();
            for _ in 0..6 {
                v.extend(
                    claim(s, &f, "q", "A", 1, 600, secs(10))
                        .await
                        .into_iter()
                        .map(|c| c.id),
                );
            }
            v
        };
        assert_eq!(order, vec![ids[4], ids[1], ids[3], ids[0], ids[2], ids[5]]);
        assert!(claim(s, &f, "q", "A", 10, 600, secs(10)).await.is_empty());
        let late = claim(s, &f, "q", "A", 10, 60, secs(100)).await;
        assert_eq!(late.iter().map(|c| c.id).collect::<Vec<_>>(), vec![ids[6]]);
        // One batch claim takes the best across priorities.
        let f2 = fixture(s, "acme2", "b").await;
        let mut items = Vec::new();
        for (i, prio) in [(0, 0), (1, 5), (2, 0), (3, 5), (4, 9), (5, -3), (100, 20)] {
            let mut o = new_occ(&f2, "b", secs(i), 3);
            o.priority = prio;
            items.push(o);
        }
        let ids = insert(s, &f2, items).await;
        let mut got: Vec<OccurrenceId> = claim(s, &f2, "b", "A", 4, 60, secs(10))
            .await
            .into_iter()
            .map(|c| c.id)
            .collect();
        got.sort();
        let mut want = vec![ids[4], ids[1], ids[3], ids[0]];
        want.sort();
        assert_eq!(got, want);
    });
}

pub fn quotas_and_queue_limits_cap_claims(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        insert(
            s,
            &f,
            (0..10)
                .map(|i| new_occ(&f, "q", at(i), 3))
                .chain((0..10).map(|i| new_occ(&f, "q2", at(100 + i), 3)))
                .collect(),
        )
        .await;
        s.tenant_quota_set(TenantQuota {
            tenant: f.tenant,
            max_active_schedules: Some(1),
            max_running: Some(5),
            ..Default::default()
        })
        .await
        .unwrap();
        s.queue_limit_set(QueueLimitSet {
            tenant: f.tenant,
            queue: "q2".into(),
            max_running: Some(2),
        })
        .await
        .unwrap();
        // The queue limit: at most 2 of q2 running.
        let c2 = claim(s, &f, "q2", "A", 10, 60, secs(1)).await;
        assert_eq!(c2.len(), 2);
        assert!(claim(s, &f, "q2", "B", 10, 60, secs(1)).await.is_empty());
        // The tenant quota: 5 running across queues, 2 already in q2.
        let c1 = claim(s, &f, "q", "A", 10, 60, secs(1)).await;
        assert_eq!(c1.len(), 3);
        assert!(claim(s, &f, "q", "A", 10, 60, secs(1)).await.is_empty());
        // Finishing one frees one slot.
        assert!(
            finish(s, &f, "A", c1[0].id, c1[0].epoch, ok("done"), secs(2))
                .await
                .accepted()
        );
        assert_eq!(claim(s, &f, "q", "A", 10, 60, secs(2)).await.len(), 1);
        // Limits removed: everything due can be claimed.
        s.tenant_quota_set(TenantQuota {
            tenant: f.tenant,
            max_active_schedules: Some(1),
            max_running: None,
            ..Default::default()
        })
        .await
        .unwrap();
        s.queue_limit_set(QueueLimitSet {
            tenant: f.tenant,
            queue: "q2".into(),
            max_running: None,
        })
        .await
        .unwrap();
        assert_eq!(claim(s, &f, "q2", "A", 100, 60, secs(3)).await.len(), 8);
        // The fixture's schedule is the one active schedule allowed.
        let err = s
            .schedule_create(ScheduleCreate {
                tenant: f.tenant,
                id: ScheduleId(Uuid::now_v7()),
                spec: spec("q"),
                shard: 0,
                next_run_at: None,
                fires_per_hour: 0,
                idempotency: None,
                now: Some(secs(3)),
            })
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::QuotaExceeded {
                    quota: Quota::ActiveSchedules,
                    ..
                }
            ),
            "{err}"
        );
        // The trigger-rate quota: fires per hour summed over active schedules.
        let r = fixture(s, "rated", "q").await; // its fixture schedule fires 0 times an hour
        s.tenant_quota_set(TenantQuota {
            tenant: r.tenant,
            max_triggers_per_sec: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
        let create = |fires: u32| ScheduleCreate {
            tenant: r.tenant,
            id: ScheduleId(Uuid::now_v7()),
            spec: spec("q"),
            shard: 0,
            next_run_at: None,
            fires_per_hour: fires,
            idempotency: None,
            now: Some(secs(3)),
        };
        s.schedule_create(create(3000)).await.unwrap();
        assert!(matches!(
            s.schedule_create(create(601)).await,
            Err(StoreError::QuotaExceeded {
                quota: Quota::TriggersPerSec,
                ..
            })
        ));
        s.schedule_create(create(600)).await.unwrap();
        assert_eq!(
            s.tenant_quota_get(TenantQuotaGet { tenant: r.tenant })
                .await
                .unwrap()
                .max_triggers_per_sec,
            Some(1)
        );
        // Another tenant is not affected by any of it.
        let g = fixture(s, "other", "q").await;
        insert(s, &g, (0..10).map(|i| new_occ(&g, "q", at(i), 3)).collect()).await;
        assert_eq!(claim(s, &g, "q", "A", 100, 60, secs(3)).await.len(), 10);
        // Occurrences with an overlap policy (each of its own schedule here) count against the
        // same limits: with 10 running and a tenant limit of 12, two more are claimed.
        insert(
            s,
            &g,
            (0..5)
                .map(|i| NewOccurrence {
                    schedule_id: ScheduleId(Uuid::now_v7()),
                    overlap: campanile_core::Overlap::SkipIfRunning,
                    ..new_occ(&g, "q3", at(i), 3)
                })
                .collect(),
        )
        .await;
        s.tenant_quota_set(TenantQuota {
            tenant: g.tenant,
            max_running: Some(12),
            ..Default::default()
        })
        .await
        .unwrap();
        assert_eq!(claim(s, &g, "q3", "A", 10, 60, secs(3)).await.len(), 2);
        assert!(claim(s, &g, "q3", "A", 10, 60, secs(3)).await.is_empty());
        // And a queue limit alone caps them too.
        s.tenant_quota_set(TenantQuota {
            tenant: g.tenant,
            max_running: None,
            ..Default::default()
        })
        .await
        .unwrap();
        s.queue_limit_set(QueueLimitSet {
            tenant: g.tenant,
            queue: "q3".into(),
            max_running: Some(3),
        })
        .await
        .unwrap();
        assert_eq!(claim(s, &g, "q3", "A", 10, 60, secs(3)).await.len(), 1);
        assert!(claim(s, &g, "q3", "A", 10, 60, secs(3)).await.is_empty());
    });
}

/// An overlap-constrained occurrence whose worker went silent is claimed again once its lease
/// has expired, by a claim that finds nothing else due in the queue (nothing pending at all),
/// and its lost attempt is on record.
pub fn constrained_lease_expiry_is_reclaimed(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let queued = |due| NewOccurrence {
            overlap: campanile_core::Overlap::QueueOne,
            ..new_occ(&f, "q", due, 3)
        };
        let ids = insert(s, &f, vec![queued(secs(0))]).await;
        let a = claim(s, &f, "q", "A", 10, 5, secs(1)).await;
        assert_eq!(a.iter().map(|c| c.id).collect::<Vec<_>>(), ids);
        // Before the lease ends (6): nothing to claim.
        assert!(claim(s, &f, "q", "B", 10, 5, at(5_999)).await.is_empty());
        // After: the same occurrence, at epoch 2.
        let b = claim(s, &f, "q", "B", 10, 5, secs(6)).await;
        assert_eq!(
            b.iter().map(|c| (c.id, c.epoch)).collect::<Vec<_>>(),
            vec![(ids[0], 2)]
        );
        let d = get(s, &f, ids[0], secs(6)).await;
        assert_eq!(
            d.attempts
                .iter()
                .map(|a| (a.epoch, a.outcome))
                .collect::<Vec<_>>(),
            vec![
                (1, AttemptOutcome::LeaseExpired),
                (2, AttemptOutcome::Running)
            ]
        );
    });
}

/// A lone worker that claims only once its run has ended never finds the previous run
/// `RUNNING`, yet the overlap policies hold: they are decided from what the schedule's runs did
/// when each occurrence came due (recorded claim and finish instants), not from their state
/// when a claim happens to look. Occurrences every 2 s, runs of 7 s: `SKIP_IF_RUNNING` runs
/// every fourth and skips the ones that came due during a run; `QUEUE_ONE` runs the first to
/// come due behind each run and skips the rest, so the lag stays under one run. Occurrences
/// that all came due while nothing ran (a backlog) run one after the other, none skipped.
/// The same whether the worker's report claims its next work or a claim follows it.
pub fn a_lone_worker_keeps_overlap_policies(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        use campanile_core::Overlap::{QueueOne, SkipIfRunning};
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let offset = |t: jiff::Timestamp| (t.as_millisecond() - T0) / 1000;
        for ((queue, overlap, dues, first_claim, want), combined) in [
            (
                "skip",
                SkipIfRunning,
                (0..=40).step_by(2).collect::<Vec<i64>>(),
                0,
                vec![(0, 0), (8, 8), (16, 16), (24, 24), (32, 32), (40, 40)],
            ),
            (
                "one",
                QueueOne,
                (0..=40).step_by(2).collect(),
                0,
                vec![
                    (0, 0),
                    (2, 7),
                    (8, 14),
                    (14, 21),
                    (22, 28),
                    (28, 35),
                    (36, 42),
                ],
            ),
            (
                "backlog",
                SkipIfRunning,
                vec![0, 2, 4],
                10,
                vec![(0, 10), (2, 17), (4, 24)],
            ),
        ]
        .into_iter()
        .flat_map(|case| [(case.clone(), false), (case, true)])
        {
            // Each case twice: reports apart from claims, and reports that claim the next
            // work in the same call (on PostgreSQL, the coalesced shared transaction).
            let queue = format!("{queue}-{combined}");
            let queue = queue.as_str();
            let schedule = new_schedule(s, f.tenant, queue).await;
            let items = dues
                .iter()
                .map(|&d| NewOccurrence {
                    schedule_id: schedule,
                    overlap,
                    ..new_occ(&f, queue, secs(d), 3)
                })
                .collect();
            insert(s, &f, items).await;
            // One worker: it claims one occurrence at a time, only when it has nothing to run
            // (with its report, else once a second), and each run takes 7 s.
            let (mut now, mut runs, mut next) = (first_claim, Vec::new(), None::<Claimed>);
            while now <= 60 {
                let c = match next.take() {
                    Some(c) => c,
                    None => match claim(s, &f, queue, "lone", 1, 30, secs(now)).await.pop() {
                        Some(c) => c,
                        None => {
                            now += 1;
                            continue;
                        }
                    },
                };
                runs.push((offset(c.scheduled_for), now));
                now += 7;
                if combined {
                    let (acks, claimed) = s
                        .occurrence_finish_and_claim(
                            OccurrenceFinishMany {
                                tenant: f.tenant,
                                worker_id: "lone".into(),
                                items: vec![FinishItem {
                                    lease: LeaseRef {
                                        occurrence_id: c.id,
                                        epoch: c.epoch,
                                    },
                                    finish: ok("done"),
                                }],
                                now: Some(secs(now)),
                            },
                            OccurrenceClaim {
                                max_bytes: None,
                                tenant: f.tenant,
                                queue: queue.into(),
                                worker_id: "lone".into(),
                                max: 1,
                                lease: Some(SignedDuration::from_secs(30)),
                                key: None,
                                now: Some(secs(now)),
                            },
                        )
                        .await
                        .unwrap();
                    assert!(acks[0].accepted(), "{acks:?}");
                    next = claimed.unwrap().pop();
                } else {
                    let ack = finish(s, &f, "lone", c.id, c.epoch, ok("done"), secs(now)).await;
                    assert!(ack.accepted(), "{ack:?}");
                }
            }
            assert_eq!(runs, want, "{queue}: (due, claimed at) of each run");
            let all = schedule_occurrences(s, f.tenant, schedule).await;
            assert_eq!(all.len(), dues.len(), "{queue}: every row stays");
            for o in &all {
                let ran = runs.iter().any(|&(d, _)| d == offset(o.scheduled_for));
                let expect = if ran {
                    OccurrenceState::Succeeded
                } else {
                    OccurrenceState::SkippedOverlap
                };
                assert_eq!(
                    o.state,
                    expect,
                    "{queue}: due at {}",
                    offset(o.scheduled_for)
                );
            }
        }
    });
}

/// The history an overlap decision reads is the runs themselves, each from its claim to its
/// end — a failed attempt included, a retry that never ran again not: a run that failed still
/// covered the occurrences that came due during it (`SKIP_IF_RUNNING` skips them); the one
/// `QUEUE_ONE` kept waiting, claimed and then failed, still waited (the next is skipped); and
/// an occurrence that waited to retry and was then canceled did not run until its cancel, so
/// what came due meanwhile, while nothing ran, runs one after the other. A run whose lease
/// ended counts until then, whether the sweep or a claim's takeover ends it.
pub fn overlap_history_is_the_runs_themselves(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        use campanile_core::Overlap::{QueueOne, SkipIfRunning};
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let offset = |t: jiff::Timestamp| (t.as_millisecond() - T0) / 1000;
        let failed = || Finish::Failed {
            class: ErrorClass::Transient,
            message: "503 from upstream".into(),
        };
        let setup = async |queue: &str, overlap, dues: &[i64]| {
            let schedule = new_schedule(s, f.tenant, queue).await;
            let items = dues
                .iter()
                .map(|&d| NewOccurrence {
                    schedule_id: schedule,
                    overlap,
                    ..new_occ(&f, queue, secs(d), 3)
                })
                .collect();
            (schedule, insert(s, &f, items).await)
        };
        let state_of = async |schedule, due: i64| {
            schedule_occurrences(s, f.tenant, schedule)
                .await
                .into_iter()
                .find(|o| offset(o.scheduled_for) == due)
                .map(|o| o.state)
                .unwrap()
        };

        // A run from 0 that fails at 7: 2, 4 and 6 came due while it ran.
        let (a, _) = setup("fails", SkipIfRunning, &[0, 2, 4, 6]).await;
        let r = claim(s, &f, "fails", "lone", 1, 30, secs(0)).await;
        assert_eq!(r.len(), 1);
        let ack = finish(s, &f, "lone", r[0].id, r[0].epoch, failed(), secs(7)).await;
        assert_eq!(ack.state, Some(OccurrenceState::RetryWait));
        // The claim right after the report: whatever it takes (at most the retry, if its
        // jitter made it due already), 2, 4 and 6 are skipped.
        let got = claim(s, &f, "fails", "lone", 1, 30, secs(7)).await;
        assert!(got.iter().all(|c| c.id == r[0].id), "{got:?}");
        for due in [2, 4, 6] {
            assert_eq!(
                state_of(a, due).await,
                OccurrenceState::SkippedOverlap,
                "due at {due}"
            );
        }

        // QUEUE_ONE: 0 runs until 7; 2 waits behind it and runs from 7, failing at 8; 4 and
        // 6 came due while 0 ran and 2 waited: skipped, though 2 now waits to retry.
        let (b, _) = setup("queued", QueueOne, &[0, 2, 4, 6]).await;
        let first = claim(s, &f, "queued", "lone", 1, 30, secs(0)).await;
        let ack = finish(
            s,
            &f,
            "lone",
            first[0].id,
            first[0].epoch,
            ok("done"),
            secs(7),
        )
        .await;
        assert!(ack.accepted(), "{ack:?}");
        let second = claim(s, &f, "queued", "lone", 1, 30, secs(7)).await;
        assert_eq!(
            second
                .iter()
                .map(|c| offset(c.scheduled_for))
                .collect::<Vec<_>>(),
            vec![2]
        );
        let ack = finish(
            s,
            &f,
            "lone",
            second[0].id,
            second[0].epoch,
            failed(),
            secs(8),
        )
        .await;
        assert_eq!(ack.state, Some(OccurrenceState::RetryWait));
        let got = claim(s, &f, "queued", "lone", 1, 30, secs(8)).await;
        assert!(got.iter().all(|c| c.id == second[0].id), "{got:?}");
        for due in [4, 6] {
            assert_eq!(
                state_of(b, due).await,
                OccurrenceState::SkippedOverlap,
                "due at {due}"
            );
        }

        // A run from 0 fails at 1 and its retry is canceled at 9, unrun; 3, 4 and 5 came due
        // while nothing ran: one after the other, none skipped.
        let (c, ids) = setup("canceled", SkipIfRunning, &[0, 3, 4, 5]).await;
        let r = claim(s, &f, "canceled", "lone", 1, 30, secs(0)).await;
        let ack = finish(s, &f, "lone", r[0].id, r[0].epoch, failed(), secs(1)).await;
        assert_eq!(ack.state, Some(OccurrenceState::RetryWait));
        let ack = s
            .occurrence_cancel(OccurrenceCancel {
                tenant: f.tenant,
                occurrence_id: ids[0],
                now: Some(secs(9)),
            })
            .await
            .unwrap();
        assert_eq!(ack.state, Some(OccurrenceState::Canceled), "{ack:?}");
        let mut runs = Vec::new();
        for now in 10..14 {
            for got in claim(s, &f, "canceled", "lone", 1, 30, secs(now)).await {
                runs.push((offset(got.scheduled_for), now));
                let ack = finish(s, &f, "lone", got.id, got.epoch, ok("done"), secs(now + 1)).await;
                assert!(ack.accepted(), "{ack:?}");
            }
        }
        assert_eq!(runs, vec![(3, 10), (4, 11), (5, 12)]);
        assert_eq!(state_of(c, 0).await, OccurrenceState::Canceled);

        // A run from 0 whose worker went silent, its 5 s lease ended at 5; 2 and 4 came due
        // during it. Whether the sweep re-readies it before the next claim or that claim takes
        // it over, the same occurrences are skipped (the takeover comes after the ones that
        // came due during the lost attempt, which are decided first).
        for (overlap, skipped) in [(SkipIfRunning, vec![2, 4]), (QueueOne, vec![4])] {
            for swept in [false, true] {
                let queue = format!("lost-{}-{swept}", overlap.code());
                let (sched, _) = setup(&queue, overlap, &[0, 2, 4]).await;
                let first = claim(s, &f, &queue, "gone", 1, 5, secs(0)).await;
                assert_eq!(first.len(), 1);
                if swept {
                    s.lease_sweep(LeaseSweep {
                        limit: 100,
                        now: Some(at(5_100)),
                    })
                    .await
                    .unwrap();
                }
                let next = claim(s, &f, &queue, "lone", 1, 30, at(5_200)).await;
                assert_eq!(next.len(), 1, "{overlap:?} swept={swept}");
                // A claim stops looking once it is full: one more decides the rest.
                claim(s, &f, &queue, "other", 1, 30, at(5_300)).await;
                let mut got = Vec::new();
                for o in schedule_occurrences(s, f.tenant, sched).await {
                    if o.state == OccurrenceState::SkippedOverlap {
                        got.push(offset(o.scheduled_for));
                    }
                }
                got.sort_unstable();
                assert_eq!(got, skipped, "{overlap:?} swept={swept}");
            }
        }

        // One left pending in a queue no worker reads any more (an old version's, redriven)
        // does not keep the schedule's occurrences in the claimed queue waiting.
        let moved = new_schedule(s, f.tenant, "new").await;
        let occ = |queue, due| NewOccurrence {
            schedule_id: moved,
            overlap: QueueOne,
            ..new_occ(&f, queue, secs(due), 3)
        };
        insert(s, &f, vec![occ("old", 0), occ("new", 1)]).await;
        let got = claim(s, &f, "new", "lone", 1, 30, secs(2)).await;
        assert_eq!(
            got.iter()
                .map(|c| offset(c.scheduled_for))
                .collect::<Vec<_>>(),
            vec![1]
        );
    });
}

/// Eight claimers racing on one queue, round after round, never run two occurrences of a
/// `SKIP_IF_RUNNING` or a `QUEUE_ONE` schedule at once. Each schedule's first occurrence runs,
/// and a hundred more come due while it does: the racing claims record them all as skipped —
/// `QUEUE_ONE` keeps the first of them waiting, run once the first run is finished — while the
/// queue's unconstrained work runs side by side. Nothing is dropped: every row stays, on record.
pub fn racing_claimers_keep_overlap_policies(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        // More due rows of the two schedules than one claim locks as candidates (its room plus
        // 64), so that racing claimers split them.
        const DUE: usize = 100;
        let skip = new_schedule(s, f.tenant, "ovl").await;
        let one = new_schedule(s, f.tenant, "ovl").await;
        let mut items = Vec::new();
        for (schedule_id, overlap) in [
            (skip, campanile_core::Overlap::SkipIfRunning),
            (one, campanile_core::Overlap::QueueOne),
        ] {
            items.extend((0..=DUE as i64).map(|i| NewOccurrence {
                schedule_id,
                overlap,
                ..new_occ(&f, "ovl", at(i), 3)
            }));
        }
        items.extend((1..=20).map(|i| new_occ(&f, "ovl", at(i), 3)));
        insert(s, &f, items).await;
        // Each schedule's first occurrence runs from 0; the other hundred come due during it.
        let first = claim(s, &f, "ovl", "p", 5, 600, at(0)).await;
        assert_eq!(first.len(), 2, "{first:?}");
        let states = async |schedule: ScheduleId| {
            let all = schedule_occurrences(s, f.tenant, schedule).await;
            let mut n: std::collections::HashMap<OccurrenceState, usize> = Default::default();
            for o in all {
                *n.entry(o.state).or_default() += 1;
            }
            n
        };
        let count = |n: &std::collections::HashMap<OccurrenceState, usize>, st| {
            n.get(&st).copied().unwrap_or(0)
        };
        let mut allowed = 0;
        // Claimed in each round and running after it: nothing (the first runs still run),
        // then, once they have finished, the one QUEUE_ONE kept waiting, then nothing.
        for (round, expect, running_after) in [
            (0, [0, 0], [1, 1]),
            (1, [0, 1], [0, 1]),
            (2, [0, 0], [0, 0]),
        ] {
            let now = secs(100 + round);
            let mut tasks = tokio::task::JoinSet::new();
            for w in 0..8 {
                let store = h.store.clone();
                let tenant = f.tenant;
                tasks.spawn(async move {
                    let worker = format!("w{w}");
                    let got = store
                        .occurrence_claim(OccurrenceClaim {
                            max_bytes: None,
                            tenant,
                            queue: "ovl".into(),
                            worker_id: worker.clone(),
                            max: 5,
                            lease: Some(SignedDuration::from_secs(600)),
                            key: None,
                            now: Some(now),
                        })
                        .await
                        .unwrap();
                    got.into_iter()
                        .map(move |c| (worker.clone(), c))
                        .collect::<Vec<_>>()
                });
            }
            let got: Vec<(String, Claimed)> =
                tasks.join_all().await.into_iter().flatten().collect();
            for (((name, schedule), claimed_want), running) in
                [("skip_if_running", skip), ("queue_one", one)]
                    .into_iter()
                    .zip(expect)
                    .zip(running_after)
            {
                let claimed = got
                    .iter()
                    .filter(|(_, c)| c.schedule_id == schedule)
                    .count();
                let n = states(schedule).await;
                assert_eq!(
                    claimed, claimed_want,
                    "round {round}: {name} claimed, {n:?}"
                );
                assert_eq!(
                    count(&n, OccurrenceState::Running),
                    running,
                    "round {round}: {name} running, {n:?}"
                );
                assert_eq!(
                    n.values().sum::<usize>(),
                    DUE + 1,
                    "{name}: every row stays"
                );
            }
            allowed += got
                .iter()
                .filter(|(_, c)| c.schedule_id == f.schedule)
                .count();
            // Everything claimed in this round finishes before the next.
            for (worker, c) in &got {
                let ack = finish(s, &f, worker, c.id, c.epoch, ok("done"), now).await;
                assert!(ack.accepted(), "{ack:?}");
            }
            if round == 0 {
                for c in &first {
                    let ack = finish(s, &f, "p", c.id, c.epoch, ok("done"), now).await;
                    assert!(ack.accepted(), "{ack:?}");
                }
            }
        }
        // The unconstrained twenty ran, none twice; of the constrained, one and two ran and
        // the rest are on record as skipped.
        assert_eq!(allowed, 20);
        for (schedule, ran) in [(skip, 1), (one, 2)] {
            let n = states(schedule).await;
            assert_eq!(count(&n, OccurrenceState::Succeeded), ran, "{n:?}");
            assert_eq!(
                count(&n, OccurrenceState::SkippedOverlap),
                DUE + 1 - ran,
                "{n:?}"
            );
        }
    });
}

/// Every backend refuses, at its front door, a request that breaks the store's rules
/// ([`campanile_store::rules`]) — a claim of no occurrence or of more than 1,000, a lease that
/// is not positive or longer than a day, a blank or NUL worker id, the relay's reserved queue;
/// a renewal or a report from a blank worker — and nothing is claimed or written.
pub fn requests_breaking_the_rules_are_refused_by_every_backend(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(s, &f, vec![new_occ(&f, "q", secs(1), 3)]).await;
        let base = claim_params(&f, "q", "w", 1, None, None, secs(5));
        let day = campanile_store::rules::LEASE_MAX;
        let refused = [
            OccurrenceClaim {
                max: 0,
                ..base.clone()
            },
            OccurrenceClaim {
                max: 1001,
                ..base.clone()
            },
            OccurrenceClaim {
                lease: Some(SignedDuration::ZERO),
                ..base.clone()
            },
            OccurrenceClaim {
                lease: Some(day + SignedDuration::from_millis(1)),
                ..base.clone()
            },
            OccurrenceClaim {
                worker_id: " ".into(),
                ..base.clone()
            },
            OccurrenceClaim {
                worker_id: "a\0b".into(),
                ..base.clone()
            },
            OccurrenceClaim {
                queue: "$nats.x".into(),
                ..base.clone()
            },
        ];
        for p in refused {
            let what = format!("{p:?}");
            assert!(
                matches!(s.occurrence_claim(p).await, Err(StoreError::Invalid(_))),
                "{what}"
            );
        }
        let renew = s
            .lease_renew(LeaseRenew {
                tenant: f.tenant,
                worker_id: "w".into(),
                leases: vec![],
                lease: Some(SignedDuration::ZERO),
                now: Some(secs(5)),
            })
            .await;
        assert!(matches!(renew, Err(StoreError::Invalid(_))), "{renew:?}");
        let report = s
            .occurrence_finish_many(OccurrenceFinishMany {
                tenant: f.tenant,
                worker_id: "".into(),
                items: vec![],
                now: Some(secs(5)),
            })
            .await;
        assert!(matches!(report, Err(StoreError::Invalid(_))), "{report:?}");
        // Nothing was claimed: the one occurrence is still there for a claim that keeps them,
        // with the longest lease allowed.
        let got = s
            .occurrence_claim(OccurrenceClaim {
                lease: Some(day),
                ..base
            })
            .await
            .unwrap();
        assert_eq!(got.iter().map(|c| c.id).collect::<Vec<_>>(), ids);
    });
}
