//! `campanile bench relay`: how fast the relay moves due occurrences with an external target
//! into NATS JetStream.
//!
//! `--occurrences` due occurrences routed to a fresh subject (their outbox rows written as the
//! planner writes them; not timed), a fresh stream over that subject, then `--relays` relays
//! claiming `--batch` at a time, publishing, awaiting the stream's acknowledgements and
//! recording each occurrence as SUCCEEDED, fenced like a worker. The figure is occurrences
//! published, acknowledged and recorded per second; the stream is then checked to hold exactly
//! one message per occurrence, and deleted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use campanile_core::Target;
use campanile_relay::{Relay, RelayConfig};
use campanile_store::TenantCreate;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::common::Common;
use crate::error::BenchError;

/// A relay that publishes nothing for this long ends the run with an error (another relay
/// may still be finishing the last batches; a batch's acknowledgements wait at most 10 s).
const STALL: Duration = Duration::from_secs(30);

/// Arguments of `campanile bench relay`.
#[derive(Debug, Args)]
pub struct RelayArgs {
    #[command(flatten)]
    common: Common,
    /// NATS server with JetStream (e.g. nats://127.0.0.1:4222).
    #[arg(long, env = "CAMPANILE_NATS_URL")]
    nats_url: String,
    /// Due occurrences to relay.
    #[arg(long, default_value_t = 100_000)]
    occurrences: u32,
    /// Concurrent relays (each one as a node of its own).
    #[arg(long, default_value_t = 1)]
    relays: u32,
    /// Occurrences per relay claim.
    #[arg(long, default_value_t = 500)]
    batch: u32,
}

pub(crate) fn run(args: RelayArgs) -> Result<(), BenchError> {
    if args.occurrences == 0 || args.relays == 0 || args.batch == 0 || args.batch > 10_000 {
        return Err(BenchError::usage(
            "--occurrences and --relays must be positive, --batch 1..=10000",
        ));
    }
    crate::error::block_on(run_async(args))
}

async fn run_async(args: RelayArgs) -> Result<(), BenchError> {
    let client = campanile_relay::connect(&args.nats_url)
        .await
        .map_err(|e| BenchError::nats(&e))?;
    let bench_db = args.common.open("bench.db").await?;
    let js = jetstream::new(client.clone());
    let id = uuid::Uuid::now_v7().simple().to_string();
    let subject = format!("campanile.bench.{id}.jobs");
    let stream = format!("CAMPANILE_BENCH_{id}");
    let created = js
        .create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![subject.clone()],
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await;
    if let Err(e) = created {
        let _ = bench_db.finish().await;
        return Err(BenchError::runtime(format!(
            "cannot create the bench stream: {e}"
        )));
    }
    let outcome = measure(&args, &bench_db, &client, &js, &stream, &subject).await;
    // Clean up whatever happened; the measurement's error, if any, is the one reported.
    let _ = js.delete_stream(&stream).await;
    let finished = bench_db.finish().await;
    let figures = outcome?;
    finished?;

    println!(
        "campanile bench relay — {:?}, {} occurrences, {} relay(s), batch {}",
        args.common.backend, args.occurrences, args.relays, args.batch
    );
    println!(
        "relayed {} in {:.3} s: {:.0} occurrences/s; {} messages in the stream, {} duplicates, {} failed publishes",
        figures["relayed"],
        figures["seconds"].as_f64().unwrap_or(0.0),
        figures["occurrences_per_sec"].as_f64().unwrap_or(0.0),
        figures["stream_messages"],
        figures["duplicates"],
        figures["failed"],
    );
    if args.common.json {
        println!("{figures}");
    }
    Ok(())
}

async fn measure(
    args: &RelayArgs,
    bench_db: &crate::common::BenchDb,
    client: &async_nats::Client,
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
) -> Result<serde_json::Value, BenchError> {
    let store = bench_db.store.clone();
    let err = |e: campanile_store::StoreError| BenchError::runtime(format!("store error: {e}"));
    let tenant = store
        .tenant_create(TenantCreate {
            name: format!("bench-relay-{}", uuid::Uuid::now_v7().simple()),
            now: None,
        })
        .await
        .map_err(err)?
        .id;
    let route = Target::Nats {
        subject: subject.to_string(),
    }
    .queue();
    crate::common::seed_due(store.as_ref(), tenant, &route, args.occurrences).await?;

    let total = u64::from(args.occurrences);
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("relay [{bar:40}] {pos}/{len} {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let published = Arc::new(AtomicU64::new(0));
    let duplicates = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for r in 0..args.relays {
        let mut cfg = RelayConfig::new(format!("bench-relay-{r}"));
        cfg.batch = args.batch;
        let relay = Relay::new(Arc::clone(&store), client.clone(), cfg);
        let (published, duplicates, failed, bar) = (
            published.clone(),
            duplicates.clone(),
            failed.clone(),
            bar.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut last_progress = Instant::now();
            while published.load(Ordering::Relaxed) < total {
                let report = relay.step(None).await.map_err(|e| e.to_string())?;
                if report.paused {
                    return Err("the connection to NATS was lost".to_string());
                }
                if report.stale > 0 {
                    return Err(format!(
                        "{} completions refused as stale (a lease passed mid-batch)",
                        report.stale
                    ));
                }
                if report.published > 0 {
                    last_progress = Instant::now();
                } else if last_progress.elapsed() > STALL {
                    return Err(format!(
                        "nothing relayed for {} s with {} of {total} done",
                        STALL.as_secs(),
                        published.load(Ordering::Relaxed)
                    ));
                }
                published.fetch_add(report.published, Ordering::Relaxed);
                duplicates.fetch_add(report.duplicates, Ordering::Relaxed);
                failed.fetch_add(report.failed, Ordering::Relaxed);
                bar.inc(report.published);
                if report.failed > 0 || report.unrecorded > 0 {
                    return Err(format!(
                        "{} publishes failed, {} outcomes unrecorded",
                        report.failed, report.unrecorded
                    ));
                }
                if report.claimed == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| BenchError::runtime(format!("relay task failed: {e}")))?
            .map_err(|e| BenchError::runtime(format!("relay: {e}")))?;
    }
    let secs = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let relayed = published.load(Ordering::Relaxed);
    let in_stream = js
        .get_stream(stream)
        .await
        .map_err(|e| BenchError::runtime(format!("cannot read the bench stream: {e}")))?
        .info()
        .await
        .map_err(|e| BenchError::runtime(format!("cannot read the bench stream: {e}")))?
        .state
        .messages;
    if relayed != total || in_stream != total {
        return Err(BenchError::runtime(format!(
            "{relayed} of {total} occurrences relayed, {in_stream} messages in the stream"
        )));
    }
    Ok(json!({
        "bench": "relay",
        "backend": args.common.backend,
        "occurrences": total,
        "relays": args.relays,
        "batch": args.batch,
        "relayed": relayed,
        "seconds": secs,
        "occurrences_per_sec": relayed as f64 / secs,
        "stream_messages": in_stream,
        "duplicates": duplicates.load(Ordering::Relaxed),
        "failed": failed.load(Ordering::Relaxed),
    }))
}
