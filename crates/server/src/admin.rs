//! `/v1/admin`: tenant management with an admin key.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use campanile_store::{
    Retention, StoreError, TenantByName, TenantClassSet, TenantCreate, TenantRetentionSet,
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
