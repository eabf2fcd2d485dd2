//! The OpenAPI document against the server (DESIGN.md, "Why does a test walk the OpenAPI
//! document?"): for every operation of `/openapi.json`, requests built from the document alone.
//! A request the document allows must not be refused as invalid (400 or 422), and one that
//! breaks exactly one of the document's constraints (a length, a bound, a pattern, an enum, a
//! format, a type, a required property, an unknown property, an item count) must not succeed.
//!
//! The generator is deterministic and small: for each value it takes the lower bound, the
//! shortest string, the first enum value, and each bound in turn. Rules that are semantic (a
//! cron expression, a zone, a duration) or that tie properties together (exactly one of
//! `cron`, `at`, `every`) come from the short tables [`Gen::known`], [`Gen::invalid`],
//! [`base`] and [`fit`]; a property with a `pattern` and no entry there makes the test fail,
//! so that a new pattern comes with an example.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode};
use campanile_server::{AppState, ServerConfig, issue_key, router};
use campanile_store::{Store, TenantCreate};
use campanile_store_sqlite::SqliteStore;
use http_body_util::BodyExt;
use serde_json::{Map, Value, json};
use tower::ServiceExt;

struct Harness {
    router: Router,
    tenant: String,
    admin: String,
    _dir: tempfile::TempDir,
}

async fn harness() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("drift.db")).unwrap());
    let t = store
        .tenant_create(TenantCreate {
            name: "a".into(),
            now: None,
        })
        .await
        .unwrap();
    let tenant = issue_key(store.as_ref(), Some(t.id), false).await.unwrap();
    let admin = issue_key(store.as_ref(), None, true).await.unwrap();
    // A deployment that relays: a NATS target is then a valid target.
    let cfg = ServerConfig {
        relay: true,
        ..ServerConfig::default()
    };
    let router = router(AppState::new(store, &cfg, None), &cfg);
    Harness {
        router,
        tenant,
        admin,
        _dir: dir,
    }
}

/// One request, as the document describes its parts.
#[derive(Debug, Clone)]
struct Req {
    method: String,
    template: String,
    path: Vec<(String, String)>,
    query: Vec<(String, String)>,
    headers: Vec<(String, Vec<u8>)>,
    body: Option<Value>,
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl Harness {
    async fn send(&self, r: &Req, key: &str) -> (StatusCode, Value) {
        let mut uri = r.template.clone();
        for (name, value) in &r.path {
            uri = uri.replace(&format!("{{{name}}}"), &enc(value));
        }
        if !r.query.is_empty() {
            let q: Vec<String> = r
                .query
                .iter()
                .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
                .collect();
            uri = format!("{uri}?{}", q.join("&"));
        }
        let mut req = Request::builder()
            .method(r.method.to_uppercase().as_str())
            .uri(uri)
            .header("authorization", format!("Bearer {key}"));
        for (name, value) in &r.headers {
            req = req.header(name.as_str(), HeaderValue::from_bytes(value).unwrap());
        }
        let req = match &r.body {
            Some(b) => req
                .header("content-type", "application/json")
                .body(Body::from(b.to_string()))
                .unwrap(),
            None => req.body(Body::empty()).unwrap(),
        };
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, value)
    }
}

/// A schema with its `$ref`s followed and a nullable `oneOf` reduced to its other branch;
/// with the component's name when it is one.
fn deref<'a>(doc: &'a Value, mut s: &'a Value) -> (&'a Value, Option<&'a str>) {
    let mut name = None;
    loop {
        if let Some(r) = s.get("$ref").and_then(Value::as_str) {
            let n = r.rsplit('/').next().unwrap();
            name = Some(n);
            s = &doc["components"]["schemas"][n];
            continue;
        }
        let alts = s.get("oneOf").or_else(|| s.get("anyOf"));
        if let Some(alts) = alts.and_then(Value::as_array) {
            let other: Vec<&Value> = alts.iter().filter(|a| a["type"] != "null").collect();
            if other.len() == 1 {
                s = other[0];
                continue;
            }
        }
        return (s, name);
    }
}

/// The schema's type other than `null`.
fn kind(s: &Value) -> Option<&str> {
    match s.get("type") {
        Some(Value::String(t)) => Some(t.as_str()),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).find(|t| *t != "null"),
        _ if s.get("properties").is_some() => Some("object"),
        _ => None,
    }
}

fn nullable(s: &Value) -> bool {
    kind(s).is_none()
        || s["type"]
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t == "null"))
        || s["oneOf"]
            .as_array()
            .is_some_and(|a| a.iter().any(|b| b["type"] == "null"))
}

fn num(s: &Value, key: &str) -> Option<i64> {
    s.get(key).and_then(Value::as_f64).map(|f| f as i64)
}

fn len(s: &Value, key: &str) -> Option<usize> {
    s.get(key).and_then(Value::as_u64).map(|n| n as usize)
}

/// Values that satisfy a schema.
struct Gen {
    /// A schedule of the tenant's (for `PATCH`).
    schedule: String,
    counter: AtomicUsize,
}

impl Gen {
    fn next(&self) -> usize {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }

    /// Valid values of semantic or patterned fields, by `Component.property`, `path?query`,
    /// `path:param` or `header:Name`.
    fn known(&self, at: &str) -> Option<Value> {
        let v = match at {
            "ScheduleInput.cron"
            | "ScheduleCreate.cron"
            | "ScheduleUpdate.cron"
            | "PreviewInput.cron" => json!("*/15 * * * *"),
            "ScheduleInput.timezone"
            | "ScheduleCreate.timezone"
            | "ScheduleUpdate.timezone"
            | "PreviewInput.timezone" => json!("Europe/Paris"),
            "ScheduleInput.every"
            | "ScheduleCreate.every"
            | "ScheduleUpdate.every"
            | "PreviewInput.every" => json!("1h 30m"),
            "ScheduleInput.queue"
            | "ScheduleCreate.queue"
            | "ScheduleUpdate.queue"
            | "PreviewInput.queue"
            | "ClaimNext.queue" => json!("emails"),
            "TargetDto.subject" => json!("billing.nightly"),
            "ClaimInput.worker_id"
            | "RenewInput.worker_id"
            | "CompleteInput.worker_id"
            | "FailInput.worker_id"
            | "CompletionsInput.worker_id" => json!("worker-1"),
            "TenantInput.name" => json!(format!("t-{}", self.next())),
            "ClassInput.class" => json!("gold"),
            "header:Idempotency-Key" => json!(format!("key-{}", self.next())),
            "/v1/schedules?cursor" => json!(uuid::Uuid::new_v4().to_string()),
            "/v1/occurrences?cursor" => {
                json!(format!("1700000000000_{}", uuid::Uuid::new_v4()))
            }
            "/v1/schedules?queue" => json!("emails"),
            "/v1/schedules/{id}:id"
            | "/v1/schedules/{id}/backfill:id"
            | "/v1/schedules/{id}/trigger:id" => json!(self.schedule),
            // A past range, from before to.
            "BackfillInput.from" => json!("2026-01-01T00:00:00Z"),
            "BackfillInput.to" => json!("2026-01-02T00:00:00Z"),
            "/v1/queues/{queue}/claim:queue" => json!("emails"),
            "/v1/admin/tenants/{name}/keys:name"
            | "/v1/admin/tenants/{name}/class:name"
            | "/v1/admin/tenants/{name}/retention:name"
            | "/v1/admin/tenants/{name}/quotas:name"
            | "/v1/admin/tenants/{name}/queues/{queue}/limit:name" => json!("a"),
            "/v1/admin/tenants/{name}/queues/{queue}/limit:queue" => json!("emails"),
            _ => return None,
        };
        Some(v)
    }

    /// A value that breaks the `pattern` of a field (and nothing else where that can be).
    fn invalid(&self, at: &str) -> Option<Value> {
        let v = match at {
            "ScheduleInput.queue"
            | "ScheduleCreate.queue"
            | "ScheduleUpdate.queue"
            | "PreviewInput.queue"
            | "ClaimNext.queue" => json!("$nats:billing"),
            "/v1/queues/{queue}/claim:queue" => json!("$nats:billing"),
            "TargetDto.subject" => json!("billing.*"),
            "ScheduleInput.timezone"
            | "ScheduleCreate.timezone"
            | "ScheduleUpdate.timezone"
            | "PreviewInput.timezone" => json!("/etc/localtime"),
            "ClaimInput.worker_id"
            | "RenewInput.worker_id"
            | "CompleteInput.worker_id"
            | "FailInput.worker_id"
            | "CompletionsInput.worker_id" => json!("   "),
            "TenantInput.name" => json!("no spaces"),
            "ClassInput.class" => json!("Gold"),
            "header:Idempotency-Key" => json!("caf\u{e9}"),
            "/v1/schedules?queue" => json!("a\u{0}b"),
            "/v1/schedules?cursor" => json!("not-a-cursor"),
            "/v1/occurrences?cursor" => json!("not-a-cursor"),
            "/v1/admin/tenants/{name}/keys:name"
            | "/v1/admin/tenants/{name}/class:name"
            | "/v1/admin/tenants/{name}/retention:name"
            | "/v1/admin/tenants/{name}/quotas:name"
            | "/v1/admin/tenants/{name}/queues/{queue}/limit:name" => json!("no spaces"),
            _ => return None,
        };
        Some(v)
    }

    /// A value the schema allows: the known one, else the first enum value, the lower bound,
    /// the shortest string, the required properties.
    fn valid(&self, doc: &Value, s: &Value, at: &str) -> Value {
        if let Some(v) = self.known(at) {
            return v;
        }
        let (s, comp) = deref(doc, s);
        if let Some(e) = s["enum"].as_array() {
            return e.iter().find(|v| !v.is_null()).cloned().unwrap();
        }
        match kind(s) {
            Some("object") => {
                let comp = comp.unwrap_or(at);
                let mut m = Map::new();
                for r in s["required"].as_array().into_iter().flatten() {
                    let r = r.as_str().unwrap();
                    m.insert(
                        r.into(),
                        self.valid(doc, &s["properties"][r], &format!("{comp}.{r}")),
                    );
                }
                base(comp, &mut m);
                Value::Object(m)
            }
            Some("string") => match s["format"].as_str() {
                Some("uuid") => json!(uuid::Uuid::new_v4().to_string()),
                Some("date-time") => json!(
                    jiff::Timestamp::now()
                        .checked_add(jiff::SignedDuration::from_hours(1))
                        .unwrap()
                        .to_string()
                ),
                _ => {
                    assert!(
                        s.get("pattern").is_none(),
                        "{at}: no known value for the pattern {}; add one to Gen::known",
                        s["pattern"]
                    );
                    let n = len(s, "minLength").unwrap_or(1).max(1);
                    json!("x".repeat(n.min(len(s, "maxLength").unwrap_or(n))))
                }
            },
            Some("integer") | Some("number") => {
                let lo = num(s, "minimum");
                let hi = num(s, "maximum");
                json!(lo.unwrap_or(1.min(hi.unwrap_or(1))))
            }
            Some("boolean") => json!(false),
            Some("array") => {
                let n = len(s, "minItems").unwrap_or(0);
                let item = self.valid(doc, &s["items"], &format!("{at}[]"));
                Value::Array(vec![item; n])
            }
            _ => json!({"n": 1}),
        }
    }
}

/// What a component's valid value needs beyond its required properties: rules that tie its
/// properties together (stated in the document's descriptions).
fn base(comp: &str, m: &mut Map<String, Value>) {
    if matches!(comp, "ScheduleInput" | "ScheduleCreate" | "ScheduleUpdate") {
        // Queue or target; exactly one of cron, at or every.
        m.insert("queue".into(), json!("emails"));
        m.insert("every".into(), json!("1h 30m"));
    }
    if comp == "PreviewInput" {
        // Exactly one of cron, at or every, as a create.
        m.insert("every".into(), json!("1h 30m"));
    }
}

/// Makes room in `m` (the object holding `prop`) for `prop` to be set to `value`: what the
/// document's descriptions say goes with it.
fn fit(comp: &str, prop: &str, value: &Value, m: &mut Map<String, Value>) {
    let schedule = matches!(
        comp,
        "ScheduleInput" | "ScheduleCreate" | "ScheduleUpdate" | "PreviewInput"
    );
    match prop {
        "cron" | "timezone" | "dst" if schedule => {
            m.remove("every");
            m.remove("anchor");
            m.entry("cron").or_insert(json!("*/15 * * * *"));
        }
        "at" if schedule => {
            m.remove("every");
            m.remove("anchor");
        }
        "target" if schedule => {
            m.remove("queue");
        }
        "catchup_max" | "catchup_interval_ms" if comp == "MisfireDto" => {
            m.insert("policy".into(), json!("catchup"));
            m.entry("catchup_max").or_insert(json!(1));
        }
        "policy"
            if comp == "MisfireDto"
                && value
                    .as_str()
                    .is_some_and(|p| p.eq_ignore_ascii_case("catchup")) =>
        {
            m.entry("catchup_max").or_insert(json!(1));
        }
        "backoff_initial_ms" if comp == "RetryDto" => {
            m.insert("backoff_max_ms".into(), json!(2_592_000_000_i64));
        }
        "backoff_max_ms" if comp == "RetryDto" => {
            m.insert("backoff_initial_ms".into(), json!(1));
        }
        "resent" if comp == "ClaimInput" || comp == "ClaimNext" => {
            m.insert("claim_key".into(), json!(uuid::Uuid::new_v4().to_string()));
        }
        "failure" if comp == "CompletionItem" => {
            m.remove("result");
        }
        _ => {}
    }
}

/// Where a property sits in a body: the objects and arrays leading to its object.
#[derive(Debug, Clone)]
enum Step {
    /// The property of that name (in an object of that component), of that schema.
    Key(String, Value, String),
    /// The first item of the array.
    First(Value),
}

/// A property of a request body.
#[derive(Debug, Clone)]
struct Prop {
    /// `Component.property`.
    at: String,
    comp: String,
    name: String,
    steps: Vec<Step>,
    schema: Value,
    required: bool,
}

/// Every property of the object schema `s` (component `comp`) and of the objects under it.
fn props(doc: &Value, s: &Value, comp: &str, steps: &[Step], out: &mut Vec<Prop>) {
    let (s, _) = deref(doc, s);
    let required: Vec<&str> = s["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for (name, ps) in s["properties"].as_object().into_iter().flatten() {
        out.push(Prop {
            at: format!("{comp}.{name}"),
            comp: comp.into(),
            name: name.clone(),
            steps: steps.to_vec(),
            schema: ps.clone(),
            required: required.contains(&name.as_str()),
        });
        let (inner, inner_comp) = deref(doc, ps);
        match kind(inner) {
            Some("object") => {
                let mut st = steps.to_vec();
                st.push(Step::Key(name.clone(), ps.clone(), comp.into()));
                props(doc, inner, inner_comp.unwrap_or(name), &st, out);
            }
            Some("array") => {
                let (item, item_comp) = deref(doc, &inner["items"]);
                if kind(item) == Some("object") {
                    let mut st = steps.to_vec();
                    st.push(Step::Key(name.clone(), ps.clone(), comp.into()));
                    st.push(Step::First(inner["items"].clone()));
                    props(doc, item, item_comp.unwrap_or(name), &st, out);
                }
            }
            _ => {}
        }
    }
}

/// The object holding a property, created along the way from valid values.
fn holder<'a>(
    g: &Gen,
    doc: &Value,
    body: &'a mut Value,
    steps: &[Step],
) -> &'a mut Map<String, Value> {
    let mut at = body;
    for step in steps {
        at = match step {
            Step::Key(name, s, comp) => {
                let m = at.as_object_mut().unwrap();
                if m.get(name).is_none_or(Value::is_null) {
                    let v = g.valid(doc, s, name);
                    fit(comp, name, &v, m);
                    m.insert(name.clone(), v);
                }
                m.get_mut(name).unwrap()
            }
            Step::First(s) => {
                let a = at.as_array_mut().unwrap();
                if a.is_empty() {
                    a.push(g.valid(doc, s, "item"));
                }
                &mut a[0]
            }
        };
    }
    at.as_object_mut().unwrap()
}

/// Values of a schema at each of its bounds, each allowed.
fn valid_variants(g: &Gen, doc: &Value, s: &Value, at: &str) -> Vec<Value> {
    let mut out = vec![g.valid(doc, s, at)];
    let known = g.known(at).is_some();
    let (s, _) = deref(doc, s);
    if let Some(e) = s["enum"].as_array() {
        out.extend(e.iter().filter(|v| !v.is_null()).cloned());
        return out;
    }
    match kind(s) {
        // Without a bound, the document allows what the type holds: below zero, and large.
        Some("integer") | Some("number") => {
            out.push(json!(num(s, "minimum").unwrap_or(-1)));
            out.push(json!(num(s, "maximum").unwrap_or(
                if s["format"] == "int32" {
                    i64::from(i32::MAX)
                } else {
                    1_000_000_000_000_000
                }
            )));
        }
        // The shortest string allowed (a semantic field's known value aside, once the
        // document says it is not empty) and the longest.
        Some("string") if s["format"].is_null() && s["pattern"].is_null() => {
            let shortest = len(s, "minLength").unwrap_or(0);
            if !known || shortest == 0 {
                out.push(json!("x".repeat(shortest)));
            }
            if !known {
                out.extend(len(s, "maxLength").map(|n| json!("x".repeat(n))));
            }
        }
        Some("boolean") => out.push(json!(true)),
        Some("array") => {
            if let Some(n) = len(s, "maxItems") {
                let item = g.valid(doc, &s["items"], &format!("{at}[]"));
                out.push(Value::Array(vec![item; n]));
            }
        }
        _ => {}
    }
    out
}

/// Values that each break one constraint of the schema, with what they break.
fn invalid_variants(g: &Gen, doc: &Value, s0: &Value, at: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let (s, _) = deref(doc, s0);
    if !nullable(s0) && !nullable(s) {
        out.push(("null".into(), Value::Null));
    }
    if s.get("enum").is_some() {
        out.push(("enum".into(), json!("not_one_of_them")));
    }
    match kind(s) {
        Some("string") => {
            out.push(("type string".into(), json!(12345)));
            if let Some(n) = len(s, "minLength").filter(|n| *n > 0) {
                out.push((format!("minLength {n}"), json!("x".repeat(n - 1))));
            }
            if let Some(n) = len(s, "maxLength") {
                out.push((format!("maxLength {n}"), json!("x".repeat(n + 1))));
            }
            if let Some(p) = s.get("pattern") {
                let bad = g.invalid(at).unwrap_or_else(|| {
                    panic!("{at}: no value breaking the pattern {p}; add one to Gen::invalid")
                });
                out.push((format!("pattern {p}"), bad));
            }
            match s["format"].as_str() {
                Some("uuid") => out.push(("format uuid".into(), json!("not-a-uuid"))),
                Some("date-time") => {
                    out.push(("format date-time".into(), json!("not-an-instant")));
                }
                _ => {}
            }
        }
        Some("integer") => {
            out.push(("type integer".into(), json!("1")));
            let ok = num(s, "minimum").unwrap_or(1);
            out.push(("type integer (a fraction)".into(), json!(ok as f64 + 0.5)));
            out.push(("type integer (written with .0)".into(), json!(ok as f64)));
            if let Some(n) = num(s, "minimum") {
                out.push((format!("minimum {n}"), json!(n - 1)));
            }
            if let Some(n) = num(s, "maximum") {
                out.push((format!("maximum {n}"), json!(n + 1)));
            }
        }
        Some("number") => out.push(("type number".into(), json!("1"))),
        Some("boolean") => out.push(("type boolean".into(), json!("true"))),
        Some("object") => out.push(("type object".into(), json!("x"))),
        Some("array") => {
            out.push(("type array".into(), json!({})));
            let item = g.valid(doc, &s["items"], &format!("{at}[]"));
            if let Some(n) = len(s, "minItems").filter(|n| *n > 0) {
                out.push((
                    format!("minItems {n}"),
                    Value::Array(vec![item.clone(); n - 1]),
                ));
            }
            if let Some(n) = len(s, "maxItems") {
                out.push((format!("maxItems {n}"), Value::Array(vec![item; n + 1])));
            }
        }
        _ => {}
    }
    out
}

/// The same values as query or path text: no nulls, strings as they are.
fn text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// With `OPENAPI_DRIFT_LOG` set, every request and its answer on stderr.
fn log(r: &Req, what: &str, s: StatusCode, allowed: bool) {
    if std::env::var_os("OPENAPI_DRIFT_LOG").is_some() {
        let kind = if allowed { "allowed" } else { "broken " };
        let what: String = what.chars().take(120).collect();
        eprintln!(
            "{kind} {} {} {what} -> {}",
            r.method.to_uppercase(),
            r.template,
            s.as_u16()
        );
    }
}

struct Check<'a> {
    h: &'a Harness,
    found: Vec<String>,
    sent: usize,
}

impl Check<'_> {
    /// A request the document allows: not refused as invalid, never a server error.
    async fn allowed(&mut self, key: &str, r: &Req, what: &str) {
        let (s, v) = self.h.send(r, key).await;
        self.sent += 1;
        log(r, what, s, true);
        if s == StatusCode::UNPROCESSABLE_ENTITY
            || s == StatusCode::BAD_REQUEST
            || s.is_server_error()
        {
            self.found.push(format!(
                "{} {}: {what} is allowed by the document, the server answered {s}: {}",
                r.method.to_uppercase(),
                r.template,
                v["message"]
            ));
        }
    }

    /// A request that breaks the document: never a success.
    async fn refused(&mut self, key: &str, r: &Req, what: &str) {
        let (s, _) = self.h.send(r, key).await;
        self.sent += 1;
        log(r, what, s, false);
        if s.is_success() || s.is_server_error() {
            self.found.push(format!(
                "{} {}: {what} breaks the document, the server answered {s}",
                r.method.to_uppercase(),
                r.template
            ));
        }
    }
}

#[tokio::test]
async fn every_constraint_the_server_enforces_is_in_the_openapi_document() {
    let h = harness().await;
    let (s, doc) = h
        .send(
            &Req {
                method: "get".into(),
                template: "/openapi.json".into(),
                path: vec![],
                query: vec![],
                headers: vec![],
                body: None,
            },
            &h.tenant,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    // A schedule of the tenant's, for PATCH.
    let created = Req {
        method: "post".into(),
        template: "/v1/schedules".into(),
        path: vec![],
        query: vec![],
        headers: vec![],
        body: Some(json!({"queue": "emails", "every": "1h"})),
    };
    let (s, v) = h.send(&created, &h.tenant).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let g = Gen {
        schedule: v["id"].as_str().unwrap().to_string(),
        counter: AtomicUsize::new(0),
    };
    let mut check = Check {
        h: &h,
        found: Vec::new(),
        sent: 0,
    };
    for (template, item) in doc["paths"].as_object().unwrap() {
        if !template.starts_with("/v1/") {
            continue;
        }
        for (method, op) in item.as_object().unwrap() {
            let key = if template.starts_with("/v1/admin/") {
                h.admin.clone()
            } else {
                h.tenant.clone()
            };
            let params: Vec<&Value> = op["parameters"].as_array().into_iter().flatten().collect();
            let at_of = |p: &Value| {
                let name = p["name"].as_str().unwrap();
                match p["in"].as_str().unwrap() {
                    "query" => format!("{template}?{name}"),
                    "path" => format!("{template}:{name}"),
                    _ => format!("header:{name}"),
                }
            };
            let body_schema = op["requestBody"]["content"]["application/json"]["schema"].clone();
            let body_comp = deref(&doc, &body_schema).1.unwrap_or("body").to_string();
            // The request with every required part and nothing else.
            let required = |g: &Gen, place: &str| -> Vec<(String, String)> {
                params
                    .iter()
                    .filter(|p| p["in"] == place && (place == "path" || p["required"] == true))
                    .map(|p| {
                        let v = g.valid(&doc, &p["schema"], &at_of(p));
                        (p["name"].as_str().unwrap().to_string(), text(&v).unwrap())
                    })
                    .collect()
            };
            let fresh = |g: &Gen| Req {
                method: method.clone(),
                template: template.clone(),
                path: required(g, "path"),
                query: required(g, "query"),
                headers: required(g, "header")
                    .into_iter()
                    .map(|(k, v)| (k, v.into_bytes()))
                    .collect(),
                body: (!body_schema.is_null()).then(|| g.valid(&doc, &body_schema, &body_comp)),
            };
            check.allowed(&key, &fresh(&g), "the plain request").await;
            // Each parameter: its bounds allowed, each of its constraints broken refused.
            for p in &params {
                let at = at_of(p);
                let name = p["name"].as_str().unwrap().to_string();
                let set = |r: &mut Req, v: &str| match p["in"].as_str().unwrap() {
                    "query" => {
                        r.query.retain(|(k, _)| *k != name);
                        r.query.push((name.clone(), v.to_string()));
                    }
                    "path" => {
                        for slot in &mut r.path {
                            if slot.0 == name {
                                slot.1 = v.to_string();
                            }
                        }
                    }
                    _ => {
                        r.headers.retain(|(k, _)| *k != name);
                        r.headers.push((name.clone(), v.as_bytes().to_vec()));
                    }
                };
                // A required query parameter or header left out.
                if p["required"] == true && p["in"] != "path" {
                    let mut r = fresh(&g);
                    r.query.retain(|(k, _)| *k != name);
                    r.headers.retain(|(k, _)| *k != name);
                    check
                        .refused(&key, &r, &format!("{at} left out (required)"))
                        .await;
                }
                for (i, v) in valid_variants(&g, &doc, &p["schema"], &at)
                    .into_iter()
                    .enumerate()
                {
                    let mut r = fresh(&g);
                    // A header's known value is fresh each time (an Idempotency-Key names one
                    // request).
                    let v = if p["in"] == "header" && i == 0 {
                        g.valid(&doc, &p["schema"], &at)
                    } else {
                        v
                    };
                    let Some(t) = text(&v) else { continue };
                    set(&mut r, &t);
                    check.allowed(&key, &r, &format!("{at}={t:?}")).await;
                }
                for (what, v) in invalid_variants(&g, &doc, &p["schema"], &at) {
                    // A parameter is text: `null`, a number for a string and the like are
                    // the same text as a valid value, or no value at all.
                    if what.starts_with("null") || what.starts_with("type") {
                        continue;
                    }
                    let Some(t) = text(&v) else { continue };
                    let mut r = fresh(&g);
                    set(&mut r, &t);
                    check
                        .refused(&key, &r, &format!("{at}={t:?} ({what})"))
                        .await;
                }
            }
            if body_schema.is_null() {
                continue;
            }
            // Each property of the body, at any depth.
            let mut all = Vec::new();
            props(&doc, &body_schema, &body_comp, &[], &mut all);
            let mut closed = std::collections::BTreeSet::new();
            for p in &all {
                let put = |g: &Gen, v: Value| {
                    let mut r = fresh(g);
                    let m = holder(g, &doc, r.body.as_mut().unwrap(), &p.steps);
                    fit(&p.comp, &p.name, &v, m);
                    m.insert(p.name.clone(), v);
                    r
                };
                for v in valid_variants(&g, &doc, &p.schema, &p.at) {
                    let r = put(&g, v.clone());
                    check.allowed(&key, &r, &format!("{} = {v}", p.at)).await;
                }
                for (what, v) in invalid_variants(&g, &doc, &p.schema, &p.at) {
                    let r = put(&g, v.clone());
                    let shown: String = v.to_string().chars().take(60).collect();
                    check
                        .refused(&key, &r, &format!("{} = {shown} ({what})", p.at))
                        .await;
                }
                // `null` where the document allows it, for a property the body leaves out.
                if nullable(&p.schema) {
                    let mut r = fresh(&g);
                    let m = holder(&g, &doc, r.body.as_mut().unwrap(), &p.steps);
                    if !m.contains_key(&p.name) {
                        m.insert(p.name.clone(), Value::Null);
                        check.allowed(&key, &r, &format!("{} = null", p.at)).await;
                    }
                }
                if p.required {
                    let mut r = fresh(&g);
                    holder(&g, &doc, r.body.as_mut().unwrap(), &p.steps).remove(&p.name);
                    check
                        .refused(&key, &r, &format!("{} left out (required)", p.at))
                        .await;
                }
                // An object that takes no other properties: one more is refused.
                if closed.insert(p.comp.clone()) {
                    let (s, _) = deref(&doc, &body_schema);
                    let holder_schema = p
                        .steps
                        .last()
                        .map(|st| match st {
                            Step::Key(_, s, _) | Step::First(s) => deref(&doc, s).0.clone(),
                        })
                        .unwrap_or_else(|| s.clone());
                    if holder_schema["additionalProperties"] == false {
                        let mut r = fresh(&g);
                        holder(&g, &doc, r.body.as_mut().unwrap(), &p.steps)
                            .insert("no_such_property".into(), json!(1));
                        check
                            .refused(&key, &r, &format!("{}.no_such_property", p.comp))
                            .await;
                    }
                }
            }
        }
    }
    assert!(check.sent > 300, "only {} requests were sent", check.sent);
    assert!(
        check.found.is_empty(),
        "{} disagreements between /openapi.json and the server:\n{}",
        check.found.len(),
        check.found.join("\n")
    );
}
