//! Overlap policies, decided at claim time against the running occurrence.

use campanile_core::{OccurrenceState, Overlap};
use campanile_store::*;
use jiff::{SignedDuration, Timestamp};

use crate::both;
use crate::harness::*;

async fn claim(env: &Env, worker: &str, now: Timestamp) -> Vec<Claimed> {
    claim_jobs(env, worker, 600, now).await
}

async fn complete(env: &Env, worker: &str, c: &Claimed, now: Timestamp) {
    let acks = env
        .store
        .occurrence_finish_many(OccurrenceFinishMany {
            tenant: env.tenant,
            worker_id: worker.into(),
            items: vec![FinishItem {
                lease: LeaseRef {
                    occurrence_id: c.id,
                    epoch: c.epoch,
                },
                finish: Finish::Succeeded { result: None },
            }],
            now: Some(now),
        })
        .await
        .unwrap();
    assert!(acks[0].accepted());
}

async fn setup(env: &Env, overlap: Overlap) -> campanile_core::ScheduleId {
    let t0 = ts("2026-06-01T00:00:00Z");
    let mut sp = spec(Timing::Every {
        period: SignedDuration::from_mins(1),
        anchor: t0,
    });
    sp.overlap = overlap;
    let id = schedules(env)
        .create(env.tenant, sp, Some(t0))
        .await
        .unwrap()
        .record
        .id;
    planner(env, "n").tick(Some(t0)).await.unwrap();
    id
}

fn state_at(occ: &[Occurrence], t: Timestamp) -> OccurrenceState {
    occ.iter()
        .find(|o| o.scheduled_for == t)
        .map(|o| o.state)
        .unwrap()
}

async fn skip_if_running(env: Env) {
    let id = setup(&env, Overlap::SkipIfRunning).await;
    let t0 = ts("2026-06-01T00:00:00Z");
    let first = claim(&env, "A", t0).await;
    assert_eq!(first.len(), 1);
    // 00:01 comes due while 00:00 runs: recorded SKIPPED_OVERLAP, not handed out.
    assert!(claim(&env, "B", plus(t0, 60)).await.is_empty());
    complete(&env, "A", &first[0], plus(t0, 70)).await;
    let next = claim(&env, "B", plus(t0, 120)).await;
    assert_eq!(
        next.iter().map(|c| c.scheduled_for).collect::<Vec<_>>(),
        vec![plus(t0, 120)]
    );
    let occ = occurrences(&env, id).await;
    assert_eq!(
        state_at(&occ, plus(t0, 60)),
        OccurrenceState::SkippedOverlap
    );
    assert_eq!(state_at(&occ, t0), OccurrenceState::Succeeded);
    let skipped = env
        .store
        .occurrence_list(OccurrenceList {
            tenant: env.tenant,
            state: Some(OccurrenceState::SkippedOverlap),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(skipped.len(), 1);
}
both!(skip_if_running);

async fn queue_one(env: Env) {
    let id = setup(&env, Overlap::QueueOne).await;
    let t0 = ts("2026-06-01T00:00:00Z");
    let first = claim(&env, "A", t0).await;
    assert_eq!(first.len(), 1);
    // 00:01 waits behind the running 00:00; 00:02 and 00:03 find one already waiting.
    assert!(claim(&env, "B", plus(t0, 60)).await.is_empty());
    assert!(claim(&env, "B", plus(t0, 180)).await.is_empty());
    let occ = occurrences(&env, id).await;
    assert_eq!(state_at(&occ, plus(t0, 60)), OccurrenceState::Ready);
    assert_eq!(
        state_at(&occ, plus(t0, 120)),
        OccurrenceState::SkippedOverlap
    );
    assert_eq!(
        state_at(&occ, plus(t0, 180)),
        OccurrenceState::SkippedOverlap
    );
    complete(&env, "A", &first[0], plus(t0, 190)).await;
    let next = claim(&env, "B", plus(t0, 200)).await;
    assert_eq!(
        next.iter().map(|c| c.scheduled_for).collect::<Vec<_>>(),
        vec![plus(t0, 60)],
        "the one that waited runs next"
    );
}
both!(queue_one);

async fn allow_runs_side_by_side(env: Env) {
    setup(&env, Overlap::Allow).await;
    let t0 = ts("2026-06-01T00:00:00Z");
    assert_eq!(claim(&env, "A", t0).await.len(), 1);
    assert_eq!(claim(&env, "B", plus(t0, 60)).await.len(), 1);
}
both!(allow_runs_side_by_side);
