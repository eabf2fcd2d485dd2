//! API keys: generation, hashing, and the extractor that turns `Authorization: Bearer <key>`
//! into the caller's tenant.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use campanile_store::{ApiKeyCreate, ApiKeyFind, ApiKeyRecord, Store, StoreError, TenantId};
use sha2::{Digest, Sha256};

use crate::{ApiError, AppState};

/// A new random API key: `cmp_` and 64 hex characters (244 random bits).
pub fn new_key() -> String {
    format!(
        "cmp_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// SHA-256 of a key. Keys are long random strings, so a fast hash is the right one: there is
/// nothing to brute-force, and verification stays cheap on every request.
pub fn hash_key(key: &str) -> Vec<u8> {
    Sha256::digest(key.as_bytes()).to_vec()
}

/// The first characters of a key, stored to tell keys apart and to revoke them.
pub fn key_prefix(key: &str) -> String {
    key.chars().take(12).collect()
}

/// Creates a key for `tenant` (or an admin key) and returns it; only its hash is stored.
///
/// # Errors
///
/// Whatever the store returns.
pub async fn issue_key(
    store: &dyn Store,
    tenant: Option<TenantId>,
    is_admin: bool,
) -> Result<String, StoreError> {
    let key = new_key();
    store
        .api_key_create(ApiKeyCreate {
            tenant,
            hash: hash_key(&key),
            prefix: key_prefix(&key),
            is_admin,
            now: None,
        })
        .await?;
    Ok(key)
}

/// The unrevoked key named by `Authorization: Bearer <key>`, or 401.
async fn authenticate(parts: &Parts, state: &AppState) -> Result<ApiKeyRecord, ApiError> {
    let value = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(ApiError::unauthorized)?;
    // The scheme is case-insensitive (RFC 9110 §11.1): `bearer` and `BEARER` are `Bearer`.
    let key = value
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key.trim())
        .filter(|k| !k.is_empty())
        .ok_or_else(ApiError::unauthorized)?;
    find_by_hash(state, hash_key(key)).await
}

/// The unrevoked key with this hash (through the node's key cache), or 401.
pub(crate) async fn find_by_hash(
    state: &AppState,
    hash: Vec<u8>,
) -> Result<ApiKeyRecord, ApiError> {
    if let Some(record) = state.keys.get(&hash) {
        return Ok(record);
    }
    let record = state
        .store
        .api_key_find(ApiKeyFind { hash: hash.clone() })
        .await?
        .ok_or_else(ApiError::unauthorized)?;
    state.keys.put(hash, &record);
    Ok(record)
}

/// The authenticated caller: every handler that takes it is scoped to this tenant.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller {
    /// The caller's tenant.
    pub(crate) tenant: TenantId,
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, ApiError> {
        let record = authenticate(parts, state).await?;
        let tenant = record.tenant.ok_or_else(|| {
            ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "forbidden",
                "admin keys manage tenants; use a tenant key for the API",
            )
        })?;
        Ok(Caller { tenant })
    }
}

/// An authenticated admin key: may manage tenants and keys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Admin, ApiError> {
        let record = authenticate(parts, state).await?;
        if !record.is_admin {
            return Err(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "forbidden",
                "tenant management needs an admin key (campanile key create --admin)",
            ));
        }
        Ok(Admin)
    }
}
