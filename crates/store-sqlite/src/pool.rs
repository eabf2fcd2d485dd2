//! A small pool of read-only connections.
//!
//! Hand-written (30 lines) because `r2d2_sqlite` trails `rusqlite` releases and would pin us to
//! an older SQLite; see docs/DESIGN.md.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use campanile_store::StoreError;
use rusqlite::{Connection, OpenFlags};

use crate::db::db_err;

#[derive(Debug, Clone)]
pub(crate) struct ReadPool {
    path: PathBuf,
    idle: Arc<Mutex<Vec<Connection>>>,
}

const MAX_IDLE: usize = 8;

impl ReadPool {
    pub(crate) fn new(path: PathBuf) -> ReadPool {
        ReadPool {
            path,
            idle: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Runs `f` on an idle read-only connection, opening one if none is idle.
    pub(crate) fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let conn = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let conn = match conn {
            Some(c) => c,
            None => {
                let c = Connection::open_with_flags(
                    &self.path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )
                .map_err(db_err)?;
                c.busy_timeout(std::time::Duration::from_secs(10))
                    .map_err(db_err)?;
                crate::connection::stable_plans(&c)?;
                // Pages read through the map, not copied in by a read() call each time the
                // writer's commits have emptied this connection's cache.
                c.execute_batch("PRAGMA mmap_size = 1073741824; PRAGMA cache_size = -16384;")
                    .map_err(db_err)?;
                c
            }
        };
        let out = f(&conn);
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
        out
    }
}
