//! SIGKILL in the middle of claim batches: each batch is all there or not there at all.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use campanile_core::{OccurrenceState, ScheduleId};
use campanile_store::*;
use campanile_store_sqlite::SqliteStore;
use jiff::{SignedDuration, Timestamp};
use uuid::Uuid;

const BATCH: u32 = 500;
const TOTAL: i64 = 100_000;

fn t(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap()
}

/// The child: claims batches of 500 until the queue is empty or it is killed.
#[test]
fn crash_child() {
    let Ok(path) = std::env::var("CAMPANILE_CRASH_CHILD") else {
        return;
    };
    let generation: u32 = std::env::var("CAMPANILE_CRASH_GEN")
        .unwrap()
        .parse()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = SqliteStore::open(&path).unwrap();
    for n in 0.. {
        let got = rt
            .block_on(store.occurrence_claim(OccurrenceClaim {
                tenant: TenantId(1),
                queue: "q".into(),
                worker_id: format!("g{generation}-batch-{n}"),
                max: BATCH,
                lease: SignedDuration::from_hours(1),
                now: Some(t(1_000)),
            }))
            .unwrap();
        if n == 0 {
            println!("claiming");
        }
        if got.is_empty() {
            println!("empty");
            return;
        }
    }
}

#[test]
fn sigkill_mid_claim_leaves_whole_batches_or_none() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.db");
    let rt = tokio::runtime::Runtime::new().unwrap();
    {
        let store = SqliteStore::open(&path).unwrap();
        rt.block_on(async {
            let tenant = store
                .tenant_create(TenantCreate {
                    name: "crash".into(),
                    now: Some(t(0)),
                })
                .await
                .unwrap()
                .id;
            assert_eq!(tenant, TenantId(1));
            let schedule = ScheduleId(Uuid::now_v7());
            let items = (0..TOTAL)
                .map(|i| NewOccurrence {
                    schedule_id: schedule,
                    version: 1,
                    scheduled_for: t(i / 100),
                    available_at: t(i / 100),
                    queue: "q".into(),
                    priority: 0,
                    max_attempts: 3,
                    backoff_initial: SignedDuration::from_secs(1),
                    backoff_max: SignedDuration::from_secs(1),
                    state: OccurrenceState::Ready,
                })
                .collect::<Vec<_>>();
            // Same instant for 100 items needs distinct keys: vary the version.
            let items = items
                .into_iter()
                .enumerate()
                .map(|(i, mut o)| {
                    o.version = (i % 100) as u32 + 1;
                    o
                })
                .collect();
            let n = store
                .occurrence_insert_many(OccurrenceInsertMany {
                    tenant,
                    items,
                    now: Some(t(0)),
                })
                .await
                .unwrap();
            assert_eq!(n, TOTAL as u64);
        });
    }

    let mut kills = 0;
    for generation in 0..8 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "crash_child",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("CAMPANILE_CRASH_CHILD", &path)
            .env("CAMPANILE_CRASH_GEN", generation.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // Skip the test harness's own lines up to the child's first word.
        let first = lines
            .by_ref()
            .map_while(Result::ok)
            .find(|l| l.contains("claiming") || l.contains("empty"))
            .unwrap_or_default();
        if !first.contains("claiming") {
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(5 + 11 * generation));
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        if status.code().is_none() {
            kills += 1;
        }
    }
    assert!(
        kills >= 1,
        "at least one child must have died by SIGKILL mid-run"
    );

    // Every batch that committed is whole: 500 RUNNING occurrences and 500 attempt rows per
    // worker id, except possibly the very last batch that emptied the queue.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let by_owner: Vec<(String, i64)> = conn
        .prepare("SELECT owner, COUNT(*) FROM occurrences WHERE state = 'RUNNING' GROUP BY owner")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let attempts: Vec<(String, i64)> = conn
        .prepare("SELECT owner, COUNT(*) FROM attempts GROUP BY owner")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        by_owner, attempts,
        "every claimed occurrence has its attempt row and no other"
    );
    let ready: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM occurrences WHERE state = 'READY'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let partial: Vec<&(String, i64)> = by_owner
        .iter()
        .filter(|(_, n)| *n != i64::from(BATCH))
        .collect();
    assert!(
        partial.is_empty() || (partial.len() == 1 && ready == 0),
        "torn batches: {partial:?}"
    );
    let claimed: i64 = by_owner.iter().map(|(_, n)| n).sum();
    assert_eq!(claimed + ready, TOTAL, "nothing lost");
    assert!(claimed > 0);
    eprintln!(
        "{kills} SIGKILLs, {} whole batches, {claimed} claimed, {ready} still ready",
        by_owner.len()
    );
}
