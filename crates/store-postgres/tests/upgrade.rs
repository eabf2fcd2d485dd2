//! Upgrading a database written by an older campanile (when `CAMPANILE_TEST_PG_URL` is set).

use campanile_store::{ScheduleDueList, Store, StoreError, Timing};
use campanile_store_postgres::{MIGRATIONS, PgOptions, PgStore};

/// The outbox-relay migration reserves queue names starting with `$`.
const RESERVING: i64 = 3;

async fn client(url: &str, schema: &str) -> tokio_postgres::Client {
    let mut cfg: tokio_postgres::Config = url.parse().expect("url");
    cfg.options(format!("-c search_path={schema}"));
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
}

async fn schema_version(c: &tokio_postgres::Client) -> i64 {
    c.query_one("SELECT MAX(version) FROM campanile_migrations", &[])
        .await
        .expect("version")
        .get(0)
}

/// A schema at the version before `below`, with one ACTIVE schedule on `queue`, entered in
/// the planning queue as due at 0 (below 7 only).
async fn old_schema(url: &str, schema: &str, queue: &str, below: i64) -> tokio_postgres::Client {
    let c = client(url, schema).await;
    c.batch_execute(&format!(
        "CREATE SCHEMA {schema};
         CREATE TABLE campanile_migrations (
             version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    ))
    .await
    .expect("schema");
    for (version, name, sql) in MIGRATIONS.iter().filter(|m| m.0 < below) {
        c.batch_execute(sql).await.expect("old migration");
        c.execute(
            "INSERT INTO campanile_migrations (version, name) VALUES ($1, $2)",
            &[version, name],
        )
        .await
        .expect("record migration");
    }
    c.batch_execute(&format!(
        "INSERT INTO schedules (id, tenant_id, version, state, shard, next_run_at, created_at, updated_at)
         VALUES ('00000000-0000-7000-8000-000000000001', 1, 1, 'ACTIVE', 0, 0, 0, 0);
         INSERT INTO schedule_versions (schedule_id, version, kind, cron, timezone, queue, priority,
             lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms, misfire, overlap,
             flex_window_ms, created_at)
         VALUES ('00000000-0000-7000-8000-000000000001', 1, 'cron', '0 9 * * *', 'UTC', '{queue}',
             0, 30000, 3, 1000, 60000, '{{\"policy\":\"skip\"}}', 'ALLOW', 0, 0);"
    ))
    .await
    .expect("old schedule");
    // From migration 6 a queue entry carries its definition; the tests of later migrations
    // need no queue entry.
    if below <= 6 {
        c.batch_execute(
            "INSERT INTO schedule_queue (shard, next_run_at, schedule_id, version, tenant_id)
             VALUES (0, 0, '00000000-0000-7000-8000-000000000001', 1, 1);",
        )
        .await
        .expect("old queue entry");
    }
    c
}

/// A fresh schema at the version before `below` (see [`old_schema`]), with the test database's
/// URL and the schema's name; `None`, with a notice, when `CAMPANILE_TEST_PG_URL` is not set.
async fn old_database(queue: &str, below: i64) -> Option<(String, String, tokio_postgres::Client)> {
    let url = campanile_testkit::pg_url("PostgreSQL upgrade test")?;
    let schema = campanile_testkit::new_schema();
    let c = old_schema(&url, &schema, queue, below).await;
    Some((url, schema, c))
}

fn options(schema: &str) -> PgOptions {
    PgOptions {
        schema: Some(schema.to_string()),
        pool_size: 1,
    }
}

#[tokio::test]
async fn upgrade_refuses_a_live_queue_named_like_a_reserved_route() {
    let Some((url, schema, c)) = old_database("$legacy", RESERVING).await else {
        return;
    };
    let err = PgStore::connect_with(&url, options(&schema)).await.err();
    let drop = format!("DROP SCHEMA {schema} CASCADE");
    let refused_at = schema_version(&c).await;
    // Once that schedule is canceled (and nothing of it is pending), the upgrade goes on.
    c.batch_execute("UPDATE schedules SET state = 'CANCELED'")
        .await
        .expect("cancel");
    let store = PgStore::connect_with(&url, options(&schema)).await;
    let upgraded_to = schema_version(&c).await;
    // Drop the schema before asserting, so a failure does not leave it behind.
    c.batch_execute(&drop).await.expect("drop");

    let Some(StoreError::Migration(msg)) = &err else {
        panic!("expected a migration error for a live '$legacy' queue, got {err:?}");
    };
    assert!(msg.contains("'$legacy'"), "{msg}");
    assert!(msg.contains("reserved"), "{msg}");
    // Nothing was applied: the schema is still the old one, usable by the old binary.
    assert_eq!(refused_at, RESERVING - 1);
    store.expect("upgrade after the queue is retired");
    assert_eq!(upgraded_to, MIGRATIONS.last().expect("migrations").0);
}

/// From migration 6 on, a planning-queue entry carries its version's definition: an entry
/// written by an older binary gets it from its version row, and the planner reads it there.
#[tokio::test]
async fn upgrade_gives_each_queued_schedule_its_definition() {
    let Some((url, schema, c)) = old_database("reports", 6).await else {
        return;
    };
    let store = PgStore::connect_with(&url, options(&schema)).await;
    let due = match &store {
        Ok(store) => Some(
            store
                .schedule_due(ScheduleDueList {
                    shard: 0,
                    before: jiff::Timestamp::UNIX_EPOCH,
                    limit: 10,
                })
                .await,
        ),
        Err(_) => None,
    };
    let upgraded_to = schema_version(&c).await;
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop");

    store.expect("upgrade");
    assert_eq!(upgraded_to, MIGRATIONS.last().expect("migrations").0);
    let due = due.expect("read").expect("due schedules");
    assert_eq!(due.len(), 1, "{due:?}");
    assert_eq!(due[0].spec.queue, "reports");
    assert_eq!(due[0].spec.max_attempts, 3);
    let Timing::Cron { expr, timezone, .. } = &due[0].spec.timing else {
        panic!("expected a cron timing, got {:?}", due[0].spec.timing);
    };
    assert_eq!((expr.as_str(), timezone.as_str()), ("0 9 * * *", "UTC"));
}

/// A queue entry whose version row is missing (it could not be planned before migration 6
/// either) stops the upgrade with that schedule's id, and nothing of it is applied.
#[tokio::test]
async fn upgrade_names_a_queued_schedule_without_its_version() {
    let Some((url, schema, c)) = old_database("reports", 6).await else {
        return;
    };
    c.batch_execute("UPDATE schedule_queue SET version = 2")
        .await
        .expect("orphan the entry");
    let err = PgStore::connect_with(&url, options(&schema)).await.err();
    let refused_at = schema_version(&c).await;
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop");

    let Some(StoreError::Migration(msg)) = &err else {
        panic!("expected a migration error for an orphaned queue entry, got {err:?}");
    };
    assert!(
        msg.contains("00000000-0000-7000-8000-000000000001"),
        "{msg}"
    );
    assert_eq!(refused_at, 5);
}

/// From migration 7 on, an occurrence carries its lease length; occurrences written by an
/// older binary get 30 s, what a claim naming no lease granted them before.
#[tokio::test]
async fn upgrade_gives_existing_occurrences_the_old_default_lease() {
    let Some((url, schema, c)) = old_database("reports", 7).await else {
        return;
    };
    c.batch_execute(
        "INSERT INTO occurrences (id, tenant_id, schedule_id, version, scheduled_for, available_at,
             queue, priority, state, max_attempts, backoff_initial_ms, backoff_max_ms, created_at)
         VALUES ('00000000-0000-8000-8000-000000000001', 1, '00000000-0000-7000-8000-000000000001',
             1, 0, 0, 'reports', 0, 'READY', 3, 1000, 60000, 0)",
    )
    .await
    .expect("old occurrence");
    let store = PgStore::connect_with(&url, options(&schema)).await;
    let now = jiff::Timestamp::from_second(1_000).expect("instant");
    let claimed = match &store {
        Ok(store) => Some(
            store
                .occurrence_claim(campanile_store::OccurrenceClaim {
                    max_bytes: None,
                    tenant: campanile_store::TenantId(1),
                    queue: "reports".into(),
                    worker_id: "w".into(),
                    max: 1,
                    lease: None,
                    key: None,
                    now: Some(now),
                })
                .await,
        ),
        Err(_) => None,
    };
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop");

    store.expect("upgrade");
    let claimed = claimed.expect("claim").expect("claimed");
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

/// Connects (so upgrades) the schema and, if that worked, acquires its shard as a new node at
/// `now` (the caller drops the schema before asserting either).
async fn upgrade_and_acquire(
    url: &str,
    schema: &str,
    now: jiff::Timestamp,
) -> (
    Result<PgStore, StoreError>,
    Option<Result<campanile_store::ShardAcquired, StoreError>>,
) {
    let store = PgStore::connect_with(url, options(schema)).await;
    let acquired = match &store {
        Ok(store) => Some(
            store
                .shard_acquire(campanile_store::ShardAcquire {
                    node: "new-node".into(),
                    total: 1,
                    lease: jiff::SignedDuration::from_secs(15),
                    judge: std::sync::Arc::new(MissAll),
                    now: Some(now),
                })
                .await,
        ),
        Err(_) => None,
    };
    (store, acquired)
}

/// A liveness mark written before `seen_at` existed counts as seen until it ends (an old
/// node's graceful stop wrote `alive_until = now`): the backlog before it is not judged.
#[tokio::test]
async fn upgrade_reads_old_liveness_marks_as_seen_until_they_end() {
    let Some((url, schema, c)) = old_database("reports", 8).await else {
        return;
    };
    c.batch_execute(
        "INSERT INTO planner_nodes (node, alive_until) VALUES ('old-node', 20000);
         INSERT INTO occurrences (id, tenant_id, schedule_id, version, scheduled_for, available_at,
             queue, priority, state, max_attempts, backoff_initial_ms, backoff_max_ms, created_at)
         VALUES ('00000000-0000-8000-8000-000000000001', 1, '00000000-0000-7000-8000-000000000001',
             1, 19000, 19000, 'reports', 0, 'READY', 3, 1000, 60000, 0),
                ('00000000-0000-8000-8000-000000000002', 1, '00000000-0000-7000-8000-000000000001',
             1, 21000, 21000, 'reports', 0, 'READY', 3, 1000, 60000, 0)",
    )
    .await
    .expect("old mark and occurrences");
    let (store, acquired) = upgrade_and_acquire(
        &url,
        &schema,
        jiff::Timestamp::from_second(100).expect("instant"),
    )
    .await;
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop");

    store.expect("upgrade");
    let resumed = acquired.expect("acquire").expect("acquired").resumed;
    assert_eq!(
        resumed,
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
#[tokio::test]
async fn upgrade_drops_liveness_marks_that_lapsed_a_day_before() {
    let Some((url, schema, c)) = old_database("reports", 9).await else {
        return;
    };
    const DAY: i64 = 86_400_000;
    let now = 10 * DAY;
    let mut marks = String::new();
    for i in 0..200 {
        marks.push_str(&format!(
            "INSERT INTO planner_nodes (node, alive_until, seen_at) VALUES ('gone-{i}', {}, {});",
            i * 1000 + 15_000,
            i * 1000
        ));
    }
    marks.push_str(&format!(
        "INSERT INTO planner_nodes (node, alive_until, seen_at) VALUES ('recent', {}, {});",
        now - DAY / 2,
        now - DAY / 2 - 15_000
    ));
    c.batch_execute(&marks).await.expect("old marks");
    let (store, acquired) = upgrade_and_acquire(
        &url,
        &schema,
        jiff::Timestamp::from_millisecond(now).expect("instant"),
    )
    .await;
    let nodes: Vec<String> = c
        .query("SELECT node FROM planner_nodes ORDER BY node", &[])
        .await
        .expect("marks")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let indexed = c
        .query_one(
            "SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema() AND indexname = 'planner_nodes_alive'",
            &[],
        )
        .await
        .expect("index")
        .get::<_, i64>(0);
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop");

    store.expect("upgrade");
    acquired.expect("acquire").expect("acquired");
    assert_eq!(nodes, vec!["new-node".to_string(), "recent".to_string()]);
    assert_eq!(indexed, 1);
}

/// Migration 13: an `ACTIVE` schedule without a planning-queue entry has nothing left to plan
/// (a one-off that fired under an older binary) and becomes `FINISHED`; one with an entry, and
/// a paused one, keep their state.
#[tokio::test]
async fn upgrade_finishes_active_schedules_with_nothing_left_to_plan() {
    // ...01: ACTIVE, no queue entry (see `old_schema`).
    let Some((url, schema, c)) = old_database("billing", 13).await else {
        return;
    };
    c.batch_execute(
        "INSERT INTO schedules (id, tenant_id, version, state, shard, next_run_at, created_at, updated_at)
         VALUES ('00000000-0000-7000-8000-000000000002', 1, 1, 'ACTIVE', 0, 5, 0, 0),
                ('00000000-0000-7000-8000-000000000003', 1, 2, 'PAUSED', 0, 5, 0, 0);
         INSERT INTO schedule_queue (shard, next_run_at, schedule_id, version, tenant_id, kind, cron,
             timezone, queue, priority, lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms,
             misfire, overlap, flex_window_ms)
         SELECT 0, 5, '00000000-0000-7000-8000-000000000002', 1, 1, kind, cron, timezone, queue,
                priority, lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms, misfire,
                overlap, flex_window_ms
           FROM schedule_versions;",
    )
    .await
    .expect("schedules");
    let store = PgStore::connect_with(&url, options(&schema)).await;
    let states: Vec<(String, String)> = c
        .query("SELECT id::text, state FROM schedules ORDER BY id", &[])
        .await
        .expect("states")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop");

    store.expect("upgrade");
    let id = |n: u8| format!("00000000-0000-7000-8000-00000000000{n}");
    assert_eq!(
        states,
        vec![
            (id(1), "FINISHED".to_string()),
            (id(2), "ACTIVE".to_string()),
            (id(3), "PAUSED".to_string()),
        ]
    );
}

/// Migration 16 makes the occurrence key schedule-major (and it replaces the schedule's own
/// index) on a table that holds occurrences: they stay, the key still refuses a second
/// occurrence of an instant, and the time-major key and the schedule index are gone. (Since
/// migration 23 the key is each day partition's own index; these instants of 1970 are the
/// default partition's.)
#[tokio::test]
async fn upgrade_keys_occurrences_by_schedule() {
    const KEY_BY_SCHEDULE: i64 = 16;
    let Some((url, schema, c)) = old_database("reports", KEY_BY_SCHEDULE).await else {
        return;
    };
    c.batch_execute(
        "INSERT INTO occurrences (id, tenant_id, schedule_id, version, scheduled_for, available_at,
             queue, priority, state, max_attempts, backoff_initial_ms, backoff_max_ms, created_at)
         SELECT gen_random_uuid(), 1, '00000000-0000-7000-8000-000000000001', 1 + i % 2, i / 2,
             i / 2, 'reports', 0, 'READY', 3, 1000, 60000, 0
           FROM generate_series(0, 99) i",
    )
    .await
    .expect("old occurrences");
    let store = PgStore::connect_with(&url, options(&schema)).await;
    let kept: i64 = c
        .query_one("SELECT count(*) FROM occurrences", &[])
        .await
        .expect("count")
        .get(0);
    let duplicate = c
        .execute(
            "INSERT INTO occurrences (id, tenant_id, schedule_id, version, scheduled_for, available_at,
                 queue, priority, state, max_attempts, backoff_initial_ms, backoff_max_ms, created_at)
             VALUES ((lpad(to_hex(7), 12, '0') || substr(md5(random()::text), 13))::uuid, 1,
                 '00000000-0000-7000-8000-000000000001', 2, 7, 7,
                 'reports', 0, 'READY', 3, 1000, 60000, 0)",
            &[],
        )
        .await;
    let indexes: Vec<String> = c
        .query(
            "SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND tablename = 'occurrences'
              ORDER BY indexname",
            &[&schema],
        )
        .await
        .expect("indexes")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let key: Option<String> = c
        .query_opt(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = $1
                AND indexname = 'occurrences_default_key'",
            &[&schema],
        )
        .await
        .expect("key")
        .map(|r| r.get(0));
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop");

    store.expect("upgrade");
    assert_eq!(kept, 100);
    let err = duplicate.expect_err("a second occurrence of an instant");
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION),
        "{err}"
    );
    let key = key.expect("the new key");
    assert!(
        key.contains("UNIQUE") && key.contains("(schedule_id, scheduled_for, version)"),
        "{key}"
    );
    assert!(
        !indexes.iter().any(|i| i == "occurrences_schedule"
            || i == "occurrences_scheduled_for_schedule_id_version_key"),
        "{indexes:?}"
    );
}

/// Migration 18 repairs what a schedule change racing a planning commit left: a pending
/// occurrence of a version superseded before its instant is canceled (a running one flagged),
/// history and instants before the change are left alone, queue entries of superseded versions
/// go, and an active schedule whose only entry was of an old version keeps its position under
/// its current version.
#[tokio::test]
async fn upgrade_repairs_what_changes_racing_planning_left() {
    const REPAIR: i64 = 18;
    let Some((url, schema, c)) = old_database("jobs", REPAIR).await else {
        return;
    };
    let id = |n: u8| format!("00000000-0000-7000-8000-00000000000{n}");
    // ...01 paused at 1000 (version 2), ...02 and ...03 updated at 1000 (version 2).
    c.batch_execute(&format!(
        "UPDATE schedules SET version = 2, state = 'PAUSED' WHERE id = '{one}';
         INSERT INTO schedules (id, tenant_id, version, state, shard, next_run_at, created_at, updated_at)
         VALUES ('{two}', 1, 2, 'ACTIVE', 0, 0, 0, 1000), ('{three}', 1, 2, 'ACTIVE', 0, 0, 0, 1000);
         INSERT INTO schedule_versions (schedule_id, version, kind, cron, timezone, queue, priority,
             lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms, misfire, overlap,
             flex_window_ms, created_at)
         SELECT s.id, v.version, kind, cron, timezone, queue, priority, lease_ms, max_attempts,
                backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms,
                CASE v.version WHEN 1 THEN 0 ELSE 1000 END
           FROM schedule_versions, (VALUES ('{two}'::uuid), ('{three}'::uuid)) AS s(id), (VALUES (1), (2)) AS v(version)
          WHERE schedule_id = '{one}'
         UNION ALL
         SELECT schedule_id, 2, kind, cron, timezone, queue, priority, lease_ms, max_attempts,
                backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms, 1000
           FROM schedule_versions WHERE schedule_id = '{one}';
         INSERT INTO schedule_queue (shard, next_run_at, schedule_id, version, tenant_id, kind, cron,
             timezone, queue, priority, lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms,
             misfire, overlap, flex_window_ms)
         SELECT 0, q.at, q.id, q.version, 1, kind, cron, timezone, queue, priority, lease_ms,
                max_attempts, backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms
           FROM schedule_versions,
                (VALUES ('{one}'::uuid, 1, 5000::int8), ('{two}'::uuid, 1, 6000::int8),
                        ('{two}'::uuid, 2, 7000::int8), ('{three}'::uuid, 1, 8000::int8)) AS q(id, version, at)
          WHERE schedule_id = '{one}' AND schedule_versions.version = 1;
         INSERT INTO occurrences (id, tenant_id, schedule_id, version, scheduled_for, available_at,
             queue, priority, state, max_attempts, backoff_initial_ms, backoff_max_ms, created_at)
         SELECT gen_random_uuid(), 1, '{one}', 1, o.at, o.at, 'jobs', 0, o.state, 3, 1000, 60000, 0
           FROM (VALUES (500::int8, 'READY'), (2000, 'READY'), (2500, 'RETRY_WAIT'), (3000, 'RUNNING'),
                        (4000, 'SUCCEEDED')) AS o(at, state);",
        one = id(1),
        two = id(2),
        three = id(3)
    ))
    .await
    .expect("what the race left");
    let store = PgStore::connect_with(&url, options(&schema)).await;
    let occurrences: Vec<(i64, String, bool)> = c
        .query(
            "SELECT scheduled_for, state, cancel_requested FROM occurrences ORDER BY scheduled_for",
            &[],
        )
        .await
        .expect("occurrences")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let queue: Vec<(String, i32, i64)> = c
        .query(
            "SELECT schedule_id::text, version, next_run_at FROM schedule_queue ORDER BY schedule_id, next_run_at",
            &[],
        )
        .await
        .expect("queue")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop");

    store.expect("upgrade");
    let o = |at: i64, state: &str, flagged: bool| (at, state.to_string(), flagged);
    assert_eq!(
        occurrences,
        vec![
            o(500, "READY", false),
            o(2000, "CANCELED", false),
            o(2500, "CANCELED", false),
            o(3000, "RUNNING", true),
            o(4000, "SUCCEEDED", false),
        ]
    );
    assert_eq!(queue, vec![(id(2), 2, 7000), (id(3), 2, 8000)]);
}
