//! The store's own tests: what the conformance suite cannot see from outside (the writer's
//! queue, the resent-claim look-up on the writer, key bookkeeping, the row numbers reports
//! are found by).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::task::{Context, Poll, Waker};

use campanile_conformance::{claim_params, fixture, insert, new_occ, secs, spec};
use campanile_core::OccurrenceState;

use super::*;

/// Holds the writer with a job that waits until the returned sender is used; the handle
/// ends with that job.
async fn hold_writer(
    store: &SqliteStore,
) -> (
    std::sync::mpsc::Sender<()>,
    tokio::task::JoinHandle<Result<(), StoreError>>,
) {
    let (let_go, wait) = std::sync::mpsc::channel::<()>();
    let (running, is_running) = tokio::sync::oneshot::channel::<()>();
    let holder = store.clone();
    let held = tokio::spawn(async move {
        holder
            .write(move |_| {
                let _ = running.send(());
                let _ = wait.recv();
                Ok(())
            })
            .await
    });
    is_running.await.unwrap();
    (let_go, held)
}

/// The writer remembers the latest keys only: past the cap the oldest is forgotten (a key
/// entered twice counts once).
#[test]
fn recent_claim_keys_are_bounded() {
    let mut recent = RecentKeys::default();
    let keys: Vec<uuid::Uuid> = (0..=RecentKeys::CAP as u128)
        .map(uuid::Uuid::from_u128)
        .collect();
    recent.insert(keys[0]);
    for k in &keys {
        recent.insert(*k);
    }
    assert!(!recent.contains(&keys[0]), "the oldest is forgotten");
    assert!(recent.contains(&keys[1]) && recent.contains(&keys[RecentKeys::CAP]));
    assert_eq!(
        (recent.keys.len(), recent.order.len()),
        (RecentKeys::CAP, RecentKeys::CAP)
    );
}

/// A claim sent again while its first sending still waits for the writer (the worker gave
/// up on the answer first, as a client whose timeout ran out behind a long planning commit
/// does) answers what that first sending claimed, once it has claimed it, and claims
/// nothing more: nothing lies leased to a worker that never heard of it.
#[test]
fn a_claim_sent_again_behind_its_first_sending_answers_what_that_claimed() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("k.db")).unwrap();
        let f = fixture(&store, "t", "q").await;
        let ids = insert(
            &store,
            &f,
            (0..4).map(|i| new_occ(&f, "q", secs(i), 3)).collect(),
        )
        .await;

        // The writer is held up by a job that waits to be let go.
        let (let_go, held) = hold_writer(&store).await;
        let key = uuid::Uuid::new_v4();
        let claim = |resent| {
            let key = Some(ClaimKey { id: key, resent });
            claim_params(&f, "q", "w", 2, None, key, secs(10))
        };
        // Polled once each: the first sending's job is queued behind the held writer,
        // then the worker, having had no answer, sends the claim again.
        let mut cx = Context::from_waker(Waker::noop());
        let mut first = store.occurrence_claim(claim(false));
        assert!(matches!(first.as_mut().poll(&mut cx), Poll::Pending));
        let mut again = store.occurrence_claim(claim(true));
        assert!(matches!(again.as_mut().poll(&mut cx), Poll::Pending));
        let_go.send(()).unwrap();
        held.await.unwrap().unwrap();
        let (first, again) = tokio::join!(first, again);
        let (first, again) = (first.unwrap(), again.unwrap());
        let terms = |c: &[Claimed]| -> Vec<_> {
            c.iter().map(|c| (c.id, c.epoch, c.lease_until)).collect()
        };
        assert_eq!(first.iter().map(|c| c.id).collect::<Vec<_>>(), ids[..2]);
        assert_eq!(
            terms(&again),
            terms(&first),
            "the same occurrences, as claimed"
        );
        assert!(again.iter().all(|c| c.replayed) && first.iter().all(|c| !c.replayed));
        assert!(again.iter().all(|c| c.payload == spec("q").payload));
        let running = store
            .occurrence_list(OccurrenceList {
                tenant: f.tenant,
                state: Some(OccurrenceState::Running),
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(running.len(), 2, "nothing more was claimed: {running:?}");
    });
}

/// Judges nothing missed (the tests below start no outage).
struct NoMisses;

impl PrePlannedJudge for NoMisses {
    fn missed(&self, _: &PrePlanned<'_>) -> Vec<jiff::Timestamp> {
        Vec::new()
    }
}

/// A schedule change and a planning commit sent while the writer is busy never
/// interleave: the writer runs each job whole, in the order they were sent. A commit
/// queued first is retired by the pause after it (its occurrence canceled, its queue entry
/// taken out); a commit queued after the pause is refused, and writes nothing.
#[test]
fn a_pause_and_a_planning_commit_never_interleave() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for commit_first in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let store = SqliteStore::open(dir.path().join("p.db")).unwrap();
            let tenant = store
                .tenant_create(TenantCreate {
                    name: "t".into(),
                    now: Some(secs(0)),
                })
                .await
                .unwrap()
                .id;
            let id = campanile_core::ScheduleId(uuid::Uuid::now_v7());
            store
                .schedule_create(ScheduleCreate {
                    tenant,
                    id,
                    spec: spec("q"),
                    shard: 0,
                    next_run_at: Some(secs(60)),
                    fires_per_hour: 60,
                    idempotency: None,
                    now: Some(secs(0)),
                })
                .await
                .unwrap();
            let lease = store
                .shard_acquire(ShardAcquire {
                    node: "n".into(),
                    total: 1,
                    lease: jiff::SignedDuration::from_hours(1),
                    judge: std::sync::Arc::new(NoMisses),
                    now: Some(secs(1)),
                })
                .await
                .unwrap()
                .leases[0];
            let fixture = campanile_conformance::Fixture {
                tenant,
                schedule: id,
            };
            let commit = PlanCommit {
                node: "n".into(),
                shard: 0,
                shard_epoch: lease.epoch,
                items: std::sync::Arc::from(vec![PlanItem {
                    tenant,
                    schedule_id: id,
                    version: 1,
                    expected_next_run_at: secs(60),
                    next_run_at: Some(secs(120)),
                    occurrences: vec![new_occ(&fixture, "q", secs(60), 3)],
                    missed: None,
                }]),
                now: Some(secs(2)),
            };
            let pause = ScheduleTransition {
                tenant,
                id,
                to: ScheduleState::Paused,
                superseded: Superseded::default(),
                now: Some(secs(3)),
            };

            let (let_go, held) = hold_writer(&store).await;
            // Each sent (queued behind the held writer) in the order under test.
            let mut cx = Context::from_waker(Waker::noop());
            let (mut planning, mut pausing) = if commit_first {
                let mut planning = store.plan_commit(commit);
                assert!(planning.as_mut().poll(&mut cx).is_pending());
                let mut pausing = store.schedule_transition(pause);
                assert!(pausing.as_mut().poll(&mut cx).is_pending());
                (planning, pausing)
            } else {
                let mut pausing = store.schedule_transition(pause);
                assert!(pausing.as_mut().poll(&mut cx).is_pending());
                let mut planning = store.plan_commit(commit);
                assert!(planning.as_mut().poll(&mut cx).is_pending());
                (planning, pausing)
            };
            let_go.send(()).unwrap();
            held.await.unwrap().unwrap();
            let (planned, paused) = tokio::join!(planning.as_mut(), pausing.as_mut());
            let (planned, paused) = (planned.unwrap(), paused.unwrap());
            assert_eq!(paused.schedule.version, 2);
            let occurrences = store
                .occurrence_list(OccurrenceList {
                    tenant,
                    schedule_id: Some(id),
                    limit: 10,
                    ..Default::default()
                })
                .await
                .unwrap();
            if commit_first {
                assert_eq!((planned.applied, paused.canceled), (1, 1));
                assert_eq!(occurrences.len(), 1);
                assert_eq!(occurrences[0].state, OccurrenceState::Canceled);
            } else {
                assert_eq!((planned.applied, planned.refused), (0, vec![id]));
                assert!(occurrences.is_empty(), "{occurrences:?}");
            }
            let queued: i64 = store
                .read(move |c| {
                    c.query_row(
                        "SELECT count(*) FROM schedule_queue WHERE schedule_id = ?1",
                        [id.0],
                        |r| r.get(0),
                    )
                    .map_err(db_err)
                })
                .await
                .unwrap();
            assert_eq!(queued, 0, "a paused schedule has no queue entry");
        }
    });
}

/// A report finds its rows by the numbers the writer's claims noted, and is answered exactly
/// as by id when a number is wrong: a number that names another row (or none) does not
/// complete that row, and the report's own row is still found by id. The fence is the same
/// either way: a report at a stale epoch is refused. Accepted reports forget their numbers.
#[tokio::test]
async fn reports_find_rows_by_noted_numbers_and_by_id_when_a_number_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("n.db")).unwrap();
    let f = fixture(&store, "t", "q").await;
    insert(
        &store,
        &f,
        (0..3).map(|i| new_occ(&f, "q", secs(i), 3)).collect(),
    )
    .await;
    let claimed = store
        .occurrence_claim(claim_params(&f, "q", "w", 3, None, None, secs(10)))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3);
    let numbers = |store: &SqliteStore| store.inner.row_numbers.lock().unwrap().0.clone();
    let noted = numbers(&store);
    assert_eq!(noted.len(), 3, "the claim noted each row's number");
    // The first occurrence's number made to name the second's row, the third's to name none.
    let (a, b, c) = (&claimed[0], &claimed[1], &claimed[2]);
    {
        let mut n = store.inner.row_numbers.lock().unwrap();
        let b_seq = n.0[&b.id.0];
        n.0.insert(a.id.0, b_seq);
        n.0.insert(c.id.0, i64::MAX);
    }
    let report = |items: Vec<FinishItem>| OccurrenceFinishMany {
        tenant: f.tenant,
        worker_id: "w".into(),
        items,
        now: Some(secs(11)),
    };
    let success = |c: &Claimed, epoch: i64| FinishItem {
        lease: LeaseRef {
            occurrence_id: c.id,
            epoch,
        },
        finish: Finish::Succeeded {
            result: Some("1".into()),
        },
    };
    // A stale epoch through a right number: refused, as by id.
    let acks = store
        .occurrence_finish_many(report(vec![success(b, b.epoch - 1)]))
        .await
        .unwrap();
    assert!(!acks[0].accepted(), "{acks:?}");
    let acks = store
        .occurrence_finish_many(report(vec![success(a, a.epoch), success(c, c.epoch)]))
        .await
        .unwrap();
    assert!(acks.iter().all(Ack::accepted), "{acks:?}");
    let state = |id: campanile_core::OccurrenceId| {
        let store = store.clone();
        async move {
            store
                .occurrence_get(OccurrenceGet {
                    tenant: f.tenant,
                    key: OccurrenceKey::Id(id),
                    now: Some(secs(12)),
                })
                .await
                .unwrap()
                .unwrap()
                .occurrence
                .state
        }
    };
    assert_eq!(state(a.id).await, OccurrenceState::Succeeded);
    assert_eq!(
        state(b.id).await,
        OccurrenceState::Running,
        "the row a wrong number named is untouched"
    );
    assert_eq!(state(c.id).await, OccurrenceState::Succeeded);
    assert_eq!(
        numbers(&store).keys().copied().collect::<Vec<_>>(),
        [b.id.0],
        "accepted reports forget their numbers"
    );
    let acks = store
        .occurrence_finish_many(report(vec![success(b, b.epoch)]))
        .await
        .unwrap();
    assert!(acks[0].accepted(), "{acks:?}");
    assert!(numbers(&store).is_empty());
}

/// The numbers kept are bounded: at the cap they are forgotten, all at once.
#[test]
fn row_numbers_are_bounded() {
    let mut n = finish::RowNumbers::default();
    n.note((0..finish::RowNumbers::CAP as u128).map(|i| (uuid::Uuid::from_u128(i), i as i64)));
    assert_eq!(n.0.len(), finish::RowNumbers::CAP);
    n.note(std::iter::once((uuid::Uuid::from_u128(u128::MAX), 7)));
    assert_eq!(n.0.len(), 1, "emptied at the cap, then noted");
}
