//! The service's own routes and limits: health, readiness, metrics and OpenAPI, quotas and
//! fairness, tenant classes, and answers bounded in size.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use campanile_server::issue_key;
use serde_json::{Value, json};

use crate::*;

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
async fn tenant_quotas_and_queue_limits_are_read_and_set_by_admins() {
    let app = app().await;
    let admin = issue_key(app.store.as_ref(), None, true).await.unwrap();
    let (s, v) = app
        .call("GET", "/v1/admin/tenants/a/quotas", Some(&admin), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        json!({"tenant": "a", "max_active_schedules": null, "max_running": null,
               "max_triggers_per_sec": null, "max_catchup_per_sec": null, "queue_limits": []})
    );
    let (s, v) = app
        .call(
            "PUT",
            "/v1/admin/tenants/a/quotas",
            Some(&admin),
            Some(json!({"max_active_schedules": 1, "max_running": 2})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (
            v["max_active_schedules"].as_i64(),
            v["max_running"].as_i64()
        ),
        (Some(1), Some(2))
    );
    assert!(v["max_triggers_per_sec"].is_null(), "{v}");
    // The quota set over HTTP holds: a second active schedule is refused.
    let (s, _) = app
        .call("POST", "/v1/schedules", Some(&app.a), Some(due_now("q")))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, v) = app
        .call("POST", "/v1/schedules", Some(&app.a), Some(due_now("q")))
        .await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
    let (s, v) = app
        .call(
            "PUT",
            "/v1/admin/tenants/a/queues/emails/limit",
            Some(&admin),
            Some(json!({"max_running": 3})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v["queue_limits"],
        json!([{"queue": "emails", "max_running": 3}])
    );
    let (_, v) = app
        .call(
            "PUT",
            "/v1/admin/tenants/a/queues/emails/limit",
            Some(&admin),
            Some(json!({"max_running": null})),
        )
        .await;
    assert_eq!(v["queue_limits"], json!([]), "null removes the limit");
    // Each omitted quota is removed.
    let (_, v) = app
        .call(
            "PUT",
            "/v1/admin/tenants/a/quotas",
            Some(&admin),
            Some(json!({})),
        )
        .await;
    assert!(
        v["max_active_schedules"].is_null() && v["max_running"].is_null(),
        "{v}"
    );
    for (path, body) in [
        ("/v1/admin/tenants/a/quotas", json!({"max_running": -1})),
        ("/v1/admin/tenants/a/quotas", json!({"max_runing": 1})),
        (
            "/v1/admin/tenants/a/queues/$nats:x/limit",
            json!({"max_running": 1}),
        ),
        (
            "/v1/admin/tenants/a/queues/emails/limit",
            json!({"max_running": 1.5}),
        ),
    ] {
        let (s, v) = app
            .call("PUT", path, Some(&admin), Some(body.clone()))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{path} {body}: {v}");
    }
    let (s, v) = app
        .call("GET", "/v1/admin/tenants/ghost/quotas", Some(&admin), None)
        .await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    let (s, v) = app
        .call("GET", "/v1/admin/tenants/a/quotas", Some(&app.a), None)
        .await;
    assert_eq!((s, code(&v)), (StatusCode::FORBIDDEN, "forbidden"));
}

#[tokio::test]
async fn tenant_retention_is_set_and_shown_by_admins() {
    let app = app().await;
    let admin = issue_key(app.store.as_ref(), None, true).await.unwrap();
    let put = async |tenant: &str, body: Value, key: &str| {
        app.call(
            "PUT",
            &format!("/v1/admin/tenants/{tenant}/retention"),
            Some(key),
            Some(body),
        )
        .await
    };
    let shown = async || {
        let (_, l) = app
            .call("GET", "/v1/admin/tenants", Some(&admin), None)
            .await;
        l["tenants"][0]["retention_days"].clone()
    };
    assert_eq!(
        shown().await,
        Value::Null,
        "the operator's default until set"
    );
    let (s, v) = put("a", json!({"retention_days": 30}), &admin).await;
    assert_eq!(
        (s, v["retention_days"].as_u64()),
        (StatusCode::OK, Some(30)),
        "{v}"
    );
    assert_eq!(shown().await, json!(30));
    let (s, v) = put("a", json!({"retention_days": 0}), &admin).await;
    assert_eq!(
        (s, v["retention_days"].as_u64()),
        (StatusCode::OK, Some(0)),
        "{v}"
    );
    assert_eq!(shown().await, json!(0), "0: forever");
    let (s, _) = put("a", json!({"retention_days": null}), &admin).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(shown().await, Value::Null);
    for bad in [
        json!({"retention_days": 36_501}),
        json!({"retention_days": -1}),
        json!({"retention_days": "14"}),
        json!({"days": 14}),
    ] {
        let (s, v) = put("a", bad.clone(), &admin).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {v}");
        assert!(v["message"].is_string(), "{v}");
    }
    let (s, v) = put("ghost", json!({"retention_days": 3}), &admin).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    let (s, v) = put("a", json!({"retention_days": 3}), &app.a).await;
    assert_eq!((s, code(&v)), (StatusCode::FORBIDDEN, "forbidden"));
}

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
