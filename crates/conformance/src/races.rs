//! Real concurrency: eight OS threads claiming, renewing, completing, failing and sweeping
//! the same few hundred occurrences while the test clock runs past their leases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use campanile_core::{ErrorClass, OccurrenceState};
use jiff::SignedDuration;
use tokio::runtime::Runtime;

use super::*;

#[derive(Debug, Clone)]
struct Sent {
    id: OccurrenceId,
    epoch: i64,
    worker: String,
    success: bool,
    class: Option<ErrorClass>,
    accepted: bool,
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

pub fn racing_workers_never_overwrite_a_successor(rt: &Runtime, h: Harness) {
    const OCCURRENCES: i64 = 300;
    const THREADS: u64 = 8;
    const ROUNDS: usize = 120;
    const LEASE_MS: i64 = 40;

    let store = h.store.clone();
    let f = rt.block_on(async {
        let f = fixture(store.as_ref(), "racers", "hot").await;
        insert(
            store.as_ref(),
            &f,
            (0..OCCURRENCES)
                .map(|i| new_occ(&f, "hot", at(i), 40))
                .collect(),
        )
        .await;
        f
    });
    let f = Arc::new(f);
    let clock = Arc::new(AtomicI64::new(T0 + 1_000));
    let sent: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let claims: Arc<Mutex<Vec<(OccurrenceId, i64)>>> = Arc::default();

    let threads: Vec<_> = (0..THREADS)
        .map(|k| {
            let (store, f, clock, sent, claims) = (
                store.clone(),
                f.clone(),
                clock.clone(),
                sent.clone(),
                claims.clone(),
            );
            let handle = rt.handle().clone();
            std::thread::spawn(move || {
                let worker = format!("w{k}");
                let mut rng =
                    0x9e37_79b9_7f4a_7c15u64 ^ (k + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                let now = |clock: &AtomicI64| {
                    Some(Timestamp::from_millisecond(clock.load(Ordering::SeqCst)).unwrap())
                };
                for round in 0..ROUNDS {
                    clock.fetch_add((xorshift(&mut rng) % 4) as i64, Ordering::SeqCst);
                    if k == 0 && round % 5 == 0 {
                        handle
                            .block_on(store.lease_sweep(LeaseSweep {
                                limit: 50,
                                now: now(&clock),
                            }))
                            .unwrap();
                    }
                    let got = handle
                        .block_on(store.occurrence_claim(OccurrenceClaim {
                            max_bytes: None,
                            tenant: f.tenant,
                            queue: "hot".into(),
                            worker_id: worker.clone(),
                            max: 1 + (xorshift(&mut rng) % 4) as u32,
                            lease: Some(SignedDuration::from_millis(LEASE_MS)),
                            key: None,
                            now: now(&clock),
                        }))
                        .unwrap();
                    claims
                        .lock()
                        .unwrap()
                        .extend(got.iter().map(|c| (c.id, c.epoch)));
                    for c in got {
                        let choice = xorshift(&mut rng) % 10;
                        if choice == 4 {
                            continue; // abandoned: a crashed worker
                        }
                        if choice <= 1 {
                            clock.fetch_add(LEASE_MS + 5, Ordering::SeqCst); // a stall past the lease
                        }
                        if choice == 2 {
                            handle
                                .block_on(store.lease_renew(LeaseRenew {
                                    tenant: f.tenant,
                                    worker_id: worker.clone(),
                                    leases: vec![LeaseRef {
                                        occurrence_id: c.id,
                                        epoch: c.epoch,
                                    }],
                                    lease: Some(SignedDuration::from_millis(LEASE_MS)),
                                    now: now(&clock),
                                }))
                                .unwrap();
                        }
                        let (finish, class) = if choice == 3 {
                            (
                                Finish::Failed {
                                    class: ErrorClass::Transient,
                                    message: "flaky".into(),
                                },
                                Some(ErrorClass::Transient),
                            )
                        } else {
                            (
                                Finish::Succeeded {
                                    result: Some(format!("\"{worker}@{}\"", c.epoch)),
                                },
                                None,
                            )
                        };
                        let success = class.is_none();
                        let acks = handle
                            .block_on(store.occurrence_finish_many(OccurrenceFinishMany {
                                tenant: f.tenant,
                                worker_id: worker.clone(),
                                items: vec![FinishItem {
                                    lease: LeaseRef {
                                        occurrence_id: c.id,
                                        epoch: c.epoch,
                                    },
                                    finish,
                                }],
                                now: now(&clock),
                            }))
                            .unwrap();
                        assert_eq!(
                            acks[0].rows,
                            u64::from(acks[0].accepted()),
                            "rows is the acknowledgement"
                        );
                        sent.lock().unwrap().push(Sent {
                            id: c.id,
                            epoch: c.epoch,
                            worker: worker.clone(),
                            success,
                            class,
                            accepted: acks[0].accepted(),
                        });
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("racing thread panicked");
    }

    rt.block_on(async {
        let s = store.as_ref();
        // Right after the race: nothing lost. Every occurrence exists and is succeeded, dead,
        // or still on its way to a worker.
        let now = Timestamp::from_millisecond(clock.load(Ordering::SeqCst)).unwrap();
        let all = list_pages(
            s,
            OccurrenceList {
                tenant: f.tenant,
                limit: 1000,
                now: Some(now),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(all.len() as i64, OCCURRENCES, "no occurrence may vanish");
        for o in &all {
            assert!(
                matches!(
                    o.state,
                    OccurrenceState::Succeeded
                        | OccurrenceState::Dead
                        | OccurrenceState::Ready
                        | OccurrenceState::RetryWait
                        | OccurrenceState::Running
                ),
                "{:?} is {}",
                o.id,
                o.state
            );
        }

        // Drain: sweep and finish everything left with a well-behaved worker.
        let mut t = now;
        for _ in 0..200 {
            t = t.checked_add(SignedDuration::from_secs(120)).unwrap();
            s.lease_sweep(LeaseSweep {
                limit: 1000,
                now: Some(t),
            })
            .await
            .unwrap();
            let left = claim(s, &f, "hot", "drainer", 1000, 60, t).await;
            if left.is_empty() {
                break;
            }
            claims
                .lock()
                .unwrap()
                .extend(left.iter().map(|c| (c.id, c.epoch)));
            for c in left {
                let ack = finish(
                    s,
                    &f,
                    "drainer",
                    c.id,
                    c.epoch,
                    Finish::Succeeded {
                        result: Some(format!("\"drainer@{}\"", c.epoch)),
                    },
                    t,
                )
                .await;
                assert!(ack.accepted(), "{ack:?}");
                sent.lock().unwrap().push(Sent {
                    id: c.id,
                    epoch: c.epoch,
                    worker: "drainer".into(),
                    success: true,
                    class: None,
                    accepted: true,
                });
            }
        }

        let sent = sent.lock().unwrap().clone();
        let claims = claims.lock().unwrap().clone();
        let mut max_epoch: HashMap<OccurrenceId, i64> = HashMap::new();
        for (id, e) in &claims {
            let m = max_epoch.entry(*id).or_default();
            *m = (*m).max(*e);
        }
        let (mut refused, mut accepted_successes) = (0, 0);
        for o in &all {
            let d = get(s, &f, o.id, t).await;
            let occ = &d.occurrence;
            assert!(
                matches!(
                    occ.state,
                    OccurrenceState::Succeeded | OccurrenceState::Dead
                ),
                "after the drain {:?} is {}",
                occ.id,
                occ.state
            );
            let mine: Vec<&Sent> = sent.iter().filter(|x| x.id == o.id).collect();
            let successes: Vec<&&Sent> = mine.iter().filter(|x| x.success && x.accepted).collect();
            assert!(
                successes.len() <= 1,
                "{:?} has {} accepted completions",
                o.id,
                successes.len()
            );
            // Every accepted completion carried the highest epoch the occurrence ever had,
            // and its result is the one stored.
            if let Some(win) = successes.first() {
                accepted_successes += 1;
                assert_eq!(occ.state, OccurrenceState::Succeeded);
                assert_eq!(win.epoch, occ.epoch);
                assert_eq!(Some(win.epoch), max_epoch.get(&o.id).copied());
                assert_eq!(
                    occ.result.as_deref(),
                    Some(format!("\"{}@{}\"", win.worker, win.epoch).as_str())
                );
            } else {
                assert_ne!(
                    occ.state,
                    OccurrenceState::Succeeded,
                    "{:?} succeeded without an accepted completion",
                    o.id
                );
            }
            // Every completion with a superseded epoch was refused; accepted failures were
            // transient ones, each at a distinct epoch.
            for x in &mine {
                if x.success && x.epoch < occ.epoch {
                    assert!(!x.accepted, "stale completion {x:?} was accepted");
                }
                if !x.accepted {
                    refused += 1;
                }
                if x.accepted && !x.success {
                    assert_eq!(x.class, Some(ErrorClass::Transient));
                }
            }
            // The attempt history has one row per claim, epochs 1..=epoch, at most one success.
            let epochs: Vec<i64> = d.attempts.iter().map(|a| a.epoch).collect();
            assert_eq!(epochs, (1..=occ.epoch).collect::<Vec<_>>(), "{:?}", occ.id);
            let won: Vec<i64> = d
                .attempts
                .iter()
                .filter(|a| a.outcome == AttemptOutcome::Succeeded)
                .map(|a| a.epoch)
                .collect();
            assert!(won.len() <= 1 && won.iter().all(|e| *e == occ.epoch));
        }
        assert!(
            refused > 0,
            "the race must have produced stale completions to refuse"
        );
        assert!(accepted_successes > 0);
        assert!(
            claims.iter().any(|(_, e)| *e > 1),
            "some leases must have been taken over"
        );
    });
}

/// Many workers claiming one queue at the same instant, and then reporting at the same
/// instant: each gets at most what it asked for, as owner with its own lease, nothing is
/// claimed twice, and each report is fenced on its own — one worker's stale or foreign item
/// is refused without touching another's. (PostgreSQL lets requests that arrive together
/// share a statement; this is what sharing must not change.)
pub fn simultaneous_claimers_and_reporters_keep_their_own_terms(rt: &Runtime, h: Harness) {
    const WORKERS: u32 = 16;
    const OCCURRENCES: i64 = 30; // fewer than the 40 asked for: some claimers go short
    let store = h.store.clone();
    rt.block_on(async {
        let f = Arc::new(fixture(store.as_ref(), "together", "q").await);
        insert(
            store.as_ref(),
            &f,
            (0..OCCURRENCES).map(|i| new_occ(&f, "q", at(i), 3)).collect(),
        )
        .await;
        let now = secs(100);
        let terms = |k: u32| (format!("w{k}"), 1 + k % 4, i64::from(1 + k)); // worker, max, lease s
        let tasks: Vec<_> = (0..WORKERS)
            .map(|k| {
                let (store, f) = (store.clone(), f.clone());
                let (worker, max, lease_s) = terms(k);
                tokio::spawn(async move {
                    let got = claim(store.as_ref(), &f, "q", &worker, max, lease_s, now).await;
                    (k, got)
                })
            })
            .collect();
        let mut claimed: Vec<(u32, Claimed)> = Vec::new();
        for t in tasks {
            let (k, got) = t.await.unwrap();
            let (_, max, lease_s) = terms(k);
            assert!(got.len() <= max as usize, "w{k} asked {max}, got {}", got.len());
            for c in got {
                assert_eq!(c.lease_until, now.checked_add(SignedDuration::from_secs(lease_s)).unwrap());
                assert_eq!((c.epoch, c.claimed_at), (1, now));
                claimed.push((k, c));
            }
        }
        let mut ids: Vec<OccurrenceId> = claimed.iter().map(|(_, c)| c.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), claimed.len(), "an occurrence was claimed twice");
        assert_eq!(claimed.len() as i64, OCCURRENCES, "all due work was handed out");
        for (k, c) in &claimed {
            let o = get(store.as_ref(), &f, c.id, now).await.occurrence;
            let (worker, _, _) = terms(*k);
            assert_eq!((o.state, o.owner.as_deref()), (OccurrenceState::Running, Some(worker.as_str())));
            assert_eq!(o.lease_until, Some(c.lease_until));
        }

        // Every worker reports at once. Worker k also slips in, as its last item, the first
        // occurrence of worker (k + 1) (not its own: refused), and sends its first item with
        // a wrong epoch (refused); everything else is accepted.
        let by_worker = |k: u32| -> Vec<&Claimed> {
            claimed.iter().filter(|(w, _)| *w == k).map(|(_, c)| c).collect()
        };
        let reports: Vec<(u32, Vec<FinishItem>)> = (0..WORKERS)
            .map(|k| {
                let mine = by_worker(k);
                let mut items: Vec<FinishItem> = mine
                    .iter()
                    .enumerate()
                    .map(|(i, c)| FinishItem {
                        lease: LeaseRef {
                            occurrence_id: c.id,
                            epoch: if i == 0 { c.epoch + 7 } else { c.epoch },
                        },
                        finish: ok(&format!("\"w{k}\"")),
                    })
                    .collect();
                if let Some(theirs) = by_worker((k + 1) % WORKERS).get(1) {
                    items.push(FinishItem {
                        lease: LeaseRef {
                            occurrence_id: theirs.id,
                            epoch: theirs.epoch,
                        },
                        finish: ok("\"thief\""),
                    });
                }
                (k, items)
            })
            .filter(|(_, items)| !items.is_empty())
            .collect();
        let tasks: Vec<_> = reports
            .into_iter()
            .map(|(k, items)| {
                let (store, f) = (store.clone(), f.clone());
                tokio::spawn(async move {
                    let acks = store
                        .occurrence_finish_many(OccurrenceFinishMany {
                            tenant: f.tenant,
                            worker_id: format!("w{k}"),
                            items: items.clone(),
                            now: Some(now),
                        })
                        .await
                        .expect("finish");
                    (k, items, acks)
                })
            })
            .collect();
        for t in tasks {
            let (k, items, acks) = t.await.unwrap();
            assert_eq!(acks.len(), items.len());
            let mine = by_worker(k);
            for (item, ack) in items.iter().zip(&acks) {
                assert_eq!(ack.occurrence_id, item.lease.occurrence_id);
                let own = mine.iter().position(|c| c.id == item.lease.occurrence_id);
                match own {
                    Some(0) => assert!(
                        matches!(ack.conflict, Some(Conflict::StaleEpoch { .. })),
                        "w{k} wrong epoch: {ack:?}"
                    ),
                    Some(_) => assert!(ack.accepted() && ack.rows == 1, "w{k}: {ack:?}"),
                    // Its worker's claim: running, or already ended by its success.
                    None => assert!(
                        matches!(&ack.conflict, Some(Conflict::NotOwner { owner: Some(o) }) if *o == format!("w{}", (k + 1) % WORKERS))
                            || ack.conflict == Some(Conflict::NotClaimed { state: OccurrenceState::Succeeded }),
                        "w{k} foreign item: {ack:?}"
                    ),
                }
            }
        }
        for (k, c) in &claimed {
            let o = get(store.as_ref(), &f, c.id, now).await.occurrence;
            let first = by_worker(*k).first().map(|x| x.id) == Some(c.id);
            if first {
                assert_eq!(o.state, OccurrenceState::Running, "{:?}", c.id);
            } else {
                assert_eq!(o.state, OccurrenceState::Succeeded, "{:?}", c.id);
                assert_eq!(o.result.as_deref(), Some(format!("\"w{k}\"").as_str()));
            }
        }
    });
}

/// A worker renewing its leases while it (or its other thread) reports the same occurrences,
/// in whatever order each request names them: every call returns — neither request is chosen
/// as a deadlock victim (PostgreSQL would abort one with `deadlock detected` if the two locked
/// the same rows in different orders) — every report is accepted, and every renewal speaks
/// for its own lease. Rounds alternate between a batch of successes (on PostgreSQL, the
/// shared success statement) and a batch with a failure (the item-by-item path).
pub fn renewals_and_reports_of_the_same_leases_never_deadlock(rt: &Runtime, h: Harness) {
    const ROUNDS: i64 = 24;
    const PER_ROUND: i64 = 40;
    let store = h.store.clone();
    rt.block_on(async {
        let f = Arc::new(fixture(store.as_ref(), "renew-race", "q").await);
        for round in 0..ROUNDS {
            insert(
                store.as_ref(),
                &f,
                (0..PER_ROUND)
                    .map(|i| new_occ(&f, "q", at(round * 1000 + i), 3))
                    .collect(),
            )
            .await;
            let now = secs(1000 + round * 100);
            let claimed = claim(store.as_ref(), &f, "q", "w", 1000, 600, now).await;
            assert_eq!(claimed.len() as i64, PER_ROUND, "round {round}");
            let leases: Vec<LeaseRef> = claimed.iter().map(Claimed::lease).collect();
            let with_failure = round % 2 == 1;
            // Reported from the middle on, then the first half, as handlers finish.
            let half = leases.len() / 2;
            let report: Vec<FinishItem> = leases[half..]
                .iter()
                .chain(&leases[..half])
                .enumerate()
                .map(|(i, l)| FinishItem {
                    lease: *l,
                    finish: if with_failure && i == leases.len() - 1 {
                        Finish::Failed {
                            class: ErrorClass::Permanent,
                            message: "bad input".into(),
                        }
                    } else {
                        ok("\"done\"")
                    },
                })
                .collect();
            let reversed: Vec<LeaseRef> = leases.iter().rev().copied().collect();
            let interleaved: Vec<LeaseRef> = leases
                .iter()
                .skip(1)
                .step_by(2)
                .chain(leases.iter().step_by(2))
                .copied()
                .collect();
            let renewal = |order: Vec<LeaseRef>| {
                let (store, f) = (store.clone(), f.clone());
                tokio::spawn(async move {
                    let got = store
                        .lease_renew(LeaseRenew {
                            tenant: f.tenant,
                            worker_id: "w".into(),
                            leases: order.clone(),
                            lease: Some(SignedDuration::from_secs(900)),
                            now: Some(now),
                        })
                        .await
                        .expect("a renewal racing a report must not fail");
                    (order, got)
                })
            };
            let renewals = [renewal(reversed), renewal(interleaved)];
            let reporter = {
                let (store, f, items) = (store.clone(), f.clone(), report.clone());
                tokio::spawn(async move {
                    store
                        .occurrence_finish_many(OccurrenceFinishMany {
                            tenant: f.tenant,
                            worker_id: "w".into(),
                            items,
                            now: Some(now),
                        })
                        .await
                        .expect("a report racing renewals must not fail")
                })
            };
            let acks = reporter.await.unwrap();
            assert_eq!(acks.len(), report.len());
            for (item, ack) in report.iter().zip(&acks) {
                assert_eq!(ack.occurrence_id, item.lease.occurrence_id);
                assert!(ack.accepted() && ack.rows == 1, "round {round}: {ack:?}");
            }
            let renewed_until = now.checked_add(SignedDuration::from_secs(900)).unwrap();
            for r in renewals {
                let (order, got) = r.await.unwrap();
                assert_eq!(got.len(), order.len());
                for (sent, g) in order.iter().zip(&got) {
                    assert_eq!(g.lease, *sent, "round {round}: answers in the order asked");
                    if g.renewed {
                        assert_eq!(g.lease_until, Some(renewed_until), "round {round}");
                    }
                }
            }
            for (i, item) in report.iter().enumerate() {
                let o = get(store.as_ref(), &f, item.lease.occurrence_id, now)
                    .await
                    .occurrence;
                let want = if with_failure && i == report.len() - 1 {
                    OccurrenceState::Dead
                } else {
                    OccurrenceState::Succeeded
                };
                assert_eq!(o.state, want, "round {round}, item {i}");
            }
        }
    });
}

/// Reports that claim the worker's next work in the same call (what `POST /v1/completions`
/// with `claim` does): the outcomes are decided as on their own — a stale item is refused, a
/// failure retries — and the claim after them hands out only what no one holds. Eight
/// workers each reporting one and claiming one drain a queue with every occurrence claimed
/// once and completed once.
pub fn reports_that_claim_more_work_run_each_occurrence_once(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let store = h.store.clone();
        let f = Arc::new(fixture(store.as_ref(), "drain", "q").await);
        let now = secs(10);
        let total = 240;
        insert(
            store.as_ref(),
            &f,
            (0..total).map(|i| new_occ(&f, "q", at(i), 3)).collect(),
        )
        .await;
        let tenant = f.tenant;
        let report = move |worker: &str, items: Vec<FinishItem>, max: u32| {
            (
                OccurrenceFinishMany {
                    tenant,
                    worker_id: worker.into(),
                    items,
                    now: Some(now),
                },
                OccurrenceClaim {
                    max_bytes: None,
                    tenant,
                    queue: "q".into(),
                    worker_id: worker.into(),
                    max,
                    lease: Some(SignedDuration::from_secs(60)),
                    key: None,
                    now: Some(now),
                },
            )
        };
        let item = |c: &Claimed, epoch: i64, finish: Finish| FinishItem {
            lease: LeaseRef {
                occurrence_id: c.id,
                epoch,
            },
            finish,
        };

        // One worker: a success and a stale report, then three more claimed.
        let held = claim(store.as_ref(), &f, "q", "w0", 2, 60, now).await;
        let (fin, cl) = report(
            "w0",
            vec![
                item(&held[0], held[0].epoch, ok("done")),
                item(&held[1], held[1].epoch + 5, ok("late")),
            ],
            3,
        );
        let (acks, next) = store.occurrence_finish_and_claim(fin, cl).await.unwrap();
        assert_eq!(acks[0].conflict, None);
        assert_eq!(acks[0].state, Some(OccurrenceState::Succeeded));
        assert!(
            matches!(acks[1].conflict, Some(Conflict::StaleEpoch { .. })),
            "{:?}",
            acks[1]
        );
        let next = next.unwrap();
        assert_eq!(next.len(), 3);
        assert!(
            next.iter()
                .all(|c| c.id != held[0].id && c.id != held[1].id)
        );
        // A failure with its claim: retried later, and more work handed out now.
        let (fin, cl) = report(
            "w0",
            vec![item(
                &next[0],
                next[0].epoch,
                Finish::Failed {
                    class: ErrorClass::Transient,
                    message: "again".into(),
                },
            )],
            1,
        );
        let (acks, more) = store.occurrence_finish_and_claim(fin, cl).await.unwrap();
        assert_eq!(acks[0].state, Some(OccurrenceState::RetryWait));
        assert_eq!(more.unwrap().len(), 1);
        // Tidy what w0 holds (held[1], next[1..], the one just claimed) by finishing it.
        let in_state = async |state| {
            let list = OccurrenceList {
                tenant: f.tenant,
                schedule_id: None,
                state: Some(state),
                from: None,
                to: None,
                after: None,
                limit: 1000,
                now: Some(now),
            };
            store.occurrence_list(list).await.unwrap()
        };
        let listed = in_state(OccurrenceState::Running).await;
        let mut done_by_w0 = 1;
        for o in &listed {
            let a = finish(store.as_ref(), &f, "w0", o.id, o.epoch, ok("tidy"), now).await;
            assert_eq!(a.conflict, None);
            done_by_w0 += 1;
        }

        // Eight workers racing: each reports its one and claims the next until none is left.
        let claims: Arc<Mutex<HashMap<OccurrenceId, u32>>> = Arc::default();
        let mut tasks = Vec::new();
        for w in 0..8 {
            let (store, claims) = (store.clone(), claims.clone());
            let worker = format!("racer-{w}");
            tasks.push(tokio::spawn(async move {
                let mut accepted = 0u32;
                let mut mine = store
                    .occurrence_claim(report(&worker, Vec::new(), 1).1)
                    .await
                    .unwrap();
                while let Some(c) = mine.first().cloned() {
                    *claims.lock().unwrap().entry(c.id).or_default() += 1;
                    let (fin, cl) = report(
                        &worker,
                        vec![FinishItem {
                            lease: LeaseRef {
                                occurrence_id: c.id,
                                epoch: c.epoch,
                            },
                            finish: ok("raced"),
                        }],
                        1,
                    );
                    let (acks, next) = store.occurrence_finish_and_claim(fin, cl).await.unwrap();
                    assert_eq!(acks[0].conflict, None, "{:?}", acks[0]);
                    accepted += 1;
                    mine = next.unwrap();
                }
                accepted
            }));
        }
        let mut accepted = 0;
        for t in tasks {
            accepted += t.await.unwrap();
        }
        let twice: Vec<OccurrenceId> = claims
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, n)| **n != 1)
            .map(|(id, _)| *id)
            .collect();
        assert!(twice.is_empty(), "claimed twice: {twice:?}");
        // Everything was completed once, but the one that failed if its retry (backoff with
        // jitter from its id, possibly next to nothing) was not due yet.
        let succeeded = in_state(OccurrenceState::Succeeded).await.len() as u32;
        let waiting = in_state(OccurrenceState::RetryWait).await.len() as u32;
        assert_eq!(accepted + done_by_w0, succeeded);
        assert_eq!(succeeded + waiting, total as u32, "{succeeded} + {waiting}");
    });
}
