//! Campanile's HTTP API.
//!
//! Everything under `/v1` is JSON, authenticated with `Authorization: Bearer <key>`, and scoped
//! to the caller's tenant: another tenant's records are `404`, never `403`, so their existence
//! is not revealed. Errors are [`ErrorBody`] with a stable `code`. The OpenAPI document at
//! `/openapi.json` is generated from the handlers and types below.

mod admin;
mod answers;
mod auth;
mod body;
pub mod dto;
mod error;
pub mod http;
mod occurrences;
mod schedules;

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post, put};
use campanile_planner::Planner;
use campanile_planner::schedules::Schedules;
use campanile_store::{Quota, Store};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use utoipa::OpenApi;

pub use auth::{hash_key, issue_key, key_prefix, new_key};
pub use error::{ApiError, ErrorBody};

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

/// The size bound of one answer that lists records (schedules, occurrences), in bytes of
/// JSON: a page stops before the record that would pass it (a page always holds at least
/// one record) and says `truncated`. Records are read in chunks small enough that the chunk
/// in hand stays within the bound whatever their payloads and results hold, so memory per
/// answer follows this bound, not `limit` times the largest payload.
pub const ANSWER_BYTES: usize = 8 << 20;

/// Room for a record's fields besides its payload or result, in bytes of JSON.
const RECORD_OVERHEAD: usize = 4 << 10;

/// An answer under construction that keeps to [`ANSWER_BYTES`].
#[derive(Debug)]
pub(crate) struct AnswerBudget {
    left: usize,
    empty: bool,
}

impl AnswerBudget {
    pub(crate) fn new() -> AnswerBudget {
        AnswerBudget {
            left: ANSWER_BYTES,
            empty: true,
        }
    }

    /// Bytes of JSON counted so far.
    pub(crate) fn used(&self) -> usize {
        ANSWER_BYTES - self.left
    }

    /// Whether `record` fits (the first one always does); if it does, it is counted.
    pub(crate) fn fits(&mut self, record: &impl serde::Serialize) -> bool {
        let mut counter = ByteCount(0);
        let size = serde_json::to_writer(&mut counter, record).map_or(usize::MAX, |()| counter.0);
        if !self.empty && size > self.left {
            return false;
        }
        self.empty = false;
        self.left = self.left.saturating_sub(size + 1);
        true
    }
}

/// Counts what is written to it, keeping nothing.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) schedules: Schedules,
    pub(crate) planner: Option<Arc<Planner>>,
    pub(crate) relay: bool,
    pub(crate) keys: Arc<auth::KeyCache>,
    /// The tenants' classes, the label of the claim-lag histogram.
    pub(crate) classes: Arc<campanile_store::classes::TenantClasses>,
    /// Records read per store call by the list endpoints: as many as fit in [`ANSWER_BYTES`]
    /// at the largest payload or result a request body can carry.
    pub(crate) list_chunk: u32,
    /// The node's budget for answers in flight.
    pub(crate) answers: answers::AnswerMemory,
    /// Largest accepted request body: the largest payload an answer can carry.
    pub(crate) max_body_bytes: usize,
    metrics: PrometheusHandle,
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
            answers: answers::AnswerMemory::new(cfg),
            max_body_bytes: cfg.max_body_bytes,
            keys: Arc::new(auth::KeyCache::new(
                cfg.key_cache,
                Arc::new(campanile_core::SystemClock),
            )),
            metrics: metrics_handle(),
        }
    }

    /// The same state with `clock` timing the API-key cache (tests step it).
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn campanile_core::Clock>) -> AppState {
        self.keys = Arc::new(self.keys.with_clock(clock));
        self
    }
}

/// Installs the process-wide Prometheus recorder (once), so that what a node does before it
/// serves (its first planning pass) is counted.
pub fn install_metrics() {
    let _ = metrics_handle();
}

/// This process's metrics in the Prometheus text format, as `/metrics` serves them (for an
/// embedding program such as `campanile bench`).
pub fn metrics_text() -> String {
    metrics_handle().render()
}

/// The process-wide Prometheus recorder (installed once).
fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let lag_buckets = [
                0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
            ];
            // A histogram series not observed for 15 minutes is dropped from the exposition
            // (and starts again from zero if it comes back): the `tenant_class` label's values
            // are then those of classes active lately, not every class the node ever saw
            // (renamed classes would otherwise add series until a restart).
            let recorder = PrometheusBuilder::new()
                .idle_timeout(
                    metrics_util::MetricKindMask::HISTOGRAM,
                    Some(std::time::Duration::from_secs(15 * 60)),
                )
                .set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Suffix("_lag_seconds".into()),
                    &lag_buckets,
                )
                .map(|b| b.build_recorder())
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
            let handle = recorder.handle();
            // Another recorder may already be installed (tests embedding several servers).
            let _ = metrics::set_global_recorder(recorder);
            register_metrics();
            handle
        })
        .clone()
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Campanile", description = "Multi-tenant job scheduler: schedules, occurrences and the fenced worker protocol.\n\n\
        Every constraint the server enforces on input is stated here (`minLength`, `maxLength`, `pattern`, `enum`, `minimum`, \
        `maximum`, `format`, `minItems`, `maxItems`); rules that tie fields together, and lengths counted in bytes of UTF-8, \
        are in the descriptions. Integers are written as JSON integers, without a fraction or an exponent (`30`, not `30.0` \
        or `3e1`): JSON Schema counts `30.0` as an integer, the server refuses it."),
    paths(
        schedules::create, schedules::list, schedules::get, schedules::update, schedules::pause, schedules::resume,
        schedules::cancel, schedules::preview,
        occurrences::list, occurrences::get, occurrences::get_planned, occurrences::claim, occurrences::renew,
        occurrences::complete, occurrences::fail, occurrences::completions, occurrences::redrive, occurrences::cancel,
        admin::create_tenant, admin::list_tenants, admin::create_key, admin::set_class,
        healthz, readyz
    ),
    modifiers(&BearerAuth, &CommonResponses, &ScheduleBodies),
    security(("bearer" = []))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// `POST /v1/schedules` and `PATCH /v1/schedules/{id}` take the same definition
/// ([`dto::ScheduleInput`]) but not the same `version`: refused on create, required on update.
/// The document shows the two bodies as they are: `ScheduleCreate` without `version`,
/// `ScheduleUpdate` with it required.
struct ScheduleBodies;

impl utoipa::Modify for ScheduleBodies {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::schema::Schema;
        use utoipa::openapi::{Ref, RefOr};
        let Some(components) = doc.components.as_mut() else {
            return;
        };
        let Some(RefOr::T(Schema::Object(input))) = components.schemas.remove("ScheduleInput")
        else {
            return;
        };
        let mut create = input.clone();
        create.properties.remove("version");
        create.description = input
            .description
            .as_ref()
            .map(|d| format!("{d}\n\nAs created: without `version`."));
        let mut update = input;
        update.required.push("version".into());
        update.description = update
            .description
            .map(|d| format!("{d}\n\nAs replaced: with the `version` read."));
        components
            .schemas
            .insert("ScheduleCreate".into(), RefOr::T(Schema::Object(create)));
        components
            .schemas
            .insert("ScheduleUpdate".into(), RefOr::T(Schema::Object(update)));
        let bodies = [
            ("/v1/schedules", "ScheduleCreate"),
            ("/v1/schedules/{id}", "ScheduleUpdate"),
        ];
        for (path, name) in bodies {
            let Some(item) = doc.paths.paths.get_mut(path) else {
                continue;
            };
            let op = if name == "ScheduleCreate" {
                item.post.as_mut()
            } else {
                item.patch.as_mut()
            };
            let content = op
                .and_then(|op| op.request_body.as_mut())
                .and_then(|b| b.content.get_mut("application/json"));
            if let Some(content) = content {
                content.schema = Some(RefOr::Ref(Ref::from_schema_name(name)));
            }
        }
    }
}

/// The error answers every operation of a kind can give, added to each so that the document
/// lists every status the API sends (a schemathesis probe found most of these missing):
/// authenticated routes 401, 403 and 503; operations that take a body 400, 413, 415 and 422;
/// those with query or path parameters 400 and 422.
struct CommonResponses;

impl utoipa::Modify for CommonResponses {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::ParameterIn;
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let error = |what: &str| {
            ResponseBuilder::new()
                .description(what)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build()
        };
        for item in doc.paths.paths.values_mut() {
            let ops = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ];
            for op in ops.into_iter().flatten() {
                let public = op
                    .security
                    .as_ref()
                    .is_some_and(|s| s.is_empty() || s.iter().all(|r| *r == Default::default()));
                let params = op.parameters.as_deref().unwrap_or_default();
                let query = params.iter().any(|p| p.parameter_in == ParameterIn::Query);
                let path = params.iter().any(|p| p.parameter_in == ParameterIn::Path);
                let body = op.request_body.is_some();
                let mut add = |status: &str, what: &str| {
                    op.responses
                        .responses
                        .entry(status.to_string())
                        .or_insert_with(|| error(what).into());
                };
                if !public {
                    add("401", "no valid API key (`unauthorized`)");
                    add(
                        "403",
                        "the key is of the other kind: admin on a tenant route or the reverse (`forbidden`)",
                    );
                    add("503", "the database is unreachable (`unavailable`)");
                }
                if body {
                    add("400", "malformed JSON (`invalid_request`)");
                    add(
                        "413",
                        "the body is larger than the limit (`payload_too_large`)",
                    );
                    add("415", "not JSON, or compressed (`unsupported_media_type`)");
                }
                if body || query || path {
                    if query || path {
                        add(
                            "400",
                            "an unparsable query string or path (`invalid_request`)",
                        );
                    }
                    add("422", "a value that is not valid (`validation_failed`)");
                }
            }
        }
    }
}

/// The OpenAPI document.
pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "system", security(), responses((status = 200, description = "alive")))]
async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the database answers.
#[utoipa::path(get, path = "/readyz", tag = "system", security(), responses((status = 200, description = "ready"), (status = 503, body = ErrorBody)))]
async fn readyz(State(state): State<AppState>) -> Response {
    if state.planner.as_ref().is_some_and(|p| !p.is_live()) {
        return ApiError::node_not_live().into_response();
    }
    match state.store.store_ping().await {
        Ok(()) => "ready".into_response(),
        Err(e) => {
            ApiError::from(campanile_store::StoreError::Unavailable(e.to_string())).into_response()
        }
    }
}

async fn metrics_endpoint(State(state): State<AppState>) -> String {
    state.metrics.render()
}

async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(openapi())
}

async fn fallback() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such route; see /openapi.json",
    )
}

/// A route that exists, asked with a method it does not take (the `Allow` header lists those
/// it does).
async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method; the Allow header lists those it does",
    )
}

/// The router: `/v1` API, `/openapi.json`, `/metrics`, `/healthz`, `/readyz`.
pub fn router(state: AppState, cfg: &ServerConfig) -> Router {
    let v1 = Router::new()
        .route("/schedules", post(schedules::create).get(schedules::list))
        .route("/schedules/preview", post(schedules::preview))
        .route(
            "/schedules/{id}",
            get(schedules::get).patch(schedules::update),
        )
        .route("/schedules/{id}/pause", post(schedules::pause))
        .route("/schedules/{id}/resume", post(schedules::resume))
        .route("/schedules/{id}/cancel", post(schedules::cancel))
        .route(
            "/schedules/{id}/occurrences/{scheduled_for}",
            get(occurrences::get_planned),
        )
        .route("/occurrences", get(occurrences::list))
        .route("/occurrences/{id}", get(occurrences::get))
        .route("/occurrences/{id}/complete", post(occurrences::complete))
        .route("/occurrences/{id}/fail", post(occurrences::fail))
        .route("/occurrences/{id}/redrive", post(occurrences::redrive))
        .route("/occurrences/{id}/cancel", post(occurrences::cancel))
        .route("/queues/{queue}/claim", post(occurrences::claim))
        .route("/leases/renew", post(occurrences::renew))
        .route("/completions", post(occurrences::completions))
        .route(
            "/admin/tenants",
            post(admin::create_tenant).get(admin::list_tenants),
        )
        .route("/admin/tenants/{name}/keys", post(admin::create_key))
        .route("/admin/tenants/{name}/class", put(admin::set_class))
        .method_not_allowed_fallback(method_not_allowed);
    Router::new()
        .nest("/v1", v1)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_endpoint))
        .route("/openapi.json", get(openapi_json))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(fallback)
        .layer(DefaultBodyLimit::max(cfg.max_body_bytes))
        .with_state(state)
}

/// What a node serves while its first planning pass has not finished (it may be retried for
/// as long as the database is away): `/healthz` answers (the process is alive), `/readyz` and
/// every other route answer 503 with `Retry-After`, and `/metrics` and `/openapi.json` are
/// served.
pub fn starting_router() -> Router {
    let metrics = metrics_handle();
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(|| async { ApiError::node_starting() }))
        .route("/metrics", get(move || async move { metrics.render() }))
        .route("/openapi.json", get(openapi_json))
        .method_not_allowed_fallback(|| async { ApiError::node_starting() })
        .fallback(|| async { ApiError::node_starting() })
}

/// One service for the node's whole life: it answers as [`starting_router`] until `full` is
/// set (when the first planning pass is done), then as `full`. One listener and one server
/// throughout, so that no connection — an idle keep-alive one or one whose request is still
/// in flight — is dropped when the node becomes ready.
pub fn until_ready(full: Arc<OnceLock<Router>>) -> Router {
    use tower::ServiceExt;
    let starting = starting_router();
    Router::new().fallback_service(tower::service_fn(move |req: axum::extract::Request| {
        let router = full.get().cloned().unwrap_or_else(|| starting.clone());
        router.oneshot(req)
    }))
}

/// Every metric Campanile exports, described and present from the start (at zero), so that
/// dashboards and alerts see them before the first event. Label sets are bounded: no tenant
/// or occurrence ids.
pub const METRICS: &[(&str, &str)] = &[
    (
        "campanile_occurrences_planned_total",
        "Occurrences materialized by the planner.",
    ),
    (
        "campanile_occurrences_claimed_total",
        "Occurrences handed to workers.",
    ),
    (
        "campanile_occurrences_replayed_total",
        "Occurrences answered again to a claim sent again with its key after its answer was lost (not counted again as claimed).",
    ),
    (
        "campanile_occurrences_completed_total",
        "Completions accepted.",
    ),
    (
        "campanile_occurrences_failed_total",
        "Failures accepted (transient and permanent).",
    ),
    (
        "campanile_occurrences_retried_total",
        "Transient failures scheduled for another attempt.",
    ),
    (
        "campanile_occurrences_dead_total",
        "Occurrences that became dead letters.",
    ),
    (
        "campanile_occurrences_missed_total",
        "Instants recorded as MISSED by the misfire policy.",
    ),
    (
        "campanile_occurrences_canceled_total",
        "Unclaimed occurrences canceled by a schedule change.",
    ),
    (
        "campanile_stale_completions_refused_total",
        "Completions or failures refused by the fence.",
    ),
    (
        "campanile_leases_expired_total",
        "Leases that ran out (found by the recovery sweep).",
    ),
    (
        "campanile_leases_recovered_total",
        "Expired leases returned to READY.",
    ),
    (
        "campanile_lease_renewals_failed_total",
        "Leases a worker asked to renew that were already lost.",
    ),
    (
        "campanile_throttled_requests_total",
        "Requests refused by a quota (429), by quota (max_active_schedules, max_triggers_per_sec).",
    ),
    (
        "campanile_occurrences_skipped_overlap_total",
        "Occurrences skipped at claim time because their schedule was still running (SKIP_IF_RUNNING).",
    ),
    (
        "campanile_relay_publish_failures_total",
        "Publishes to an external target (NATS JetStream) that failed; recorded as failed attempts.",
    ),
    (
        "campanile_planner_shards_held",
        "Planner shards held by this node.",
    ),
    (
        "campanile_planner_consecutive_failed_passes",
        "Planning passes in a row that failed to plan all of one of this node's shards (the worst shard; 0 when the last pass planned everything).",
    ),
    (
        "campanile_planner_schedules_isolated_total",
        "Schedules left out of a planning pass because committing them failed (the rest of their batch was planned; they are tried again next pass).",
    ),
    (
        "campanile_due_backlog",
        "Occurrences due and not claimed, all tenants (counted up to 1,000,000; sampled every 10 s).",
    ),
    (
        "campanile_due_backlog_oldest_age_seconds",
        "How long the longest-waiting due occurrence has been available (sampled every 10 s).",
    ),
    (
        "campanile_backlog_sampled_timestamp_seconds",
        "When the backlog gauges were last sampled (Unix seconds): they keep their last value while sampling fails, e.g. in a database outage.",
    ),
    (
        "campanile_outbox_backlog",
        "Outbox rows due for the relay and not yet delivered or settled (sampled every 10 s).",
    ),
    (
        "campanile_schedule_lag_seconds",
        "visible_at - scheduled_for of planned occurrences, by tenant class.",
    ),
    (
        "campanile_claim_lag_seconds",
        "claimed_at - available_at of claimed occurrences, by tenant class.",
    ),
];

fn register_metrics() {
    for (name, help) in METRICS {
        let name: &'static str = name;
        if name.ends_with("_lag_seconds") {
            metrics::describe_histogram!(name, metrics::Unit::Seconds, *help);
        } else if name == "campanile_throttled_requests_total" {
            // One series per quota that refuses requests, each from zero.
            metrics::describe_counter!(name, *help);
            for quota in Quota::ALL {
                metrics::counter!(name, "quota" => quota.as_str()).absolute(0);
            }
        } else if name.ends_with("_total") {
            metrics::describe_counter!(name, *help);
            metrics::counter!(name).absolute(0);
        } else {
            metrics::describe_gauge!(name, *help);
            metrics::gauge!(name).set(0.0);
        }
    }
}
