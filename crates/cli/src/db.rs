//! Opening the store named by `--database`: a file path (embedded SQLite) or a
//! `postgres://` URL.

use std::sync::Arc;

use campanile_store::{Store, StoreError};
use campanile_store_postgres::{PgOptions, PgStore};
use campanile_store_sqlite::SqliteStore;

use crate::CliError;

/// Which backend a `--database` value names.
pub(crate) fn is_postgres(database: &str) -> bool {
    database.starts_with("postgres://") || database.starts_with("postgresql://")
}

/// Opens (and migrates) the store.
pub(crate) async fn open(
    database: &str,
    schema: Option<String>,
) -> Result<Arc<dyn Store>, CliError> {
    if is_postgres(database) {
        let store = PgStore::connect_with(
            database,
            PgOptions {
                schema,
                ..PgOptions::default()
            },
        )
        .await
        .map_err(|e| open_error(format!("cannot open {}: {e}", redact(database)), &e))?;
        Ok(Arc::new(store))
    } else {
        let store = SqliteStore::open(database)
            .map_err(|e| open_error(format!("cannot open {database}: {e}"), &e))?;
        Ok(Arc::new(store))
    }
}

/// A store that cannot be opened: a malformed URL or name is the user's input (exit 2); an
/// unreachable or failing database is the environment (1).
fn open_error(message: String, e: &StoreError) -> CliError {
    match e {
        StoreError::Invalid(_) => CliError::usage(message),
        _ => CliError::runtime(message),
    }
}

/// The URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// The latest schema version this binary knows for the backend.
pub(crate) fn latest_version(database: &str) -> i64 {
    let migrations = if is_postgres(database) {
        campanile_store_postgres::MIGRATIONS
    } else {
        campanile_store_sqlite::MIGRATIONS
    };
    migrations.last().map_or(0, |m| m.0)
}

/// Size of a SQLite database in bytes (main file plus WAL), if it can be read.
pub(crate) fn sqlite_size(path: &std::path::Path) -> Option<u64> {
    let main = std::fs::metadata(path).ok()?.len();
    let wal = std::fs::metadata(path.with_extension("db-wal"))
        .map(|m| m.len())
        .unwrap_or(0);
    Some(main + wal)
}

/// A one-connection store on a benchmark's temporary PostgreSQL schema.
pub(crate) async fn bench_schema(url: &str, schema: &str) -> Result<PgStore, CliError> {
    PgStore::connect_with(
        url,
        PgOptions {
            schema: Some(schema.to_string()),
            pool_size: 1,
        },
    )
    .await
    .map_err(|e| CliError::runtime(e.to_string()))
}

/// Drops a benchmark's temporary PostgreSQL schema.
pub(crate) async fn drop_pg_schema(url: &str, schema: &str) -> Result<(), CliError> {
    bench_schema(url, schema)
        .await?
        .drop_schema()
        .await
        .map_err(|e| CliError::runtime(e.to_string()))
}
