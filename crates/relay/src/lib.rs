//! The relay: delivers externally targeted occurrences from the transactional outbox.
//!
//! The planner writes an outbox row with each occurrence whose route is a reserved queue
//! (`$nats:<subject>`), in the same transaction. The relay claims due rows across tenants
//! ([`Store::relay_claim`]) under a fenced lease like any worker, publishes each occurrence
//! to its JetStream subject with the occurrence id as `Nats-Msg-Id` (the stream's
//! de-duplication id), and completes it with the stream's acknowledgement — fenced, so a
//! relay whose lease passed cannot overwrite its successor's result. A relay that dies after
//! publishing and before completing leaves a lease that expires; the next relay publishes
//! again with the same id, and the stream drops the duplicate inside its duplicate window.
//! Delivery is at least once.
//!
//! A failed publish (no stream for the subject, a timeout) is a transient failure: the
//! occurrence backs off and is retried under its schedule's retry policy, then goes `DEAD`
//! like any other. A message the server can never take (over its payload limit) is permanent.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, message::PublishMessage};
use campanile_core::{ErrorClass, Target};
use campanile_store::{
    Finish, FinishItem, OccurrenceFinishMany, RelayClaim, Relayed, Store, StoreError, TenantId,
};
use jiff::{SignedDuration, Timestamp};
use tokio::sync::watch;

/// Errors of the relay layer.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The NATS server could not be reached.
    #[error("cannot connect to NATS at {url}: {message}")]
    Connect {
        /// The URL tried.
        url: String,
        /// Why.
        message: String,
    },
    /// The URL, its credentials or its TLS settings are wrong: trying again will not help.
    #[error("cannot connect to NATS at {url}: {message}")]
    Refused {
        /// The URL tried.
        url: String,
        /// Why.
        message: String,
    },
}

/// Relay settings.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// This node's name: the owner of the occurrences it claims.
    pub node: String,
    /// Occurrences per claim.
    pub batch: u32,
    /// Lease on claimed occurrences; longer than a publish and its acknowledgement can take.
    pub lease: SignedDuration,
    /// Pause between polls when nothing was due.
    pub idle: Duration,
    /// How long a batch waits for the stream's acknowledgements (capped at half the lease).
    pub ack_timeout: Duration,
}

impl RelayConfig {
    /// Defaults for a node called `node`.
    #[must_use]
    pub fn new(node: impl Into<String>) -> RelayConfig {
        RelayConfig {
            node: node.into(),
            batch: 500,
            lease: SignedDuration::from_secs(30),
            idle: Duration::from_millis(200),
            ack_timeout: Duration::from_secs(10),
        }
    }
}

/// What one relay step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Occurrences claimed from the outbox.
    pub claimed: u64,
    /// Acknowledged by the stream (including ones it reported as duplicates).
    pub published: u64,
    /// Acknowledged as duplicates (a re-delivery after a relay died).
    pub duplicates: u64,
    /// Publishes that failed (recorded as failed attempts).
    pub failed: u64,
    /// Nothing was claimed because the connection to NATS is down (an outage of the broker
    /// must not burn the occurrences' attempts, so they wait in the outbox instead), or the
    /// node's liveness mark has lapsed ([`Relay::with_liveness`]).
    pub paused: bool,
    /// Completions refused because the lease had passed (another relay took over).
    pub stale: u64,
    /// Outcomes the store failed to record (published, or not, and relayed again after the
    /// lease).
    pub unrecorded: u64,
}

/// Connects to NATS, for [`Relay::new`].
///
/// # Errors
///
/// [`RelayError::Connect`] naming the URL.
pub async fn connect(url: &str) -> Result<async_nats::Client, RelayError> {
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .map_err(|e| {
            use async_nats::ConnectErrorKind as K;
            let (url, message) = (url.to_string(), e.to_string());
            match e.kind() {
                K::ServerParse | K::Authentication | K::AuthorizationViolation | K::Tls => {
                    RelayError::Refused { url, message }
                }
                _ => RelayError::Connect { url, message },
            }
        })
}

/// Whether the node the relay runs in may hand out work now (see [`Relay::with_liveness`]).
#[derive(Clone)]
pub struct Liveness(pub Arc<dyn Fn() -> bool + Send + Sync>);

impl std::fmt::Debug for Liveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Liveness")
    }
}

/// Delivers due outbox rows to NATS JetStream.
#[derive(Debug, Clone)]
pub struct Relay {
    store: Arc<dyn Store>,
    client: async_nats::Client,
    js: jetstream::Context,
    cfg: RelayConfig,
    live: Option<Liveness>,
    /// The tenants' classes, the label of the claim-lag histogram.
    classes: Arc<campanile_store::classes::TenantClasses>,
}

impl Relay {
    /// A relay over a store and a connected NATS client.
    #[must_use]
    pub fn new(store: Arc<dyn Store>, client: async_nats::Client, cfg: RelayConfig) -> Relay {
        Relay {
            classes: Arc::new(campanile_store::classes::TenantClasses::new(store.clone())),
            store,
            js: jetstream::new(client.clone()),
            client,
            cfg,
            live: None,
        }
    }

    /// Labels its claims with this copy of the tenants' classes (the node's planner's), instead
    /// of a copy of its own.
    #[must_use]
    pub fn with_classes(mut self, classes: Arc<campanile_store::classes::TenantClasses>) -> Relay {
        self.classes = classes;
        self
    }

    /// Claims only while `live` says so (a node's liveness mark is valid), as the node's API
    /// does: otherwise [`Relay::step`] pauses, and due deliveries wait in the outbox.
    #[must_use]
    pub fn with_liveness(mut self, live: Liveness) -> Relay {
        self.live = Some(live);
        self
    }

    /// Claims one batch of due outbox rows at `now` (`None`: the store's clock), publishes
    /// them, and records each outcome, fenced.
    ///
    /// # Errors
    ///
    /// A store failure. Publish failures are not errors: they are recorded on the
    /// occurrences as failed attempts.
    pub async fn step(&self, now: Option<Timestamp>) -> Result<RelayReport, RelayError> {
        if self.client.connection_state() != async_nats::connection::State::Connected
            || self.live.as_ref().is_some_and(|l| !(l.0)())
        {
            return Ok(RelayReport {
                paused: true,
                ..RelayReport::default()
            });
        }
        let claimed = self
            .store
            .relay_claim(RelayClaim {
                node: self.cfg.node.clone(),
                max: self.cfg.batch,
                lease: self.cfg.lease,
                now,
            })
            .await?;
        let mut report = RelayReport {
            claimed: claimed.len() as u64,
            ..RelayReport::default()
        };
        if claimed.is_empty() {
            return Ok(report);
        }
        // One count per run of a tenant's rows (the relay claims across tenants).
        for run in claimed.chunk_by(|a, b| a.tenant == b.tenant) {
            let class = self.classes.class_of(run[0].tenant).await;
            campanile_metrics::record_claims(&class, run.iter().map(|r| &r.claim));
        }
        // Send every message first, then wait for all the acknowledgements at once, under one
        // deadline well inside the lease: a broker that stops answering mid-batch costs this
        // batch a failed attempt each, never a wait past the lease (which would let another
        // relay publish again and the sweep spend an attempt on a delivered message).
        let budget = self
            .cfg
            .ack_timeout
            .min(self.cfg.lease.unsigned_abs() / 2)
            .max(Duration::from_millis(100));
        let deadline = tokio::time::Instant::now() + budget;
        let mut sent = Vec::with_capacity(claimed.len());
        for r in &claimed {
            sent.push(
                match tokio::time::timeout_at(deadline, self.send(r)).await {
                    Ok(s) => s,
                    Err(_) => Err(failure(r, ErrorClass::Transient, "timed out sending")),
                },
            );
        }
        let acks = futures_util::future::join_all(sent.into_iter().zip(&claimed).map(
            |(sent, r)| async move {
                let ack = match sent {
                    Ok(ack) => ack,
                    Err(f) => return (f, false),
                };
                match tokio::time::timeout_at(deadline, ack.into_future()).await {
                    Ok(Ok(ack)) => (
                        Finish::Succeeded {
                            result: Some(
                                serde_json::json!({
                                    "stream": ack.stream,
                                    "seq": ack.sequence,
                                    "duplicate": ack.duplicate,
                                })
                                .to_string(),
                            ),
                        },
                        ack.duplicate,
                    ),
                    Ok(Err(e)) => (failure(r, publish_class(e.kind()), &e.to_string()), false),
                    Err(_) => (
                        failure(
                            r,
                            ErrorClass::Transient,
                            &format!("no acknowledgement within {budget:?}"),
                        ),
                        false,
                    ),
                }
            },
        ))
        .await;
        let mut by_tenant: BTreeMap<TenantId, Vec<FinishItem>> = BTreeMap::new();
        for (r, (finish, duplicate)) in claimed.iter().zip(acks) {
            match &finish {
                Finish::Succeeded { .. } => {
                    report.published += 1;
                    report.duplicates += u64::from(duplicate);
                }
                Finish::Failed { .. } => {
                    report.failed += 1;
                    metrics::counter!("campanile_relay_publish_failures_total").increment(1);
                }
            }
            by_tenant.entry(r.tenant).or_default().push(FinishItem {
                lease: r.claim.lease(),
                finish,
            });
        }
        // One tenant's store error must not drop the others' outcomes: each group is recorded
        // on its own; an unrecorded group's occurrences are relayed again after their lease
        // (and the stream drops the copies).
        let mut first_error = None;
        for (tenant, items) in by_tenant {
            let succeeded: Vec<bool> = items.iter().map(|i| i.finish.succeeded()).collect();
            match self
                .store
                .occurrence_finish_many(OccurrenceFinishMany {
                    tenant,
                    worker_id: self.cfg.node.clone(),
                    items,
                    now,
                })
                .await
            {
                Ok(acks) => report.stale += campanile_metrics::record_outcomes(&acks, succeeded),
                Err(e) => {
                    tracing::warn!(tenant = tenant.0, error = %e, "relay: outcomes not recorded");
                    report.unrecorded += succeeded.len() as u64;
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error
            && report.unrecorded == report.claimed
        {
            return Err(e.into());
        }
        Ok(report)
    }

    /// Sends one occurrence to its subject; the returned future resolves to the stream's
    /// acknowledgement. A route the relay cannot serve, or a message the client refuses,
    /// comes back as the failure to record.
    async fn send(
        &self,
        r: &Relayed,
    ) -> Result<async_nats::jetstream::context::PublishAckFuture, Finish> {
        let subject = match Target::from_queue(&r.target) {
            Ok(Target::Nats { subject }) => subject,
            Ok(Target::Queue(_)) | Err(_) => {
                return Err(failure(
                    r,
                    ErrorClass::Permanent,
                    &format!("the relay has no route for target {:?}", r.target),
                ));
            }
        };
        let c = &r.claim;
        let message = PublishMessage::build()
            .payload(bytes::Bytes::from(c.payload.clone().unwrap_or_default()))
            .message_id(c.id.to_string())
            .header("Campanile-Schedule-Id", c.schedule_id.to_string().as_str())
            .header("Campanile-Version", c.version.to_string().as_str())
            .header(
                "Campanile-Scheduled-For",
                c.scheduled_for.to_string().as_str(),
            )
            .header("Campanile-Attempt", c.attempt.to_string().as_str());
        self.js
            .send_publish(subject, message)
            .await
            .map_err(|e| failure(r, publish_class(e.kind()), &e.to_string()))
    }

    /// Relays until `stop` turns true: without pause while full batches come back, every
    /// [`RelayConfig::idle`] otherwise.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut was_paused = false;
        loop {
            if *stop.borrow() {
                return;
            }
            let step = self.step(None).await;
            let paused = matches!(step, Ok(RelayReport { paused: true, .. }));
            if paused != was_paused {
                if paused {
                    tracing::warn!(
                        "relay paused: not connected to NATS, or this node's liveness mark \
                         lapsed; due deliveries wait"
                    );
                } else {
                    tracing::info!("relay resumed: connected to NATS and the node is live");
                }
                was_paused = paused;
            }
            let pause = match step {
                Ok(r) if r.claimed >= u64::from(self.cfg.batch) => Duration::ZERO,
                Ok(r) if r.paused => Duration::from_millis(500),
                Ok(r) => {
                    if r.failed > 0 || r.stale > 0 || r.unrecorded > 0 {
                        tracing::warn!(
                            failed = r.failed,
                            stale = r.stale,
                            unrecorded = r.unrecorded,
                            "relay: some occurrences were not delivered this round"
                        );
                    }
                    self.cfg.idle
                }
                Err(e) => {
                    tracing::warn!(error = %e, "relay step failed; retrying");
                    Duration::from_secs(1)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => {}
            }
        }
    }
}

/// Starts a relay on the current runtime; stop it by sending `true` on the returned sender.
pub fn spawn(relay: Relay) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let (stop, rx) = watch::channel(false);
    (stop, tokio::spawn(relay.run(rx)))
}

fn publish_class(kind: PublishErrorKind) -> ErrorClass {
    match kind {
        PublishErrorKind::MaxPayloadExceeded => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

fn failure(r: &Relayed, class: ErrorClass, message: &str) -> Finish {
    tracing::debug!(occurrence = %r.claim.id, target = %r.target, %message, "relay publish failed");
    Finish::Failed {
        class,
        message: format!("publish to {}: {message}", r.target),
    }
}
