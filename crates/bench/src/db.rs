//! A benchmark's store: a SQLite file or a temporary schema on a PostgreSQL server.

use std::sync::Arc;

use campanile_store::Store;
use campanile_store_postgres::{PgOptions, PgStore};
use campanile_store_sqlite::SqliteStore;

use crate::error::BenchError;

/// Whether `database` is a PostgreSQL URL (else a SQLite file path).
pub(crate) fn is_postgres(database: &str) -> bool {
    database.starts_with("postgres://") || database.starts_with("postgresql://")
}

/// Opens (and migrates) the store: `schema` on PostgreSQL.
pub(crate) async fn open(
    database: &str,
    schema: Option<String>,
) -> Result<Arc<dyn Store>, BenchError> {
    // A malformed URL is the user's input (exit 2); a database that does not answer or fails
    // is the environment (1).
    let err = |e: campanile_store::StoreError| {
        let message = format!("cannot open the benchmark's database: {e}");
        match e {
            campanile_store::StoreError::Invalid(_) => BenchError::usage(message),
            _ => BenchError::runtime(message),
        }
    };
    if is_postgres(database) {
        let options = PgOptions {
            schema,
            ..PgOptions::default()
        };
        Ok(Arc::new(
            PgStore::connect_with(database, options)
                .await
                .map_err(err)?,
        ))
    } else {
        Ok(Arc::new(SqliteStore::open(database).map_err(err)?))
    }
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
pub(crate) async fn bench_schema(url: &str, schema: &str) -> Result<PgStore, BenchError> {
    PgStore::connect_with(
        url,
        PgOptions {
            schema: Some(schema.to_string()),
            pool_size: 1,
        },
    )
    .await
    .map_err(|e| BenchError::runtime(e.to_string()))
}

/// Drops a benchmark's temporary PostgreSQL schema.
pub(crate) async fn drop_pg_schema(url: &str, schema: &str) -> Result<(), BenchError> {
    bench_schema(url, schema)
        .await?
        .drop_schema()
        .await
        .map_err(|e| BenchError::runtime(e.to_string()))
}
