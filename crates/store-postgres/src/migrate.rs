//! Versioned migrations, embedded in the binary, applied under an advisory lock so that
//! nodes starting together migrate once.

use campanile_store::{StoreError, upgrade};

use crate::db::{pg_err, pg_message};

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
    (
        18,
        "superseded_repair",
        include_str!("../migrations/0018_superseded_repair.sql"),
    ),
    (
        19,
        "retention",
        include_str!("../migrations/0019_retention.sql"),
    ),
    (
        20,
        "occurrence_origin",
        include_str!("../migrations/0020_occurrence_origin.sql"),
    ),
    (
        21,
        "backfill",
        include_str!("../migrations/0021_backfill.sql"),
    ),
    (
        22,
        "trigger_payload",
        include_str!("../migrations/0022_trigger_payload.sql"),
    ),
    (
        23,
        "occurrences_by_day",
        include_str!("../migrations/0023_occurrences_by_day.sql"),
    ),
    (
        24,
        "occurrences_without_seq_index",
        include_str!("../migrations/0024_occurrences_without_seq_index.sql"),
    ),
];

/// The repairs of migration 18, in order: `(what one repaired row is, statement)`. `$1` is the
/// database's clock in milliseconds, where a statement uses it. An occurrence counts as superseded when its version's
/// successor took effect before its instant: the change would have canceled it (or flagged it
/// for cancellation, if a worker holds it). A redriven dead letter of an older version was
/// scheduled before the change, and is left alone.
const SUPERSEDED_REPAIRS: &[(&str, &str)] = &[
    (
        "pending occurrence of a superseded version canceled",
        "UPDATE occurrences o SET state = 'CANCELED', finished_at = $1
           FROM schedule_versions nv
          WHERE o.state IN ('READY', 'RETRY_WAIT')
            AND nv.schedule_id = o.schedule_id AND nv.version = o.version + 1
            AND o.scheduled_for > nv.created_at",
    ),
    (
        "running occurrence of a superseded version flagged for cancellation",
        "UPDATE occurrences o SET cancel_requested = true
           FROM schedule_versions nv
          WHERE o.state = 'RUNNING' AND NOT o.cancel_requested
            AND nv.schedule_id = o.schedule_id AND nv.version = o.version + 1
            AND o.scheduled_for > nv.created_at",
    ),
    (
        "queue entry of a schedule not active, or beside one of its current version, dropped",
        "DELETE FROM schedule_queue q USING schedules s
          WHERE s.id = q.schedule_id AND q.version <> s.version
            AND (s.state <> 'ACTIVE'
                 OR EXISTS (SELECT 1 FROM schedule_queue c
                             WHERE c.schedule_id = s.id AND c.version = s.version))",
    ),
    (
        "active schedule's only queue entries carried to its current version",
        "UPDATE schedule_queue q SET version = s.version, kind = v.kind, cron = v.cron,
                timezone = v.timezone, dst_gap = v.dst_gap, dst_fold = v.dst_fold, at = v.at,
                every_ms = v.every_ms, anchor = v.anchor, queue = v.queue, priority = v.priority,
                lease_ms = v.lease_ms, max_attempts = v.max_attempts,
                backoff_initial_ms = v.backoff_initial_ms, backoff_max_ms = v.backoff_max_ms,
                misfire = v.misfire, overlap = v.overlap, flex_window_ms = v.flex_window_ms
           FROM schedules s JOIN schedule_versions v ON v.schedule_id = s.id AND v.version = s.version
          WHERE s.id = q.schedule_id AND q.version <> s.version",
    ),
    (
        "second queue entry of one schedule dropped",
        "DELETE FROM schedule_queue q
          WHERE EXISTS (SELECT 1 FROM schedule_queue e
                         WHERE e.schedule_id = q.schedule_id
                           AND (e.next_run_at, e.shard) < (q.next_run_at, q.shard))",
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
        if *version == 18 {
            repair_superseded(&tx).await?;
        }
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

/// Runs [`SUPERSEDED_REPAIRS`] and logs how many rows each repaired.
async fn repair_superseded(tx: &tokio_postgres::Transaction<'_>) -> Result<(), StoreError> {
    let now: i64 = tx
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8",
            &[],
        )
        .await
        .map_err(|e| StoreError::Migration(format!("migration 18: {}", pg_message(&e))))?
        .get(0);
    let mut total = 0;
    for (what, sql) in SUPERSEDED_REPAIRS {
        let params: &[&(dyn tokio_postgres::types::ToSql + Sync)] =
            if sql.contains("$1") { &[&now] } else { &[] };
        let n = tx.execute(*sql, params).await.map_err(|e| {
            StoreError::Migration(format!("migration 18 ({what}): {}", pg_message(&e)))
        })?;
        if n > 0 {
            tracing::warn!(rows = n, "upgrade repair: {what}");
        }
        total += n;
    }
    tracing::info!(
        rows = total,
        "upgrade repair of rows left by schedule changes racing planning commits: {total} repaired"
    );
    Ok(())
}
