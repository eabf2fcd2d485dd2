//! Planners as separate processes: SIGKILLed mid-batch, and racing each other.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use campanile_calendar::DstPolicy;
use campanile_planner::{Planner, PlannerConfig};
use campanile_store::*;
use campanile_store_postgres::{PgOptions, PgStore};
use campanile_store_sqlite::SqliteStore;
use jiff::{SignedDuration, Timestamp};

use crate::harness::*;

const T0: &str = "2026-06-01T00:00:00Z";

fn config(node: &str) -> PlannerConfig {
    let mut cfg = PlannerConfig::new(node);
    cfg.shards = 4;
    cfg.horizon = SignedDuration::from_mins(15);
    cfg.batch = 25;
    cfg.shard_lease = SignedDuration::from_secs(10);
    cfg
}

async fn open_from_env() -> Option<Arc<dyn Store>> {
    if let Ok(path) = std::env::var("CAMPANILE_PLANNER_DB") {
        return Some(Arc::new(SqliteStore::open(path).unwrap()));
    }
    let (Ok(url), Ok(schema)) = (
        std::env::var("CAMPANILE_TEST_PG_URL"),
        std::env::var("CAMPANILE_PLANNER_SCHEMA"),
    ) else {
        return None;
    };
    Some(Arc::new(
        PgStore::connect_with(
            &url,
            PgOptions {
                schema: Some(schema),
                pool_size: 2,
            },
        )
        .await
        .unwrap(),
    ))
}

/// The child: only acts when spawned by the tests below.
#[test]
fn planner_child() {
    let Ok(mode) = std::env::var("CAMPANILE_PLANNER_CHILD") else {
        return;
    };
    let node = std::env::var("CAMPANILE_PLANNER_NODE").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = open_from_env().await.unwrap();
        let p = Planner::new(store, config(&node));
        println!("planning");
        // A crash victim plans at T0 plus CAMPANILE_PLANNER_AT seconds (after the previous
        // victim's shard leases ran out).
        let at: i64 = std::env::var("CAMPANILE_PLANNER_AT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let t0 = plus(ts(T0), at);
        let steps: i64 = if mode == "race" { 30 } else { 1 };
        for step in 0..steps {
            p.tick(Some(plus(t0, step * 20))).await.unwrap();
        }
        println!("done");
    });
}

fn spawn(mode: &str, node: &str, env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "processes::planner_child",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env("CAMPANILE_PLANNER_CHILD", mode)
    .env("CAMPANILE_PLANNER_NODE", node)
    .stdout(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

async fn seed(env: &Env, n: usize) -> Vec<campanile_core::ScheduleId> {
    let s = schedules(env);
    let mut ids = Vec::new();
    for i in 0..n {
        let expr = format!("{} * * * * *", i % 60);
        ids.push(
            s.create(
                env.tenant,
                cron(&expr, "UTC", DstPolicy::default()),
                Some(ts(T0)),
            )
            .await
            .unwrap()
            .record
            .id,
        );
    }
    ids
}

async fn check_exact(env: &Env, ids: &[campanile_core::ScheduleId], until: Timestamp) {
    for id in ids {
        let want = calendar_instants(env, *id, ts(T0), until).await;
        let got = instants(env, *id).await; // asserts one occurrence per instant
        assert_eq!(got, want, "schedule {id}: nothing missing, nothing extra");
    }
}

/// How many occurrences the store holds for the tenant (all schedules, all states).
async fn stored(env: &Env) -> usize {
    occurrences_of(env, None).await.len()
}

/// How many instants of `ids` a complete pass at `now` plans (through its horizon).
async fn planned_by(env: &Env, ids: &[campanile_core::ScheduleId], now: Timestamp) -> usize {
    let until = now.checked_add(config("x").horizon).unwrap();
    let mut n = 0;
    for id in ids {
        // Up to the horizon, not at it.
        let last = until.checked_sub(SignedDuration::from_nanos(1)).unwrap();
        n += calendar_instants(env, *id, ts(T0), last).await.len();
    }
    n
}

/// Victims planning the same schedules one after another (each once the previous one's shard
/// leases ran out), each killed with SIGKILL a few milliseconds into its pass; at least one is
/// killed mid-pass with some batches committed and others not. A survivor then plans:
/// exactly the calendar's instants, nothing missing, nothing twice.
async fn sigkill_mid_batch(env: Env, child_env: Vec<(&'static str, String)>) {
    let ids = seed(&env, 300).await;
    let mut kills = 0;
    let mut partial = Vec::new();
    let mut seen = Vec::new();
    let delays = [3u64, 9, 20, 40, 80, 160];
    for (i, delay) in delays.into_iter().enumerate() {
        let at = 11 * i as i64;
        let mut vars = child_env.clone();
        vars.push(("CAMPANILE_PLANNER_AT", at.to_string()));
        let before = stored(&env).await;
        let mut child = spawn("crash", &format!("victim-{i}"), &vars);
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let _ = lines
            .by_ref()
            .map_while(Result::ok)
            .find(|l| l.contains("planning"));
        std::thread::sleep(Duration::from_millis(delay));
        child.kill().unwrap();
        if child.wait().unwrap().code().is_none() {
            kills += 1;
            let after = stored(&env).await;
            let full = planned_by(&env, &ids, plus(ts(T0), at)).await;
            seen.push((delay, before, after, full));
            if before < after && after < full {
                partial.push((i, before, after, full));
            }
        }
    }
    eprintln!("victims (delay ms, stored before, after, a whole pass): {seen:?}");
    assert!(kills >= 1);
    assert!(
        !partial.is_empty(),
        "no victim was killed between two of its batches: (delay ms, stored before, after, a \
         whole pass) {seen:?}"
    );
    // A survivor takes over once the victims' shard leases have passed, and finishes the job.
    let survivor = Planner::new(env.store.clone(), config("survivor"));
    let later = plus(ts(T0), 11 * delays.len() as i64);
    survivor.tick(Some(later)).await.unwrap();
    check_exact(&env, &ids, plus(later, 15 * 60)).await;
}

#[test]
fn sigkill_planner_mid_batch_sqlite() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let env = rt.block_on(crate::harness::sqlite_at(&path));
    rt.block_on(sigkill_mid_batch(
        env,
        vec![("CAMPANILE_PLANNER_DB", path.display().to_string())],
    ));
}

#[test]
fn sigkill_planner_mid_batch_postgres() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some((env, schema)) = rt.block_on(crate::harness::postgres_named()) else {
        return;
    };
    rt.block_on(sigkill_mid_batch(
        env,
        vec![("CAMPANILE_PLANNER_SCHEMA", schema)],
    ));
}

/// Two, then three planner processes on one PostgreSQL database (a fresh schema each time),
/// ticking over the same half hour with skewed clocks and 10 s shard leases: exactly one
/// occurrence per instant, none missing.
#[test]
fn planner_processes_race_postgres() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    for racers in [2, 3] {
        let Some((env, schema)) = rt.block_on(crate::harness::postgres_named()) else {
            return;
        };
        let ids = rt.block_on(seed(&env, 120));
        let children: Vec<Child> = (0..racers)
            .map(|i| {
                spawn(
                    "race",
                    &format!("racer-{i}"),
                    &[("CAMPANILE_PLANNER_SCHEMA", schema.clone())],
                )
            })
            .collect();
        for mut c in children {
            let status = c.wait().unwrap();
            assert!(status.success(), "a racing planner failed: {status}");
        }
        // The last tick of each racer is at T0 + 29 × 20 s; a final pass finishes any shard
        // a racer let go in its last step.
        let last = plus(ts(T0), 29 * 20);
        let finisher = Planner::new(env.store.clone(), config("finisher"));
        rt.block_on(finisher.tick(Some(plus(last, 11)))).unwrap();
        rt.block_on(check_exact(&env, &ids, plus(plus(last, 11), 15 * 60)));
    }
}
