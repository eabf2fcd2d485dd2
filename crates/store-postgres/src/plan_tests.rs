//! The plans PostgreSQL makes for the claim and relay statements.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use uuid::Uuid;

use crate::claim::FAST_CLAIM;
use crate::constrained::{CONSTRAINED_CANDIDATES, CONSTRAINED_SCHEDULES, OVERLAP_STATE};
use crate::relay::RELAY_DUE;

/// A store on a schema of its own at `CAMPANILE_TEST_PG_URL`, with one connection (`None`,
/// and a notice printed, when the variable is not set).
async fn plan_store() -> Option<crate::PgStore> {
    let Ok(url) = std::env::var("CAMPANILE_TEST_PG_URL") else {
        eprintln!("skipped: CAMPANILE_TEST_PG_URL is not set (PostgreSQL plan test)");
        return None;
    };
    let schema = format!("t_{}", Uuid::now_v7().simple());
    Some(
        crate::PgStore::connect_with(
            &url,
            crate::PgOptions {
                schema: Some(schema),
                pool_size: 1,
            },
        )
        .await
        .expect("connect"),
    )
}

/// The store's one connection with generic plans forced, as the store runs its statements
/// (the pool sets them too, unless the URL names `plan_cache_mode`; a plan test must not
/// depend on the URL).
async fn generic_client(store: &crate::PgStore) -> deadpool_postgres::Client {
    let c = store.client().await.expect("client");
    c.batch_execute("SET plan_cache_mode = force_generic_plan")
        .await
        .expect("generic plans");
    c
}

/// The plan PostgreSQL uses for `sql` as a prepared statement (generic plans forced by the
/// caller), executed with `args`.
async fn generic_plan(c: &tokio_postgres::Client, name: &str, sql: &str, args: &str) -> String {
    c.batch_execute(&format!("PREPARE {name} AS {sql}"))
        .await
        .expect("prepare");
    let plan: Vec<String> = c
        .query(&format!("EXPLAIN EXECUTE {name}{args}"), &[])
        .await
        .expect("explain")
        .iter()
        .map(|r| r.get(0))
        .collect();
    plan.join("\n")
}

/// The liveness gate is evaluated once per statement, even though it reads the clock (a
/// volatile function): as a per-row filter, a refused claim or relay poll would walk all
/// its candidates to return nothing. Generic plans, as the store runs them.
// Multi-threaded: the schema guard's drop blocks this thread while the pool's connection
// task must go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_liveness_gate_is_a_one_time_filter() {
    let Some(store) = plan_store().await else {
        return;
    };
    let _drop = store.drop_schema_on_drop();
    let c = generic_client(&store).await;
    for (name, sql, args) in [
        ("relay_due", RELAY_DUE, "(0, 10, NULL)"),
        (
            "fast_claim",
            FAST_CLAIM,
            "(1, 'q', 0, 10, 'w', NULL, NULL, NULL, 8388608)",
        ),
        (
            "constrained_schedules",
            CONSTRAINED_SCHEDULES,
            "(1, 'q', 0, 10, NULL)",
        ),
        (
            "constrained",
            CONSTRAINED_CANDIDATES,
            "(1, 'q', 0, 10, NULL, ARRAY[]::uuid[])",
        ),
    ] {
        let plan = generic_plan(&c, name, sql, args).await;
        assert!(plan.contains("One-Time Filter"), "{name}:\n{plan}");
        assert!(
            !plan.contains("clock_timestamp"),
            "{name}, gate per row:\n{plan}"
        );
    }
    // The per-candidate overlap question seeks partial indexes (on empty tables the
    // planner picks either running index; the waiting question has one of its own).
    let plan = generic_plan(
        &c,
        "overlap_state",
        OVERLAP_STATE,
        "(gen_random_uuid(), 1, 0, 0, 0, 'q')",
    )
    .await;
    eprintln!("overlap state:\n{plan}");
    for index in [
        "occurrences_pending_constrained_schedule",
        "occurrences_ran_constrained_schedule",
    ] {
        let each_day = per_partition(&c, index).await;
        assert!(
            each_day.iter().any(|i| plan.contains(&format!("{i} "))),
            "overlap state, {index} ({each_day:?}):\n{plan}"
        );
    }
    // The key (schedule_id, scheduled_for, version) is the schedule's whole history.
    assert!(
        !plan.contains("Seq Scan") && !plan.contains("_key "),
        "overlap state:\n{plan}"
    );
    // A listing across schedules reads the id index in order (ids lead with their planned
    // instant), so a page stops at its limit instead of sorting the range first; only the
    // day partitions the id range reaches are read.
    let plan = generic_plan(
        &c,
        "listing",
        "SELECT seq FROM occurrences WHERE tenant_id = $1 AND scheduled_for >= $2
            AND scheduled_for < $3 AND id >= $4 AND id < $5 ORDER BY id LIMIT $6",
        "(1, 0, 10, gen_random_uuid(), gen_random_uuid(), 10)",
    )
    .await;
    eprintln!("listing:\n{plan}");
    let each_day = per_partition(&c, "occurrences_id_key").await;
    assert!(
        each_day.iter().any(|i| plan.contains(&format!("{i} "))),
        "listing ({each_day:?}):\n{plan}"
    );
    // Merged across the day partitions the range reaches, never sorted.
    assert!(
        !plan.lines().any(|l| l
            .trim_start()
            .trim_start_matches("->")
            .trim_start()
            .starts_with("Sort  (")),
        "listing:\n{plan}"
    );
}

/// The names of an index of `occurrences` on each of its partitions (occurrences are
/// partitioned by day).
async fn per_partition(c: &tokio_postgres::Client, index: &str) -> Vec<String> {
    c.query(
        "SELECT k.relname::text FROM pg_inherits i JOIN pg_class k ON k.oid = i.inhrelid
          WHERE i.inhparent = $1::text::regclass",
        &[&index],
    )
    .await
    .expect("partition indexes")
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// Every statement that writes occurrences it has already chosen finds each by its id, the
/// partitioned table's unique key (there is no index on `seq` alone): with sequential scans,
/// bitmaps, materialized inner sides and hash and merge joins made prohibitively expensive,
/// every read of the partition that holds rows is an index scan with an index condition. A
/// lookup by `seq` alone would be a sequential scan, or an index read whole, of every
/// partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chosen_occurrences_are_found_by_id() {
    let Some(store) = plan_store().await else {
        return;
    };
    let _drop = store.drop_schema_on_drop();
    let c = generic_client(&store).await;
    // Statistics of a table in use (on empty tables the planner reads a whole partial index
    // as the cheapest way to find anything): today's partition holds 20,000 occurrences of 100
    // schedules, half pending, half running.
    c.batch_execute(
        "INSERT INTO occurrences (id, tenant_id, schedule_id, version, scheduled_for,
                                  available_at, queue, priority, state, max_attempts,
                                  backoff_initial_ms, backoff_max_ms, created_at, owner, epoch,
                                  lease_until)
         SELECT (lpad(to_hex(t), 12, '0') || lpad(to_hex(i), 20, '0'))::uuid, 1,
                ('00000000-0000-0000-0000-' || lpad(to_hex(i % 100), 12, '0'))::uuid, 1, t, t,
                'q', 0, CASE WHEN i % 2 = 0 THEN 'READY' ELSE 'RUNNING' END, 3, 1000, 60000, t,
                'w', 1, t + 60000
           FROM generate_series(1, 20000) i,
                LATERAL (SELECT (extract(epoch FROM now()) * 1000)::int8 + i AS t) x;
         ANALYZE occurrences;",
    )
    .await
    .expect("rows");
    c.batch_execute(
        "SET enable_seqscan = off; SET enable_hashjoin = off; SET enable_mergejoin = off;
         SET enable_material = off; SET enable_bitmapscan = off;",
    )
    .await
    .expect("settings");
    // The partition that holds the rows (an empty one may be read whole: it costs nothing).
    let today: String = c
        .query_one(
            "SELECT c.relname::text FROM occurrences o JOIN pg_class c ON c.oid = o.tableoid LIMIT 1",
            &[],
        )
        .await
        .expect("partition")
        .get(0);
    let ids = "ARRAY[gen_random_uuid()]";
    for (name, sql, args) in [
        (
            "claim_ids",
            crate::claimed::CLAIM_IDS,
            format!("({ids}, 'w', 0, NULL, NULL)"),
        ),
        ("lease_sweep", crate::lease::LEASE_SWEEP, "(0, 10)".into()),
        (
            "record_ended",
            crate::finish::RECORD_ENDED_ATTEMPTS,
            format!(
                "(ARRAY[1]::int8[], ARRAY[1]::int8[], ARRAY['failed'], 0, ARRAY[NULL]::text[], \
                 ARRAY[NULL]::text[], ARRAY[1]::int8[], {ids})"
            ),
        ),
        (
            "finish_write",
            crate::finish::FINISH_WRITE,
            format!(
                "(ARRAY[1]::int8[], ARRAY[1]::int8[], ARRAY['FAILED'], ARRAY[NULL]::text[], \
                 ARRAY[0]::int8[], ARRAY[0]::int8[], ARRAY[NULL]::text[], ARRAY[NULL]::text[], \
                 'w', 0, {ids})"
            ),
        ),
        (
            "retire_pending",
            crate::schedule::RETIRE_PENDING,
            "(gen_random_uuid(), 2, 0)".into(),
        ),
        (
            "retire_running",
            crate::schedule::RETIRE_RUNNING,
            "(gen_random_uuid(), 2)".into(),
        ),
    ] {
        let plan = generic_plan(&c, name, sql, &args).await;
        let lines: Vec<&str> = plan.lines().collect();
        let mut scans = 0;
        for (i, line) in lines.iter().enumerate() {
            if !(line.contains("Scan") && line.contains(&format!(" on {today} "))) {
                continue;
            }
            scans += 1;
            assert!(!line.contains("Seq Scan"), "{name}:\n{plan}");
            // The scan's own details, up to the next plan node.
            let cond = lines[i + 1..]
                .iter()
                .take_while(|l| !l.contains("->"))
                .any(|l| l.contains("Index Cond:") || l.contains("Recheck Cond:"));
            assert!(cond, "{name}, a partition read whole:\n{plan}");
        }
        assert!(scans > 0, "{name} reads no occurrence partition:\n{plan}");
    }
}
