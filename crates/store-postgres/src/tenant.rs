//! Tenants, their quotas, classes and per-queue limits.

use campanile_store::*;
use deadpool_postgres::{Client, GenericClient};
use tokio_postgres::Row;

use crate::db::{R, execute, pg_err, query, resolve_now, ts};

pub(crate) async fn tenant_create(c: &Client, p: TenantCreate) -> R<Tenant> {
    let now = resolve_now(c, p.now).await?;
    let rows = query(
        c,
        "INSERT INTO tenants (name, created_at) VALUES ($1, $2) RETURNING id",
        &[&p.name, &now],
    )
    .await
    .map_err(|e| match e {
        StoreError::AlreadyExists(_) => StoreError::AlreadyExists(format!("tenant '{}'", p.name)),
        other => other,
    })?;
    let id: i64 = rows
        .first()
        .ok_or_else(|| StoreError::Database("no id returned".into()))?
        .get(0);
    Ok(Tenant {
        id: TenantId(id),
        name: p.name,
        created_at: ts(now)?,
        class: classes::DEFAULT_CLASS.into(),
        retention: Retention::Default,
    })
}

pub(crate) fn tenant_row(r: &Row) -> R<Tenant> {
    Ok(Tenant {
        id: TenantId(r.get(0)),
        name: r.get(1),
        created_at: ts(r.get(2))?,
        class: r.get(3),
        retention: Retention::from_ms(r.get(4)),
    })
}

pub(crate) async fn tenant_list(c: &Client) -> R<Vec<Tenant>> {
    query(
        c,
        "SELECT id, name, created_at, class, retention_ms FROM tenants ORDER BY name",
        &[],
    )
    .await?
    .iter()
    .map(tenant_row)
    .collect()
}

pub(crate) async fn tenant_by_name(c: &Client, name: &str) -> R<Option<Tenant>> {
    query(
        c,
        "SELECT id, name, created_at, class, retention_ms FROM tenants WHERE name = $1",
        &[&name],
    )
    .await?
    .first()
    .map(tenant_row)
    .transpose()
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
    let tx = c.transaction().await.map_err(pg_err)?;
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
    tx.commit().await.map_err(pg_err)
}

pub(crate) async fn queue_limit_list(c: &Client, tenant: TenantId) -> R<Vec<QueueLimit>> {
    Ok(query(
        c,
        "SELECT queue, max_running FROM queue_limits WHERE tenant_id = $1 ORDER BY queue",
        &[&tenant.0],
    )
    .await?
    .iter()
    .map(|r| QueueLimit {
        queue: r.get(0),
        max_running: r.get(1),
    })
    .collect())
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

/// [`Store::tenant_catchup_reserve`], in the caller's transaction or on its own: the tenant's
/// pace cursor moves on by the reserved slots' span, from `now` at the earliest (the row lock
/// serializes reservations of one tenant).
pub(crate) async fn catchup_reserve<C: GenericClient>(
    c: &C,
    tenant: TenantId,
    count: u32,
    now: i64,
) -> R<Option<CatchupSlots>> {
    if count == 0 {
        return Ok(None);
    }
    let rows = query(
        c,
        "UPDATE tenants
            SET catchup_next_at = GREATEST(COALESCE(catchup_next_at, $2), $2)
                                  + (($3::int8 * 1000 + max_catchup_per_sec - 1) / max_catchup_per_sec)
          WHERE id = $1 AND max_catchup_per_sec > 0
          RETURNING catchup_next_at, max_catchup_per_sec",
        &[&tenant.0, &now, &i64::from(count)],
    )
    .await?;
    let Some(r) = rows.first() else {
        return Ok(None);
    };
    let (next, rate): (i64, i64) = (r.get(0), r.get(1));
    Ok(Some(CatchupSlots {
        start: ts(next - rules::catchup_span_ms(count, rate))?,
        rate,
        count,
    }))
}
