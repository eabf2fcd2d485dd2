//! The console's pages and the actions their forms send.

// A page's early exits carry the page to answer with (a `Response`, large by clippy's measure):
// it is answered at once, not passed along.
#![allow(clippy::result_large_err)]

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use campanile_core::{OccurrenceId, OccurrenceState, ScheduleId};
use campanile_store::{
    Ack, OccurrenceCancel, OccurrenceGet, OccurrenceKey, OccurrenceList, OccurrenceRedrive,
    OverviewGet, QueueLimitList, ScheduleGet, ScheduleList, ScheduleState, ScheduleTrigger,
    TenantId, TenantQuotaGet,
};
use jiff::{SignedDuration, Timestamp};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{COOKIE, LOGIN_COOKIE, Signed, cookie, page, set_cookie, svg};
use crate::dto::{OccurrenceOut, ScheduleOut};
use crate::{ApiError, AppState};

/// Rows per page of the lists.
const PAGE: u32 = 50;

/// The context every page shares: who is signed in, the CSRF token, and a notice or an
/// error carried over a redirect.
fn base(s: &Signed, nav: &str, q: &Notice) -> Value {
    json!({
        "signed": {"label": s.label, "admin": s.is_admin(), "csrf": s.csrf},
        "nav": nav,
        "notice": q.notice,
        "error": q.error,
    })
}

fn merge(mut a: Value, b: Value) -> Value {
    if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
        a.extend(b);
    }
    a
}

/// A notice or error shown once, after an action's redirect.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Notice {
    notice: Option<String>,
    error: Option<String>,
}

/// A page saying what went wrong, with the status it deserves (404 for what the tenant does
/// not have: another tenant's ids are not found, as in the API).
fn problem(s: Option<&Signed>, status: StatusCode, title: &str, message: &str) -> Response {
    let signed = s.map(|s| json!({"label": s.label, "admin": s.is_admin(), "csrf": s.csrf}));
    page(
        status,
        "message.html",
        json!({"signed": signed, "title": title, "message": message}),
    )
}

fn not_found(s: &Signed, what: &str) -> Response {
    problem(
        Some(s),
        StatusCode::NOT_FOUND,
        "Not found",
        &format!("No {what} with that id exists for this tenant."),
    )
}

fn failed(s: &Signed, e: &ApiError) -> Response {
    problem(Some(s), e.status(), "That did not work", e.message())
}

/// Tenant pages need a tenant key; an admin key manages tenants.
fn tenant_of(s: &Signed) -> Result<TenantId, Response> {
    s.tenant.ok_or_else(|| {
        problem(
            Some(s),
            StatusCode::FORBIDDEN,
            "A tenant key is needed",
            "This key is an admin key: it manages tenants (see Tenants). Sign in with a \
             tenant's key to see its schedules and occurrences.",
        )
    })
}

/// `path` with the query string `pairs` (form-encoded).
fn with_query(path: &str, pairs: &[(&str, &str)]) -> String {
    format!(
        "{path}?{}",
        serde_urlencoded::to_string(pairs).unwrap_or_default()
    )
}

/// After an action: back to `to` with a notice (`Ok`) or an error.
fn back(to: &str, outcome: Result<String, String>) -> Response {
    let (k, v) = match outcome {
        Ok(m) => ("notice", m),
        Err(m) => ("error", m),
    };
    Redirect::to(&with_query(to, &[(k, &v)])).into_response()
}

fn blank(v: Option<String>) -> Option<String> {
    v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

// ── Sign-in ──

#[derive(Debug, Deserialize)]
pub(crate) struct LoginForm {
    key: String,
    token: String,
}

/// The sign-in form, with its own double-submit token.
pub(crate) async fn login_form() -> Response {
    login_page(StatusCode::OK, None)
}

fn login_page(status: StatusCode, error: Option<&str>) -> Response {
    let token = super::logins::token();
    let mut r = page(
        status,
        "login.html",
        json!({"token": token, "error": error}),
    );
    r.headers_mut()
        .append(header::SET_COOKIE, set_cookie(LOGIN_COOKIE, &token, 600));
    r
}

/// Signs in with an API key: a login for it, named by an `HttpOnly` cookie.
pub(crate) async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    if cookie(&headers, LOGIN_COOKIE).as_deref() != Some(f.token.as_str()) || f.token.is_empty() {
        return login_page(
            StatusCode::FORBIDDEN,
            Some("The sign-in form expired or came from elsewhere: try again."),
        );
    }
    let key = f.key.trim();
    let hash = crate::auth::hash_key(key);
    let record = match crate::auth::find_by_hash(&state, hash.clone()).await {
        Ok(r) => r,
        Err(e) if e.status() == StatusCode::UNAUTHORIZED => {
            return login_page(
                StatusCode::UNAUTHORIZED,
                Some("That key is not valid (unknown or revoked)."),
            );
        }
        Err(e) => return login_page(e.status(), Some(e.message())),
    };
    let tenant_name = match record.tenant {
        None => "admin".to_string(),
        Some(t) => state
            .store
            .tenant_list()
            .await
            .ok()
            .and_then(|ts| ts.into_iter().find(|x| x.id == t).map(|x| x.name))
            .unwrap_or_else(|| format!("tenant {}", t.0)),
    };
    let label = format!("{tenant_name} ({}…)", record.prefix);
    let token = state
        .logins
        .create(hash, record.tenant, record.is_admin, label);
    let mut r = Redirect::to("/ui/").into_response();
    let max_age = super::logins::ABSOLUTE.as_secs();
    r.headers_mut()
        .append(header::SET_COOKIE, set_cookie(COOKIE, &token, max_age));
    r.headers_mut()
        .append(header::SET_COOKIE, set_cookie(LOGIN_COOKIE, "", 0));
    r
}

#[derive(Debug, Deserialize)]
pub(crate) struct CsrfForm {
    csrf: String,
}

/// Signs out: the login ends.
pub(crate) async fn logout(
    State(state): State<AppState>,
    s: Signed,
    headers: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Response {
    if f.csrf != s.csrf {
        return csrf_refused(&s);
    }
    if let Some(token) = cookie(&headers, COOKIE) {
        state.logins.remove(&token);
    }
    let mut r = Redirect::to("/ui/login").into_response();
    r.headers_mut()
        .append(header::SET_COOKIE, set_cookie(COOKIE, "", 0));
    r
}

fn csrf_refused(s: &Signed) -> Response {
    problem(
        Some(s),
        StatusCode::FORBIDDEN,
        "Refused",
        "The form did not carry this login's token (it may come from another site, or \
         from a page older than the login): reload the page and try again.",
    )
}

// ── Overview ──

/// The overview: backlog, the last hour's lags and throughput, outcomes, nodes and shards.
pub(crate) async fn overview(
    State(state): State<AppState>,
    s: Signed,
    Query(q): Query<Notice>,
) -> Response {
    let now = match state.store.store_now().await {
        Ok(t) => t,
        Err(e) => return failed(&s, &ApiError::from(e)),
    };
    let since = now
        .checked_sub(SignedDuration::from_hours(1))
        .unwrap_or(now);
    let o = match state
        .store
        .overview(OverviewGet {
            tenant: s.tenant,
            since,
            now: Some(now),
        })
        .await
    {
        Ok(o) => o,
        Err(e) => return failed(&s, &ApiError::from(e)),
    };
    let count = |st: OccurrenceState| {
        o.finished
            .iter()
            .filter(|(x, _)| *x == st)
            .map(|(_, n)| *n)
            .sum::<u64>()
    };
    let lag = |v: &[i64]| {
        json!({
            "samples": v.len(),
            "p50": svg::quantile(v, 0.5),
            "p90": svg::quantile(v, 0.9),
            "p99": svg::quantile(v, 0.99),
            "max": v.iter().max(),
        })
    };
    // One bar per minute of the hour, empty minutes included.
    let first = since.as_millisecond() / 60_000;
    let minutes: Vec<(String, u64)> = (0..60)
        .map(|i| {
            let m = first + 1 + i;
            let n = o
                .per_minute
                .iter()
                .find(|(t, _)| t.as_millisecond() / 60_000 == m)
                .map_or(0, |(_, n)| *n);
            let label = Timestamp::from_millisecond(m * 60_000)
                .map(|t| t.strftime("%H:%M").to_string())
                .unwrap_or_default();
            (label, n)
        })
        .collect();
    let finished_total: u64 = o.finished.iter().map(|(_, n)| n).sum();
    // Node names and who holds which shard are the deployment's: shown to admin keys.
    let holders: Vec<Value> = if !s.is_admin() {
        Vec::new()
    } else {
        o.nodes
            .iter()
            .map(|(node, until)| {
                let held: Vec<i32> = o
                    .shards
                    .iter()
                    .filter(|h| {
                        h.owner.as_deref() == Some(node.as_str())
                            && h.lease_until.is_some_and(|t| t > now)
                    })
                    .map(|h| h.shard)
                    .collect();
                json!({"node": node, "alive_until": until.to_string(), "alive": *until > now,
                   "shards": held})
            })
            .collect()
    };
    let unheld = o
        .shards
        .iter()
        .filter(|h| h.owner.is_none() || h.lease_until.is_none_or(|t| t <= now))
        .count();
    let ctx = json!({
        "now": now.to_string(),
        "due": o.due,
        "oldest_due_at": o.oldest_due_at.map(|t| t.to_string()),
        "oldest_age_s": o.oldest_due_at.map(|t| (now.as_millisecond() - t.as_millisecond()).max(0) as f64 / 1000.0),
        "claim_lag": lag(&o.claim_lag_ms),
        "schedule_lag": lag(&o.schedule_lag_ms),
        "claim_chart": svg::lag_histogram("Claim lag over the last hour (claimed minus available)", &o.claim_lag_ms),
        "schedule_chart": svg::lag_histogram("Schedule lag over the last hour (claimed minus planned)", &o.schedule_lag_ms),
        "throughput_chart": svg::bars("Occurrences finished per minute over the last hour", 1120.0, &minutes),
        "finished_total": finished_total,
        "succeeded": count(OccurrenceState::Succeeded),
        "dead": count(OccurrenceState::Dead),
        "missed": count(OccurrenceState::Missed),
        "skipped": count(OccurrenceState::SkippedOverlap),
        "canceled": count(OccurrenceState::Canceled),
        "nodes": holders,
        "shards": o.shards.len(),
        "unheld": unheld,
    });
    page(
        StatusCode::OK,
        "overview.html",
        merge(base(&s, "overview", &q), ctx),
    )
}

// ── Schedules ──

#[derive(Debug, Default, Deserialize)]
pub(crate) struct SchedulesQuery {
    state: Option<String>,
    queue: Option<String>,
    zone: Option<String>,
    q: Option<String>,
    after: Option<String>,
    #[serde(flatten)]
    notice: NoticeFields,
}

/// The notice fields inside another query.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct NoticeFields {
    notice: Option<String>,
    error: Option<String>,
}

impl NoticeFields {
    fn notice(self) -> Notice {
        Notice {
            notice: self.notice,
            error: self.error,
        }
    }
}

/// The tenant's schedules: filtered by state, queue and zone, a search by id, a page at a
/// time (keyset pagination on the id index: as fast on page 2,000 as on page 1).
pub(crate) async fn schedules(
    State(state): State<AppState>,
    s: Signed,
    Query(q): Query<SchedulesQuery>,
) -> Response {
    let tenant = match tenant_of(&s) {
        Ok(t) => t,
        Err(r) => return r,
    };
    // A search for an id goes to that schedule.
    if let Some(text) = blank(q.q.clone()) {
        return match uuid::Uuid::parse_str(&text) {
            Ok(id) => Redirect::to(&format!("/ui/schedules/{id}")).into_response(),
            Err(_) => back(
                "/ui/schedules",
                Err(format!("'{text}' is not a schedule id (a UUID)")),
            ),
        };
    }
    let st = match blank(q.state.clone()).map(|x| ScheduleState::parse(&x.to_ascii_uppercase())) {
        None => None,
        Some(Some(st)) => Some(st),
        Some(None) => {
            return back("/ui/schedules", Err("unknown state filter".into()));
        }
    };
    let after = match blank(q.after.clone()).map(|a| uuid::Uuid::parse_str(&a)) {
        None => None,
        Some(Ok(a)) => Some(ScheduleId(a)),
        Some(Err(_)) => return back("/ui/schedules", Err("malformed page cursor".into())),
    };
    let (queue, zone) = (blank(q.queue.clone()), blank(q.zone.clone()));
    let rows = match state
        .store
        .schedule_list(ScheduleList {
            tenant,
            state: st,
            queue: queue.clone(),
            timezone: zone.clone(),
            after,
            limit: PAGE,
        })
        .await
    {
        Ok(r) => r,
        Err(e) => return failed(&s, &ApiError::from(e)),
    };
    let now = match store_now(&state, &s).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let items: Vec<Value> = rows
        .iter()
        .map(|r| {
            let next = campanile_planner::schedules::upcoming(r, now, 1);
            serde_json::to_value(ScheduleOut::new(r, next)).unwrap_or(Value::Null)
        })
        .collect();
    let next = (rows.len() as u32 == PAGE)
        .then(|| rows.last().map(|r| r.id.0.to_string()))
        .flatten();
    let filters = json!({
        "state": q.state.clone().unwrap_or_default(),
        "queue": queue.clone().unwrap_or_default(),
        "zone": zone.clone().unwrap_or_default(),
    });
    let more = next.map(|n| {
        with_query(
            "/ui/schedules",
            &[
                ("state", q.state.as_deref().unwrap_or_default()),
                ("queue", queue.as_deref().unwrap_or_default()),
                ("zone", zone.as_deref().unwrap_or_default()),
                ("after", &n),
            ],
        )
    });
    page(
        StatusCode::OK,
        "schedules.html",
        merge(
            base(&s, "schedules", &q.notice.notice()),
            json!({"schedules": items, "filters": filters, "next": more,
                   "paged": after.is_some(),
                   "states": ["ACTIVE", "PAUSED", "CANCELED", "FINISHED"]}),
        ),
    )
}

/// One schedule: its definition, versions, next fires in its zone and in UTC with each DST
/// decision, its recent occurrences, and what can be done to it.
pub(crate) async fn schedule(
    State(state): State<AppState>,
    s: Signed,
    Path(id): Path<String>,
    Query(q): Query<Notice>,
) -> Response {
    let tenant = match tenant_of(&s) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let Ok(id) = uuid::Uuid::parse_str(&id).map(ScheduleId) else {
        return not_found(&s, "schedule");
    };
    let get = ScheduleGet { tenant, id };
    let rec = match state.store.schedule_get(get.clone()).await {
        Ok(Some(r)) => r,
        Ok(None) => return not_found(&s, "schedule"),
        Err(e) => return failed(&s, &ApiError::from(e)),
    };
    let versions = match state.store.schedule_versions(get).await {
        Ok(v) => v,
        Err(e) => return failed(&s, &ApiError::from(e)),
    };
    let now = match store_now(&state, &s).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let fires = campanile_planner::calendar_of(&rec.spec)
        .map_err(|e| ApiError::invalid(e.to_string()))
        .and_then(|cal| super::super::schedules::fires_of(&rec.spec, &cal, now, 10));
    let fires = match fires {
        Ok(f) => serde_json::to_value(f).unwrap_or(Value::Null),
        Err(e) => json!({"error": e.message()}),
    };
    let from = now
        .checked_sub(SignedDuration::from_hours(24))
        .unwrap_or(now);
    let recent = state
        .store
        .occurrence_list(OccurrenceList {
            tenant,
            schedule_id: Some(id),
            from: Some(from),
            limit: PAGE,
            now: Some(now),
            ..Default::default()
        })
        .await
        .unwrap_or_default();
    let recent: Vec<Value> = recent
        .iter()
        .map(|o| serde_json::to_value(OccurrenceOut::new(o)).unwrap_or(Value::Null))
        .collect();
    let versions: Vec<Value> = versions
        .iter()
        .rev()
        .map(|v| {
            let shown = campanile_store::ScheduleRecord {
                version: v.version,
                spec: v.spec.clone(),
                ..rec.clone()
            };
            json!({"version": v.version, "created_at": v.created_at.to_string(),
                   "definition": serde_json::to_value(ScheduleOut::new(&shown, vec![])).unwrap_or(Value::Null)})
        })
        .collect();
    let out = serde_json::to_value(ScheduleOut::new(&rec, vec![])).unwrap_or(Value::Null);
    let default_from = now
        .checked_sub(SignedDuration::from_hours(6))
        .unwrap_or(now);
    page(
        StatusCode::OK,
        "schedule.html",
        merge(
            base(&s, "schedules", &q),
            json!({"s": out, "state": rec.state.as_str(), "versions": versions,
                   "fires": fires, "recent": recent,
                   "backfill_from": default_from.strftime("%Y-%m-%dT%H:00:00Z").to_string(),
                   "backfill_to": now.strftime("%Y-%m-%dT%H:00:00Z").to_string()}),
        ),
    )
}

#[derive(Debug, Deserialize)]
pub(crate) struct ActionForm {
    csrf: String,
    from: Option<String>,
    to: Option<String>,
}

/// Pause, resume, cancel, run now or backfill a schedule.
pub(crate) async fn schedule_action(
    State(state): State<AppState>,
    s: Signed,
    Path((id, action)): Path<(String, String)>,
    Form(f): Form<ActionForm>,
) -> Response {
    if f.csrf != s.csrf {
        return csrf_refused(&s);
    }
    let tenant = match tenant_of(&s) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let Ok(sid) = uuid::Uuid::parse_str(&id).map(ScheduleId) else {
        return not_found(&s, "schedule");
    };
    let to_page = format!("/ui/schedules/{}", sid.0);
    let transition = |to: ScheduleState, done: &'static str| {
        let state = state.clone();
        async move {
            let r = state.schedules.transition(tenant, sid, to, None).await;
            if let Some(p) = &state.planner {
                p.notify();
            }
            r.map(|(_, c)| {
                if c.canceled > 0 {
                    format!("{done} ({} pending occurrences canceled)", c.canceled)
                } else {
                    done.to_string()
                }
            })
            .map_err(|e| ApiError::from(e).message().to_string())
        }
    };
    let outcome = match action.as_str() {
        "pause" => transition(ScheduleState::Paused, "Paused.").await,
        "resume" => transition(ScheduleState::Active, "Resumed.").await,
        "cancel" => transition(ScheduleState::Canceled, "Canceled.").await,
        "trigger" => state
            .store
            .schedule_trigger(ScheduleTrigger {
                tenant,
                id: sid,
                key: None,
                payload: None,
                now: None,
            })
            .await
            .map(|t| {
                if let Some(p) = &state.planner {
                    p.notify();
                }
                format!("Run now: occurrence {} is ready.", t.occurrence_id.0)
            })
            .map_err(|e| ApiError::from(e).message().to_string()),
        "backfill" => {
            let parse = |name: &str, v: Option<String>| {
                let v = blank(v).ok_or_else(|| format!("{name} is required"))?;
                campanile_calendar::parse_instant(&v).map_err(|e| format!("{name}: {e}"))
            };
            match (parse("from", f.from), parse("to", f.to)) {
                (Ok(from), Ok(to)) => state
                    .schedules
                    .backfill(tenant, sid, from, to, None, None, None)
                    .await
                    .map(|b| {
                        format!(
                            "Backfill: {} instants, {} made, {} run again, {} already there.",
                            b.instants,
                            b.created.len(),
                            b.rerun.len(),
                            b.existing.len()
                        )
                    })
                    .map_err(|e| ApiError::from(e).message().to_string()),
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        }
        _ => return not_found(&s, "action"),
    };
    // Not found stays not found (another tenant's id): no page that names it.
    if let Err(m) = &outcome
        && m.starts_with("schedule ")
        && m.contains(&sid.0.to_string())
    {
        return not_found(&s, "schedule");
    }
    back(&to_page, outcome)
}

// ── Occurrences ──

#[derive(Debug, Default, Deserialize)]
pub(crate) struct OccurrencesQuery {
    state: Option<String>,
    schedule: Option<String>,
    from: Option<String>,
    to: Option<String>,
    after: Option<String>,
    #[serde(flatten)]
    notice: NoticeFields,
}

/// The tenant's occurrences: by state, schedule and planned-time range, a page at a time.
pub(crate) async fn occurrences(
    State(state): State<AppState>,
    s: Signed,
    Query(q): Query<OccurrencesQuery>,
) -> Response {
    let tenant = match tenant_of(&s) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let st = match blank(q.state.clone()).map(|x| crate::dto::parse_state(&x)) {
        None => None,
        Some(Ok(st)) => Some(st),
        Some(Err(_)) => return back("/ui/occurrences", Err("unknown state filter".into())),
    };
    let schedule = match blank(q.schedule.clone()).map(|x| uuid::Uuid::parse_str(&x)) {
        None => None,
        Some(Ok(id)) => Some(ScheduleId(id)),
        Some(Err(_)) => {
            return back(
                "/ui/occurrences",
                Err("the schedule filter is a schedule id (a UUID)".into()),
            );
        }
    };
    let instant = |name: &str, v: Option<String>| -> Result<Option<Timestamp>, String> {
        blank(v)
            .map(|v| campanile_calendar::parse_instant(&v).map_err(|e| format!("{name}: {e}")))
            .transpose()
    };
    let (from, to) = match (instant("from", q.from.clone()), instant("to", q.to.clone())) {
        (Ok(f), Ok(t)) => (f, t),
        (Err(e), _) | (_, Err(e)) => return back("/ui/occurrences", Err(e)),
    };
    let after = match blank(q.after.clone()) {
        None => None,
        Some(a) => {
            let parsed = a.split_once('_').and_then(|(t, id)| {
                Some((
                    Timestamp::from_millisecond(t.parse().ok()?).ok()?,
                    OccurrenceId(uuid::Uuid::parse_str(id).ok()?),
                ))
            });
            match parsed {
                Some(p) => Some(p),
                None => return back("/ui/occurrences", Err("malformed page cursor".into())),
            }
        }
    };
    let rows = match state
        .store
        .occurrence_list(OccurrenceList {
            tenant,
            schedule_id: schedule,
            state: st,
            from,
            to,
            after,
            limit: PAGE,
            now: None,
        })
        .await
    {
        Ok(r) => r,
        Err(e) => return failed(&s, &ApiError::from(e)),
    };
    let items: Vec<Value> = rows
        .iter()
        .map(|o| serde_json::to_value(OccurrenceOut::new(o)).unwrap_or(Value::Null))
        .collect();
    let next = (rows.len() as u32 == PAGE)
        .then(|| {
            rows.last().map(|o| {
                let after = format!("{}_{}", o.scheduled_for.as_millisecond(), o.id.0);
                with_query(
                    "/ui/occurrences",
                    &[
                        ("state", q.state.as_deref().unwrap_or_default()),
                        ("schedule", q.schedule.as_deref().unwrap_or_default()),
                        ("from", q.from.as_deref().unwrap_or_default()),
                        ("to", q.to.as_deref().unwrap_or_default()),
                        ("after", &after),
                    ],
                )
            })
        })
        .flatten();
    let filters = json!({
        "state": q.state.clone().unwrap_or_default(),
        "schedule": q.schedule.clone().unwrap_or_default(),
        "from": q.from.clone().unwrap_or_default(),
        "to": q.to.clone().unwrap_or_default(),
    });
    page(
        StatusCode::OK,
        "occurrences.html",
        merge(
            base(&s, "occurrences", &q.notice.notice()),
            json!({"occurrences": items, "filters": filters, "next": next,
                   "states": ["SCHEDULED", "READY", "RUNNING", "RETRY_WAIT", "SUCCEEDED",
                              "DEAD", "CANCELED", "MISSED", "SKIPPED_OVERLAP"]}),
        ),
    )
}

/// One occurrence with every attempt.
pub(crate) async fn occurrence(
    State(state): State<AppState>,
    s: Signed,
    Path(id): Path<String>,
    Query(q): Query<Notice>,
) -> Response {
    let tenant = match tenant_of(&s) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let Ok(oid) = uuid::Uuid::parse_str(&id).map(OccurrenceId) else {
        return not_found(&s, "occurrence");
    };
    let d = match state
        .store
        .occurrence_get(OccurrenceGet {
            tenant,
            key: OccurrenceKey::Id(oid),
            now: None,
        })
        .await
    {
        Ok(Some(d)) => d,
        Ok(None) => return not_found(&s, "occurrence"),
        Err(e) => return failed(&s, &ApiError::from(e)),
    };
    let st = d.occurrence.state;
    let out = serde_json::to_value(OccurrenceOut::detail(&d)).unwrap_or(Value::Null);
    page(
        StatusCode::OK,
        "occurrence.html",
        merge(
            base(&s, "occurrences", &q),
            json!({"o": out,
                   "can_redrive": st == OccurrenceState::Dead,
                   "can_cancel": matches!(st, OccurrenceState::Scheduled | OccurrenceState::Ready
                        | OccurrenceState::RetryWait | OccurrenceState::Running)
                        && !d.occurrence.cancel_requested}),
        ),
    )
}

/// Redrive a dead occurrence, or cancel a pending (or ask a running one to stop).
pub(crate) async fn occurrence_action(
    State(state): State<AppState>,
    s: Signed,
    Path((id, action)): Path<(String, String)>,
    Form(f): Form<CsrfForm>,
) -> Response {
    if f.csrf != s.csrf {
        return csrf_refused(&s);
    }
    let tenant = match tenant_of(&s) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let Ok(oid) = uuid::Uuid::parse_str(&id).map(OccurrenceId) else {
        return not_found(&s, "occurrence");
    };
    let ack: Result<Ack, _> = match action.as_str() {
        "redrive" => {
            state
                .store
                .occurrence_redrive(OccurrenceRedrive {
                    tenant,
                    occurrence_id: oid,
                    now: None,
                })
                .await
        }
        "cancel" => {
            state
                .store
                .occurrence_cancel(OccurrenceCancel {
                    tenant,
                    occurrence_id: oid,
                    now: None,
                })
                .await
        }
        _ => return not_found(&s, "action"),
    };
    let to_page = format!("/ui/occurrences/{}", oid.0);
    match ack {
        Ok(a) if a.conflict.as_ref().map(|c| c.check()) == Some("not_found") => {
            not_found(&s, "occurrence")
        }
        Ok(a) => match (&a.conflict, a.state) {
            (None, Some(st)) => back(
                &to_page,
                Ok(format!("Done: the occurrence is {}.", st.as_str())),
            ),
            (None, None) => back(&to_page, Ok("Done.".into())),
            (Some(c), _) => back(&to_page, Err(format!("Refused: {c}"))),
        },
        Err(e) => back(&to_page, Err(ApiError::from(e).message().to_string())),
    }
}

// ── Tenants (admin) ──

/// Every tenant with its class, retention, quotas and per-queue limits.
pub(crate) async fn tenants(
    State(state): State<AppState>,
    s: Signed,
    Query(q): Query<Notice>,
) -> Response {
    if !s.is_admin() {
        return problem(
            Some(&s),
            StatusCode::FORBIDDEN,
            "An admin key is needed",
            "Tenants, their quotas and limits are shown to admin keys.",
        );
    }
    let list = match state.store.tenant_list().await {
        Ok(l) => l,
        Err(e) => return failed(&s, &ApiError::from(e)),
    };
    let mut rows = Vec::with_capacity(list.len());
    for t in &list {
        let quota = state
            .store
            .tenant_quota_get(TenantQuotaGet { tenant: t.id })
            .await
            .ok();
        let limits = state
            .store
            .queue_limit_list(QueueLimitList { tenant: t.id })
            .await
            .unwrap_or_default();
        rows.push(json!({
            "name": t.name,
            "created_at": t.created_at.to_string(),
            "class": t.class,
            "retention": format!("{:?}", t.retention),
            "max_active_schedules": quota.as_ref().and_then(|q| q.max_active_schedules),
            "max_running": quota.as_ref().and_then(|q| q.max_running),
            "max_triggers_per_sec": quota.as_ref().and_then(|q| q.max_triggers_per_sec),
            "max_catchup_per_sec": quota.as_ref().and_then(|q| q.max_catchup_per_sec),
            "limits": limits.iter().map(|l| json!({"queue": l.queue, "max_running": l.max_running})).collect::<Vec<_>>(),
        }));
    }
    page(
        StatusCode::OK,
        "tenants.html",
        merge(base(&s, "tenants", &q), json!({"tenants": rows})),
    )
}

/// The store's clock (a page that needs it fails with the store).
async fn store_now(state: &AppState, s: &Signed) -> Result<Timestamp, Response> {
    state
        .store
        .store_now()
        .await
        .map_err(|e| failed(s, &ApiError::from(e)))
}
