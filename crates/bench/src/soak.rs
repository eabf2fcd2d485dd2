//! `campanile bench soak`: steady load for minutes with a short retention — does the database
//! level off, and does the work keep its pace as history comes and goes?
//!
//! `--schedules` schedules fire every `schedules / rate` seconds between them (`--rate` fires a
//! second in all), planned by the real planner; `--workers` workers claim and complete what is
//! due through the store (batches of 100); retention runs beside them with `--retention`
//! seconds for the tenant and an archive in the run's temporary directory. Every
//! `--sample-secs` it records the database's size (the SQLite file with its WAL, or the
//! PostgreSQL schema's relations, vacuumed first when the server's autovacuum is off, as
//! autovacuum would have), the completions and the mean completion lag (completed at
//! minus planned for) since the last sample. The verdict compares the first and the last
//! minute (after the start-up sample), and the size half-way with the size at the end: with a
//! run longer than twice the retention, retention is in its steady state by half-way.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use campanile_core::ScheduleId;
use campanile_planner::{Engine, PlannerConfig, SweepConfig, shard_of};
use campanile_retention::{Archive, Retention as Retainer, RetentionConfig};
use campanile_store::*;
use clap::Args;
use jiff::{SignedDuration, Timestamp};
use serde_json::json;

use crate::common::{Backend, Common};
use crate::error::BenchError;

/// Arguments of `campanile bench soak`.
#[derive(Debug, Args)]
pub struct SoakArgs {
    #[command(flatten)]
    common: Common,
    /// Schedules.
    #[arg(long, default_value_t = 200)]
    schedules: u32,
    /// Fires per second across all schedules (each schedule every schedules/rate seconds,
    /// at least 1 s).
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// How long the load runs, in minutes (fractions allowed).
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// The tenant's retention, in seconds.
    #[arg(long, default_value_t = 60)]
    retention: u32,
    /// Concurrent workers.
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Seconds between samples.
    #[arg(long, default_value_t = 10)]
    sample_secs: u64,
    /// Write an SVG of size and throughput over time to this file.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
}

/// One sample.
#[derive(Debug, Clone, serde::Serialize)]
struct Sample {
    /// Seconds since the load started.
    t: f64,
    /// Database bytes.
    bytes: u64,
    /// Completions since the previous sample, per second.
    completed_per_sec: f64,
    /// Mean completed-at minus planned-for of those completions, in seconds.
    mean_lag_s: f64,
    /// Occurrences removed by retention so far.
    removed: u64,
}

pub(crate) fn run(args: SoakArgs) -> Result<(), BenchError> {
    if args.schedules == 0
        || args.workers == 0
        || !(args.rate > 0.0 && args.rate.is_finite())
        || !(args.minutes > 0.0 && args.minutes <= 24.0 * 60.0)
        || args.retention == 0
        || args.sample_secs == 0
    {
        return Err(BenchError::usage(
            "--schedules, --workers, --rate, --retention and --sample-secs must be positive, \
             --minutes in (0, 1440]",
        ));
    }
    crate::error::block_on(run_async(args))
}

async fn run_async(args: SoakArgs) -> Result<(), BenchError> {
    let err = |e: StoreError| BenchError::runtime(format!("store error: {e}"));
    let bench_db = args.common.open("soak.db").await?;
    let store = bench_db.store.clone();
    let tenant = store
        .tenant_create(TenantCreate {
            name: "soak".into(),
            now: None,
        })
        .await
        .map_err(err)?
        .id;
    store
        .tenant_retention_set(TenantRetentionSet {
            tenant,
            retention: Retention::For(SignedDuration::from_secs(i64::from(args.retention))),
        })
        .await
        .map_err(err)?;
    let period_ms = ((f64::from(args.schedules) / args.rate) * 1000.0).max(1000.0) as i64;
    let spec = crate::common::bench_spec(
        Timing::Every {
            period: SignedDuration::from_millis(period_ms),
            anchor: Timestamp::UNIX_EPOCH,
        },
        "soak",
    );
    let shards = 16;
    let now = Timestamp::now();
    // Every schedule fires at the period's multiples (one anchor, one shared definition).
    let first = (now.as_millisecond() / period_ms + 2) * period_ms;
    let items = (0..args.schedules)
        .map(|_| {
            let id = ScheduleId(uuid::Uuid::now_v7());
            (
                id,
                shard_of(id, shards),
                Timestamp::from_millisecond(first).ok(),
            )
        })
        .collect();
    store
        .schedule_create_many(ScheduleCreateMany {
            tenant,
            spec: spec.clone(),
            items,
            now: None,
        })
        .await
        .map_err(err)?;

    let mut pcfg = PlannerConfig::new("soak-node");
    pcfg.shards = shards;
    let engine = Engine::start_after_first_pass(Arc::clone(&store), pcfg, SweepConfig::default())
        .await
        .map_err(|e| BenchError::runtime(format!("first planning pass: {e}")))?;

    let archive_dir = tempfile::tempdir()
        .map_err(|e| BenchError::runtime(format!("cannot create the archive directory: {e}")))?;
    let mut rcfg = RetentionConfig::new("soak-node");
    rcfg.archive = Some(Archive::new(archive_dir.path()));
    rcfg.idle = Duration::from_secs(1);
    let retention = Retainer::new(Arc::clone(&store), rcfg);

    let completed = Arc::new(AtomicU64::new(0));
    let lag_ms = Arc::new(AtomicU64::new(0));
    let removed = Arc::new(AtomicU64::new(0));
    let files = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for w in 0..args.workers {
        let store = Arc::clone(&store);
        let completed = Arc::clone(&completed);
        let lag_ms = Arc::clone(&lag_ms);
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            let worker = format!("soak-w{w}");
            while !*stop.borrow() {
                let claimed = match store
                    .occurrence_claim(OccurrenceClaim {
                        tenant,
                        queue: "soak".into(),
                        worker_id: worker.clone(),
                        max: 100,
                        lease: Some(SignedDuration::from_secs(60)),
                        key: None,
                        max_bytes: None,
                        now: None,
                    })
                    .await
                {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "soak claim failed");
                        Vec::new()
                    }
                };
                if claimed.is_empty() {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                        _ = stop.changed() => {}
                    }
                    continue;
                }
                let items = claimed
                    .iter()
                    .map(|c| FinishItem {
                        lease: LeaseRef {
                            occurrence_id: c.id,
                            epoch: c.epoch,
                        },
                        finish: Finish::Succeeded { result: None },
                    })
                    .collect();
                let acks = store
                    .occurrence_finish_many(OccurrenceFinishMany {
                        tenant,
                        worker_id: worker.clone(),
                        items,
                        now: None,
                    })
                    .await;
                let done = Timestamp::now().as_millisecond();
                if let Ok(acks) = acks {
                    for (a, c) in acks.iter().zip(&claimed) {
                        if a.accepted() {
                            completed.fetch_add(1, Ordering::Relaxed);
                            let lag = (done - c.scheduled_for.as_millisecond()).max(0);
                            lag_ms.fetch_add(lag as u64, Ordering::Relaxed);
                        }
                    }
                }
            }
        }));
    }
    {
        let removed = Arc::clone(&removed);
        let files = Arc::clone(&files);
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            while !*stop.borrow() {
                let pass = retention.pass(None).await;
                match &pass {
                    Ok(pass) => {
                        removed.fetch_add(
                            pass.closed.removed + pass.day_closed.removed,
                            Ordering::Relaxed,
                        );
                        files.fetch_add(pass.files.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) => tracing::warn!(error = %e, "soak retention pass failed"),
                }
                let wait = retention.config().wait_after(&pass);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.changed() => {}
                }
            }
        }));
    }

    let start = Instant::now();
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let mut samples: Vec<Sample> = Vec::new();
    let (mut last_done, mut last_lag, mut last_t) = (0u64, 0u64, 0.0f64);
    while start.elapsed() < total {
        let left = total.saturating_sub(start.elapsed());
        let every = Duration::from_secs(args.sample_secs);
        if left < every / 2 && !samples.is_empty() {
            // Too short a last interval to be a fair sample of the rates.
            tokio::time::sleep(left).await;
            break;
        }
        tokio::time::sleep(every.min(left)).await;
        let t = start.elapsed().as_secs_f64();
        let done = completed.load(Ordering::Relaxed);
        let lag = lag_ms.load(Ordering::Relaxed);
        let n = done - last_done;
        let sample = Sample {
            t,
            bytes: db_bytes(&bench_db, args.common.backend).await,
            completed_per_sec: n as f64 / (t - last_t).max(1e-9),
            mean_lag_s: if n == 0 {
                0.0
            } else {
                (lag - last_lag) as f64 / n as f64 / 1000.0
            },
            removed: removed.load(Ordering::Relaxed),
        };
        eprintln!(
            "{:>7.1} s  {:>8.2} MiB  {:>8.1} completed/s  lag {:>6.3} s  removed {}",
            sample.t,
            sample.bytes as f64 / 1048576.0,
            sample.completed_per_sec,
            sample.mean_lag_s,
            sample.removed
        );
        samples.push(sample);
        (last_done, last_lag, last_t) = (done, lag, t);
    }
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    engine.shutdown().await;
    let archive_files = files.load(Ordering::Relaxed);
    bench_db.finish().await?;

    // The first and last minute (or the first and last sample when the run is shorter).
    let window = |from: f64, to: f64| {
        let pick: Vec<&Sample> = samples.iter().filter(|s| s.t > from && s.t <= to).collect();
        let n = pick.len().max(1) as f64;
        (
            pick.iter().map(|s| s.completed_per_sec).sum::<f64>() / n,
            pick.iter().map(|s| s.mean_lag_s).sum::<f64>() / n,
        )
    };
    // The first sample is the start-up (the first fire is two periods in): the first minute
    // is the one after it.
    let begin = samples.first().map_or(0.0, |s| s.t);
    let end = samples.last().map_or(0.0, |s| s.t);
    let minute = 60.0f64.min((end - begin) / 2.0);
    let (first_rate, first_lag) = window(begin, begin + minute);
    let (last_rate, last_lag) = window(end - minute, end);
    let half = samples
        .iter()
        .find(|s| s.t >= end / 2.0)
        .map_or(0, |s| s.bytes);
    let final_bytes = samples.last().map_or(0, |s| s.bytes);
    println!(
        "campanile bench soak — {:?}, {} schedules at {} fires/s, retention {} s, {:.1} min",
        args.common.backend, args.schedules, args.rate, args.retention, args.minutes
    );
    println!(
        "completed/s: first {first_rate:.1}, last {last_rate:.1} (ratio {:.2}); mean lag: first {first_lag:.3} s, last {last_lag:.3} s",
        last_rate / first_rate.max(1e-9)
    );
    println!(
        "database: {:.2} MiB half-way, {:.2} MiB at the end (ratio {:.2}); {} removed by retention, {} archive files",
        half as f64 / 1048576.0,
        final_bytes as f64 / 1048576.0,
        final_bytes as f64 / (half as f64).max(1.0),
        samples.last().map_or(0, |s| s.removed),
        archive_files
    );
    if let Some(path) = &args.plot {
        std::fs::write(path, crate::plot::soak_svg(&samples_for_plot(&samples)))
            .map_err(|e| BenchError::runtime(format!("cannot write {}: {e}", path.display())))?;
        eprintln!("plot written to {}", path.display());
    }
    if args.common.json {
        println!(
            "{}",
            json!({
                "bench": "soak",
                "backend": args.common.backend,
                "schedules": args.schedules,
                "rate": args.rate,
                "retention_s": args.retention,
                "minutes": args.minutes,
                "first_minute_completed_per_sec": first_rate,
                "last_minute_completed_per_sec": last_rate,
                "first_minute_mean_lag_s": first_lag,
                "last_minute_mean_lag_s": last_lag,
                "bytes_half_way": half,
                "bytes_at_end": final_bytes,
                "archive_files": archive_files,
                "samples": samples,
            })
        );
    }
    Ok(())
}

fn samples_for_plot(samples: &[Sample]) -> Vec<(f64, f64, f64)> {
    samples
        .iter()
        .map(|s| (s.t, s.bytes as f64 / 1048576.0, s.completed_per_sec))
        .collect()
}

/// The database's size now: the SQLite file and its WAL, or the schema's relations. On a
/// PostgreSQL server with autovacuum off, the schema is vacuumed first, as autovacuum would
/// have done by then (retention's deletes leave dead rows only a vacuum makes room from; see
/// docs/DESIGN.md, "Why warn when autovacuum is off?").
async fn db_bytes(db: &crate::common::BenchDb, backend: Backend) -> u64 {
    match backend {
        Backend::Sqlite => db
            .sqlite_path
            .as_deref()
            .and_then(crate::db::sqlite_size)
            .unwrap_or(0),
        Backend::Postgres => match &db.schema {
            Some(schema) => match crate::db::bench_schema(&db.database, schema).await {
                Ok(pg) => {
                    if pg.autovacuum().await.is_ok_and(|a| !(a.server && a.table))
                        && let Err(e) = pg.vacuum_analyze().await
                    {
                        tracing::warn!(error = %e, "soak vacuum failed");
                    }
                    pg.schema_bytes().await.unwrap_or(0)
                }
                Err(_) => 0,
            },
            None => 0,
        },
    }
}
