//! `campanile reconcile` on a SQLite file written through the planner: a clean history exits
//! 0; occurrences lost behind the store's back (rows deleted, as a bug or a bad manual fix
//! would) are listed as missing and the exit status is 3.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;
use std::sync::Arc;

use campanile_calendar::DstPolicy;
use campanile_planner::schedules::Schedules;
use campanile_planner::{Planner, PlannerConfig};
use campanile_store::{ScheduleSpec, Store, TenantCreate, Timing};
use jiff::{SignedDuration, Timestamp};

fn every(expr: &str) -> ScheduleSpec {
    ScheduleSpec {
        timing: Timing::Cron {
            expr: expr.into(),
            timezone: "UTC".into(),
            dst_gap: DstPolicy::default().gap,
            dst_fold: DstPolicy::default().fold,
        },
        queue: "jobs".into(),
        payload: None,
        priority: 0,
        lease: SignedDuration::from_secs(30),
        max_attempts: 3,
        backoff_initial: SignedDuration::from_secs(1),
        backoff_max: SignedDuration::from_secs(30),
        misfire: campanile_core::Misfire::Skip {
            max_lateness: SignedDuration::from_secs(600),
        },
        overlap: campanile_core::Overlap::Allow,
        flex_window: SignedDuration::ZERO,
    }
}

/// A SQLite store at `db` with the tenant `acme`.
async fn acme(db: &std::path::Path) -> (Arc<dyn Store>, campanile_store::TenantId) {
    let store: Arc<dyn Store> =
        Arc::new(campanile_store_sqlite::SqliteStore::open(db.to_str().unwrap()).unwrap());
    let tenant = store
        .tenant_create(TenantCreate {
            name: "acme".into(),
            now: None,
        })
        .await
        .unwrap()
        .id;
    (store, tenant)
}

/// A planner of 4 shards with a 15-minute horizon and day-long leases.
fn planner(store: &Arc<dyn Store>) -> Planner {
    let mut cfg = PlannerConfig::new("n");
    cfg.shards = 4;
    cfg.horizon = SignedDuration::from_mins(15);
    cfg.shard_lease = SignedDuration::from_hours(24);
    Planner::new(store.clone(), cfg)
}

fn reconcile(db: &std::path::Path, extra: &[&str]) -> (i32, serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_campanile"))
        .args(["reconcile", "--tenant", "acme", "--json", "--database"])
        .arg(db)
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().unwrap_or("null");
    (
        out.status.code().unwrap(),
        serde_json::from_str(last).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn reconcile_lists_missing_instants_and_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("r.db");
    let t0: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let (lossy, clean) = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let (store, tenant) = acme(&db).await;
        let s = Schedules::new(store.clone(), 4);
        let create = async |spec| s.create(tenant, spec, Some(t0)).await.unwrap().record.id;
        let lossy = create(every("* * * * *")).await;
        let clean = create(every("*/5 * * * *")).await;
        let p = planner(&store);
        for k in 0..=9 {
            let now = t0.checked_add(SignedDuration::from_mins(5 * k)).unwrap();
            p.tick(Some(now)).await.unwrap();
        }
        (lossy, clean)
    });
    // Three instants of the minutely schedule vanish.
    let deleted = rusqlite::Connection::open(&db)
        .unwrap()
        .execute(
            "DELETE FROM occurrences WHERE schedule_id = ?1 AND scheduled_for IN (?2, ?3, ?4)",
            rusqlite::params![
                lossy.0,
                t0.as_millisecond() + 16 * 60_000,
                t0.as_millisecond() + 17 * 60_000,
                t0.as_millisecond() + 39 * 60_000
            ],
        )
        .unwrap();
    assert_eq!(deleted, 3);
    let range = [
        "--from",
        "2026-06-01T00:00:00Z",
        "--to",
        "2026-06-01T00:45:00Z",
    ];

    let (code, report, stderr) = reconcile(&db, &range);
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("3 missing"), "{stderr}");
    assert_eq!(report["missing_total"], 3, "{report}");
    assert_eq!(report["schedules"], 2);
    let missing: Vec<&str> = report["missing"]
        .as_array()
        .unwrap()
        .iter()
        .inspect(|m| assert_eq!(m["schedule_id"], lossy.0.to_string()))
        .map(|m| m["scheduled_for"].as_str().unwrap())
        .collect();
    assert_eq!(
        missing,
        [
            "2026-06-01T00:16:00Z",
            "2026-06-01T00:17:00Z",
            "2026-06-01T00:39:00Z"
        ]
    );

    let mut one = range.to_vec();
    let id = clean.0.to_string();
    one.extend(["--schedule", &id]);
    let (code, report, stderr) = reconcile(&db, &one);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["missing_total"], 0);
    // Every five minutes from 00:00 to 00:40, planned ahead, none claimed.
    assert_eq!(report["counts"]["pending"], 9, "{report}");

    // Cut short by --max-instants: not a clean bill of health.
    one.extend(["--max-instants", "4"]);
    let (code, report, stderr) = reconcile(&db, &one);
    assert_eq!(code, 3, "{stderr}");
    assert_eq!(report["truncated"][0]["covered_to"], "2026-06-01T00:20:00Z");

    // A mistyped path is an error, not a new empty database reconciled as clean.
    let typo = dir.path().join("typo.db");
    let out = Command::new(env!("CARGO_BIN_EXE_campanile"))
        .args(["reconcile", "--tenant", "acme", "--database"])
        .arg(&typo)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(!typo.exists());
}

/// An occurrence of a version superseded before its instant that is not `CANCELED` (what a
/// pause racing a planning commit could leave: the old version planned on after the pause
/// answered) is unexpected, and the exit status is 3.
#[test]
fn reconcile_flags_runs_of_a_superseded_version_and_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let t0: Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
    let min = |m: i64| t0.checked_add(SignedDuration::from_mins(m)).unwrap();
    let id = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let (store, tenant) = acme(&db).await;
        let s = Schedules::new(store.clone(), 4);
        let id = s
            .create(tenant, every("* * * * *"), Some(t0))
            .await
            .unwrap()
            .record
            .id;
        planner(&store).tick(Some(t0)).await.unwrap();
        s.transition(
            tenant,
            id,
            campanile_store::ScheduleState::Paused,
            Some(min(5) + SignedDuration::from_secs(30)),
        )
        .await
        .unwrap();
        id
    });
    let range = [
        "--from",
        "2026-06-01T00:00:00Z",
        "--to",
        "2026-06-01T00:30:00Z",
    ];
    let (code, report, stderr) = reconcile(&db, &range);
    assert_eq!(code, 0, "a clean pause: {stderr}");
    assert_eq!(report["unexpected_total"], 0);
    // The pause's instants after 00:05:30 come back to life under version 1.
    let revived = rusqlite::Connection::open(&db)
        .unwrap()
        .execute(
            "UPDATE occurrences SET state = 'READY', finished_at = NULL
              WHERE schedule_id = ?1 AND version = 1 AND scheduled_for IN (?2, ?3)",
            rusqlite::params![id.0, min(6).as_millisecond(), min(9).as_millisecond()],
        )
        .unwrap();
    assert_eq!(revived, 2);
    let (code, report, stderr) = reconcile(&db, &range);
    assert_eq!(code, 3, "{stderr}");
    assert_eq!(report["unexpected_total"], 2, "{report}");
    let flagged: Vec<(&str, u64)> = report["unexpected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["scheduled_for"].as_str().unwrap(),
                f["version"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        flagged,
        [("2026-06-01T00:06:00Z", 1), ("2026-06-01T00:09:00Z", 1)]
    );
}
