//! Fencing: the reference scenario, lease and due boundaries to the millisecond, renewals,
//! batches of reports fenced item by item, redrive and lease grants.

use campanile_core::{ErrorClass, OccurrenceState};
use jiff::SignedDuration;
use tokio::runtime::Runtime;

use super::*;

/// DESIGN.md's reference scenario, exactly, with a 5 s lease.
pub fn reference_scenario(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "reports").await;
        let ids = insert(
            s,
            &f,
            vec![
                new_occ(&f, "reports", secs(10), 5),
                new_occ(&f, "reports", secs(20), 5),
            ],
        )
        .await;
        let (job10, job20) = (ids[0], ids[1]);

        // t=9: nothing is due.
        assert!(
            claim(s, &f, "reports", "A", 1, 5, secs(9)).await.is_empty(),
            "t=9 must refuse"
        );
        // t=10: A claims job@10, epoch 1, lease until 15.
        let a = claim(s, &f, "reports", "A", 1, 5, secs(10)).await;
        assert_eq!(a.len(), 1);
        assert_eq!(
            (a[0].id, a[0].epoch, a[0].lease_until, a[0].attempt),
            (job10, 1, secs(15), 1)
        );
        assert_eq!(a[0].payload.as_deref(), Some("{\"report\":\"daily\"}"));
        // t=14: B is refused (A's lease is valid, job@20 not due).
        assert!(
            claim(s, &f, "reports", "B", 1, 5, secs(14))
                .await
                .is_empty(),
            "t=14 must refuse B"
        );
        // t=15: A's lease has expired exactly now: B claims, epoch 2, lease until 20.
        let b = claim(s, &f, "reports", "B", 1, 5, secs(15)).await;
        assert_eq!(b.len(), 1);
        assert_eq!(
            (b[0].id, b[0].epoch, b[0].lease_until, b[0].attempt),
            (job10, 2, secs(20), 2)
        );
        // It became claimable again when A's lease ended: that is its availability now (claim
        // lag counts from there, not from 10, which would count A's lost run as waiting).
        assert_eq!((a[0].available_at, b[0].available_at), (secs(10), secs(15)));
        assert_eq!(
            get(s, &f, job10, secs(15)).await.occurrence.available_at,
            secs(15)
        );
        // t=16: A completes with epoch 1: rejected, 0 rows, because the epoch is stale.
        let ack = finish(s, &f, "A", job10, 1, ok("A's output"), secs(16)).await;
        assert_eq!(ack.rows, 0);
        assert_eq!(
            ack.conflict,
            Some(Conflict::StaleEpoch {
                sent: 1,
                current: 2
            })
        );
        // t=16: B completes with epoch 2: accepted, 1 row.
        let ack = finish(s, &f, "B", job10, 2, ok("B's output"), secs(16)).await;
        assert_eq!(
            (ack.rows, ack.conflict.clone(), ack.state),
            (1, None, Some(OccurrenceState::Succeeded))
        );
        // A second completion: rejected, 0 rows.
        let ack = finish(s, &f, "B", job10, 2, ok("B again"), secs(16)).await;
        assert_eq!(ack.rows, 0);
        assert_eq!(
            ack.conflict,
            Some(Conflict::WrongState {
                state: OccurrenceState::Succeeded
            })
        );
        // A again, now also too late: still refused.
        let ack = finish(s, &f, "A", job10, 1, ok("A's output"), secs(16)).await;
        assert_eq!(ack.rows, 0);

        // The results table holds only job@10 = B's output.
        let all = s
            .occurrence_list(OccurrenceList {
                tenant: f.tenant,
                limit: 10,
                now: Some(secs(16)),
                ..Default::default()
            })
            .await
            .unwrap();
        let results: Vec<(OccurrenceId, Option<String>)> = all
            .iter()
            .filter(|o| o.result.is_some())
            .map(|o| (o.id, o.result.clone()))
            .collect();
        assert_eq!(results, vec![(job10, Some("B's output".to_string()))]);
        let d = get(s, &f, job10, secs(16)).await;
        assert_eq!(
            (
                d.occurrence.state,
                d.occurrence.epoch,
                d.occurrence.owner.as_deref()
            ),
            (OccurrenceState::Succeeded, 2, Some("B"))
        );
        let outcomes: Vec<(i64, &str, AttemptOutcome)> = d
            .attempts
            .iter()
            .map(|a| (a.epoch, a.owner.as_str(), a.outcome))
            .collect();
        assert_eq!(
            outcomes,
            vec![
                (1, "A", AttemptOutcome::LeaseExpired),
                (2, "B", AttemptOutcome::Succeeded)
            ]
        );

        // t=19: job@20 is not due yet; t=20: it is.
        assert!(
            claim(s, &f, "reports", "C", 1, 5, secs(19))
                .await
                .is_empty(),
            "t=19 must refuse"
        );
        let c = claim(s, &f, "reports", "C", 1, 5, secs(20)).await;
        assert_eq!((c.len(), c[0].id, c[0].epoch), (1, job20, 1));
    });
}

/// A lease is valid while `now < lease_until`: at `lease_until - 1ms` it completes, renews
/// and blocks other claims; at `lease_until` it does none of those.
pub fn lease_boundaries_to_the_millisecond(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(
            s,
            &f,
            vec![new_occ(&f, "q", secs(0), 5), new_occ(&f, "q", at(1), 5)],
        )
        .await;
        let lease_end = 5_000;

        let a = claim(s, &f, "q", "A", 1, 5, secs(0)).await;
        assert_eq!(a[0].id, ids[0]);
        // Just before the end: B cannot take it (only the other, not-yet-due... now due one).
        let b = claim(s, &f, "q", "B", 5, 5, at(lease_end - 1)).await;
        assert_eq!(b.iter().map(|c| c.id).collect::<Vec<_>>(), vec![ids[1]]);
        // Renew at lease_end - 1: renewed to (lease_end - 1) + 5 s.
        let r = renew(s, f.tenant, "A", ids[0], 1, 5, at(lease_end - 1)).await;
        assert!(r.renewed);
        let new_end = lease_end - 1 + 5_000;
        assert_eq!(r.lease_until, Some(at(new_end)));
        // Complete at new_end - 1: accepted.
        let ack = finish(s, &f, "A", ids[0], 1, ok("in time"), at(new_end - 1)).await;
        assert!(ack.accepted(), "{ack:?}");

        // B's lease on ids[1]: it ends at (lease_end - 1) + 5000. At exactly that instant a
        // completion is refused as expired, a renewal fails, and C may claim it.
        let b_end = lease_end - 1 + 5_000;
        let ack = finish(s, &f, "B", ids[1], 1, ok("too late"), at(b_end)).await;
        assert_eq!(ack.rows, 0);
        assert_eq!(
            ack.conflict,
            Some(Conflict::LeaseExpired {
                lease_until: at(b_end)
            })
        );
        let r = renew(s, f.tenant, "B", ids[1], 1, 5, at(b_end)).await;
        assert!(!r.renewed);
        assert!(claim(s, &f, "q", "C", 5, 5, at(b_end - 1)).await.is_empty());
        let c = claim(s, &f, "q", "C", 5, 5, at(b_end)).await;
        assert_eq!((c.len(), c[0].id, c[0].epoch), (1, ids[1], 2));
    });
}

/// An occurrence is due when `now >= available_at`.
pub fn due_boundary(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let mut o = new_occ(&f, "q", secs(10), 3);
        o.available_at = at(10_250); // inside a flexible window
        let ids = insert(s, &f, vec![o]).await;
        let d = get(s, &f, ids[0], at(10_249)).await;
        assert_eq!(d.occurrence.state, OccurrenceState::Scheduled);
        assert!(claim(s, &f, "q", "A", 1, 5, at(10_249)).await.is_empty());
        assert_eq!(
            get(s, &f, ids[0], at(10_250)).await.occurrence.state,
            OccurrenceState::Ready
        );
        assert_eq!(claim(s, &f, "q", "A", 1, 5, at(10_250)).await.len(), 1);
    });
}

/// With `max_attempts = 2`, the second expired lease ends the occurrence: no third claim,
/// and the sweep makes it DEAD. A transient failure on the last attempt is DEAD too.
pub fn max_attempts_boundary(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(
            s,
            &f,
            vec![new_occ(&f, "q", secs(0), 2), new_occ(&f, "q", secs(100), 2)],
        )
        .await;
        let c1 = claim(s, &f, "q", "A", 1, 5, secs(0)).await;
        assert_eq!((c1[0].attempt, c1[0].epoch), (1, 1));
        let c2 = claim(s, &f, "q", "B", 1, 5, secs(5)).await;
        assert_eq!((c2[0].id, c2[0].attempt, c2[0].epoch), (ids[0], 2, 2));
        // Attempts used up: the expired lease is not claimable again.
        assert!(claim(s, &f, "q", "C", 1, 5, secs(10)).await.is_empty());
        let report = s
            .lease_sweep(LeaseSweep {
                limit: 100,
                now: Some(secs(10)),
            })
            .await
            .unwrap();
        assert_eq!(
            report,
            SweepReport {
                requeued: 0,
                dead: 1,
                canceled: 0,
            }
        );
        let d = get(s, &f, ids[0], secs(10)).await;
        assert_eq!(
            (d.occurrence.state, d.occurrence.attempts),
            (OccurrenceState::Dead, 2)
        );
        assert_eq!(
            d.attempts
                .iter()
                .map(|a| (a.epoch, a.outcome))
                .collect::<Vec<_>>(),
            vec![
                (1, AttemptOutcome::LeaseExpired),
                (2, AttemptOutcome::LeaseExpired)
            ]
        );

        // Second occurrence: attempt 1 fails transiently -> RETRY_WAIT; attempt 2 fails
        // transiently -> DEAD (no attempts left).
        let c = claim(s, &f, "q", "A", 1, 5, secs(100)).await;
        let ack = finish(
            s,
            &f,
            "A",
            ids[1],
            c[0].epoch,
            Finish::Failed {
                class: ErrorClass::Transient,
                message: "flaky".into(),
            },
            secs(101),
        )
        .await;
        assert_eq!(ack.state, Some(OccurrenceState::RetryWait));
        let retry_at = ack.retry_at.unwrap();
        let c = claim(s, &f, "q", "A", 1, 5, retry_at).await;
        assert_eq!(c[0].attempt, 2);
        let ack = finish(
            s,
            &f,
            "A",
            ids[1],
            c[0].epoch,
            Finish::Failed {
                class: ErrorClass::Transient,
                message: "flaky again".into(),
            },
            retry_at,
        )
        .await;
        assert_eq!((ack.rows, ack.state), (1, Some(OccurrenceState::Dead)));
    });
}

/// Renewal reports, per lease, whether it was renewed; a lost lease (re-claimed, wrong
/// owner, finished) is reported as not renewed.
pub fn renew_reports_lost_leases(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(
            s,
            &f,
            (0..3).map(|i| new_occ(&f, "q", secs(i), 5)).collect(),
        )
        .await;
        let c = claim(s, &f, "q", "A", 3, 5, secs(3)).await;
        assert_eq!(c.len(), 3);
        // ids[2] is taken over after A's lease ends; ids[1] is finished.
        finish(s, &f, "A", ids[1], 1, ok("done"), secs(4)).await;
        let leases: Vec<LeaseRef> = ids
            .iter()
            .map(|&id| LeaseRef {
                occurrence_id: id,
                epoch: 1,
            })
            .collect();
        let r = s
            .lease_renew(LeaseRenew {
                tenant: f.tenant,
                worker_id: "A".into(),
                leases: leases.clone(),
                lease: Some(SignedDuration::from_secs(5)),
                now: Some(secs(7)),
            })
            .await
            .unwrap();
        assert_eq!(
            r.iter().map(|x| x.renewed).collect::<Vec<_>>(),
            vec![true, false, true]
        );
        // Each lost lease says why, as a refused completion would.
        let why = |r: &[Renewal]| -> Vec<Option<&'static str>> {
            r.iter()
                .map(|x| x.lost.as_ref().map(Conflict::check))
                .collect()
        };
        assert_eq!(why(&r), [None, Some("wrong_state"), None]);
        let c2 = claim(s, &f, "q", "B", 3, 5, secs(12)).await; // A's renewed leases ended at 12
        assert_eq!(c2.len(), 2);
        let r = s
            .lease_renew(LeaseRenew {
                tenant: f.tenant,
                worker_id: "A".into(),
                leases,
                lease: Some(SignedDuration::from_secs(5)),
                now: Some(secs(12)),
            })
            .await
            .unwrap();
        assert!(r.iter().all(|x| !x.renewed));
        assert_eq!(
            why(&r),
            [
                Some("stale_epoch"),
                Some("wrong_state"),
                Some("stale_epoch")
            ]
        );
        // A stranger cannot renew B's lease; nor can anyone renew what does not exist.
        let r = renew(s, f.tenant, "mallory", ids[0], 2, 5, secs(12)).await;
        assert!(!r.renewed);
        assert!(
            matches!(r.lost, Some(Conflict::NotOwner { owner: Some(ref o) }) if o == "B"),
            "{r:?}"
        );
        let nobody = OccurrenceId(uuid::Uuid::now_v7());
        let r = renew(s, f.tenant, "A", nobody, 1, 5, secs(12)).await;
        assert_eq!((r.renewed, r.lost), (false, Some(Conflict::NotFound)));
        // An expired lease nobody took over yet.
        let r = renew(s, f.tenant, "B", ids[0], 2, 5, secs(17)).await;
        assert!(
            matches!(r.lost, Some(Conflict::LeaseExpired { .. })),
            "{r:?}"
        );
    });
}

/// No worker holds an occurrence that is not `RUNNING`. A redriven dead letter shows no owner
/// and no lease (the dead attempt stays in its history), and a report or renewal at the dead
/// attempt's epoch is refused as `not_claimed` — not as another worker's lease — whether or
/// not that attempt's lease would still run, and whoever sends it. An occurrence the sweep took
/// back is refused to its last worker as its lease having expired, and to any other as
/// `not_claimed`.
pub fn a_redriven_occurrence_is_held_by_no_worker(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(
            s,
            &f,
            vec![new_occ(&f, "q", secs(0), 5), new_occ(&f, "q", secs(100), 5)],
        )
        .await;
        let c = claim(s, &f, "q", "A", 1, 30, secs(0)).await;
        assert_eq!((c[0].id, c[0].epoch), (ids[0], 1));
        let permanent = || Finish::Failed {
            class: ErrorClass::Permanent,
            message: "bad payload".into(),
        };
        let ack = finish(s, &f, "A", ids[0], 1, permanent(), secs(1)).await;
        assert_eq!(ack.state, Some(OccurrenceState::Dead));
        let ack = s
            .occurrence_redrive(OccurrenceRedrive {
                tenant: f.tenant,
                occurrence_id: ids[0],
                now: Some(secs(2)),
            })
            .await
            .unwrap();
        assert_eq!((ack.rows, ack.state), (1, Some(OccurrenceState::Ready)));

        // The view: READY, epoch kept, no owner, no lease; the dead attempt in the history.
        let d = get(s, &f, ids[0], secs(3)).await;
        let o = &d.occurrence;
        assert_eq!(
            (
                o.state,
                o.epoch,
                o.attempts,
                o.owner.as_deref(),
                o.lease_until
            ),
            (OccurrenceState::Ready, 1, 0, None, None)
        );
        assert_eq!(
            d.attempts
                .iter()
                .map(|a| (a.epoch, a.owner.as_str(), a.outcome, a.lease_until))
                .collect::<Vec<_>>(),
            vec![(1, "A", AttemptOutcome::Failed, secs(30))]
        );
        let listed = schedule_occurrences(s, f.tenant, f.schedule).await;
        let o = listed.iter().find(|o| o.id == ids[0]).unwrap();
        assert_eq!((o.owner.as_deref(), o.lease_until), (None, None));

        // Reports at the dead attempt's epoch, inside its old lease and after it.
        let not_claimed = Some(Conflict::NotClaimed {
            state: OccurrenceState::Ready,
        });
        for (worker, finish_as, now) in [
            ("A", ok("late"), secs(3)),
            ("A", permanent(), secs(3)),
            ("B", ok("stranger"), secs(3)),
            ("A", ok("later"), secs(40)),
        ] {
            let ack = finish(s, &f, worker, ids[0], 1, finish_as, now).await;
            assert_eq!(
                (ack.rows, &ack.conflict),
                (0, &not_claimed),
                "{worker} at {now}"
            );
        }
        let r = renew(s, f.tenant, "A", ids[0], 1, 30, secs(3)).await;
        assert_eq!((r.renewed, r.lost), (false, not_claimed.clone()));
        let d = get(s, &f, ids[0], secs(40)).await;
        assert_eq!(
            (d.occurrence.state, d.occurrence.result.as_deref()),
            (OccurrenceState::Ready, None)
        );

        // Claimed again, it is held, and its history has both attempts.
        let c = claim(s, &f, "q", "B", 1, 30, secs(41)).await;
        assert_eq!((c[0].id, c[0].epoch, c[0].attempt), (ids[0], 2, 1));
        let o = get(s, &f, ids[0], secs(41)).await.occurrence;
        assert_eq!(
            (o.state, o.owner.as_deref(), o.lease_until),
            (OccurrenceState::Running, Some("B"), Some(secs(71)))
        );
        assert!(
            finish(s, &f, "B", ids[0], 2, ok("redriven"), secs(42))
                .await
                .accepted()
        );
        let d = get(s, &f, ids[0], secs(42)).await;
        assert_eq!(
            d.attempts
                .iter()
                .map(|a| (a.epoch, a.owner.as_str(), a.outcome))
                .collect::<Vec<_>>(),
            vec![
                (1, "A", AttemptOutcome::Failed),
                (2, "B", AttemptOutcome::Succeeded)
            ]
        );

        // Taken back by the sweep after A's lease ran out: A's lease expired; B never held it.
        let c = claim(s, &f, "q", "A", 1, 5, secs(100)).await;
        assert_eq!((c[0].id, c[0].epoch), (ids[1], 1));
        let swept = s
            .lease_sweep(LeaseSweep {
                limit: 10,
                now: Some(secs(105)),
            })
            .await
            .unwrap();
        assert_eq!(swept.requeued, 1);
        let ack = finish(s, &f, "A", ids[1], 1, ok("late"), secs(106)).await;
        assert_eq!(
            ack.conflict,
            Some(Conflict::LeaseExpired {
                lease_until: secs(105)
            })
        );
        let ack = finish(s, &f, "B", ids[1], 1, ok("stranger"), secs(106)).await;
        assert_eq!(ack.conflict, not_claimed);
    });
}

/// In a batch, each item is fenced on its own: good items are accepted next to bad ones.
pub fn batch_finish_fences_each_item(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(
            s,
            &f,
            (0..4).map(|i| new_occ(&f, "q", secs(i), 5)).collect(),
        )
        .await;
        let c = claim(s, &f, "q", "A", 4, 5, secs(4)).await;
        assert_eq!(c.len(), 4);
        let unknown = occurrence_id(ScheduleId(Uuid::nil()), 1, secs(0));
        let items = vec![
            FinishItem {
                lease: LeaseRef {
                    occurrence_id: ids[0],
                    epoch: 1,
                },
                finish: ok("r0"),
            },
            FinishItem {
                lease: LeaseRef {
                    occurrence_id: ids[1],
                    epoch: 7,
                },
                finish: ok("bad epoch"),
            },
            FinishItem {
                lease: LeaseRef {
                    occurrence_id: ids[2],
                    epoch: 1,
                },
                finish: Finish::Failed {
                    class: ErrorClass::Permanent,
                    message: "no such customer".into(),
                },
            },
            FinishItem {
                lease: LeaseRef {
                    occurrence_id: unknown,
                    epoch: 1,
                },
                finish: ok("ghost"),
            },
            FinishItem {
                lease: LeaseRef {
                    occurrence_id: ids[3],
                    epoch: 1,
                },
                finish: ok("r3"),
            },
        ];
        let acks = s
            .occurrence_finish_many(OccurrenceFinishMany {
                tenant: f.tenant,
                worker_id: "A".into(),
                items,
                now: Some(secs(5)),
            })
            .await
            .unwrap();
        let summary: Vec<(u64, Option<&'static str>)> = acks
            .iter()
            .map(|a| (a.rows, a.conflict.as_ref().map(Conflict::check)))
            .collect();
        assert_eq!(
            summary,
            vec![
                (1, None),
                (0, Some("stale_epoch")),
                (1, None),
                (0, Some("not_found")),
                (1, None)
            ]
        );
        assert_eq!(acks[2].state, Some(OccurrenceState::Dead));
        // Wrong owner is its own check.
        let ack = finish(s, &f, "B", ids[1], 1, ok("not mine"), secs(5)).await;
        assert_eq!(
            ack.conflict,
            Some(Conflict::NotOwner {
                owner: Some("A".into())
            })
        );
        let d = get(s, &f, ids[2], secs(5)).await;
        assert_eq!(d.occurrence.last_error_class, Some(ErrorClass::Permanent));
        assert_eq!(d.occurrence.last_error.as_deref(), Some("no such customer"));
        assert_eq!(
            d.attempts[0].error_message.as_deref(),
            Some("no such customer")
        );
    });
}

/// Each occurrence carries its schedule's lease length. A claim that names no lease grants
/// each occurrence its own; a renewal that names none extends each by its own; a claim or
/// renewal that names one applies it to everything it touches.
pub fn claims_and_renewals_without_a_lease_grant_each_occurrences_own(rt: &Runtime, h: Harness) {
    let store = h.store.clone();
    rt.block_on(async {
        let f = fixture(store.as_ref(), "own-lease", "q").await;
        let mut short = new_occ(&f, "q", at(0), 3);
        short.lease = SignedDuration::from_secs(5);
        let mut long = new_occ(&f, "q", at(1), 3);
        long.lease = SignedDuration::from_secs(600);
        let mut third = new_occ(&f, "q", at(2), 3);
        third.lease = SignedDuration::from_secs(600);
        let ids = insert(store.as_ref(), &f, vec![short, long, third]).await;
        let plus = |t: Timestamp, s: i64| t.checked_add(SignedDuration::from_secs(s)).unwrap();

        let granted = |got: &[Claimed]| -> Vec<(OccurrenceId, Timestamp)> {
            got.iter().map(|c| (c.id, c.lease_until)).collect()
        };

        let now = secs(10);
        let got = claim_leased(store.as_ref(), &f, "q", "w", 2, None, now).await;
        let until = granted(&got);
        assert_eq!(until, [(ids[0], plus(now, 5)), (ids[1], plus(now, 600))]);
        for (id, end) in &until {
            let o = get(store.as_ref(), &f, *id, now).await.occurrence;
            assert_eq!(o.lease_until, Some(*end), "stored as answered");
        }

        let later = secs(12);
        let leases: Vec<LeaseRef> = got.iter().map(Claimed::lease).collect();
        let renew = |lease: Option<SignedDuration>| LeaseRenew {
            tenant: f.tenant,
            worker_id: "w".into(),
            leases: leases.clone(),
            lease,
            now: Some(later),
        };
        let r = store.lease_renew(renew(None)).await.unwrap();
        let ends: Vec<Option<Timestamp>> = r.iter().map(|x| x.lease_until).collect();
        assert_eq!(ends, [Some(plus(later, 5)), Some(plus(later, 600))]);
        let o = get(store.as_ref(), &f, ids[0], later).await.occurrence;
        assert_eq!(o.lease_until, Some(plus(later, 5)));
        let r = store
            .lease_renew(renew(Some(SignedDuration::from_secs(60))))
            .await
            .unwrap();
        let ends: Vec<Option<Timestamp>> = r.iter().map(|x| x.lease_until).collect();
        assert_eq!(ends, [Some(plus(later, 60)), Some(plus(later, 60))]);

        // A named lease overrides the occurrence's own.
        let got = claim(store.as_ref(), &f, "q", "w2", 5, 45, later).await;
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].id, got[0].lease_until), (ids[2], plus(later, 45)));

        // The other claim paths grant the occurrence's own lease too: a queue with a
        // concurrency limit, and overlap-constrained work.
        let mut limited = new_occ(&f, "lim", at(3), 3);
        limited.queue = "lim".into();
        limited.lease = SignedDuration::from_secs(7);
        let mut constrained = new_occ(&f, "ovl", at(4), 3);
        constrained.queue = "ovl".into();
        constrained.overlap = campanile_core::Overlap::SkipIfRunning;
        constrained.lease = SignedDuration::from_secs(9);
        let more = insert(store.as_ref(), &f, vec![limited, constrained]).await;
        store
            .queue_limit_set(QueueLimitSet {
                tenant: f.tenant,
                queue: "lim".into(),
                max_running: Some(10),
            })
            .await
            .unwrap();
        for (queue, id, secs_own) in [("lim", more[0], 7), ("ovl", more[1], 9)] {
            let got = claim_leased(store.as_ref(), &f, queue, "w3", 5, None, later).await;
            assert_eq!(
                granted(&got),
                [(id, plus(later, secs_own))],
                "queue {queue}"
            );
            let o = get(store.as_ref(), &f, id, later).await.occurrence;
            assert_eq!(o.lease_until, Some(plus(later, secs_own)), "queue {queue}");
        }
        // And a named lease overrides it on those paths too (taken over once expired).
        let after = plus(later, 60);
        for (queue, id) in [("lim", more[0]), ("ovl", more[1])] {
            let got = claim(store.as_ref(), &f, queue, "w4", 5, 45, after).await;
            assert_eq!(granted(&got), [(id, plus(after, 45))], "queue {queue}");
        }

        // A lease must be positive: a row that would be claimed already expired is refused.
        let mut none = new_occ(&f, "q", at(5), 3);
        none.lease = SignedDuration::ZERO;
        let refused = store
            .occurrence_insert_many(OccurrenceInsertMany {
                tenant: f.tenant,
                items: vec![none],
                now: Some(at(0)),
            })
            .await;
        assert!(
            matches!(refused, Err(StoreError::Invalid(_))),
            "{refused:?}"
        );
    });
}
