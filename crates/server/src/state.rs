//! What every handler shares ([`AppState`]), the server's settings, and the size bound of an\n//! answer that lists records.

use std::sync::Arc;

use campanile_planner::Planner;
use campanile_planner::schedules::Schedules;
use campanile_store::Store;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::answers::{ANSWER_BYTES, RECORD_OVERHEAD};
use crate::prometheus::metrics_handle;

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest accepted request body, bytes (default 256 KiB).
    pub max_body_bytes: usize,
    /// Planner shards (must match every node's planner).
    pub shards: u32,
    /// Whether the deployment relays external targets (a node runs with `--nats-url`);
    /// without it, schedules with a NATS target are refused rather than left undelivered.
    pub relay: bool,
    /// How long a verified API key is trusted before it is read again (default 1 s): the
    /// longest a key revoked elsewhere keeps working on this node. Zero reads the key on
    /// every request.
    pub key_cache: std::time::Duration,
    /// Bytes that the answers in flight (lists, claims) may hold at once, from before their
    /// records are read until they are sent: an answer being built counts twice its size
    /// (its records and their JSON), a built one its size (default 64 MiB; never below one
    /// answer being built, 16 MiB). Past it, a claim's answer is bounded by what is free and
    /// a list waits for room.
    pub answer_memory: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_body_bytes: 256 * 1024,
            shards: 16,
            relay: false,
            key_cache: std::time::Duration::from_secs(1),
            answer_memory: 64 << 20,
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) schedules: Schedules,
    pub(crate) planner: Option<Arc<Planner>>,
    pub(crate) relay: bool,
    pub(crate) keys: Arc<crate::keys::KeyCache>,
    /// The tenants' classes, the label of the claim-lag histogram.
    pub(crate) classes: Arc<campanile_store::classes::TenantClasses>,
    /// Records read per store call by the list endpoints: as many as fit in [`ANSWER_BYTES`]
    /// at the largest payload or result a request body can carry.
    pub(crate) list_chunk: u32,
    /// The node's budget for answers in flight.
    pub(crate) answers: crate::answers::AnswerMemory,
    /// Largest accepted request body: the largest payload an answer can carry.
    pub(crate) max_body_bytes: usize,
    pub(crate) metrics: PrometheusHandle,
    /// The console's signed-in logins.
    pub(crate) logins: Arc<crate::console::Logins>,
}

impl AppState {
    /// State over `store`; `planner`, when given, is woken after schedule changes.
    pub fn new(
        store: Arc<dyn Store>,
        cfg: &ServerConfig,
        planner: Option<Arc<Planner>>,
    ) -> AppState {
        AppState {
            schedules: Schedules::new(store.clone(), cfg.shards),
            // The planner's copy when there is one: one per node.
            classes: planner.as_ref().map_or_else(
                || Arc::new(campanile_store::classes::TenantClasses::new(store.clone())),
                |p| p.classes(),
            ),
            store,
            planner,
            relay: cfg.relay,
            list_chunk: (ANSWER_BYTES / (cfg.max_body_bytes + RECORD_OVERHEAD)).clamp(1, 1000)
                as u32,
            answers: crate::answers::AnswerMemory::new(cfg.answer_memory),
            max_body_bytes: cfg.max_body_bytes,
            keys: Arc::new(crate::keys::KeyCache::new(
                cfg.key_cache,
                Arc::new(campanile_core::SystemClock),
            )),
            metrics: metrics_handle(),
            logins: Arc::new(crate::console::Logins::new(Arc::new(
                campanile_core::SystemClock,
            ))),
        }
    }

    /// The same state with `clock` timing the API-key cache (tests step it).
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn campanile_core::Clock>) -> AppState {
        self.keys = Arc::new(self.keys.with_clock(clock.clone()));
        self.logins = Arc::new(crate::console::Logins::new(clock));
        self
    }
}
