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

#[test]
fn attempts_opened_by_older_versions_end_in_place() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("campanile.db");
    let store = SqliteStore::open(&path).expect("open");
    let h = Harness {
        store: Arc::new(store),
        guard: Box::new(()),
    };
    campanile_store::conformance::attempts_opened_by_older_versions_end_in_place(
        &rt,
        h,
        |sql| async move {
            rusqlite::Connection::open(&path)
                .expect("open")
                .execute_batch(sql)
                .expect("legacy rows");
        },
    );
}
