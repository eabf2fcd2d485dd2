//! The hot statements use the indexes they were designed for. SQLite has no statistics on a
//! fresh database, so a planner change could silently turn a point lookup into a range scan.

use rusqlite::Connection;

fn plan(c: &Connection, sql: &str) -> String {
    let n = sql.matches('?').count();
    let params: Vec<i64> = vec![1; n];
    let mut stmt = c
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .expect("prepare");
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
    let finish = plan(
        &c,
        "UPDATE occurrences SET state = 'SUCCEEDED', result = ?, finished_at = ?
          WHERE id = ? AND tenant_id = ? AND state = 'RUNNING' AND owner = ? AND epoch = ? AND lease_until > ?
         RETURNING seq",
    );
    eprintln!("finish: {finish}");
    let lookup = plan(
        &c,
        "SELECT seq FROM occurrences WHERE id = ? AND tenant_id = ?",
    );
    eprintln!("lookup: {lookup}");
    let pending = plan(
        &c,
        "SELECT seq FROM occurrences WHERE tenant_id = ? AND queue = ? AND state IN ('READY', 'RETRY_WAIT')
           AND available_at <= ? ORDER BY priority DESC, available_at LIMIT ?",
    );
    eprintln!("pending: {pending}");
    assert!(
        lookup.contains("sqlite_autoindex_occurrences_1 (id=?)"),
        "{lookup}"
    );
    assert!(finish.contains("(id=?)"), "{finish}");
    assert!(pending.contains("occurrences_pending"), "{pending}");
}
