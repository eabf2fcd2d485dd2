//! The worker protocol over HTTP: claims, leases, reports, and a report that claims.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::*;

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
