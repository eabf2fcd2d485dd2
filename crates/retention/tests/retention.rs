//! Retention end to end on both backends: what leaves the hot store is in the archive, line
//! for line as it was stored; a node dying between writing the archive and removing the rows
//! leaves the batch to be finished, not archived twice; and a process SIGKILLed over and over
//! in the middle of retention loses and doubles nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use campanile_core::{ErrorClass, OccurrenceId, OccurrenceState, ScheduleId, occurrence_id};
use campanile_retention::{Archive, ArchiveLine, Retention, RetentionConfig, Step, read_file};
use campanile_store::*;
use jiff::{SignedDuration, Timestamp};

const DAY: i64 = 86_400;

/// A month ago, on a whole minute (where the schedule's calendar fires).
fn month_ago() -> Timestamp {
    let t = Timestamp::now().as_second() - 30 * DAY;
    Timestamp::from_second(t - t.rem_euclid(60)).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn spec() -> ScheduleSpec {
    ScheduleSpec {
        timing: Timing::Every {
            period: SignedDuration::from_secs(60),
            anchor: Timestamp::UNIX_EPOCH,
        },
        queue: "q".into(),
        payload: None,
        priority: 0,
        lease: SignedDuration::from_secs(30),
        max_attempts: 3,
        backoff_initial: SignedDuration::from_secs(1),
        backoff_max: SignedDuration::from_secs(1),
        misfire: campanile_core::Misfire::default(),
        overlap: campanile_core::Overlap::Allow,
        flex_window: SignedDuration::ZERO,
    }
}

fn new_occ(schedule: ScheduleId, at: Timestamp, state: OccurrenceState) -> NewOccurrence {
    NewOccurrence {
        schedule_id: schedule,
        version: 1,
        scheduled_for: at,
        available_at: at,
        queue: "q".into(),
        priority: 0,
        max_attempts: 3,
        backoff_initial: SignedDuration::from_secs(1),
        backoff_max: SignedDuration::from_secs(1),
        state,
        overlap: campanile_core::Overlap::Allow,
        lease: SignedDuration::from_secs(30),
    }
}

async fn tenant_and_schedule(s: &dyn Store, name: &str, t0: Timestamp) -> (TenantId, ScheduleId) {
    let tenant = s
        .tenant_create(TenantCreate {
            name: name.into(),
            now: Some(t0),
        })
        .await
        .unwrap()
        .id;
    let schedule = ScheduleId(uuid::Uuid::now_v7());
    s.schedule_create(ScheduleCreate {
        tenant,
        id: schedule,
        spec: spec(),
        shard: 0,
        next_run_at: None,
        fires_per_hour: 0,
        idempotency: None,
        now: Some(t0),
    })
    .await
    .unwrap();
    (tenant, schedule)
}

/// Every line of every archive file under `dir`, by occurrence id; panics on a `.tmp` file
/// left behind or an id archived twice.
fn archived(dir: &Path) -> BTreeMap<String, ArchiveLine> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            assert!(
                name.ends_with(".jsonl.gz"),
                "a stray file in the archive: {name}"
            );
            for line in read_file(&path).unwrap() {
                let id = line.id.clone();
                assert!(
                    out.insert(id.clone(), line).is_none(),
                    "{id} archived twice"
                );
            }
        }
    }
    out
}

fn config(node: &str, dir: &Path) -> RetentionConfig {
    let mut cfg = RetentionConfig::new(node);
    cfg.default_retention = Some(SignedDuration::from_secs(14 * DAY));
    cfg.archive = Some(Archive::new(dir));
    cfg.batch = 7;
    cfg.lease = SignedDuration::from_secs(60);
    cfg
}

/// Occurrences of one schedule a month old that ran to every end (succeeded with a result,
/// failed then succeeded, dead after failures, canceled), and a latest one still READY.
async fn history(s: &dyn Store, tenant: TenantId, schedule: ScheduleId, t0: Timestamp, n: i64) {
    // A minute apart: an occurrence's retries (2 s apart) never reach the next one.
    let at = |i: i64| t0 + SignedDuration::from_secs(60 * i);
    let items: Vec<NewOccurrence> = (0..n)
        .map(|i| new_occ(schedule, at(i), OccurrenceState::Ready))
        .chain(std::iter::once(new_occ(
            schedule,
            t0 + SignedDuration::from_secs(10 * DAY),
            OccurrenceState::Ready,
        )))
        .collect();
    s.occurrence_insert_many(OccurrenceInsertMany {
        tenant,
        items,
        now: Some(t0),
    })
    .await
    .unwrap();
    for i in 0..n {
        let id = occurrence_id(schedule, 1, at(i));
        let now = at(i) + SignedDuration::from_millis(500);
        if i % 4 == 3 {
            let ack = s
                .occurrence_cancel(OccurrenceCancel {
                    tenant,
                    occurrence_id: id,
                    now: Some(now),
                })
                .await
                .unwrap();
            assert_eq!(ack.state, Some(OccurrenceState::Canceled));
            continue;
        }
        let failures = i % 4; // 0: succeeds at once; 1: fails once; 2: dies after 3 failures
        let mut tries = 0;
        loop {
            let claimed = s
                .occurrence_claim(OccurrenceClaim {
                    tenant,
                    queue: "q".into(),
                    worker_id: "w".into(),
                    max: 1,
                    lease: Some(SignedDuration::from_secs(30)),
                    key: None,
                    max_bytes: None,
                    now: Some(now + SignedDuration::from_secs(tries * 2)),
                })
                .await
                .unwrap();
            assert_eq!(claimed.len(), 1);
            assert_eq!(claimed[0].id, id);
            let finish = if failures == 2 || tries < failures {
                Finish::Failed {
                    class: ErrorClass::Transient,
                    message: format!("try {tries} failed"),
                }
            } else {
                // Pretty-printed, as a worker may send it: still one archive line.
                Finish::Succeeded {
                    result: Some(format!("{{\n  \"n\": {i}\n}}")),
                }
            };
            let acks = s
                .occurrence_finish_many(OccurrenceFinishMany {
                    tenant,
                    worker_id: "w".into(),
                    items: vec![FinishItem {
                        lease: LeaseRef {
                            occurrence_id: id,
                            epoch: claimed[0].epoch,
                        },
                        finish,
                    }],
                    now: Some(now + SignedDuration::from_secs(tries * 2 + 1)),
                })
                .await
                .unwrap();
            assert!(acks[0].accepted(), "{acks:?}");
            tries += 1;
            match acks[0].state {
                Some(OccurrenceState::RetryWait) => continue,
                _ => break,
            }
        }
    }
}

async fn details(s: &dyn Store, tenant: TenantId, schedule: ScheduleId) -> Vec<OccurrenceDetail> {
    let list = s
        .occurrence_list(OccurrenceList {
            tenant,
            schedule_id: Some(schedule),
            limit: 10_000,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut out = Vec::new();
    for o in list {
        out.push(
            s.occurrence_get(OccurrenceGet {
                tenant,
                key: OccurrenceKey::Id(o.id),
                now: None,
            })
            .await
            .unwrap()
            .unwrap(),
        );
    }
    out
}

/// What each archived line must be: the occurrence as stored before retention.
/// What the rollups of `schedule` count, by state.
/// The schedule's rolled-up counts by state, summed over its days (a history that crosses
/// midnight UTC has rollups on two days).
async fn rollup_counts(
    s: &dyn Store,
    tenant: TenantId,
    schedule: ScheduleId,
) -> BTreeMap<&'static str, u64> {
    let mut counts = BTreeMap::new();
    for r in s
        .rollup_list(RollupList {
            tenant,
            schedule_id: schedule,
        })
        .await
        .unwrap()
    {
        *counts.entry(r.state.as_str()).or_default() += r.count;
    }
    counts
}

fn expected_line(d: &OccurrenceDetail) -> serde_json::Value {
    let r = Retired {
        tenant: TenantId(0),
        tenant_name: "acme".into(),
        detail: d.clone(),
        payload: None,
    };
    serde_json::to_value(ArchiveLine::of(&r)).unwrap()
}

async fn archive_reads_back_what_was_removed(s: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let t0 = month_ago();
    let (tenant, schedule) = tenant_and_schedule(s.as_ref(), "acme", t0).await;
    history(s.as_ref(), tenant, schedule, t0, 20).await;
    let before = details(s.as_ref(), tenant, schedule).await;
    assert_eq!(before.len(), 21);
    let retention = Retention::new(Arc::clone(&s), config("n1", dir.path()));
    let mut removed = 0;
    loop {
        let pass = retention.pass(None).await.unwrap();
        if pass.batch.is_none() {
            if pass.more {
                continue;
            }
            break;
        }
        assert!(!pass.closed.abandoned);
        assert_eq!(pass.closed.removed as usize, pass.chosen);
        removed += pass.closed.removed;
    }
    assert_eq!(removed, 20, "all but the latest");
    let lines = archived(dir.path());
    assert_eq!(lines.len(), 20);
    for d in &before[..20] {
        let line = &lines[&d.occurrence.id.0.to_string()];
        assert_eq!(serde_json::to_value(line).unwrap(), expected_line(d));
        assert_eq!(line.attempts.len(), d.attempts.len());
    }
    // The dead letters kept their three failed attempts; the retried successes both tries.
    let dead = before
        .iter()
        .filter(|d| d.occurrence.state == OccurrenceState::Dead)
        .count();
    assert_eq!(dead, 5);
    let files: Vec<PathBuf> = walk(dir.path());
    let day = jiff::tz::Offset::UTC.to_datetime(t0).date().to_string();
    assert!(
        files
            .iter()
            .all(|f| f.to_string_lossy().contains(&format!("-acme/{day}/batch-"))),
        "{files:?}"
    );
    // The rollups count what left, by state.
    let counts = rollup_counts(s.as_ref(), tenant, schedule).await;
    assert_eq!(
        counts,
        BTreeMap::from([("SUCCEEDED", 10), ("DEAD", 5), ("CANCELED", 5)])
    );
    // Reconcile over the archived range: every instant accounted for, nothing missing.
    let range = campanile_planner::reconcile::Range {
        from: t0,
        to: t0 + SignedDuration::from_secs(20 * 60),
        now: Timestamp::now(),
        max_instants: 1000,
        stall_after: SignedDuration::from_secs(600),
    };
    let r = campanile_planner::reconcile::reconcile(s.as_ref(), tenant, schedule, &range)
        .await
        .unwrap();
    let archived_class = r
        .counts
        .get(&campanile_planner::reconcile::Class::Archived)
        .copied();
    assert_eq!(archived_class, Some(20), "{:?}", r.counts);
    assert!(!r.has_problems(), "{r:?}");
}

/// A run triggered with its own payload is archived with it.
async fn a_runs_own_payload_is_archived_with_it(s: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let t0 = month_ago();
    let (tenant, schedule) = tenant_and_schedule(s.as_ref(), "acme", t0).await;
    // A later occurrence keeps the triggered run from being the schedule's latest.
    history(s.as_ref(), tenant, schedule, t0, 0).await;
    let own = r#"{"redo": "2026-11-03", "n": 12345678901234567890}"#;
    let t = s
        .schedule_trigger(ScheduleTrigger {
            tenant,
            id: schedule,
            key: None,
            payload: Some(own.into()),
            now: Some(t0 + SignedDuration::from_secs(30)),
        })
        .await
        .unwrap();
    s.occurrence_cancel(OccurrenceCancel {
        tenant,
        occurrence_id: t.occurrence_id,
        now: Some(t0 + SignedDuration::from_secs(31)),
    })
    .await
    .unwrap();
    let retention = Retention::new(Arc::clone(&s), config("n1", dir.path()));
    let mut removed = 0;
    loop {
        let pass = retention.pass(None).await.unwrap();
        removed += pass.closed.removed;
        if pass.batch.is_none() && !pass.more {
            break;
        }
    }
    assert_eq!(removed, 1);
    let lines = archived(dir.path());
    let line = &lines[&t.occurrence_id.0.to_string()];
    assert_eq!(line.origin, "manual");
    assert_eq!(line.payload.as_ref().map(|p| p.get()), Some(own));
}

/// A one-off run of a new schedule of `tenant` at `at`, canceled: final, and its schedule's
/// only (so latest) occurrence.
async fn lone_run(s: &dyn Store, tenant: TenantId, at: Timestamp) -> OccurrenceId {
    let schedule = ScheduleId(uuid::Uuid::now_v7());
    s.schedule_create(ScheduleCreate {
        tenant,
        id: schedule,
        spec: spec(),
        shard: 0,
        next_run_at: None,
        fires_per_hour: 0,
        idempotency: None,
        now: Some(at),
    })
    .await
    .unwrap();
    s.occurrence_insert_many(OccurrenceInsertMany {
        tenant,
        items: vec![new_occ(schedule, at, OccurrenceState::Ready)],
        now: Some(at),
    })
    .await
    .unwrap();
    let id = occurrence_id(schedule, 1, at);
    s.occurrence_cancel(OccurrenceCancel {
        tenant,
        occurrence_id: id,
        now: Some(at),
    })
    .await
    .unwrap();
    id
}

/// Where occurrences are kept by day (PostgreSQL), a day whose whole span is past the default
/// retention leaves at once: sealed (a redrive of one of its dead letters is refused), its
/// rows archived line for line, counted in the rollups, and its partition dropped; the rows
/// that must stay (a schedule's latest run, a tenant's that keeps history forever) stay. A
/// node that dies after writing the archive leaves the day to another, which writes it again
/// without a line twice.
async fn a_whole_day_leaves_at_once(s: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let midnight = (Timestamp::now().as_second() / DAY - 30) * DAY;
    let t0 = Timestamp::from_second(midnight + 3600).unwrap();
    let created = s
        .occurrence_days_prepare(OccurrenceDaysPrepare {
            ahead: 0,
            now: Some(t0),
        })
        .await
        .unwrap();
    assert_eq!(created, 2, "the day before and the day itself");
    let (tenant, schedule) = tenant_and_schedule(s.as_ref(), "acme", t0).await;
    history(s.as_ref(), tenant, schedule, t0, 20).await;
    let before = details(s.as_ref(), tenant, schedule).await;
    assert_eq!(before.len(), 21);
    let lone = lone_run(s.as_ref(), tenant, t0 + SignedDuration::from_secs(1800)).await;
    let (keeper, _) = tenant_and_schedule(s.as_ref(), "keeper", t0).await;
    s.tenant_retention_set(TenantRetentionSet {
        tenant: keeper,
        retention: campanile_store::Retention::Forever,
    })
    .await
    .unwrap();
    let kept = lone_run(s.as_ref(), keeper, t0 + SignedDuration::from_secs(2400)).await;
    // Another tenant's history, its ids between acme's: the archive's chunks mix tenants.
    let (beta, beta_schedule) = tenant_and_schedule(s.as_ref(), "beta", t0).await;
    history(
        s.as_ref(),
        beta,
        beta_schedule,
        t0 + SignedDuration::from_secs(30),
        20,
    )
    .await;
    let beta_before = details(s.as_ref(), beta, beta_schedule).await;
    // A run triggered with a key, canceled: it leaves with the day, and so does its key.
    let keyed = |now| ScheduleTrigger {
        tenant,
        id: schedule,
        key: Some("rerun-1".into()),
        payload: None,
        now: Some(now),
    };
    let manual = s
        .schedule_trigger(keyed(t0 + SignedDuration::from_secs(45)))
        .await
        .unwrap();
    s.occurrence_cancel(OccurrenceCancel {
        tenant,
        occurrence_id: manual.occurrence_id,
        now: Some(t0 + SignedDuration::from_secs(46)),
    })
    .await
    .unwrap();

    let day_name = |t: Timestamp| {
        let date = jiff::tz::Offset::UTC.to_datetime(t).date();
        format!(
            "occurrences_{:04}{:02}{:02}",
            date.year(),
            date.month(),
            date.day()
        )
    };
    let first = Retention::new(Arc::clone(&s), config("n1", dir.path()));
    // The day before, empty, goes first.
    let empty = first.pass(None).await.unwrap();
    assert_eq!(
        empty.day,
        Some(day_name(t0 - SignedDuration::from_secs(DAY)))
    );
    assert_eq!((empty.day_closed.removed, empty.day_closed.kept), (0, 0));
    let opened = first.pass_until(None, Step::Open).await.unwrap();
    let name = day_name(t0);
    assert_eq!(opened.day.as_deref(), Some(name.as_str()));
    assert_eq!(opened.chosen, 41, "all but the two that stay");
    let dead = before
        .iter()
        .find(|d| d.occurrence.state == OccurrenceState::Dead)
        .unwrap();
    let refused = s
        .occurrence_redrive(OccurrenceRedrive {
            tenant,
            occurrence_id: dead.occurrence.id,
            now: None,
        })
        .await;
    assert!(
        matches!(refused, Err(StoreError::WrongState(_))),
        "{refused:?}"
    );
    let written = first.pass_until(None, Step::Archive).await.unwrap();
    assert!(!written.files.is_empty());
    // The node stops there; another takes the day over when its lease has passed.
    let second = Retention::new(Arc::clone(&s), config("n2", dir.path()));
    let early = second.pass(None).await.unwrap();
    assert_eq!(early.day, None, "the first node's lease holds");
    let later = Timestamp::now() + SignedDuration::from_secs(120);
    let pass = second.pass(Some(later)).await.unwrap();
    assert_eq!(pass.day.as_deref(), Some(name.as_str()));
    assert!(pass.resumed);
    assert_eq!(
        (
            pass.day_closed.removed,
            pass.day_closed.kept,
            pass.day_closed.redo
        ),
        (41, 2, false)
    );
    assert_eq!(
        pass.day_closed.attempts_removed,
        2 * (5 * 3 + 5),
        "the failed tries"
    );
    // Every row once (`archived` refuses an id archived twice), as it was stored.
    let lines = archived(dir.path());
    assert_eq!(lines.len(), 41);
    assert_eq!(lines[&manual.occurrence_id.0.to_string()].origin, "manual");
    let of_day =
        |d: &&OccurrenceDetail| d.occurrence.scheduled_for < t0 + SignedDuration::from_secs(DAY);
    for (who, d) in before
        .iter()
        .filter(of_day)
        .map(|d| ("acme", d))
        .chain(beta_before.iter().filter(of_day).map(|d| ("beta", d)))
    {
        let line = &lines[&d.occurrence.id.0.to_string()];
        let mut expected = expected_line(d);
        expected["tenant"] = who.into();
        assert_eq!(serde_json::to_value(line).unwrap(), expected);
    }
    let counts = rollup_counts(s.as_ref(), tenant, schedule).await;
    assert_eq!(
        counts,
        BTreeMap::from([("SUCCEEDED", 10), ("DEAD", 5), ("CANCELED", 6)])
    );
    // Its run gone, the key makes a new one.
    let again = s.schedule_trigger(keyed(later)).await.unwrap();
    assert!(again.created, "{again:?}");
    assert_ne!(again.occurrence_id, manual.occurrence_id);
    // What stays is where it was, readable as before; the latest of the history too.
    for (t, id) in [(tenant, lone), (keeper, kept)] {
        let got = s
            .occurrence_get(OccurrenceGet {
                tenant: t,
                key: OccurrenceKey::Id(id),
                now: None,
            })
            .await
            .unwrap();
        assert_eq!(
            got.map(|d| d.occurrence.state),
            Some(OccurrenceState::Canceled)
        );
    }
    assert_eq!(
        details(s.as_ref(), tenant, schedule).await.len(),
        2,
        "its latest, and the new run"
    );
    // Reconcile over the day: every instant accounted for.
    let range = campanile_planner::reconcile::Range {
        from: t0,
        to: t0 + SignedDuration::from_secs(20 * 60),
        now: Timestamp::now(),
        max_instants: 1000,
        stall_after: SignedDuration::from_secs(600),
    };
    let r = campanile_planner::reconcile::reconcile(s.as_ref(), tenant, schedule, &range)
        .await
        .unwrap();
    assert_eq!(
        r.counts
            .get(&campanile_planner::reconcile::Class::Archived)
            .copied(),
        Some(20),
        "{:?}",
        r.counts
    );
    assert!(!r.has_problems(), "{r:?}");
    // The day is gone: nothing more to take, and a dead letter of it is no more.
    let after = second.pass(Some(later)).await.unwrap();
    assert_eq!(after.day, None);
    assert_eq!(after.closed.removed, 0);
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

async fn a_node_dying_mid_batch_leaves_it_to_be_finished(s: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let t0 = month_ago();
    let (tenant, schedule) = tenant_and_schedule(s.as_ref(), "acme", t0).await;
    history(s.as_ref(), tenant, schedule, t0, 12).await;
    let now = Timestamp::now();
    // Node A writes the archive of its batch and dies before removing anything.
    let a = Retention::new(Arc::clone(&s), config("A", dir.path()));
    let cut = a.pass_until(Some(now), Step::Archive).await.unwrap();
    assert_eq!((cut.chosen, cut.closed.removed), (7, 0));
    let first_files = walk(dir.path());
    assert!(!first_files.is_empty());
    // Node B waits out A's lease, finishes that batch (writing the same files again), then
    // goes on with the rest.
    let b = Retention::new(Arc::clone(&s), config("B", dir.path()));
    assert_eq!(
        b.pass(Some(now + SignedDuration::from_secs(30)))
            .await
            .unwrap()
            .batch,
        None,
        "A's lease still holds its batch"
    );
    let later = now + SignedDuration::from_secs(61);
    let finished = b.pass(Some(later)).await.unwrap();
    assert!(finished.resumed);
    assert_eq!((finished.batch, finished.closed.removed), (cut.batch, 7));
    assert_eq!(finished.files, cut.files, "the same files, written again");
    let rest = b.pass(Some(later)).await.unwrap();
    assert_eq!(rest.closed.removed, 5, "{rest:?}");
    assert_eq!(b.pass(Some(later)).await.unwrap().batch, None);
    // A comes back: its batch is gone, nothing is done twice.
    assert!(a.pass(Some(later)).await.unwrap().batch.is_none());
    assert_eq!(archived(dir.path()).len(), 12);
    let left = details(s.as_ref(), tenant, schedule).await;
    assert_eq!(left.len(), 1);
}

async fn a_batch_given_up_leaves_no_file_behind(s: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let t0 = month_ago();
    let (tenant, schedule) = tenant_and_schedule(s.as_ref(), "acme", t0).await;
    history(s.as_ref(), tenant, schedule, t0, 8).await;
    let now = Timestamp::now();
    let a = Retention::new(Arc::clone(&s), config("A", dir.path()));
    let cut = a.pass_until(Some(now), Step::Archive).await.unwrap();
    assert_eq!(cut.chosen, 7);
    assert!(!walk(dir.path()).is_empty());
    // A dead letter of the batch is redriven before the batch is closed.
    let dead = occurrence_id(schedule, 1, t0 + SignedDuration::from_secs(120));
    let ack = s
        .occurrence_redrive(OccurrenceRedrive {
            tenant,
            occurrence_id: dead,
            now: Some(now),
        })
        .await
        .unwrap();
    assert_eq!(ack.state, Some(OccurrenceState::Ready));
    let given_up = a.pass(Some(now)).await.unwrap();
    assert_eq!(
        (given_up.batch, given_up.closed.abandoned),
        (cut.batch, true)
    );
    assert!(
        walk(dir.path()).iter().all(|f| f.is_dir()),
        "{:?}",
        walk(dir.path())
    );
    // The rest goes in later batches; the redriven one stays.
    loop {
        let pass = a.pass(Some(now)).await.unwrap();
        if pass.batch.is_none() && !pass.more {
            break;
        }
    }
    let lines = archived(dir.path());
    assert_eq!(lines.len(), 7);
    assert!(!lines.contains_key(&dead.0.to_string()));
    let left = details(s.as_ref(), tenant, schedule).await;
    assert_eq!(left.len(), 2, "the redriven one and the latest");
}

/// The crash test's child: retention passes back to back until it is killed.
fn retention_child_run(s: Arc<dyn Store>, dir: &Path) {
    let rt = runtime();
    rt.block_on(async {
        let mut cfg = config("child", dir);
        cfg.lease = SignedDuration::from_millis(1);
        let r = Retention::new(s, cfg);
        loop {
            let pass = r.pass(None).await.unwrap();
            if pass.batch.is_none() && !pass.more {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
}

/// Kills a child process running retention over and over, at a different point each round,
/// then lets a last node finish: every removed occurrence is archived once and counted once.
/// `by_day`: the history is in a day partition of its own (PostgreSQL), which leaves whole.
fn sigkill_mid_retention(s: Arc<dyn Store>, child: &str, env: &[(&str, String)], by_day: bool) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let t0 = if by_day {
        let midnight = (Timestamp::now().as_second() / DAY - 30) * DAY;
        let t0 = Timestamp::from_second(midnight + 3600).unwrap();
        rt.block_on(s.occurrence_days_prepare(OccurrenceDaysPrepare {
            ahead: 0,
            now: Some(t0),
        }))
        .unwrap();
        t0
    } else {
        month_ago()
    };
    let n = 240;
    let (tenant, schedule) = rt.block_on(async {
        let (tenant, schedule) = tenant_and_schedule(s.as_ref(), "acme", t0).await;
        history(s.as_ref(), tenant, schedule, t0, n).await;
        (tenant, schedule)
    });
    let before: BTreeMap<String, serde_json::Value> = rt
        .block_on(details(s.as_ref(), tenant, schedule))
        .iter()
        .map(|d| (d.occurrence.id.0.to_string(), expected_line(d)))
        .collect();
    let counted = |s: &dyn Store| {
        rt.block_on(rollup_counts(s, tenant, schedule))
            .values()
            .sum::<u64>()
    };
    let mut kills = 0;
    for round in 0..6u64 {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", child, "--nocapture", "--test-threads=1"])
            .env("CAMPANILE_RETENTION_ARCHIVE", dir.path())
            .stdout(std::process::Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut proc = cmd.spawn().unwrap();
        if by_day {
            // The day's rows leave all at once: killed at a later point of its steps each
            // round (the child's start takes some of it).
            std::thread::sleep(Duration::from_millis(20 + round * 25));
        } else {
            // Kill it at a different point of its work each round: after some more rows left.
            let target = counted(s.as_ref()) + 7 + round * 5;
            let deadline = Instant::now() + Duration::from_secs(60);
            while counted(s.as_ref()) < target.min(n as u64 - 1) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1 + round * 3));
            }
        }
        proc.kill().unwrap();
        proc.wait().unwrap();
        kills += 1;
        eprintln!("killed in round {round}: {} counted", counted(s.as_ref()));
    }
    assert!(kills >= 1);
    // What the kills left open is finished here, and the rest done.
    let mut cfg = config("survivor", dir.path());
    cfg.lease = SignedDuration::from_millis(1);
    let r = Retention::new(Arc::clone(&s), cfg);
    rt.block_on(async {
        std::thread::sleep(Duration::from_millis(5));
        loop {
            let pass = r.pass(None).await.unwrap();
            if pass.batch.is_none() && !pass.more {
                break;
            }
        }
    });
    assert_eq!(
        counted(s.as_ref()),
        n as u64,
        "every removed occurrence counted once"
    );
    let lines = archived(dir.path());
    assert_eq!(
        lines.len(),
        n as usize,
        "every removed occurrence archived once"
    );
    for (id, line) in &lines {
        assert_eq!(&serde_json::to_value(line).unwrap(), &before[id], "{id}");
    }
    let left = rt.block_on(details(s.as_ref(), tenant, schedule));
    assert_eq!(left.len(), 1, "only the schedule's latest stays");
}

mod sqlite {
    use super::*;
    use campanile_store_sqlite::SqliteStore;

    fn store() -> (Arc<dyn Store>, tempfile::TempDir) {
        let (s, dir) = campanile_testkit::sqlite_store();
        (Arc::new(s), dir)
    }

    #[test]
    fn archive_reads_back_what_was_removed() {
        let (s, _dir) = store();
        runtime().block_on(super::archive_reads_back_what_was_removed(s));
    }

    #[test]
    fn a_runs_own_payload_is_archived_with_it() {
        let (s, _dir) = store();
        runtime().block_on(super::a_runs_own_payload_is_archived_with_it(s));
    }

    #[test]
    fn a_node_dying_mid_batch_leaves_it_to_be_finished() {
        let (s, _dir) = store();
        runtime().block_on(super::a_node_dying_mid_batch_leaves_it_to_be_finished(s));
    }

    #[test]
    fn a_batch_given_up_leaves_no_file_behind() {
        let (s, _dir) = store();
        runtime().block_on(super::a_batch_given_up_leaves_no_file_behind(s));
    }

    /// Only acts when re-run as the crash test's child.
    #[test]
    fn retention_child() {
        let (Ok(db), Ok(archive)) = (
            std::env::var("CAMPANILE_RETENTION_DB"),
            std::env::var("CAMPANILE_RETENTION_ARCHIVE"),
        ) else {
            return;
        };
        let s = SqliteStore::open(db).unwrap();
        retention_child_run(Arc::new(s), Path::new(&archive));
    }

    #[test]
    fn sigkill_mid_retention_loses_and_doubles_nothing() {
        let (s, dir) = store();
        let db = dir.path().join("campanile.db").display().to_string();
        sigkill_mid_retention(
            s,
            "sqlite::retention_child",
            &[("CAMPANILE_RETENTION_DB", db)],
            false,
        );
    }
}

mod postgres {
    use super::*;

    /// Runs `body` on a store in a schema of its own; skipped, with a notice, without
    /// PostgreSQL.
    fn on_postgres<F: std::future::Future<Output = ()>>(
        what: &str,
        body: impl FnOnce(Arc<dyn Store>) -> F,
    ) {
        let Some(url) = campanile_testkit::pg_url(what) else {
            return;
        };
        let rt = runtime();
        let (s, _) = rt.block_on(campanile_testkit::pg_store(&url, 4));
        rt.block_on(body(Arc::new(s)));
    }

    #[test]
    fn archive_reads_back_what_was_removed() {
        on_postgres(
            "retention archive test",
            super::archive_reads_back_what_was_removed,
        );
    }

    #[test]
    fn a_runs_own_payload_is_archived_with_it() {
        on_postgres(
            "retention payload test",
            super::a_runs_own_payload_is_archived_with_it,
        );
    }

    #[test]
    fn a_whole_day_leaves_at_once() {
        on_postgres("retention day test", super::a_whole_day_leaves_at_once);
    }

    #[test]
    fn a_node_dying_mid_batch_leaves_it_to_be_finished() {
        on_postgres(
            "retention takeover test",
            super::a_node_dying_mid_batch_leaves_it_to_be_finished,
        );
    }

    #[test]
    fn a_batch_given_up_leaves_no_file_behind() {
        on_postgres(
            "retention give-up test",
            super::a_batch_given_up_leaves_no_file_behind,
        );
    }

    /// Only acts when re-run as the crash test's child.
    #[test]
    fn retention_child() {
        let (Ok(url), Ok(schema), Ok(archive)) = (
            std::env::var("CAMPANILE_TEST_PG_URL"),
            std::env::var("CAMPANILE_RETENTION_SCHEMA"),
            std::env::var("CAMPANILE_RETENTION_ARCHIVE"),
        ) else {
            return;
        };
        let s = runtime().block_on(campanile_testkit::pg_store_in(&url, &schema, 2));
        retention_child_run(Arc::new(s), Path::new(&archive));
    }

    /// [`sigkill_mid_retention`] on a store in a schema of its own, its child on the same.
    fn sigkill_on_postgres(what: &str, by_day: bool) {
        let Some(url) = campanile_testkit::pg_url(what) else {
            return;
        };
        let (s, schema) = runtime().block_on(campanile_testkit::pg_store(&url, 4));
        sigkill_mid_retention(
            Arc::new(s),
            "postgres::retention_child",
            &[("CAMPANILE_RETENTION_SCHEMA", schema)],
            by_day,
        );
    }

    #[test]
    fn sigkill_mid_retention_loses_and_doubles_nothing() {
        sigkill_on_postgres("retention crash test", false);
    }

    #[test]
    fn sigkill_mid_day_loses_and_doubles_nothing() {
        sigkill_on_postgres("retention day crash test", true);
    }
}
