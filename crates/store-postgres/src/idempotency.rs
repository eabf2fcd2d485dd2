//! Idempotency reservations of creating requests.

use campanile_core::ScheduleId;
use campanile_store::*;
use deadpool_postgres::Client;

use crate::db::{R, execute, query, resolve_now};

pub(crate) async fn idempotency_get(
    c: &Client,
    tenant: TenantId,
    key: &str,
) -> R<Option<IdempotentResponse>> {
    Ok(query(c, "SELECT request_hash, status, response, schedule_id FROM idempotency_keys WHERE tenant_id = $1 AND key = $2", &[&tenant.0, &key])
        .await?
        .first()
        .map(|r| IdempotentResponse {
            request_hash: r.get(0),
            status: r.get::<_, Option<i32>>(1).map_or(200, |s| s as u16),
            body: r.get::<_, Option<String>>(2).unwrap_or_default(),
            schedule_id: r.get::<_, Option<uuid::Uuid>>(3).map(ScheduleId),
        }))
}

/// Inserts the answer or reservation; or takes over a reservation of the same request that
/// has neither an answer nor a schedule and was made at or before `$8`. (A create holding the
/// reservation row locked makes this wait for it, and then see its schedule.)
pub(crate) async fn idempotency_put(c: &Client, p: IdempotencyPut) -> R<bool> {
    let now = resolve_now(c, p.now).await?;
    let stale = now.saturating_sub(p.take_over_after.as_millis() as i64);
    let n = execute(
        c,
        "INSERT INTO idempotency_keys (tenant_id, key, request_hash, status, response, created_at, token)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (tenant_id, key) DO UPDATE SET token = excluded.token, created_at = excluded.created_at
          WHERE idempotency_keys.status = 0 AND idempotency_keys.schedule_id IS NULL
            AND idempotency_keys.created_at <= $8
            AND idempotency_keys.request_hash = excluded.request_hash",
        &[
            &p.tenant.0,
            &p.key,
            &p.request_hash,
            &i32::from(p.status),
            &p.body,
            &now,
            &p.token,
            &stale,
        ],
    )
    .await?;
    Ok(n == 1)
}

pub(crate) async fn idempotency_finish(
    c: &Client,
    tenant: TenantId,
    key: &str,
    token: &str,
    answer: Option<(u16, String)>,
) -> R<()> {
    match answer {
        Some((status, body)) => {
            execute(c, "UPDATE idempotency_keys SET status = $3, response = $4 WHERE tenant_id = $1 AND key = $2 AND status = 0", &[&tenant.0, &key, &i32::from(status), &body]).await
        }
        None => execute(c, "DELETE FROM idempotency_keys WHERE tenant_id = $1 AND key = $2 AND token = $3 AND status = 0 AND schedule_id IS NULL", &[&tenant.0, &key, &token]).await,
    }
    .map(|_| ())
}
