//! The API's one error type: every failure leaves as JSON `{code, message, details}` with a
//! stable `code`, and internals never reach a client.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use campanile_planner::PlannerError;
use campanile_store::{Conflict, StoreError};
use serde::Serialize;

/// An API error.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    details: Option<serde_json::Value>,
    retry_after: Option<u64>,
    /// What writing this answer records besides it (a log line, a counter): the conversion
    /// that made it has no side effects, the response is the edge.
    record: Option<Box<Record>>,
}

/// What an error's answer records when it is written.
#[derive(Debug)]
enum Record {
    /// The database did not answer: a warning.
    Unavailable(String),
    /// A quota refused the request: `campanile_throttled_requests_total{quota}`.
    Throttled(&'static str),
    /// An unexpected store error, hidden from the client: an error line with the cause.
    Internal(String),
}

#[derive(Serialize, utoipa::ToSchema)]
/// The body of every error response.
pub struct ErrorBody {
    /// Stable machine-readable code (`validation_failed`, `not_found`, `lease_conflict`, …).
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
    /// Structured detail, when there is any (e.g. which fencing check failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
}

impl ApiError {
    /// A new error.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            details: None,
            retry_after: None,
            record: None,
        }
    }

    /// Adds structured detail.
    pub fn with_details(mut self, details: serde_json::Value) -> ApiError {
        self.details = Some(details);
        self
    }

    /// 400: the request cannot be read.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// 422: the request is well-formed but says something invalid.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            message,
        )
    }

    /// 401.
    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid API key is required: Authorization: Bearer <key>",
        )
    }

    /// 404 — also for anything that exists but belongs to another tenant.
    pub fn not_found(what: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{} not found", what.into()),
        )
    }

    /// 404 for a path id that is not a UUID: no record can have it, so it is not found, as a
    /// well-formed id of no record is (README, "Errors"); the message says why.
    pub fn malformed_id(kind: &str, id: &str) -> ApiError {
        let shown: String = id.chars().take(64).collect();
        let more = if shown.len() < id.len() { "…" } else { "" };
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{kind} '{shown}{more}' not found: {kind} ids are UUIDs"),
        )
    }

    /// 409 for a fencing refusal, naming the failed check.
    pub fn lease_conflict(conflict: &Conflict) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, "lease_conflict", conflict.to_string())
            .with_details(serde_json::to_value(conflict).unwrap_or_default())
    }

    /// 429 `quota_exceeded`, naming the quota in `details.quota`. No `Retry-After`: these
    /// quotas (active schedules, trigger rate) do not lapse with time — retrying later
    /// succeeds only once the tenant pauses or cancels schedules, or an admin raises the
    /// limit, so a client told to come back in a minute would only loop.
    pub fn quota_exceeded(quota: campanile_store::Quota, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", message)
            .with_details(serde_json::json!({ "quota": quota.as_str() }))
    }

    /// 503 with `Retry-After: 1`: this node does not hand out work while its liveness mark
    /// has lapsed.
    pub fn node_not_live() -> ApiError {
        ApiError::retry_shortly(
            "this node is not handing out work: its liveness mark lapsed (its planner could not \
             renew it, e.g. the database was unreachable) and it resumes after its next \
             planning pass; retry shortly",
        )
    }

    /// 503 `unavailable` with `Retry-After: 1`: the node has not finished its first planning
    /// pass (it judges what came due while the deployment was down before it serves anything).
    pub fn node_starting() -> ApiError {
        ApiError::retry_shortly(
            "this node is starting: its first planning pass (which judges what came due while \
             the deployment was down) has not finished; retry shortly",
        )
    }

    /// 503 `unavailable` with `Retry-After: 1`: no work is handed out for a moment.
    fn retry_shortly(message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message);
        e.retry_after = Some(1);
        e
    }

    /// The status code.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The human message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self.record.as_deref() {
            Some(Record::Unavailable(m)) => tracing::warn!(error = %m, "database unavailable"),
            Some(Record::Throttled(quota)) => {
                metrics::counter!("campanile_throttled_requests_total", "quota" => *quota)
                    .increment(1);
            }
            Some(Record::Internal(m)) => tracing::error!(error = %m, "store error"),
            None => {}
        }
        let body = ErrorBody {
            code: self.code.to_string(),
            message: self.message,
            details: self.details,
        };
        let mut resp = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            // RFC 9110 §11.6.1: a 401 names the scheme that would succeed.
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"campanile\""),
            );
        }
        if let Some(secs) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match e {
            StoreError::Unavailable(m) => {
                // A client waits a moment rather than retry at once into the same outage.
                let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the database is unavailable; retry later");
                e.retry_after = Some(2);
                e.record = Some(Box::new(Record::Unavailable(m)));
                e
            }
            // The database's view of the cluster: no node's mark is valid (an outage not yet
            // judged by a node's start). As this node's own gate answers.
            StoreError::NoLiveNode => ApiError::retry_shortly(
                "no node of this deployment is live (every planner's liveness mark has \
                 lapsed); work is handed out again once a node has started and judged what \
                 came due meanwhile against its misfire policy; retry shortly",
            ),
            StoreError::NotFound(what) => ApiError::not_found(what),
            StoreError::VersionConflict { current } => ApiError::new(
                StatusCode::CONFLICT,
                "version_conflict",
                format!("the schedule was changed meanwhile: it is at version {current}; read it again and retry"),
            )
            .with_details(serde_json::json!({ "current_version": current })),
            StoreError::WrongState(m) => ApiError::new(StatusCode::CONFLICT, "wrong_state", m),
            StoreError::Superseded(m) => {
                ApiError::new(StatusCode::CONFLICT, "request_in_progress", m)
            }
            StoreError::AlreadyExists(m) => ApiError::new(StatusCode::CONFLICT, "already_exists", m),
            StoreError::Invalid(m) => ApiError::invalid(m),
            StoreError::QuotaExceeded { quota, message } => {
                let mut e = ApiError::quota_exceeded(quota, message);
                e.record = Some(Box::new(Record::Throttled(quota.as_str())));
                e
            }
            other => {
                let mut e =
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error");
                e.record = Some(Box::new(Record::Internal(other.to_string())));
                e
            }
        }
    }
}

impl From<PlannerError> for ApiError {
    fn from(e: PlannerError) -> ApiError {
        match e {
            PlannerError::Invalid(m) => ApiError::invalid(m),
            PlannerError::Calendar(c) => ApiError::invalid(c.to_string()),
            PlannerError::Store(s) => s.into(),
            other => ApiError::invalid(other.to_string()),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> ApiError {
        match r.status() {
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                r.body_text(),
            ),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send JSON with Content-Type: application/json",
            ),
            StatusCode::UNPROCESSABLE_ENTITY => ApiError::invalid(r.body_text()),
            _ => ApiError::bad_request(r.body_text()),
        }
    }
}
