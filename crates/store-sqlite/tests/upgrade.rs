//! Upgrading a database written by an older campanile.

use campanile_store::StoreError;
use campanile_store_sqlite::{MIGRATIONS, SqliteStore};
use rusqlite::Connection;

/// The outbox-relay migration reserves queue names starting with `$`.
const RESERVING: i64 = 4;

/// A database at the schema before `RESERVING`, with one ACTIVE schedule on `queue`.
fn old_database(path: &std::path::Path, queue: &str) {
    let conn = Connection::open(path).expect("open");
    conn.execute_batch(
        "CREATE TABLE campanile_migrations (
             version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)",
    )
    .expect("migrations table");
    for (version, name, sql) in MIGRATIONS.iter().filter(|m| m.0 < RESERVING) {
        conn.execute_batch(sql).expect("old migration");
        conn.execute(
            "INSERT INTO campanile_migrations (version, name, applied_at) VALUES (?1, ?2, 0)",
            rusqlite::params![version, name],
        )
        .expect("record migration");
    }
    conn.execute_batch(&format!(
        "INSERT INTO schedules (id, tenant_id, version, state, shard, next_run_at, created_at, updated_at)
         VALUES (X'01', 1, 1, 'ACTIVE', 0, 0, 0, 0);
         INSERT INTO schedule_versions (schedule_id, version, kind, cron, timezone, queue, priority,
             lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms, misfire, overlap,
             flex_window_ms, created_at)
         VALUES (X'01', 1, 'cron', '0 9 * * *', 'UTC', '{queue}', 0, 30000, 3, 1000, 60000,
             'SKIP', 'ALLOW', 0, 0);"
    ))
    .expect("old schedule");
}

/// The database from [`old_database`], with the migrations from `RESERVING` up to (not
/// including) `below` applied as the binary of that time would have.
fn migrated_up_to(path: &std::path::Path, below: i64) -> Connection {
    let conn = Connection::open(path).expect("open");
    for (version, name, sql) in MIGRATIONS
        .iter()
        .filter(|m| (RESERVING..below).contains(&m.0))
    {
        conn.execute_batch(sql).expect("old migration");
        conn.execute(
            "INSERT INTO campanile_migrations (version, name, applied_at) VALUES (?1, ?2, 0)",
            rusqlite::params![version, name],
        )
        .expect("record migration");
    }
    conn
}

fn schema_version(path: &std::path::Path) -> i64 {
    Connection::open(path)
        .expect("open")
        .query_row("SELECT MAX(version) FROM campanile_migrations", [], |r| {
            r.get(0)
        })
        .expect("version")
}

#[test]
fn upgrade_refuses_a_live_queue_named_like_a_reserved_route() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.db");
    old_database(&path, "$legacy");
    let Err(err) = SqliteStore::open(&path) else {
        panic!("a live '$legacy' queue must stop the upgrade");
    };
    let StoreError::Migration(msg) = &err else {
        panic!("expected a migration error, got {err:?}");
    };
    assert!(msg.contains("'$legacy'"), "{msg}");
    assert!(msg.contains("reserved"), "{msg}");
    // Nothing was applied: the database is still the old one, usable by the old binary.
    assert_eq!(schema_version(&path), RESERVING - 1);

    // Once that schedule is canceled (and nothing of it is pending), the upgrade goes on.
    Connection::open(&path)
        .expect("open")
        .execute("UPDATE schedules SET state = 'CANCELED'", [])
        .expect("cancel");
    SqliteStore::open(&path).expect("upgrade after the queue is retired");
    assert_eq!(
        schema_version(&path),
        MIGRATIONS.last().expect("migrations").0
    );
}

#[test]
fn upgrade_keeps_ordinary_queues() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.db");
    old_database(&path, "billing");
    SqliteStore::open(&path).expect("upgrade");
    assert_eq!(
        schema_version(&path),
        MIGRATIONS.last().expect("migrations").0
    );
}

/// Migration 5: the `running` attempt rows older versions opened at claim time, for attempts
/// the occurrence row now holds (in progress, or succeeded since), are removed; every ended
/// attempt's row stays.
#[test]
fn upgrade_leaves_attempts_in_progress_to_their_occurrence_rows() {
    const ON_OCCURRENCE: i64 = 5;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.db");
    old_database(&path, "billing");
    let conn = migrated_up_to(&path, ON_OCCURRENCE);
    // Occurrence 1 runs at epoch 1; 2 succeeded at epoch 1 under an older version; 3 runs at
    // epoch 2 after a failed attempt; 4 succeeded at epoch 1 while its row still said running
    // (ended by a newer node during a rolling upgrade).
    for (seq, state, epoch) in [
        (1, "RUNNING", 1),
        (2, "SUCCEEDED", 1),
        (3, "RUNNING", 2),
        (4, "SUCCEEDED", 1),
    ] {
        conn.execute(
            "INSERT INTO occurrences (seq, id, tenant_id, schedule_id, version, scheduled_for,
                 available_at, queue, priority, state, epoch, owner, lease_until, claimed_at,
                 attempts, max_attempts, backoff_initial_ms, backoff_max_ms, created_at)
             VALUES (?1, randomblob(16), 1, X'01', 1, ?1, 0, 'billing', 0, ?2, ?3, 'w', 9, 5,
                 ?3, 3, 1000, 60000, 0)",
            rusqlite::params![seq, state, epoch],
        )
        .expect("occurrence");
    }
    conn.execute_batch(
        "INSERT INTO attempts (occurrence_seq, epoch, owner, started_at, lease_until, finished_at, outcome)
         VALUES (1, 1, 'w', 5, 9, NULL, 'running'),
                (2, 1, 'w', 5, 9, 7, 'succeeded'),
                (3, 1, 'w', 1, 2, 3, 'failed'),
                (3, 2, 'w', 5, 9, NULL, 'running'),
                (4, 1, 'w', 5, 9, NULL, 'running');",
    )
    .expect("old attempt rows");
    drop(conn);

    SqliteStore::open(&path).expect("upgrade");
    let left: Vec<(i64, i64, String)> = Connection::open(&path)
        .expect("open")
        .prepare("SELECT occurrence_seq, epoch, outcome FROM attempts ORDER BY 1, 2")
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(
        left,
        vec![(2, 1, "succeeded".into()), (3, 1, "failed".into())]
    );
}

/// From migration 6 on, an occurrence carries its lease length; occurrences written by an
/// older binary get 30 s, what a claim naming no lease granted them before.
#[test]
fn upgrade_gives_existing_occurrences_the_old_default_lease() {
    const OWN_LEASE: i64 = 6;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.db");
    old_database(&path, "billing");
    let conn = migrated_up_to(&path, OWN_LEASE);
    conn.execute(
        "INSERT INTO occurrences (id, tenant_id, schedule_id, version, scheduled_for,
             available_at, queue, priority, state, max_attempts, backoff_initial_ms,
             backoff_max_ms, created_at)
         VALUES (randomblob(16), 1, X'00000000000070008000000000000001', 1, 0, 0, 'billing',
             0, 'READY', 3, 1000, 60000, 0)",
        [],
    )
    .expect("occurrence");
    drop(conn);

    let store = SqliteStore::open(&path).expect("upgrade");
    assert_eq!(
        schema_version(&path),
        MIGRATIONS.last().expect("migrations").0
    );
    let now = jiff::Timestamp::from_second(1_000).expect("instant");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let claimed = rt
        .block_on(campanile_store::Store::occurrence_claim(
            &store,
            campanile_store::OccurrenceClaim {
                max_bytes: None,
                tenant: campanile_store::TenantId(1),
                queue: "billing".into(),
                worker_id: "w".into(),
                max: 1,
                lease: None,
                key: None,
                now: Some(now),
            },
        ))
        .expect("claim");
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert_eq!(
        claimed[0].lease_until,
        jiff::Timestamp::from_second(1_030).expect("instant")
    );
}

/// Misses every instant it is shown.
struct MissAll;

impl campanile_store::PrePlannedJudge for MissAll {
    fn missed(&self, p: &campanile_store::PrePlanned<'_>) -> Vec<jiff::Timestamp> {
        p.instants.to_vec()
    }
}

/// Opens (so upgrades) the database and acquires its shard as a new node at `now`.
fn upgrade_and_acquire(
    path: &std::path::Path,
    now: jiff::Timestamp,
) -> campanile_store::ShardAcquired {
    let store = SqliteStore::open(path).expect("upgrade");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(campanile_store::Store::shard_acquire(
        &store,
        campanile_store::ShardAcquire {
            node: "new-node".into(),
            total: 1,
            lease: jiff::SignedDuration::from_secs(15),
            judge: std::sync::Arc::new(MissAll),
            now: Some(now),
        },
    ))
    .expect("acquire")
}

/// A liveness mark written before `seen_at` existed counts as seen until it ends (an old
/// node's graceful stop wrote `alive_until = now`): the backlog before it is not judged.
#[test]
fn upgrade_reads_old_liveness_marks_as_seen_until_they_end() {
    const SEEN_AT: i64 = 7;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.db");
    old_database(&path, "billing");
    let conn = migrated_up_to(&path, SEEN_AT);
    conn.execute_batch(
        "UPDATE schedules SET id = X'00000000000070008000000000000001';
         UPDATE schedule_versions SET misfire = '{\"policy\":\"skip\"}',
             schedule_id = X'00000000000070008000000000000001';
         INSERT INTO planner_nodes (node, alive_until) VALUES ('old-node', 20000);
         INSERT INTO occurrences (id, tenant_id, schedule_id, version, scheduled_for,
             available_at, queue, priority, state, max_attempts, backoff_initial_ms,
             backoff_max_ms, created_at)
         VALUES (randomblob(16), 1, X'00000000000070008000000000000001', 1, 19000, 19000,
                 'billing', 0, 'READY', 3, 1000, 60000, 0),
                (randomblob(16), 1, X'00000000000070008000000000000001', 1, 21000, 21000,
                 'billing', 0, 'READY', 3, 1000, 60000, 0);",
    )
    .expect("old mark and occurrences");
    drop(conn);

    let acquired = upgrade_and_acquire(&path, jiff::Timestamp::from_second(100).expect("instant"));
    assert_eq!(
        acquired.resumed,
        campanile_store::Resumed {
            down_since: Some(jiff::Timestamp::from_second(20).expect("instant")),
            examined: 1,
            missed: 1,
            paced: 0,
        },
        "a mark without seen_at was seen until it ends (it may be a graceful stop's): only what became claimable after 20 s is judged"
    );
}

/// Marks piled up before the index on `alive_until` (a row per node start) are dropped by the
/// first acquisition after the upgrade once they lapsed a day before; the others are kept.
#[test]
fn upgrade_drops_liveness_marks_that_lapsed_a_day_before() {
    const MARKS_BY_END: i64 = 8;
    const DAY: i64 = 86_400_000;
    let now = 10 * DAY;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.db");
    old_database(&path, "billing");
    let conn = migrated_up_to(&path, MARKS_BY_END);
    for i in 0..200 {
        conn.execute(
            "INSERT INTO planner_nodes (node, alive_until, seen_at) VALUES (?1, ?2, ?3)",
            rusqlite::params![format!("gone-{i}"), i * 1000 + 15_000, i * 1000],
        )
        .expect("old mark");
    }
    conn.execute(
        "INSERT INTO planner_nodes (node, alive_until, seen_at) VALUES ('recent', ?1, ?2)",
        rusqlite::params![now - DAY / 2, now - DAY / 2 - 15_000],
    )
    .expect("recent mark");
    drop(conn);

    upgrade_and_acquire(
        &path,
        jiff::Timestamp::from_millisecond(now).expect("instant"),
    );
    let conn = Connection::open(&path).expect("open");
    let nodes: Vec<String> = conn
        .prepare("SELECT node FROM planner_nodes ORDER BY node")
        .and_then(|mut s| {
            s.query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .expect("marks");
    assert_eq!(nodes, vec!["new-node".to_string(), "recent".to_string()]);
    let plan: String = conn
        .query_row(
            "EXPLAIN QUERY PLAN SELECT MAX(alive_until) FROM planner_nodes",
            [],
            |r| r.get(3),
        )
        .expect("plan");
    assert!(plan.contains("planner_nodes_alive"), "{plan}");
}

/// Migration 11: an `ACTIVE` schedule without a planning-queue entry has nothing left to plan
/// (a one-off that fired under an older binary) and becomes `FINISHED`; one with an entry, and
/// a paused one, keep their state.
#[test]
fn upgrade_finishes_active_schedules_with_nothing_left_to_plan() {
    const FINISHED: i64 = 11;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.db");
    old_database(&path, "billing"); // X'01': ACTIVE, no queue entry
    let conn = migrated_up_to(&path, FINISHED);
    conn.execute_batch(
        "INSERT INTO schedules (id, tenant_id, version, state, shard, next_run_at, created_at, updated_at)
         VALUES (X'02', 1, 1, 'ACTIVE', 0, 5, 0, 0), (X'03', 1, 2, 'PAUSED', 0, 5, 0, 0);
         INSERT INTO schedule_queue (shard, next_run_at, schedule_id, version, tenant_id)
         VALUES (0, 5, X'02', 1, 1);",
    )
    .expect("schedules");
    drop(conn);

    SqliteStore::open(&path).expect("upgrade");
    let states: Vec<(Vec<u8>, String)> = Connection::open(&path)
        .expect("open")
        .prepare("SELECT id, state FROM schedules ORDER BY id")
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(
        states,
        vec![
            (vec![1], "FINISHED".into()),
            (vec![2], "ACTIVE".into()),
            (vec![3], "PAUSED".into()),
        ]
    );
}

/// The overlap history migration: a constrained run that ended within the last day keeps
/// counting as a run (its `ran_until` from its `finished_at`), so an occurrence that came due
/// during it and still waits is skipped after the upgrade, as before it; older runs are left
/// alone; rows without `due_at` are read by their availability.
#[test]
fn upgrade_keeps_recent_runs_in_the_overlap_history() {
    const OVERLAP_HISTORY: i64 = 13;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.db");
    old_database(&path, "billing");
    let conn = migrated_up_to(&path, OVERLAP_HISTORY);
    let now = jiff::Timestamp::now().as_millisecond();
    let day = 86_400_000;
    // (scheduled and due, state, claimed_at, finished_at) of one SKIP_IF_RUNNING schedule.
    for (i, (due, state, claimed, finished)) in [
        (
            now - 3 * day,
            "SUCCEEDED",
            Some(now - 3 * day),
            Some(now - 2 * day),
        ),
        (
            now - 60_000,
            "SUCCEEDED",
            Some(now - 60_000),
            Some(now - 10_000),
        ),
        (now - 30_000, "READY", None, None),
    ]
    .into_iter()
    .enumerate()
    {
        conn.execute(
            "INSERT INTO occurrences (id, tenant_id, schedule_id, version, scheduled_for,
                 available_at, queue, priority, state, max_attempts, backoff_initial_ms,
                 backoff_max_ms, created_at, overlap, claimed_at, finished_at)
             VALUES (?1, 1, X'00000000000070008000000000000001', 1, ?2, ?2, 'billing', 0, ?3,
                 3, 1000, 60000, 0, 1, ?4, ?5)",
            rusqlite::params![vec![i as u8 + 1; 16], due, state, claimed, finished],
        )
        .expect("occurrence");
    }
    drop(conn);

    let store = SqliteStore::open(&path).expect("upgrade");
    let ran: Vec<Option<i64>> = Connection::open(&path)
        .expect("open")
        .prepare("SELECT ran_until FROM occurrences ORDER BY scheduled_for")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(ran, vec![None, Some(now - 10_000), None]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let claimed = rt
        .block_on(campanile_store::Store::occurrence_claim(
            &store,
            campanile_store::OccurrenceClaim {
                max_bytes: None,
                tenant: campanile_store::TenantId(1),
                queue: "billing".into(),
                worker_id: "w".into(),
                max: 1,
                lease: None,
                key: None,
                now: Some(jiff::Timestamp::from_millisecond(now).expect("instant")),
            },
        ))
        .expect("claim");
    assert!(claimed.is_empty(), "{claimed:?}");
    let state: String = Connection::open(&path)
        .expect("open")
        .query_row(
            "SELECT state FROM occurrences WHERE scheduled_for = ?1",
            [now - 30_000],
            |r| r.get(0),
        )
        .expect("state");
    assert_eq!(state, "SKIPPED_OVERLAP");
}

/// Migration 14 rebuilds the occurrences table around a schedule-major key: every row comes
/// through as it was (seq included, which attempts name), the key still refuses a second
/// occurrence of an instant, and the schedule's separate index is gone.
#[test]
fn upgrade_rebuilds_occurrences_around_a_schedule_major_key() {
    const KEY_BY_SCHEDULE: i64 = 14;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.db");
    old_database(&path, "billing");
    let conn = migrated_up_to(&path, KEY_BY_SCHEDULE);
    // Every column set, in different states, two versions of one schedule at one instant.
    for (seq, version, at, state, owner, result) in [
        (3, 1, 1_000, "RUNNING", Some("w"), None),
        (7, 1, 2_000, "SUCCEEDED", Some("w"), Some("{\"ok\":1}")),
        (8, 2, 2_000, "MISSED", None, None),
        (9, 2, 3_000, "READY", None, None),
    ] {
        conn.execute(
            "INSERT INTO occurrences (seq, id, tenant_id, schedule_id, version, scheduled_for,
                 available_at, queue, priority, state, epoch, owner, lease_until, claimed_at,
                 attempts, max_attempts, backoff_initial_ms, backoff_max_ms, overlap,
                 cancel_requested, result, last_error_class, last_error, created_at,
                 finished_at, lease_ms, due_at, ran_until)
             VALUES (?1, randomblob(16), 1, X'01', ?2, ?3, ?3 + 5, 'billing', 4, ?4, 2, ?5,
                 ?3 + 30000, ?3 + 1, 2, 3, 1000, 60000, 1, 1, ?6, 'transient', 'timeout', 7,
                 ?3 + 9, 45000, ?3 + 5, ?3 + 8)",
            rusqlite::params![seq, version, at, state, owner, result],
        )
        .expect("occurrence");
    }
    // The columns as of migration 14 (later migrations add columns, NULL on old rows).
    let columns: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('occurrences') ORDER BY cid")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("columns");
    let select = format!(
        "SELECT {} FROM occurrences ORDER BY seq",
        columns.join(", ")
    );
    let rows = |c: &Connection| -> Vec<Vec<rusqlite::types::Value>> {
        let mut stmt = c.prepare(&select).expect("prepare");
        let n = stmt.column_count();
        stmt.query_map([], |r| (0..n).map(|i| r.get(i)).collect())
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    };
    let before = rows(&conn);
    drop(conn);

    drop(SqliteStore::open(&path).expect("upgrade"));
    let conn = Connection::open(&path).expect("open");
    assert_eq!(rows(&conn), before);
    assert_eq!(
        schema_version(&path),
        MIGRATIONS.last().expect("migrations").0
    );
    let duplicate = conn.execute(
        "INSERT INTO occurrences (id, tenant_id, schedule_id, version, scheduled_for, available_at,
             queue, priority, state, max_attempts, backoff_initial_ms, backoff_max_ms, created_at)
         VALUES (randomblob(16), 1, X'01', 2, 2000, 2000, 'billing', 0, 'READY', 3, 1000, 60000, 0)",
        [],
    );
    assert!(
        matches!(
            duplicate,
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
        ),
        "{duplicate:?}"
    );
    let indexes: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'occurrences' ORDER BY name")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(
        indexes,
        [
            "occurrences_pending",
            "occurrences_pending_constrained",
            "occurrences_pending_constrained_schedule",
            "occurrences_ran_constrained_schedule",
            "occurrences_running",
            "occurrences_running_schedule",
            // A later migration's (trigger keys).
            "occurrences_trigger_key",
            "sqlite_autoindex_occurrences_1",
            "sqlite_autoindex_occurrences_2",
        ]
    );
    let key: Vec<String> = conn
        .prepare(
            "SELECT name FROM pragma_index_info('sqlite_autoindex_occurrences_2') ORDER BY seqno",
        )
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(key, ["schedule_id", "scheduled_for", "version"]);
}
