//! Versioned migrations, embedded in the binary, applied under an advisory lock so that
//! nodes starting together migrate once.

use campanile_store::{StoreError, upgrade};

use crate::{pg_err, pg_message};

/// `(version, name, sql)` of every migration, in order.
pub const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "init", include_str!("../migrations/0001_init.sql")),
    (
        2,
        "deployment",
        include_str!("../migrations/0002_deployment.sql"),
    ),
    (
        3,
        "outbox_relay",
        include_str!("../migrations/0003_outbox_relay.sql"),
    ),
    (
        4,
        "claim_constrained",
        include_str!("../migrations/0004_claim_constrained.sql"),
    ),
    (
        5,
        "attempts_on_occurrence",
        include_str!("../migrations/0005_attempts_on_occurrence.sql"),
    ),
    (
        6,
        "queue_carries_definition",
        include_str!("../migrations/0006_queue_carries_definition.sql"),
    ),
    (
        7,
        "occurrence_lease",
        include_str!("../migrations/0007_occurrence_lease.sql"),
    ),
    (
        8,
        "node_seen",
        include_str!("../migrations/0008_node_seen.sql"),
    ),
    (
        9,
        "node_marks_by_end",
        include_str!("../migrations/0009_node_marks_by_end.sql"),
    ),
    (
        10,
        "tenant_class",
        include_str!("../migrations/0010_tenant_class.sql"),
    ),
    (
        11,
        "missed_range_superseded",
        include_str!("../migrations/0011_missed_range_superseded.sql"),
    ),
    (
        12,
        "pending_constrained_by_schedule",
        include_str!("../migrations/0012_pending_constrained_by_schedule.sql"),
    ),
    (
        13,
        "finished_schedules",
        include_str!("../migrations/0013_finished_schedules.sql"),
    ),
    (
        14,
        "idempotency_token",
        include_str!("../migrations/0014_idempotency_token.sql"),
    ),
    (
        15,
        "overlap_history",
        include_str!("../migrations/0015_overlap_history.sql"),
    ),
    (
        16,
        "key_by_schedule",
        include_str!("../migrations/0016_key_by_schedule.sql"),
    ),
    (
        17,
        "claim_key",
        include_str!("../migrations/0017_claim_key.sql"),
    ),
];

/// Checks run before a migration (`campanile_store::upgrade`); a row returned names what makes
/// the upgrade unsafe.
const GUARDS: &[(i64, &str)] = &[(3, upgrade::RESERVED_QUEUE_IN_USE)];

const LOCK_KEY: i64 = 0x0063_616d_7061_6e69; // "campani"

pub(crate) async fn apply(client: &mut deadpool_postgres::Client) -> Result<u32, StoreError> {
    let mig = |e: tokio_postgres::Error| StoreError::Migration(pg_err(e).to_string());
    let tx = client.transaction().await.map_err(mig)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY])
        .await
        .map_err(mig)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS campanile_migrations (
             version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    )
    .await
    .map_err(mig)?;
    let current: i64 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM campanile_migrations",
            &[],
        )
        .await
        .map_err(mig)?
        .get(0);
    let latest = MIGRATIONS.last().map_or(0, |m| m.0);
    if current > latest {
        return Err(StoreError::Migration(format!(
            "database schema version {current} is newer than this binary's ({latest}); upgrade campanile"
        )));
    }
    let mut applied = 0;
    for (version, name, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        for (_, guard) in GUARDS.iter().filter(|g| g.0 == *version) {
            if let Some(row) = tx.query_opt(*guard, &[]).await.map_err(mig)? {
                return Err(StoreError::Migration(upgrade::reserved_queue_refusal(
                    *version,
                    name,
                    row.get(0),
                )));
            }
        }
        tx.batch_execute(sql).await.map_err(|e| {
            StoreError::Migration(format!("migration {version} ({name}): {}", pg_message(&e)))
        })?;
        tx.execute(
            "INSERT INTO campanile_migrations (version, name) VALUES ($1, $2)",
            &[version, name],
        )
        .await
        .map_err(mig)?;
        applied += 1;
    }
    tx.commit().await.map_err(mig)?;
    Ok(applied)
}
