//! The relay's claim from the transactional outbox: externally targeted occurrences, across
//! tenants, fenced exactly like a worker's claims, and every outbox row settled in the end.

use campanile_core::{ErrorClass, OccurrenceState};
use tokio::runtime::Runtime;

use super::*;

const NATS: &str = "$nats:billing.nightly";

async fn relay(
    store: &dyn Store,
    node: &str,
    max: u32,
    lease_s: i64,
    now: Timestamp,
) -> Vec<Relayed> {
    store
        .relay_claim(RelayClaim {
            node: node.into(),
            max,
            lease: SignedDuration::from_secs(lease_s),
            now: Some(now),
        })
        .await
        .expect("relay claim")
}

fn relayed_ids(r: &[Relayed]) -> Vec<OccurrenceId> {
    r.iter().map(|r| r.claim.id).collect()
}

pub fn relay_claims_due_outbox_work_across_tenants(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let a = fixture(s, "acme", NATS).await;
        let b = fixture(s, "globex", NATS).await;
        let a_ids = insert(
            s,
            &a,
            vec![
                new_occ(&a, NATS, secs(10), 3),
                new_occ(&a, NATS, secs(20), 3),
                new_occ(&a, NATS, secs(500), 3),
            ],
        )
        .await;
        let b_ids = insert(s, &b, vec![new_occ(&b, NATS, secs(15), 3)]).await;
        // A built-in queue occurrence of the same tenant writes no outbox row.
        let q_ids = insert(s, &a, vec![new_occ(&a, "q", secs(12), 3)]).await;
        // Inserting again (a racing planner) writes no second outbox row.
        insert(s, &a, vec![new_occ(&a, NATS, secs(10), 3)]).await;

        assert!(
            relay(s, "relay-1", 10, 5, secs(9)).await.is_empty(),
            "nothing due at 9 s"
        );
        assert_eq!(
            s.backlog(BacklogGet {
                now: Some(secs(100))
            })
            .await
            .unwrap()
            .outbox_pending,
            3
        );

        let got = relay(s, "relay-1", 2, 5, secs(100)).await;
        assert_eq!(
            relayed_ids(&got),
            vec![a_ids[0], b_ids[0]],
            "earliest first, across tenants"
        );
        assert_eq!((got[0].tenant, got[1].tenant), (a.tenant, b.tenant));
        assert!(got.iter().all(|r| r.target == NATS));
        assert!(
            got.iter()
                .all(|r| r.claim.epoch == 1 && r.claim.attempt == 1)
        );
        assert_eq!(
            got[0].claim.payload.as_deref(),
            Some("{\"report\":\"daily\"}")
        );
        assert_eq!(got[0].claim.lease_until, secs(105));

        // Workers can still claim the built-in queue; it holds only its own occurrence.
        let w = claim(s, &a, "q", "W", 10, 30, secs(100)).await;
        assert_eq!(w.iter().map(|c| c.id).collect::<Vec<_>>(), q_ids);

        // The relay completes like a worker: fenced by owner and epoch.
        let ack = finish(s, &a, "relay-1", a_ids[0], 1, ok("{\"seq\":1}"), secs(101)).await;
        assert!(ack.accepted());
        // The next claim takes the third due one and settles the delivered row on the way.
        let got = relay(s, "relay-1", 10, 5, secs(101)).await;
        assert_eq!(relayed_ids(&got), vec![a_ids[1]]);
        let b_left = s
            .backlog(BacklogGet {
                now: Some(secs(101)),
            })
            .await
            .unwrap()
            .outbox_pending;
        // The row just claimed waits for its delivery; the one under a live lease (postponed
        // to its lease end) is not waiting.
        assert_eq!(b_left, 1);
        for (f, id, epoch) in [(&b, b_ids[0], 1), (&a, a_ids[1], 1)] {
            assert!(
                finish(s, f, "relay-1", id, epoch, ok("{}"), secs(102))
                    .await
                    .accepted()
            );
        }
        assert!(relay(s, "relay-1", 10, 5, secs(102)).await.is_empty());
        assert_eq!(
            s.backlog(BacklogGet {
                now: Some(secs(102))
            })
            .await
            .unwrap()
            .outbox_pending,
            0
        );
        // The future one comes due in its time.
        assert_eq!(
            relayed_ids(&relay(s, "relay-1", 10, 5, secs(500)).await),
            vec![a_ids[2]]
        );
    });
}

pub fn relay_lease_expiry_hands_over_and_fences_the_stale_relay(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", NATS).await;
        let ids = insert(s, &f, vec![new_occ(&f, NATS, secs(10), 3)]).await;
        let first = relay(s, "relay-A", 10, 5, secs(10)).await;
        assert_eq!(relayed_ids(&first), ids);
        // Inside A's lease, B gets nothing; at lease_until exactly, B takes it over.
        assert!(relay(s, "relay-B", 10, 5, secs(14)).await.is_empty());
        let second = relay(s, "relay-B", 10, 5, secs(15)).await;
        assert_eq!(relayed_ids(&second), ids);
        assert_eq!((second[0].claim.epoch, second[0].claim.attempt), (2, 2));
        // A comes back from the dead: refused, nothing changes. B's completion is accepted.
        let stale = finish(s, &f, "relay-A", ids[0], 1, ok("{\"by\":\"A\"}"), secs(16)).await;
        assert_eq!(stale.rows, 0);
        assert!(stale.conflict.is_some());
        assert!(
            finish(s, &f, "relay-B", ids[0], 2, ok("{\"by\":\"B\"}"), secs(16))
                .await
                .accepted()
        );
        let d = get(s, &f, ids[0], secs(16)).await;
        assert_eq!(d.occurrence.state, OccurrenceState::Succeeded);
        assert_eq!(d.attempts.len(), 2);
        assert!(relay(s, "relay-A", 10, 5, secs(17)).await.is_empty());
        assert_eq!(
            s.backlog(BacklogGet {
                now: Some(secs(17))
            })
            .await
            .unwrap()
            .outbox_pending,
            0
        );
    });
}

pub fn relay_retries_settles_cancels_and_reopens_on_redrive(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", NATS).await;
        let ids = insert(
            s,
            &f,
            vec![
                new_occ(&f, NATS, secs(10), 2),
                new_occ(&f, NATS, secs(11), 2),
            ],
        )
        .await;
        // The second is canceled before it is due: never handed to the relay, row settled.
        let c = s
            .occurrence_cancel(OccurrenceCancel {
                tenant: f.tenant,
                occurrence_id: ids[1],
                now: Some(secs(5)),
            })
            .await
            .unwrap();
        assert!(c.accepted());
        let got = relay(s, "relay-1", 10, 5, secs(20)).await;
        assert_eq!(relayed_ids(&got), vec![ids[0]]);
        // Another relay's scan finds it in flight, and puts its outbox row off to the lease's
        // end (25 s).
        let in_flight = at(20_500);
        assert!(relay(s, "relay-2", 10, 5, in_flight).await.is_empty());
        // A transient publish failure backs off; the relay does not see it before its time,
        // nor after it (the retry instant comes before the lease's end).
        let failed = Finish::Failed {
            class: ErrorClass::Transient,
            message: "no stream for subject".into(),
        };
        let ack = finish(s, &f, "relay-1", ids[0], 1, failed.clone(), secs(21)).await;
        assert!(ack.accepted());
        let retry_at = ack.retry_at.expect("a retry instant");
        assert!(retry_at > secs(21));
        let before = Timestamp::from_millisecond(retry_at.as_millisecond() - 1).unwrap();
        assert!(relay(s, "relay-1", 10, 5, before).await.is_empty());
        let again = relay(s, "relay-1", 10, 5, retry_at).await;
        assert_eq!(relayed_ids(&again), vec![ids[0]]);
        assert_eq!(again[0].claim.attempt, 2);
        // Attempts exhausted: DEAD, and the row settles with that outcome.
        let ack = finish(s, &f, "relay-1", ids[0], 2, failed, retry_at).await;
        assert_eq!(ack.state, Some(OccurrenceState::Dead));
        let later = Timestamp::from_millisecond(retry_at.as_millisecond() + 1_000).unwrap();
        assert!(relay(s, "relay-1", 10, 5, later).await.is_empty());
        assert_eq!(
            s.backlog(BacklogGet { now: Some(later) })
                .await
                .unwrap()
                .outbox_pending,
            0
        );
        // An operator redrives the dead letter: the relay delivers it again.
        let r = s
            .occurrence_redrive(OccurrenceRedrive {
                tenant: f.tenant,
                occurrence_id: ids[0],
                now: Some(later),
            })
            .await
            .unwrap();
        assert!(r.accepted());
        let redriven = relay(s, "relay-1", 10, 5, later).await;
        assert_eq!(relayed_ids(&redriven), vec![ids[0]]);
        assert_eq!(redriven[0].claim.epoch, 3);
        // The canceled one is still canceled and was never claimed.
        let d = get(s, &f, ids[1], later).await;
        assert_eq!(
            (d.occurrence.state, d.attempts.len()),
            (OccurrenceState::Canceled, 0)
        );
    });
}
