//! Records and tenants: unique keys, tenant isolation, listings and their cursor, the backlog,
//! the deployment's shard count, tenant classes and idempotency reservations.

use campanile_core::OccurrenceState;
use jiff::SignedDuration;
use tokio::runtime::Runtime;

use super::*;

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

pub fn backlog_counts_due_unclaimed_work(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let empty = s
            .backlog(BacklogGet {
                now: Some(secs(100)),
            })
            .await
            .unwrap();
        assert_eq!((empty.due, empty.oldest_due_at), (0, None));
        // Due at 10, 20, 30 s; one more due only at 500 s; a second queue due at 5 s.
        let mut items: Vec<_> = [10, 20, 30, 500]
            .into_iter()
            .map(|t| new_occ(&f, "q", secs(t), 3))
            .collect();
        items.push(new_occ(&f, "other", secs(5), 3));
        insert(s, &f, items).await;
        let b = s
            .backlog(BacklogGet {
                now: Some(secs(100)),
            })
            .await
            .unwrap();
        assert_eq!((b.due, b.oldest_due_at), (4, Some(secs(5))));
        assert_eq!(b.outbox_pending, 0);
        // Claimed work is no longer waiting; the oldest moves on.
        claim(s, &f, "other", "A", 10, 600, secs(100)).await;
        claim(s, &f, "q", "A", 1, 600, secs(100)).await;
        let b = s
            .backlog(BacklogGet {
                now: Some(secs(100)),
            })
            .await
            .unwrap();
        assert_eq!((b.due, b.oldest_due_at), (2, Some(secs(20))));
        // At 550 s the future one is due too (and the leases above are still held).
        let b = s
            .backlog(BacklogGet {
                now: Some(secs(550)),
            })
            .await
            .unwrap();
        assert_eq!((b.due, b.oldest_due_at), (3, Some(secs(20))));
    });
}

pub fn the_first_shard_count_recorded_is_kept(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        assert_eq!(
            s.deployment_shards(DeploymentShards { shards: 16 })
                .await
                .unwrap(),
            16
        );
        // A node started with another count learns the recorded one (and refuses to start).
        assert_eq!(
            s.deployment_shards(DeploymentShards { shards: 8 })
                .await
                .unwrap(),
            16
        );
        assert_eq!(
            s.deployment_shards(DeploymentShards { shards: 16 })
                .await
                .unwrap(),
            16
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
        assert_eq!(listed[0].class, campanile_store::classes::DEFAULT_CLASS);
        set(f.tenant, "pro").await.unwrap();
        let by_name = s
            .tenant_by_name(TenantByName { name: "t0".into() })
            .await
            .unwrap()
            .unwrap();
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
            .filter(|c| c != campanile_store::classes::DEFAULT_CLASS)
            .collect();
        assert_eq!(
            classes.len(),
            campanile_store::classes::MAX_CLASSES,
            "{classes:?}"
        );
        // Full: a new class is refused, an existing one (or the default) is not; a tenant
        // that is the only one of its class may move it to a new one (the count stays).
        let d = new_tenant("d").await;
        assert!(matches!(
            set(d, "brand-new").await,
            Err(StoreError::Invalid(_))
        ));
        set(d, "pro").await.unwrap();
        set(d, campanile_store::classes::DEFAULT_CLASS)
            .await
            .unwrap();
        set(tenants[0], "renamed").await.unwrap();
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
        let get = || async {
            s.idempotency_get(IdempotencyGet {
                tenant: f.tenant,
                key: "k1".into(),
            })
            .await
            .unwrap()
            .unwrap()
        };

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
        s.idempotency_finish(IdempotencyFinish {
            tenant: f.tenant,
            key: "k1".into(),
            token: "A".into(),
            answer: None,
        })
        .await
        .unwrap();
        assert_eq!(get().await.status, 0);

        let made = create("B");
        s.schedule_create(made.clone()).await.unwrap();
        assert_eq!(get().await.schedule_id, Some(made.id));
        // Its request dies before answering: the reservation is neither taken over nor
        // released, whatever its age; the schedule on it is the answer.
        assert!(!s.idempotency_put(put("C", b"h", secs(600))).await.unwrap());
        s.idempotency_finish(IdempotencyFinish {
            tenant: f.tenant,
            key: "k1".into(),
            token: "B".into(),
            answer: None,
        })
        .await
        .unwrap();
        let held = get().await;
        assert_eq!((held.status, held.schedule_id), (0, Some(made.id)));
        // The answer is recorded once.
        s.idempotency_finish(IdempotencyFinish {
            tenant: f.tenant,
            key: "k1".into(),
            token: "C".into(),
            answer: Some((201, "first".into())),
        })
        .await
        .unwrap();
        s.idempotency_finish(IdempotencyFinish {
            tenant: f.tenant,
            key: "k1".into(),
            token: "B".into(),
            answer: Some((201, "second".into())),
        })
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
        s.idempotency_finish(IdempotencyFinish {
            tenant: f.tenant,
            key: "k2".into(),
            token: "E".into(),
            answer: None,
        })
        .await
        .unwrap();
        assert!(s.idempotency_put(other("F", secs(2))).await.unwrap());
    });
}

pub fn a_triggered_schedule_runs_once_now_and_its_key_answers_again(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let trigger = |key: Option<&str>, now: Timestamp| ScheduleTrigger {
            tenant: f.tenant,
            id: f.schedule,
            key: key.map(str::to_string),
            payload: None,
            now: Some(now),
        };
        let first = s
            .schedule_trigger(trigger(Some("k1"), secs(100)))
            .await
            .unwrap();
        assert!(first.created);
        assert_eq!(first.scheduled_for, secs(100));
        let d = get(s, &f, first.occurrence_id, secs(100)).await;
        assert_eq!(
            (
                d.occurrence.state,
                d.occurrence.origin,
                d.occurrence.queue.as_str()
            ),
            (OccurrenceState::Ready, Origin::Manual, "q")
        );
        assert_eq!((d.occurrence.version, d.occurrence.max_attempts), (1, 3));
        // Sent again with its key: the same occurrence, nothing new.
        let again = s
            .schedule_trigger(trigger(Some("k1"), secs(101)))
            .await
            .unwrap();
        assert_eq!(
            (again.occurrence_id, again.scheduled_for, again.created),
            (first.occurrence_id, secs(100), false)
        );
        let other = s.schedule_trigger(trigger(None, secs(102))).await.unwrap();
        assert!(other.created);
        assert_ne!(other.occurrence_id, first.occurrence_id);
        // Both are claimable at once, first things first.
        let c = claim(s, &f, "q", "w", 10, 30, secs(103)).await;
        let claimed: Vec<OccurrenceId> = c.iter().map(|c| c.id).collect();
        assert_eq!(claimed, vec![first.occurrence_id, other.occurrence_id]);
        // A planned occurrence reads as planned.
        let planned = insert(s, &f, vec![new_occ(&f, "q", secs(200), 3)]).await;
        assert_eq!(
            get(s, &f, planned[0], secs(200)).await.occurrence.origin,
            Origin::Planned
        );
        // A pause cancels an unclaimed manual run like any other, and a paused schedule is
        // not run on demand.
        let pending = s.schedule_trigger(trigger(None, secs(300))).await.unwrap();
        s.schedule_transition(ScheduleTransition {
            tenant: f.tenant,
            id: f.schedule,
            to: ScheduleState::Paused,
            superseded: Superseded::default(),
            now: Some(secs(301)),
        })
        .await
        .unwrap();
        assert_eq!(
            get(s, &f, pending.occurrence_id, secs(302))
                .await
                .occurrence
                .state,
            OccurrenceState::Canceled
        );
        let refused = s.schedule_trigger(trigger(None, secs(303))).await;
        assert!(
            matches!(refused, Err(StoreError::WrongState(_))),
            "{refused:?}"
        );
        let unknown = s
            .schedule_trigger(ScheduleTrigger {
                id: ScheduleId(Uuid::now_v7()),
                ..trigger(None, secs(304))
            })
            .await;
        assert!(
            matches!(unknown, Err(StoreError::NotFound(_))),
            "{unknown:?}"
        );
        // Another tenant cannot trigger it.
        let other_tenant = fixture(s, "other", "q").await;
        let foreign = s
            .schedule_trigger(ScheduleTrigger {
                tenant: other_tenant.tenant,
                ..trigger(None, secs(305))
            })
            .await;
        assert!(
            matches!(foreign, Err(StoreError::NotFound(_))),
            "{foreign:?}"
        );
    });
}
