//! The size of what a claim answers ([`OccurrenceClaim::max_bytes`]).

use campanile_core::OccurrenceId;
use jiff::SignedDuration;
use tokio::runtime::Runtime;
use uuid::Uuid;

use super::*;

/// A schedule of `f`'s tenant whose payload is a JSON string `len` bytes long (quotes
/// included), with `overlap`; returns it and the payload's size as a claim counts it.
async fn sized_schedule(
    s: &dyn Store,
    f: &Fixture,
    queue: &str,
    len: usize,
    overlap: campanile_core::Overlap,
) -> (ScheduleId, u64) {
    let id = ScheduleId(Uuid::now_v7());
    let payload = format!("\"{}\"", "x".repeat(len - 2));
    s.schedule_create(ScheduleCreate {
        tenant: f.tenant,
        id,
        spec: ScheduleSpec {
            payload: Some(payload),
            overlap,
            ..spec(queue)
        },
        shard: 0,
        next_run_at: None,
        fires_per_hour: 0,
        idempotency: None,
        now: Some(at(0)),
    })
    .await
    .expect("schedule");
    (id, payload_answer_bytes(len))
}

/// An occurrence of `schedule` due at `due` seconds.
fn occ_of(f: &Fixture, schedule: ScheduleId, queue: &str, due: i64) -> NewOccurrence {
    NewOccurrence {
        schedule_id: schedule,
        ..new_occ(f, queue, secs(due), 3)
    }
}

fn ids(c: &[Claimed]) -> Vec<OccurrenceId> {
    c.iter().map(|c| c.id).collect()
}

async fn claim_within(
    s: &dyn Store,
    f: &Fixture,
    queue: &str,
    worker: &str,
    max: u32,
    max_bytes: u64,
    now: Timestamp,
) -> Vec<Claimed> {
    let lease = Some(SignedDuration::from_secs(30));
    s.occurrence_claim(OccurrenceClaim {
        max_bytes: Some(max_bytes),
        ..claim_params(f, queue, worker, max, lease, None, now)
    })
    .await
    .expect("claim")
}

/// A claim answers, in claim order, the occurrences whose payloads (each with
/// [`CLAIM_RECORD_BYTES`]) fit its size bound, stopping at the first that does not — always
/// at least one, whatever its size — on the plain path, a limited queue's and the
/// overlap-constrained one; what it leaves is claimed by the next claim, and concurrent
/// claims with different bounds each keep to their own.
pub fn a_claim_answer_keeps_to_its_size_bound(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let allow = campanile_core::Overlap::Allow;
        let (big, big_size) = sized_schedule(s, &f, "q", 3000, allow).await;
        let (small, small_size) = sized_schedule(s, &f, "q", 10, allow).await;
        // Claim order: big, big, small, big, small, big, big.
        let order = [big, big, small, big, small, big, big];
        let all = insert(
            s,
            &f,
            (0..)
                .zip(order)
                .map(|(i, sid)| occ_of(&f, sid, "q", i))
                .collect(),
        )
        .await;
        let bound = 2 * big_size + small_size;
        let got = claim_within(s, &f, "q", "A", 100, bound, secs(100)).await;
        assert_eq!(ids(&got), all[..3], "big, big, small fit exactly");
        let got = claim_within(s, &f, "q", "A", 100, bound - 1, secs(100)).await;
        assert_eq!(
            ids(&got),
            all[3..5],
            "big then small fit; the next big would pass the bound"
        );
        let total: u64 = got.iter().map(Claimed::answer_bytes).sum();
        assert_eq!(total, big_size + small_size);
        assert!(got.iter().all(|c| c.payload.is_some()));
        let got = claim_within(s, &f, "q", "A", 100, 1, secs(100)).await;
        assert_eq!(
            ids(&got),
            all[5..6],
            "the first always comes, whatever its size"
        );
        let got = claim_within(s, &f, "q", "A", 100, u64::MAX / 4, secs(100)).await;
        assert_eq!(
            ids(&got),
            all[6..],
            "what was left is claimed by the next claim"
        );

        // A prefix: a small occurrence behind one that does not fit waits for the next claim.
        let more = insert(
            s,
            &f,
            [small, big, small]
                .into_iter()
                .zip(200..)
                .map(|(sid, i)| occ_of(&f, sid, "p", i))
                .collect(),
        )
        .await;
        let got = claim_within(s, &f, "p", "A", 100, small_size + 10, secs(300)).await;
        assert_eq!(ids(&got), more[..1]);
        let got = claim_within(s, &f, "p", "A", 100, big_size + small_size, secs(300)).await;
        assert_eq!(ids(&got), more[1..]);

        // A queue with a concurrency limit claims on its own path: the same bound.
        s.queue_limit_set(QueueLimitSet {
            tenant: f.tenant,
            queue: "lim".into(),
            max_running: Some(50),
        })
        .await
        .unwrap();
        let (lim_big, _) = sized_schedule(s, &f, "lim", 3000, allow).await;
        let lim = insert(
            s,
            &f,
            (400..404).map(|i| occ_of(&f, lim_big, "lim", i)).collect(),
        )
        .await;
        let got = claim_within(s, &f, "lim", "A", 100, 2 * big_size, secs(500)).await;
        assert_eq!(ids(&got), lim[..2]);

        // Overlap-constrained work (one occurrence each of several schedules): the same bound,
        // counting what the answer already holds.
        let mut constrained = Vec::new();
        for i in 0..4 {
            let (sid, _) =
                sized_schedule(s, &f, "c", 3000, campanile_core::Overlap::SkipIfRunning).await;
            let mut o = occ_of(&f, sid, "c", 600 + i);
            o.overlap = campanile_core::Overlap::SkipIfRunning;
            constrained.extend(insert(s, &f, vec![o]).await);
        }
        let got = claim_within(s, &f, "c", "A", 100, 3 * big_size - 1, secs(700)).await;
        assert_eq!(ids(&got), constrained[..2]);
        let got = claim_within(s, &f, "c", "A", 100, 1, secs(700)).await;
        assert_eq!(ids(&got), constrained[2..3]);

        // Concurrent claims with different bounds (PostgreSQL may serve them in one
        // statement): each answer keeps to its own bound; none is claimed twice.
        let race = insert(s, &f, (800..840).map(|i| occ_of(&f, big, "r", i)).collect()).await;
        let mut claimed: Vec<OccurrenceId> = Vec::new();
        for _ in 0..20 {
            let (a, b, c) = tokio::join!(
                claim_within(s, &f, "r", "A", 10, big_size, secs(900)),
                claim_within(s, &f, "r", "B", 10, 3 * big_size, secs(900)),
                claim_within(s, &f, "r", "C", 10, 5 * big_size + 1, secs(900)),
            );
            assert!(
                a.len() <= 1 && b.len() <= 3 && c.len() <= 5,
                "{a:?} {b:?} {c:?}"
            );
            claimed.extend(ids(&a).into_iter().chain(ids(&b)).chain(ids(&c)));
            if a.is_empty() && b.is_empty() && c.is_empty() {
                break;
            }
        }
        claimed.sort_unstable();
        let mut expected = race.clone();
        expected.sort_unstable();
        assert_eq!(claimed, expected, "each claimed once, none left");
    });
}

/// A run triggered with its own payload is handed that payload instead of its version's, and
/// its own size counts against a claim's bound; its key answers again only with the same
/// payload.
pub fn a_triggered_run_carries_its_own_payload(rt: &Runtime, h: Harness) {
    rt.block_on(async {
        let s = h.store.as_ref();
        let f = fixture(s, "acme", "q").await;
        let trigger = |key: Option<&str>, payload: Option<&str>, now| ScheduleTrigger {
            tenant: f.tenant,
            id: f.schedule,
            key: key.map(str::to_string),
            payload: payload.map(str::to_string),
            now: Some(now),
        };
        let big = format!("{{\"rerun\":\"{}\"}}", "y".repeat(3000));
        let first = s
            .schedule_trigger(trigger(Some("k1"), Some(&big), secs(100)))
            .await
            .expect("trigger");
        let second = s
            .schedule_trigger(trigger(None, Some(&big), secs(101)))
            .await
            .expect("trigger");
        let plain = s
            .schedule_trigger(trigger(None, None, secs(102)))
            .await
            .expect("trigger");
        // Sent again with its key and the same payload: the same run.
        let again = s
            .schedule_trigger(trigger(Some("k1"), Some(&big), secs(103)))
            .await
            .expect("trigger again");
        assert_eq!(
            (again.occurrence_id, again.created),
            (first.occurrence_id, false)
        );
        // The same key with another payload, or with none, is another request: refused.
        for other in [Some("{}"), None] {
            let reused = s
                .schedule_trigger(trigger(Some("k1"), other, secs(104)))
                .await;
            assert!(matches!(reused, Err(StoreError::Invalid(_))), "{reused:?}");
        }
        // Read back with the run.
        let read = |id| {
            s.occurrence_get(OccurrenceGet {
                tenant: f.tenant,
                key: OccurrenceKey::Id(id),
                now: Some(secs(105)),
            })
        };
        let own = read(first.occurrence_id)
            .await
            .expect("get")
            .expect("found");
        assert_eq!(own.payload.as_deref(), Some(big.as_str()));
        let none = read(plain.occurrence_id)
            .await
            .expect("get")
            .expect("found");
        assert_eq!(
            none.payload, None,
            "a plain trigger runs with its version's"
        );
        // Each run's own payload counts against the bound: one of the two large ones fits.
        let size = payload_answer_bytes(big.len());
        let got = claim_within(s, &f, "q", "A", 10, size + 100, secs(110)).await;
        assert_eq!(ids(&got), vec![first.occurrence_id]);
        assert_eq!(got[0].payload.as_deref(), Some(big.as_str()));
        let got = claim_within(s, &f, "q", "A", 10, u64::MAX / 4, secs(110)).await;
        assert_eq!(ids(&got), vec![second.occurrence_id, plain.occurrence_id]);
        let payloads: Vec<Option<&str>> = got.iter().map(|c| c.payload.as_deref()).collect();
        assert_eq!(
            payloads,
            vec![Some(big.as_str()), spec("q").payload.as_deref()],
            "the plain trigger runs with its version's payload"
        );
        // Taken over after its lease ends, a run still carries its own payload.
        let retaken = claim_within(s, &f, "q", "B", 10, u64::MAX / 4, secs(200)).await;
        let own: Vec<(OccurrenceId, Option<&str>)> = retaken
            .iter()
            .map(|c| (c.id, c.payload.as_deref()))
            .collect();
        assert!(
            own.contains(&(first.occurrence_id, Some(big.as_str()))),
            "{own:?}"
        );
    });
}
