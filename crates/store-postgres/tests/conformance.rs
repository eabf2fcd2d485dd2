//! The store conformance suite on PostgreSQL, one schema per test, when
//! `CAMPANILE_TEST_PG_URL` is set (CI sets it).

use std::sync::Arc;

use campanile_conformance::Harness;
use campanile_store_postgres::Autovacuum;

/// A store in a schema of its own, with the URL and the schema's name.
async fn in_new_schema() -> Option<(String, String, Harness)> {
    let url = campanile_testkit::pg_url("PostgreSQL conformance")?;
    let (store, schema) = campanile_testkit::pg_store(&url, 10).await;
    let h = Harness {
        store: Arc::new(store.clone()),
        guard: Box::new(store.drop_schema_on_drop()),
    };
    Some((url, schema, h))
}

/// A connection of its own to the test database (closed when dropped).
async fn session(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    client
}

async fn postgres() -> Option<Harness> {
    in_new_schema().await.map(|(_, _, h)| h)
}

campanile_conformance::conformance_tests!(postgres);

#[test]
fn attempts_opened_by_older_versions_end_in_place() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let Some((url, schema, h)) = rt.block_on(in_new_schema()) else {
        return;
    };
    campanile_conformance::attempts_opened_by_older_versions_end_in_place(
        &rt,
        h,
        |sql| async move {
            session(&url)
                .await
                .batch_execute(&format!("SET search_path TO {schema}; {sql}"))
                .await
                .expect("legacy rows");
        },
    );
}

#[test]
fn a_claim_that_waited_while_every_mark_lapsed_takes_nothing() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let Some((url, _, h)) = rt.block_on(in_new_schema()) else {
        return;
    };
    let hold_url = url.clone();
    campanile_conformance::a_claim_that_waited_while_every_mark_lapsed_takes_nothing(
        &rt,
        h,
        |key| async move {
            // A session of its own: the lock is released when the connection closes.
            let client = session(&hold_url).await;
            client
                .execute(
                    "SELECT pg_advisory_lock(hashtextextended('campanile/queue/' || $1, 0))",
                    &[&key],
                )
                .await
                .expect("queue lock");
            client
        },
        |key| {
            let url = url.clone();
            async move {
                session(&url)
                    .await
                    .query_one(
                        "SELECT count(*) FROM pg_locks
                          WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
                            AND ((classid::int8 << 32) | objid::int8)
                                = hashtextextended('campanile/queue/' || $1, 0)",
                        &[&key],
                    )
                    .await
                    .expect("pg_locks")
                    .get::<_, i64>(0)
                    > 0
            }
        },
    );
}

#[test]
fn a_report_whose_claim_fails_keeps_its_outcomes() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let Some((url, schema, h)) = rt.block_on(in_new_schema()) else {
        return;
    };
    campanile_conformance::a_report_whose_claim_fails_keeps_its_outcomes(&rt, h, || async move {
        session(&url)
            .await
            .batch_execute(&format!(
                "SET search_path TO {schema};
                     CREATE FUNCTION refuse_claims() RETURNS trigger LANGUAGE plpgsql
                         AS $$ BEGIN RAISE EXCEPTION 'claims refused by the test'; END $$;
                     CREATE TRIGGER refuse_claims BEFORE UPDATE ON occurrences FOR EACH ROW
                         WHEN (NEW.epoch <> OLD.epoch) EXECUTE FUNCTION refuse_claims();"
            ))
            .await
            .expect("trigger");
    });
}

/// What `connect` warns about: autovacuum off for the server, or for the occurrences table.
#[test]
fn tells_whether_autovacuum_covers_the_occurrences_table() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let Ok(url) = std::env::var("CAMPANILE_TEST_PG_URL") else {
        eprintln!("skipped: CAMPANILE_TEST_PG_URL is not set (PostgreSQL autovacuum check)");
        return;
    };
    rt.block_on(async {
        let (store, schema) = campanile_testkit::pg_store(&url, 10).await;
        let _guard = store.clone().drop_schema_on_drop();
        let c = session(&url).await;
        let server: String = c
            .query_one("SHOW autovacuum", &[])
            .await
            .expect("show")
            .get(0);
        let on = Autovacuum {
            server: server == "on",
            table: true,
        };
        assert_eq!(store.autovacuum().await.expect("check"), on);
        for off in ["false", "off"] {
            c.batch_execute(&format!(
                "ALTER TABLE {schema}.occurrences_default SET (autovacuum_enabled = {off})"
            ))
            .await
            .expect("turn autovacuum off for a partition of the table");
            let a = store.autovacuum().await.expect("check");
            assert_eq!(a, Autovacuum { table: false, ..on }, "{off}");
        }
        c.batch_execute(&format!(
            "ALTER TABLE {schema}.occurrences_default SET (autovacuum_enabled = true)"
        ))
        .await
        .expect("turn it back on");
        assert_eq!(store.autovacuum().await.expect("check"), on);
    });
}
