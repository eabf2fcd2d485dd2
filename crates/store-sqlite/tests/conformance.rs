//! The store conformance suite on embedded SQLite, plus SQLite's own crash test.

use std::sync::Arc;

use campanile_conformance::Harness;
use campanile_store_sqlite::SqliteStore;

async fn sqlite() -> Option<Harness> {
    let (store, dir) = campanile_testkit::sqlite_store();
    Some(Harness {
        store: Arc::new(store),
        guard: Box::new(dir),
    })
}

campanile_conformance::conformance_tests!(sqlite);

/// A store in a new temporary directory (kept while the first value lives), with its file's
/// path for a connection of the test's own.
fn at_path() -> (tempfile::TempDir, std::path::PathBuf, Harness) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("campanile.db");
    let store = SqliteStore::open(&path).expect("open");
    let h = Harness {
        store: Arc::new(store),
        guard: Box::new(()),
    };
    (dir, path, h)
}

#[test]
fn attempts_opened_by_older_versions_end_in_place() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (_dir, path, h) = at_path();
    campanile_conformance::attempts_opened_by_older_versions_end_in_place(
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

#[test]
fn a_report_whose_claim_fails_keeps_its_outcomes() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (_dir, path, h) = at_path();
    campanile_conformance::a_report_whose_claim_fails_keeps_its_outcomes(&rt, h, || async move {
        rusqlite::Connection::open(&path)
            .expect("open")
            .execute_batch(
                "CREATE TRIGGER refuse_claims BEFORE UPDATE ON occurrences
                         WHEN NEW.epoch <> OLD.epoch
                     BEGIN SELECT RAISE(ABORT, 'claims refused by the test'); END;",
            )
            .expect("trigger");
    });
}
