//! A claim whose answer was lost, and a node whose liveness mark lapsed.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use campanile_planner::{Planner, PlannerConfig};
use campanile_server::{AppState, ServerConfig, issue_key, router};
use campanile_store::{Store, TenantCreate};
use campanile_store_sqlite::SqliteStore;
use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::*;

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
