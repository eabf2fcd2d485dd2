//! A new database, and the WAL and shared-memory files beside it, are readable by their owner
//! only; an existing file keeps its mode.
#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use campanile_store::{Store, TenantCreate};
use campanile_store_sqlite::SqliteStore;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

async fn write_something(store: &SqliteStore) {
    store
        .tenant_create(TenantCreate {
            name: "t".into(),
            now: None,
        })
        .await
        .expect("tenant");
}

#[tokio::test]
async fn a_new_database_and_its_wal_and_shm_are_private() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("private.db");
    let store = SqliteStore::open(&path).expect("open");
    write_something(&store).await;
    for name in ["private.db", "private.db-wal", "private.db-shm"] {
        assert_eq!(
            format!("{:o}", mode(&dir.path().join(name))),
            "600",
            "{name}"
        );
    }
}

#[tokio::test]
async fn an_existing_database_keeps_its_mode() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("shared.db");
    drop(SqliteStore::open(&path).expect("create"));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let store = SqliteStore::open(&path).expect("open");
    write_something(&store).await;
    assert_eq!(format!("{:o}", mode(&path)), "640");
}
