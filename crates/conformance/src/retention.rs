//! Retention: which occurrences a batch takes (only final ones, older than their tenant's
//! policy, never a schedule's latest), what closing it removes and counts, a batch left open
//! by a node that stopped, and a batch given up because something in it changed.

use std::collections::BTreeMap;

use campanile_core::{ErrorClass, OccurrenceState};
use jiff::SignedDuration;
use tokio::runtime::Runtime;

use super::*;

const DAY: i64 = 86_400;

fn open_params(node: &str, now: Timestamp, limit: u32) -> RetentionBatchOpen {
    RetentionBatchOpen {
        node: node.into(),
        default_retention: Some(SignedDuration::from_secs(DAY)),
        limit,
        after: None,
        window: 10_000,
        lease: SignedDuration::from_secs(60),
        now: Some(now),
    }
}

fn close_params(node: &str, b: &RetentionBatch, now: Timestamp) -> RetentionBatchClose {
    RetentionBatchClose {
        batch: b.id,
        node: node.into(),
        items: b
            .items
            .iter()
            .map(|r| ArchivedKey::of(&r.detail.occurrence))
            .collect(),
        now: Some(now),
    }
}

fn ids_of(b: &RetentionBatch) -> Vec<OccurrenceId> {
    let mut ids: Vec<_> = b.items.iter().map(|r| r.detail.occurrence.id).collect();
    ids.sort_by_key(|i| i.0);
    ids
}

fn sorted(mut ids: Vec<OccurrenceId>) -> Vec<OccurrenceId> {
    ids.sort_by_key(|i| i.0);
    ids
}

/// Runs one occurrence to an end: `Some(true)` succeeded, `Some(false)` dead (permanent
/// failure), `None` canceled before it was claimed.
async fn end(s: &dyn Store, f: &Fixture, id: OccurrenceId, how: Option<bool>, now: Timestamp) {
    match how {
        None => {
            let ack = s
                .occurrence_cancel(OccurrenceCancel {
                    tenant: f.tenant,
                    occurrence_id: id,
                    now: Some(now),
                })
                .await
                .unwrap();
            assert_eq!(ack.state, Some(OccurrenceState::Canceled));
        }
        Some(success) => {
            let c = claim(s, f, "q", "w", 1, 30, now).await;
            assert_eq!(c.len(), 1, "the occurrence to end is claimed");
            assert_eq!(c[0].id, id);
            let outcome = if success {
                ok("{\"rows\":3}")
            } else {
                Finish::Failed {
                    class: ErrorClass::Permanent,
                    message: "bad input".into(),
                }
            };
            let ack = finish(s, f, "w", id, c[0].epoch, outcome, now).await;
            assert!(ack.accepted(), "{ack:?}");
        }
    }
}

pub fn retention_takes_exactly_the_eligible_occurrences(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let mut items = Vec::new();
        for i in 0..8 {
            items.push(new_occ(&f, "q", secs(i * 10), 1));
        }
        // One more, planned a day and a half later: too young to go.
        items.push(new_occ(&f, "q", secs(DAY + DAY / 2), 1));
        let ids = insert(s, &f, items).await;
        end(s, &f, ids[0], Some(true), secs(1)).await;
        end(s, &f, ids[1], Some(false), secs(11)).await;
        end(s, &f, ids[2], None, secs(21)).await;
        // ids[3] is claimed and left RUNNING (its one attempt's lease runs out unreported);
        // ids[4] to ids[6] succeed; ids[7] stays READY; ids[8], young, is canceled.
        let running = claim(s, &f, "q", "w", 1, 30, secs(31)).await;
        assert_eq!(running[0].id, ids[3], "the oldest READY goes first");
        end(s, &f, ids[4], Some(true), secs(42)).await;
        end(s, &f, ids[5], Some(true), secs(51)).await;
        end(s, &f, ids[6], Some(true), secs(61)).await;
        end(s, &f, ids[8], None, secs(DAY + DAY / 2)).await;

        // A schedule whose only occurrence is old and done: its latest, kept.
        let lone = Fixture {
            tenant: f.tenant,
            schedule: new_schedule(s, f.tenant, "q").await,
        };
        let lone_id = insert(s, &lone, vec![new_occ(&lone, "q", secs(5), 1)]).await[0];
        end(s, &lone, lone_id, Some(true), secs(6)).await;

        // A tenant that keeps its history forever, and one with a retention of its own (two
        // days: nothing of it is due yet).
        let forever = fixture(s, "keeper", "q").await;
        s.tenant_retention_set(TenantRetentionSet {
            tenant: forever.tenant,
            retention: Retention::Forever,
        })
        .await
        .unwrap();
        let kept = insert(
            s,
            &forever,
            vec![
                new_occ(&forever, "q", secs(0), 1),
                new_occ(&forever, "q", secs(1), 1),
            ],
        )
        .await;
        end(s, &forever, kept[0], Some(true), secs(2)).await;
        end(s, &forever, kept[1], Some(true), secs(3)).await;
        let own = fixture(s, "own", "q").await;
        s.tenant_retention_set(TenantRetentionSet {
            tenant: own.tenant,
            retention: Retention::For(SignedDuration::from_secs(3 * DAY)),
        })
        .await
        .unwrap();
        let own_ids = insert(
            s,
            &own,
            vec![
                new_occ(&own, "q", secs(0), 1),
                new_occ(&own, "q", secs(1), 1),
            ],
        )
        .await;
        end(s, &own, own_ids[0], Some(true), secs(2)).await;
        end(s, &own, own_ids[1], Some(true), secs(3)).await;
        let tenants = s.tenant_list().await.unwrap();
        let policy: BTreeMap<&str, Retention> = tenants
            .iter()
            .map(|t| (t.name.as_str(), t.retention))
            .collect();
        assert_eq!(policy["acme"], Retention::Default);
        assert_eq!(policy["keeper"], Retention::Forever);
        assert_eq!(
            policy["own"],
            Retention::For(SignedDuration::from_secs(3 * DAY))
        );

        // Without a default, a tenant without its own keeps everything.
        let now = secs(2 * DAY);
        let none = s
            .retention_batch_open(RetentionBatchOpen {
                default_retention: None,
                ..open_params("n1", now, 100)
            })
            .await
            .unwrap()
            .batch;
        assert!(none.is_none(), "no default retention: nothing is due");

        let batch = s
            .retention_batch_open(open_params("n1", now, 100))
            .await
            .unwrap()
            .batch
            .expect("a batch");
        assert!(!batch.resumed);
        assert_eq!(
            ids_of(&batch),
            sorted(vec![ids[0], ids[1], ids[2], ids[4], ids[5], ids[6]]),
            "only final, old, not-latest occurrences of tenants whose retention passed"
        );
        for r in &batch.items {
            assert_eq!(r.tenant, f.tenant);
            assert_eq!(r.tenant_name, "acme");
            let stored = get(s, &f, r.detail.occurrence.id, now).await;
            assert_eq!(
                r.detail, stored,
                "the batch carries the occurrence as stored"
            );
        }
        let dead = batch
            .items
            .iter()
            .find(|r| r.detail.occurrence.id == ids[1])
            .unwrap();
        assert_eq!(dead.detail.attempts.len(), 1);
        assert_eq!(
            dead.detail.attempts[0].error_message.as_deref(),
            Some("bad input")
        );

        // One batch at a time: the open one is the node's own to finish.
        let again = s
            .retention_batch_open(open_params("n1", now, 100))
            .await
            .unwrap()
            .batch
            .expect("the open batch, handed back to its owner");
        assert_eq!((again.id, again.resumed), (batch.id, true));
        assert_eq!(ids_of(&again), ids_of(&batch));

        let closed = s
            .retention_batch_close(close_params("n1", &batch, now))
            .await
            .unwrap();
        assert_eq!((closed.removed, closed.abandoned), (6, false));
        assert_eq!(
            closed.attempts_removed, 1,
            "the dead letter's failed attempt"
        );
        let left: Vec<OccurrenceId> = schedule_occurrences(s, f.tenant, f.schedule)
            .await
            .iter()
            .map(|o| o.id)
            .collect();
        assert_eq!(sorted(left), sorted(vec![ids[3], ids[7], ids[8]]));
        assert_eq!(
            schedule_occurrences(s, f.tenant, lone.schedule).await.len(),
            1
        );
        assert_eq!(
            schedule_occurrences(s, forever.tenant, forever.schedule)
                .await
                .len(),
            2
        );
        assert_eq!(
            schedule_occurrences(s, own.tenant, own.schedule)
                .await
                .len(),
            2
        );
        for id in [ids[0], ids[1]] {
            let gone = s
                .occurrence_get(OccurrenceGet {
                    tenant: f.tenant,
                    key: OccurrenceKey::Id(id),
                    now: Some(now),
                })
                .await
                .unwrap();
            assert!(gone.is_none());
        }

        // What left is counted, per version, day and state.
        let rollups = s
            .rollup_list(RollupList {
                tenant: f.tenant,
                schedule_id: f.schedule,
            })
            .await
            .unwrap();
        let counts: BTreeMap<&str, (u64, Timestamp, Timestamp)> = rollups
            .iter()
            .map(|r| (r.state.as_str(), (r.count, r.first_at, r.last_at)))
            .collect();
        assert_eq!(
            counts,
            BTreeMap::from([
                ("SUCCEEDED", (4, secs(0), secs(60))),
                ("DEAD", (1, secs(10), secs(10))),
                ("CANCELED", (1, secs(20), secs(20))),
            ])
        );
        let midnight =
            Timestamp::from_second(secs(0).as_second() - secs(0).as_second() % DAY).unwrap();
        assert!(rollups.iter().all(|r| r.version == 1 && r.day == midnight));
        // Another tenant's schedule id reads nothing.
        assert!(
            s.rollup_list(RollupList {
                tenant: own.tenant,
                schedule_id: f.schedule,
            })
            .await
            .unwrap()
            .is_empty()
        );

        // Nothing more is due; a day later the own-retention tenant's first run is (its
        // second is its schedule's latest), and the keeper's never.
        assert!(
            s.retention_batch_open(open_params("n1", now, 100))
                .await
                .unwrap()
                .batch
                .is_none()
        );
        let later = s
            .retention_batch_open(open_params("n1", secs(3 * DAY + 10), 100))
            .await
            .unwrap()
            .batch
            .expect("the own-retention tenant's old run");
        assert_eq!(ids_of(&later), vec![own_ids[0]]);
        let status = s.retention_status().await.unwrap();
        assert_eq!(
            status.oldest,
            Some(secs(0)),
            "the keeper's first run is the oldest"
        );
    });
}

pub fn a_retention_batch_left_open_is_finished_not_chosen_again(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(
            s,
            &f,
            (0..6).map(|i| new_occ(&f, "q", secs(i), 1)).collect(),
        )
        .await;
        for (i, id) in ids.iter().enumerate() {
            end(s, &f, *id, Some(true), secs(i as i64 + 1)).await;
        }
        let now = secs(2 * DAY);
        // Bounded, oldest first.
        let first = s
            .retention_batch_open(open_params("A", now, 2))
            .await
            .unwrap()
            .batch
            .unwrap();
        assert_eq!(ids_of(&first), sorted(vec![ids[0], ids[1]]));
        // A's lease holds the batch: B gets nothing, not a second batch.
        assert!(
            s.retention_batch_open(open_params("B", secs(2 * DAY + 59), 2))
                .await
                .unwrap()
                .batch
                .is_none()
        );
        // A stops; once its lease has passed, B finishes the same batch.
        let taken = s
            .retention_batch_open(open_params("B", secs(2 * DAY + 61), 2))
            .await
            .unwrap()
            .batch
            .unwrap();
        assert_eq!((taken.id, taken.resumed), (first.id, true));
        assert_eq!(ids_of(&taken), ids_of(&first));
        // A, back, is refused: the batch is B's.
        let refused = s
            .retention_batch_close(close_params("A", &first, secs(2 * DAY + 62)))
            .await;
        assert!(
            matches!(refused, Err(StoreError::WrongState(_))),
            "{refused:?}"
        );
        let closed = s
            .retention_batch_close(close_params("B", &taken, secs(2 * DAY + 62)))
            .await
            .unwrap();
        assert_eq!(closed.removed, 2);
        // Closed once: closing it again is refused, and counts nothing twice.
        let twice = s
            .retention_batch_close(close_params("B", &taken, secs(2 * DAY + 63)))
            .await;
        assert!(matches!(twice, Err(StoreError::WrongState(_))), "{twice:?}");
        let next = s
            .retention_batch_open(open_params("A", secs(2 * DAY + 64), 10))
            .await
            .unwrap()
            .batch
            .unwrap();
        assert_ne!(next.id, first.id);
        assert_eq!(
            ids_of(&next),
            sorted(vec![ids[2], ids[3], ids[4]]),
            "the rest but the schedule's latest"
        );
        s.retention_batch_close(close_params("A", &next, secs(2 * DAY + 65)))
            .await
            .unwrap();
        let rollups = s
            .rollup_list(RollupList {
                tenant: f.tenant,
                schedule_id: f.schedule,
            })
            .await
            .unwrap();
        assert_eq!(rollups.len(), 1);
        assert_eq!(
            (rollups[0].count, rollups[0].first_at, rollups[0].last_at),
            (5, secs(0), secs(4))
        );
    });
}

pub fn a_retention_batch_with_a_redriven_occurrence_is_given_up(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(
            s,
            &f,
            (0..4).map(|i| new_occ(&f, "q", secs(i), 1)).collect(),
        )
        .await;
        end(s, &f, ids[0], Some(true), secs(1)).await;
        end(s, &f, ids[1], Some(false), secs(2)).await;
        end(s, &f, ids[2], Some(true), secs(3)).await;
        end(s, &f, ids[3], Some(true), secs(4)).await;
        let now = secs(2 * DAY);
        let batch = s
            .retention_batch_open(open_params("A", now, 10))
            .await
            .unwrap()
            .batch
            .unwrap();
        assert_eq!(ids_of(&batch), sorted(vec![ids[0], ids[1], ids[2]]));
        // An operator redrives the dead letter after the archive read it, then cancels it:
        // final again, at the same epoch, but not what the archive holds.
        let ack = s
            .occurrence_redrive(OccurrenceRedrive {
                tenant: f.tenant,
                occurrence_id: ids[1],
                now: Some(now),
            })
            .await
            .unwrap();
        assert_eq!(ack.state, Some(OccurrenceState::Ready));
        let ack = s
            .occurrence_cancel(OccurrenceCancel {
                tenant: f.tenant,
                occurrence_id: ids[1],
                now: Some(now + SignedDuration::from_secs(1)),
            })
            .await
            .unwrap();
        assert_eq!(ack.state, Some(OccurrenceState::Canceled));
        let closed = s
            .retention_batch_close(close_params("A", &batch, now))
            .await
            .unwrap();
        assert_eq!((closed.removed, closed.abandoned), (0, true));
        assert_eq!(schedule_occurrences(s, f.tenant, f.schedule).await.len(), 4);
        assert!(
            s.rollup_list(RollupList {
                tenant: f.tenant,
                schedule_id: f.schedule,
            })
            .await
            .unwrap()
            .is_empty()
        );
        // Given up, the batch stays open, marked, until its files are deleted: the next open
        // hands it back with nothing in it, and closing it again forgets it.
        let marked = s
            .retention_batch_open(open_params("A", now, 10))
            .await
            .unwrap()
            .batch
            .unwrap();
        assert_eq!(
            (marked.id, marked.abandoned, marked.items.len()),
            (batch.id, true, 0)
        );
        let forgotten = s
            .retention_batch_close(RetentionBatchClose {
                items: Vec::new(),
                ..close_params("A", &marked, now)
            })
            .await
            .unwrap();
        assert_eq!((forgotten.removed, forgotten.abandoned), (0, true));
        // The next batch takes what is still due, the canceled one too (its cancel is a day
        // old by then).
        let later = now + SignedDuration::from_secs(DAY + 10);
        let next = s
            .retention_batch_open(open_params("A", later, 10))
            .await
            .unwrap()
            .batch
            .unwrap();
        assert!(!next.resumed);
        assert_eq!(ids_of(&next), sorted(vec![ids[0], ids[1], ids[2]]));
        let closed = s
            .retention_batch_close(close_params("A", &next, later))
            .await
            .unwrap();
        assert_eq!((closed.removed, closed.abandoned), (3, false));
    });
}

pub fn retention_steps_over_kept_history_a_window_at_a_time(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let missed = |f: &Fixture, at: Timestamp| NewOccurrence {
            state: OccurrenceState::Missed,
            ..new_occ(f, "q", at, 1)
        };
        // Six old runs of a tenant that keeps everything, then two of one that does not,
        // each schedule with a later (latest) run.
        let keeper = fixture(s, "keeper", "q").await;
        s.tenant_retention_set(TenantRetentionSet {
            tenant: keeper.tenant,
            retention: Retention::Forever,
        })
        .await
        .unwrap();
        let mut kept: Vec<NewOccurrence> = (0..6).map(|i| missed(&keeper, secs(i))).collect();
        kept.push(missed(&keeper, secs(100)));
        insert(s, &keeper, kept).await;
        let acme = fixture(s, "acme", "q").await;
        let gone = insert(
            s,
            &acme,
            vec![
                missed(&acme, secs(10)),
                missed(&acme, secs(11)),
                missed(&acme, secs(200)),
            ],
        )
        .await;
        let now = secs(2 * DAY);
        let mut after = None;
        let mut calls = 0;
        let mut found = Vec::new();
        loop {
            calls += 1;
            assert!(calls < 10, "the scan does not end");
            let scan = s
                .retention_batch_open(RetentionBatchOpen {
                    after,
                    window: 3,
                    ..open_params("n1", now, 100)
                })
                .await
                .unwrap();
            if let Some(b) = scan.batch {
                found.extend(ids_of(&b));
                let closed = s
                    .retention_batch_close(close_params("n1", &b, now))
                    .await
                    .unwrap();
                assert_eq!(closed.removed as usize, b.items.len());
            }
            after = scan.scanned_to;
            if after.is_none() {
                break;
            }
        }
        // Three windows of three over the kept runs and acme's two, one short window to the
        // end: each call looked at no more than three occurrences.
        assert_eq!(calls, 4);
        assert_eq!(found, sorted(vec![gone[0], gone[1]]));
        assert_eq!(
            schedule_occurrences(s, keeper.tenant, keeper.schedule)
                .await
                .len(),
            7
        );
        assert_eq!(
            schedule_occurrences(s, acme.tenant, acme.schedule)
                .await
                .len(),
            1
        );
    });
}
