//! The store conformance suite on PostgreSQL, one schema per test, when
//! `CAMPANILE_TEST_PG_URL` is set (CI sets it).

use std::sync::Arc;

use campanile_store::conformance::Harness;
use campanile_store_postgres::{PgOptions, PgStore};

async fn postgres() -> Option<Harness> {
    let Ok(url) = std::env::var("CAMPANILE_TEST_PG_URL") else {
        eprintln!("skipped: CAMPANILE_TEST_PG_URL is not set (PostgreSQL conformance)");
        return None;
    };
    let schema = format!("t_{}", uuid::Uuid::now_v7().simple());
    let store = PgStore::connect_with(
        &url,
        PgOptions {
            schema: Some(schema),
            pool_size: 10,
        },
    )
    .await
    .expect("connect to PostgreSQL");
    Some(Harness {
        store: Arc::new(store.clone()),
        guard: Box::new(store.drop_schema_on_drop()),
    })
}

campanile_store::conformance_tests!(postgres);
