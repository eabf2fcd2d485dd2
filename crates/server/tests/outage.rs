//! The database goes away and comes back: the API answers 503 (never 500, never a hang) while
//! it is gone, readiness says so, and everything works again once it is back. PostgreSQL is
//! reached through a TCP proxy that the test stops and restarts (when CAMPANILE_TEST_PG_URL is
//! set).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use campanile_server::{AppState, ServerConfig, issue_key, router};
use campanile_store::{Store, TenantCreate};
use campanile_store_postgres::{PgOptions, PgStore};
use http_body_util::BodyExt;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

/// A proxy to PostgreSQL that can be cut (existing connections dropped, new ones refused) and
/// restored.
struct Proxy {
    port: u16,
    up: Arc<AtomicBool>,
    generation: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Proxy {
    async fn start(target: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let (tx, _) = tokio::sync::watch::channel(0u64);
        let generation = Arc::new(tx);
        let (up2, gen2) = (up.clone(), generation.clone());
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if !up2.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let target = target.clone();
                let mut cut = gen2.subscribe();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&target).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    tokio::select! {
                        _ = tokio::io::copy(&mut cr, &mut sw) => {}
                        _ = tokio::io::copy(&mut sr, &mut cw) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Proxy {
            port,
            up,
            generation,
        }
    }

    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

async fn status(
    app: &axum::Router,
    method: &str,
    path: &str,
    key: &str,
) -> (StatusCode, serde_json::Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {key}"))
        .body(Body::empty())
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(20), app.clone().oneshot(req))
        .await
        .expect("no hang")
        .unwrap();
    let s = resp.status();
    // Every 503 tells the client when to ask again.
    if s == StatusCode::SERVICE_UNAVAILABLE {
        assert!(
            resp.headers().get("retry-after").is_some(),
            "{method} {path}: a 503 without Retry-After"
        );
    }
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        s,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_is_a_503_and_recovery_is_automatic() {
    let Some(url) = campanile_testkit::pg_url("database outage test") else {
        return;
    };
    let cfg: tokio_postgres_config::Config = url.parse().unwrap();
    let host = cfg.get_hosts().first().map(|h| match h {
        tokio_postgres_config::config::Host::Tcp(h) => h.clone(),
        #[allow(unreachable_patterns)]
        _ => "127.0.0.1".to_string(),
    });
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let proxy = Proxy::start(format!(
        "{}:{port}",
        host.unwrap_or_else(|| "127.0.0.1".into())
    ))
    .await;
    let user = cfg.get_user().unwrap_or("postgres").to_string();
    let dbname = cfg.get_dbname().unwrap_or("test").to_string();
    let proxied = format!(
        "postgres://{user}@127.0.0.1:{}/{dbname}?connect_timeout=2",
        proxy.port
    );
    let schema = format!("t_{}", uuid::Uuid::now_v7().simple());
    let pg = PgStore::connect_with(
        &proxied,
        PgOptions {
            schema: Some(schema),
            pool_size: 4,
        },
    )
    .await
    .unwrap();
    let store: Arc<dyn Store> = Arc::new(pg.clone());
    let tenant = store
        .tenant_create(TenantCreate {
            name: "a".into(),
            now: None,
        })
        .await
        .unwrap();
    let key = issue_key(store.as_ref(), Some(tenant.id), false)
        .await
        .unwrap();
    let cfg = ServerConfig::default();
    let mut pcfg = campanile_planner::PlannerConfig::new("outage-test");
    pcfg.shards = cfg.shards;
    pcfg.shard_lease = jiff::SignedDuration::from_millis(400);
    let planner = Arc::new(campanile_planner::Planner::new(store.clone(), pcfg));
    planner.tick(None).await.unwrap();
    let held = planner.shards_held().len();
    assert!(held > 0, "the planner holds its shards");
    let app = router(AppState::new(store, &cfg, Some(planner.clone())), &cfg);

    assert_eq!(status(&app, "GET", "/readyz", &key).await.0, StatusCode::OK);
    assert_eq!(
        status(&app, "GET", "/v1/schedules", &key).await.0,
        StatusCode::OK
    );

    proxy.cut();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for path in ["/readyz", "/v1/schedules", "/v1/occurrences"] {
        let (s, v) = status(&app, "GET", path, &key).await;
        assert_eq!(
            s,
            StatusCode::SERVICE_UNAVAILABLE,
            "{path} while the database is gone: {v}"
        );
        assert_eq!(v["code"], "unavailable");
    }
    // A planner that cannot renew holds nothing once its leases run out, and says so (a
    // shards gauge that kept its last value through an outage would hide it).
    assert!(planner.tick(None).await.is_err());
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(planner.tick(None).await.is_err());
    assert!(
        planner.shards_held().is_empty(),
        "{:?}",
        planner.shards_held()
    );

    proxy.restore();
    let mut ok = false;
    for _ in 0..50 {
        if status(&app, "GET", "/v1/schedules", &key).await.0 == StatusCode::OK {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(ok, "the API recovers by itself once the database is back");
    let mut back = false;
    for _ in 0..50 {
        if planner.tick(None).await.is_ok() {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(back, "the planner renews once the database is back");
    assert_eq!(
        planner.shards_held().len(),
        held,
        "and holds its shards again"
    );
    assert_eq!(status(&app, "GET", "/readyz", &key).await.0, StatusCode::OK);
    pg.drop_schema().await.unwrap();
}
