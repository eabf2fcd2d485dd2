//! A node starting after the whole control plane was down.

use std::sync::Mutex;

use campanile_core::OccurrenceState;
use jiff::SignedDuration;
use tokio::runtime::Runtime;

use super::*;

/// One judgement: schedule, version, instants, planned through.
type Seen = (ScheduleId, u32, Vec<Timestamp>, Timestamp);

/// Records what it is shown and misses every instant older than a minute before `now`.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<Seen>>,
}

impl PrePlannedJudge for Recorder {
    fn missed(&self, p: &PrePlanned<'_>) -> Vec<Timestamp> {
        self.seen.lock().unwrap().push((
            p.schedule_id,
            p.version,
            p.instants.to_vec(),
            p.planned_through,
        ));
        let cutoff = p.now - SignedDuration::from_secs(60);
        p.instants.iter().copied().filter(|t| *t < cutoff).collect()
    }
}

/// A node's shard acquisition (its start, or a renewal), with its outage check.
async fn resume(s: &dyn Store, node: &str, judge: &Arc<Recorder>, now: Timestamp) -> Resumed {
    s.shard_acquire(ShardAcquire {
        node: node.into(),
        total: 4,
        lease: SignedDuration::from_secs(15),
        judge: judge.clone(),
        now: Some(now),
    })
    .await
    .unwrap()
    .resumed
}

async fn state(s: &dyn Store, f: &Fixture, id: OccurrenceId) -> OccurrenceState {
    state_at(s, f, id, secs(400)).await
}

async fn state_at(s: &dyn Store, f: &Fixture, id: OccurrenceId, now: Timestamp) -> OccurrenceState {
    s.occurrence_get(OccurrenceGet {
        tenant: f.tenant,
        key: OccurrenceKey::Id(id),
        now: Some(now),
    })
    .await
    .unwrap()
    .unwrap()
    .occurrence
    .state
}

/// What the outage left behind is judged once, by the first node back, and only that: never
/// claimed, claimable only from inside the outage (by `available_at`, so a flexible window
/// that moved an earlier instant into it counts), across tenants; a backlog from before it,
/// claimed rows and rows not due yet are left alone. A node starting while another is alive
/// sees no outage, and of nodes starting together exactly one does.
pub fn resume_judges_what_came_due_while_no_node_was_alive(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let judge = Arc::new(Recorder::default());
        // The deployment's first start: nothing to judge.
        assert_eq!(resume(s, "a", &judge, secs(0)).await, Resumed::default());
        let f = fixture(s, "acme", "q").await;
        let g = fixture(s, "beta", "q").await;
        let occ = |sched: i64, avail: i64| {
            let mut o = new_occ(&f, "q", secs(sched), 3);
            o.available_at = secs(avail);
            o
        };
        let ids = insert(
            s,
            &f,
            vec![
                occ(90, 90),   // 0: claimed before the outage
                occ(91, 91),   // 1: backlog from before the outage
                occ(95, 150),  // 2: moved into the outage by a flexible window
                occ(120, 120), // 3: due in the outage
                occ(200, 200), // 4: due in the outage
                occ(380, 380), // 5: due in the outage, within the judge's minute
                occ(500, 500), // 6: not due yet
            ],
        )
        .await;
        let other = insert(s, &g, vec![new_occ(&g, "q", secs(150), 3)]).await;
        // Node a renews every 10 s until 100 (alive until 115): never an outage.
        for t in (10..=100).step_by(10) {
            assert_eq!(resume(s, "a", &judge, secs(t)).await, Resumed::default());
        }
        // b starts at 110 while a is alive.
        let c = claim(s, &f, "q", "w", 1, 1_000, secs(100)).await;
        assert_eq!(c[0].id, ids[0]);
        assert_eq!(resume(s, "b", &judge, secs(110)).await, Resumed::default());
        assert!(judge.seen.lock().unwrap().is_empty());
        // Nobody renews: b's mark (until 125) is the last. Back at 400.
        let r = resume(s, "a", &judge, secs(400)).await;
        assert_eq!(
            r,
            Resumed {
                down_since: Some(secs(110)),
                examined: 5,
                missed: 4,
                paced: 0,
            }
        );
        let mut seen = judge.seen.lock().unwrap().clone();
        seen.sort_by_key(|x| x.0.0);
        let mut want = vec![
            (
                f.schedule,
                1,
                vec![secs(95), secs(120), secs(200), secs(380)],
                secs(500),
            ),
            (g.schedule, 1, vec![secs(150)], secs(150)),
        ];
        want.sort_by_key(|x| x.0.0);
        assert_eq!(
            seen, want,
            "one judgement per schedule version, instants ascending"
        );
        let states = [
            OccurrenceState::Running,
            OccurrenceState::Ready,
            OccurrenceState::Missed,
            OccurrenceState::Missed,
            OccurrenceState::Missed,
            OccurrenceState::Ready,
            OccurrenceState::Scheduled,
        ];
        for (i, want) in states.iter().enumerate() {
            assert_eq!(state(s, &f, ids[i]).await, *want, "occurrence {i}");
        }
        assert_eq!(state(s, &g, other[0]).await, OccurrenceState::Missed);
        // What was judged to run is claimable; what was missed is not.
        let c = claim(s, &f, "q", "w", 10, 5, secs(400)).await;
        let got: Vec<_> = c.iter().map(|c| c.id).collect();
        assert_eq!(got, vec![ids[1], ids[5]]);

        // Two nodes back at the same instant after the next outage: one judges, once.
        let late = insert(s, &f, vec![occ(900, 900)]).await;
        judge.seen.lock().unwrap().clear();
        let (x, y) = tokio::join!(
            resume(s, "c", &judge, secs(1_000)),
            resume(s, "d", &judge, secs(1_000))
        );
        assert_eq!(
            [x.down_since, y.down_since].iter().flatten().count(),
            1,
            "{x:?} {y:?}"
        );
        assert_eq!(
            x.missed + y.missed,
            2,
            "900, and 500 (due at 500, in this outage)"
        );
        assert_eq!(judge.seen.lock().unwrap().len(), 1);
        assert_eq!(state(s, &f, late[0]).await, OccurrenceState::Missed);
        assert_eq!(state(s, &f, ids[6]).await, OccurrenceState::Missed);
        // And again, racing, outage after outage.
        for round in 2..10 {
            let back = round * 1_000;
            let late = insert(s, &f, vec![occ(back - 100, back - 100)]).await;
            let (nx, ny) = (format!("x{round}"), format!("y{round}"));
            let (x, y) = tokio::join!(
                resume(s, &nx, &judge, secs(back)),
                resume(s, &ny, &judge, secs(back))
            );
            let seen: Vec<_> = [x, y]
                .into_iter()
                .filter(|r| r.down_since.is_some())
                .collect();
            assert_eq!(seen.len(), 1, "round {round}: {x:?} {y:?}");
            assert_eq!(seen[0].missed, 1, "round {round}");
            assert_eq!(x.missed + y.missed, 1, "round {round}");
            assert_eq!(state(s, &f, late[0]).await, OccurrenceState::Missed);
        }
        // A graceful stop says exactly when the nodes were last seen: what was claimable
        // before it is a backlog, not a misfire, even within a lease of the stop.
        for node in ["x9", "y9"] {
            s.shard_release(ShardRelease {
                node: node.into(),
                now: Some(secs(9_005)),
            })
            .await
            .unwrap();
        }
        let rows = insert(
            s,
            &f,
            vec![occ(9_002, 9_002), occ(9_005, 9_005), occ(9_006, 9_006)],
        )
        .await;
        let r = resume(s, "z", &judge, secs(9_500)).await;
        assert_eq!(
            r,
            Resumed {
                down_since: Some(secs(9_005)),
                examined: 2,
                missed: 2,
                paced: 0,
            }
        );
        let back = secs(9_500);
        assert_eq!(state_at(s, &f, rows[0], back).await, OccurrenceState::Ready);
        assert_eq!(
            state_at(s, &f, rows[1], back).await,
            OccurrenceState::Missed
        );
        assert_eq!(
            state_at(s, &f, rows[2], back).await,
            OccurrenceState::Missed
        );
        // A node whose mark lapsed (cut off from the database) and then stops must not hide
        // the outage: its stop does not move its mark.
        let row = insert(s, &f, vec![occ(9_600, 9_600)]).await;
        s.shard_release(ShardRelease {
            node: "z".into(),
            now: Some(secs(10_000)),
        })
        .await
        .unwrap();
        let r = resume(s, "w", &judge, secs(10_200)).await;
        assert_eq!(r.down_since, Some(secs(9_500)), "{r:?}");
        assert_eq!(r.missed, 1);
        assert_eq!(
            state_at(s, &f, row[0], secs(10_200)).await,
            OccurrenceState::Missed
        );
    });
}

/// While no node's mark is valid, nothing is handed out: a worker's claim is refused with
/// [`StoreError::NoLiveNode`] and the relay gets nothing, so work that came due in an outage
/// waits for the first node back to judge it. A claim racing with that node's start either
/// comes before its check (refused) or after it (sees what it judged): never takes an
/// occurrence the check would have recorded as missed.
pub fn claims_wait_for_the_first_node_back_after_an_outage(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let judge = Arc::new(Recorder::default());
        let f = fixture(s, "acme", "q").await;
        let nats = fixture(s, "beta", "$nats:jobs").await;
        // Before any node started, claims are the store's alone (tools, tests): allowed.
        insert(s, &f, vec![new_occ(&f, "q", secs(-20), 3)]).await;
        assert_eq!(claim(s, &f, "q", "w", 1, 1_000, secs(-10)).await.len(), 1);
        let backlog = insert(
            s,
            &f,
            vec![
                new_occ(&f, "q", secs(-10), 3),
                new_occ(&f, "q", secs(-5), 3),
            ],
        )
        .await;
        // Node a starts at 0 (alive until 15) and is never heard of again.
        assert_eq!(resume(s, "a", &judge, secs(0)).await, Resumed::default());
        let late = insert(s, &f, vec![new_occ(&f, "q", secs(100), 3)]).await;
        // Queues whose claims take other paths: one with a running limit, one overlap-constrained.
        s.queue_limit_set(QueueLimitSet {
            tenant: f.tenant,
            queue: "lim".into(),
            max_running: Some(10),
        })
        .await
        .unwrap();
        let mut constrained = new_occ(&f, "one", secs(101), 3);
        constrained.overlap = campanile_core::Overlap::SkipIfRunning;
        let others = insert(s, &f, vec![new_occ(&f, "lim", secs(102), 3), constrained]).await;
        let relayed = insert(s, &nats, vec![new_occ(&nats, "$nats:jobs", secs(100), 3)]).await;
        // Within a's lease, work is handed out.
        let c = claim(s, &f, "q", "w", 1, 5, secs(14)).await;
        assert_eq!(c.iter().map(|c| c.id).collect::<Vec<_>>(), vec![backlog[0]]);
        // After it, nothing: the worker is told why, the relay waits.
        for queue in ["q", "lim", "one"] {
            let err = s
                .occurrence_claim(OccurrenceClaim {
                    max_bytes: None,
                    tenant: f.tenant,
                    queue: queue.into(),
                    worker_id: "w".into(),
                    max: 10,
                    lease: Some(SignedDuration::from_secs(5)),
                    key: None,
                    now: Some(secs(200)),
                })
                .await
                .unwrap_err();
            assert!(matches!(err, StoreError::NoLiveNode), "{queue}: {err:?}");
        }
        let relay = |now| {
            s.relay_claim(RelayClaim {
                node: "a".into(),
                max: 10,
                lease: SignedDuration::from_secs(5),
                now: Some(now),
            })
        };
        assert!(relay(secs(200)).await.unwrap().is_empty());
        // Node b starts at 400: what came due after 0 and is older than a minute is missed;
        // the backlog from before the outage is not judged and is handed out again.
        let r = resume(s, "b", &judge, secs(400)).await;
        assert_eq!(r.down_since, Some(secs(0)));
        assert_eq!(r.missed, 4, "{r:?}");
        let got = claim(s, &f, "q", "w", 10, 5, secs(400)).await;
        // In order of availability: the one taken over is available again from its lease's
        // end (19), after the other (-5).
        assert_eq!(
            got.iter()
                .map(|c| (c.id, c.available_at))
                .collect::<Vec<_>>(),
            vec![(backlog[1], secs(-5)), (backlog[0], secs(19))],
            "the backlog, and the claim whose lease ended in the outage"
        );
        assert!(relay(secs(400)).await.unwrap().is_empty());
        for id in [late[0], others[0], others[1]] {
            assert_eq!(
                state_at(s, &f, id, secs(400)).await,
                OccurrenceState::Missed
            );
        }
        assert_eq!(
            state_at(s, &nats, relayed[0], secs(400)).await,
            OccurrenceState::Missed
        );

        // Claims racing with the first node back, outage after outage.
        let mut refused = 0;
        for round in 1..=12 {
            let back = secs(1_000 * round);
            let rows = insert(
                s,
                &f,
                (0..5)
                    .map(|i| new_occ(&f, "race", back - SignedDuration::from_secs(200 + i), 3))
                    .collect(),
            )
            .await;
            let claims = async {
                let mut taken = Vec::new();
                for w in 0..4 {
                    match s
                        .occurrence_claim(OccurrenceClaim {
                            max_bytes: None,
                            tenant: f.tenant,
                            queue: "race".into(),
                            worker_id: format!("w{w}"),
                            max: 10,
                            lease: Some(SignedDuration::from_secs(5)),
                            key: None,
                            now: Some(back),
                        })
                        .await
                    {
                        Ok(c) => taken.extend(c.into_iter().map(|c| c.id)),
                        Err(StoreError::NoLiveNode) => refused += 1,
                        Err(e) => panic!("round {round}: {e}"),
                    }
                    tokio::task::yield_now().await;
                }
                taken
            };
            let node = format!("n{round}");
            let (taken, r) = tokio::join!(claims, resume(s, &node, &judge, back));
            assert!(
                taken.is_empty(),
                "round {round}: claimed {taken:?} that the outage check records as missed"
            );
            assert_eq!(r.missed, 5, "round {round}: {r:?}");
            for id in rows {
                assert_eq!(state_at(s, &f, id, back).await, OccurrenceState::Missed);
            }
        }
        // The race was run: some claims came before the check.
        assert!(refused > 0);
    });
}

/// A claim that waits — here for its queue's running-limit lock, as it would for a stalled
/// database — while every liveness mark lapses takes nothing once it goes on: the gate is
/// judged at the instant the claim runs, not at the one it read before it waited. On the
/// store's own clock (`now: None`) in real time. `hold_queue_lock(key)` takes the lock a
/// limited claim of queue `key` (`"{tenant}/{queue}"`) waits for, until its result is dropped;
/// `waits_for_it(key)` says whether a session is waiting for that lock.
pub fn a_claim_that_waited_while_every_mark_lapsed_takes_nothing<F, Fut, G, W, WFut>(
    rt: &Runtime,
    h: Harness,
    hold_queue_lock: F,
    waits_for_it: W,
) where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = G>,
    W: Fn(String) -> WFut,
    WFut: std::future::Future<Output = bool>,
{
    rt.block_on(async {
        let store = h.store.clone();
        let s = store.as_ref();
        // A queue name no other test uses: the lock is the database's, not the schema's.
        let queue = "limited-while-lapsing";
        let f = fixture(s, "acme", queue).await;
        s.queue_limit_set(QueueLimitSet {
            tenant: f.tenant,
            queue: queue.to_string(),
            max_running: Some(10),
        })
        .await
        .unwrap();
        let now = s.store_now().await.unwrap();
        let ids = insert(
            s,
            &f,
            vec![new_occ(&f, queue, now - SignedDuration::from_secs(1), 3)],
        )
        .await;
        let lease = SignedDuration::from_millis(1_500);
        s.shard_acquire(ShardAcquire {
            node: "a".into(),
            total: 1,
            lease,
            judge: Arc::new(Recorder::default()),
            now: None,
        })
        .await
        .unwrap();
        let key = format!("{}/{queue}", f.tenant.0);
        let held = hold_queue_lock(key.clone()).await;
        let (tenant, claimer) = (f.tenant, store.clone());
        let waiting = tokio::spawn(async move {
            claimer
                .occurrence_claim(OccurrenceClaim {
                    max_bytes: None,
                    tenant,
                    queue: queue.into(),
                    worker_id: "w".into(),
                    max: 10,
                    lease: Some(SignedDuration::from_secs(30)),
                    key: None,
                    now: None,
                })
                .await
        });
        // The claim passed the gate of its first statement and now waits for the lock.
        let mut polls = 0;
        while !waits_for_it(key.clone()).await {
            polls += 1;
            assert!(polls < 500, "the claim never waited for the queue lock");
            assert!(
                !waiting.is_finished(),
                "the claim did not wait for the queue lock"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // The mark lapses while it waits.
        tokio::time::sleep(lease.unsigned_abs()).await;
        drop(held);
        let got = waiting.await.unwrap().unwrap();
        assert!(
            got.is_empty(),
            "claimed in an outage not yet judged: {got:?}"
        );
        let after = s.store_now().await.unwrap();
        assert_eq!(state_at(s, &f, ids[0], after).await, OccurrenceState::Ready);
    });
}

/// Runs an operator asked for — triggered now, or backfilled and paced late — are late on
/// purpose: an outage check does not judge them by the misfire policy, and they still run.
pub fn an_outage_check_leaves_operators_runs_alone(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let judge = Arc::new(Recorder::default());
        assert_eq!(resume(s, "a", &judge, secs(0)).await, Resumed::default());
        let f = fixture(s, "acme", "q").await;
        // A planned run and a backfilled one, both claimable from inside the coming outage.
        let planned = insert(s, &f, vec![new_occ(&f, "q", secs(120), 3)]).await;
        let done = s
            .schedule_backfill(ScheduleBackfill {
                tenant: f.tenant,
                id: f.schedule,
                version: 1,
                from: secs(1),
                to: secs(3),
                instants: vec![secs(1), secs(2)],
                overlap: None,
                key: None,
                // Asked for while the nodes are down: available from 130, inside the outage.
                now: Some(secs(130)),
            })
            .await
            .unwrap();
        assert_eq!(done.created.len(), 2);
        // Node a is last seen alive at 100 (its mark ends at 115); back at 400.
        resume(s, "a", &judge, secs(100)).await;
        let r = resume(s, "a", &judge, secs(400)).await;
        assert_eq!(
            (r.examined, r.missed),
            (1, 1),
            "only the planned run is judged"
        );
        assert_eq!(state(s, &f, planned[0]).await, OccurrenceState::Missed);
        for o in &done.created {
            assert_eq!(state(s, &f, o.id).await, OccurrenceState::Ready);
        }
    });
}
