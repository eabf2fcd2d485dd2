//! `campanile bench throughput`: claim + complete end to end through the real HTTP API.
//!
//! The API runs in this process on a loopback port; `--workers` SDK clients claim a batch, then
//! report each batch and claim the next in one `POST /v1/completions` until the queue is empty
//! (with `--separate-claims`, as a worker without that option does: a claim request, then one
//! `complete` per occurrence at batch 1 or one `POST /v1/completions` per batch).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use campanile_sdk::{ClaimKey, Client};
use campanile_server::{AppState, ServerConfig, router};
use campanile_store::*;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::common::Common;
use crate::error::BenchError;

/// Arguments of `campanile bench throughput`.
#[derive(Debug, Args)]
pub struct ThroughputArgs {
    #[command(flatten)]
    common: Common,
    /// Occurrences per batch size.
    #[arg(long, default_value_t = 20_000)]
    occurrences: u32,
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
    batch: Vec<u32>,
    /// Concurrent HTTP workers.
    #[arg(long, default_value_t = 8)]
    workers: u32,
    /// Claim in a request of its own instead of with the previous batch's outcomes.
    #[arg(long)]
    separate_claims: bool,
    #[command(flatten)]
    ceiling: crate::ceiling::CeilingFlag,
}

pub(crate) fn run(args: ThroughputArgs) -> Result<(), BenchError> {
    if args.occurrences == 0 || args.workers == 0 || args.batch.iter().any(|b| *b == 0 || *b > 1000)
    {
        return Err(BenchError::usage(
            "--occurrences and --workers must be positive; --batch values between 1 and 1000",
        ));
    }
    crate::error::block_on(run_async(args))
}

async fn run_async(args: ThroughputArgs) -> Result<(), BenchError> {
    let bench_db = args.common.open("bench.db").await?;
    let store = bench_db.store.clone();
    let cfg = ServerConfig::default();
    let app = router(AppState::new(Arc::clone(&store), &cfg, None), &cfg);
    let (url, server) = crate::common::serve(app).await?;

    let mut results = Vec::new();
    for (round, &batch) in args.batch.iter().enumerate() {
        // The ceiling right before and right after each batch size, on the same backend and
        // machine.
        let r = crate::common::bracketed(
            &args.common,
            args.ceiling.no_ceiling,
            args.occurrences,
            batch,
            args.workers,
            drain(
                &store,
                &url,
                round,
                args.occurrences,
                batch,
                args.workers,
                args.separate_claims,
            ),
        )
        .await?;
        results.push(r);
    }
    server.abort();
    bench_db.finish().await?;
    println!(
        "campanile bench throughput — {:?} over HTTP, {} occurrences per batch size, {} workers, {}",
        args.common.backend,
        args.occurrences,
        args.workers,
        if args.separate_claims {
            "claims separate from outcomes"
        } else {
            "each batch's outcomes and the next claim in one request"
        }
    );
    crate::common::print_rates(&results);
    if args.common.json {
        println!(
            "{}",
            json!({ "bench": "throughput", "backend": args.common.backend, "occurrences": args.occurrences, "workers": args.workers, "separate_claims": args.separate_claims, "results": results })
        );
    }
    Ok(())
}

/// One drain over the API at `url`: a fresh tenant gets `occurrences` due occurrences, then
/// `workers` SDK clients claim and complete them `batch` at a time until none is left.
async fn drain(
    store: &Arc<dyn Store>,
    url: &str,
    round: usize,
    occurrences: u32,
    batch: u32,
    workers: u32,
    separate: bool,
) -> Result<serde_json::Value, BenchError> {
    let (tenant, key) =
        crate::common::tenant_with_key(store.as_ref(), &format!("bench-{round}")).await?;
    crate::common::seed_due(store.as_ref(), tenant, "bench", occurrences).await?;
    let bar = ProgressBar::new(u64::from(occurrences));
    bar.set_style(
        ProgressStyle::with_template("HTTP batch {msg:>5} [{bar:40}] {pos}/{len} {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(batch.to_string());
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let client = Client::new(url, &key).map_err(|e| BenchError::runtime(e.to_string()))?;
        let (done, bar) = (done.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            let worker = format!("http-{w}");
            let mut claimed = client
                .claim_keyed("bench", &worker, batch, 60, Some(ClaimKey::new()))
                .await?;
            while !claimed.is_empty() {
                let accepted = if separate && batch == 1 {
                    let c = &claimed[0];
                    let n = client
                        .complete(c.id, &worker, c.epoch, json!(true))
                        .await
                        .map(|_| 1)?;
                    claimed = client
                        .claim_keyed("bench", &worker, batch, 60, Some(ClaimKey::new()))
                        .await?;
                    n
                } else {
                    let items = claimed
                        .iter()
                        .map(|c| json!({"occurrence_id": c.id, "epoch": c.epoch, "result": true}))
                        .collect();
                    let results = if separate {
                        let results = client.completions(&worker, items).await?;
                        claimed = client
                            .claim_keyed("bench", &worker, batch, 60, Some(ClaimKey::new()))
                            .await?;
                        results
                    } else {
                        let (results, next) = client
                            .completions_and_claim_keyed(
                                &worker,
                                items,
                                "bench",
                                batch,
                                60,
                                Some(ClaimKey::new()),
                            )
                            .await?;
                        claimed = next;
                        results
                    };
                    results.iter().filter(|o| o.outcome == "accepted").count() as u64
                };
                done.fetch_add(accepted, Ordering::Relaxed);
                bar.inc(accepted);
            }
            Ok::<(), campanile_sdk::SdkError>(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| BenchError::runtime(format!("worker task failed: {e}")))?
            .map_err(|e| BenchError::runtime(format!("HTTP worker failed: {e}")))?;
    }
    let secs = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let completed = done.load(Ordering::Relaxed);
    if completed != u64::from(occurrences) {
        return Err(BenchError::runtime(format!(
            "only {completed} of {} occurrences were completed",
            occurrences
        )));
    }
    Ok(
        json!({ "batch": batch, "occurrences": completed, "seconds": secs, "occurrences_per_sec": completed as f64 / secs }),
    )
}

/// `bench throughput` at one batch size on a database and API of its own, as another
/// benchmark measures it beside itself: occurrences claimed and completed per second.
pub(crate) async fn rate_beside(
    common: &Common,
    occurrences: u32,
    batch: u32,
    workers: u32,
    separate: bool,
) -> Result<f64, BenchError> {
    let bench_db = common.open("beside.db").await?;
    let store = bench_db.store.clone();
    let cfg = ServerConfig::default();
    let app = router(AppState::new(Arc::clone(&store), &cfg, None), &cfg);
    let (url, server) = crate::common::serve(app).await?;
    let r = drain(&store, &url, 0, occurrences, batch, workers, separate).await;
    server.abort();
    bench_db.finish().await?;
    r?["occurrences_per_sec"]
        .as_f64()
        .ok_or_else(|| BenchError::runtime("the throughput run gave no rate"))
}
