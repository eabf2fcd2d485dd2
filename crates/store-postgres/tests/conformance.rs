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

/// The coming days get partitions of their own: a day still to come is created without
/// attaching scanning the default partition (a check proves the default partition holds none
/// of it, and goes when the day is attached), a day whose rows sit in the default partition
/// (none was created for it in time) takes them out of it, and a proof a node left behind is
/// removed.
#[test]
fn days_are_created_ahead_and_take_their_rows_out_of_the_default_partition() {
    use campanile_store::{OccurrenceDaysPrepare, Store};
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let Ok(url) = std::env::var("CAMPANILE_TEST_PG_URL") else {
        eprintln!("skipped: CAMPANILE_TEST_PG_URL is not set (PostgreSQL day partitions)");
        return;
    };
    rt.block_on(async {
        let (store, schema) = campanile_testkit::pg_store(&url, 4).await;
        let _guard = store.clone().drop_schema_on_drop();
        let c = session(&url).await;
        c.batch_execute(&format!("SET search_path = {schema}"))
            .await
            .expect("schema");
        let f = campanile_conformance::fixture(&store, "acme", "q").await;
        let day = 86_400_000_i64;
        let today = jiff::Timestamp::now().as_millisecond().div_euclid(day) * day;
        // Five days ahead, before its partition exists: the default partition takes it.
        let at = jiff::Timestamp::from_millisecond(today + 5 * day + 3_600_000).expect("instant");
        let id = campanile_conformance::insert(
            &store,
            &f,
            vec![campanile_store::NewOccurrence {
                scheduled_for: at,
                available_at: at,
                ..campanile_conformance::new_occ(&f, "q", at, 3)
            }],
        )
        .await[0];
        assert_eq!(home(&c, id.0).await, "occurrences_default");
        // A proof left behind for a day that exists already.
        let name_of = |ms: i64| {
            let date = jiff::tz::Offset::UTC
                .to_datetime(jiff::Timestamp::from_millisecond(ms).expect("instant"))
                .date();
            format!(
                "occurrences_{:04}{:02}{:02}",
                date.year(),
                date.month(),
                date.day()
            )
        };
        c.batch_execute(&format!(
            "ALTER TABLE occurrences_default ADD CONSTRAINT {}_not_default
                 CHECK (id IS NOT NULL) NOT VALID",
            name_of(today)
        ))
        .await
        .expect("a proof left behind for today, which has its partition");
        assert_eq!(proofs(&c).await, 1);
        let created = store
            .occurrence_days_prepare(OccurrenceDaysPrepare {
                ahead: 6,
                now: None,
            })
            .await
            .expect("prepare");
        assert_eq!(created, 3, "days 4, 5 and 6 ahead");
        assert_eq!(home(&c, id.0).await, name_of(at.as_millisecond()));
        assert_eq!(
            proofs(&c).await,
            0,
            "none left behind, none left by the days created"
        );
    });
}

/// The partition an occurrence is stored in.
async fn home(c: &tokio_postgres::Client, id: uuid::Uuid) -> String {
    c.query_one(
        "SELECT tableoid::regclass::text FROM occurrences WHERE id = $1",
        &[&id],
    )
    .await
    .expect("row")
    .get(0)
}

/// How many checks proving a day absent from the default partition it carries.
async fn proofs(c: &tokio_postgres::Client) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_constraint
          WHERE conrelid = 'occurrences_default'::regclass AND conname LIKE '%_not_default'",
        &[],
    )
    .await
    .expect("count")
    .get(0)
}
