//! `/v1/admin`: tenant management with an admin key.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use campanile_store::{StoreError, TenantCreate};
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
        })
        .collect();
    Ok(Json(TenantList { tenants }))
}

/// Issue another API key for a tenant.
#[utoipa::path(post, path = "/v1/admin/tenants/{name}/keys", tag = "admin", params(("name" = String, Path)),
    responses((status = 201, body = KeyOut), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn create_key(
    State(state): State<AppState>,
    _admin: Admin,
    PathParams(name): PathParams<String>,
) -> Result<(StatusCode, Json<KeyOut>), ApiError> {
    let t = state
        .store
        .tenant_by_name(&name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("tenant '{name}'")))?;
    let api_key = issue_key(state.store.as_ref(), Some(t.id), false).await?;
    Ok((
        StatusCode::CREATED,
        Json(KeyOut {
            tenant: name,
            api_key,
        }),
    ))
}
