//! API keys: created, found by hash, revoked.

use campanile_store::*;
use deadpool_postgres::Client;
use tokio_postgres::Row;

use crate::db::{R, execute, query, resolve_now, ts};

pub(crate) fn key_row(r: &Row) -> R<ApiKeyRecord> {
    Ok(ApiKeyRecord {
        id: r.get(0),
        tenant: r.get::<_, Option<i64>>(1).map(TenantId),
        prefix: r.get(2),
        is_admin: r.get(3),
        created_at: ts(r.get(4))?,
        revoked_at: r.get::<_, Option<i64>>(5).map(ts).transpose()?,
    })
}

pub(crate) async fn api_key_create(c: &Client, p: ApiKeyCreate) -> R<ApiKeyRecord> {
    let now = resolve_now(c, p.now).await?;
    let rows = query(
        c,
        "INSERT INTO api_keys (tenant_id, key_hash, prefix, is_admin, created_at) VALUES ($1, $2, $3, $4, $5)
         RETURNING id, tenant_id, prefix, is_admin, created_at, revoked_at",
        &[&p.tenant.map(|t| t.0), &p.hash, &p.prefix, &p.is_admin, &now],
    )
    .await?;
    rows.first()
        .map(key_row)
        .ok_or_else(|| StoreError::Database("no key returned".into()))?
}

pub(crate) async fn api_key_find(c: &Client, hash: &[u8]) -> R<Option<ApiKeyRecord>> {
    query(
        c,
        "SELECT id, tenant_id, prefix, is_admin, created_at, revoked_at FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL",
        &[&hash],
    )
    .await?
    .first()
    .map(key_row)
    .transpose()
}

pub(crate) async fn api_key_revoke(
    c: &Client,
    prefix: &str,
    now: Option<jiff::Timestamp>,
) -> R<u64> {
    let now = resolve_now(c, now).await?;
    execute(
        c,
        "UPDATE api_keys SET revoked_at = $2 WHERE prefix = $1 AND revoked_at IS NULL",
        &[&prefix, &now],
    )
    .await
}
