//! `campanile bench scale`: what it costs to store many schedules. For each `--schedules N`
//! (the same `--due` every time): database bytes per stored schedule before any occurrence, one
//! planner pass, and the resident memory of a real `campanile serve` process opened on that
//! database (after it is ready and has planned for a few seconds).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use crate::common::Common;
use crate::error::BenchError;

/// Arguments of `campanile bench scale`.
#[derive(Debug, Args)]
pub struct ScaleArgs {
    #[command(flatten)]
    common: Common,
    /// Stored schedules, one run per value (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "20000,2000000")]
    schedules: Vec<u32>,
    /// Schedules due at the timed planner pass (the same for every run).
    #[arg(long, default_value_t = 10_000)]
    due: u32,
    /// Seconds `serve` runs (planning, sweeping, answering) before its memory is read.
    #[arg(long, default_value_t = 5)]
    settle: u64,
}

/// Kills the child on every exit path.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn run(args: ScaleArgs) -> Result<(), BenchError> {
    if args.due == 0 || args.schedules.iter().any(|n| *n < args.due) {
        return Err(BenchError::usage(
            "--due must be positive and at most every --schedules value",
        ));
    }
    crate::error::block_on(async {
        let mut runs = Vec::new();
        for &n in &args.schedules {
            let (bench_db, mut run) =
                crate::plan::seed_and_pass(&args.common, n, args.due, 16, 5_000).await?;
            let database = match &bench_db.schema {
                // The schema rides in the URL's connection options.
                Some(schema) => {
                    let sep = if bench_db.database.contains('?') {
                        '&'
                    } else {
                        '?'
                    };
                    format!("{}{sep}options=-csearch_path%3D{schema}", bench_db.database)
                }
                None => bench_db.database.clone(),
            };
            let memory = tokio::task::spawn_blocking(move || serve_memory(&database, args.settle))
                .await
                .map_err(|e| BenchError::runtime(format!("measuring serve failed: {e}")))??;
            if memory.shards_held.is_some_and(|n| n < 1.0) {
                return Err(BenchError::runtime(
                    "the measured serve holds no planner shard: it plans nothing, and its memory \
                     would not reflect the stored schedules",
                ));
            }
            run["serve_rss_bytes"] = json!(memory.rss);
            run["serve_peak_rss_bytes"] = json!(memory.peak_rss);
            run["serve_shards_held"] = json!(memory.shards_held);
            bench_db.finish().await?;
            runs.push(run);
        }
        println!(
            "campanile bench scale — {:?}, {} due per pass",
            args.common.backend, args.due
        );
        println!(
            "{:>10}  {:>10}  {:>10}  {:>14}  {:>14}",
            "schedules", "B/sched", "pass s", "serve RSS MiB", "serve peak MiB"
        );
        let mib = |v: &serde_json::Value| {
            v.as_f64()
                .map_or("-".to_string(), |b| format!("{:.1}", b / 1_048_576.0))
        };
        for r in &runs {
            println!(
                "{:>10}  {:>10}  {:>10.3}  {:>14}  {:>14}",
                r["schedules"].as_u64().unwrap_or(0),
                r["db_bytes_per_schedule"]
                    .as_f64()
                    .map_or("-".to_string(), |b| format!("{b:.0}")),
                r["pass_seconds"].as_f64().unwrap_or(0.0),
                mib(&r["serve_rss_bytes"]),
                mib(&r["serve_peak_rss_bytes"]),
            );
        }
        let ratio = |key: &str| {
            let v: Vec<f64> = runs.iter().filter_map(|r| r[key].as_f64()).collect();
            match (v.first(), v.last()) {
                (Some(a), Some(b)) if *a > 0.0 && v.len() > 1 => Some(b / a),
                _ => None,
            }
        };
        let (pass_ratio, next_ratio, rss_ratio) = (
            ratio("pass_seconds"),
            ratio("next_pass_seconds"),
            ratio("serve_rss_bytes"),
        );
        if let Some(p) = pass_ratio {
            println!(
                "largest / smallest: planner pass {p:.2}x after the seed, {:.2}x the next hour; serve RSS {:.2}x",
                next_ratio.unwrap_or(0.0),
                rss_ratio.unwrap_or(0.0)
            );
        }
        if args.common.json {
            println!(
                "{}",
                json!({
                    "bench": "scale",
                    "backend": args.common.backend,
                    "due": args.due,
                    "runs": runs,
                    "pass_ratio_largest_to_smallest": pass_ratio,
                    "next_pass_ratio_largest_to_smallest": next_ratio,
                    "rss_ratio_largest_to_smallest": rss_ratio,
                })
            );
        }
        Ok(())
    })
}

/// Starts `campanile serve` on `database`, waits until it answers `/readyz`, lets it run for
/// `settle` seconds, and reads its resident memory (current and peak) from /proc and how
/// many shards it holds.
fn serve_memory(database: &str, settle: u64) -> Result<ServeReading, BenchError> {
    let exe = std::env::current_exe()
        .map_err(|e| BenchError::runtime(format!("cannot find this executable: {e}")))?;
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| BenchError::runtime(format!("no free port: {e}")))?
        .port();
    let child = Command::new(exe)
        .args(["serve", "--database", database, "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| BenchError::runtime(format!("cannot start serve: {e}")))?;
    let mut serve = Serve(child);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready(port) {
        if let Ok(Some(status)) = serve.0.try_wait() {
            return Err(BenchError::runtime(format!("serve exited early: {status}")));
        }
        if Instant::now() > deadline {
            return Err(BenchError::runtime("serve was not ready within 120 s"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(settle));
    let (current, peak) = rss(serve.0.id());
    Ok(ServeReading {
        rss: current,
        peak_rss: peak,
        shards_held: shards_held(port),
    })
}

/// What `serve_memory` read off the running `serve`.
struct ServeReading {
    rss: Option<u64>,
    peak_rss: Option<u64>,
    /// `campanile_planner_shards_held` from its `/metrics`: a node that holds no shard plans
    /// nothing, and its memory would say nothing about the stored schedules.
    shards_held: Option<f64>,
}

/// The node's `campanile_planner_shards_held` gauge, read from `GET /metrics`.
fn shards_held(port: u16) -> Option<f64> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.lines()
        .find_map(|l| l.strip_prefix("campanile_planner_shards_held "))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether `GET /readyz` answers 200.
fn ready(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

/// `(VmRSS, VmHWM)` in bytes, where /proc exists.
fn rss(pid: u32) -> (Option<u64>, Option<u64>) {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return (None, None);
    };
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}
