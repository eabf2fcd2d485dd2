//! `campanile bench plan`: materialization throughput, and the cost of a planning pass as
//! the number of stored schedules grows while the number due stays the same.
//!
//! For each `--schedules N`: a fresh database gets N hourly schedules, of which `--due M` are
//! due at the next planning pass and the rest a year later. One timed planner pass then
//! materializes the M due occurrences. If the pass costs the same at 20k and at 2M stored
//! schedules, cost follows the work due, not the size of the table. Last, the node "comes
//! back" from an outage after the next hour's M occurrences came due: the outage check that
//! records them `MISSED` (it runs before a restarted node serves claims) is timed alone.
//!
//! Before and after each run the raw-SQL ceiling (`bench ceiling`, batch 1000, its default 8
//! workers on PostgreSQL, over `--ceiling-occurrences` rows: more than a pass's 10,000, so that
//! it runs long enough to be measured) gives `ratio_to_ceiling`: the pass's occurrences per
//! second over the mean of the two ceilings' occurrences per second claimed and completed. Planning and draining have different work, so
//! the ratio says whether planning can keep ahead of the fastest drain the database allows
//! (above 1 it can), not how close planning is to a planning optimum.

use std::sync::Arc;
use std::time::Instant;

use campanile_calendar::{DstFold, DstGap};
use campanile_core::ScheduleId;
use campanile_planner::{Planner, PlannerConfig, shard_of};
use campanile_store::*;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use jiff::{SignedDuration, Timestamp};
use serde_json::json;

use crate::common::{Backend, Common};
use crate::db;
use crate::error::BenchError;

/// Arguments of `campanile bench plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    common: Common,
    /// Stored schedules, one run per value (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "20000,2000000")]
    schedules: Vec<u32>,
    /// Schedules due at the timed pass (the same for every run).
    #[arg(long, default_value_t = 10_000)]
    due: u32,
    /// Planner shards.
    #[arg(long, default_value_t = 16)]
    shards: u32,
    /// Schedules per planning batch (one transaction).
    #[arg(long, default_value_t = 5_000)]
    batch: u32,
    #[command(flatten)]
    ceiling: crate::ceiling::CeilingFlag,
    /// Rows the ceiling claims and completes before and after each run.
    #[arg(long, default_value_t = 100_000)]
    ceiling_occurrences: u32,
}

/// The ceiling's batch beside `bench plan`.
const CEILING_BATCH: u32 = 1_000;

pub(crate) fn run(args: PlanArgs) -> Result<(), BenchError> {
    if args.schedules.iter().any(|n| *n < args.due)
        || args.due == 0
        || args.shards == 0
        || args.batch == 0
        || args.ceiling_occurrences == 0
    {
        return Err(BenchError::usage(
            "--due must be positive and at most every --schedules value; --shards, --batch and --ceiling-occurrences must be positive",
        ));
    }
    crate::error::block_on(async {
        let mut runs = Vec::new();
        for &n in &args.schedules {
            let mut run = crate::common::bracketed(
                &args.common,
                args.ceiling.no_ceiling,
                args.ceiling_occurrences,
                CEILING_BATCH,
                crate::ceiling::WORKERS,
                async {
                    let (bench_db, run) =
                        seed_and_pass(&args.common, n, args.due, args.shards, args.batch).await?;
                    bench_db.finish().await?;
                    Ok(run)
                },
            )
            .await?;
            if !args.ceiling.no_ceiling {
                run["ceiling_batch"] = json!(CEILING_BATCH);
            }
            runs.push(run);
        }
        println!(
            "campanile bench plan — {:?}, {} due per pass, {} shards",
            args.common.backend, args.due, args.shards
        );
        println!(
            "{:>10}  {:>10}  {:>12}  {:>12}  {:>16}  {:>10}  {:>10}  {:>10}",
            "schedules",
            "seed s",
            "pass s",
            "next pass s",
            "occurrences/s",
            "resume s",
            "B/sched",
            "/ceiling"
        );
        for r in &runs {
            println!(
                "{:>10}  {:>10.2}  {:>12.3}  {:>12.3}  {:>16.0}  {:>10.3}  {:>10}  {:>10}",
                r["schedules"].as_u64().unwrap_or(0),
                r["seed_seconds"].as_f64().unwrap_or(0.0),
                r["pass_seconds"].as_f64().unwrap_or(0.0),
                r["next_pass_seconds"].as_f64().unwrap_or(0.0),
                r["occurrences_per_sec"].as_f64().unwrap_or(0.0),
                r["resume_seconds"].as_f64().unwrap_or(0.0),
                r["db_bytes_per_schedule"]
                    .as_f64()
                    .map_or("-".to_string(), |b| format!("{b:.0}")),
                r["ratio_to_ceiling"]
                    .as_f64()
                    .map_or("-".to_string(), |x| format!("{x:.2}")),
            );
        }
        let ratio_of = |field: &str| {
            let passes: Vec<f64> = runs.iter().filter_map(|r| r[field].as_f64()).collect();
            match (passes.first(), passes.last()) {
                (Some(a), Some(b)) if *a > 0.0 => b / a,
                _ => 1.0,
            }
        };
        let (ratio, next_ratio) = (ratio_of("pass_seconds"), ratio_of("next_pass_seconds"));
        if runs.len() > 1 {
            println!(
                "largest / smallest pass time: {ratio:.2}x after the seed, {next_ratio:.2}x the next hour"
            );
        }
        if args.common.json {
            println!(
                "{}",
                json!({ "bench": "plan", "backend": args.common.backend, "due": args.due, "shards": args.shards, "runs": runs, "pass_ratio_largest_to_smallest": ratio, "next_pass_ratio_largest_to_smallest": next_ratio })
            );
        }
        Ok(())
    })
}

/// A fresh database with `n` stored schedules of which `due` are due at the next pass, and
/// one timed planner pass over it; the database is left open for the caller to measure more.
pub(crate) async fn seed_and_pass(
    common: &Common,
    n: u32,
    due: u32,
    shards: u32,
    batch: u32,
) -> Result<(crate::common::BenchDb, serde_json::Value), BenchError> {
    let err = |e: StoreError| BenchError::runtime(format!("store error: {e}"));
    let bench_db = common.open("bench-plan.db").await?;
    let store = bench_db.store.clone();
    let tenant = store
        .tenant_create(TenantCreate {
            name: "bench".into(),
            now: None,
        })
        .await
        .map_err(err)?
        .id;
    // A fixed top of the hour; the pass runs a minute before it.
    let at: Timestamp = "2030-01-01T00:00:00Z"
        .parse()
        .map_err(|e| BenchError::runtime(format!("{e}")))?;
    let now = at
        .checked_sub(SignedDuration::from_secs(60))
        .map_err(|e| BenchError::runtime(e.to_string()))?;
    let later = at
        .checked_add(SignedDuration::from_hours(24 * 365))
        .map_err(|e| BenchError::runtime(e.to_string()))?;
    let spec = crate::common::bench_spec(
        Timing::Cron {
            expr: "0 * * * *".into(),
            timezone: "UTC".into(),
            dst_gap: DstGap::Skip,
            dst_fold: DstFold::Once,
        },
        "bench",
    );
    let bar = ProgressBar::new(u64::from(n));
    bar.set_style(
        ProgressStyle::with_template("seeding {pos}/{len} schedules [{bar:40}] {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let seed_start = Instant::now();
    let mut made = 0u32;
    while made < n {
        let chunk = (n - made).min(50_000);
        let items = (made..made + chunk)
            .map(|i| {
                let id = ScheduleId(uuid::Uuid::now_v7());
                // Spread the due ones evenly through the table, not at its end.
                let is_due = u64::from(i) * u64::from(due) / u64::from(n)
                    != (u64::from(i) + 1) * u64::from(due) / u64::from(n);
                (
                    id,
                    shard_of(id, shards),
                    Some(if is_due { at } else { later }),
                )
            })
            .collect();
        store
            .schedule_create_many(ScheduleCreateMany {
                tenant,
                spec: spec.clone(),
                items,
                now: Some(now),
            })
            .await
            .map_err(err)?;
        made += chunk;
        bar.inc(u64::from(chunk));
    }
    bar.finish_and_clear();
    let seed_seconds = seed_start.elapsed().as_secs_f64();
    // On PostgreSQL: the schema's size, then what a production server would have done after a
    // bulk load like the seed, outside the timing, so that the pass is measured on the database
    // a production node would see. Autovacuum (off on this machine's server) would have run
    // `VACUUM (ANALYZE)` (hint bits, visibility map, statistics); the checkpointer would have
    // written the seed's dirty pages out within minutes, and without that the pass, finding the
    // buffer pool full of them, writes them out itself (seen at 2M schedules: a third of the
    // first pass's reads waited on such writes).
    let (bytes, vacuumed, checkpointed) = match (&common.backend, &bench_db.schema) {
        (Backend::Postgres, Some(schema)) => {
            let admin = db::bench_schema(&bench_db.database, schema).await?;
            let bytes = admin.schema_bytes().await.map_err(err)?;
            admin.vacuum_analyze().await.map_err(err)?;
            (Some(bytes), true, admin.checkpoint().await.map_err(err)?)
        }
        (Backend::Postgres, None) => (None, false, false),
        (Backend::Sqlite, _) => (
            bench_db.sqlite_path.as_deref().and_then(db::sqlite_size),
            false,
            false,
        ),
    };

    let mut cfg = PlannerConfig::new("bench");
    cfg.shards = shards;
    cfg.batch = batch;
    // The passes below jump an hour; a lease that outlasts the jump keeps the node's liveness
    // mark valid, so that the jump is not taken for an outage (that is measured at the end).
    cfg.shard_lease = SignedDuration::from_hours(2);
    let planner = Planner::new(Arc::clone(&store), cfg);
    // One timed pass at `at`, which must materialize exactly the due schedules.
    let timed_pass = async |at: Timestamp, which: &str| {
        let started = Instant::now();
        let report = planner
            .tick(Some(at))
            .await
            .map_err(|e| BenchError::runtime(e.to_string()))?;
        let seconds = started.elapsed().as_secs_f64();
        if report.inserted != u64::from(due) {
            return Err(BenchError::runtime(format!(
                "{which} materialized {} occurrences, expected {due}",
                report.inserted
            )));
        }
        Ok((report, seconds))
    };
    let (report, pass) = timed_pass(now, "the pass").await?;
    // The next hour's pass: the same schedules are due again, and their queue entries are now
    // where the first pass put them back — together, as in a deployment that has been running
    // (the seed scattered them among all the others, as a bulk load does).
    let next_now = now
        .checked_add(SignedDuration::from_hours(1))
        .map_err(|e| BenchError::runtime(e.to_string()))?;
    let (_, next_pass) = timed_pass(next_now, "the next hour's pass").await?;
    // Then the whole control plane is down for longer than the mark lasts: the node coming
    // back judges the occurrences the last pass planned, which came due meanwhile and are
    // now late (all of them `MISSED` under the default `SKIP`) before it serves a claim. The
    // outage check alone is timed.
    let back = next_now
        .checked_add(SignedDuration::from_mins(130))
        .map_err(|e| BenchError::runtime(e.to_string()))?;
    let started = Instant::now();
    let resumed = store
        .shard_acquire(ShardAcquire {
            node: "bench-restarted".into(),
            total: shards,
            lease: SignedDuration::from_secs(15),
            judge: Arc::new(campanile_planner::CalendarJudge::default()),
            now: Some(back),
        })
        .await
        .map_err(err)?
        .resumed;
    let resume_seconds = started.elapsed().as_secs_f64();
    // Stop both nodes by the real clock: their shard leases and liveness marks run into 2030,
    // and a node started on this database (`bench scale` measures one) would otherwise take
    // no shard, or only its share among nodes it believes alive.
    for node in ["bench", "bench-restarted"] {
        store
            .shard_release(ShardRelease {
                node: node.into(),
                now: None,
            })
            .await
            .map_err(err)?;
    }
    if resumed.missed != u64::from(due) {
        return Err(BenchError::runtime(format!(
            "the node coming back recorded {} occurrences MISSED, expected {due}",
            resumed.missed
        )));
    }
    let run = json!({
        "schedules": n,
        "due": due,
        "seed_seconds": seed_seconds,
        "pass_seconds": pass,
        "occurrences": report.inserted,
        "occurrences_per_sec": report.inserted as f64 / pass,
        "read_seconds": report.read.as_secs_f64(),
        "decide_seconds": report.decide.as_secs_f64(),
        "commit_seconds": report.commit.as_secs_f64(),
        "db_bytes_per_schedule": bytes.map(|b| b as f64 / f64::from(n)),
        "vacuumed_after_seed": vacuumed,
        "checkpointed_after_seed": checkpointed,
        "next_pass_seconds": next_pass,
        "resume_seconds": resume_seconds,
        "resume_missed": resumed.missed,
    });
    Ok((bench_db, run))
}
