//! Versioned migrations, embedded in the binary and applied in one transaction.

use campanile_store::{StoreError, upgrade};
use rusqlite::{Connection, OptionalExtension};

use crate::db::db_err;

/// `(version, name, sql)` of every migration, in order.
pub const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "init", include_str!("../migrations/0001_init.sql")),
    (
        2,
        "claim_indexes",
        include_str!("../migrations/0002_claim_indexes.sql"),
    ),
    (
        3,
        "deployment",
        include_str!("../migrations/0003_deployment.sql"),
    ),
    (
        4,
        "outbox_relay",
        include_str!("../migrations/0004_outbox_relay.sql"),
    ),
    (
        5,
        "attempts_on_occurrence",
        include_str!("../migrations/0005_attempts_on_occurrence.sql"),
    ),
    (
        6,
        "occurrence_lease",
        include_str!("../migrations/0006_occurrence_lease.sql"),
    ),
    (
        7,
        "node_seen",
        include_str!("../migrations/0007_node_seen.sql"),
    ),
    (
        8,
        "node_marks_by_end",
        include_str!("../migrations/0008_node_marks_by_end.sql"),
    ),
    (
        9,
        "tenant_class",
        include_str!("../migrations/0009_tenant_class.sql"),
    ),
    (
        10,
        "missed_range_superseded",
        include_str!("../migrations/0010_missed_range_superseded.sql"),
    ),
    (
        11,
        "finished_schedules",
        include_str!("../migrations/0011_finished_schedules.sql"),
    ),
    (
        12,
        "idempotency_token",
        include_str!("../migrations/0012_idempotency_token.sql"),
    ),
    (
        13,
        "overlap_history",
        include_str!("../migrations/0013_overlap_history.sql"),
    ),
    (
        14,
        "key_by_schedule",
        include_str!("../migrations/0014_key_by_schedule.sql"),
    ),
    (
        15,
        "claim_key",
        include_str!("../migrations/0015_claim_key.sql"),
    ),
    (
        16,
        "payload_bound",
        include_str!("../migrations/0016_payload_bound.sql"),
    ),
    (
        17,
        "retention",
        include_str!("../migrations/0017_retention.sql"),
    ),
    (
        18,
        "occurrence_origin",
        include_str!("../migrations/0018_occurrence_origin.sql"),
    ),
    (
        19,
        "backfill",
        include_str!("../migrations/0019_backfill.sql"),
    ),
    (
        20,
        "trigger_payload",
        include_str!("../migrations/0020_trigger_payload.sql"),
    ),
];

/// Checks run before a migration (`campanile_store::upgrade`); a row returned names what makes
/// the upgrade unsafe.
const GUARDS: &[(i64, &str)] = &[(4, upgrade::RESERVED_QUEUE_IN_USE)];

/// Applies the migrations the database lacks; refuses a database newer than this binary.
pub(crate) fn apply(conn: &mut Connection) -> Result<u32, StoreError> {
    let mig = |e: rusqlite::Error| StoreError::Migration(db_err(e).to_string());
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(mig)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS campanile_migrations (
             version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)",
    )
    .map_err(mig)?;
    let current: i64 = tx
        .query_row(
            "SELECT COALESCE(MAX(version), 0) FROM campanile_migrations",
            [],
            |r| r.get(0),
        )
        .map_err(mig)?;
    let latest = MIGRATIONS.last().map_or(0, |m| m.0);
    if current > latest {
        return Err(StoreError::Migration(format!(
            "database schema version {current} is newer than this binary's ({latest}); upgrade campanile"
        )));
    }
    let mut applied = 0;
    for (version, name, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        for (_, guard) in GUARDS.iter().filter(|g| g.0 == *version) {
            let found: Option<String> = tx
                .query_row(guard, [], |r| r.get(0))
                .optional()
                .map_err(mig)?;
            if let Some(queue) = found {
                return Err(StoreError::Migration(upgrade::reserved_queue_refusal(
                    *version, name, &queue,
                )));
            }
        }
        tx.execute_batch(sql)
            .map_err(|e| StoreError::Migration(format!("migration {version} ({name}): {e}")))?;
        tx.execute(
            "INSERT INTO campanile_migrations (version, name, applied_at)
             VALUES (?1, ?2, CAST(unixepoch('subsec') * 1000 AS INTEGER))",
            rusqlite::params![version, name],
        )
        .map_err(mig)?;
        applied += 1;
    }
    tx.commit().map_err(mig)?;
    Ok(applied)
}
