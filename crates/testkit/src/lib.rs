//! What Campanile's test suites share (a dev-dependency only): stores of their own — a SQLite
//! file in a temporary directory, a PostgreSQL schema named for the test — and the services'
//! URLs, read from `CAMPANILE_TEST_PG_URL` / `CAMPANILE_TEST_NATS_URL`. A test whose service
//! is not configured is skipped with a printed notice, so `cargo test` passes on a laptop.

#![allow(clippy::expect_used)]

use campanile_store_postgres::{PgOptions, PgStore};
use campanile_store_sqlite::SqliteStore;

/// The PostgreSQL URL the tests use, or `None` after printing that `what` is skipped.
pub fn pg_url(what: &str) -> Option<String> {
    env_url("CAMPANILE_TEST_PG_URL", what)
}

/// The NATS URL the tests use, or `None` after printing that `what` is skipped.
pub fn nats_url(what: &str) -> Option<String> {
    env_url("CAMPANILE_TEST_NATS_URL", what)
}

fn env_url(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) => Some(url),
        Err(_) => {
            eprintln!("skipped: {var} is not set ({what})");
            None
        }
    }
}

/// A new schema name, unique to the test that asks (`t_` and a UUIDv7).
pub fn new_schema() -> String {
    format!("t_{}", uuid::Uuid::now_v7().simple())
}

/// A PostgreSQL store at `url` in `schema` (created and migrated), with a pool of `pool_size`.
///
/// # Panics
///
/// When the database cannot be reached or migrated: the test cannot run.
pub async fn pg_store_in(url: &str, schema: &str, pool_size: usize) -> PgStore {
    PgStore::connect_with(
        url,
        PgOptions {
            schema: Some(schema.to_string()),
            pool_size,
        },
    )
    .await
    .expect("connect to CAMPANILE_TEST_PG_URL")
}

/// A PostgreSQL store at `url` in a schema of its own, and the schema's name.
///
/// # Panics
///
/// As [`pg_store_in`].
pub async fn pg_store(url: &str, pool_size: usize) -> (PgStore, String) {
    let schema = new_schema();
    (pg_store_in(url, &schema, pool_size).await, schema)
}

/// A SQLite store in a new temporary directory, which lives as long as the second value.
///
/// # Panics
///
/// When the directory or the database cannot be created.
pub fn sqlite_store() -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("campanile.db")).expect("open SQLite");
    (store, dir)
}
