//! Tenants, API keys, schedule listing and idempotency keys on PostgreSQL.

use campanile_core::ScheduleId;
use campanile_store::*;
use deadpool_postgres::Client;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::ops::{R, execute, query, ts};
use crate::resolve_now;

fn tenant(r: &Row) -> R<Tenant> {
    Ok(Tenant {
        id: TenantId(r.get(0)),
        name: r.get(1),
        created_at: ts(r.get(2))?,
        class: r.get(3),
    })
}

pub(crate) async fn tenant_list(c: &Client) -> R<Vec<Tenant>> {
    query(
        c,
        "SELECT id, name, created_at, class FROM tenants ORDER BY name",
        &[],
    )
    .await?
    .iter()
    .map(tenant)
    .collect()
}

pub(crate) async fn tenant_by_name(c: &Client, name: &str) -> R<Option<Tenant>> {
    query(
        c,
        "SELECT id, name, created_at, class FROM tenants WHERE name = $1",
        &[&name],
    )
    .await?
    .first()
    .map(tenant)
    .transpose()
}

fn key(r: &Row) -> R<ApiKeyRecord> {
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
        .map(key)
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
    .map(key)
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

pub(crate) async fn schedule_list(c: &Client, p: ScheduleList) -> R<Vec<ScheduleRecord>> {
    // The cursor as an index range whatever the plan (a generic plan cannot turn
    // `$2 IS NULL OR id > $2` into one, and would read every page from the tenant's first).
    let ids: Vec<Uuid> = query(
        c,
        "SELECT s.id FROM schedules s JOIN schedule_versions v ON v.schedule_id = s.id AND v.version = s.version
          WHERE s.tenant_id = $1 AND s.id > COALESCE($2::uuid, '00000000-0000-0000-0000-000000000000')
            AND ($3::text IS NULL OR s.state = $3)
            AND ($4::text IS NULL OR v.queue = $4)
          ORDER BY s.id LIMIT $5",
        &[&p.tenant.0, &p.after.map(|a| a.0), &p.state.map(|st| st.as_str()), &p.queue, &i64::from(p.limit)],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(rec) = crate::schedules::schedule_get(c, p.tenant, ScheduleId(id)).await? {
            out.push(rec);
        }
    }
    Ok(out)
}

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

pub(crate) async fn tenant_quota_set(c: &Client, p: TenantQuota) -> R<()> {
    let n = execute(
        c,
        "UPDATE tenants SET max_active_schedules = $2, max_running = $3, max_triggers_per_sec = $4, max_catchup_per_sec = $5 WHERE id = $1",
        &[&p.tenant.0, &p.max_active_schedules, &p.max_running, &p.max_triggers_per_sec, &p.max_catchup_per_sec],
    )
    .await?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("tenant {}", p.tenant.0)));
    }
    Ok(())
}

/// Sets a tenant's class, refusing one that would make more than `classes::MAX_CLASSES`
/// distinct classes: counted under a transaction-scoped advisory lock, so two admins (on any
/// nodes) cannot both pass the count.
pub(crate) async fn tenant_class_set(c: &mut Client, p: TenantClassSet) -> R<()> {
    classes::validate(&p.class)?;
    let tx = c.transaction().await.map_err(crate::pg_err)?;
    execute(
        &tx,
        "SELECT pg_advisory_xact_lock(hashtextextended('campanile/tenant-classes', 0))",
        &[],
    )
    .await?;
    let rows = query(
        &tx,
        "SELECT COUNT(DISTINCT class), COALESCE(bool_or(class = $2), false) FROM tenants WHERE id <> $1 AND class <> 'default'",
        &[&p.tenant.0, &p.class],
    )
    .await?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Database("no count returned".into()))?;
    classes::check_count(&p.class, row.get(0), row.get(1))?;
    let n = execute(
        &tx,
        "UPDATE tenants SET class = $2 WHERE id = $1",
        &[&p.tenant.0, &p.class],
    )
    .await?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("tenant {}", p.tenant.0)));
    }
    tx.commit().await.map_err(crate::pg_err)
}

pub(crate) async fn queue_limit_set(
    c: &Client,
    tenant: TenantId,
    queue: &str,
    max_running: Option<i64>,
) -> R<()> {
    match max_running {
        None => {
            execute(
                c,
                "DELETE FROM queue_limits WHERE tenant_id = $1 AND queue = $2",
                &[&tenant.0, &queue],
            )
            .await
        }
        Some(m) => {
            execute(
                c,
                "INSERT INTO queue_limits (tenant_id, queue, max_running) VALUES ($1, $2, $3)
                 ON CONFLICT (tenant_id, queue) DO UPDATE SET max_running = excluded.max_running",
                &[&tenant.0, &queue, &m],
            )
            .await
        }
    }
    .map(|_| ())
}

/// Refuses a schedule change that would exceed the tenant's active-schedules or trigger-rate
/// quota (under a per-tenant lock; `exclude`: the schedule being replaced).
pub(crate) async fn check_schedule_quota<C: deadpool_postgres::GenericClient>(
    c: &C,
    tenant: TenantId,
    adding: i64,
    fires_per_hour: i64,
    exclude: Option<campanile_core::ScheduleId>,
) -> R<()> {
    let rows = query(
        c,
        "SELECT max_active_schedules, max_triggers_per_sec FROM tenants WHERE id = $1",
        &[&tenant.0],
    )
    .await?;
    let Some(r) = rows.first() else { return Ok(()) };
    let (max_active, max_rate): (Option<i64>, Option<i64>) = (r.get(0), r.get(1));
    if max_active.is_none() && max_rate.is_none() {
        return Ok(());
    }
    execute(
        c,
        "SELECT pg_advisory_xact_lock(hashtextextended('campanile/schedules/' || $1::text, 0))",
        &[&tenant.0.to_string()],
    )
    .await?;
    if let Some(limit) = max_active.filter(|_| adding > 0) {
        let active: i64 = query(
            c,
            "SELECT count(*) FROM schedules WHERE tenant_id = $1 AND state = 'ACTIVE'",
            &[&tenant.0],
        )
        .await?
        .first()
        .map_or(0, |r| r.get(0));
        if active + adding > limit {
            return Err(StoreError::QuotaExceeded {
                quota: Quota::ActiveSchedules,
                message: format!(
                    "the tenant may have at most {limit} active schedules ({active} now)"
                ),
            });
        }
    }
    if let Some(rate) = max_rate {
        let fires: i64 = query(
            c,
            "SELECT COALESCE(SUM(fires_per_hour), 0)::int8 FROM schedules WHERE tenant_id = $1 AND state = 'ACTIVE' AND ($2::uuid IS NULL OR id <> $2)",
            &[&tenant.0, &exclude.map(|e| e.0)],
        )
        .await?
        .first()
        .map_or(0, |r| r.get(0));
        if fires + fires_per_hour > rate * 3600 {
            return Err(StoreError::QuotaExceeded {
                quota: Quota::TriggersPerSec,
                message: format!(
                    "the tenant's schedules may fire at most {rate} times per second in total ({} an hour); this one fires up to {fires_per_hour} times in an hour, the others up to {fires}",
                    rate.saturating_mul(3600)
                ),
            });
        }
    }
    Ok(())
}

pub(crate) async fn tenant_quota_get(c: &Client, tenant: TenantId) -> R<TenantQuota> {
    let rows = query(c, "SELECT max_active_schedules, max_running, max_triggers_per_sec, max_catchup_per_sec FROM tenants WHERE id = $1", &[&tenant.0]).await?;
    let r = rows
        .first()
        .ok_or_else(|| StoreError::NotFound(format!("tenant {}", tenant.0)))?;
    Ok(TenantQuota {
        tenant,
        max_active_schedules: r.get(0),
        max_running: r.get(1),
        max_triggers_per_sec: r.get(2),
        max_catchup_per_sec: r.get(3),
    })
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
