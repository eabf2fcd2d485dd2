//! Idempotency reservations of creating requests.

use campanile_core::ScheduleId;
use campanile_store::*;
use rusqlite::{Connection, OptionalExtension, params};

use crate::db::{R, db_err};

pub(crate) fn idempotency_get(
    c: &Connection,
    tenant: TenantId,
    key: &str,
) -> R<Option<IdempotentResponse>> {
    c.prepare_cached("SELECT request_hash, status, response, schedule_id FROM idempotency_keys WHERE tenant_id = ?1 AND key = ?2")
        .and_then(|mut s| {
            s.query_row(params![tenant.0, key], |r| {
                Ok(IdempotentResponse {
                    request_hash: r.get(0)?,
                    status: r.get::<_, Option<u16>>(1)?.unwrap_or(200),
                    body: r.get::<_, Option<String>>(2)?.unwrap_or_default(),
                    schedule_id: r.get::<_, Option<uuid::Uuid>>(3)?.map(ScheduleId),
                })
            })
            .optional()
        })
        .map_err(db_err)
}

/// Inserts the answer or reservation; or takes over a reservation of the same request that
/// has neither an answer nor a schedule and was made at or before `?8`.
pub(crate) fn idempotency_put(c: &Connection, p: &IdempotencyPut, now: i64) -> R<bool> {
    let stale = now.saturating_sub(p.take_over_after.as_millis() as i64);
    c.prepare_cached(
        "INSERT INTO idempotency_keys (tenant_id, key, request_hash, status, response, created_at, token)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (tenant_id, key) DO UPDATE SET token = excluded.token, created_at = excluded.created_at
          WHERE idempotency_keys.status = 0 AND idempotency_keys.schedule_id IS NULL
            AND idempotency_keys.created_at <= ?8
            AND idempotency_keys.request_hash = excluded.request_hash",
    )
    .and_then(|mut s| {
        s.execute(params![
            p.tenant.0,
            p.key,
            p.request_hash,
            p.status,
            p.body,
            now,
            p.token,
            stale
        ])
    })
    .map(|n| n == 1)
    .map_err(db_err)
}

pub(crate) fn idempotency_finish(
    c: &Connection,
    tenant: TenantId,
    key: &str,
    token: &str,
    answer: Option<(u16, String)>,
) -> R<()> {
    match answer {
        Some((status, body)) => c
            .prepare_cached("UPDATE idempotency_keys SET status = ?3, response = ?4 WHERE tenant_id = ?1 AND key = ?2 AND status = 0")
            .and_then(|mut s| s.execute(params![tenant.0, key, status, body])),
        None => c
            .prepare_cached("DELETE FROM idempotency_keys WHERE tenant_id = ?1 AND key = ?2 AND token = ?3 AND status = 0 AND schedule_id IS NULL")
            .and_then(|mut s| s.execute(params![tenant.0, key, token])),
    }
    .map(|_| ())
    .map_err(db_err)
}
