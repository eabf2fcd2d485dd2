//! Tenants, their quotas, classes and per-queue limits, and a claim's allowance under them.

use campanile_core::ScheduleId;
use campanile_store::*;
use rusqlite::{Connection, OptionalExtension, params};

use crate::db::{R, db_err, ts};

pub(crate) fn tenant_create(c: &Connection, name: &str, now: i64) -> R<Tenant> {
    let id = c
        .prepare_cached("INSERT INTO tenants (name, created_at) VALUES (?1, ?2) RETURNING id")
        .and_then(|mut s| s.query_row(params![name, now], |r| r.get::<_, i64>(0)))
        .map_err(|e| match db_err(e) {
            StoreError::AlreadyExists(_) => StoreError::AlreadyExists(format!("tenant '{name}'")),
            other => other,
        })?;
    Ok(Tenant {
        id: TenantId(id),
        name: name.to_string(),
        created_at: ts(now)?,
        class: classes::DEFAULT_CLASS.into(),
        retention: Retention::Default,
    })
}

type TenantRow = (i64, String, i64, String, Option<i64>);

pub(crate) fn tenant_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TenantRow> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

pub(crate) fn tenant((id, name, at, class, retention): TenantRow) -> R<Tenant> {
    Ok(Tenant {
        id: TenantId(id),
        name,
        created_at: ts(at)?,
        class,
        retention: Retention::from_ms(retention),
    })
}

pub(crate) fn tenant_list(c: &Connection) -> R<Vec<Tenant>> {
    c.prepare_cached("SELECT id, name, created_at, class, retention_ms FROM tenants ORDER BY name")
        .and_then(|mut s| {
            s.query_map([], tenant_row)?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(db_err)?
        .into_iter()
        .map(tenant)
        .collect()
}

pub(crate) fn tenant_by_name(c: &Connection, name: &str) -> R<Option<Tenant>> {
    c.prepare_cached(
        "SELECT id, name, created_at, class, retention_ms FROM tenants WHERE name = ?1",
    )
    .and_then(|mut s| s.query_row(params![name], tenant_row).optional())
    .map_err(db_err)?
    .map(tenant)
    .transpose()
}

/// Sets a tenant's class, refusing one that would make more than `classes::MAX_CLASSES`
/// distinct classes (counted by the single writer, so two admins cannot both pass).
pub(crate) fn tenant_class_set(c: &Connection, p: &TenantClassSet) -> R<()> {
    classes::validate(&p.class)?;
    let (others, taken): (i64, bool) = c
        .prepare_cached(
            "SELECT COUNT(DISTINCT class), COALESCE(MAX(class = ?2), 0) FROM tenants WHERE id <> ?1 AND class <> 'default'",
        )
        .and_then(|mut s| s.query_row(params![p.tenant.0, p.class], |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(db_err)?;
    classes::check_count(&p.class, others, taken)?;
    let n = c
        .prepare_cached("UPDATE tenants SET class = ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![p.tenant.0, p.class]))
        .map_err(db_err)?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("tenant {}", p.tenant.0)));
    }
    Ok(())
}

pub(crate) fn tenant_quota_set(c: &Connection, p: &TenantQuota) -> R<()> {
    let n = c
        .prepare_cached(
            "UPDATE tenants SET max_active_schedules = ?2, max_running = ?3, max_triggers_per_sec = ?4,
                    max_catchup_per_sec = ?5 WHERE id = ?1",
        )
        .and_then(|mut s| {
            s.execute(params![p.tenant.0, p.max_active_schedules, p.max_running, p.max_triggers_per_sec, p.max_catchup_per_sec])
        })
        .map_err(db_err)?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("tenant {}", p.tenant.0)));
    }
    Ok(())
}

pub(crate) fn queue_limit_set(
    c: &Connection,
    tenant: TenantId,
    queue: &str,
    max_running: Option<i64>,
) -> R<()> {
    match max_running {
        None => c
            .prepare_cached("DELETE FROM queue_limits WHERE tenant_id = ?1 AND queue = ?2")
            .and_then(|mut s| s.execute(params![tenant.0, queue])),
        Some(m) => c
            .prepare_cached(
                "INSERT INTO queue_limits (tenant_id, queue, max_running) VALUES (?1, ?2, ?3)
                 ON CONFLICT (tenant_id, queue) DO UPDATE SET max_running = excluded.max_running",
            )
            .and_then(|mut s| s.execute(params![tenant.0, queue, m])),
    }
    .map(|_| ())
    .map_err(db_err)
}

pub(crate) fn queue_limit_list(c: &Connection, tenant: TenantId) -> R<Vec<QueueLimit>> {
    c.prepare_cached(
        "SELECT queue, max_running FROM queue_limits WHERE tenant_id = ?1 ORDER BY queue",
    )
    .and_then(|mut s| {
        s.query_map(params![tenant.0], |r| {
            Ok(QueueLimit {
                queue: r.get(0)?,
                max_running: r.get(1)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()
    })
    .map_err(db_err)
}

/// How many occurrences a claim may take without exceeding the tenant's running quota or the
/// queue's concurrency limit (runs on the single writer, so the count and the claim are one).
pub(crate) fn claim_allowance(c: &Connection, tenant: TenantId, queue: &str, max: u32) -> R<u32> {
    let tenant_limit: Option<i64> = c
        .prepare_cached("SELECT max_running FROM tenants WHERE id = ?1")
        .and_then(|mut s| s.query_row(params![tenant.0], |r| r.get(0)).optional())
        .map_err(db_err)?
        .flatten();
    let queue_limit: Option<i64> = c
        .prepare_cached("SELECT max_running FROM queue_limits WHERE tenant_id = ?1 AND queue = ?2")
        .and_then(|mut s| {
            s.query_row(params![tenant.0, queue], |r| r.get(0))
                .optional()
        })
        .map_err(db_err)?;
    let mut allowed = i64::from(max);
    if let Some(limit) = tenant_limit {
        let running: i64 = c
            .prepare_cached(
                "SELECT COUNT(*) FROM occurrences WHERE tenant_id = ?1 AND state = 'RUNNING'",
            )
            .and_then(|mut s| s.query_row(params![tenant.0], |r| r.get(0)))
            .map_err(db_err)?;
        allowed = allowed.min(limit - running);
    }
    if let Some(limit) = queue_limit {
        let running: i64 = c
            .prepare_cached("SELECT COUNT(*) FROM occurrences WHERE tenant_id = ?1 AND queue = ?2 AND state = 'RUNNING'")
            .and_then(|mut s| s.query_row(params![tenant.0, queue], |r| r.get(0)))
            .map_err(db_err)?;
        allowed = allowed.min(limit - running);
    }
    Ok(allowed.max(0) as u32)
}

/// Refuses a schedule change that would exceed the tenant's active-schedules or trigger-rate
/// quota (`exclude`: the schedule being replaced, whose current rate does not count).
pub(crate) fn check_schedule_quota(
    c: &Connection,
    tenant: TenantId,
    adding: i64,
    fires_per_hour: i64,
    exclude: Option<ScheduleId>,
) -> R<()> {
    let limits: Option<(Option<i64>, Option<i64>)> = c
        .prepare_cached(
            "SELECT max_active_schedules, max_triggers_per_sec FROM tenants WHERE id = ?1",
        )
        .and_then(|mut s| {
            s.query_row(params![tenant.0], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(db_err)?;
    let Some((max_active, max_rate)) = limits else {
        return Ok(());
    };
    if let Some(limit) = max_active.filter(|_| adding > 0) {
        let active: i64 = c
            .prepare_cached(
                "SELECT COUNT(*) FROM schedules WHERE tenant_id = ?1 AND state = 'ACTIVE'",
            )
            .and_then(|mut s| s.query_row(params![tenant.0], |r| r.get(0)))
            .map_err(db_err)?;
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
        let fires: i64 = c
            .prepare_cached(
                "SELECT COALESCE(SUM(fires_per_hour), 0) FROM schedules
                  WHERE tenant_id = ?1 AND state = 'ACTIVE' AND (?2 IS NULL OR id <> ?2)",
            )
            .and_then(|mut s| s.query_row(params![tenant.0, exclude.map(|e| e.0)], |r| r.get(0)))
            .map_err(db_err)?;
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

pub(crate) fn tenant_quota_get(c: &Connection, tenant: TenantId) -> R<TenantQuota> {
    c.prepare_cached("SELECT max_active_schedules, max_running, max_triggers_per_sec, max_catchup_per_sec FROM tenants WHERE id = ?1")
        .and_then(|mut s| {
            s.query_row(params![tenant.0], |r| {
                Ok(TenantQuota { tenant, max_active_schedules: r.get(0)?, max_running: r.get(1)?, max_triggers_per_sec: r.get(2)?, max_catchup_per_sec: r.get(3)? })
            })
            .optional()
        })
        .map_err(db_err)?
        .ok_or_else(|| StoreError::NotFound(format!("tenant {}", tenant.0)))
}

/// [`Store::tenant_catchup_reserve`] on the writer: the tenant's pace cursor moves on by the
/// reserved slots' span, from `now` at the earliest.
pub(crate) fn catchup_reserve(
    c: &Connection,
    tenant: TenantId,
    count: u32,
    now: i64,
) -> R<Option<CatchupSlots>> {
    if count == 0 {
        return Ok(None);
    }
    let rate: Option<i64> = c
        .prepare_cached(
            "SELECT max_catchup_per_sec FROM tenants WHERE id = ?1 AND max_catchup_per_sec > 0",
        )
        .and_then(|mut s| s.query_row(params![tenant.0], |r| r.get(0)).optional())
        .map_err(db_err)?;
    let Some(rate) = rate else {
        return Ok(None);
    };
    let span = rules::catchup_span_ms(count, rate);
    let next: i64 = c
        .prepare_cached(
            "UPDATE tenants SET catchup_next_at = MAX(COALESCE(catchup_next_at, ?2), ?2) + ?3
              WHERE id = ?1 RETURNING catchup_next_at",
        )
        .and_then(|mut s| s.query_row(params![tenant.0, now, span], |r| r.get(0)))
        .map_err(db_err)?;
    Ok(Some(CatchupSlots {
        start: ts(next - span)?,
        rate,
        count,
    }))
}
