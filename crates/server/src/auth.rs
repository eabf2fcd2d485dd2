//! API keys: generation, hashing, and the extractor that turns `Authorization: Bearer <key>`
//! into the caller's tenant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use campanile_core::Clock;
use campanile_store::{ApiKeyCreate, ApiKeyRecord, Store, StoreError, TenantId};
use jiff::{SignedDuration, Timestamp};
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

/// Keys this node verified recently, so that a worker's every claim and completion does not
/// also read the key table: a verified key is trusted for `ttl` after it was read, so a key
/// revoked elsewhere (`campanile key revoke`, another node) is refused by this node at most
/// `ttl` later. Only keys found valid are kept (an unknown or revoked key is looked up every
/// time), and the map is bounded: when full, expired entries go, and if none had expired, all.
/// A zero `ttl` turns the cache off.
pub(crate) struct KeyCache {
    ttl: SignedDuration,
    clock: Arc<dyn Clock>,
    entries: Mutex<HashMap<Vec<u8>, (ApiKeyRecord, Timestamp)>>,
}

/// Most keys a node keeps verified at once.
const KEY_CACHE_CAPACITY: usize = 4096;

impl KeyCache {
    pub(crate) fn new(ttl: std::time::Duration, clock: Arc<dyn Clock>) -> KeyCache {
        KeyCache {
            ttl: SignedDuration::try_from(ttl).unwrap_or(SignedDuration::MAX),
            clock,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// An empty cache with the same period, timed by `clock`.
    pub(crate) fn with_clock(&self, clock: Arc<dyn Clock>) -> KeyCache {
        KeyCache {
            ttl: self.ttl,
            clock,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, hash: &[u8]) -> Option<ApiKeyRecord> {
        if self.ttl.is_zero() {
            return None;
        }
        let now = self.clock.now();
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(hash)
            .filter(|(_, read_at)| now.duration_since(*read_at) < self.ttl)
            .map(|(record, _)| record.clone())
    }

    fn put(&self, hash: Vec<u8>, record: &ApiKeyRecord) {
        if self.ttl.is_zero() {
            return;
        }
        let now = self.clock.now();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= KEY_CACHE_CAPACITY && !entries.contains_key(&hash) {
            entries.retain(|_, (_, read_at)| now.duration_since(*read_at) < self.ttl);
            if entries.len() >= KEY_CACHE_CAPACITY {
                entries.clear();
            }
        }
        entries.insert(hash, (record.clone(), now));
    }
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
    let hash = hash_key(key);
    if let Some(record) = state.keys.get(&hash) {
        return Ok(record);
    }
    let record = state
        .store
        .api_key_find(&hash)
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
