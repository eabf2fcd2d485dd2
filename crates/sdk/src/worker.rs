//! The worker loop.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinSet;
use uuid::Uuid;

use crate::client::{ClaimKey, Claimed};
use crate::{Client, SdkError};

/// Worker settings.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The tenant's queue to claim from.
    pub queue: String,
    /// This worker's id (unique among live workers).
    pub worker_id: String,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Most occurrences per claim.
    pub batch: u32,
    /// Lease length asked for.
    pub lease_seconds: u32,
    /// How often all held leases are renewed (one call).
    pub heartbeat: Duration,
    /// Pause between empty claims.
    pub idle_poll: Duration,
    /// How long the worker does without a field a server older than this SDK refused (a
    /// claim's key, a claim riding on a report) before sending it again: during a rolling
    /// upgrade the next request may reach an upgraded node. Each try at an old server costs
    /// one refused request (422, nothing written).
    pub recheck_refused: Duration,
}

impl WorkerConfig {
    /// Defaults: 8 concurrent handlers, batches of 16, 30 s leases renewed every 10 s; a field
    /// an older server refused is tried again after a minute.
    pub fn new(queue: impl Into<String>, worker_id: impl Into<String>) -> WorkerConfig {
        WorkerConfig {
            queue: queue.into(),
            worker_id: worker_id.into(),
            concurrency: 8,
            batch: 16,
            lease_seconds: 30,
            heartbeat: Duration::from_secs(10),
            idle_poll: Duration::from_millis(250),
            recheck_refused: Duration::from_secs(60),
        }
    }
}

/// One occurrence handed to a handler.
#[derive(Debug)]
pub struct Job {
    /// The occurrence id: stable across retries and failovers — the idempotency key of any
    /// side effect.
    pub id: Uuid,
    /// Schedule.
    pub schedule_id: Uuid,
    /// Planned instant.
    pub scheduled_for: Timestamp,
    /// Attempt number (1-based).
    pub attempt: u32,
    /// The schedule's payload, exactly as stored: `job.payload.as_ref().map(|p|
    /// p.parse::<MyPayload>())` reads it as your own type, every digit kept.
    pub payload: Option<crate::Payload>,
    cancel: watch::Receiver<bool>,
}

impl Job {
    /// Whether someone asked to cancel this occurrence (seen on the last heartbeat). Check it
    /// before side effects.
    pub fn cancel_requested(&self) -> bool {
        *self.cancel.borrow()
    }
}

/// How a handler failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// Worth retrying (with backoff, while attempts remain).
    #[error("transient: {0}")]
    Transient(String),
    /// Retrying cannot help: a dead letter.
    #[error("permanent: {0}")]
    Permanent(String),
}

/// What a worker did before it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Completions accepted.
    pub completed: u64,
    /// Failures accepted.
    pub failed: u64,
    /// Handlers stopped because their lease was lost.
    pub lost: u64,
    /// Outcomes the server refused (the lease had passed to a successor).
    pub refused: u64,
}

struct Held {
    epoch: i64,
    lost: watch::Sender<bool>,
    cancel: watch::Sender<bool>,
}

type HeldMap = Arc<Mutex<HashMap<Uuid, Held>>>;

fn lock(h: &HeldMap) -> std::sync::MutexGuard<'_, HashMap<Uuid, Held>> {
    h.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs a handler over one queue.
#[derive(Debug, Clone)]
pub struct Worker {
    client: Client,
    cfg: WorkerConfig,
    /// What a server older than this SDK refused.
    compat: Arc<Compat>,
}

/// What the server turned out not to take (it is older than this SDK), each learned from the
/// 422 that refused it (nothing written), after which the worker does without it for
/// [`WorkerConfig::recheck_refused`] and then tries it again: behind a load balancer during a
/// rolling upgrade, one old node must not turn a feature off for the worker's whole life.
#[derive(Debug)]
struct Compat {
    /// A claim riding on a report: reports are then sent on their own and claims made apart.
    plain_reports: Refused,
    /// A claim's key ([`ClaimKey`]): claims are then sent without one, and a claim whose
    /// answer was lost costs what it claimed until those leases end.
    unkeyed: Refused,
    recheck: Duration,
}

/// When a field was last refused, if it is still being done without.
#[derive(Debug, Default)]
struct Refused(Mutex<Option<Instant>>);

impl Refused {
    /// Whether to do without the field now: refused less than `recheck` ago. Once that has
    /// passed the refusal is forgotten, and the next request tries the field again.
    fn active(&self, recheck: Duration) -> bool {
        let mut since = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match *since {
            Some(t) if t.elapsed() < recheck => true,
            Some(_) => {
                *since = None;
                false
            }
            None => false,
        }
    }

    fn refuse(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }
}

impl Compat {
    fn new(recheck: Duration) -> Compat {
        Compat {
            plain_reports: Refused::default(),
            unkeyed: Refused::default(),
            recheck,
        }
    }

    /// A new key for the next claim, unless the server refused keys lately.
    fn key(&self) -> Option<ClaimKey> {
        (!self.unkeyed.active(self.recheck)).then(ClaimKey::new)
    }

    /// Whether reports go without a claim (the server refused one lately).
    fn plain_reports(&self) -> bool {
        self.plain_reports.active(self.recheck)
    }

    /// Whether `e` is a server older than this SDK refusing a claim's key (nothing was
    /// written); if so, claims go without one for a while.
    fn refused_key(&self, e: &SdkError) -> bool {
        let refused = matches!(e, SdkError::Api { status: 422, body }
            if body.message.contains("unknown field `claim_key`"));
        if refused {
            tracing::info!(recheck = ?self.recheck, "the server takes no claim keys; claiming without for a while");
            self.unkeyed.refuse();
        }
        refused
    }
}

#[derive(Debug, Clone, Copy)]
enum Done {
    Completed,
    Failed,
    Lost,
    Refused,
}

impl Worker {
    /// A worker over `client`.
    pub fn new(client: Client, cfg: WorkerConfig) -> Worker {
        Worker {
            client,
            compat: Arc::new(Compat::new(cfg.recheck_refused)),
            cfg,
        }
    }

    /// Claims and runs until `shutdown` turns true, then stops claiming, lets in-flight
    /// handlers finish (still renewing their leases) and returns.
    ///
    /// # Errors
    ///
    /// Only for configuration errors; transport errors are retried.
    pub async fn run<F, Fut>(
        &self,
        handler: F,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<WorkerReport, SdkError>
    where
        F: Fn(Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, JobError>> + Send + 'static,
    {
        if self.cfg.concurrency == 0 || self.cfg.batch == 0 || self.cfg.lease_seconds == 0 {
            return Err(SdkError::Config(
                "concurrency, batch and lease_seconds must be positive".into(),
            ));
        }
        let handler = Arc::new(handler);
        let held: HeldMap = Arc::default();
        let (hb_stop, hb_rx) = watch::channel(false);
        let heartbeat = tokio::spawn(heartbeat(
            self.client.clone(),
            self.cfg.clone(),
            held.clone(),
            hb_rx,
        ));
        let mut tasks: JoinSet<(Done, Vec<Claimed>)> = JoinSet::new();
        let mut report = WorkerReport::default();
        // The key of the claim to make next: kept, marked sent again, when a claim got no
        // answer, so that what it may have claimed comes back instead of lying leased to
        // nobody until its lease ends (docs/DESIGN.md, "Why does a claim carry a key?").
        let mut key = self.compat.key();
        loop {
            if *shutdown.borrow() {
                break;
            }
            let free = self.cfg.concurrency.saturating_sub(tasks.len());
            let mut got = 0;
            if free > 0 {
                match self
                    .client
                    .claim_keyed(
                        &self.cfg.queue,
                        &self.cfg.worker_id,
                        self.cfg.batch.min(free as u32),
                        self.cfg.lease_seconds,
                        key,
                    )
                    .await
                {
                    Ok(claimed) => {
                        got = claimed.len();
                        self.start(&mut tasks, &handler, &held, claimed, &shutdown);
                        key = self.compat.key();
                    }
                    Err(e) if self.compat.refused_key(&e) => key = None,
                    Err(e) => {
                        tracing::warn!(error = %e, "claim failed; retrying");
                        // It may have claimed before its answer was lost: sent again, it gets
                        // that. A refusal (4xx) claimed nothing, but the key may still hold
                        // what an earlier sending of it claimed: a key already sent again is
                        // kept.
                        key = match key {
                            Some(k) if k.resent => Some(k),
                            Some(k) if !matches!(e, SdkError::Api { status, .. } if status < 500) => {
                                Some(k.again())
                            }
                            _ => self.compat.key(),
                        };
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
            // Collect finished handlers without blocking; each may have claimed its successor.
            while let Some(done) = tasks.try_join_next() {
                let next = tally(&mut report, done);
                self.start(&mut tasks, &handler, &held, next, &shutdown);
            }
            if got == 0 || tasks.len() >= self.cfg.concurrency {
                tokio::select! {
                    Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                        let next = tally(&mut report, done);
                        self.start(&mut tasks, &handler, &held, next, &shutdown);
                    }
                    _ = tokio::time::sleep(self.cfg.idle_poll), if tasks.len() < self.cfg.concurrency => {}
                    _ = shutdown.changed() => {}
                }
            }
        }
        // Graceful: no more claims; in-flight handlers finish under renewed leases (and what
        // a handler's report claimed just before the shutdown is run too: it is leased here).
        while let Some(done) = tasks.join_next().await {
            let next = tally(&mut report, done);
            self.start(&mut tasks, &handler, &held, next, &shutdown);
        }
        let _ = hb_stop.send(true);
        let _ = heartbeat.await;
        Ok(report)
    }

    /// Runs a handler task for each claimed occurrence, holding its lease for the heartbeat.
    fn start<F, Fut>(
        &self,
        tasks: &mut JoinSet<(Done, Vec<Claimed>)>,
        handler: &Arc<F>,
        held: &HeldMap,
        claimed: Vec<Claimed>,
        shutdown: &watch::Receiver<bool>,
    ) where
        F: Fn(Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, JobError>> + Send + 'static,
    {
        for c in claimed {
            // Already running here under this very claim: a claim sent again can answer what
            // the first sending claimed, and must not start it twice.
            if lock(held).get(&c.id).is_some_and(|h| h.epoch == c.epoch) {
                tracing::info!(occurrence = %c.id, epoch = c.epoch, "claimed twice; already running");
                continue;
            }
            let (lost_tx, lost_rx) = watch::channel(false);
            let (cancel_tx, cancel_rx) = watch::channel(false);
            lock(held).insert(
                c.id,
                Held {
                    epoch: c.epoch,
                    lost: lost_tx,
                    cancel: cancel_tx,
                },
            );
            let job = Job {
                id: c.id,
                schedule_id: c.schedule_id,
                scheduled_for: c.scheduled_for,
                attempt: c.attempt,
                payload: c.payload,
                cancel: cancel_rx,
            };
            tasks.spawn(run_one(
                self.client.clone(),
                self.cfg.clone(),
                self.compat.clone(),
                handler.clone(),
                job,
                c.epoch,
                lost_rx,
                held.clone(),
                shutdown.clone(),
            ));
        }
    }
}

/// Counts a finished handler; returns what its report claimed.
fn tally(
    report: &mut WorkerReport,
    done: Result<(Done, Vec<Claimed>), tokio::task::JoinError>,
) -> Vec<Claimed> {
    let (done, next) = match done {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(error = %e, "handler task panicked");
            return Vec::new();
        }
    };
    match done {
        Done::Completed => report.completed += 1,
        Done::Failed => report.failed += 1,
        Done::Lost => report.lost += 1,
        Done::Refused => report.refused += 1,
    }
    next
}

/// Runs one handler and reports its outcome. Unless the worker is shutting down, the report
/// also claims the occurrence that takes this one's place (one request instead of two).
#[allow(clippy::too_many_arguments)]
async fn run_one<F, Fut>(
    client: Client,
    cfg: WorkerConfig,
    compat: Arc<Compat>,
    handler: Arc<F>,
    job: Job,
    epoch: i64,
    mut lost: watch::Receiver<bool>,
    held: HeldMap,
    shutdown: watch::Receiver<bool>,
) -> (Done, Vec<Claimed>)
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, JobError>> + Send + 'static,
{
    let id = job.id;
    // The lease stays held (the heartbeat renews it) until the outcome is reported, so that a
    // report retried through a short outage still lands inside it; released however the task
    // ends (a panicking handler included).
    let _release = Release { held, id, epoch };
    let outcome = tokio::select! {
        r = handler(job) => Some(r),
        _ = lost.wait_for(|l| *l) => None,
    };
    let (item, done) = match outcome {
        None => {
            tracing::warn!(occurrence = %id, "lease lost: handler stopped, no outcome reported");
            return (Done::Lost, Vec::new());
        }
        Some(Ok(result)) => (
            json!({ "occurrence_id": id, "epoch": epoch, "result": result }),
            Done::Completed,
        ),
        Some(Err(e)) => {
            let (class, message) = match e {
                JobError::Transient(m) => ("transient", m),
                JobError::Permanent(m) => ("permanent", m),
            };
            (
                json!({ "occurrence_id": id, "epoch": epoch,
                        "failure": { "class": class, "message": message } }),
                Done::Failed,
            )
        }
    };
    // A report the server could not take (503: the database unreachable, the node starting)
    // or that got no answer is sent again, with backoff, for up to a lease: otherwise the
    // outcome is lost and the occurrence runs again once the lease ends.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(u64::from(cfg.lease_seconds));
    let mut delay = Duration::from_millis(100);
    let mut sent_again = false;
    let mut key = compat.key();
    // Whether a sending carried a claim: sent again, it keeps it even once shutdown began,
    // so that what the first sending may have claimed comes back and is run before the
    // worker stops.
    let mut claim_sent = false;
    let sent = loop {
        let resending_claim = sent_again && claim_sent && key.is_some();
        let sent = if (*shutdown.borrow() && !resending_claim) || compat.plain_reports() {
            client
                .completions(&cfg.worker_id, vec![item.clone()])
                .await
                .map(|r| (r, Vec::new()))
        } else {
            claim_sent = true;
            match client
                .completions_and_claim_keyed(
                    &cfg.worker_id,
                    vec![item.clone()],
                    &cfg.queue,
                    1,
                    cfg.lease_seconds,
                    key,
                )
                .await
            {
                // A server older than this SDK refuses the field (nothing was written): report
                // on its own from now on.
                Err(SdkError::Api { status: 422, body })
                    if body.message.contains("unknown field `claim`") =>
                {
                    tracing::info!(recheck = ?compat.recheck, "the server takes no claim with a report; reporting apart for a while");
                    compat.plain_reports.refuse();
                    continue;
                }
                Err(e) if compat.refused_key(&e) => {
                    key = None;
                    continue;
                }
                sent => sent,
            }
        };
        let retry = matches!(
            &sent,
            Err(SdkError::Api { status: 503, .. } | SdkError::Transport(_))
        );
        if !retry || tokio::time::Instant::now() + delay >= give_up {
            break sent;
        }
        if let Err(e) = &sent {
            tracing::warn!(occurrence = %id, error = %e, "reporting the outcome failed; retrying");
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
        sent_again = true;
        // Its claim may have been made: sent again, it answers what it claimed.
        key = key.map(ClaimKey::again);
    };
    match sent {
        Ok((results, next)) => match results.first() {
            Some(o) if o.outcome == "accepted" => (done, next),
            // A success sent again and refused because the occurrence is SUCCEEDED: the
            // fence checks the epoch and the owner before the state, and a success at this
            // epoch can only come from this worker's claim, so the earlier sending was
            // written and only its answer was lost (the connection dropped, say). A failure
            // sent again is not read this way: what a written failure leaves overlaps with
            // what the sweep of a lapsed lease leaves (docs/DESIGN.md). Nor is `not_claimed`,
            // whatever state it names: this worker did not hold the occurrence at this epoch
            // (a redrive released it), so it counts as a lost lease, as the other checks do.
            Some(o)
                if sent_again
                    && matches!(done, Done::Completed)
                    && o.check.as_deref() == Some("wrong_state")
                    && o.state.as_deref() == Some("SUCCEEDED") =>
            {
                tracing::info!(
                    occurrence = %id,
                    "outcome written by an earlier sending whose answer was lost"
                );
                (done, next)
            }
            other => {
                let check = other.and_then(|o| o.check.as_deref()).unwrap_or("");
                tracing::warn!(occurrence = %id, check, "outcome refused: the lease had passed on");
                (Done::Refused, next)
            }
        },
        Err(e) => {
            // The lease will expire and another worker will run it again (at least once).
            tracing::warn!(occurrence = %id, error = %e, "could not report the outcome");
            (Done::Refused, Vec::new())
        }
    }
}

/// Stops holding a lease (the heartbeat stops renewing it) when a handler's task ends — this
/// claim's lease only: the same occurrence may meanwhile have been claimed again by this
/// worker under a later epoch (its lease ran out during a long outage), and that one is held
/// for its own handler.
struct Release {
    held: HeldMap,
    id: Uuid,
    epoch: i64,
}

impl Drop for Release {
    fn drop(&mut self) {
        let mut held = lock(&self.held);
        if held.get(&self.id).is_some_and(|h| h.epoch == self.epoch) {
            held.remove(&self.id);
        }
    }
}

async fn heartbeat(
    client: Client,
    cfg: WorkerConfig,
    held: HeldMap,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(cfg.heartbeat) => {}
            _ = stop.changed() => return,
        }
        let leases: Vec<(Uuid, i64)> = lock(&held).iter().map(|(id, h)| (*id, h.epoch)).collect();
        if leases.is_empty() {
            continue;
        }
        for chunk in leases.chunks(1000) {
            match client.renew(&cfg.worker_id, chunk, cfg.lease_seconds).await {
                Ok(renewals) => {
                    let map = lock(&held);
                    for r in renewals {
                        if let Some(h) = map.get(&r.occurrence_id) {
                            if !r.renewed {
                                let _ = h.lost.send(true);
                            }
                            if r.cancel_requested {
                                let _ = h.cancel.send(true);
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "lease renewal failed; will retry"),
            }
        }
    }
}
