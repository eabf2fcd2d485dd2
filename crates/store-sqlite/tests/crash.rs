//! SIGKILL in the middle of claim batches on embedded SQLite.

use std::sync::Arc;

use campanile_conformance as conformance;
use campanile_store_sqlite::SqliteStore;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}

/// Only acts when re-run as the crash test's child.
#[test]
fn crash_child() {
    let Ok(path) = std::env::var("CAMPANILE_CRASH_DB") else {
        return;
    };
    let store = SqliteStore::open(path).expect("open");
    conformance::crash_child(&runtime(), Arc::new(store));
}

#[test]
fn sigkill_mid_claim_leaves_whole_batches_or_none() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("crash.db");
    let store = SqliteStore::open(&path).expect("open");
    let env = [("CAMPANILE_CRASH_DB", path.display().to_string())];
    conformance::sigkill_mid_claim_leaves_whole_batches_or_none(
        &runtime(),
        Arc::new(store),
        "crash_child",
        &env,
    );
}
