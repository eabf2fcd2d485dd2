//! Reports and what follows them: retries with backoff, dead letters and redrive, cancel, the
//! lease sweep, and the attempt history each leaves.

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
