//! The hot statements use the indexes they were designed for. SQLite has no statistics on a
//! fresh database, so a planner change could silently turn a point lookup into a range scan.

use rusqlite::Connection;

fn plan(c: &Connection, sql: &str) -> String {
    let mut stmt = c
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .expect("prepare");
    let params: Vec<i64> = vec![1; stmt.parameter_count()];
    let rows = stmt
        .query_map(rusqlite::params_from_iter(params), |r| {
            r.get::<_, String>(3)
        })
        .expect("query")
        .collect::<Result<Vec<_>, _>>()
        .expect("rows");
    rows.join(" | ")
}

#[test]
fn hot_statements_use_their_indexes() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("plans.db");
    drop(campanile_store_sqlite::SqliteStore::open(&path).expect("open"));
    let c = Connection::open(&path).expect("open");
    // As the store's connections plan: never with the values bound.
    c.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .expect("QPSG");
    let lookup = plan(
        &c,
        "SELECT seq FROM occurrences WHERE id = ? AND tenant_id = ?",
    );
    eprintln!("lookup: {lookup}");
    assert!(
        lookup.contains("sqlite_autoindex_occurrences_1 (id=?)"),
        "{lookup}"
    );
    // The claim's loose index scan: one seek for the next pending priority, then the due range
    // of that priority, for unconstrained and for overlap-constrained occurrences.
    for (overlap, index) in [
        ("overlap = 0", "occurrences_pending "),
        ("overlap <> 0", "occurrences_pending_constrained "),
    ] {
        let probe = plan(
            &c,
            &format!(
                "SELECT priority FROM occurrences
                  WHERE tenant_id = ? AND queue = ? AND state IN ('READY', 'RETRY_WAIT')
                    AND {overlap} AND priority < ? ORDER BY priority DESC LIMIT 1"
            ),
        );
        eprintln!("probe ({overlap}): {probe}");
        assert!(
            probe.contains(&format!("{index}(tenant_id=? AND queue=? AND priority<?)")),
            "{probe}"
        );
        assert!(!probe.contains("TEMP B-TREE"), "{probe}");
        let range = plan(
            &c,
            &format!(
                "SELECT seq FROM occurrences
                  WHERE tenant_id = ? AND queue = ? AND state IN ('READY', 'RETRY_WAIT')
                    AND {overlap} AND priority = ? AND available_at <= ?
                  ORDER BY available_at LIMIT ?"
            ),
        );
        eprintln!("range ({overlap}): {range}");
        assert!(
            range.contains(&format!(
                "{index}(tenant_id=? AND queue=? AND priority=? AND available_at<?)"
            )),
            "{range}"
        );
        assert!(!range.contains("TEMP B-TREE"), "{range}");
    }
    // The constrained claim's overlap question: each part a seek in a partial index of the
    // schedule's constrained occurrences (running, pending, runs by their end),
    // never the schedule's whole history.
    let overlap = plan(&c, campanile_store_sqlite::OVERLAP_STATE);
    eprintln!("overlap: {overlap}");
    for index in [
        "occurrences_running_schedule (schedule_id=?)",
        "occurrences_pending_constrained_schedule (schedule_id=?",
        "occurrences_ran_constrained_schedule (schedule_id=? AND ran_until>?)",
    ] {
        assert!(overlap.contains(index), "{index}: {overlap}");
    }
    // The key (schedule_id, scheduled_for, version) is the schedule's whole history.
    assert!(
        !overlap.contains("sqlite_autoindex_occurrences_2"),
        "{overlap}"
    );
    assert!(!overlap.contains("SCAN occurrences"), "{overlap}");
    // Listings: one schedule's occurrences are a range of the key; a tenant's, across
    // schedules, a range of the id index read in order (ids lead with their planned instant),
    // so a page stops at its limit instead of sorting the range first.
    let by_schedule = plan(
        &c,
        "SELECT seq FROM occurrences WHERE tenant_id = ? AND schedule_id = ?
            AND scheduled_for >= ? AND scheduled_for < ? ORDER BY scheduled_for, id LIMIT ?",
    );
    eprintln!("by schedule: {by_schedule}");
    assert!(
        by_schedule.contains(
            "sqlite_autoindex_occurrences_2 (schedule_id=? AND scheduled_for>? AND scheduled_for<?)"
        ),
        "{by_schedule}"
    );
    for (name, sql) in [
        (
            "all",
            "SELECT seq FROM occurrences WHERE tenant_id = ? ORDER BY id LIMIT ?",
        ),
        (
            "range",
            "SELECT seq FROM occurrences WHERE tenant_id = ? AND scheduled_for >= ? AND scheduled_for < ?
                AND id >= ? AND id < ? AND id > ?
              ORDER BY id LIMIT ?",
        ),
        (
            "dead",
            "SELECT seq FROM occurrences WHERE tenant_id = ? AND id >= ? AND state = 'DEAD'
              ORDER BY id LIMIT ?",
        ),
    ] {
        let listing = plan(&c, sql);
        eprintln!("listing, {name}: {listing}");
        assert!(
            listing.contains("sqlite_autoindex_occurrences_1"),
            "{name}: {listing}"
        );
        assert!(!listing.contains("TEMP B-TREE"), "{name}: {listing}");
    }
    // Listing a tenant's running occurrences reads the running ones, not all of them (the
    // list writes the state into the statement, so the partial index qualifies).
    let running = plan(
        &c,
        "SELECT seq FROM occurrences WHERE tenant_id = ? AND state = 'RUNNING'
          ORDER BY id LIMIT ?",
    );
    eprintln!("running: {running}");
    assert!(
        running.contains("occurrences_running (tenant_id=?)"),
        "{running}"
    );
    let bound = plan(
        &c,
        "SELECT seq FROM occurrences WHERE tenant_id = ? AND state = ?
          ORDER BY id LIMIT ?",
    );
    eprintln!("running, bound: {bound}");
    assert!(bound.contains("SCAN occurrences"), "{bound}");
}
