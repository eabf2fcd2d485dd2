//! Upgrading a database written by an older campanile.

use campanile_store::StoreError;
use campanile_store_sqlite::{MIGRATIONS, SqliteStore};
use rusqlite::Connection;

/// The outbox-relay migration reserves queue names starting with `$`.
const RESERVING: i64 = 4;

/// A database at the schema before `RESERVING`, with one ACTIVE schedule on `queue`.
fn old_database(path: &std::path::Path, queue: &str) {
    let conn = Connection::open(path).expect("open");
    conn.execute_batch(
        "CREATE TABLE campanile_migrations (
             version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)",
    )
    .expect("migrations table");
    for (version, name, sql) in MIGRATIONS.iter().filter(|m| m.0 < RESERVING) {
        conn.execute_batch(sql).expect("old migration");
        conn.execute(
            "INSERT INTO campanile_migrations (version, name, applied_at) VALUES (?1, ?2, 0)",
            rusqlite::params![version, name],
        )
        .expect("record migration");
    }
    conn.execute_batch(&format!(
        "INSERT INTO schedules (id, tenant_id, version, state, shard, next_run_at, created_at, updated_at)
         VALUES (X'01', 1, 1, 'ACTIVE', 0, 0, 0, 0);
         INSERT INTO schedule_versions (schedule_id, version, kind, cron, timezone, queue, priority,
             lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms, misfire, overlap,
             flex_window_ms, created_at)
         VALUES (X'01', 1, 'cron', '0 9 * * *', 'UTC', '{queue}', 0, 30000, 3, 1000, 60000,
             'SKIP', 'ALLOW', 0, 0);"
    ))
    .expect("old schedule");
}

fn schema_version(path: &std::path::Path) -> i64 {
    Connection::open(path)
        .expect("open")
        .query_row("SELECT MAX(version) FROM campanile_migrations", [], |r| {
            r.get(0)
        })
        .expect("version")
}

#[test]
fn upgrade_refuses_a_live_queue_named_like_a_reserved_route() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.db");
    old_database(&path, "$legacy");
    let Err(err) = SqliteStore::open(&path) else {
        panic!("a live '$legacy' queue must stop the upgrade");
    };
    let StoreError::Migration(msg) = &err else {
        panic!("expected a migration error, got {err:?}");
    };
    assert!(msg.contains("'$legacy'"), "{msg}");
    assert!(msg.contains("reserved"), "{msg}");
    // Nothing was applied: the database is still the old one, usable by the old binary.
    assert_eq!(schema_version(&path), RESERVING - 1);

    // Once that schedule is canceled (and nothing of it is pending), the upgrade goes on.
    Connection::open(&path)
        .expect("open")
        .execute("UPDATE schedules SET state = 'CANCELED'", [])
        .expect("cancel");
    SqliteStore::open(&path).expect("upgrade after the queue is retired");
    assert_eq!(
        schema_version(&path),
        MIGRATIONS.last().expect("migrations").0
    );
}

#[test]
fn upgrade_keeps_ordinary_queues() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.db");
    old_database(&path, "billing");
    SqliteStore::open(&path).expect("upgrade");
    assert_eq!(
        schema_version(&path),
        MIGRATIONS.last().expect("migrations").0
    );
}
