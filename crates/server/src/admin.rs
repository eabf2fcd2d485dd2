//! `/v1/admin`: tenant management with an admin key.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use campanile_store::{
    QueueLimitList, QueueLimitSet, Retention, StoreError, TenantByName, TenantClassSet,
    TenantCreate, TenantQuota, TenantQuotaGet, TenantRetentionSet,
};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::{Admin, issue_key};
use crate::body::{JsonBody, PathParams};
use crate::{ApiError, AppState, ErrorBody};

/// Body of `POST /v1/admin/tenants`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantInput {
    /// Unique name: 1-64 letters, digits, `-`, `_` or `.`.
    #[schema(min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9._-]{1,64}$")]
    name: String,
}

/// A tenant as shown to admins.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TenantOut {
    /// Name.
    name: String,
    /// Creation.
    #[schema(value_type = String, format = DateTime)]
    created_at: Timestamp,
    /// Its class: the `tenant_class` label of its lag metrics (`default` unless set).
    class: String,
    /// Days its finished occurrences stay before retention archives and removes them: null
    /// follows the operator's default (`campanile serve --retention-days`), 0 keeps them
    /// forever.
    retention_days: Option<u64>,
}

impl TenantOut {
    fn of(t: campanile_store::Tenant) -> TenantOut {
        TenantOut {
            name: t.name,
            created_at: t.created_at,
            class: t.class,
            retention_days: retention_days(t.retention),
        }
    }
}

fn retention_days(r: Retention) -> Option<u64> {
    match r {
        Retention::Default => None,
        Retention::Forever => Some(0),
        // At least a day: a retention set in finer units (only by a program using the store)
        // still shows as one that removes history.
        Retention::For(d) => Some((d.as_secs().max(0) as u64 / 86_400).max(1)),
    }
}

/// Body of `PUT /v1/admin/tenants/{name}/retention`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetentionInput {
    /// Days finished occurrences stay (1-36500); 0 keeps them forever; null follows the
    /// operator's default.
    #[schema(minimum = 0, maximum = 36500)]
    retention_days: Option<u32>,
}

/// Body of `PUT /v1/admin/tenants/{name}/class`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClassInput {
    /// 1-32 lower-case letters, digits, `-` or `_`; at most 16 distinct classes in all.
    #[schema(min_length = 1, max_length = 32, pattern = r"^[a-z0-9_-]{1,32}$")]
    class: String,
}

/// A tenant's quotas and per-queue limits (null: no limit).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct QuotasOut {
    /// The tenant.
    tenant: String,
    /// Most `ACTIVE` schedules; creating one more answers 429.
    max_active_schedules: Option<i64>,
    /// Most occurrences `RUNNING` at once across its queues; claims are cut to fit.
    max_running: Option<i64>,
    /// Most fires per second summed over its active schedules; a schedule that would pass it
    /// answers 429.
    max_triggers_per_sec: Option<i64>,
    /// Most late (catch-up) runs made available per second across its schedules.
    max_catchup_per_sec: Option<i64>,
    /// Per-queue concurrency limits, by queue.
    queue_limits: Vec<QueueLimitOut>,
}

/// One queue's concurrency limit.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct QueueLimitOut {
    /// The queue.
    queue: String,
    /// At most this many of its occurrences running at once, across workers and nodes.
    max_running: i64,
}

/// Body of `PUT /v1/admin/tenants/{name}/quotas`: every quota at once, each one absent or null
/// removed.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct QuotasInput {
    /// Most `ACTIVE` schedules.
    #[schema(minimum = 0)]
    max_active_schedules: Option<u32>,
    /// Most occurrences `RUNNING` at once across its queues.
    #[schema(minimum = 0)]
    max_running: Option<u32>,
    /// Most fires per second summed over its active schedules.
    #[schema(minimum = 0)]
    max_triggers_per_sec: Option<u32>,
    /// Most late (catch-up) runs made available per second.
    #[schema(minimum = 0)]
    max_catchup_per_sec: Option<u32>,
}

/// Body of `PUT /v1/admin/tenants/{name}/queues/{queue}/limit`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct QueueLimitInput {
    /// At most this many of the queue's occurrences running at once; null removes the limit.
    #[schema(minimum = 0)]
    max_running: Option<u32>,
}

/// A new key: shown once, stored only as a hash.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct KeyOut {
    /// The tenant.
    tenant: String,
    /// The API key.
    api_key: String,
}

/// The tenants.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TenantList {
    /// All tenants, by name.
    tenants: Vec<TenantOut>,
}

fn valid_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "name: use 1-64 letters, digits, '-', '_' or '.'",
        ))
    }
}

/// The tenant called `name`; 404 if there is none.
async fn tenant_named(state: &AppState, name: &str) -> Result<campanile_store::Tenant, ApiError> {
    // No tenant can have a name creation refuses (and PostgreSQL cannot even look up one
    // with NUL): not found without asking.
    let found = match valid_name(name) {
        Ok(()) => {
            state
                .store
                .tenant_by_name(TenantByName {
                    name: name.to_string(),
                })
                .await?
        }
        Err(_) => None,
    };
    found.ok_or_else(|| ApiError::not_found(format!("tenant '{name}'")))
}

/// Create a tenant; answers with its first API key (shown once).
#[utoipa::path(post, path = "/v1/admin/tenants", tag = "admin", request_body = TenantInput,
    responses((status = 201, body = KeyOut), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn create_tenant(
    State(state): State<AppState>,
    _admin: Admin,
    body: JsonBody<TenantInput>,
) -> Result<(StatusCode, Json<KeyOut>), ApiError> {
    let name = body.value.name;
    valid_name(&name)?;
    let t = state
        .store
        .tenant_create(TenantCreate {
            name: name.clone(),
            now: None,
        })
        .await
        .map_err(|e| match e {
            StoreError::AlreadyExists(_) => ApiError::new(
                StatusCode::CONFLICT,
                "already_exists",
                format!("tenant '{name}' already exists"),
            ),
            other => other.into(),
        })?;
    let api_key = issue_key(state.store.as_ref(), Some(t.id), false).await?;
    Ok((
        StatusCode::CREATED,
        Json(KeyOut {
            tenant: name,
            api_key,
        }),
    ))
}

/// List tenants.
#[utoipa::path(get, path = "/v1/admin/tenants", tag = "admin", responses((status = 200, body = TenantList), (status = 403, body = ErrorBody)))]
pub(crate) async fn list_tenants(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<TenantList>, ApiError> {
    let tenants = state
        .store
        .tenant_list()
        .await?
        .into_iter()
        .map(TenantOut::of)
        .collect();
    Ok(Json(TenantList { tenants }))
}

/// Issue another API key for a tenant.
#[utoipa::path(post, path = "/v1/admin/tenants/{name}/keys", tag = "admin", params(("name" = String, Path, min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9._-]{1,64}$")),
    responses((status = 201, body = KeyOut), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn create_key(
    State(state): State<AppState>,
    _admin: Admin,
    PathParams(name): PathParams<String>,
) -> Result<(StatusCode, Json<KeyOut>), ApiError> {
    let t = tenant_named(&state, &name).await?;
    let api_key = issue_key(state.store.as_ref(), Some(t.id), false).await?;
    Ok((
        StatusCode::CREATED,
        Json(KeyOut {
            tenant: name,
            api_key,
        }),
    ))
}

/// Put a tenant in a class: the `tenant_class` label of its schedule-lag and claim-lag
/// histograms (nodes pick a change up within 30 s). Classes keep the metrics' cardinality
/// bounded: at most 16 distinct classes across all tenants.
#[utoipa::path(put, path = "/v1/admin/tenants/{name}/class", tag = "admin", params(("name" = String, Path, min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9._-]{1,64}$")),
    request_body = ClassInput,
    responses((status = 200, body = TenantOut), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn set_class(
    State(state): State<AppState>,
    _admin: Admin,
    PathParams(name): PathParams<String>,
    body: JsonBody<ClassInput>,
) -> Result<Json<TenantOut>, ApiError> {
    let class = body.value.class;
    let t = tenant_named(&state, &name).await?;
    state
        .store
        .tenant_class_set(TenantClassSet {
            tenant: t.id,
            class: class.clone(),
        })
        .await?;
    Ok(Json(TenantOut::of(campanile_store::Tenant { class, ..t })))
}

/// Set how long a tenant's finished occurrences stay before retention archives them and
/// removes them from the database (each counted in per-day rollups that reconcile reads).
#[utoipa::path(put, path = "/v1/admin/tenants/{name}/retention", tag = "admin", params(("name" = String, Path, min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9._-]{1,64}$")),
    request_body = RetentionInput,
    responses((status = 200, body = TenantOut), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn set_retention(
    State(state): State<AppState>,
    _admin: Admin,
    PathParams(name): PathParams<String>,
    body: JsonBody<RetentionInput>,
) -> Result<Json<TenantOut>, ApiError> {
    let retention = match body.value.retention_days {
        None => Retention::Default,
        Some(0) => Retention::Forever,
        Some(d) if d > 36_500 => {
            return Err(ApiError::invalid(
                "retention_days: at most 36500 (100 years); 0 keeps history forever",
            ));
        }
        Some(d) => Retention::For(jiff::SignedDuration::from_hours(i64::from(d) * 24)),
    };
    let t = tenant_named(&state, &name).await?;
    state
        .store
        .tenant_retention_set(TenantRetentionSet {
            tenant: t.id,
            retention,
        })
        .await?;
    Ok(Json(TenantOut::of(campanile_store::Tenant {
        retention,
        ..t
    })))
}

async fn quotas_of(state: &AppState, t: &campanile_store::Tenant) -> Result<QuotasOut, ApiError> {
    let q = state
        .store
        .tenant_quota_get(TenantQuotaGet { tenant: t.id })
        .await?;
    let limits = state
        .store
        .queue_limit_list(QueueLimitList { tenant: t.id })
        .await?;
    Ok(QuotasOut {
        tenant: t.name.clone(),
        max_active_schedules: q.max_active_schedules,
        max_running: q.max_running,
        max_triggers_per_sec: q.max_triggers_per_sec,
        max_catchup_per_sec: q.max_catchup_per_sec,
        queue_limits: limits
            .into_iter()
            .map(|l| QueueLimitOut {
                queue: l.queue,
                max_running: l.max_running,
            })
            .collect(),
    })
}

/// A tenant's quotas and per-queue limits.
#[utoipa::path(get, path = "/v1/admin/tenants/{name}/quotas", tag = "admin", params(("name" = String, Path, min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9._-]{1,64}$")),
    responses((status = 200, body = QuotasOut), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_quotas(
    State(state): State<AppState>,
    _admin: Admin,
    PathParams(name): PathParams<String>,
) -> Result<Json<QuotasOut>, ApiError> {
    let t = tenant_named(&state, &name).await?;
    Ok(Json(quotas_of(&state, &t).await?))
}

/// Set a tenant's quotas, all four at once: each one absent or null is removed.
#[utoipa::path(put, path = "/v1/admin/tenants/{name}/quotas", tag = "admin", params(("name" = String, Path, min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9._-]{1,64}$")),
    request_body = QuotasInput,
    responses((status = 200, body = QuotasOut), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn set_quotas(
    State(state): State<AppState>,
    _admin: Admin,
    PathParams(name): PathParams<String>,
    body: JsonBody<QuotasInput>,
) -> Result<Json<QuotasOut>, ApiError> {
    let q = body.value;
    let t = tenant_named(&state, &name).await?;
    state
        .store
        .tenant_quota_set(TenantQuota {
            tenant: t.id,
            max_active_schedules: q.max_active_schedules.map(i64::from),
            max_running: q.max_running.map(i64::from),
            max_triggers_per_sec: q.max_triggers_per_sec.map(i64::from),
            max_catchup_per_sec: q.max_catchup_per_sec.map(i64::from),
        })
        .await?;
    Ok(Json(quotas_of(&state, &t).await?))
}

/// Set (or with null remove) the concurrency limit of one of a tenant's queues: at most that
/// many of its occurrences running at once, across all workers and nodes.
#[utoipa::path(put, path = "/v1/admin/tenants/{name}/queues/{queue}/limit", tag = "admin", params(("name" = String, Path, min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9._-]{1,64}$"), ("queue" = String, Path, min_length = 1, max_length = 200)),
    request_body = QueueLimitInput,
    responses((status = 200, body = QuotasOut), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn set_queue_limit(
    State(state): State<AppState>,
    _admin: Admin,
    PathParams((name, queue)): PathParams<(String, String)>,
    body: JsonBody<QueueLimitInput>,
) -> Result<Json<QuotasOut>, ApiError> {
    campanile_core::check_claimable_queue(&queue)
        .map_err(|e| ApiError::invalid(format!("queue: {e}")))?;
    let t = tenant_named(&state, &name).await?;
    state
        .store
        .queue_limit_set(QueueLimitSet {
            tenant: t.id,
            queue,
            max_running: body.value.max_running.map(i64::from),
        })
        .await?;
    Ok(Json(quotas_of(&state, &t).await?))
}
