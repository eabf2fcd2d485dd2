//! `campanile bench store`: claim + complete throughput with the fencing checks on.
//!
//! For each batch size: a fresh tenant gets `--occurrences` due occurrences (not timed), then
//! `--workers` concurrent workers each claim a batch, then loop "finish the batch held as one
//! fenced batch and claim the next in the same call" (`Store::occurrence_finish_and_claim`)
//! until the queue is empty. The figure is occurrences claimed and completed per second, and
//! its ratio to the raw-SQL ceiling (`bench ceiling`) measured right after it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use campanile_store::*;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use jiff::SignedDuration;
use serde_json::json;

use crate::common::Common;
use crate::error::BenchError;

/// Arguments of `campanile bench store`.
#[derive(Debug, Args)]
pub struct StoreArgs {
    #[command(flatten)]
    common: Common,
    /// Occurrences per batch size.
    #[arg(long, default_value_t = 100_000)]
    occurrences: u32,
    /// Batch sizes to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
    batch: Vec<u32>,
    /// Concurrent workers.
    #[arg(long, default_value_t = 8)]
    workers: u32,
    #[command(flatten)]
    ceiling: crate::ceiling::CeilingFlag,
}

pub(crate) fn run(args: StoreArgs) -> Result<(), BenchError> {
    if args.occurrences == 0 || args.workers == 0 || args.batch.contains(&0) {
        return Err(BenchError::usage(
            "--occurrences, --workers and every --batch must be positive",
        ));
    }
    crate::error::block_on(run_async(args))
}

async fn run_async(args: StoreArgs) -> Result<(), BenchError> {
    let bench_db = args.common.open("bench.db").await?;
    let store = bench_db.store.clone();
    let mut results = Vec::new();
    for (i, &batch) in args.batch.iter().enumerate() {
        // The ceiling right before and right after each batch size, on the same backend and
        // machine.
        let rate = crate::common::bracketed(
            &args.common,
            args.ceiling.no_ceiling,
            args.occurrences,
            batch,
            args.workers,
            measure(&store, i, batch, &args),
        )
        .await?;
        results.push(rate);
    }
    bench_db.finish().await?;

    println!(
        "campanile bench store — {:?}, {} occurrences per batch size, {} workers",
        args.common.backend, args.occurrences, args.workers
    );
    crate::common::print_rates(&results);
    if args.common.json {
        let out = json!({
            "bench": "store",
            "backend": args.common.backend,
            "occurrences": args.occurrences,
            "workers": args.workers,
            "results": results,
        });
        println!("{out}");
    }
    Ok(())
}

async fn measure(
    store: &Arc<dyn Store>,
    round: usize,
    batch: u32,
    args: &StoreArgs,
) -> Result<serde_json::Value, BenchError> {
    let err = |e: StoreError| BenchError::runtime(format!("store error: {e}"));
    let tenant = store
        .tenant_create(TenantCreate {
            name: format!("bench-{round}-{}", uuid::Uuid::now_v7().simple()),
            now: None,
        })
        .await
        .map_err(err)?
        .id;
    crate::common::seed_due(store.as_ref(), tenant, "bench", args.occurrences).await?;

    let bar = ProgressBar::new(u64::from(args.occurrences));
    bar.set_style(
        ProgressStyle::with_template("batch {msg:>5} [{bar:40}] {pos}/{len} {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(batch.to_string());
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..args.workers {
        let (store, done, bar) = (store.clone(), done.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            let worker = format!("bench-{w}");
            let next = || OccurrenceClaim {
                max_bytes: None,
                tenant,
                queue: "bench".into(),
                worker_id: worker.clone(),
                max: batch,
                lease: Some(SignedDuration::from_secs(60)),
                key: None,
                now: None,
            };
            // As a worker whose report carries its next claim (as the ceiling's steps and the
            // HTTP workers of `bench throughput` do).
            let mut held = store.occurrence_claim(next()).await?;
            while !held.is_empty() {
                let items = held
                    .iter()
                    .map(|c| FinishItem {
                        lease: c.lease(),
                        finish: Finish::Succeeded {
                            result: Some("true".into()),
                        },
                    })
                    .collect();
                let report = OccurrenceFinishMany {
                    tenant,
                    worker_id: worker.clone(),
                    items,
                    now: None,
                };
                let (acks, claimed) = store.occurrence_finish_and_claim(report, next()).await?;
                let accepted = acks.iter().filter(|a| a.accepted()).count() as u64;
                done.fetch_add(accepted, Ordering::Relaxed);
                bar.inc(accepted);
                held = claimed?;
            }
            Ok::<(), StoreError>(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| BenchError::runtime(format!("worker task failed: {e}")))?
            .map_err(err)?;
    }
    let secs = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let completed = done.load(Ordering::Relaxed);
    if completed != u64::from(args.occurrences) {
        return Err(BenchError::runtime(format!(
            "only {completed} of {} occurrences were completed",
            args.occurrences
        )));
    }
    Ok(
        json!({ "batch": batch, "occurrences": completed, "seconds": secs, "occurrences_per_sec": completed as f64 / secs }),
    )
}
