//! Keys and tenants: who may call what, and tenants that never see each other.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use campanile_server::{ServerConfig, issue_key};
use campanile_store::ApiKeyRevoke;
use serde_json::{Value, json};

use crate::*;

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
