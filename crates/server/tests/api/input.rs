//! Bad input is a 4xx that says what is wrong; what is accepted is kept exactly.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use campanile_server::ServerConfig;
use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::*;

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
    // Each DST decision is labelled, with the wall time in the schedule's zone.
    assert_eq!(v["timezone"], "America/New_York");
    assert_eq!(v["fires"][0]["local"], "2026-03-07T02:30:00-05:00");
    assert!(v["fires"][0]["dst"].is_null(), "{v}");
    assert_eq!(v["fires"][1]["dst"], "after_skipped_gap", "{v}");
    assert_eq!(v["fires"][1]["dst_wall_time"], "2026-03-08T02:30:00", "{v}");
    assert_eq!(v["fires"][1]["local"], "2026-03-09T02:30:00-04:00");
    let (s, v) = app.call("POST", "/v1/schedules/preview", k, Some(json!({"cron": "30 2 * * *", "timezone": "America/New_York", "dst": {"gap": "shift"}, "after": "2026-03-07T00:00:00Z", "count": 2}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["fires"][1]["dst"], "shifted_from_gap", "{v}");
    assert_eq!(v["fires"][1]["local"], "2026-03-08T03:00:00-04:00", "{v}");
    let (s, v) = app.call("POST", "/v1/schedules/preview", k, Some(json!({"cron": "30 1 * * *", "timezone": "America/New_York", "dst": {"fold": "twice"}, "after": "2026-11-01T00:00:00Z", "count": 2}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (&v["fires"][0]["dst"], &v["fires"][1]["dst"]),
        (&json!("fold_earlier"), &json!("fold_later")),
        "{v}"
    );
    assert_eq!(v["fires"][1]["local"], "2026-11-01T01:30:00-05:00", "{v}");
    // Intervals and one-offs preview too, checked as a create checks them.
    let (s, v) = app.call("POST", "/v1/schedules/preview", k, Some(json!({"every": "90m", "anchor": "2030-01-01T00:00:00Z", "after": "2030-01-01T00:00:00Z", "count": 2}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v["next_fires"],
        json!(["2030-01-01T01:30:00Z", "2030-01-01T03:00:00Z"])
    );
    assert_eq!(v["timezone"], "UTC");
    // A whole definition, the body of a create, previews as its timing, with its DST policy.
    let whole = json!({"queue": "reports", "cron": "30 2 * * *", "timezone": "America/New_York",
        "dst": {"gap": "shift"}, "payload": {"n": 1}, "priority": 5, "lease_seconds": 60,
        "misfire": {"policy": "fire_once", "max_lateness_seconds": 600}, "overlap": "SKIP_IF_RUNNING",
        "retry": {"max_attempts": 5}, "after": "2026-03-07T00:00:00Z", "count": 2});
    let (s, v) = app
        .call("POST", "/v1/schedules/preview", k, Some(whole))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v["next_fires"],
        json!(["2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z"]),
        "{v}"
    );
    assert_eq!(v["fires"][1]["dst"], "shifted_from_gap", "{v}");
    let (s, v) = app
        .call(
            "POST",
            "/v1/schedules/preview",
            k,
            Some(json!({"at": "2030-05-01T12:00:00+02:00"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["next_fires"], json!(["2030-05-01T10:00:00Z"]));
    for bad in [
        json!({"every": "0s"}),
        json!({"every": "1d"}),
        json!({"cron": "* * * * *", "every": "1m"}),
        json!({}),
        json!({"cron": "* * * * *", "queue": "q", "lease_seconds": 0}),
        json!({"cron": "* * * * *", "queue": "q", "target": {"type": "nats", "subject": "a.b"}}),
        json!({"cron": "* * * * *", "queue": "q", "no_such_field": 1}),
    ] {
        let (s, v) = app
            .call("POST", "/v1/schedules/preview", k, Some(bad.clone()))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {v}");
    }
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
