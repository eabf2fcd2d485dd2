//! The background work of a node: the planning loop and the recovery sweep, side by side.

use std::sync::Arc;
use std::time::Duration;

use campanile_store::{BacklogGet, LeaseSweep, Store};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::{Planner, PlannerConfig, PlannerError};

/// Recovery sweep settings.
#[derive(Debug, Clone, Copy)]
pub struct SweepConfig {
    /// Pause between sweeps when there was nothing to do.
    pub interval: Duration,
    /// Occurrences per sweep transaction.
    pub batch: u32,
}

impl Default for SweepConfig {
    fn default() -> Self {
        SweepConfig {
            interval: Duration::from_millis(500),
            batch: 1_000,
        }
    }
}

/// A running planner and sweeper; stop them with [`Engine::shutdown`].
#[derive(Debug)]
pub struct Engine {
    planner: Arc<Planner>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Engine {
    /// Starts the planning loop and the recovery sweep on the current tokio runtime.
    pub fn start(store: Arc<dyn Store>, planner: PlannerConfig, sweep: SweepConfig) -> Engine {
        let planner = Arc::new(Planner::new(store.clone(), planner));
        Engine::spawn(store, planner, sweep)
    }

    /// Runs a first planning pass, then starts as [`Engine::start`] does. A node calls this
    /// before it serves claims: the pass's outage check records as `MISSED` what the misfire
    /// policy says of the occurrences planned before an outage of the whole control plane, and
    /// the pass plans the instants not planned yet with the same `now`, so that the two agree
    /// on what is late and nothing stale is handed out first.
    ///
    /// # Errors
    ///
    /// [`PlannerError`] if the first pass fails (the store is unreachable).
    pub async fn start_after_first_pass(
        store: Arc<dyn Store>,
        planner: PlannerConfig,
        sweep: SweepConfig,
    ) -> Result<Engine, PlannerError> {
        let planner = Arc::new(Planner::new(store.clone(), planner));
        planner.tick(None).await?;
        Ok(Engine::spawn(store, planner, sweep))
    }

    fn spawn(store: Arc<dyn Store>, planner: Arc<Planner>, sweep: SweepConfig) -> Engine {
        let (stop, rx) = watch::channel(false);
        let tasks = vec![
            tokio::spawn(planner.clone().run(rx.clone())),
            tokio::spawn(sweeper(store.clone(), sweep, rx.clone())),
            tokio::spawn(backlog_gauges(store, rx)),
        ];
        Engine {
            planner,
            stop,
            tasks,
        }
    }

    /// The planner (to [`Planner::notify`] it after creating a schedule).
    pub fn planner(&self) -> &Arc<Planner> {
        &self.planner
    }

    /// Stops planning and sweeping, releases the shard leases, and waits for both loops.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Re-readies (or buries) occurrences whose lease expired, in bounded batches, until told to
/// stop. Keeps sweeping without pause while there is a backlog.
async fn sweeper(store: Arc<dyn Store>, cfg: SweepConfig, mut stop: watch::Receiver<bool>) {
    loop {
        if *stop.borrow() {
            return;
        }
        let pause = match store
            .lease_sweep(LeaseSweep {
                limit: cfg.batch,
                now: None,
            })
            .await
        {
            Ok(r) if r.expired() >= u64::from(cfg.batch) => {
                record_sweep(r);
                Duration::ZERO
            }
            Ok(r) => {
                record_sweep(r);
                if r.expired() > 0 {
                    tracing::info!(
                        requeued = r.requeued,
                        dead = r.dead,
                        canceled = r.canceled,
                        "expired leases recovered"
                    );
                }
                cfg.interval
            }
            Err(e) => {
                tracing::warn!(error = %e, "recovery sweep failed; retrying");
                Duration::from_secs(1)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => {}
        }
    }
}

/// How often the backlog gauges are refreshed.
const BACKLOG_EVERY: Duration = Duration::from_secs(10);

/// Samples the due backlog, its oldest age and the outbox backlog into gauges.
async fn backlog_gauges(store: Arc<dyn Store>, mut stop: watch::Receiver<bool>) {
    loop {
        if *stop.borrow() {
            return;
        }
        // One instant for the sample and its age.
        let sampled = match store.store_now().await {
            Ok(now) => store
                .backlog(BacklogGet { now: Some(now) })
                .await
                .map(|b| (b, now)),
            Err(e) => Err(e),
        };
        match sampled {
            Ok((b, now)) => {
                metrics::gauge!("campanile_due_backlog").set(b.due as f64);
                let age = b.oldest_due_at.map_or(0.0, |t| {
                    (now.as_millisecond() - t.as_millisecond()).max(0) as f64 / 1000.0
                });
                metrics::gauge!("campanile_due_backlog_oldest_age_seconds").set(age);
                metrics::gauge!("campanile_outbox_backlog").set(b.outbox_pending as f64);
                // The backlog gauges keep their last value while sampling fails (a database
                // outage); this says how old they are.
                metrics::gauge!("campanile_backlog_sampled_timestamp_seconds")
                    .set(now.as_millisecond() as f64 / 1000.0);
            }
            Err(e) => {
                tracing::warn!(error = %e, "sampling the backlog failed; retrying");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(BACKLOG_EVERY) => {}
            _ = stop.changed() => {}
        }
    }
}

fn record_sweep(r: campanile_store::SweepReport) {
    if r.expired() > 0 {
        metrics::counter!("campanile_leases_expired_total").increment(r.expired());
        metrics::counter!("campanile_leases_recovered_total").increment(r.requeued);
        metrics::counter!("campanile_occurrences_dead_total").increment(r.dead);
        metrics::counter!("campanile_occurrences_canceled_total").increment(r.canceled);
    }
}
