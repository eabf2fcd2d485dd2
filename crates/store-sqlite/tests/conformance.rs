//! The store conformance suite on embedded SQLite, plus SQLite's own crash test.

use std::sync::Arc;

use campanile_store::conformance::Harness;
use campanile_store_sqlite::SqliteStore;

async fn sqlite() -> Option<Harness> {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("campanile.db")).expect("open");
    Some(Harness {
        store: Arc::new(store),
        guard: Box::new(dir),
    })
}

campanile_store::conformance_tests!(sqlite);
