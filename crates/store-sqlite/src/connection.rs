//! A connection as the store opens it: its pragmas, the query planner's stable plans, and a
//! database file that only its owner can read.

use std::path::Path;

use campanile_store::*;
use rusqlite::Connection;
use rusqlite::config::DbConfig;

use crate::db::db_err;

/// Turns on SQLite's query planner stability guarantee: a statement's plan does not depend on
/// the values bound to it. Without it, SQLite marks a statement whose `LIMIT ?` (or a
/// parameter compared with a partial index's condition) it planned with the bound value as
/// expired whenever its bindings are cleared — which rusqlite's statement cache does each time
/// a statement goes back — so every claim would be parsed and planned again on every use, 13%
/// of all CPU samples in a batch-1 drain (docs/DESIGN.md, "Why the query planner stability
/// guarantee on SQLite?").
pub(crate) fn stable_plans(conn: &Connection) -> Result<(), StoreError> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map(drop)
        .map_err(db_err)
}

pub(crate) fn configure(conn: &Connection) -> Result<(), StoreError> {
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(db_err)?;
    stable_plans(conn)?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = FULL;
         PRAGMA foreign_keys = OFF;
         PRAGMA temp_store = MEMORY;
         PRAGMA cache_size = -65536;
         PRAGMA mmap_size = 1073741824;",
    )
    .map_err(db_err)
}

/// Creates the database file, if there is none, readable and writable by its owner only
/// (mode 0600): it holds API key hashes and every payload. SQLite gives its `-wal` and `-shm`
/// files the main file's mode. A file that exists keeps its mode; a name SQLite does not read
/// as a file path (`:memory:`, a `file:` URI) is left to SQLite, as is any failure here (SQLite
/// then reports its own).
pub(crate) fn create_private(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let name = path.as_os_str();
        let special =
            name.is_empty() || name == ":memory:" || name.as_encoded_bytes().starts_with(b"file:");
        if !special {
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path);
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}
