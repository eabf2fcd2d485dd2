//! `campanile bench peak`: the top of the minute. N cron schedules all due at the same instant,
//! the real planner running, and SDK-style workers claiming and completing over the real HTTP
//! API. Reports schedule lag (p50/p99 from the planner's own histogram, max measured), claim
//! lag (`claimed_at − available_at`, the server's instants, per occurrence), the end-to-end lag
//! (the instant a worker holds the occurrence, minus its planned instant), time to drain and
//! occurrences per second. Each worker reports a batch and claims its next in one request, as
//! the SDK's worker does (`--separate-claims`: a claim request, then a report).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use campanile_calendar::{DstFold, DstGap};
use campanile_core::ScheduleId;
use campanile_planner::{Engine, PlannerConfig, SweepConfig, shard_of};
use campanile_sdk::{ClaimKey, Client};
use campanile_server::{AppState, ServerConfig, router};
use campanile_store::*;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use jiff::Timestamp;
use serde_json::json;

use crate::common::Common;
use crate::error::BenchError;

/// Arguments of `campanile bench peak`.
#[derive(Debug, Args)]
pub struct PeakArgs {
    #[command(flatten)]
    common: Common,
    /// Schedules, all due at the same instant.
    #[arg(long, default_value_t = 500_000)]
    schedules: u32,
    /// Concurrent HTTP workers.
    #[arg(long, default_value_t = 8)]
    workers: u32,
    /// Occurrences per claim (and per batched completion).
    #[arg(long, default_value_t = 1000)]
    batch: u32,
    /// Seconds from now to the due instant (default: the first top of a minute at least 15 s
    /// plus a second per 10,000 schedules away). Short values suit smoke runs.
    #[arg(long)]
    due_in: Option<i64>,
    /// Also draw the drain curve and the claim-lag histogram to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<std::path::PathBuf>,
    /// Claim in a request of its own instead of with the previous batch's outcomes.
    #[arg(long)]
    separate_claims: bool,
    #[command(flatten)]
    ceiling: crate::ceiling::CeilingFlag,
    /// Do not run `bench throughput` beside the peak (at the same occurrence count, workers
    /// and batch; no `ratio_to_throughput`).
    #[arg(long)]
    no_throughput: bool,
    /// A noisy neighbour: a second tenant with 10 schedules due every second and a worker of
    /// its own, beside the peak; reports its claim and schedule lag before the due instant
    /// (idle: from two seconds after the API answers) and during the drain.
    #[arg(long)]
    neighbour: bool,
}

/// The neighbour's samples: (claimed at, claim lag s, schedule lag s).
type Samples = Arc<Mutex<Vec<(Timestamp, f64, f64)>>>;

/// p50/p99/max of the neighbour's lags in `[from, to)`.
fn neighbour_phase(
    samples: &[(Timestamp, f64, f64)],
    from: Timestamp,
    to: Timestamp,
) -> serde_json::Value {
    let mut claim: Vec<f64> = samples
        .iter()
        .filter(|s| s.0 >= from && s.0 < to)
        .map(|s| s.1)
        .collect();
    let mut sched: Vec<f64> = samples
        .iter()
        .filter(|s| s.0 >= from && s.0 < to)
        .map(|s| s.2)
        .collect();
    claim.sort_by(f64::total_cmp);
    sched.sort_by(f64::total_cmp);
    json!({
        "claims": claim.len(),
        "claim_lag_seconds": {"p50": pct(&claim, 0.5), "p99": pct(&claim, 0.99), "max": claim.last().copied().unwrap_or(0.0)},
        "schedule_lag_seconds": {"p50": pct(&sched, 0.5), "p99": pct(&sched, 0.99), "max": sched.last().copied().unwrap_or(0.0)},
    })
}

/// Quantiles of a Prometheus histogram in the text format, summed over its label sets: for
/// each `q`, the upper bound of the bucket that holds it (`None` past the last finite bucket);
/// and the number of observations.
fn bucket_quantiles(text: &str, name: &str, qs: &[f64]) -> (u64, Vec<Option<f64>>) {
    let prefix = format!("{name}_bucket{{");
    let mut by_le: std::collections::BTreeMap<u64, (f64, f64)> = Default::default();
    for line in text.lines().filter(|l| l.starts_with(&prefix)) {
        let Some(le) = line
            .split("le=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|v| {
                v.parse::<f64>()
                    .ok()
                    .or((v == "+Inf").then_some(f64::INFINITY))
            })
        else {
            continue;
        };
        let Some(n) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        // Keyed by the bound's bits: finite positive bounds (and +Inf) sort as their values.
        by_le.entry(le.to_bits()).or_insert((le, 0.0)).1 += n;
    }
    let total = by_le.values().last().map_or(0.0, |(_, n)| *n);
    let quantiles = qs
        .iter()
        .map(|q| {
            by_le
                .values()
                .find(|(_, n)| *n >= q * total && total > 0.0)
                .and_then(|(le, _)| le.is_finite().then_some(*le))
        })
        .collect();
    (total as u64, quantiles)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub(crate) fn run(args: PeakArgs) -> Result<(), BenchError> {
    if args.schedules == 0
        || args.workers == 0
        || !(1..=1000).contains(&args.batch)
        || args.due_in.is_some_and(|d| d < 1)
    {
        return Err(BenchError::usage(
            "--schedules and --workers must be positive, --batch 1..=1000, --due-in at least 1",
        ));
    }
    crate::error::block_on(run_async(args))
}

async fn run_async(args: PeakArgs) -> Result<(), BenchError> {
    let err = |e: StoreError| BenchError::runtime(format!("store error: {e}"));
    // The ceiling before the peak (and again after it), at the same count, batch and workers.
    let ceiling_before = crate::common::ceiling_before(
        &args.common,
        args.ceiling.no_ceiling,
        args.schedules,
        args.batch,
        args.workers,
    )
    .await?;
    let bench_db = args.common.open("peak.db").await?;
    let store = bench_db.store.clone();
    let (tenant, key) = crate::common::tenant_with_key(store.as_ref(), "peak").await?;

    // The due instant: the top of the next minute (or --due-in seconds from now).
    let now = Timestamp::now();
    let due = match args.due_in {
        Some(s) => Timestamp::from_second(now.as_second() + s)
            .map_err(|e| BenchError::runtime(e.to_string()))?,
        None => {
            // Far enough for the schedules to be made and planned before it (about 10k/s
            // each on a slow hour): a peak planned at its instant measures planning, not
            // dispatch, and production schedules exist long before their instant.
            let lead = 15 + i64::from(args.schedules) / 10_000;
            let mut top = (now.as_second() / 60 + 1) * 60;
            while top - now.as_second() < lead {
                top += 60;
            }
            Timestamp::from_second(top).map_err(|e| BenchError::runtime(e.to_string()))?
        }
    };
    let spec = crate::common::bench_spec(
        Timing::Cron {
            // Daily at the due instant, as top-of-the-hour jobs are: the peak is that one
            // instant, and the next fire is far outside the planning horizon.
            expr: {
                let t = due.as_second().rem_euclid(86_400);
                format!("{} {} {} * * *", t % 60, t / 60 % 60, t / 3600)
            },
            timezone: "UTC".into(),
            dst_gap: DstGap::Skip,
            dst_fold: DstFold::Once,
        },
        "peak",
    );
    let shards = 16;
    let bar = ProgressBar::new(u64::from(args.schedules));
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message("seeding");
    let mut made = 0u32;
    while made < args.schedules {
        let chunk = (args.schedules - made).min(50_000);
        let items = (0..chunk)
            .map(|_| {
                let id = ScheduleId(uuid::Uuid::now_v7());
                (id, shard_of(id, shards), Some(due))
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
        made += chunk;
        bar.inc(u64::from(chunk));
    }
    bar.finish_and_clear();
    let seeded_at = Timestamp::now();
    eprintln!(
        "seeded in {:.3} s; {:.3} s before the due instant",
        (seeded_at.as_millisecond() - now.as_millisecond()) as f64 / 1000.0,
        (due.as_millisecond() - seeded_at.as_millisecond()) as f64 / 1000.0
    );

    // The neighbour: its own tenant, key and schedules (every second, from now on).
    let neighbour = if args.neighbour {
        let (nb, nb_key) = crate::common::tenant_with_key(store.as_ref(), "neighbour").await?;
        let anchor = Timestamp::from_second(Timestamp::now().as_second() + 1)
            .map_err(|e| BenchError::runtime(e.to_string()))?;
        // Ten schedules 105 ms apart: the neighbour's claims sample ten phases of the second
        // and of its worker's 50 ms cadence (5 ms apart), not one instant ten times over (its
        // p99 would be the worst of a few seconds' claims).
        for i in 0..10 {
            let at = anchor
                .checked_add(jiff::SignedDuration::from_millis(105 * i))
                .map_err(|e| BenchError::runtime(e.to_string()))?;
            let every = crate::common::bench_spec(
                Timing::Every {
                    period: jiff::SignedDuration::from_secs(1),
                    anchor: at,
                },
                "nb",
            );
            let id = ScheduleId(uuid::Uuid::now_v7());
            store
                .schedule_create_many(ScheduleCreateMany {
                    tenant: nb,
                    spec: every,
                    items: vec![(id, shard_of(id, shards), Some(at))],
                    now: None,
                })
                .await
                .map_err(err)?;
        }
        Some(nb_key)
    } else {
        None
    };

    // The real planner (and sweep), and the real API on a loopback port.
    let mut pcfg = PlannerConfig::new("peak-node");
    pcfg.shards = shards;
    // As `serve` does: the first pass before the API answers (claims wait for it).
    // The metrics recorder first, so that the first pass's schedule lags are recorded too.
    campanile_server::install_metrics();
    let engine = Engine::start_after_first_pass(Arc::clone(&store), pcfg, SweepConfig::default())
        .await
        .map_err(|e| BenchError::runtime(format!("first planning pass: {e}")))?;
    let cfg = ServerConfig {
        shards,
        ..ServerConfig::default()
    };
    let app = router(
        AppState::new(Arc::clone(&store), &cfg, Some(engine.planner().clone())),
        &cfg,
    );
    let (url, server) = crate::common::serve(app).await?;
    // The neighbour's idle baseline starts two seconds after the API answers: before, its
    // runs wait for the node's first planning pass over the whole seed.
    let idle_from = Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(2))
        .unwrap_or(due);

    // When was everything planned? When the earliest queue position has moved past the due
    // instant, every schedule's occurrence for it exists.
    let planned_at: Arc<Mutex<Option<Timestamp>>> = Arc::default();
    {
        let (store, planned_at) = (Arc::clone(&store), planned_at.clone());
        let all: Vec<i32> = (0..shards as i32).collect();
        tokio::spawn(async move {
            loop {
                if let Ok(next) = store
                    .schedule_next_due(ScheduleNextDue {
                        shards: all.to_vec(),
                    })
                    .await
                    && next.is_none_or(|n| n > due)
                {
                    *planned_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Timestamp::now());
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        });
    }

    // The neighbour's worker: claims every 50 ms (from the start of one claim to the start of
    // the next, unless a claim and its report take longer), completes at once, records its
    // lags. A cadence that began after each report would add the report's answer time to the
    // claim lag of everything due meanwhile.
    let nb_samples: Samples = Arc::default();
    let nb_task = neighbour.map(|nb_key| {
        let samples = nb_samples.clone();
        let url = url.clone();
        tokio::spawn(async move {
            let Ok(client) = Client::new(&url, &nb_key) else {
                return;
            };
            let mut cadence = tokio::time::interval(std::time::Duration::from_millis(50));
            cadence.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                cadence.tick().await;
                if let Ok(got) = client.claim("nb", "neighbour", 50, 60).await
                    && !got.is_empty()
                {
                    {
                        let mut l = samples.lock().unwrap_or_else(|e| e.into_inner());
                        for c in &got {
                            if let (Some(at), Some(avail)) = (c.claimed_at, c.available_at) {
                                let secs = |a: Timestamp, b: Timestamp| {
                                    (a.as_millisecond() - b.as_millisecond()).max(0) as f64 / 1000.0
                                };
                                l.push((at, secs(at, avail), secs(at, c.scheduled_for)));
                            }
                        }
                    }
                    let items = got
                        .iter()
                        .map(|c| json!({"occurrence_id": c.id, "epoch": c.epoch, "result": true}))
                        .collect();
                    let _ = client.completions("neighbour", items).await;
                }
            }
        })
    });

    let bar = ProgressBar::new(u64::from(args.schedules));
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message("draining");
    // Per occurrence: end to end (a worker holds it, minus its planned instant) and the
    // claim lag (`claimed_at − available_at`, both the server's).
    let lags: Arc<Mutex<Vec<f64>>> =
        Arc::new(Mutex::new(Vec::with_capacity(args.schedules as usize)));
    let claim_lags: Arc<Mutex<Vec<f64>>> =
        Arc::new(Mutex::new(Vec::with_capacity(args.schedules as usize)));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..args.workers {
        let client = Client::new(&url, &key).map_err(|e| BenchError::runtime(e.to_string()))?;
        let claim_lags = claim_lags.clone();
        let (lags, bar, total, batch) = (
            lags.clone(),
            bar.clone(),
            args.schedules as usize,
            args.batch,
        );
        let separate = args.separate_claims;
        tasks.push(tokio::spawn(async move {
            let worker = format!("peak-{w}");
            // What this worker holds, and when it got it; each batch's outcomes carry the
            // claim of the next (unless --separate-claims).
            let mut held: Vec<campanile_sdk::Claimed> = Vec::new();
            let mut got_at = Timestamp::now();
            loop {
                if held.is_empty() {
                    if lags.lock().unwrap_or_else(|e| e.into_inner()).len() >= total {
                        return Ok::<(), campanile_sdk::SdkError>(());
                    }
                    held = match client
                        .claim_keyed("peak", &worker, batch, 60, Some(ClaimKey::new()))
                        .await
                    {
                        Ok(c) => c,
                        // The node is not handing out work for a moment (its liveness mark
                        // lapsed): as a worker would, wait and ask again.
                        Err(campanile_sdk::SdkError::Api { status: 503, .. }) => {
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    got_at = Timestamp::now();
                    if held.is_empty() {
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                        continue;
                    }
                }
                let items = held
                    .iter()
                    .map(|c| json!({"occurrence_id": c.id, "epoch": c.epoch, "result": true}))
                    .collect();
                let (outcomes, next) = if separate {
                    (client.completions(&worker, items).await?, Vec::new())
                } else {
                    client
                        .completions_and_claim_keyed(
                            &worker,
                            items,
                            "peak",
                            batch,
                            60,
                            Some(ClaimKey::new()),
                        )
                        .await?
                };
                let next_at = Timestamp::now();
                let accepted = outcomes.iter().filter(|o| o.outcome == "accepted").count();
                {
                    let mut l = claim_lags.lock().unwrap_or_else(|e| e.into_inner());
                    for c in &held {
                        if let (Some(at), Some(avail)) = (c.claimed_at, c.available_at) {
                            l.push(
                                (at.as_millisecond() - avail.as_millisecond()).max(0) as f64
                                    / 1000.0,
                            );
                        }
                    }
                }
                {
                    let mut l = lags.lock().unwrap_or_else(|e| e.into_inner());
                    for c in &held {
                        l.push(
                            (got_at.as_millisecond() - c.scheduled_for.as_millisecond()) as f64
                                / 1000.0,
                        );
                    }
                }
                bar.inc(accepted as u64);
                held = next;
                got_at = next_at;
            }
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| BenchError::runtime(format!("worker task failed: {e}")))?
            .map_err(|e| BenchError::runtime(format!("HTTP worker failed: {e}")))?;
    }
    let drained_at = Timestamp::now();
    bar.finish_and_clear();
    if let Some(t) = nb_task {
        t.abort();
    }
    let nb = args.neighbour.then(|| {
        let samples = nb_samples.lock().unwrap_or_else(|e| e.into_inner()).clone();
        json!({
            "idle": neighbour_phase(&samples, idle_from, due),
            "during_peak": neighbour_phase(&samples, due, drained_at),
        })
    });
    // The planner's own schedule-lag histogram (what Prometheus would scrape from this node):
    // p50 and p99 to its buckets' resolution.
    let (lag_count, lag_q) = bucket_quantiles(
        &campanile_server::metrics_text(),
        "campanile_schedule_lag_seconds",
        &[0.5, 0.99],
    );
    let _ = started;
    engine.shutdown().await;
    server.abort();
    bench_db.finish().await?;

    let mut lags = lags.lock().unwrap_or_else(|e| e.into_inner()).clone();
    lags.sort_by(f64::total_cmp);
    let mut claim_lags = claim_lags.lock().unwrap_or_else(|e| e.into_inner()).clone();
    claim_lags.sort_by(f64::total_cmp);
    let planned = *planned_at.lock().unwrap_or_else(|e| e.into_inner());
    // Everything was visible to workers at max(planned, due): the schedule lag of the batch.
    let schedule_lag =
        planned.map(|p| ((p.as_millisecond() - due.as_millisecond()).max(0)) as f64 / 1000.0);
    let drain = (drained_at.as_millisecond() - due.as_millisecond()) as f64 / 1000.0;
    let rate = lags.len() as f64 / drain.max(1e-9);
    // The ceiling after the peak: the ratio is to the mean of the two.
    let ceiling = crate::common::ceiling_after(
        &args.common,
        ceiling_before,
        args.schedules,
        args.batch,
        args.workers,
    )
    .await?;
    // `bench throughput` after the peak, at the same count, batch and workers: what the
    // drain is judged against.
    let throughput = if args.no_throughput {
        None
    } else {
        Some(
            crate::throughput::rate_beside(
                &args.common,
                args.schedules,
                args.batch,
                args.workers,
                args.separate_claims,
            )
            .await?,
        )
    };
    let mut out = json!({
        "neighbour": nb,
        "throughput_occurrences_per_sec": throughput,
        "ratio_to_throughput": throughput.map(|t| rate / t.max(1e-9)),
        "bench": "peak",
        "backend": args.common.backend,
        "schedules": args.schedules,
        "workers": args.workers,
        "batch": args.batch,
        "separate_claims": args.separate_claims,
        "schedule_lag_seconds_max": schedule_lag,
        // p50/p99: upper bounds of the planner histogram's buckets (null: past the last
        // one); max: when the last of them was visible, measured.
        "schedule_lag_seconds": { "p50": lag_q[0], "p99": lag_q[1], "max": schedule_lag, "observed": lag_count },
        "claim_lag_seconds": { "p50": pct(&claim_lags, 0.5), "p99": pct(&claim_lags, 0.99), "max": claim_lags.last().copied().unwrap_or(0.0) },
        "end_to_end_lag_seconds": { "p50": pct(&lags, 0.5), "p99": pct(&lags, 0.99), "max": lags.last().copied().unwrap_or(0.0) },
        "drain_seconds": drain,
        "occurrences_per_sec": rate,
        "claimed": lags.len(),
    });
    if let Some(ceiling) = ceiling {
        ceiling.record(&mut out);
    }
    println!(
        "campanile bench peak — {:?}, {} schedules due at {due}, {} workers, batch {}",
        args.common.backend, args.schedules, args.workers, args.batch
    );
    let bound = |q: Option<f64>| q.map_or("over 3600 s".to_string(), |b| format!("≤ {b} s"));
    println!(
        "schedule lag: p50 {}, p99 {} (the planner's histogram, {lag_count} observed); max (all planned by): {}",
        bound(lag_q[0]),
        bound(lag_q[1]),
        schedule_lag.map_or("not measured".to_string(), |l| format!(
            "{l:.3} s after the due instant"
        ))
    );
    println!(
        "claim lag (claimed_at − available_at): p50 {:.3} s, p99 {:.3} s, max {:.3} s",
        pct(&claim_lags, 0.5),
        pct(&claim_lags, 0.99),
        claim_lags.last().copied().unwrap_or(0.0)
    );
    println!(
        "end to end (a worker holds it − its instant): p50 {:.3} s, p99 {:.3} s, max {:.3} s",
        pct(&lags, 0.5),
        pct(&lags, 0.99),
        lags.last().copied().unwrap_or(0.0)
    );
    println!(
        "drained {} in {:.3} s after the due instant: {:.0} occurrences/s",
        lags.len(),
        drain,
        lags.len() as f64 / drain.max(1e-9)
    );
    if let Some(t) = throughput {
        println!(
            "bench throughput beside it (same count, workers and batch): {t:.0} occurrences/s; \
             the drain ran at {:.2} of it",
            rate / t.max(1e-9)
        );
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "campanile bench peak: {} schedules, {:?}, {} workers, batch {}",
            args.schedules, args.common.backend, args.workers, args.batch
        );
        std::fs::write(path, crate::plot::lag_svg(&title, &lags))
            .map_err(|e| BenchError::runtime(format!("cannot write {}: {e}", path.display())))?;
        println!("plot: {}", path.display());
    }
    if args.common.json {
        println!("{out}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::bucket_quantiles;

    #[test]
    fn quantiles_are_read_from_the_buckets_summed_over_label_sets() {
        let text = "\
# TYPE campanile_schedule_lag_seconds histogram
campanile_schedule_lag_seconds_bucket{tenant_class=\"default\",le=\"0.05\"} 90
campanile_schedule_lag_seconds_bucket{tenant_class=\"default\",le=\"1\"} 97
campanile_schedule_lag_seconds_bucket{tenant_class=\"default\",le=\"+Inf\"} 98
campanile_schedule_lag_seconds_bucket{tenant_class=\"pro\",le=\"0.05\"} 0
campanile_schedule_lag_seconds_bucket{tenant_class=\"pro\",le=\"1\"} 1
campanile_schedule_lag_seconds_bucket{tenant_class=\"pro\",le=\"+Inf\"} 2
campanile_schedule_lag_seconds_sum{tenant_class=\"pro\"} 12
campanile_claim_lag_seconds_bucket{tenant_class=\"pro\",le=\"0.05\"} 1000
";
        let (n, q) = bucket_quantiles(
            text,
            "campanile_schedule_lag_seconds",
            &[0.5, 0.9, 0.98, 0.99],
        );
        assert_eq!(n, 100);
        // 90 of 100 within 0.05 s, 98 within 1 s, the last 2 beyond every finite bucket.
        assert_eq!(q, [Some(0.05), Some(0.05), Some(1.0), None]);
        let (n, q) = bucket_quantiles("", "campanile_schedule_lag_seconds", &[0.5]);
        assert_eq!((n, q), (0, vec![None]));
    }
}
