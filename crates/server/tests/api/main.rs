//! The HTTP API in process against embedded SQLite: every route, its errors, tenant isolation,
//! the worker protocol and the service's own routes, by topic.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod auth;
mod console;
mod input;
mod recovery;
mod schedules;
mod service;
mod workers;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use campanile_planner::{Planner, PlannerConfig};
use campanile_server::{AppState, ServerConfig, issue_key, router};
use campanile_store::{Store, TenantByName, TenantCreate};
use campanile_store_sqlite::SqliteStore;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

struct App {
    router: Router,
    store: Arc<dyn Store>,
    a: String,
    b: String,
    _dir: tempfile::TempDir,
}

async fn app_with(cfg: ServerConfig) -> App {
    app_timed(cfg, Arc::new(campanile_core::SystemClock)).await
}

/// An app whose API-key cache is timed by `clock`.
async fn app_timed(cfg: ServerConfig, clock: Arc<dyn campanile_core::Clock>) -> App {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("api.db")).unwrap());
    let ta = store
        .tenant_create(TenantCreate {
            name: "a".into(),
            now: None,
        })
        .await
        .unwrap();
    let tb = store
        .tenant_create(TenantCreate {
            name: "b".into(),
            now: None,
        })
        .await
        .unwrap();
    let a = issue_key(store.as_ref(), Some(ta.id), false).await.unwrap();
    let b = issue_key(store.as_ref(), Some(tb.id), false).await.unwrap();
    let router = router(
        AppState::new(store.clone(), &cfg, None).with_clock(clock),
        &cfg,
    );
    App {
        router,
        store,
        a,
        b,
        _dir: dir,
    }
}

async fn app() -> App {
    app_with(ServerConfig::default()).await
}

impl App {
    async fn raw(&self, req: Request<Body>) -> (StatusCode, Value, axum::http::HeaderMap) {
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, value, headers)
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        let req = match body {
            Some(b) => req
                .header("content-type", "application/json")
                .body(Body::from(b.to_string()))
                .unwrap(),
            None => req.body(Body::empty()).unwrap(),
        };
        let (s, v, _) = self.raw(req).await;
        (s, v)
    }

    /// Sets tenant a's quotas (`q.tenant` is ignored).
    async fn quota_of_a(&self, q: campanile_store::TenantQuota) {
        let a = self
            .store
            .tenant_by_name(TenantByName { name: "a".into() })
            .await
            .unwrap()
            .unwrap();
        let q = campanile_store::TenantQuota { tenant: a.id, ..q };
        self.store.tenant_quota_set(q).await.unwrap();
    }

    async fn plan(&self) {
        let mut cfg = PlannerConfig::new("test");
        cfg.shards = ServerConfig::default().shards;
        Planner::new(self.store.clone(), cfg)
            .tick(None)
            .await
            .unwrap();
    }
}

fn code(v: &Value) -> &str {
    v["code"].as_str().unwrap_or("")
}

fn now_plus(secs: i64) -> String {
    jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(secs))
        .unwrap()
        .to_string()
}

/// A one-off due a moment ago that still runs (within its lateness): claimable at once.
fn due_now(queue: &str) -> Value {
    json!({"queue": queue, "at": now_plus(-1), "misfire": {"policy": "fire_once", "max_lateness_seconds": 600}, "payload": {"n": 1}})
}

/// The value of an unlabelled counter on /metrics.
async fn counter(app: &App, name: &str) -> f64 {
    let (_, m) = app.call("GET", "/metrics", None, None).await;
    m.as_str()
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}
