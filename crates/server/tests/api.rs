//! The HTTP API in-process (tower `oneshot`, no socket): every route, every error code,
//! tenant isolation, idempotency and the OpenAPI document.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use campanile_planner::{Planner, PlannerConfig};
use campanile_server::{AppState, ServerConfig, issue_key, router};
use campanile_store::{ApiKeyRevoke, BacklogGet, Store, TenantByName, TenantCreate};
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

#[tokio::test]
async fn a_schedules_lease_is_what_a_claim_without_one_grants() {
    let app = app().await;
    let k = Some(app.a.as_str());
    let mut long = due_now("leases");
    long["lease_seconds"] = json!(600);
    let (s, v) = app.call("POST", "/v1/schedules", k, Some(long)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["lease_seconds"], 600);
    app.plan().await;
    let (s, c) = app
        .call(
            "POST",
            "/v1/queues/leases/claim",
            k,
            Some(json!({"worker_id": "w"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{c}");
    let o = &c["occurrences"][0];
    let secs = |v: &Value| {
        v.as_str()
            .unwrap()
            .parse::<jiff::Timestamp>()
            .unwrap()
            .as_second()
    };
    let granted = secs(&o["lease_until"]) - jiff::Timestamp::now().as_second();
    assert!((595..=600).contains(&granted), "lease of {granted} s: {c}");
    // A renewal that names none extends by the schedule's lease too; one that names one
    // uses it.
    let lease = json!([{"occurrence_id": o["id"], "epoch": o["epoch"]}]);
    let (_, r) = app
        .call(
            "POST",
            "/v1/leases/renew",
            k,
            Some(json!({"worker_id": "w", "leases": lease})),
        )
        .await;
    let granted = secs(&r["leases"][0]["lease_until"]) - jiff::Timestamp::now().as_second();
    assert!(
        (595..=600).contains(&granted),
        "renewed for {granted} s: {r}"
    );
    let (_, r) = app
        .call(
            "POST",
            "/v1/leases/renew",
            k,
            Some(json!({"worker_id": "w", "leases": lease, "lease_seconds": 20})),
        )
        .await;
    let granted = secs(&r["leases"][0]["lease_until"]) - jiff::Timestamp::now().as_second();
    assert!((15..=20).contains(&granted), "renewed for {granted} s: {r}");
    // A lease that is not renewed says why, as a refused completion does.
    let stale = json!([{"occurrence_id": o["id"], "epoch": 7}]);
    let (_, r) = app
        .call(
            "POST",
            "/v1/leases/renew",
            k,
            Some(json!({"worker_id": "w", "leases": stale})),
        )
        .await;
    let lost = &r["leases"][0];
    assert_eq!(
        (lost["renewed"].as_bool(), lost["check"].as_str()),
        (Some(false), Some("stale_epoch")),
        "{r}"
    );
    assert!(
        lost["message"]
            .as_str()
            .is_some_and(|m| m.contains("epoch 7")),
        "{r}"
    );
}

#[tokio::test]
async fn the_auth_scheme_is_case_insensitive_and_a_401_names_it() {
    let app = app().await;
    // A 401 names the scheme; the scheme is case-insensitive, the key is not.
    let with = |auth: String| {
        Request::builder()
            .uri("/v1/schedules")
            .header("authorization", auth)
            .body(Body::empty())
            .unwrap()
    };
    let (s, _, headers) = app.raw(with("Basic abc".into())).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let challenge = headers
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok());
    assert!(
        challenge.is_some_and(|c| c.starts_with("Bearer")),
        "{challenge:?}"
    );
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let (s, v, _) = app.raw(with(format!("{scheme} {}", app.a))).await;
        assert_eq!(s, StatusCode::OK, "{scheme}: {v}");
    }
    let (s, _, _) = app
        .raw(with(format!("Bearer {}", app.a.to_uppercase())))
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn every_v1_route_requires_a_valid_key() {
    let app = app().await;
    let id = "01a22920-d853-729f-9c55-289f7af8c7d4";
    let routes = [
        ("POST", "/v1/schedules".to_string()),
        ("GET", "/v1/schedules".to_string()),
        ("POST", "/v1/schedules/preview".to_string()),
        ("GET", format!("/v1/schedules/{id}")),
        ("PATCH", format!("/v1/schedules/{id}")),
        ("POST", format!("/v1/schedules/{id}/pause")),
        ("POST", format!("/v1/schedules/{id}/resume")),
        ("POST", format!("/v1/schedules/{id}/cancel")),
        (
            "GET",
            format!("/v1/schedules/{id}/occurrences/2026-01-01T00:00:00Z"),
        ),
        ("GET", "/v1/occurrences".to_string()),
        ("GET", format!("/v1/occurrences/{id}")),
        ("POST", format!("/v1/occurrences/{id}/complete")),
        ("POST", format!("/v1/occurrences/{id}/fail")),
        ("POST", format!("/v1/occurrences/{id}/redrive")),
        ("POST", format!("/v1/occurrences/{id}/cancel")),
        ("POST", "/v1/queues/q/claim".to_string()),
        ("POST", "/v1/leases/renew".to_string()),
        ("POST", "/v1/completions".to_string()),
    ];
    for (m, p) in &routes {
        for key in [None, Some("cmp_not_a_real_key"), Some("")] {
            let (s, v) = app.call(m, p, key, Some(json!({}))).await;
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{m} {p} with {key:?}: {v}");
            assert_eq!(code(&v), "unauthorized");
        }
    }
    // A revoked key that this node has not just verified is refused at once.
    let prefix = campanile_server::key_prefix(&app.a);
    assert_eq!(
        app.store
            .api_key_revoke(ApiKeyRevoke {
                prefix: prefix.clone(),
                now: None
            })
            .await
            .unwrap(),
        1
    );
    let (s, _) = app.call("GET", "/v1/schedules", Some(&app.a), None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_revoked_key_is_refused_once_the_verified_key_expires() {
    // A node trusts a key it verified for `key_cache`: a key revoked elsewhere (the CLI, another
    // node) keeps working there at most that long, and is refused after. Zero: at once.
    for cache_ms in [1000, 0] {
        let clock = Arc::new(campanile_core::ManualClock::new(jiff::Timestamp::now()));
        let cfg = ServerConfig {
            key_cache: std::time::Duration::from_millis(cache_ms),
            ..ServerConfig::default()
        };
        let app = app_timed(cfg, clock.clone()).await;
        let status = async |key: &str| app.call("GET", "/v1/schedules", Some(key), None).await.0;
        assert_eq!(status(&app.a).await, StatusCode::OK);
        let prefix = campanile_server::key_prefix(&app.a);
        assert_eq!(
            app.store
                .api_key_revoke(ApiKeyRevoke {
                    prefix: prefix.clone(),
                    now: None
                })
                .await
                .unwrap(),
            1
        );
        if cache_ms > 0 {
            clock.advance(jiff::SignedDuration::from_millis(999));
            assert_eq!(status(&app.a).await, StatusCode::OK, "within the period");
            clock.advance(jiff::SignedDuration::from_millis(1));
        }
        assert_eq!(
            status(&app.a).await,
            StatusCode::UNAUTHORIZED,
            "{cache_ms} ms"
        );
        // The other tenant's key is unaffected.
        assert_eq!(status(&app.b).await, StatusCode::OK);
    }
}

#[tokio::test]
async fn schedule_lifecycle_over_http() {
    let app = app().await;
    let k = Some(app.a.as_str());
    let (s, v) = app
        .call("POST", "/v1/schedules", k, Some(json!({"queue": "reports", "cron": "30 2 * * *", "timezone": "America/New_York", "payload": {"r": "daily"}})))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    assert_eq!(
        (v["version"].as_u64(), v["state"].as_str()),
        (Some(1), Some("ACTIVE"))
    );
    assert_eq!(v["next_fires"].as_array().unwrap().len(), 5);
    assert_eq!(v["payload"], json!({"r": "daily"}));
    assert_eq!(v["dst"], json!({"gap": "skip", "fold": "once"}));
    let (s, got) = app
        .call("GET", &format!("/v1/schedules/{id}"), k, None)
        .await;
    assert_eq!((s, got["id"].clone()), (StatusCode::OK, v["id"].clone()));

    // Optimistic update: a stale version is a conflict that names the current one.
    let patch =
        json!({"version": 7, "queue": "reports", "cron": "0 3 * * *", "timezone": "Europe/Paris"});
    let (s, e) = app
        .call("PATCH", &format!("/v1/schedules/{id}"), k, Some(patch))
        .await;
    assert_eq!((s, code(&e)), (StatusCode::CONFLICT, "version_conflict"));
    assert_eq!(e["details"]["current_version"], 1);
    let (s, e) = app
        .call(
            "PATCH",
            &format!("/v1/schedules/{id}"),
            k,
            Some(json!({"queue": "reports", "cron": "0 3 * * *"})),
        )
        .await;
    assert_eq!(
        (s, code(&e)),
        (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
        "version is required"
    );
    let (s, c) = app
        .call("PATCH", &format!("/v1/schedules/{id}"), k, Some(json!({"version": 1, "queue": "reports", "cron": "0 3 * * *", "timezone": "Europe/Paris"})))
        .await;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert_eq!(
        (
            c["schedule"]["version"].as_u64(),
            c["schedule"]["timezone"].as_str()
        ),
        (Some(2), Some("Europe/Paris"))
    );
    assert!(c["in_flight"].as_array().unwrap().is_empty());

    for (action, state, version) in [
        ("pause", "PAUSED", 3),
        ("resume", "ACTIVE", 3),
        ("cancel", "CANCELED", 4),
    ] {
        let (s, c) = app
            .call("POST", &format!("/v1/schedules/{id}/{action}"), k, None)
            .await;
        assert_eq!(s, StatusCode::OK, "{action}: {c}");
        assert_eq!(
            (
                c["schedule"]["state"].as_str(),
                c["schedule"]["version"].as_u64()
            ),
            (Some(state), Some(version))
        );
    }
    let (s, e) = app
        .call("POST", &format!("/v1/schedules/{id}/resume"), k, None)
        .await;
    assert_eq!((s, code(&e)), (StatusCode::CONFLICT, "wrong_state"));
    let (_, c) = app
        .call("GET", &format!("/v1/schedules/{id}"), k, None)
        .await;
    assert!(
        c["next_fires"].as_array().unwrap().is_empty(),
        "a canceled schedule has no next fires"
    );

    // Listing with a cursor walks every schedule once.
    for i in 0..5 {
        app.call(
            "POST",
            "/v1/schedules",
            k,
            Some(json!({"queue": format!("q{i}"), "every": "15m"})),
        )
        .await;
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/schedules?limit=2&cursor={c}"),
            None => "/v1/schedules?limit=2".to_string(),
        };
        let (s, page) = app.call("GET", &path, k, None).await;
        assert_eq!(s, StatusCode::OK);
        seen.extend(
            page["schedules"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["id"].as_str().unwrap().to_string()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 6);
    let (_, active) = app.call("GET", "/v1/schedules?state=active", k, None).await;
    assert_eq!(active["schedules"].as_array().unwrap().len(), 5);
    let (_, q3) = app.call("GET", "/v1/schedules?queue=q3", k, None).await;
    assert_eq!(q3["schedules"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn bad_input_is_a_4xx_that_says_what_is_wrong() {
    let app = app_with(ServerConfig {
        max_body_bytes: 2048,
        ..ServerConfig::default()
    })
    .await;
    let k = Some(app.a.as_str());
    let cases: Vec<(Value, &str)> = vec![
        (json!({"queue": "q", "cron": "0 25 * * *"}), "hour"),
        (json!({"queue": "q", "cron": "0 0 30 2 *"}), "never fire"),
        (
            json!({"queue": "q", "cron": "0 1 * * *", "timezone": "Mars/Olympus"}),
            "Mars/Olympus",
        ),
        (json!({"cron": "0 1 * * *"}), "queue"),
        (json!({"queue": "q"}), "exactly one of"),
        (
            json!({"queue": "q", "cron": "0 1 * * *", "at": now_plus(60)}),
            "exactly one of",
        ),
        (json!({"queue": "q", "at": now_plus(-3600)}), "past"),
        (json!({"queue": "q", "every": "soon"}), "every"),
        (json!({"queue": "q", "every": "1d"}), "24h"),
        (
            json!({"queue": "q", "every": "99999999999h"}),
            "never fire a second time",
        ),
        (
            json!({"queue": "q", "every": "1h", "lease_seconds": 0}),
            "lease_seconds",
        ),
        (
            json!({"queue": "q", "every": "1h", "overlap": "SOMETIMES"}),
            "overlap",
        ),
        (
            json!({"queue": "q", "every": "1h", "misfire": {"policy": "yolo"}}),
            "misfire",
        ),
        (
            json!({"queue": "q", "cron": "* * * * *", "dst": {"gap": "jump"}}),
            "dst.gap",
        ),
        (
            json!({"queue": "q", "every": "1h", "colour": "red"}),
            "colour",
        ),
        (json!({"queue": 42, "every": "1h"}), "queue"),
        // Out of range: accepted, a backoff this long would make every transient failure of
        // its occurrences a 500 (the retry instant does not exist).
        (
            json!({"queue": "q", "every": "1h", "retry": {"backoff_initial_ms": i64::MAX, "backoff_max_ms": i64::MAX}}),
            "backoff_max_ms must be at most",
        ),
        (
            json!({"queue": "q", "every": "1h", "misfire": {"policy": "catchup", "catchup_max": 5, "catchup_interval_ms": -1}}),
            "catchup_interval_ms",
        ),
        (
            json!({"queue": "q", "every": "1h", "misfire": {"policy": "catchup", "catchup_max": 5, "catchup_interval_ms": i64::MAX}}),
            "catchup_interval_ms",
        ),
        (
            json!({"queue": "q", "every": "1h", "misfire": {"policy": "skip", "catchup_max": 5}}),
            "only to the catchup policy",
        ),
        // Listings read occurrences in planned order from their ids, which sort so only from
        // 1970 on; a one-off that runs late is the only way to plan earlier.
        (
            json!({"queue": "q", "at": "1969-12-31T23:59:59.999Z", "misfire": {"policy": "fire_once"}}),
            "before 1970",
        ),
    ];
    for (body, needle) in cases {
        let (s, v) = app
            .call("POST", "/v1/schedules", k, Some(body.clone()))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
        assert_eq!(code(&v), "validation_failed");
        assert!(
            v["message"].as_str().unwrap().contains(needle),
            "{body}: {v}"
        );
    }
    // A refused name is quoted, not echoed whole: a 100 kB policy, zone or cron token made a
    // 100 kB error message (1.5 kB here, under this server's body limit).
    let long = "X".repeat(1_500);
    for body in [
        json!({"queue": "q", "every": "1h", "overlap": long}),
        json!({"queue": "q", "every": "1h", "misfire": {"policy": long}}),
        json!({"queue": "q", "cron": "0 1 * * *", "timezone": long}),
        json!({"queue": "q", "cron": format!("0 1 * * {long}")}),
        json!({"queue": "q", "cron": "* * * * *", "dst": {"gap": long}}),
        json!({"queue": "q", "every": long}),
    ] {
        let (s, v) = app.call("POST", "/v1/schedules", k, Some(body)).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
        let message = v["message"].as_str().unwrap();
        assert!(
            message.len() < 400,
            "{} bytes: {message:.300}",
            message.len()
        );
        assert!(message.to_uppercase().contains("XXXX…"), "{message:.300}");
    }
    // Malformed JSON, wrong media type, oversized body.
    let req = |ct: &str, body: String| {
        Request::builder()
            .method("POST")
            .uri("/v1/schedules")
            .header("authorization", format!("Bearer {}", app.a))
            .header("content-type", ct)
            .body(Body::from(body))
            .unwrap()
    };
    let (s, v, _) = app
        .raw(req("application/json", "{\"queue\": ".into()))
        .await;
    assert_eq!((s, code(&v)), (StatusCode::BAD_REQUEST, "invalid_request"));
    for ct in ["text/plain", "application/jsonx", "text/x+json"] {
        let (s, v, _) = app.raw(req(ct, "{}".into())).await;
        assert_eq!(
            (s, code(&v)),
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            "{ct}"
        );
    }
    // A +json type with parameters is JSON: the body gets as far as validation.
    let (s, v, _) = app
        .raw(req(
            "application/merge-patch+json; charset=utf-8",
            "{}".into(),
        ))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    // A compressed body is refused, not parsed as if it were plain.
    let mut gz = req(
        "application/json",
        r#"{"queue": "q", "every": "1h"}"#.into(),
    );
    gz.headers_mut()
        .insert("content-encoding", "gzip".parse().unwrap());
    let (s, v, _) = app.raw(gz).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
        "{v}"
    );
    // Instants RFC 3339 cannot write (years outside 0000–9999) are refused wherever an
    // instant is taken, not stored and echoed.
    let k = Some(app.a.as_str());
    for body in [
        json!({"queue": "q", "at": "-009000-01-01T00:00:00Z", "misfire": {"policy": "fire_once"}}),
        json!({"queue": "q", "every": "1h", "anchor": "-000001-01-01T00:00:00Z"}),
    ] {
        let (s, v) = app
            .call("POST", "/v1/schedules", k, Some(body.clone()))
            .await;
        assert_eq!(
            (s, code(&v)),
            (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
            "{body}: {v}"
        );
        assert!(
            v["message"].as_str().unwrap().contains("0000 to 9999"),
            "{v}"
        );
    }
    let (s, v) = app
        .call(
            "POST",
            "/v1/schedules/preview",
            k,
            Some(json!({"cron": "0 0 1 1 *", "after": "-000005-01-01T00:00:00Z"})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (s, v) = app
        .call("GET", "/v1/occurrences?to=-000001-01-01T00:00:00Z", k, None)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    // A malformed schedule filter is bad input like any other filter, not a missing record.
    for q in ["abc", ""] {
        let (s, v) = app
            .call("GET", &format!("/v1/occurrences?schedule_id={q}"), k, None)
            .await;
        assert_eq!(
            (s, code(&v)),
            (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
            "{q}: {v}"
        );
    }
    // Preview takes policy names in either case, as create does.
    let (s, v) = app
        .call(
            "POST",
            "/v1/schedules/preview",
            k,
            Some(json!({"cron": "0 2 * * *", "timezone": "America/New_York",
                        "dst": {"gap": "SHIFT", "fold": "TWICE"}})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // One JSON object and nothing after it; media types compare case-insensitively.
    let one = r#"{"queue": "q", "every": "1h"}"#;
    let (s, v, _) = app
        .raw(req("application/json", format!("{one} trailing")))
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, "invalid_request"),
        "{v}"
    );
    let (s, v, _) = app
        .raw(req("application/json", format!("{one}{one}")))
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, "invalid_request"),
        "{v}"
    );
    let (s, v, _) = app
        .raw(req(
            "application/json",
            r#"[null, "q", null, "0 0 * * *"]"#.into(),
        ))
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
        "{v}"
    );
    let (s, v, _) = app
        .raw(req("Application/JSON", r#"{"queue": 42}"#.into()))
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
        "read as JSON, then refused for its content: {v}"
    );
    let big = json!({"queue": "q", "every": "1h", "payload": "x".repeat(4096)}).to_string();
    let (s, v, _) = app.raw(req("application/json", big)).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
    );
    // Query and path errors.
    for path in [
        "/v1/occurrences?state=FINISHED",
        "/v1/occurrences?limit=0",
        "/v1/occurrences?from=yesterday",
        "/v1/schedules?limit=9999",
        "/v1/occurrences?cursor=abc",
    ] {
        let (s, v) = app.call("GET", path, k, None).await;
        assert_eq!(
            (s, code(&v)),
            (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
            "{path}: {v}"
        );
    }
    // A query string or path that cannot be parsed at all is a JSON 400 too (axum's own
    // extractors answered these in plain text).
    for path in [
        "/v1/schedules?limit=abc",
        "/v1/schedules?limit=-1",
        "/v1/schedules?limit=1&limit=2",
        "/v1/occurrences?limit=99999999999",
    ] {
        let (s, v) = app.call("GET", path, k, None).await;
        assert_eq!(
            (s, code(&v)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{path}: {v}"
        );
        assert!(
            v["message"].as_str().unwrap().contains("limit"),
            "{path}: {v}"
        );
    }
    // A misspelt filter is refused, not ignored: ignored, it would list everything.
    for (path, name) in [
        ("/v1/occurrences?stat=DEAD", "stat"),
        ("/v1/schedules?queu=q", "queu"),
    ] {
        let (s, v) = app.call("GET", path, k, None).await;
        assert_eq!(
            (s, code(&v)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{path}: {v}"
        );
        assert!(v["message"].as_str().unwrap().contains(name), "{path}: {v}");
    }
    let (s, v) = app
        .call(
            "POST",
            "/v1/queues/%FF/claim",
            k,
            Some(json!({"worker_id": "w"})),
        )
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, "invalid_request"),
        "{v}"
    );
    // A claim sent again needs the key it was sent with, and a key is a UUID; the claim a
    // report carries is checked the same way, before any outcome is written.
    for (path, body) in [
        (
            "/v1/queues/q/claim",
            json!({"worker_id": "w", "resent": true}),
        ),
        (
            "/v1/queues/q/claim",
            json!({"worker_id": "w", "claim_key": "k1"}),
        ),
        (
            "/v1/completions",
            json!({"worker_id": "w",
                   "items": [{"occurrence_id": uuid::Uuid::nil(), "epoch": 1}],
                   "claim": {"queue": "q", "resent": true}}),
        ),
    ] {
        let (s, v) = app.call("POST", path, k, Some(body.clone())).await;
        assert_eq!(
            (s, code(&v)),
            (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
            "{body}: {v}"
        );
        assert!(
            v["message"].as_str().unwrap().contains("claim_key"),
            "{body}: {v}"
        );
    }
    // A route asked with a method it does not take: JSON, and the methods it does take.
    let wrong = Request::builder()
        .method("DELETE")
        .uri("/v1/schedules")
        .header("authorization", format!("Bearer {}", app.a))
        .body(Body::empty())
        .unwrap();
    let (s, v, headers) = app.raw(wrong).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
        "{v}"
    );
    let allow = headers
        .get("allow")
        .and_then(|a| a.to_str().ok())
        .unwrap_or("");
    assert!(
        allow.contains("GET") && allow.contains("POST"),
        "Allow: {allow}"
    );
    let (s, v) = app.call("GET", "/v1/schedules/not-a-uuid", k, None).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("schedule ids are UUIDs"),
        "{v}"
    );
    let (s, v) = app.call("GET", "/v1/nothing-here", k, None).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    // Preview validates without saving.
    let (s, v) = app.call("POST", "/v1/schedules/preview", k, Some(json!({"cron": "30 2 * * *", "timezone": "America/New_York", "after": "2026-03-07T00:00:00Z", "count": 3}))).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        v["next_fires"],
        json!([
            "2026-03-07T07:30:00Z",
            "2026-03-09T06:30:00Z",
            "2026-03-10T06:30:00Z"
        ])
    );
    let (s, v) = app
        .call(
            "POST",
            "/v1/schedules/preview",
            k,
            Some(json!({"cron": "61 * * * *"})),
        )
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed")
    );
    let (_, list) = app.call("GET", "/v1/schedules", k, None).await;
    assert!(
        list["schedules"].as_array().unwrap().is_empty(),
        "nothing was saved"
    );
}

#[tokio::test]
async fn idempotency_key_makes_create_safe_to_retry() {
    let app = app().await;
    let body = json!({"queue": "q", "every": "1h"});
    let req = |body: &Value| {
        Request::builder()
            .method("POST")
            .uri("/v1/schedules")
            .header("authorization", format!("Bearer {}", app.a))
            .header("content-type", "application/json")
            .header("idempotency-key", "create-once-42")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let (s1, v1, _) = app.raw(req(&body)).await;
    let (s2, v2, _) = app.raw(req(&body)).await;
    assert_eq!((s1, s2), (StatusCode::CREATED, StatusCode::CREATED));
    assert_eq!(v1["id"], v2["id"], "the retry returns the first schedule");
    // The same request re-serialized (other spacing, other key order) is the same request.
    let mut again = req(&body);
    *again.body_mut() = Body::from("{ \"every\" : \"1h\",\n  \"queue\": \"q\" }");
    let (s3, v3, _) = app.raw(again).await;
    assert_eq!(s3, StatusCode::CREATED, "{v3}");
    assert_eq!(
        v1["id"], v3["id"],
        "a re-serialized retry returns the first schedule"
    );
    let (_, list) = app.call("GET", "/v1/schedules", Some(&app.a), None).await;
    assert_eq!(list["schedules"].as_array().unwrap().len(), 1);
    let (s, v, _) = app
        .raw(req(&json!({"queue": "other", "every": "1h"})))
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused")
    );
}

/// Only a `RUNNING` occurrence shows an owner and a lease. A redriven dead letter shows
/// neither (its dead attempt stays in `attempts`), and a report or renewal at the dead
/// attempt's epoch is a 409 whose check is `not_claimed`, not another worker's lease.
#[tokio::test]
async fn an_occurrence_no_worker_holds_shows_no_owner_and_refuses_reports_as_not_claimed() {
    let app = app().await;
    let k = Some(app.a.as_str());
    for _ in 0..2 {
        let (s, v) = app
            .call("POST", "/v1/schedules", k, Some(due_now("held")))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    app.plan().await;
    let (s, c) = app
        .call(
            "POST",
            "/v1/queues/held/claim",
            k,
            Some(json!({"worker_id": "w-old", "max": 2, "lease_seconds": 600})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{c}");
    let claimed = c["occurrences"].as_array().unwrap().clone();
    assert_eq!(claimed.len(), 2);
    let (dead, done) = (
        claimed[0]["id"].as_str().unwrap().to_string(),
        claimed[1]["id"].as_str().unwrap().to_string(),
    );
    let epoch = claimed[0]["epoch"].as_i64().unwrap();
    let view = |id: &str| {
        let path = format!("/v1/occurrences/{id}");
        let app = &app;
        async move {
            let (s, v) = app.call("GET", &path, k, None).await;
            assert_eq!(s, StatusCode::OK, "{v}");
            v
        }
    };
    let held = |v: &Value| {
        (
            v["state"].as_str().map(str::to_string),
            v["owner"].clone(),
            v["lease_until"].is_string(),
        )
    };

    // While it runs, the view names its worker and lease.
    assert_eq!(
        held(&view(&dead).await),
        (Some("RUNNING".into()), json!("w-old"), true)
    );
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/occurrences/{dead}/fail"),
            k,
            Some(json!({"worker_id": "w-old", "epoch": epoch, "class": "permanent", "message": "bad"})),
        )
        .await;
    assert_eq!((s, v["state"].as_str()), (StatusCode::OK, Some("DEAD")));
    assert_eq!(
        held(&view(&dead).await),
        (Some("DEAD".into()), Value::Null, false)
    );
    let (s, v) = app
        .call("POST", &format!("/v1/occurrences/{dead}/redrive"), k, None)
        .await;
    assert_eq!((s, v["state"].as_str()), (StatusCode::OK, Some("READY")));

    // Redriven: READY, no owner, no lease; the dead attempt is in its history.
    let v = view(&dead).await;
    assert_eq!(held(&v), (Some("READY".into()), Value::Null, false), "{v}");
    assert_eq!(
        (v["epoch"].as_i64(), v["attempt_count"].as_u64()),
        (Some(epoch), Some(0))
    );
    assert_eq!(
        (
            v["attempts"][0]["worker_id"].as_str(),
            v["attempts"][0]["outcome"].as_str()
        ),
        (Some("w-old"), Some("failed")),
        "{v}"
    );
    let (_, list) = app
        .call("GET", "/v1/occurrences?state=READY", k, None)
        .await;
    let listed = list["occurrences"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{list}");
    assert_eq!(
        (&listed[0]["owner"], &listed[0]["lease_until"]),
        (&Value::Null, &Value::Null)
    );

    // Reports at the dead attempt's epoch, from its worker or any other: nobody holds it.
    for (worker, route, body) in [
        ("w-old", "complete", json!({"result": {"late": true}})),
        ("w-new", "complete", json!({})),
        ("w-old", "fail", json!({"class": "transient"})),
    ] {
        let mut body = body;
        body["worker_id"] = json!(worker);
        body["epoch"] = json!(epoch);
        let (s, v) = app
            .call(
                "POST",
                &format!("/v1/occurrences/{dead}/{route}"),
                k,
                Some(body),
            )
            .await;
        assert_eq!(
            (
                s,
                code(&v),
                v["details"]["check"].as_str(),
                v["details"]["state"].as_str()
            ),
            (
                StatusCode::CONFLICT,
                "lease_conflict",
                Some("not_claimed"),
                Some("READY")
            ),
            "{worker} {route}: {v}"
        );
        let said = v["message"].as_str().unwrap();
        assert!(!said.contains("held by"), "{said}");
    }
    let (s, v) = app
        .call(
            "POST",
            "/v1/completions",
            k,
            Some(json!({"worker_id": "w-old", "items": [{"occurrence_id": dead, "epoch": epoch, "result": {}}]})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (
            v["results"][0]["check"].as_str(),
            v["results"][0]["state"].as_str()
        ),
        (Some("not_claimed"), Some("READY")),
        "{v}"
    );
    let (s, r) = app
        .call(
            "POST",
            "/v1/leases/renew",
            k,
            Some(
                json!({"worker_id": "w-old", "leases": [{"occurrence_id": dead, "epoch": epoch}]}),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(
        (
            r["leases"][0]["renewed"].as_bool(),
            r["leases"][0]["check"].as_str()
        ),
        (Some(false), Some("not_claimed"))
    );
    assert_eq!(held(&view(&dead).await).0.as_deref(), Some("READY"));

    // A finished run shows no owner or lease either; its attempt names the worker.
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/occurrences/{done}/complete"),
            k,
            Some(json!({"worker_id": "w-old", "epoch": claimed[1]["epoch"]})),
        )
        .await;
    assert_eq!(
        (s, v["state"].as_str()),
        (StatusCode::OK, Some("SUCCEEDED"))
    );
    let v = view(&done).await;
    assert_eq!(
        held(&v),
        (Some("SUCCEEDED".into()), Value::Null, false),
        "{v}"
    );
    assert_eq!(v["attempts"][0]["worker_id"], "w-old");
}

#[tokio::test]
async fn the_worker_protocol_over_http() {
    let app = app().await;
    let k = Some(app.a.as_str());
    let mut ids = Vec::new();
    for _ in 0..4 {
        let (s, v) = app
            .call("POST", "/v1/schedules", k, Some(due_now("work")))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    app.plan().await;
    let (s, c) = app
        .call(
            "POST",
            "/v1/queues/work/claim",
            k,
            Some(json!({"worker_id": "w1", "max": 4, "lease_seconds": 60})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{c}");
    let claimed = c["occurrences"].as_array().unwrap().clone();
    assert_eq!(claimed.len(), 4);
    assert_eq!(claimed[0]["payload"], json!({"n": 1}));
    let occ = |i: usize| claimed[i]["id"].as_str().unwrap().to_string();
    let epoch = |i: usize| claimed[i]["epoch"].as_i64().unwrap();

    // Renew: ours renewed, a made-up epoch is not.
    let (s, r) = app
        .call("POST", "/v1/leases/renew", k, Some(json!({"worker_id": "w1", "leases": [{"occurrence_id": occ(0), "epoch": epoch(0)}, {"occurrence_id": occ(1), "epoch": 99}]})))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(r["leases"][0]["renewed"], true);
    assert_eq!(r["leases"][1]["renewed"], false);

    // Complete; a second completion and a stale epoch are 409s naming the check.
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/occurrences/{}/complete", occ(0)),
            k,
            Some(json!({"worker_id": "w1", "epoch": epoch(0), "result": {"sent": 3}})),
        )
        .await;
    assert_eq!(
        (s, v["outcome"].as_str(), v["state"].as_str()),
        (StatusCode::OK, Some("accepted"), Some("SUCCEEDED"))
    );
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/occurrences/{}/complete", occ(0)),
            k,
            Some(json!({"worker_id": "w1", "epoch": epoch(0)})),
        )
        .await;
    assert_eq!(
        (s, code(&v), v["details"]["check"].as_str()),
        (StatusCode::CONFLICT, "lease_conflict", Some("wrong_state"))
    );
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/occurrences/{}/complete", occ(1)),
            k,
            Some(json!({"worker_id": "w1", "epoch": 0})),
        )
        .await;
    assert_eq!(
        (s, v["details"]["check"].as_str()),
        (StatusCode::CONFLICT, Some("stale_epoch"))
    );
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/occurrences/{}/complete", occ(1)),
            k,
            Some(json!({"worker_id": "intruder", "epoch": epoch(1)})),
        )
        .await;
    assert_eq!(
        (s, v["details"]["check"].as_str()),
        (StatusCode::CONFLICT, Some("not_owner"))
    );

    // Fail: transient retries later; permanent is a dead letter that can be redriven.
    let (s, v) = app.call("POST", &format!("/v1/occurrences/{}/fail", occ(1)), k, Some(json!({"worker_id": "w1", "epoch": epoch(1), "class": "transient", "message": "503"}))).await;
    assert_eq!(
        (s, v["state"].as_str()),
        (StatusCode::OK, Some("RETRY_WAIT"))
    );
    assert!(v["retry_at"].is_string());
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/occurrences/{}/fail", occ(2)),
            k,
            Some(json!({"worker_id": "w1", "epoch": epoch(2), "class": "fatal"})),
        )
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed")
    );
    let (s, v) = app.call("POST", &format!("/v1/occurrences/{}/fail", occ(2)), k, Some(json!({"worker_id": "w1", "epoch": epoch(2), "class": "permanent", "message": "no such customer"}))).await;
    assert_eq!((s, v["state"].as_str()), (StatusCode::OK, Some("DEAD")));
    let (_, dead) = app.call("GET", "/v1/occurrences?state=DEAD", k, None).await;
    assert_eq!(dead["occurrences"].as_array().unwrap().len(), 1);
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/occurrences/{}/redrive", occ(2)),
            k,
            None,
        )
        .await;
    assert_eq!((s, v["state"].as_str()), (StatusCode::OK, Some("READY")));
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/occurrences/{}/redrive", occ(2)),
            k,
            None,
        )
        .await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, "wrong_state"));

    // An item is a success or a failure, never both (the result would be dropped).
    let (s, v) = app
        .call(
            "POST",
            "/v1/completions",
            k,
            Some(json!({"worker_id": "w1", "items": [
                {"occurrence_id": occ(3), "epoch": epoch(3), "result": {"a": 1}, "failure": {"class": "transient"}}
            ]})),
        )
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
        "{v}"
    );
    assert!(v["message"].as_str().unwrap().contains("items[0]"), "{v}");

    // Batch: each item fenced on its own.
    let (s, v) = app
        .call(
            "POST",
            "/v1/completions",
            k,
            Some(json!({"worker_id": "w1", "items": [
                {"occurrence_id": occ(3), "epoch": epoch(3), "result": {"ok": true}},
                {"occurrence_id": occ(0), "epoch": epoch(0), "result": {}},
                {"occurrence_id": occ(3), "epoch": epoch(3), "failure": {"class": "transient", "message": "again?"}}
            ]})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let outcomes: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["accepted", "conflict", "conflict"]);
    // A `wrong_state` refusal names the state the occurrence is in (a report sent again
    // after its answer was lost learns that it was written).
    assert_eq!(
        (
            v["results"][1]["check"].as_str(),
            v["results"][1]["state"].as_str()
        ),
        (Some("wrong_state"), Some("SUCCEEDED")),
        "{v}"
    );

    // Reads: by id with attempts, by (schedule, instant), and the stored result.
    let (s, d) = app
        .call("GET", &format!("/v1/occurrences/{}", occ(0)), k, None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (
            d["state"].as_str(),
            d["result"].clone(),
            d["version"].as_u64()
        ),
        (Some("SUCCEEDED"), json!({"sent": 3}), Some(1))
    );
    assert_eq!(d["attempts"][0]["outcome"], "succeeded");
    let sid = d["schedule_id"].as_str().unwrap();
    let at = d["scheduled_for"].as_str().unwrap();
    let (s, d2) = app
        .call(
            "GET",
            &format!("/v1/schedules/{sid}/occurrences/{at}"),
            k,
            None,
        )
        .await;
    assert_eq!((s, d2["id"].clone()), (StatusCode::OK, d["id"].clone()));
    let (_, by_schedule) = app
        .call(
            "GET",
            &format!("/v1/occurrences?schedule_id={sid}"),
            k,
            None,
        )
        .await;
    assert_eq!(by_schedule["occurrences"].as_array().unwrap().len(), 1);

    // Bad worker input.
    let (s, v) = app
        .call(
            "POST",
            "/v1/queues/work/claim",
            k,
            Some(json!({"worker_id": "", "max": 1})),
        )
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed")
    );
    let (s, v) = app
        .call(
            "POST",
            "/v1/queues/work/claim",
            k,
            Some(json!({"worker_id": "w", "max": 5000})),
        )
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed")
    );
}

#[tokio::test]
async fn tenants_never_see_each_other() {
    let app = app().await;
    let (a, b) = (Some(app.a.as_str()), Some(app.b.as_str()));
    let (_, v) = app
        .call("POST", "/v1/schedules", a, Some(due_now("shared")))
        .await;
    let sid = v["id"].as_str().unwrap().to_string();
    app.plan().await;
    // B's queue of the same name is another queue.
    let (_, c) = app
        .call(
            "POST",
            "/v1/queues/shared/claim",
            b,
            Some(json!({"worker_id": "wb", "max": 10})),
        )
        .await;
    assert!(c["occurrences"].as_array().unwrap().is_empty());
    let (_, c) = app
        .call(
            "POST",
            "/v1/queues/shared/claim",
            a,
            Some(json!({"worker_id": "wa", "max": 10})),
        )
        .await;
    let oid = c["occurrences"][0]["id"].as_str().unwrap().to_string();
    let epoch = c["occurrences"][0]["epoch"].as_i64().unwrap();
    let at = c["occurrences"][0]["scheduled_for"]
        .as_str()
        .unwrap()
        .to_string();
    let attempts: Vec<(&str, String, Option<Value>)> = vec![
        ("GET", format!("/v1/schedules/{sid}"), None),
        (
            "PATCH",
            format!("/v1/schedules/{sid}"),
            Some(json!({"version": 1, "queue": "x", "every": "1h"})),
        ),
        ("POST", format!("/v1/schedules/{sid}/pause"), None),
        ("POST", format!("/v1/schedules/{sid}/resume"), None),
        ("POST", format!("/v1/schedules/{sid}/cancel"), None),
        ("GET", format!("/v1/schedules/{sid}/occurrences/{at}"), None),
        ("GET", format!("/v1/occurrences/{oid}"), None),
        (
            "POST",
            format!("/v1/occurrences/{oid}/complete"),
            Some(json!({"worker_id": "wa", "epoch": epoch})),
        ),
        (
            "POST",
            format!("/v1/occurrences/{oid}/fail"),
            Some(json!({"worker_id": "wa", "epoch": epoch, "class": "permanent"})),
        ),
        ("POST", format!("/v1/occurrences/{oid}/redrive"), None),
        ("POST", format!("/v1/occurrences/{oid}/cancel"), None),
    ];
    for (m, p, body) in attempts {
        let (s, v) = app.call(m, &p, b, body).await;
        assert_eq!(
            (s, code(&v)),
            (StatusCode::NOT_FOUND, "not_found"),
            "B: {m} {p}: {v}"
        );
    }
    let (_, r) = app
        .call(
            "POST",
            "/v1/leases/renew",
            b,
            Some(json!({"worker_id": "wa", "leases": [{"occurrence_id": oid, "epoch": epoch}]})),
        )
        .await;
    assert_eq!(r["leases"][0]["renewed"], false);
    let (_, r) = app
        .call(
            "POST",
            "/v1/completions",
            b,
            Some(json!({"worker_id": "wa", "items": [{"occurrence_id": oid, "epoch": epoch}]})),
        )
        .await;
    assert_eq!(r["results"][0]["check"], "not_found");
    for p in [
        "/v1/schedules",
        "/v1/occurrences",
        "/v1/occurrences?state=RUNNING",
    ] {
        let (_, l) = app.call("GET", p, b, None).await;
        let items = l
            .as_object()
            .unwrap()
            .values()
            .find_map(|v| v.as_array())
            .unwrap();
        assert!(items.is_empty(), "B lists nothing of A's: {p}");
    }
    // And A's work was untouched by all of that.
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/occurrences/{oid}/complete"),
            a,
            Some(json!({"worker_id": "wa", "epoch": epoch})),
        )
        .await;
    assert_eq!(
        (s, v["state"].as_str()),
        (StatusCode::OK, Some("SUCCEEDED"))
    );
    let (_, s2) = app
        .call("GET", &format!("/v1/schedules/{sid}"), a, None)
        .await;
    assert_eq!(s2["version"], 1);
}

#[tokio::test]
async fn health_readiness_metrics_and_openapi() {
    let app = app().await;
    let (s, _) = app.call("GET", "/healthz", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = app.call("GET", "/readyz", None, None).await;
    assert_eq!(s, StatusCode::OK);
    app.call("POST", "/v1/schedules", Some(&app.a), Some(due_now("q")))
        .await;
    app.plan().await;
    let (_, c) = app
        .call(
            "POST",
            "/v1/queues/q/claim",
            Some(&app.a),
            Some(json!({"worker_id": "w"})),
        )
        .await;
    assert_eq!(c["occurrences"].as_array().unwrap().len(), 1);
    let (s, m) = app.call("GET", "/metrics", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let text = m.as_str().unwrap();
    // Every metric in the catalogue is on /metrics from the start (histograms once observed).
    for (name, _) in campanile_server::METRICS {
        if !name.ends_with("_lag_seconds") {
            assert!(text.contains(name), "{name} missing from /metrics");
        }
    }
    assert!(
        text.contains("campanile_claim_lag_seconds_bucket{tenant_class=\"default\""),
        "claim lag is a histogram with buckets, by tenant class: {text}"
    );
    // Refusals by quota, each series from zero.
    for quota in ["max_active_schedules", "max_triggers_per_sec"] {
        let series = format!("campanile_throttled_requests_total{{quota=\"{quota}\"}}");
        assert!(text.contains(&series), "{series} missing: {text}");
    }
    let (s, doc) = app.call("GET", "/openapi.json", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    // Every route is documented: the list of (method, path) is a reviewed snapshot.
    let mut routes: Vec<String> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(p, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(move |m| format!("{} {p}", m.to_uppercase()))
        })
        .collect();
    routes.sort();
    insta::assert_json_snapshot!("openapi_routes", routes);
    assert!(doc["components"]["schemas"]["ErrorBody"].is_object());
    // A payload and a result are any JSON value (the API takes arrays, strings, numbers): the
    // document must not type them as objects, or generated clients refuse what the API sends.
    for (schema, field) in [
        ("ScheduleCreate", "payload"),
        ("ScheduleUpdate", "payload"),
        ("OccurrenceOut", "result"),
    ] {
        let prop = &doc["components"]["schemas"][schema]["properties"][field];
        assert!(prop.is_object(), "{schema}.{field}: {prop}");
        assert!(
            !prop.to_string().contains("\"object\""),
            "{schema}.{field} typed as an object: {prop}"
        );
    }
    // The document parses as OpenAPI 3.1, and every operation documents its responses.
    let typed: oas3::OpenApiV3Spec =
        serde_json::from_value(doc.clone()).expect("a valid OpenAPI document");
    assert!(typed.paths.as_ref().is_some_and(|p| p.len() >= 18));
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            assert!(
                op["responses"].as_object().is_some_and(|r| !r.is_empty()),
                "{method} {path} documents no responses"
            );
            // Every status the API can send is listed (a schemathesis probe found most of the
            // common ones missing): authentication on the API's routes, media type and size
            // on those with a body, bad input on those with parameters.
            let listed = |status: &str| op["responses"].get(status).is_some();
            let mut expected = Vec::new();
            if path.starts_with("/v1/") {
                expected.extend(["401", "403", "503"]);
            } else {
                assert!(!listed("401"), "{method} {path} is public");
            }
            if op.get("requestBody").is_some() {
                expected.extend(["400", "413", "415", "422"]);
            }
            if op["parameters"].as_array().is_some_and(|p| !p.is_empty()) {
                expected.extend(["400", "422"]);
            }
            for status in expected {
                assert!(listed(status), "{method} {path} does not list {status}");
            }
        }
    }
    let create = &doc["paths"]["/v1/schedules"]["post"]["responses"];
    assert!(
        create.get("409").is_some() && create.get("429").is_some(),
        "{create}"
    );
    // Bounds the server enforces are the document's too.
    let claim = &doc["components"]["schemas"]["ClaimInput"]["properties"];
    assert_eq!(
        (
            claim["max"]["minimum"].as_i64(),
            claim["max"]["maximum"].as_i64()
        ),
        (Some(1), Some(1000)),
        "{claim}"
    );
    // What validators check beyond parsing: operation ids are unique, and a parameter "in
    // path" is one of the path's own `{…}` (list filters were once documented as required
    // path parameters).
    let mut ids = std::collections::HashSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap_or_default();
            assert!(
                ids.insert(id.to_string()),
                "operationId '{id}' repeats ({method} {path})"
            );
            for p in op["parameters"].as_array().into_iter().flatten() {
                let name = p["name"].as_str().unwrap();
                let in_path = path.contains(&format!("{{{name}}}"));
                assert_eq!(
                    p["in"] == "path",
                    in_path,
                    "{method} {path}: parameter '{name}' is declared in {}",
                    p["in"]
                );
            }
        }
    }
}

#[tokio::test]
async fn a_busy_tenant_does_not_starve_a_small_one_and_quotas_answer_429() {
    use campanile_core::{OccurrenceState, Overlap, ScheduleId};
    use campanile_store::{NewOccurrence, OccurrenceInsertMany};
    let app = app().await;
    let tenants = app.store.tenant_list().await.unwrap();
    let (ta, tb) = (tenants[0].id, tenants[1].id);
    let now = jiff::Timestamp::now();
    let item = |sid: ScheduleId, i: i64| NewOccurrence {
        schedule_id: sid,
        version: 1,
        scheduled_for: now
            .checked_sub(jiff::SignedDuration::from_millis(i + 1))
            .unwrap(),
        available_at: now
            .checked_sub(jiff::SignedDuration::from_millis(i + 1))
            .unwrap(),
        queue: "hourly".into(),
        priority: 0,
        max_attempts: 3,
        backoff_initial: jiff::SignedDuration::from_secs(1),
        backoff_max: jiff::SignedDuration::from_secs(10),
        state: OccurrenceState::Ready,
        overlap: Overlap::Allow,
        lease: jiff::SignedDuration::from_secs(30),
    };
    let (sa, sb) = (
        ScheduleId(uuid::Uuid::now_v7()),
        ScheduleId(uuid::Uuid::now_v7()),
    );
    app.store
        .occurrence_insert_many(OccurrenceInsertMany {
            tenant: ta,
            items: (0..10_000).map(|i| item(sa, i)).collect(),
            now: None,
        })
        .await
        .unwrap();
    app.store
        .occurrence_insert_many(OccurrenceInsertMany {
            tenant: tb,
            items: (0..10).map(|i| item(sb, i)).collect(),
            now: None,
        })
        .await
        .unwrap();
    // Tenant A's top-of-the-hour batch is claimed concurrently with B's first claim of the same
    // queue name: B gets all ten at once.
    let a_claim = app.call(
        "POST",
        "/v1/queues/hourly/claim",
        Some(&app.a),
        Some(json!({"worker_id": "a", "max": 1000})),
    );
    let b_claim = app.call(
        "POST",
        "/v1/queues/hourly/claim",
        Some(&app.b),
        Some(json!({"worker_id": "b", "max": 100})),
    );
    let ((_, a), (_, b)) = tokio::join!(a_claim, b_claim);
    assert_eq!(a["occurrences"].as_array().unwrap().len(), 1000);
    assert_eq!(
        b["occurrences"].as_array().unwrap().len(),
        10,
        "the small tenant is served in its first claim"
    );

    // Over the active-schedules quota: 429 with Retry-After.
    app.store
        .tenant_quota_set(campanile_store::TenantQuota {
            tenant: tb,
            max_active_schedules: Some(1),
            max_running: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let (s, first) = app
        .call(
            "POST",
            "/v1/schedules",
            Some(&app.b),
            Some(json!({"queue": "q", "every": "1h"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let first = first["id"].as_str().unwrap().to_string();
    let req = Request::builder()
        .method("POST")
        .uri("/v1/schedules")
        .header("authorization", format!("Bearer {}", app.b))
        .header("content-type", "application/json")
        .body(Body::from(json!({"queue": "q", "every": "1h"}).to_string()))
        .unwrap();
    let (s, v, headers) = app.raw(req).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded")
    );
    assert_eq!(v["details"]["quota"], "max_active_schedules", "{v}");
    // The limit does not lapse with time: no Retry-After telling a client to loop.
    assert!(headers.get("retry-after").is_none());
    assert!(v["message"].as_str().unwrap().contains("at most 1 active"));
    // Pausing frees the slot; resuming needs it again, like creating.
    let (s, _) = app
        .call(
            "POST",
            &format!("/v1/schedules/{first}/pause"),
            Some(&app.b),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = app
        .call(
            "POST",
            "/v1/schedules",
            Some(&app.b),
            Some(json!({"queue": "q", "every": "1h"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/schedules/{first}/resume"),
            Some(&app.b),
            None,
        )
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"),
        "{v}"
    );
    let (_, got) = app
        .call("GET", &format!("/v1/schedules/{first}"), Some(&app.b), None)
        .await;
    assert_eq!(
        got["state"], "PAUSED",
        "a refused resume leaves it paused: {got}"
    );
}

/// An admin puts a tenant in a class; its schedule-lag and claim-lag observations carry the
/// class as their `tenant_class` label (bounded: classes are validated and few).
#[tokio::test]
async fn tenant_classes_label_the_lag_metrics() {
    let app = app().await;
    let admin = issue_key(app.store.as_ref(), None, true).await.unwrap();
    let put = async |tenant: &str, body: Value, key: &str| {
        app.call(
            "PUT",
            &format!("/v1/admin/tenants/{tenant}/class"),
            Some(key),
            Some(body),
        )
        .await
    };
    let (s, v) = put("a", json!({"class": "gold-tier"}), &admin).await;
    assert_eq!(
        (s, v["class"].as_str()),
        (StatusCode::OK, Some("gold-tier")),
        "{v}"
    );
    let (s, v) = put("a", json!({"class": "Gold Tier"}), &admin).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
        "{v}"
    );
    assert!(v["message"].as_str().unwrap().contains("lower-case"), "{v}");
    let (s, v) = put("ghost", json!({"class": "gold-tier"}), &admin).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    let (s, v) = put("a", json!({"class": "gold-tier"}), &app.a).await;
    assert_eq!((s, code(&v)), (StatusCode::FORBIDDEN, "forbidden"));
    let (_, l) = app
        .call("GET", "/v1/admin/tenants", Some(&admin), None)
        .await;
    let classes: Vec<(&str, &str)> = l["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t["class"].as_str().unwrap()))
        .collect();
    assert_eq!(classes, [("a", "gold-tier"), ("b", "default")]);

    app.call("POST", "/v1/schedules", Some(&app.a), Some(due_now("q")))
        .await;
    app.plan().await;
    let (_, c) = app
        .call(
            "POST",
            "/v1/queues/q/claim",
            Some(&app.a),
            Some(json!({"worker_id": "w"})),
        )
        .await;
    assert_eq!(c["occurrences"].as_array().unwrap().len(), 1);
    let (_, m) = app.call("GET", "/metrics", None, None).await;
    let text = m.as_str().unwrap();
    for name in [
        "campanile_schedule_lag_seconds",
        "campanile_claim_lag_seconds",
    ] {
        let series = format!("{name}_bucket{{tenant_class=\"gold-tier\"");
        assert!(text.contains(&series), "{series} missing: {text}");
    }
}

#[tokio::test]
async fn admin_keys_manage_tenants_and_tenant_keys_cannot() {
    let app = app().await;
    let admin = issue_key(app.store.as_ref(), None, true).await.unwrap();
    let (s, v) = app
        .call(
            "POST",
            "/v1/admin/tenants",
            Some(&admin),
            Some(json!({"name": "newco"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let key = v["api_key"].as_str().unwrap().to_string();
    // The new tenant's key works and sees nothing of the others.
    let (s, l) = app.call("GET", "/v1/schedules", Some(&key), None).await;
    assert_eq!(
        (s, l["schedules"].as_array().unwrap().len()),
        (StatusCode::OK, 0)
    );
    let (s, v) = app
        .call(
            "POST",
            "/v1/admin/tenants",
            Some(&admin),
            Some(json!({"name": "newco"})),
        )
        .await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, "already_exists"));
    let (s, v) = app
        .call(
            "POST",
            "/v1/admin/tenants",
            Some(&admin),
            Some(json!({"name": "no spaces please"})),
        )
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed")
    );
    let (s, v) = app
        .call("GET", "/v1/admin/tenants", Some(&admin), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["tenants"].as_array().unwrap().len(), 3);
    let (s, v) = app
        .call("POST", "/v1/admin/tenants/newco/keys", Some(&admin), None)
        .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_ne!(v["api_key"].as_str().unwrap(), key);
    let (s, _) = app
        .call("POST", "/v1/admin/tenants/ghost/keys", Some(&admin), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // Tenant keys may not manage tenants; admin keys may not use the tenant API.
    let (s, v) = app
        .call("GET", "/v1/admin/tenants", Some(&app.a), None)
        .await;
    assert_eq!((s, code(&v)), (StatusCode::FORBIDDEN, "forbidden"));
    let (s, v) = app.call("GET", "/v1/schedules", Some(&admin), None).await;
    assert_eq!((s, code(&v)), (StatusCode::FORBIDDEN, "forbidden"));
    let (s, _) = app.call("GET", "/v1/admin/tenants", None, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_requests_with_one_idempotency_key_create_one_schedule() {
    let app = app().await;
    let mut handles = Vec::new();
    for _ in 0..8 {
        let router = app.router.clone();
        let key = app.a.clone();
        handles.push(tokio::spawn(async move {
            let req = Request::builder()
                .method("POST")
                .uri("/v1/schedules")
                .header("authorization", format!("Bearer {key}"))
                .header("content-type", "application/json")
                .header("idempotency-key", "burst")
                .body(Body::from(
                    json!({"queue": "burst", "every": "1h"}).to_string(),
                ))
                .unwrap();
            let resp = router.oneshot(req).await.unwrap();
            let status = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice::<Value>(&bytes).unwrap())
        }));
    }
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await.unwrap());
    }
    let ids: std::collections::BTreeSet<String> = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .map(|(_, v)| v["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 1, "one schedule for one key: {results:?}");
    assert!(
        results
            .iter()
            .all(|(s, v)| *s == StatusCode::CREATED || code(v) == "request_in_progress"),
        "{results:?}"
    );
    let (_, list) = app
        .call("GET", "/v1/schedules?queue=burst", Some(&app.a), None)
        .await;
    assert_eq!(list["schedules"].as_array().unwrap().len(), 1);

    // A request that failed releases its key: the same request is judged again.
    let bad = || {
        Request::builder()
            .method("POST")
            .uri("/v1/schedules")
            .header("authorization", format!("Bearer {}", app.a))
            .header("content-type", "application/json")
            .header("idempotency-key", "fix-and-retry")
            .body(Body::from(
                json!({"queue": "late", "at": now_plus(-3600)}).to_string(),
            ))
            .unwrap()
    };
    for _ in 0..2 {
        let (s, v, _) = app.raw(bad()).await;
        assert_eq!(
            (s, code(&v)),
            (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
            "{v}"
        );
    }
}

#[tokio::test]
async fn trigger_rate_quota_answers_429() {
    let app = app().await;
    app.quota_of_a(campanile_store::TenantQuota {
        max_triggers_per_sec: Some(1),
        ..Default::default()
    })
    .await;
    // Every second is 3600 fires an hour: exactly the quota. A second one would double it.
    let (s, v) = app
        .call(
            "POST",
            "/v1/schedules",
            Some(&app.a),
            Some(json!({"queue": "q", "cron": "* * * * * *"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = app
        .call(
            "POST",
            "/v1/schedules",
            Some(&app.a),
            Some(json!({"queue": "q", "cron": "*/30 * * * * *"})),
        )
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"),
        "{v}"
    );
    assert_eq!(v["details"]["quota"], "max_triggers_per_sec", "{v}");
    assert!(v["message"].as_str().unwrap().contains("per second"));
    // Slowing the first one down makes room (an update replaces its own rate).
    let id = {
        let (_, l) = app.call("GET", "/v1/schedules", Some(&app.a), None).await;
        l["schedules"][0]["id"].as_str().unwrap().to_string()
    };
    let (s, v) = app
        .call(
            "PATCH",
            &format!("/v1/schedules/{id}"),
            Some(&app.a),
            Some(json!({"version": 1, "queue": "q", "cron": "*/2 * * * * *"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, _) = app
        .call(
            "POST",
            "/v1/schedules",
            Some(&app.a),
            Some(json!({"queue": "q", "cron": "*/30 * * * * *"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
}

#[tokio::test]
async fn nats_targets_are_validated_routed_and_never_claimable_by_workers() {
    // Without a relaying node, a NATS target would never be delivered: refused.
    let plain = app().await;
    let nats =
        json!({"target": {"type": "nats", "subject": "billing.nightly"}, "cron": "0 9 * * *"});
    let (s, v) = plain
        .call("POST", "/v1/schedules", Some(&plain.a), Some(nats.clone()))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(v["message"].as_str().unwrap().contains("--nats-url"), "{v}");

    let app = app_with(ServerConfig {
        relay: true,
        ..ServerConfig::default()
    })
    .await;
    let (s, v) = app
        .call("POST", "/v1/schedules", Some(&app.a), Some(nats))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(
        v["target"],
        json!({"type": "nats", "subject": "billing.nightly"})
    );
    assert_eq!(v["queue"], "$nats:billing.nightly");
    let id = v["id"].as_str().unwrap().to_string();
    let (s, got) = app
        .call("GET", &format!("/v1/schedules/{id}"), Some(&app.a), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(got["target"]["subject"], "billing.nightly");

    // Each mistake is a 422 that names it.
    for (body, needle) in [
        (
            json!({"queue": "q", "target": {"type": "nats", "subject": "a"}, "cron": "* * * * *"}),
            "either queue or target",
        ),
        (json!({"queue": "$nats:a", "cron": "* * * * *"}), "reserved"),
        (
            json!({"target": {"type": "kafka", "subject": "a"}, "cron": "* * * * *"}),
            "kafka",
        ),
        (
            json!({"target": {"type": "nats", "subject": "a.*"}, "cron": "* * * * *"}),
            "wildcard",
        ),
        (
            json!({"target": {"type": "nats", "subject": "a..b"}, "cron": "* * * * *"}),
            "empty token",
        ),
        (
            json!({"target": {"type": "nats", "subject": "a"}, "cron": "* * * * *", "overlap": "SKIP_IF_RUNNING"}),
            "overlap",
        ),
    ] {
        let (s, v) = app
            .call("POST", "/v1/schedules", Some(&app.a), Some(body.clone()))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
        assert!(
            v["message"].as_str().unwrap().contains(needle),
            "{body}: {v}"
        );
    }
    let (s, v) = app
        .call(
            "POST",
            "/v1/schedules",
            Some(&app.a),
            Some(json!({"target": {"type": "nats"}, "cron": "* * * * *"})),
        )
        .await;
    assert!(s.is_client_error(), "{v}");

    // A due one-off with a NATS target is planned into the relay's route; workers cannot
    // claim that route, and claiming their own queues never hands it out.
    let due = json!({"target": {"type": "nats", "subject": "orders.due"}, "at": now_plus(-1),
                     "misfire": {"policy": "fire_once", "max_lateness_seconds": 600}});
    let (s, v) = app
        .call("POST", "/v1/schedules", Some(&app.a), Some(due))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    app.plan().await;
    let (s, v) = app
        .call(
            "POST",
            "/v1/queues/$nats:orders.due/claim",
            Some(&app.a),
            Some(json!({"worker_id": "w", "max": 10})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(v["message"].as_str().unwrap().contains("reserved"), "{v}");
    // A name no schedule can target (creation refuses it) is a worker's mistake, said so.
    let long = "q".repeat(201);
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/queues/{long}/claim"),
            Some(&app.a),
            Some(json!({"worker_id": "w"})),
        )
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
        "{v}"
    );
    let (s, v) = app
        .call("GET", "/v1/occurrences?state=READY", Some(&app.a), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let items = v["occurrences"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{v}");
    assert_eq!(items[0]["state"], "READY");
    assert_eq!(
        app.store
            .backlog(BacklogGet { now: None })
            .await
            .unwrap()
            .outbox_pending,
        1
    );
}

/// A node hands out work only while its liveness mark is valid (its planner renewed it less
/// than a lease ago): before its first pass, and once the mark lapsed (the database was
/// unreachable, the planner stalled), claims and readiness answer 503 with `Retry-After`; the
/// next pass (which checks for an outage first) makes it live again.
#[tokio::test]
async fn a_node_whose_liveness_mark_lapsed_hands_out_no_work() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("live.db")).unwrap());
    let t = store
        .tenant_create(TenantCreate {
            name: "a".into(),
            now: None,
        })
        .await
        .unwrap();
    let key = issue_key(store.as_ref(), Some(t.id), false).await.unwrap();
    let mut pcfg = PlannerConfig::new("live-test");
    pcfg.shards = ServerConfig::default().shards;
    pcfg.shard_lease = jiff::SignedDuration::from_millis(400);
    let planner = Arc::new(Planner::new(store.clone(), pcfg));
    let cfg = ServerConfig::default();
    let app = App {
        router: router(
            AppState::new(store.clone(), &cfg, Some(planner.clone())),
            &cfg,
        ),
        store,
        a: key.clone(),
        b: key.clone(),
        _dir: dir,
    };
    let claim = || async {
        let req = Request::builder()
            .method("POST")
            .uri("/v1/queues/q/claim")
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(Body::from(json!({"worker_id": "w", "max": 1}).to_string()))
            .unwrap();
        app.raw(req).await
    };
    let ready = || async {
        let req = Request::builder()
            .uri("/readyz")
            .body(Body::empty())
            .unwrap();
        app.raw(req).await.0
    };
    let (s, v, h) = claim().await;
    assert_eq!(
        s,
        StatusCode::SERVICE_UNAVAILABLE,
        "before the first pass: {v}"
    );
    assert_eq!(code(&v), "unavailable");
    assert_eq!(h.get("retry-after").unwrap(), "1");
    assert_eq!(ready().await, StatusCode::SERVICE_UNAVAILABLE);
    planner.tick(None).await.unwrap();
    assert_eq!(claim().await.0, StatusCode::OK);
    assert_eq!(ready().await, StatusCode::OK);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (s, v, _) = claim().await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "the mark lapsed: {v}");
    assert_eq!(ready().await, StatusCode::SERVICE_UNAVAILABLE);
    planner.tick(None).await.unwrap();
    assert_eq!(claim().await.0, StatusCode::OK);

    // A claim riding on outcomes is held back the same way, while the outcomes are written.
    let k = Some(key.as_str());
    let (s, v) = app
        .call("POST", "/v1/schedules", k, Some(due_now("q")))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = app
        .call("POST", "/v1/schedules", k, Some(due_now("q")))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    planner.tick(None).await.unwrap();
    let (s, v, _) = claim().await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let held = v["occurrences"][0].clone();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let report = json!({"worker_id": "w",
        "items": [{"occurrence_id": held["id"], "epoch": held["epoch"], "result": true}],
        "claim": {"queue": "q"}});
    let (s, v) = app.call("POST", "/v1/completions", k, Some(report)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["results"][0]["outcome"], "accepted", "{v}");
    assert_eq!(v["claimed"], json!([]), "the mark lapsed: {v}");
    planner.tick(None).await.unwrap();
    let (s, v, _) = claim().await;
    assert_eq!(
        (s, v["occurrences"].as_array().map(Vec::len)),
        (StatusCode::OK, Some(1)),
        "the other one was there to claim: {v}"
    );
}

/// A one-off whose instant is planned reads `FINISHED`, is listed under `state=finished`, and
/// takes no slot of the active-schedules quota (it does not stay `ACTIVE` for good).
#[tokio::test]
async fn a_planned_one_off_is_finished_and_frees_its_quota_slot() {
    let app = app().await;
    app.quota_of_a(campanile_store::TenantQuota {
        max_active_schedules: Some(1),
        ..Default::default()
    })
    .await;
    let k = Some(app.a.as_str());
    let (s, v) = app
        .call("POST", "/v1/schedules", k, Some(due_now("q")))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let (s, v) = app
        .call("POST", "/v1/schedules", k, Some(due_now("q")))
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded")
    );

    app.plan().await;
    let (s, v) = app
        .call("GET", &format!("/v1/schedules/{id}"), k, None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["state"], "FINISHED", "{v}");
    let (_, finished) = app
        .call("GET", "/v1/schedules?state=finished", k, None)
        .await;
    let listed: Vec<&str> = finished["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, vec![id.as_str()]);
    let (_, active) = app.call("GET", "/v1/schedules?state=active", k, None).await;
    assert!(
        active["schedules"].as_array().unwrap().is_empty(),
        "{active}"
    );
    // Its occurrence is there to claim, and the freed slot takes a new schedule.
    let (s, claimed) = app
        .call(
            "POST",
            "/v1/queues/q/claim",
            k,
            Some(json!({"worker_id": "w"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{claimed}");
    assert_eq!(
        claimed["occurrences"].as_array().unwrap().len(),
        1,
        "{claimed}"
    );
    let (s, v) = app
        .call("POST", "/v1/schedules", k, Some(due_now("q")))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

/// Strings no record can hold are refused with a 422 that says why, not passed to the
/// database (PostgreSQL cannot store NUL in text and would answer 500); a failure message
/// with NUL is still recorded, the NUL replaced.
#[tokio::test]
async fn nul_characters_are_refused_or_replaced_never_a_500() {
    let app = app().await;
    let k = Some(app.a.as_str());
    let (s, v) = app
        .call("POST", "/v1/schedules", k, Some(due_now("q")))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    app.plan().await;
    for (path, body) in [
        ("/v1/queues/q/claim", json!({"worker_id": "a\u{0}b"})),
        ("/v1/queues/q%00x/claim", json!({"worker_id": "w"})),
        (
            "/v1/leases/renew",
            json!({"worker_id": "w\u{0}", "leases": []}),
        ),
    ] {
        let (s, v) = app.call("POST", path, k, Some(body)).await;
        assert_eq!(
            (s, code(&v)),
            (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
            "{path}: {v}"
        );
        assert!(v["message"].as_str().unwrap().contains("NUL"), "{v}");
    }
    let (s, v) = app.call("GET", "/v1/schedules?queue=q%00", k, None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    // An empty range is a mistake worth naming, not an empty page.
    let path = "/v1/occurrences?from=2026-06-02T00:00:00Z&to=2026-06-01T00:00:00Z";
    let (s, v) = app.call("GET", path, k, None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(v["message"].as_str().unwrap().contains("after to"), "{v}");
    let (s, claimed) = app
        .call(
            "POST",
            "/v1/queues/q/claim",
            k,
            Some(json!({"worker_id": "w"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{claimed}");
    let o = &claimed["occurrences"][0];
    let id = o["id"].as_str().unwrap();
    // An epoch below 1 was never issued: the refusal says so (not "re-claimed").
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/occurrences/{id}/complete"),
            k,
            Some(json!({"worker_id": "w", "epoch": 0})),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("never issued"),
        "{v}"
    );
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/occurrences/{id}/fail"),
            k,
            Some(json!({"worker_id": "w", "epoch": o["epoch"], "class": "permanent", "message": "bad\u{0}byte"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, d) = app
        .call("GET", &format!("/v1/occurrences/{id}"), k, None)
        .await;
    assert_eq!(d["last_error"], "bad\u{FFFD}byte", "{d}");
}

/// Policy names are accepted in either case (the contract writes `FIRE_ONCE`), and a one-off a
/// few seconds in the past is not an error while it is within its lateness.
#[tokio::test]
async fn policy_names_in_capitals_and_a_slightly_past_one_off_are_accepted() {
    let app = app().await;
    let k = Some(app.a.as_str());
    let body = json!({"queue": "q", "cron": "30 2 * * *", "timezone": "America/New_York",
        "dst": {"gap": "SHIFT", "fold": "TWICE"}, "misfire": {"policy": "FIRE_ONCE"}});
    let (s, v) = app.call("POST", "/v1/schedules", k, Some(body)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let at = |secs| Some(json!({"queue": "q", "at": now_plus(secs)}));
    let (s, v) = app.call("POST", "/v1/schedules", k, at(-5)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = app.call("POST", "/v1/schedules", k, at(-600)).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("max_lateness"),
        "{v}"
    );
}

/// `POST /v1/completions` with `claim` reports and claims the next work in one round trip:
/// the outcomes are written first and answered item by item as without it, the claim then
/// runs whatever they were, and a claim that is not valid refuses the whole request before
/// anything is written.
#[tokio::test]
async fn outcomes_and_the_next_claim_in_one_request() {
    let app = app().await;
    let k = Some(app.a.as_str());
    // A retry an hour off at most (full jitter from the id): not due again within the test
    // but by a one-in-a-million draw.
    let mut body = due_now("work");
    body["retry"] = json!({"backoff_initial_ms": 3_600_000, "backoff_max_ms": 3_600_000});
    for _ in 0..3 {
        let (s, v) = app
            .call("POST", "/v1/schedules", k, Some(body.clone()))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    app.plan().await;
    let (s, c) = app
        .call(
            "POST",
            "/v1/queues/work/claim",
            k,
            Some(json!({"worker_id": "w1", "lease_seconds": 60})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{c}");
    let first = c["occurrences"][0].clone();
    let item = |c: &Value, outcome: Value| {
        let mut i = json!({"occurrence_id": c["id"], "epoch": c["epoch"]});
        i.as_object_mut()
            .unwrap()
            .extend(outcome.as_object().unwrap().clone());
        i
    };
    let state_of = |c: &Value| {
        let id = c["id"].as_str().unwrap().to_string();
        let app = &app;
        async move {
            let (_, d) = app
                .call("GET", &format!("/v1/occurrences/{id}"), k, None)
                .await;
            d["state"].as_str().unwrap().to_string()
        }
    };

    // A success, and the next occurrence for the same worker.
    let (s, v) = app
        .call(
            "POST",
            "/v1/completions",
            k,
            Some(json!({"worker_id": "w1",
            "items": [item(&first, json!({"result": {"ok": 1}}))],
            "claim": {"queue": "work", "max": 1, "lease_seconds": 60}})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["results"][0]["state"], "SUCCEEDED", "{v}");
    let second = v["claimed"][0].clone();
    assert_eq!(v["claimed"].as_array().unwrap().len(), 1, "{v}");
    assert_ne!(second["id"], first["id"]);
    assert_eq!(second["payload"], json!({"n": 1}));
    assert_eq!(state_of(&first).await, "SUCCEEDED");
    assert_eq!(state_of(&second).await, "RUNNING");

    // A claim that is not valid refuses the request whole: the failure is not written.
    for (claim, says) in [
        (json!({"queue": "work", "max": 0}), "max"),
        (json!({"queue": "", "max": 1}), "empty queue"),
        (
            json!({"queue": "work", "lease_seconds": 0}),
            "lease_seconds",
        ),
        (json!({"max": 1}), "queue"),
    ] {
        let (s, v) = app
            .call(
                "POST",
                "/v1/completions",
                k,
                Some(json!({"worker_id": "w1",
                "items": [item(&second, json!({"failure": {"class": "transient"}}))],
                "claim": claim})),
            )
            .await;
        assert_eq!(
            (s, code(&v)),
            (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
            "{claim}: {v}"
        );
        assert!(v["message"].as_str().unwrap().contains(says), "{v}");
        assert_eq!(state_of(&second).await, "RUNNING", "{claim}");
    }

    // A failure, with room for five: the last one comes back (the retry is not due yet).
    let (s, v) = app
        .call(
            "POST",
            "/v1/completions",
            k,
            Some(json!({"worker_id": "w1",
            "items": [item(&second, json!({"failure": {"class": "transient", "message": "503"}}))],
            "claim": {"queue": "work", "max": 5}})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["results"][0]["state"], "RETRY_WAIT", "{v}");
    let third = v["claimed"][0].clone();
    assert_eq!(v["claimed"].as_array().unwrap().len(), 1, "{v}");
    assert!(![&first["id"], &second["id"]].contains(&&third["id"]));

    // A refused item does not stop the claim; an empty queue claims nothing.
    let (s, v) = app
        .call(
            "POST",
            "/v1/completions",
            k,
            Some(json!({"worker_id": "w1",
            "items": [item(&first, json!({"result": true})), item(&third, json!({"result": true}))],
            "claim": {"queue": "work"}})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let outcomes: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["conflict", "accepted"]);
    assert_eq!(v["claimed"], json!([]), "{v}");
    // Without `claim` the answer has no `claimed`.
    let (s, v) = app
        .call(
            "POST",
            "/v1/completions",
            k,
            Some(json!({"worker_id": "w1",
            "items": [item(&third, json!({"result": true}))]})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v.get("claimed").is_none(), "{v}");
}

/// A create whose request died after reserving its `Idempotency-Key` — a node killed, the
/// database lost mid-request — does not hold the key for good (every retry would answer 409
/// forever, and one whose schedule had been created could never learn its id): a retry
/// answers from the schedule if it was created, or takes the key over and
/// creates once the reservation is old enough, and the dead request's create would be
/// refused.
#[tokio::test]
async fn a_create_that_died_mid_request_does_not_hold_its_idempotency_key() {
    let app = app().await;
    let tenant = app
        .store
        .tenant_by_name(TenantByName { name: "a".into() })
        .await
        .unwrap()
        .unwrap()
        .id;
    let body = json!({"queue": "q", "every": "1h"});
    let hash = campanile_server::hash_key(&body.to_string());
    let post = |key: &str| {
        Request::builder()
            .method("POST")
            .uri("/v1/schedules")
            .header("authorization", format!("Bearer {}", app.a))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    // What a request leaves when it dies after reserving, `ago` seconds back.
    let reserve = |key: &str, ago: i64| {
        let now = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(ago);
        campanile_store::IdempotencyPut {
            tenant,
            key: key.into(),
            request_hash: hash.clone(),
            status: 0,
            body: String::new(),
            token: format!("dead-{key}"),
            take_over_after: jiff::SignedDuration::from_secs(10),
            now: Some(now),
        }
    };
    let schedules = || async {
        let (_, list) = app.call("GET", "/v1/schedules", Some(&app.a), None).await;
        list["schedules"].as_array().unwrap().len()
    };

    // Died a moment ago: still in progress as far as anyone can tell.
    assert!(
        app.store
            .idempotency_put(reserve("young", 1))
            .await
            .unwrap()
    );
    let (s, v, _) = app.raw(post("young")).await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, "request_in_progress"));
    assert!(v["message"].as_str().unwrap().contains("10 s"), "{v}");

    // Died long enough ago without creating: the retry takes over and creates, once.
    assert!(app.store.idempotency_put(reserve("old", 30)).await.unwrap());
    let (s, first, _) = app.raw(post("old")).await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    let (s, again, _) = app.raw(post("old")).await;
    assert_eq!((s, &again["id"]), (StatusCode::CREATED, &first["id"]));
    assert_eq!(schedules().await, 1);

    // Died after its create committed, before recording the answer: the retry answers with
    // that schedule, at once, and creates nothing.
    assert!(app.store.idempotency_put(reserve("made", 1)).await.unwrap());
    let made = campanile_planner::schedules::Schedules::new(app.store.clone(), 16)
        .create_under_key(
            tenant,
            serde_json::from_value::<campanile_server::dto::ScheduleInput>(body.clone())
                .unwrap()
                .to_spec(jiff::Timestamp::now())
                .unwrap(),
            Some(campanile_store::IdempotencyToken {
                key: "made".into(),
                token: "dead-made".into(),
            }),
            None,
        )
        .await
        .unwrap();
    let (s, v, _) = app.raw(post("made")).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["id"], made.record.id.0.to_string());
    assert_eq!(schedules().await, 2);
    let (s, v2, _) = app.raw(post("made")).await;
    assert_eq!((s, &v2["id"]), (StatusCode::CREATED, &v["id"]));
}

/// A payload and a result come back exactly as sent: numbers beyond 64 bits, `-0`, and ones
/// no float can hold (not rounded through a float).
#[tokio::test]
async fn payloads_and_results_keep_every_digit() {
    let app = app().await;
    // The answers are read as text: a `Value` would round them here too.
    let send = |method: &str, uri: String, body: Option<String>| {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {}", app.a));
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let req = req.body(body.map_or_else(Body::empty, Body::from)).unwrap();
        let router = app.router.clone();
        async move {
            let resp = router.oneshot(req).await.unwrap();
            let status = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8(bytes.to_vec()).unwrap())
        }
    };
    let payload =
        r#"{"order_id":12345678901234567890123,"neg":-9223372036854775809,"z":-0,"huge":1e400}"#;
    let body = format!(
        r#"{{"queue":"exact","at":"{}","misfire":{{"policy":"fire_once","max_lateness_seconds":600}},"payload":{payload}}}"#,
        now_plus(-1)
    );
    let (s, text) = send("POST", "/v1/schedules".into(), Some(body)).await;
    assert_eq!(s, StatusCode::CREATED, "{text}");
    assert!(text.contains(payload), "{text}");
    let sid = text
        .split("\"id\":\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string();
    let (_, text) = send("GET", format!("/v1/schedules/{sid}"), None).await;
    assert!(text.contains(payload), "{text}");
    app.plan().await;
    let (s, text) = send(
        "POST",
        "/v1/queues/exact/claim".into(),
        Some(r#"{"worker_id":"w"}"#.into()),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{text}");
    assert!(text.contains(payload), "the worker gets it as sent: {text}");
    let field = |name: &str| {
        text.split(&format!("\"{name}\":"))
            .nth(1)
            .unwrap()
            .split([',', '}'])
            .next()
            .unwrap()
            .trim_matches('"')
            .to_string()
    };
    let (id, epoch) = (field("id"), field("epoch"));
    let result = r#"{"total":98765432109876543210}"#;
    let (s, text) = send(
        "POST",
        format!("/v1/occurrences/{id}/complete"),
        Some(format!(
            r#"{{"worker_id":"w","epoch":{epoch},"result":{result}}}"#
        )),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{text}");
    let (s, text) = send("GET", format!("/v1/occurrences/{id}"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(text.contains(result), "{text}");
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

/// A claim sent again with its key and `resent` answers what the first sending claimed, the
/// same occurrence at the same epoch, claims nothing more, and is counted as replayed; the
/// claim a report carries does the same. (No other test here replays, so the counter's
/// increase is this test's.)
#[tokio::test]
async fn a_claim_sent_again_gets_what_it_claimed() {
    let app = app().await;
    let k = Some(app.a.as_str());
    for _ in 0..5 {
        app.call("POST", "/v1/schedules", k, Some(due_now("again")))
            .await;
    }
    app.plan().await;
    let before = counter(&app, "campanile_occurrences_replayed_total").await;
    let key = "6f9619ff-8b86-d011-b42d-00c04fc964ff";
    let body = |resent: bool| json!({"worker_id": "w", "claim_key": key, "resent": resent});
    let (s, first) = app
        .call("POST", "/v1/queues/again/claim", k, Some(body(false)))
        .await;
    assert_eq!(s, StatusCode::OK, "{first}");
    let (s, again) = app
        .call("POST", "/v1/queues/again/claim", k, Some(body(true)))
        .await;
    assert_eq!(s, StatusCode::OK, "{again}");
    assert_eq!(again, first, "the same answer, payload and lease included");
    assert_eq!(first["occurrences"].as_array().unwrap().len(), 1);
    let held = &first["occurrences"][0];

    // A report of it that claims the next one, then the same report sent again.
    let report = |resent: bool| {
        json!({"worker_id": "w",
               "items": [{"occurrence_id": held["id"], "epoch": held["epoch"], "result": 1}],
               "claim": {"queue": "again", "claim_key": "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
                         "resent": resent}})
    };
    let (s, r1) = app
        .call("POST", "/v1/completions", k, Some(report(false)))
        .await;
    assert_eq!(s, StatusCode::OK, "{r1}");
    assert_eq!(r1["results"][0]["outcome"], "accepted", "{r1}");
    let (s, r2) = app
        .call("POST", "/v1/completions", k, Some(report(true)))
        .await;
    assert_eq!(s, StatusCode::OK, "{r2}");
    assert_eq!(r2["results"][0]["state"], "SUCCEEDED", "{r2}");
    assert_eq!(r2["claimed"], r1["claimed"], "{r2}");
    assert_eq!(r1["claimed"].as_array().unwrap().len(), 1);
    assert_eq!(
        counter(&app, "campanile_occurrences_replayed_total").await - before,
        2.0
    );
    // Three of five are left to claim: the replays claimed nothing.
    let key = "9a4c5e3e-6f0b-4e5e-9d3a-2f1c7b8d9e01";
    let body =
        |resent: bool| json!({"worker_id": "x", "max": 10, "claim_key": key, "resent": resent});
    let (_, rest) = app
        .call("POST", "/v1/queues/again/claim", k, Some(body(false)))
        .await;
    let rest = rest["occurrences"].as_array().unwrap().clone();
    assert_eq!(rest.len(), 3, "{rest:?}");

    // A node that is not live (its planner has not marked it yet) hands out nothing new, but a
    // claim sent again still gets what its key holds, plain or riding on a report.
    let cfg = ServerConfig::default();
    let planner = Arc::new(Planner::new(app.store.clone(), PlannerConfig::new("down")));
    assert!(!planner.is_live());
    let down = router(AppState::new(app.store.clone(), &cfg, Some(planner)), &cfg);
    let call = async |path: &str, body: Value| {
        let req = Request::builder()
            .method("POST")
            .uri(path)
            .header("authorization", format!("Bearer {}", app.a))
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = down.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice::<Value>(&bytes).unwrap())
    };
    let (s, v) = call("/v1/queues/again/claim", json!({"worker_id": "x"})).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    let (s, v) = call("/v1/queues/again/claim", body(true)).await;
    assert_eq!(
        (s, v["occurrences"].as_array().unwrap()),
        (StatusCode::OK, &rest)
    );
    let other = json!({"worker_id": "x", "claim_key": "0e6f3c52-7c3b-4d7e-8f0a-1b2c3d4e5f60",
                       "resent": true});
    let (s, v) = call("/v1/queues/again/claim", other).await;
    assert_eq!(
        s,
        StatusCode::SERVICE_UNAVAILABLE,
        "a key that holds nothing: {v}"
    );
    let report = json!({"worker_id": "x",
        "items": [{"occurrence_id": rest[0]["id"], "epoch": rest[0]["epoch"], "result": 1}],
        "claim": {"queue": "again", "max": 10, "claim_key": key, "resent": true}});
    let (s, v) = call("/v1/completions", report).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["results"][0]["outcome"], "accepted", "{v}");
    assert_eq!(v["claimed"].as_array().unwrap(), &rest[1..], "{v}");
    assert_eq!(
        counter(&app, "campanile_occurrences_replayed_total").await - before,
        7.0
    );
}

/// A claim of occurrences with large payloads answers at most 8 MiB of them (the first
/// always), says it stopped short, and the next claims take the rest: each occurrence is
/// claimed once. The same bound holds for a report that claims.
#[tokio::test]
async fn claims_of_large_payloads_are_bounded_answers() {
    let app = app().await;
    let k = Some(app.a.as_str());
    let blob = "x".repeat(200_000);
    for i in 0..60 {
        let mut def = due_now("bigclaim");
        def["payload"] = json!({"i": i, "blob": blob});
        let (s, v) = app.call("POST", "/v1/schedules", k, Some(def)).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    app.plan().await;
    let mut claimed = std::collections::BTreeSet::new();
    let (mut answers, mut truncated) = (0, 0);
    let mut held: Option<Value> = None;
    loop {
        let (s, v) = match held.take() {
            // Every other claim is a report that claims (the previous answer's first).
            Some(first) => {
                let (s, v) = app
                    .call(
                        "POST",
                        "/v1/completions",
                        k,
                        Some(
                            json!({"worker_id": "w", "items": [{"occurrence_id": first["id"],
                            "epoch": first["epoch"], "result": 1}],
                            "claim": {"queue": "bigclaim", "max": 1000}}),
                        ),
                    )
                    .await;
                assert_eq!(v["results"][0]["outcome"], "accepted", "{v}");
                (
                    s,
                    json!({"occurrences": v["claimed"], "truncated": v["claimed_truncated"]}),
                )
            }
            None => {
                app.call(
                    "POST",
                    "/v1/queues/bigclaim/claim",
                    k,
                    Some(json!({"worker_id": "w", "max": 1000})),
                )
                .await
            }
        };
        assert_eq!(s, StatusCode::OK, "{v}");
        let got = v["occurrences"].as_array().unwrap();
        if got.is_empty() {
            break;
        }
        answers += 1;
        let size = serde_json::to_vec(got).unwrap().len();
        assert!(
            size <= campanile_server::ANSWER_BYTES,
            "an answer of {size} bytes"
        );
        for o in got {
            assert!(
                claimed.insert(o["id"].as_str().unwrap().to_string()),
                "claimed twice"
            );
        }
        // Stopped at the bound: the next 200 KB payload would not have fit.
        let cut = size + 200_000 > campanile_server::ANSWER_BYTES;
        assert_eq!(
            v["truncated"] == true,
            cut,
            "{} occurrences, {size} bytes",
            got.len()
        );
        truncated += usize::from(cut);
        held = Some(got[0].clone());
    }
    assert_eq!(claimed.len(), 60);
    assert!(
        answers >= 2 && truncated >= 1,
        "{answers} answers, {truncated} cut short"
    );
}

/// A list whose records carry large payloads stops at the answer's size bound, says so, and
/// goes on from its cursor: every schedule is listed once across the pages, and no page
/// passes the bound (8 MiB; before, `limit=500` answered every payload at once).
#[tokio::test]
async fn lists_of_large_payloads_are_bounded_pages() {
    let app = app().await;
    let blob = "x".repeat(200_000);
    let mut created = std::collections::BTreeSet::new();
    for i in 0..60 {
        let (s, v) = app
            .call(
                "POST",
                "/v1/schedules",
                Some(&app.a),
                Some(
                    json!({"queue": "big", "cron": "0 3 * * *", "payload": {"i": i, "blob": blob}}),
                ),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        created.insert(v["id"].as_str().unwrap().to_string());
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            None => "/v1/schedules?limit=500".to_string(),
            Some(c) => format!("/v1/schedules?limit=500&cursor={c}"),
        };
        let (s, v) = app.call("GET", &path, Some(&app.a), None).await;
        assert_eq!(s, StatusCode::OK);
        pages += 1;
        let size = serde_json::to_vec(&v).unwrap().len();
        assert!(
            size <= campanile_server::ANSWER_BYTES,
            "a page of {size} bytes"
        );
        let listed = v["schedules"].as_array().unwrap();
        assert!(!listed.is_empty());
        for s in listed {
            assert!(
                seen.insert(s["id"].as_str().unwrap().to_string()),
                "listed twice"
            );
        }
        match v["next_cursor"].as_str() {
            Some(c) => {
                assert_eq!(v["truncated"], true, "a short page says why");
                cursor = Some(c.to_string());
            }
            None => {
                assert!(v.get("truncated").is_none());
                break;
            }
        }
    }
    assert_eq!(seen, created);
    assert!(pages >= 2, "{pages} pages");
}

#[tokio::test]
async fn zone_names_are_iana_names_and_offsets_stay_within_a_day() {
    let app = app().await;
    let k = Some(app.a.as_str());
    let refused = |v: &Value, needle: &str| {
        assert_eq!(code(v), "validation_failed", "{v}");
        assert!(
            v["message"].as_str().unwrap_or("").contains(needle),
            "{needle}: {v}"
        );
    };
    // The host's own zone, the database's files that are not a place's zone, and file paths:
    // refused on create, update and preview alike.
    for zone in [
        "localtime",
        "Factory",
        "posixrules",
        "/etc/localtime",
        "../../etc/localtime",
        "right/UTC",
        "Etc/Unknown",
    ] {
        let (s, v) = app
            .call(
                "POST",
                "/v1/schedules",
                k,
                Some(json!({"queue": "q", "cron": "0 1 * * *", "timezone": zone})),
            )
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{zone}: {v}");
        refused(&v, zone);
        let (s, v) = app
            .call(
                "POST",
                "/v1/schedules/preview",
                k,
                Some(json!({"cron": "0 1 * * *", "timezone": zone})),
            )
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{zone}: {v}");
        refused(&v, zone);
    }
    let (s, v) = app
        .call(
            "POST",
            "/v1/schedules",
            k,
            Some(json!({"queue": "q", "cron": "0 1 * * *", "timezone": "utc"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["timezone"], "UTC", "stored in the database's spelling");
    let id = v["id"].as_str().unwrap().to_string();
    let (s, v) = app
        .call(
            "PATCH",
            &format!("/v1/schedules/{id}"),
            k,
            Some(json!({"version": 1, "queue": "q", "cron": "0 1 * * *", "timezone": "localtime"})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    refused(&v, "localtime");
    let (s, v) = app
        .call(
            "PATCH",
            &format!("/v1/schedules/{id}"),
            k,
            Some(
                json!({"version": 1, "queue": "q", "cron": "0 1 * * *", "timezone": "us/eastern"}),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["schedule"]["timezone"], "US/Eastern");

    // An offset of 25 hours: jiff reads it, RFC 3339 has none.
    let far = "2030-01-01T00:00:00+25:00";
    for (method, path, body) in [
        (
            "POST",
            "/v1/schedules",
            Some(json!({"queue": "q", "at": far})),
        ),
        (
            "POST",
            "/v1/schedules",
            Some(json!({"queue": "q", "every": "1h", "anchor": far})),
        ),
        (
            "POST",
            "/v1/schedules/preview",
            Some(json!({"cron": "0 1 * * *", "after": far})),
        ),
        (
            "GET",
            "/v1/occurrences?from=2030-01-01T00:00:00%2B25:00",
            None,
        ),
        ("GET", "/v1/occurrences?to=2030-01-01T00:00:00-25:00", None),
        (
            "GET",
            &format!("/v1/schedules/{id}/occurrences/2030-01-01T00:00:00%2B25:00"),
            None,
        ),
    ] {
        let (s, v) = app.call(method, path, k, body.clone()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{path} {body:?}: {v}");
        refused(&v, "25:00");
        refused(&v, "23:59");
    }
    // Within a day, it is read.
    let (s, v) = app
        .call(
            "POST",
            "/v1/schedules",
            k,
            Some(json!({"queue": "q", "at": "2030-01-01T00:00:00+23:59"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["at"], "2029-12-31T00:01:00Z");
}
