//! The store conformance suite on PostgreSQL, one schema per test, when
//! `CAMPANILE_TEST_PG_URL` is set (CI sets it).

use std::sync::Arc;

use campanile_store::conformance::Harness;
use campanile_store_postgres::{PgOptions, PgStore};

/// Drops the test's schema when the test ends.
struct DropSchema(PgStore);

impl Drop for DropSchema {
    fn drop(&mut self) {
        let store = self.0.clone();
        // A fresh runtime on a plain thread: Drop may run inside another runtime.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                let _ = rt.block_on(store.drop_schema());
            }
        })
        .join();
    }
}

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
        guard: Box::new(DropSchema(store)),
    })
}

campanile_store::conformance_tests!(postgres);
