//! A claim sent again after its answer was lost ([`ClaimKey::resent`]).

use campanile_core::OccurrenceState;
use jiff::SignedDuration;
use tokio::runtime::Runtime;

use super::*;

/// A claim with a key ([`ClaimKey`]) and a lease of 30 s.
async fn claim_keyed(
    store: &dyn Store,
    f: &Fixture,
    queue: &str,
    worker: &str,
    max: u32,
    key: ClaimKey,
    now: Timestamp,
) -> Vec<Claimed> {
    let lease = Some(SignedDuration::from_secs(30));
    store
        .occurrence_claim(claim_params(f, queue, worker, max, lease, Some(key), now))
        .await
        .expect("claim")
}

fn keyed(n: u128, resent: bool) -> ClaimKey {
    ClaimKey {
        id: Uuid::from_u128(n),
        resent,
    }
}

/// What a claim answers, without the payload: the fields a worker runs it by.
fn terms(c: &[Claimed]) -> Vec<(OccurrenceId, i64, Timestamp, Timestamp, u32)> {
    c.iter()
        .map(|c| (c.id, c.epoch, c.lease_until, c.claimed_at, c.attempt))
        .collect()
}

/// A claim whose answer was lost and that is sent again with its key gets what its first
/// sending claimed, as it was, and claims nothing more; only the same worker, only what it
/// still holds under that claim, and only when it says the claim is sent again. Covers the
/// plain claim, a report that claims, an overlap-constrained claim and a limited queue's.
pub fn a_claim_sent_again_answers_what_it_claimed(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let ids = insert(
            s,
            &f,
            (0..4).map(|i| new_occ(&f, "q", secs(i), 3)).collect(),
        )
        .await;

        let first = claim_keyed(s, &f, "q", "A", 2, keyed(1, false), secs(5)).await;
        assert_eq!(terms(&first).len(), 2);
        assert_eq!(first.iter().map(|c| c.id).collect::<Vec<_>>(), ids[..2]);
        // Sent again: the same two, same epochs, leases and claim instant, and the payload.
        let again = claim_keyed(s, &f, "q", "A", 2, keyed(1, true), secs(6)).await;
        assert_eq!(terms(&again), terms(&first));
        assert!(first.iter().all(|c| !c.replayed) && again.iter().all(|c| c.replayed));
        assert_eq!(
            again.iter().map(|c| c.payload.clone()).collect::<Vec<_>>(),
            first.iter().map(|c| c.payload.clone()).collect::<Vec<_>>()
        );
        assert!(again[0].payload.is_some());
        // The same look-up alone (for a node that hands out nothing new): the same answer,
        // and nothing for a claim not marked as sent again.
        let lookup = |key: ClaimKey| claim_params(&f, "q", "A", 2, None, Some(key), secs(6));
        let held = s
            .occurrence_claimed_with_key(lookup(keyed(1, true)))
            .await
            .unwrap();
        assert_eq!(terms(&held), terms(&first));
        assert_eq!(held[0].payload, first[0].payload);
        assert!(held.iter().all(|c| c.replayed));
        let none = s
            .occurrence_claimed_with_key(lookup(keyed(1, false)))
            .await
            .unwrap();
        assert!(none.is_empty());
        // Another worker sending the same key claims as usual: the next one, not A's.
        let b = claim_keyed(s, &f, "q", "B", 1, keyed(1, true), secs(6)).await;
        assert_eq!(terms(&b), vec![(ids[2], 1, secs(36), secs(6), 1)]);
        // What A reported is no longer held: sent again, only the other comes back.
        assert!(
            finish(s, &f, "A", ids[0], 1, ok("done"), secs(7))
                .await
                .accepted()
        );
        let again = claim_keyed(s, &f, "q", "A", 2, keyed(1, true), secs(8)).await;
        assert_eq!(terms(&again), terms(&first[1..]));
        // The same key not marked as sent again is a claim like any other.
        let next = claim_keyed(s, &f, "q", "A", 5, keyed(1, false), secs(8)).await;
        assert_eq!(terms(&next), vec![(ids[3], 1, secs(38), secs(8), 1)]);
        // A lease that has ended is no longer the key's: sent again as ids[1]'s lease ends,
        // the key answers only ids[3], which it claimed later and still holds.
        let again = claim_keyed(s, &f, "q", "A", 2, keyed(1, true), secs(35)).await;
        assert_eq!(terms(&again), vec![(ids[3], 1, secs(38), secs(8), 1)]);
        // A key that holds nothing claims as usual: here the occurrence whose lease ended, at
        // a new epoch, recorded under the key.
        let late = claim_keyed(s, &f, "q", "A", 1, keyed(2, true), secs(35)).await;
        assert_eq!(terms(&late), vec![(ids[1], 2, secs(65), secs(35), 2)]);
        assert!(!late[0].replayed && !b[0].replayed);
        let again = claim_keyed(s, &f, "q", "A", 1, keyed(2, true), secs(36)).await;
        assert_eq!(terms(&again), terms(&late));
        // A claim without a key clears the key of what it takes over: once ids[2] and ids[3]
        // are retaken that way, key 1 holds nothing (and nothing is left to claim).
        let retaken = claim(s, &f, "q", "A", 2, 30, secs(38)).await;
        assert_eq!(
            retaken.iter().map(|c| (c.id, c.epoch)).collect::<Vec<_>>(),
            vec![(ids[2], 2), (ids[3], 2)]
        );
        assert!(
            claim_keyed(s, &f, "q", "A", 2, keyed(1, true), secs(39))
                .await
                .is_empty()
        );

        // A report that claims, its answer lost, sent again: its outcome is refused as
        // already written, and its claim answers what the first sending claimed.
        let r = insert(
            s,
            &f,
            (0..3).map(|i| new_occ(&f, "r", secs(40 + i), 3)).collect(),
        )
        .await;
        let held = claim(s, &f, "r", "A", 1, 30, secs(43)).await;
        assert_eq!(held[0].id, r[0]);
        let report = |at: Timestamp| OccurrenceFinishMany {
            tenant: f.tenant,
            worker_id: "A".into(),
            items: vec![FinishItem {
                lease: LeaseRef {
                    occurrence_id: r[0],
                    epoch: 1,
                },
                finish: ok("done"),
            }],
            now: Some(at),
        };
        let lease = Some(SignedDuration::from_secs(30));
        let next =
            |key: ClaimKey, at: Timestamp| claim_params(&f, "r", "A", 1, lease, Some(key), at);
        let (acks, got) = s
            .occurrence_finish_and_claim(report(secs(44)), next(keyed(3, false), secs(44)))
            .await
            .unwrap();
        assert!(acks[0].accepted());
        let got = got.unwrap();
        assert_eq!(terms(&got), vec![(r[1], 1, secs(74), secs(44), 1)]);
        let (acks, again) = s
            .occurrence_finish_and_claim(report(secs(45)), next(keyed(3, true), secs(45)))
            .await
            .unwrap();
        assert_eq!(
            acks[0].conflict,
            Some(Conflict::WrongState {
                state: OccurrenceState::Succeeded
            })
        );
        let again = again.unwrap();
        assert_eq!(terms(&again), terms(&got));
        assert!(again[0].replayed);
        let rest = claim(s, &f, "r", "C", 5, 30, secs(46)).await;
        assert_eq!(rest.iter().map(|c| c.id).collect::<Vec<_>>(), vec![r[2]]);

        // A claim sent again answers at most its `max`, first things first.
        let m = insert(
            s,
            &f,
            (0..2).map(|i| new_occ(&f, "m", secs(60 + i), 3)).collect(),
        )
        .await;
        let first = claim_keyed(s, &f, "m", "A", 2, keyed(6, false), secs(62)).await;
        assert_eq!(first.iter().map(|c| c.id).collect::<Vec<_>>(), m);
        let again = claim_keyed(s, &f, "m", "A", 1, keyed(6, true), secs(63)).await;
        assert_eq!(terms(&again), terms(&first[..1]));

        // An overlap-constrained occurrence, and a queue under a concurrency limit: their
        // claims take other ways, and record the key too.
        let mut constrained = new_occ(&f, "c", secs(50), 3);
        constrained.overlap = campanile_core::Overlap::SkipIfRunning;
        let c = insert(s, &f, vec![constrained]).await;
        let first = claim_keyed(s, &f, "c", "A", 1, keyed(4, false), secs(51)).await;
        assert_eq!(first.iter().map(|c| c.id).collect::<Vec<_>>(), c);
        let again = claim_keyed(s, &f, "c", "A", 1, keyed(4, true), secs(52)).await;
        assert_eq!(terms(&again), terms(&first));
        s.queue_limit_set(QueueLimitSet {
            tenant: f.tenant,
            queue: "l".into(),
            max_running: Some(5),
        })
        .await
        .unwrap();
        let l = insert(s, &f, vec![new_occ(&f, "l", secs(49), 3)]).await;
        let first = claim_keyed(s, &f, "l", "A", 1, keyed(5, false), secs(51)).await;
        assert_eq!(first.iter().map(|c| c.id).collect::<Vec<_>>(), l);
        let again = claim_keyed(s, &f, "l", "A", 1, keyed(5, true), secs(52)).await;
        assert_eq!(terms(&again), terms(&first));
    });
}
