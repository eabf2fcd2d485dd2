//! The WAL is copied into the database file behind the writer, so it does not grow with
//! what has been written.

use campanile_core::{OccurrenceState, Overlap, ScheduleId};
use campanile_store::{NewOccurrence, OccurrenceInsertMany, Store, TenantCreate};
use campanile_store_sqlite::{SqliteOptions, SqliteStore};
use jiff::{SignedDuration, Timestamp};

fn size(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

#[tokio::test]
async fn the_wal_is_checkpointed_behind_the_writer() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("wal.db");
    let wal = dir.path().join("wal.db-wal");
    // A small restart threshold (256 pages, 1 MiB), so that a few MiB of writes cross it.
    let store = SqliteStore::open_with(
        &path,
        SqliteOptions {
            wal_restart_pages: 256,
            ..SqliteOptions::default()
        },
    )
    .expect("open");
    let tenant = store
        .tenant_create(TenantCreate {
            name: "t".into(),
            now: None,
        })
        .await
        .expect("tenant")
        .id;
    let start = Timestamp::from_second(1_900_000_000).expect("instant");
    // 400 commits of 500 occurrences, one after the other as under sustained load: tens of MiB
    // of pages, which end up in the database file while the WAL starts over again and again.
    for batch in 0..400 {
        let items = (0..500)
            .map(|i| {
                let at = start + SignedDuration::from_secs(batch * 500 + i);
                NewOccurrence {
                    schedule_id: ScheduleId(uuid::Uuid::now_v7()),
                    version: 1,
                    scheduled_for: at,
                    available_at: at,
                    queue: "q".into(),
                    priority: 0,
                    max_attempts: 3,
                    backoff_initial: SignedDuration::from_secs(1),
                    backoff_max: SignedDuration::from_secs(60),
                    state: OccurrenceState::Ready,
                    overlap: Overlap::Allow,
                    lease: SignedDuration::from_secs(30),
                }
            })
            .collect();
        let n = store
            .occurrence_insert_many(OccurrenceInsertMany {
                tenant,
                items,
                now: None,
            })
            .await
            .expect("insert");
        assert_eq!(n, 500);
    }
    // The WAL's size is its high-water mark: it was reused, not grown with every commit.
    let wal_size = size(&wal);
    // The checkpointer runs at most every 50 ms; give it time, without asserting any timing.
    let mut db = 0;
    for _ in 0..200 {
        db = size(&path);
        if db > 32 << 20 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        db > 32 << 20,
        "the database file holds the rows ({db} bytes; WAL {wal_size} bytes)"
    );
    assert!(
        db > 2 * wal_size,
        "the WAL ({wal_size} bytes) is reused, not grown with every write ({db} bytes in the \
         database)"
    );
}
