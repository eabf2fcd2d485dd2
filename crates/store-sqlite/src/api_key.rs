//! API keys: created, found by hash, revoked.

use campanile_store::*;
use rusqlite::{Connection, OptionalExtension, params};

use crate::db::{R, db_err, ts};

/// `(id, tenant_id, prefix, is_admin, created_at, revoked_at)`.
pub(crate) type KeyRow = (i64, Option<i64>, String, bool, i64, Option<i64>);

pub(crate) fn key_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<KeyRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
    ))
}

pub(crate) fn key_record(row: KeyRow) -> R<ApiKeyRecord> {
    let (id, tenant, prefix, is_admin, created, revoked) = row;
    Ok(ApiKeyRecord {
        id,
        tenant: tenant.map(TenantId),
        prefix,
        is_admin,
        created_at: ts(created)?,
        revoked_at: revoked.map(ts).transpose()?,
    })
}

pub(crate) fn api_key_create(c: &Connection, p: &ApiKeyCreate, now: i64) -> R<ApiKeyRecord> {
    let row = c
        .prepare_cached(
            "INSERT INTO api_keys (tenant_id, key_hash, prefix, is_admin, created_at) VALUES (?1, ?2, ?3, ?4, ?5)
             RETURNING id, tenant_id, prefix, is_admin, created_at, revoked_at",
        )
        .and_then(|mut s| s.query_row(params![p.tenant.map(|t| t.0), p.hash, p.prefix, p.is_admin, now], key_row))
        .map_err(db_err)?;
    key_record(row)
}

pub(crate) fn api_key_find(c: &Connection, hash: &[u8]) -> R<Option<ApiKeyRecord>> {
    c.prepare_cached(
        "SELECT id, tenant_id, prefix, is_admin, created_at, revoked_at FROM api_keys
          WHERE key_hash = ?1 AND revoked_at IS NULL",
    )
    .and_then(|mut s| s.query_row(params![hash], key_row).optional())
    .map_err(db_err)?
    .map(key_record)
    .transpose()
}

pub(crate) fn api_key_revoke(c: &Connection, prefix: &str, now: i64) -> R<u64> {
    c.prepare_cached("UPDATE api_keys SET revoked_at = ?2 WHERE prefix = ?1 AND revoked_at IS NULL")
        .and_then(|mut s| s.execute(params![prefix, now]))
        .map(|n| n as u64)
        .map_err(db_err)
}
