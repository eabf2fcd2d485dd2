//! Retries, dead letters, cancels, the sweep, uniqueness, tenancy and queries.

use campanile_core::{Backoff, ErrorClass, OccurrenceState};
use jiff::SignedDuration;
use tokio::runtime::Runtime;

use super::*;

pub fn transient_failure_backs_off_then_retries(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(s, &f, vec![new_occ(&f, "q", secs(0), 5)]).await;
        let c = claim(s, &f, "q", "A", 1, 30, secs(0)).await;
        let ack = finish(
            s,
            &f,
            "A",
            ids[0],
            c[0].epoch,
            Finish::Failed {
                class: ErrorClass::Transient,
                message: "503 from upstream".into(),
            },
            secs(2),
        )
        .await;
        assert_eq!((ack.rows, ack.state), (1, Some(OccurrenceState::RetryWait)));
        let retry_at = ack.retry_at.expect("retry instant");
        // Full jitter within the first ceiling (1 s), deterministic from the id.
        let backoff =
            Backoff::new(SignedDuration::from_secs(1), SignedDuration::from_secs(60)).unwrap();
        assert_eq!(
            retry_at,
            secs(2).checked_add(backoff.delay(ids[0], 1)).unwrap()
        );
        if retry_at > secs(2) {
            let before = retry_at
                .checked_sub(SignedDuration::from_millis(1))
                .unwrap();
            assert_eq!(
                get(s, &f, ids[0], before).await.occurrence.state,
                OccurrenceState::RetryWait
            );
            assert!(claim(s, &f, "q", "B", 1, 30, before).await.is_empty());
        }
        assert_eq!(
            get(s, &f, ids[0], retry_at).await.occurrence.state,
            OccurrenceState::Ready
        );
        let c = claim(s, &f, "q", "B", 1, 30, retry_at).await;
        assert_eq!((c[0].attempt, c[0].epoch), (2, 2));
        assert!(
            finish(s, &f, "B", ids[0], 2, ok("fine now"), retry_at)
                .await
                .accepted()
        );
        let d = get(s, &f, ids[0], retry_at).await;
        let outcomes: Vec<AttemptOutcome> = d.attempts.iter().map(|a| a.outcome).collect();
        assert_eq!(
            outcomes,
            vec![AttemptOutcome::Failed, AttemptOutcome::Succeeded]
        );
        assert_eq!(d.attempts[0].error_class, Some(ErrorClass::Transient));
    });
}

pub fn permanent_failure_is_dead_and_redrive_keeps_history(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(s, &f, vec![new_occ(&f, "q", secs(0), 5)]).await;
        let c = claim(s, &f, "q", "A", 1, 30, secs(0)).await;
        let ack = finish(
            s,
            &f,
            "A",
            ids[0],
            c[0].epoch,
            Finish::Failed {
                class: ErrorClass::Permanent,
                message: "bad payload".into(),
            },
            secs(1),
        )
        .await;
        assert_eq!(ack.state, Some(OccurrenceState::Dead));
        assert!(
            claim(s, &f, "q", "A", 1, 30, secs(100)).await.is_empty(),
            "dead letters are not claimed"
        );
        let dead = s
            .occurrence_list(OccurrenceList {
                tenant: f.tenant,
                state: Some(OccurrenceState::Dead),
                limit: 10,
                now: Some(secs(2)),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(dead.iter().map(|o| o.id).collect::<Vec<_>>(), ids);

        // Redrive only applies to DEAD; it keeps the id and the history, resets the budget.
        let ack = s
            .occurrence_redrive(OccurrenceRedrive {
                tenant: f.tenant,
                occurrence_id: ids[0],
                now: Some(secs(200)),
            })
            .await
            .unwrap();
        assert_eq!((ack.rows, ack.state), (1, Some(OccurrenceState::Ready)));
        let again = s
            .occurrence_redrive(OccurrenceRedrive {
                tenant: f.tenant,
                occurrence_id: ids[0],
                now: Some(secs(200)),
            })
            .await
            .unwrap();
        assert_eq!(
            again.conflict,
            Some(Conflict::WrongState {
                state: OccurrenceState::Ready
            })
        );
        let c = claim(s, &f, "q", "B", 1, 30, secs(200)).await;
        assert_eq!(
            (c[0].id, c[0].attempt, c[0].epoch),
            (ids[0], 1, 2),
            "budget reset, epoch keeps growing"
        );
        assert!(
            finish(s, &f, "B", ids[0], 2, ok("redriven"), secs(201))
                .await
                .accepted()
        );
        let d = get(s, &f, ids[0], secs(201)).await;
        assert_eq!(d.attempts.len(), 2);
        assert_eq!(d.occurrence.result.as_deref(), Some("redriven"));
    });
}

pub fn cancel_pending_and_running(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(
            s,
            &f,
            vec![new_occ(&f, "q", secs(0), 5), new_occ(&f, "q", secs(50), 5)],
        )
        .await;
        let c = claim(s, &f, "q", "A", 1, 300, secs(1)).await;
        assert_eq!(c[0].id, ids[0]);
        // Pending: canceled outright, never claimable.
        let ack = s
            .occurrence_cancel(OccurrenceCancel {
                tenant: f.tenant,
                occurrence_id: ids[1],
                now: Some(secs(2)),
            })
            .await
            .unwrap();
        assert_eq!((ack.rows, ack.state), (1, Some(OccurrenceState::Canceled)));
        assert!(claim(s, &f, "q", "B", 5, 30, secs(60)).await.is_empty());
        // Running: stays running, the worker sees the flag on its next renew.
        let ack = s
            .occurrence_cancel(OccurrenceCancel {
                tenant: f.tenant,
                occurrence_id: ids[0],
                now: Some(secs(2)),
            })
            .await
            .unwrap();
        assert_eq!((ack.rows, ack.state), (1, Some(OccurrenceState::Running)));
        let r = renew(s, f.tenant, "A", ids[0], 1, 30, secs(3)).await;
        assert!(r.renewed && r.cancel_requested);
        // Canceling something finished is a conflict that names its state.
        let ack = s
            .occurrence_cancel(OccurrenceCancel {
                tenant: f.tenant,
                occurrence_id: ids[1],
                now: Some(secs(4)),
            })
            .await
            .unwrap();
        assert_eq!(
            ack.conflict,
            Some(Conflict::WrongState {
                state: OccurrenceState::Canceled
            })
        );
        let canceled = s
            .occurrence_list(OccurrenceList {
                tenant: f.tenant,
                state: Some(OccurrenceState::Canceled),
                limit: 10,
                now: Some(secs(4)),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(canceled.len(), 1);
        // The worker that was asked to stop goes silent: its lease (renewed to 33 s) runs out.
        // The run is over and it was canceled, so it is not handed out again — neither by a
        // claim, which takes over expired leases, nor by the recovery sweep, which ends it as
        // `CANCELED` (the lost attempt on record).
        assert!(claim(s, &f, "q", "B", 5, 30, secs(40)).await.is_empty());
        let swept = s
            .lease_sweep(LeaseSweep {
                limit: 10,
                now: Some(secs(40)),
            })
            .await
            .unwrap();
        assert_eq!(
            swept,
            SweepReport {
                requeued: 0,
                dead: 0,
                canceled: 1
            }
        );
        let d = get(s, &f, ids[0], secs(41)).await;
        assert_eq!(d.occurrence.state, OccurrenceState::Canceled);
        assert_eq!(
            d.attempts.iter().map(|a| a.outcome).collect::<Vec<_>>(),
            [AttemptOutcome::LeaseExpired]
        );
        assert!(claim(s, &f, "q", "B", 5, 30, secs(50)).await.is_empty());
        // The late worker's report is refused: the occurrence ended without it.
        let ack = finish(s, &f, "A", ids[0], 1, ok("late"), secs(51)).await;
        assert!(!ack.accepted(), "{ack:?}");
    });
}

/// A worker told to stop (the cancel flag) that reports a transient failure ends its
/// occurrence `CANCELED`: retrying would run a canceled job again (`RETRY_WAIT`, then the next
/// claim would hand it out with the flag cleared). A success
/// is still accepted (the work was done) and a permanent failure is still a dead letter.
pub fn a_canceled_run_that_fails_is_not_retried(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(
            s,
            &f,
            (0..3).map(|i| new_occ(&f, "q", secs(i), 5)).collect(),
        )
        .await;
        let c = claim(s, &f, "q", "A", 3, 300, secs(3)).await;
        assert_eq!(c.len(), 3);
        for id in &ids {
            let ack = s
                .occurrence_cancel(OccurrenceCancel {
                    tenant: f.tenant,
                    occurrence_id: *id,
                    now: Some(secs(4)),
                })
                .await
                .unwrap();
            assert_eq!(ack.state, Some(OccurrenceState::Running));
        }
        let failed = |class| Finish::Failed {
            class,
            message: "stopped as asked".into(),
        };
        let transient = failed(campanile_core::ErrorClass::Transient);
        let ack = finish(s, &f, "A", ids[0], 1, transient, secs(5)).await;
        assert_eq!((ack.rows, ack.state), (1, Some(OccurrenceState::Canceled)));
        let permanent = failed(campanile_core::ErrorClass::Permanent);
        let ack = finish(s, &f, "A", ids[1], 1, permanent, secs(5)).await;
        assert_eq!((ack.rows, ack.state), (1, Some(OccurrenceState::Dead)));
        let ack = finish(s, &f, "A", ids[2], 1, ok("done anyway"), secs(5)).await;
        assert_eq!((ack.rows, ack.state), (1, Some(OccurrenceState::Succeeded)));
        // Long after any backoff, nothing is handed out again.
        assert!(claim(s, &f, "q", "B", 5, 30, secs(3_600)).await.is_empty());
        let d = get(s, &f, ids[0], secs(3_600)).await;
        assert_eq!(d.occurrence.state, OccurrenceState::Canceled);
        assert_eq!(
            d.attempts.iter().map(|a| a.outcome).collect::<Vec<_>>(),
            [AttemptOutcome::Failed]
        );
    });
}

pub fn sweep_is_bounded_and_counts_attempts(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let mut items: Vec<NewOccurrence> = (0..10).map(|i| new_occ(&f, "q", at(i), 3)).collect();
        items.extend((10..13).map(|i| new_occ(&f, "q", at(i), 1)));
        insert(s, &f, items).await;
        assert_eq!(claim(s, &f, "q", "A", 100, 5, secs(1)).await.len(), 13);
        // Nothing expired yet.
        assert_eq!(
            s.lease_sweep(LeaseSweep {
                limit: 4,
                now: Some(at(5_999))
            })
            .await
            .unwrap(),
            SweepReport::default()
        );
        let mut total = SweepReport::default();
        let mut calls = 0;
        loop {
            let r = s
                .lease_sweep(LeaseSweep {
                    limit: 4,
                    now: Some(secs(6)),
                })
                .await
                .unwrap();
            assert!(r.requeued + r.dead <= 4, "bounded: {r:?}");
            if r == SweepReport::default() {
                break;
            }
            total.requeued += r.requeued;
            total.dead += r.dead;
            calls += 1;
        }
        assert_eq!((total.requeued, total.dead, calls), (10, 3, 4));
        let again = claim(s, &f, "q", "B", 100, 5, secs(6)).await;
        assert_eq!(again.len(), 10);
        assert!(again.iter().all(|c| c.attempt == 2 && c.epoch == 2));
        // Requeued by the sweep, each is available again from its lost lease's end.
        assert!(again.iter().all(|c| c.available_at == secs(6)), "{again:?}");
    });
}

pub fn duplicate_keys_are_ignored(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let first = s
            .occurrence_insert_many(OccurrenceInsertMany {
                tenant: f.tenant,
                items: vec![new_occ(&f, "q", secs(1), 3), new_occ(&f, "q", secs(2), 3)],
                now: Some(secs(0)),
            })
            .await
            .unwrap();
        assert_eq!(first, 2);
        let mut v2 = new_occ(&f, "q", secs(2), 3);
        v2.version = 2; // a new version may plan the same instant
        let second = s
            .occurrence_insert_many(OccurrenceInsertMany {
                tenant: f.tenant,
                items: vec![
                    new_occ(&f, "q", secs(2), 3),
                    new_occ(&f, "q", secs(3), 3),
                    v2,
                ],
                now: Some(secs(0)),
            })
            .await
            .unwrap();
        assert_eq!(second, 2);
        let all = s
            .occurrence_list(OccurrenceList {
                tenant: f.tenant,
                limit: 100,
                now: Some(secs(0)),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(all.len(), 4);
        // Addressed by (schedule, instant): the highest version.
        let by_key = s
            .occurrence_get(OccurrenceGet {
                tenant: f.tenant,
                key: OccurrenceKey::Planned {
                    schedule_id: f.schedule,
                    scheduled_for: secs(2),
                },
                now: Some(secs(0)),
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(by_key.occurrence.version, 2);
    });
}

pub fn tenants_are_isolated(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let a = fixture(s, "tenant-a", "shared-name").await;
        let b = fixture(s, "tenant-b", "shared-name").await;
        assert!(matches!(
            s.tenant_create(TenantCreate {
                name: "tenant-a".into(),
                now: None
            })
            .await,
            Err(StoreError::AlreadyExists(_))
        ));
        let ids = insert(s, &a, vec![new_occ(&a, "shared-name", secs(0), 3)]).await;
        // B's queue of the same name is another queue.
        assert!(
            claim(s, &b, "shared-name", "B", 10, 5, secs(1))
                .await
                .is_empty()
        );
        let bogus = Fixture {
            tenant: b.tenant,
            schedule: a.schedule,
        };
        assert!(
            s.occurrence_get(OccurrenceGet {
                tenant: b.tenant,
                key: OccurrenceKey::Id(ids[0]),
                now: None
            })
            .await
            .unwrap()
            .is_none()
        );
        let c = claim(s, &a, "shared-name", "A", 1, 5, secs(1)).await;
        assert_eq!(c.len(), 1);
        let ack = finish(s, &bogus, "A", ids[0], 1, ok("hijack"), secs(2)).await;
        assert_eq!(ack.conflict, Some(Conflict::NotFound));
        let r = renew(s, b.tenant, "A", ids[0], 1, 5, secs(2)).await;
        assert!(!r.renewed);
        let ack = s
            .occurrence_cancel(OccurrenceCancel {
                tenant: b.tenant,
                occurrence_id: ids[0],
                now: None,
            })
            .await
            .unwrap();
        assert_eq!(ack.conflict, Some(Conflict::NotFound));
        let listed = s
            .occurrence_list(OccurrenceList {
                tenant: b.tenant,
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(listed.is_empty());
        assert!(
            finish(s, &a, "A", ids[0], 1, ok("mine"), secs(2))
                .await
                .accepted()
        );
    });
}

pub fn list_filters_and_cursor(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let mut items: Vec<NewOccurrence> =
            (0..20).map(|i| new_occ(&f, "q", secs(i * 10), 3)).collect();
        for i in 20..23 {
            let mut m = new_occ(&f, "q", secs(i * 10), 3);
            m.state = OccurrenceState::Missed;
            items.push(m);
        }
        let mut skipped = new_occ(&f, "q", secs(230), 3);
        skipped.state = OccurrenceState::SkippedOverlap;
        items.push(skipped);
        insert(s, &f, items).await;
        let other = fixture(s, "acme-2", "q").await;
        insert(s, &other, vec![new_occ(&other, "q", secs(5), 3)]).await;

        let list =
            |state: Option<OccurrenceState>, from: Option<i64>, to: Option<i64>| OccurrenceList {
                tenant: f.tenant,
                schedule_id: Some(f.schedule),
                state,
                from: from.map(secs),
                to: to.map(secs),
                after: None,
                limit: 100,
                now: Some(secs(55)),
            };
        let missed = s
            .occurrence_list(list(Some(OccurrenceState::Missed), None, None))
            .await
            .unwrap();
        assert_eq!(missed.len(), 3);
        let skipped = s
            .occurrence_list(list(Some(OccurrenceState::SkippedOverlap), None, None))
            .await
            .unwrap();
        assert_eq!(skipped.len(), 1);
        // At t=55, 0..50 are READY (6), 60..190 SCHEDULED (14).
        assert_eq!(
            s.occurrence_list(list(Some(OccurrenceState::Ready), None, None))
                .await
                .unwrap()
                .len(),
            6
        );
        assert_eq!(
            s.occurrence_list(list(Some(OccurrenceState::Scheduled), None, None))
                .await
                .unwrap()
                .len(),
            14
        );
        let window = s
            .occurrence_list(list(None, Some(100), Some(150)))
            .await
            .unwrap();
        assert_eq!(
            window.iter().map(|o| o.scheduled_for).collect::<Vec<_>>(),
            (10..15).map(|i| secs(i * 10)).collect::<Vec<_>>()
        );
        // Cursor pages cover everything exactly once, in order.
        let seen = list_pages(
            s,
            OccurrenceList {
                limit: 7,
                ..list(None, None, None)
            },
        )
        .await;
        assert_eq!(
            seen.iter().map(|o| o.scheduled_for).collect::<Vec<_>>(),
            (0..24).map(|i| secs(i * 10)).collect::<Vec<_>>()
        );

        // Across the tenant's schedules: a second one shares some instants and falls between
        // others, so the order within an instant is by id.
        let second = Fixture {
            tenant: f.tenant,
            schedule: new_schedule(s, f.tenant, "q").await,
        };
        let mut theirs: Vec<NewOccurrence> = (0..10)
            .map(|i| new_occ(&second, "q", secs(i * 25), 3))
            .collect();
        theirs[3].state = OccurrenceState::Missed;
        insert(s, &second, theirs).await;
        let all = |from: Option<i64>, to: Option<i64>| OccurrenceList {
            schedule_id: None,
            ..list(None, from, to)
        };
        let mut expected: Vec<(Timestamp, OccurrenceId)> = (0..24)
            .map(|i| (f.schedule, secs(i * 10)))
            .chain((0..10).map(|i| (second.schedule, secs(i * 25))))
            .map(|(id, t)| (t, occurrence_id(id, 1, t)))
            .collect();
        expected.sort();
        let key = |o: &Occurrence| (o.scheduled_for, o.id);
        let seen = list_pages(
            s,
            OccurrenceList {
                limit: 3,
                ..all(None, None)
            },
        )
        .await;
        assert_eq!(
            seen.iter().map(key).collect::<Vec<_>>(),
            expected,
            "every occurrence of the tenant once, in order"
        );
        let window = s.occurrence_list(all(Some(50), Some(100))).await.unwrap();
        assert_eq!(
            window.iter().map(key).collect::<Vec<_>>(),
            expected
                .iter()
                .copied()
                .filter(|(t, _)| (secs(50)..secs(100)).contains(t))
                .collect::<Vec<_>>()
        );
        let resumed = s
            .occurrence_list(OccurrenceList {
                after: Some(expected[5]),
                ..all(Some(20), Some(200))
            })
            .await
            .unwrap();
        assert_eq!(
            resumed.iter().map(key).collect::<Vec<_>>(),
            expected
                .iter()
                .copied()
                .filter(|k| *k > expected[5] && (secs(20)..secs(200)).contains(&k.0))
                .collect::<Vec<_>>()
        );
        let missed = s
            .occurrence_list(OccurrenceList {
                state: Some(OccurrenceState::Missed),
                ..all(None, None)
            })
            .await
            .unwrap();
        assert_eq!(
            missed.iter().map(|o| o.scheduled_for).collect::<Vec<_>>(),
            [secs(75), secs(200), secs(210), secs(220)]
        );

        // An occurrence planned before 1970 (older versions accepted such one-offs; its id's
        // instant wraps) is listed once, last, by cursor pages across schedules.
        let old = fixture(s, "acme-3", "q").await;
        let before_1970 = Timestamp::from_millisecond(-60_000).unwrap();
        let mut items: Vec<NewOccurrence> =
            (0..3).map(|i| new_occ(&old, "q", secs(i), 3)).collect();
        items.push(new_occ(&old, "q", before_1970, 3));
        insert(s, &old, items).await;
        let seen = list_pages(
            s,
            OccurrenceList {
                tenant: old.tenant,
                limit: 1,
                ..all(None, None)
            },
        )
        .await;
        assert_eq!(
            seen.iter().map(|o| o.scheduled_for).collect::<Vec<_>>(),
            [secs(0), secs(1), secs(2), before_1970]
        );
    });
}

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
        s.queue_limit_set(f.tenant, "q2", Some(2)).await.unwrap();
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
        s.queue_limit_set(f.tenant, "q2", None).await.unwrap();
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
            s.tenant_quota_get(r.tenant)
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
        s.queue_limit_set(g.tenant, "q3", Some(3)).await.unwrap();
        assert_eq!(claim(s, &g, "q3", "A", 10, 60, secs(3)).await.len(), 1);
        assert!(claim(s, &g, "q3", "A", 10, 60, secs(3)).await.is_empty());
    });
}

pub fn backlog_counts_due_unclaimed_work(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let empty = s.backlog(Some(secs(100))).await.unwrap();
        assert_eq!((empty.due, empty.oldest_due_at), (0, None));
        // Due at 10, 20, 30 s; one more due only at 500 s; a second queue due at 5 s.
        let mut items: Vec<_> = [10, 20, 30, 500]
            .into_iter()
            .map(|t| new_occ(&f, "q", secs(t), 3))
            .collect();
        items.push(new_occ(&f, "other", secs(5), 3));
        insert(s, &f, items).await;
        let b = s.backlog(Some(secs(100))).await.unwrap();
        assert_eq!((b.due, b.oldest_due_at), (4, Some(secs(5))));
        assert_eq!(b.outbox_pending, 0);
        // Claimed work is no longer waiting; the oldest moves on.
        claim(s, &f, "other", "A", 10, 600, secs(100)).await;
        claim(s, &f, "q", "A", 1, 600, secs(100)).await;
        let b = s.backlog(Some(secs(100))).await.unwrap();
        assert_eq!((b.due, b.oldest_due_at), (2, Some(secs(20))));
        // At 550 s the future one is due too (and the leases above are still held).
        let b = s.backlog(Some(secs(550))).await.unwrap();
        assert_eq!((b.due, b.oldest_due_at), (3, Some(secs(20))));
    });
}

pub fn the_first_shard_count_recorded_is_kept(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        assert_eq!(s.deployment_shards(16).await.unwrap(), 16);
        // A node started with another count learns the recorded one (and refuses to start).
        assert_eq!(s.deployment_shards(8).await.unwrap(), 16);
        assert_eq!(s.deployment_shards(16).await.unwrap(), 16);
    });
}

/// The attempt history is exact whichever way attempts end: who held each lease, from when,
/// until which (renewed) lease end, when and how it ended. An expired lease is recorded both
/// when another worker re-claims the occurrence and when the sweep re-readies it.
pub fn attempt_history_records_every_attempt_exactly(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(s, &f, vec![new_occ(&f, "q", secs(0), 5)]).await;
        let id = ids[0];
        let attempt = |epoch: i64,
                       owner: &str,
                       started: i64,
                       lease: i64,
                       finished: Option<i64>,
                       outcome: AttemptOutcome| Attempt {
            epoch,
            owner: owner.into(),
            started_at: secs(started),
            lease_until: secs(lease),
            finished_at: finished.map(secs),
            outcome,
            error_class: None,
            error_message: None,
        };
        // A claims at 0 (lease to 30) and renews at 10 (lease to 40).
        let c = claim(s, &f, "q", "A", 1, 30, secs(0)).await;
        assert_eq!(
            get(s, &f, id, secs(1)).await.attempts,
            vec![attempt(1, "A", 0, 30, None, AttemptOutcome::Running)]
        );
        let r = renew(s, f.tenant, "A", id, c[0].epoch, 30, secs(10)).await;
        assert!(r.renewed);
        let running_a = attempt(1, "A", 0, 40, None, AttemptOutcome::Running);
        assert_eq!(get(s, &f, id, secs(11)).await.attempts, vec![running_a]);
        // A goes silent; B re-claims at 50: A's attempt lost its renewed lease.
        let c = claim(s, &f, "q", "B", 1, 20, secs(50)).await;
        assert_eq!(c[0].epoch, 2);
        let lost_a = attempt(1, "A", 0, 40, Some(50), AttemptOutcome::LeaseExpired);
        assert_eq!(
            get(s, &f, id, secs(51)).await.attempts,
            vec![
                lost_a.clone(),
                attempt(2, "B", 50, 70, None, AttemptOutcome::Running)
            ]
        );
        // B fails transiently at 55.
        let ack = finish(
            s,
            &f,
            "B",
            id,
            2,
            Finish::Failed {
                class: ErrorClass::Transient,
                message: "timeout".into(),
            },
            secs(55),
        )
        .await;
        assert_eq!(ack.state, Some(OccurrenceState::RetryWait));
        let failed_b = Attempt {
            error_class: Some(ErrorClass::Transient),
            error_message: Some("timeout".into()),
            ..attempt(2, "B", 50, 70, Some(55), AttemptOutcome::Failed)
        };
        // C claims at 100 and goes silent; the sweep at 200 re-readies it.
        assert_eq!(claim(s, &f, "q", "C", 1, 10, secs(100)).await[0].epoch, 3);
        let swept = s
            .lease_sweep(LeaseSweep {
                limit: 10,
                now: Some(secs(200)),
            })
            .await
            .unwrap();
        assert_eq!(swept.requeued, 1);
        let lost_c = attempt(3, "C", 100, 110, Some(200), AttemptOutcome::LeaseExpired);
        // D claims at 300 and succeeds at 301.
        assert_eq!(claim(s, &f, "q", "D", 1, 10, secs(300)).await[0].epoch, 4);
        assert!(
            finish(s, &f, "D", id, 4, ok("done"), secs(301))
                .await
                .accepted()
        );
        let d = get(s, &f, id, secs(302)).await;
        assert_eq!(
            d.attempts,
            vec![
                lost_a,
                failed_b,
                lost_c,
                attempt(4, "D", 300, 310, Some(301), AttemptOutcome::Succeeded)
            ]
        );
        assert_eq!(
            (
                d.occurrence.state,
                d.occurrence.epoch,
                d.occurrence.attempts
            ),
            (OccurrenceState::Succeeded, 4, 4)
        );
    });
}

/// What an older campanile wrote at claim time, and this one no longer writes: a `running`
/// attempt row for every claimed occurrence. Valid SQL in both dialects.
pub const LEGACY_RUNNING_ATTEMPTS: &str =
    "INSERT INTO attempts (occurrence_seq, epoch, owner, started_at, lease_until, outcome)
     SELECT seq, epoch, owner, claimed_at, lease_until, 'running' FROM occurrences
      WHERE state = 'RUNNING'";

/// Attempts that an older campanile opened as `running` rows, and that end under this one, end
/// once, in place, whichever way they end: success, failure, the sweep, or a re-claim (which
/// records the lease as last renewed). `legacy` runs [`LEGACY_RUNNING_ATTEMPTS`] on the
/// store's database, as the older version would have.
pub fn attempts_opened_by_older_versions_end_in_place<F, Fut>(rt: &Runtime, h: Harness, legacy: F)
where
    F: FnOnce(&'static str) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(s, &f, (0..4).map(|i| new_occ(&f, "q", at(-i), 5)).collect()).await;
        assert_eq!(claim(s, &f, "q", "A", 4, 5, secs(0)).await.len(), 4);
        legacy(LEGACY_RUNNING_ATTEMPTS).await;
        let a = |lease: i64, finished: Option<i64>, outcome| Attempt {
            epoch: 1,
            owner: "A".into(),
            started_at: secs(0),
            lease_until: secs(lease),
            finished_at: finished.map(secs),
            outcome,
            error_class: None,
            error_message: None,
        };
        assert_eq!(
            get(s, &f, ids[0], secs(0)).await.attempts,
            vec![a(5, None, AttemptOutcome::Running)]
        );
        assert!(
            finish(s, &f, "A", ids[0], 1, ok("ok"), secs(1))
                .await
                .accepted()
        );
        assert_eq!(
            get(s, &f, ids[0], secs(1)).await.attempts,
            vec![a(5, Some(1), AttemptOutcome::Succeeded)]
        );
        let failed = Finish::Failed {
            class: ErrorClass::Permanent,
            message: "bad input".into(),
        };
        assert!(
            finish(s, &f, "A", ids[1], 1, failed, secs(1))
                .await
                .accepted()
        );
        assert_eq!(
            get(s, &f, ids[1], secs(1)).await.attempts,
            vec![Attempt {
                error_class: Some(ErrorClass::Permanent),
                error_message: Some("bad input".into()),
                ..a(5, Some(1), AttemptOutcome::Failed)
            }]
        );
        // ids[3] is renewed to 11; the sweep at 6 re-readies ids[2] only.
        let r = renew(s, f.tenant, "A", ids[3], 1, 10, secs(1)).await;
        assert!(r.renewed);
        let swept = s
            .lease_sweep(LeaseSweep {
                limit: 10,
                now: Some(secs(6)),
            })
            .await
            .unwrap();
        assert_eq!((swept.requeued, swept.dead), (1, 0));
        // B claims both at 12: ids[2] as re-readied, ids[3] over its expired lease.
        assert_eq!(claim(s, &f, "q", "B", 10, 5, secs(12)).await.len(), 2);
        let b = Attempt {
            epoch: 2,
            owner: "B".into(),
            started_at: secs(12),
            lease_until: secs(17),
            finished_at: None,
            outcome: AttemptOutcome::Running,
            error_class: None,
            error_message: None,
        };
        assert_eq!(
            get(s, &f, ids[2], secs(12)).await.attempts,
            vec![a(5, Some(6), AttemptOutcome::LeaseExpired), b.clone()]
        );
        assert_eq!(
            get(s, &f, ids[3], secs(12)).await.attempts,
            vec![a(11, Some(12), AttemptOutcome::LeaseExpired), b]
        );
    });
}

/// A report that carries a claim keeps its outcomes when the claim fails: the successes
/// are written (once), the claim's error is the claim's answer, and nothing is leased.
/// `break_claims` makes every later claim fail in the database (a trigger on the store's
/// occurrences that refuses any change of epoch), as a lost lock or a full disk would.
pub fn a_report_whose_claim_fails_keeps_its_outcomes<F, Fut>(
    rt: &Runtime,
    h: Harness,
    break_claims: F,
) where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(s, &f, (0..4).map(|i| new_occ(&f, "q", at(i), 3)).collect()).await;
        let held = claim(s, &f, "q", "A", 2, 30, secs(1)).await;
        assert_eq!(held.len(), 2);
        break_claims().await;
        let report = OccurrenceFinishMany {
            tenant: f.tenant,
            worker_id: "A".into(),
            items: held
                .iter()
                .map(|c| FinishItem {
                    lease: LeaseRef {
                        occurrence_id: c.id,
                        epoch: c.epoch,
                    },
                    finish: ok("done"),
                })
                .collect(),
            now: Some(secs(2)),
        };
        let next = OccurrenceClaim {
            max_bytes: None,
            tenant: f.tenant,
            queue: "q".into(),
            worker_id: "A".into(),
            max: 2,
            lease: Some(SignedDuration::from_secs(30)),
            key: None,
            now: Some(secs(2)),
        };
        let (acks, claimed) = s
            .occurrence_finish_and_claim(report, next)
            .await
            .expect("the outcomes are written even though the claim fails");
        assert!(claimed.is_err(), "the claim cannot succeed: {claimed:?}");
        assert_eq!(acks.len(), 2);
        for (ack, c) in acks.iter().zip(&held) {
            assert_eq!(ack.occurrence_id, c.id);
            assert_eq!(ack.conflict, None, "{ack:?}");
            assert_eq!(ack.state, Some(OccurrenceState::Succeeded));
            let o = get(s, &f, c.id, secs(3)).await.occurrence;
            assert_eq!(o.state, OccurrenceState::Succeeded);
            assert_eq!(o.result.as_deref(), Some("done"));
        }
        // The others were not leased by the failed claim.
        for id in ids.iter().filter(|id| held.iter().all(|c| c.id != **id)) {
            let o = get(s, &f, *id, secs(3)).await.occurrence;
            assert_eq!(
                (o.state, o.epoch, o.owner),
                (OccurrenceState::Ready, 0, None)
            );
        }
        // Written once: the same report again is refused.
        let again = finish(s, &f, "A", held[0].id, held[0].epoch, ok("twice"), secs(3)).await;
        assert!(
            matches!(again.conflict, Some(Conflict::WrongState { .. })),
            "{again:?}"
        );
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

/// Tenant classes (the label of the lag metrics): `default` until set, validated, at most
/// `MAX_CLASSES` besides `default` — also when two admins add the last one at once.
pub fn tenant_classes_are_bounded(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "t0", "q").await;
        let new_tenant = async |name: &str| {
            s.tenant_create(TenantCreate {
                name: name.into(),
                now: Some(at(0)),
            })
            .await
            .unwrap()
            .id
        };
        let set = |tenant: TenantId, class: &str| {
            s.tenant_class_set(TenantClassSet {
                tenant,
                class: class.into(),
            })
        };
        let listed = s.tenant_list().await.unwrap();
        assert_eq!(listed[0].class, crate::classes::DEFAULT_CLASS);
        set(f.tenant, "pro").await.unwrap();
        let by_name = s.tenant_by_name("t0").await.unwrap().unwrap();
        assert_eq!(by_name.class, "pro");
        assert!(matches!(
            set(f.tenant, "Not Valid").await,
            Err(StoreError::Invalid(_))
        ));
        assert!(matches!(
            set(TenantId(987_654), "pro").await,
            Err(StoreError::NotFound(_))
        ));
        // "pro" and c1 … c14: 15 classes besides the default.
        let mut tenants = Vec::new();
        for i in 1..=14 {
            let t = new_tenant(&format!("t{i}")).await;
            set(t, &format!("c{i}")).await.unwrap();
            tenants.push(t);
        }
        // Eight admins (tasks on the runtime's threads) add a 16th class each at once:
        // exactly one of them gets in.
        let mut racers = Vec::new();
        for i in 0..8 {
            racers.push(new_tenant(&format!("r{i}")).await);
        }
        let mut tasks = tokio::task::JoinSet::new();
        for (i, tenant) in racers.into_iter().enumerate() {
            let store = h.store.clone();
            tasks.spawn(async move {
                store
                    .tenant_class_set(TenantClassSet {
                        tenant,
                        class: format!("x{i}"),
                    })
                    .await
            });
        }
        let results = tasks.join_all().await;
        let won = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(won, 1, "{results:?}");
        for r in results.into_iter().filter_map(Result::err) {
            assert!(
                matches!(&r, StoreError::Invalid(m) if m.contains("classes")),
                "{r}"
            );
        }
        let classes: std::collections::BTreeSet<String> = s
            .tenant_list()
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.class)
            .filter(|c| c != crate::classes::DEFAULT_CLASS)
            .collect();
        assert_eq!(classes.len(), crate::classes::MAX_CLASSES, "{classes:?}");
        // Full: a new class is refused, an existing one (or the default) is not; a tenant
        // that is the only one of its class may move it to a new one (the count stays).
        let d = new_tenant("d").await;
        assert!(matches!(
            set(d, "brand-new").await,
            Err(StoreError::Invalid(_))
        ));
        set(d, "pro").await.unwrap();
        set(d, crate::classes::DEFAULT_CLASS).await.unwrap();
        set(tenants[0], "renamed").await.unwrap();
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

/// An `Idempotency-Key` reservation names the request holding it. A retry of the same request
/// takes over a reservation that has neither an answer nor a schedule once it is old enough
/// (its request died: a node killed, the database lost mid-request — otherwise such a key would
/// answer 409 for good); the create of the request that lost it is refused and writes nothing; a
/// create records its schedule on the reservation in its own transaction, so a reservation
/// whose schedule exists is never taken over nor released, and the answer is recorded once.
pub fn idempotency_reservations_are_taken_over_only_when_nothing_was_created(
    rt: &Runtime,
    h: Harness,
) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "idem", "q").await;
        let wait = SignedDuration::from_secs(10);
        let put = |token: &str, hash: &[u8], now: Timestamp| IdempotencyPut {
            tenant: f.tenant,
            key: "k1".into(),
            request_hash: hash.to_vec(),
            status: 0,
            body: String::new(),
            token: token.into(),
            take_over_after: wait,
            now: Some(now),
        };
        let create = |token: &str| ScheduleCreate {
            tenant: f.tenant,
            id: ScheduleId(Uuid::now_v7()),
            spec: spec("q"),
            shard: 0,
            next_run_at: None,
            fires_per_hour: 0,
            idempotency: Some(IdempotencyToken {
                key: "k1".into(),
                token: token.into(),
            }),
            now: Some(secs(20)),
        };
        let get = || async { s.idempotency_get(f.tenant, "k1").await.unwrap().unwrap() };

        assert!(s.idempotency_put(put("A", b"h", secs(1))).await.unwrap());
        // Held: by a younger reservation, and for good by a request that is not the same.
        assert!(!s.idempotency_put(put("B", b"h", secs(10))).await.unwrap());
        assert!(
            !s.idempotency_put(put("B", b"other", secs(60)))
                .await
                .unwrap()
        );
        // A's request died (or stalls): after the wait, its retry takes over.
        assert!(s.idempotency_put(put("B", b"h", secs(11))).await.unwrap());
        let lost = create("A");
        let err = s.schedule_create(lost.clone()).await.unwrap_err();
        assert!(matches!(err, StoreError::Superseded(_)), "{err}");
        let gone = s
            .schedule_get(ScheduleGet {
                tenant: f.tenant,
                id: lost.id,
            })
            .await
            .unwrap();
        assert!(gone.is_none(), "a refused create writes nothing");
        // A's release does not release B's reservation.
        s.idempotency_finish(f.tenant, "k1", "A", None)
            .await
            .unwrap();
        assert_eq!(get().await.status, 0);

        let made = create("B");
        s.schedule_create(made.clone()).await.unwrap();
        assert_eq!(get().await.schedule_id, Some(made.id));
        // Its request dies before answering: the reservation is neither taken over nor
        // released, whatever its age; the schedule on it is the answer.
        assert!(!s.idempotency_put(put("C", b"h", secs(600))).await.unwrap());
        s.idempotency_finish(f.tenant, "k1", "B", None)
            .await
            .unwrap();
        let held = get().await;
        assert_eq!((held.status, held.schedule_id), (0, Some(made.id)));
        // The answer is recorded once.
        s.idempotency_finish(f.tenant, "k1", "C", Some((201, "first".into())))
            .await
            .unwrap();
        s.idempotency_finish(f.tenant, "k1", "B", Some((201, "second".into())))
            .await
            .unwrap();
        let answered = get().await;
        assert_eq!((answered.status, answered.body.as_str()), (201, "first"));
        assert!(!s.idempotency_put(put("D", b"h", secs(900))).await.unwrap());

        // A reservation released by its failed request is free at once.
        let other = |token: &str, now| IdempotencyPut {
            key: "k2".into(),
            ..put(token, b"h", now)
        };
        assert!(s.idempotency_put(other("E", secs(1))).await.unwrap());
        s.idempotency_finish(f.tenant, "k2", "E", None)
            .await
            .unwrap();
        assert!(s.idempotency_put(other("F", secs(2))).await.unwrap());
    });
}
