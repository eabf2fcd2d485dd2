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

/// The page cache of the writer (and of the checkpointer), in KiB: 2,048 pages of 4 KiB. Not
/// more: a B-tree page split or merge files a page under a key far past the end of the file
/// (SQLite's pending-byte page, as a swap slot), and the commit that follows walks the cache's
/// whole hash table to drop it, a table as large as the cache has ever been. With 64 MiB that
/// walk was 4% of the writer's samples in `bench store` and 11% of the ceiling's; the pages a
/// cache this size misses are read through the map or from the WAL (docs/DESIGN.md, "Why is
/// SQLite's writer cache 8 MiB?").
pub(crate) const WRITER_CACHE_KIB: u32 = 8192;

pub(crate) fn configure(conn: &Connection) -> Result<(), StoreError> {
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(db_err)?;
    stable_plans(conn)?;
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = FULL;
         PRAGMA foreign_keys = OFF;
         PRAGMA temp_store = MEMORY;
         PRAGMA cache_size = -{WRITER_CACHE_KIB};
         PRAGMA mmap_size = 1073741824;"
    ))
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
