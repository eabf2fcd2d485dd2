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
mod claims;
mod console;
pub mod dto;
mod error;
pub mod http;
mod keys;
mod occurrences;
mod prometheus;
mod reports;
mod schedules;
mod state;

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post, put};
use utoipa::OpenApi;

pub use answers::ANSWER_BYTES;
pub use auth::{hash_key, issue_key, key_prefix, new_key};
pub use error::{ApiError, ErrorBody};
pub use prometheus::{METRICS, install_metrics, metrics_text};
pub use state::{AppState, ServerConfig};

use crate::prometheus::metrics_handle;

#[derive(OpenApi)]
#[openapi(
    info(title = "Campanile", description = "Multi-tenant job scheduler: schedules, occurrences and the fenced worker protocol.\n\n\
        Every constraint the server enforces on input is stated here (`minLength`, `maxLength`, `pattern`, `enum`, `minimum`, \
        `maximum`, `format`, `minItems`, `maxItems`); rules that tie fields together, and lengths counted in bytes of UTF-8, \
        are in the descriptions. Integers are written as JSON integers, without a fraction or an exponent (`30`, not `30.0` \
        or `3e1`): JSON Schema counts `30.0` as an integer, the server refuses it."),
    paths(
        schedules::create, schedules::list, schedules::get, schedules::update, schedules::pause, schedules::resume,
        schedules::cancel, schedules::preview, schedules::trigger, schedules::backfill,
        occurrences::list, occurrences::get, occurrences::get_planned, claims::claim, reports::renew,
        reports::complete, reports::fail, reports::completions, reports::redrive, reports::cancel,
        admin::create_tenant, admin::list_tenants, admin::create_key, admin::set_class,
        admin::set_retention, admin::get_quotas, admin::set_quotas, admin::set_queue_limit,
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
        .route("/schedules/{id}/trigger", post(schedules::trigger))
        .route("/schedules/{id}/backfill", post(schedules::backfill))
        .route(
            "/schedules/{id}/occurrences/{scheduled_for}",
            get(occurrences::get_planned),
        )
        .route("/occurrences", get(occurrences::list))
        .route("/occurrences/{id}", get(occurrences::get))
        .route("/occurrences/{id}/complete", post(reports::complete))
        .route("/occurrences/{id}/fail", post(reports::fail))
        .route("/occurrences/{id}/redrive", post(reports::redrive))
        .route("/occurrences/{id}/cancel", post(reports::cancel))
        .route("/queues/{queue}/claim", post(claims::claim))
        .route("/leases/renew", post(reports::renew))
        .route("/completions", post(reports::completions))
        .route(
            "/admin/tenants",
            post(admin::create_tenant).get(admin::list_tenants),
        )
        .route("/admin/tenants/{name}/keys", post(admin::create_key))
        .route("/admin/tenants/{name}/class", put(admin::set_class))
        .route("/admin/tenants/{name}/retention", put(admin::set_retention))
        .route(
            "/admin/tenants/{name}/quotas",
            get(admin::get_quotas).put(admin::set_quotas),
        )
        .route(
            "/admin/tenants/{name}/queues/{queue}/limit",
            put(admin::set_queue_limit),
        )
        .method_not_allowed_fallback(method_not_allowed);
    Router::new()
        .nest("/v1", v1)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_endpoint))
        .route("/openapi.json", get(openapi_json))
        .merge(console::router())
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
