//! `/v1/admin`: tenant management with an admin key.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use campanile_store::{StoreError, TenantByName, TenantClassSet, TenantCreate};
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
        .map(|t| TenantOut {
            name: t.name,
            created_at: t.created_at,
            class: t.class,
        })
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
    Ok(Json(TenantOut {
        name: t.name,
        created_at: t.created_at,
        class,
    }))
}
