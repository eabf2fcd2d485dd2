//! Schedules over HTTP: their lifecycle, idempotent creates, one-offs, policy names, zones and
//! NATS targets.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use campanile_server::ServerConfig;
use campanile_store::{BacklogGet, TenantByName};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::*;

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

#[tokio::test]
async fn a_schedule_runs_now_on_trigger_once_per_key() {
    let app = app().await;
    let (s, v) = app
        .call(
            "POST",
            "/v1/schedules",
            Some(&app.a),
            Some(json!({"queue": "q", "cron": "0 3 * * *", "payload": {"n": 1}})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let trigger = |key: Option<&'static str>| trigger_request(&app.a, &id, key, None);
    let (s1, v1, _) = app.raw(trigger(Some("run-now-1"))).await;
    assert_eq!(s1, StatusCode::CREATED, "{v1}");
    assert_eq!(
        (
            v1["origin"].as_str(),
            v1["state"].as_str(),
            v1["schedule_id"].as_str()
        ),
        (Some("manual"), Some("READY"), Some(id.as_str()))
    );
    let (s2, v2, _) = app.raw(trigger(Some("run-now-1"))).await;
    assert_eq!(s2, StatusCode::OK, "sent again with its key: {v2}");
    assert_eq!(v1["id"], v2["id"]);
    // A worker gets it now, with the schedule's payload; a daily 03:00 cron has nothing else
    // due.
    let (_, c) = app
        .call(
            "POST",
            "/v1/queues/q/claim",
            Some(&app.a),
            Some(json!({"worker_id": "w", "max": 10})),
        )
        .await;
    let claimed = c["occurrences"].as_array().unwrap();
    assert_eq!(claimed.len(), 1, "{c}");
    assert_eq!(claimed[0]["id"], v1["id"]);
    assert_eq!(claimed[0]["payload"], json!({"n": 1}));
    // Listed with its origin.
    let (_, l) = app
        .call(
            "GET",
            &format!("/v1/occurrences?schedule_id={id}"),
            Some(&app.a),
            None,
        )
        .await;
    assert_eq!(l["occurrences"][0]["origin"], "manual", "{l}");
    // Another tenant's key, an unknown schedule, a bad key: refused.
    let mut foreign = trigger(None);
    foreign.headers_mut().insert(
        "authorization",
        format!("Bearer {}", app.b).parse().unwrap(),
    );
    let (s, v, _) = app.raw(foreign).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/schedules/{}/trigger", uuid::Uuid::now_v7()),
            Some(&app.a),
            None,
        )
        .await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    let mut bad = trigger(None);
    bad.headers_mut()
        .insert("idempotency-key", "x".repeat(256).parse().unwrap());
    let (s, _, _) = app.raw(bad).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // Paused, it is not run.
    let (s, _) = app
        .call(
            "POST",
            &format!("/v1/schedules/{id}/pause"),
            Some(&app.a),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, v, _) = app.raw(trigger(None)).await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, "wrong_state"), "{v}");
}

#[tokio::test]
async fn a_triggered_run_carries_the_payload_its_body_gives() {
    let app = app().await;
    let (s, v) = app
        .call(
            "POST",
            "/v1/schedules",
            Some(&app.a),
            Some(json!({"queue": "own", "cron": "0 3 * * *", "payload": {"n": 1}})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let trigger = |key: Option<&'static str>, body: Option<&'static str>| {
        trigger_request(&app.a, &id, key, body)
    };
    // Handed on exactly as sent (numbers keep every digit), as a create's payload is.
    let own = r#"{"payload": {"order": 42, "amount": 12345678901234567890.50}}"#;
    let (s1, v1, _) = app.raw(trigger(Some("own-1"), Some(own))).await;
    assert_eq!(s1, StatusCode::CREATED, "{v1}");
    assert_eq!(
        v1["payload"],
        json!({"order": 42, "amount": 12345678901234567890.50}),
        "the answer shows the run's own payload"
    );
    let (s, v, _) = app.raw(trigger(Some("own-1"), Some(own))).await;
    assert_eq!((s, &v["id"]), (StatusCode::OK, &v1["id"]), "{v}");
    // The same key with another payload, or none, is another request.
    for other in [Some(r#"{"payload": {"order": 43}}"#), None] {
        let (s, v, _) = app.raw(trigger(Some("own-1"), other)).await;
        assert_eq!(
            (s, code(&v)),
            (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
            "{v}"
        );
    }
    // An empty object, or an explicit null, runs with the version's payload. (Two runs of a
    // version cannot share a millisecond: each trigger waits for the next one.)
    let next_ms = || tokio::time::sleep(std::time::Duration::from_millis(3));
    next_ms().await;
    let (s2, v2, _) = app.raw(trigger(None, Some("{}"))).await;
    assert_eq!(s2, StatusCode::CREATED, "{v2}");
    assert!(v2.get("payload").is_none(), "{v2}");
    next_ms().await;
    let (s3, v3, _) = app.raw(trigger(None, Some(r#"{"payload": null}"#))).await;
    assert_eq!(s3, StatusCode::CREATED, "{v3}");
    let claim = Request::builder()
        .method("POST")
        .uri("/v1/queues/own/claim")
        .header("authorization", format!("Bearer {}", app.a))
        .header("content-type", "application/json")
        .body(Body::from(r#"{"worker_id": "w", "max": 10}"#))
        .unwrap();
    let answer = app.router.clone().oneshot(claim).await.unwrap();
    let text = String::from_utf8(
        answer
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert!(
        text.contains(r#""payload":{"order": 42, "amount": 12345678901234567890.50}"#),
        "{text}"
    );
    let c: Value = serde_json::from_str(&text).unwrap();
    let claimed: Vec<(&Value, &Value)> = c["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (&o["id"], &o["payload"]))
        .collect();
    assert_eq!(
        claimed,
        vec![
            (
                &v1["id"],
                &json!({"order": 42, "amount": 12345678901234567890.50})
            ),
            (&v2["id"], &json!({"n": 1})),
            (&v3["id"], &json!({"n": 1})),
        ],
        "{c}"
    );
    // A body that is not the trigger's, or not declared JSON: refused, nothing made.
    let (s, v, _) = app
        .raw(trigger(None, Some(r#"{"payload": 1, "queue": "x"}"#)))
        .await;
    assert!(s.is_client_error(), "{s} {v}");
    let (s, v, _) = app.raw(trigger(None, Some("{\"payload\": "))).await;
    assert!(s.is_client_error(), "{s} {v}");
    let undeclared = Request::builder()
        .method("POST")
        .uri(format!("/v1/schedules/{id}/trigger"))
        .header("authorization", format!("Bearer {}", app.a))
        .body(Body::from(r#"{"payload": 1}"#))
        .unwrap();
    let (s, v, _) = app.raw(undeclared).await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{v}");
    let (_, l) = app
        .call(
            "GET",
            &format!("/v1/occurrences?schedule_id={id}"),
            Some(&app.a),
            None,
        )
        .await;
    assert_eq!(l["occurrences"].as_array().unwrap().len(), 3, "{l}");
}

#[tokio::test]
async fn a_past_range_is_backfilled_once_paced_and_answered_again_by_its_key() {
    let app = app().await;
    // Every minute, anchored two hours ago.
    let anchor =
        jiff::Timestamp::from_millisecond(jiff::Timestamp::now().as_millisecond() - 7_200_000)
            .unwrap();
    let (s, v) = app
        .call(
            "POST",
            "/v1/schedules",
            Some(&app.a),
            Some(json!({"queue": "bf", "every": "1m", "anchor": anchor.to_string(), "payload": {"n": 2}})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    app.quota_of_a(campanile_store::TenantQuota {
        max_catchup_per_sec: Some(20),
        ..Default::default()
    })
    .await;
    let at = |m: i64| {
        jiff::Timestamp::from_millisecond(anchor.as_millisecond() + m * 60_000)
            .unwrap()
            .to_string()
    };
    let backfill = |key: Option<&'static str>, body: Value| {
        let mut req = Request::builder()
            .method("POST")
            .uri(format!("/v1/schedules/{id}/backfill"))
            .header("authorization", format!("Bearer {}", app.a))
            .header("content-type", "application/json");
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        req.body(Body::from(body.to_string())).unwrap()
    };
    // Minutes 10 … 19 after the anchor: ten instants.
    let range = json!({"from": at(10), "to": at(20)});
    let (s1, v1, _) = app.raw(backfill(Some("night-1"), range.clone())).await;
    assert_eq!(s1, StatusCode::CREATED, "{v1}");
    assert_eq!(
        (v1["instants"].as_u64(), v1["replayed"].as_bool()),
        (Some(10), Some(false))
    );
    let created = v1["created"].as_array().unwrap();
    assert_eq!(created.len(), 10);
    assert!(created.iter().all(|o| o["origin"] == "backfill"));
    assert_eq!(created[0]["scheduled_for"], at(10));
    // Paced at 20 per second: 50 ms apart, oldest first.
    let avail: Vec<i64> = created
        .iter()
        .map(|o| {
            o["available_at"]
                .as_str()
                .unwrap()
                .parse::<jiff::Timestamp>()
                .unwrap()
                .as_millisecond()
        })
        .collect();
    assert!(avail.windows(2).all(|w| w[1] - w[0] == 50), "{avail:?}");
    // Sent again with its key: the same answer, 200.
    let (s2, v2, _) = app.raw(backfill(Some("night-1"), range.clone())).await;
    assert_eq!(s2, StatusCode::OK, "{v2}");
    assert_eq!(
        (v2["backfill_id"].clone(), v2["replayed"].as_bool()),
        (v1["backfill_id"].clone(), Some(true))
    );
    // The same key for another range: 422; an overlapping range without a key lists what
    // exists and makes only the rest.
    let (s, v, _) = app
        .raw(backfill(
            Some("night-1"),
            json!({"from": at(0), "to": at(5)}),
        ))
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
        "{v}"
    );
    let (s, v, _) = app
        .raw(backfill(None, json!({"from": at(15), "to": at(25)})))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(
        (
            v["created"].as_array().unwrap().len(),
            v["existing"].as_array().unwrap().len()
        ),
        (5, 5)
    );
    // The bound, the future, an empty range, a bad overlap: 422 with a message.
    for (body, says) in [
        (json!({"from": at(0), "to": now_plus(3600)}), "future"),
        (json!({"from": at(5), "to": at(5)}), "before"),
        (
            json!({"from": at(0), "to": at(5), "overlap": "sometimes"}),
            "overlap",
        ),
        (json!({"from": "yesterday", "to": at(5)}), "from"),
    ] {
        let (s, v, _) = app.raw(backfill(None, body.clone())).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
        assert!(v["message"].as_str().unwrap().contains(says), "{body}: {v}");
    }
    // Past the bound: an every-second schedule over 20 minutes.
    let (_, v) = app
        .call(
            "POST",
            "/v1/schedules",
            Some(&app.a),
            Some(json!({"queue": "other", "every": "1s", "anchor": anchor.to_string()})),
        )
        .await;
    let (s, v) = app
        .call(
            "POST",
            &format!("/v1/schedules/{}/backfill", v["id"].as_str().unwrap()),
            Some(&app.a),
            Some(json!({"from": at(0), "to": at(20)})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("at most 1000"),
        "{v}"
    );
    // Listed with their origin; claimed with the schedule's payload.
    let (_, l) = app
        .call(
            "GET",
            &format!("/v1/occurrences?schedule_id={id}&limit=100"),
            Some(&app.a),
            None,
        )
        .await;
    let backfilled = l["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["origin"] == "backfill")
        .count();
    assert_eq!(backfilled, 15, "{l}");
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    let (_, c) = app
        .call(
            "POST",
            "/v1/queues/bf/claim",
            Some(&app.a),
            Some(json!({"worker_id": "w", "max": 100})),
        )
        .await;
    let claimed = c["occurrences"].as_array().unwrap();
    assert_eq!(claimed.len(), 15, "{c}");
    assert_eq!(claimed[0]["payload"], json!({"n": 2}));
    // Another tenant's key, an unknown schedule: 404. Paused: 409.
    let mut foreign = backfill(None, range.clone());
    foreign.headers_mut().insert(
        "authorization",
        format!("Bearer {}", app.b).parse().unwrap(),
    );
    let (s, _, _) = app.raw(foreign).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = app
        .call(
            "POST",
            &format!("/v1/schedules/{id}/pause"),
            Some(&app.a),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, v, _) = app.raw(backfill(None, range)).await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, "wrong_state"), "{v}");
}

/// `POST /v1/schedules/{id}/trigger` with `api_key`, an `Idempotency-Key` if given, and a JSON
/// body if given (none otherwise).
fn trigger_request(
    api_key: &str,
    id: &str,
    key: Option<&str>,
    body: Option<&str>,
) -> Request<Body> {
    let mut req = Request::builder()
        .method("POST")
        .uri(format!("/v1/schedules/{id}/trigger"))
        .header("authorization", format!("Bearer {api_key}"));
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    match body {
        Some(b) => req
            .header("content-type", "application/json")
            .body(Body::from(b.to_string()))
            .unwrap(),
        None => req.body(Body::empty()).unwrap(),
    }
}
