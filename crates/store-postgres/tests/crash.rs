//! SIGKILL in the middle of claim batches on PostgreSQL (when `CAMPANILE_TEST_PG_URL` is set).

use std::sync::Arc;

use campanile_conformance as conformance;
use campanile_store_postgres::{PgOptions, PgStore};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}

/// Only acts when re-run as the crash test's child.
#[test]
fn crash_child() {
    let (Ok(url), Ok(schema)) = (
        std::env::var("CAMPANILE_TEST_PG_URL"),
        std::env::var("CAMPANILE_CRASH_SCHEMA"),
    ) else {
        return;
    };
    let rt = runtime();
    let store = rt
        .block_on(PgStore::connect_with(
            &url,
            PgOptions {
                schema: Some(schema),
                pool_size: 2,
            },
        ))
        .expect("connect");
    conformance::crash_child(&rt, Arc::new(store));
}

#[test]
fn sigkill_mid_claim_leaves_whole_batches_or_none() {
    let Some(url) = campanile_testkit::pg_url("PostgreSQL crash test") else {
        return;
    };
    let rt = runtime();
    let schema = format!("t_{}", uuid::Uuid::now_v7().simple());
    let store = rt
        .block_on(PgStore::connect_with(
            &url,
            PgOptions {
                schema: Some(schema.clone()),
                pool_size: 4,
            },
        ))
        .expect("connect");
    let env = [("CAMPANILE_CRASH_SCHEMA", schema)];
    conformance::sigkill_mid_claim_leaves_whole_batches_or_none(
        &rt,
        Arc::new(store.clone()),
        "crash_child",
        &env,
    );
    rt.block_on(store.drop_schema()).expect("drop schema");
}
