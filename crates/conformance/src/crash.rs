//! SIGKILL in the middle of claim batches. The backend's test binary re-runs itself as the
//! child (a test that only acts when `CAMPANILE_CRASH_GEN` is set), so the child is a real
//! process using the real backend, killed with SIGKILL at varying moments.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use campanile_core::OccurrenceState;
use jiff::SignedDuration;
use tokio::runtime::Runtime;

use super::*;

/// Occurrences claimed per batch by the child.
pub const CRASH_BATCH: u32 = 500;
const TOTAL: i64 = 100_000;

/// The child's body: claim batches until the queue is empty (or SIGKILL).
pub fn crash_child(rt: &Runtime, store: Arc<dyn Store>) {
    let Ok(generation) = std::env::var("CAMPANILE_CRASH_GEN") else {
        return;
    };
    for n in 0.. {
        let got = rt
            .block_on(store.occurrence_claim(OccurrenceClaim {
                max_bytes: None,
                tenant: TenantId(1),
                queue: "q".into(),
                worker_id: format!("g{generation}-batch-{n}"),
                max: CRASH_BATCH,
                lease: Some(SignedDuration::from_hours(1)),
                key: None,
                now: Some(secs(1_000)),
            }))
            .expect("claim");
        if n == 0 {
            println!("claiming");
        }
        if got.is_empty() {
            println!("empty");
            return;
        }
    }
}

/// Seeds 100k occurrences, runs up to eight children that are SIGKILLed mid-run, then
/// checks that every claim batch is whole (500 occurrences, each with its owner and epoch) or
/// absent.
pub fn sigkill_mid_claim_leaves_whole_batches_or_none(
    rt: &Runtime,
    store: Arc<dyn Store>,
    child_test: &str,
    child_env: &[(&str, String)],
) {
    let tenant = rt.block_on(async {
        let f = fixture(store.as_ref(), "crash", "q").await;
        assert_eq!(f.tenant, TenantId(1), "the child claims as tenant 1");
        let items = (0..TOTAL)
            .map(|i| {
                let mut o = new_occ(&f, "q", at(i / 100), 3);
                o.version = (i % 100) as u32 + 1; // 100 per instant need distinct keys
                o
            })
            .collect();
        let n = store
            .occurrence_insert_many(OccurrenceInsertMany {
                tenant: f.tenant,
                items,
                now: Some(at(0)),
            })
            .await
            .expect("seed");
        assert_eq!(n, TOTAL as u64);
        f.tenant
    });

    let mut kills = 0;
    for generation in 0..8u64 {
        let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
        cmd.args(["--exact", child_test, "--nocapture", "--test-threads", "1"])
            .env("CAMPANILE_CRASH_GEN", generation.to_string())
            .stdout(Stdio::piped());
        for (k, v) in child_env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child");
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
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
        child.kill().expect("SIGKILL");
        if child.wait().expect("reap").code().is_none() {
            kills += 1;
        }
    }
    assert!(
        kills >= 1,
        "at least one child must have died by SIGKILL mid-run"
    );

    rt.block_on(async {
        let now = secs(1_001);
        let mut per_owner: HashMap<String, Vec<OccurrenceId>> = HashMap::new();
        let mut ready = 0;
        let mut after = None;
        loop {
            let page = store
                .occurrence_list(OccurrenceList {
                    tenant,
                    after,
                    limit: 5_000,
                    now: Some(now),
                    ..Default::default()
                })
                .await
                .expect("list");
            if page.is_empty() {
                break;
            }
            after = page.last().map(|o| (o.scheduled_for, o.id));
            for o in page {
                match o.state {
                    OccurrenceState::Running => {
                        assert_eq!((o.epoch, o.attempts), (1, 1));
                        per_owner
                            .entry(o.owner.clone().expect("owner"))
                            .or_default()
                            .push(o.id);
                    }
                    OccurrenceState::Ready => ready += 1,
                    other => panic!("unexpected state {other}"),
                }
            }
        }
        let claimed: usize = per_owner.values().map(Vec::len).sum();
        assert_eq!(claimed as i64 + ready, TOTAL, "nothing lost");
        let partial: Vec<(&String, usize)> = per_owner
            .iter()
            .map(|(k, v)| (k, v.len()))
            .filter(|(_, n)| *n != CRASH_BATCH as usize)
            .collect();
        assert!(
            partial.is_empty() || (partial.len() == 1 && ready == 0),
            "torn batches: {partial:?}"
        );
        // Every claimed occurrence has exactly its one attempt (read from the occurrence row),
        // owned by its batch.
        for (owner, ids) in &per_owner {
            for id in ids.iter().step_by(97) {
                let d = store
                    .occurrence_get(OccurrenceGet {
                        tenant,
                        key: OccurrenceKey::Id(*id),
                        now: Some(now),
                    })
                    .await
                    .expect("get")
                    .expect("exists");
                let attempts: Vec<(i64, &str)> = d
                    .attempts
                    .iter()
                    .map(|a| (a.epoch, a.owner.as_str()))
                    .collect();
                assert_eq!(attempts, vec![(1, owner.as_str())]);
            }
        }
        eprintln!(
            "{kills} SIGKILLs, {} whole batches, {claimed} claimed, {ready} still ready",
            per_owner.len()
        );
    });
}
