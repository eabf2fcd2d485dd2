//! `/v1/schedules`: create (idempotent), read, list, update, pause, resume, cancel, preview.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use campanile_calendar::{FireNote, Zone};
use campanile_core::ScheduleId;
use campanile_store::{
    IdempotencyFinish, IdempotencyGet, IdempotencyPut, IdempotencyToken, OccurrenceGet,
    OccurrenceKey, ScheduleChange, ScheduleState, ScheduleTrigger,
};
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::body::{JsonBody, OptionalJsonBody, PathParams, QueryParams};
use crate::dto::{
    DstDto, InFlight, OccurrenceOut, ScheduleChangeOut, ScheduleInput, ScheduleList, ScheduleOut,
};
use crate::{ApiError, AppState, ErrorBody};

pub(crate) fn parse_schedule_id(s: &str) -> Result<ScheduleId, ApiError> {
    uuid::Uuid::parse_str(s)
        .map(ScheduleId)
        .map_err(|_| ApiError::malformed_id("schedule", s))
}

fn change_out(c: ScheduleChange, next: Vec<Timestamp>) -> ScheduleChangeOut {
    metrics::counter!("campanile_occurrences_canceled_total").increment(c.canceled);
    ScheduleChangeOut {
        schedule: ScheduleOut::new(&c.schedule, next),
        canceled: c.canceled,
        in_flight: c
            .in_flight
            .iter()
            .map(|(id, st)| InFlight {
                id: *id,
                state: st.as_str().into(),
            })
            .collect(),
    }
}

/// Create a schedule. With an `Idempotency-Key` header, a retried request returns the first
/// answer instead of creating a second schedule.
#[utoipa::path(post, path = "/v1/schedules", request_body = ScheduleInput, tag = "schedules",
    params(("Idempotency-Key" = Option<String>, Header, nullable = false,
        description = "Makes retries safe: 1 to 255 visible ASCII characters (spaces inside)",
        min_length = 1, max_length = 255, pattern = r"^[\x21-\x7E]([\x20-\x7E]*[\x21-\x7E])?$")),
    responses((status = 201, body = ScheduleOut), (status = 422, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 409, description = "`request_in_progress`: a request with this Idempotency-Key is being served", body = ErrorBody),
        (status = 429, description = "`quota_exceeded`", body = ErrorBody)))]
pub(crate) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: JsonBody<ScheduleInput>,
) -> Result<Response, ApiError> {
    let idem = idempotency_key(&headers)?;
    if body.value.version.is_some() {
        return Err(ApiError::invalid("version is only accepted by PATCH"));
    }
    let now = state.store.store_now().await?;
    let spec = body.value.to_spec(now)?;
    check_route(&state, &spec)?;
    let Some(key) = idem else {
        let out = create_now(&state, caller, spec, None, now).await?;
        return Ok((StatusCode::CREATED, Json(out)).into_response());
    };
    // Reserve the key before creating, so two concurrent first requests cannot both create.
    // The request as JSON means it, not as bytes: a client that re-serializes its retry with
    // other spacing or key order sends the same request (serde_json's maps sort their keys).
    // Keys reserved by a version that hashed the raw bytes still match those bytes.
    let raw_hash = crate::auth::hash_key(&String::from_utf8_lossy(&body.raw));
    let request_hash = serde_json::from_slice::<serde_json::Value>(&body.raw)
        .map(|v| crate::auth::hash_key(&v.to_string()))
        .unwrap_or_else(|_| raw_hash.clone());
    // The reservation names this request (`token`): the create commits only while it still
    // holds it, and records the schedule on it in the same transaction.
    let token = uuid::Uuid::new_v4().to_string();
    let reserved = state
        .store
        .idempotency_put(IdempotencyPut {
            tenant: caller.tenant,
            key: key.clone(),
            request_hash: request_hash.clone(),
            status: 0,
            body: String::new(),
            token: token.clone(),
            take_over_after: IDEMPOTENCY_TAKE_OVER,
            now: None,
        })
        .await?;
    if !reserved {
        let prev = state
            .store
            .idempotency_get(IdempotencyGet {
                tenant: caller.tenant,
                key: key.clone(),
            })
            .await?
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::CONFLICT,
                    "request_in_progress",
                    "a request with this Idempotency-Key just finished failing; retry",
                )
            })?;
        if prev.request_hash != request_hash && prev.request_hash != raw_hash {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "this Idempotency-Key was used for a different request",
            ));
        }
        if prev.status == 0 {
            // Its create committed, but its request ended before recording the answer (a node
            // killed, the database lost meanwhile): answer from the schedule, and record that.
            if let Some(id) = prev.schedule_id {
                let view = state
                    .schedules
                    .get(caller.tenant, id, None)
                    .await?
                    .ok_or_else(|| ApiError::not_found(format!("schedule {id}")))?;
                let out = ScheduleOut::new(&view.record, view.next_fires);
                let text = serde_json::to_string(&out).unwrap_or_default();
                state
                    .store
                    .idempotency_finish(IdempotencyFinish {
                        tenant: caller.tenant,
                        key: key.clone(),
                        token: token.clone(),
                        answer: Some((201, text)),
                    })
                    .await?;
                return Ok((StatusCode::CREATED, Json(out)).into_response());
            }
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "request_in_progress",
                format!(
                    "a request with this Idempotency-Key is still being processed; retry shortly \
                     (if that request died, a retry takes its place {} s after it began)",
                    IDEMPOTENCY_TAKE_OVER.as_secs()
                ),
            ));
        }
        let status = StatusCode::from_u16(prev.status).unwrap_or(StatusCode::OK);
        // The stored answer as it was written (a Value would round big numbers).
        let value = crate::dto::stored_json(&prev.body);
        return Ok((status, Json(value)).into_response());
    }
    let held = IdempotencyToken {
        key: key.clone(),
        token: token.clone(),
    };
    match create_now(&state, caller, spec, Some(held), now).await {
        Ok(out) => {
            let text = serde_json::to_string(&out).unwrap_or_default();
            state
                .store
                .idempotency_finish(IdempotencyFinish {
                    tenant: caller.tenant,
                    key: key.clone(),
                    token: token.clone(),
                    answer: Some((201, text)),
                })
                .await?;
            Ok((StatusCode::CREATED, Json(out)).into_response())
        }
        Err(e) => {
            // Release the key if the request created nothing (the store keeps a reservation
            // whose schedule was created), so a retry may try again.
            let _ = state
                .store
                .idempotency_finish(IdempotencyFinish {
                    tenant: caller.tenant,
                    key: key.clone(),
                    token: token.clone(),
                    answer: None,
                })
                .await;
            Err(e)
        }
    }
}

/// A reservation of an `Idempotency-Key` whose request has neither answered nor created
/// anything after this long is taken over by a retry of the same request. Safe at any length:
/// the create of the request that lost it is refused (`StoreError::Superseded`).
const IDEMPOTENCY_TAKE_OVER: SignedDuration = SignedDuration::from_secs(10);

async fn create_now(
    state: &AppState,
    caller: Caller,
    spec: campanile_store::ScheduleSpec,
    idempotency: Option<IdempotencyToken>,
    now: Timestamp,
) -> Result<ScheduleOut, ApiError> {
    let view = state
        .schedules
        .create_under_key(caller.tenant, spec, idempotency, Some(now))
        .await?;
    if let Some(p) = &state.planner {
        p.notify();
    }
    Ok(ScheduleOut::new(&view.record, view.next_fires))
}

/// Query of `GET /v1/schedules`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    /// Page size (1–500, default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u32>,
    /// From the previous page's `next_cursor` (a schedule id).
    #[param(
        min_length = 1,
        pattern = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    cursor: Option<String>,
    /// `ACTIVE`, `PAUSED`, `CANCELED` or `FINISHED`, in either case.
    #[param(schema_with = crate::dto::schedule_state)]
    state: Option<String>,
    /// Only this queue (a queue name never holds NUL).
    #[param(pattern = r"^[^\u0000]*$")]
    queue: Option<String>,
}

/// List the tenant's schedules, oldest first.
#[utoipa::path(get, path = "/v1/schedules", operation_id = "list_schedules", params(ListQuery), tag = "schedules",
    responses((status = 200, body = ScheduleList), (status = 401, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Response, ApiError> {
    let limit = q.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 500"));
    }
    let after = q
        .cursor
        .as_deref()
        .map(|c| {
            uuid::Uuid::parse_str(c)
                .map(ScheduleId)
                .map_err(|_| ApiError::invalid("cursor is not one this API returned"))
        })
        .transpose()?;
    let st = q
        .state
        .as_deref()
        .map(|s| {
            ScheduleState::parse(&s.to_ascii_uppercase()).ok_or_else(|| {
                ApiError::invalid(format!(
                    "state '{}': expected ACTIVE, PAUSED, CANCELED or FINISHED",
                    campanile_calendar::echo(s)
                ))
            })
        })
        .transpose()?;
    // No queue name holds NUL (creation refuses control characters), and PostgreSQL cannot
    // compare text with one.
    if q.queue.as_deref().is_some_and(|q| q.contains('\0')) {
        return Err(ApiError::invalid("queue: a queue name never contains NUL"));
    }
    let now = state.store.store_now().await?;
    let mut hold = state
        .answers
        .hold(caller.tenant, crate::ANSWER_BYTES, crate::ANSWER_BYTES)
        .await;
    let mut page = crate::answers::AnswerBudget::new();
    let mut schedules = Vec::new();
    let (mut cursor, mut more, mut truncated) = (after, false, false);
    'read: while (schedules.len() as u32) < limit {
        let want = (limit - schedules.len() as u32).min(state.list_chunk);
        let rows = state
            .store
            .schedule_list(campanile_store::ScheduleList {
                tenant: caller.tenant,
                state: st,
                queue: q.queue.clone(),
                timezone: None,
                after: cursor,
                limit: want,
            })
            .await?;
        more = rows.len() as u32 == want;
        for r in &rows {
            let out = ScheduleOut::new(r, campanile_planner::schedules::upcoming(r, now, 5));
            if !page.fits(&out) {
                truncated = true;
                break 'read;
            }
            schedules.push(out);
            cursor = Some(r.id);
        }
        if !more {
            break;
        }
    }
    let next_cursor = (truncated || more)
        .then(|| cursor.map(|c| c.to_string()))
        .flatten();
    hold.shrink_to(page.used());
    Ok(hold.attach(
        Json(ScheduleList {
            schedules,
            next_cursor,
            truncated,
        })
        .into_response(),
    ))
}

/// One schedule, with its next 5 fire times.
#[utoipa::path(get, path = "/v1/schedules/{id}", operation_id = "get_schedule", tag = "schedules", params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = ScheduleOut), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(id): PathParams<String>,
) -> Result<Json<ScheduleOut>, ApiError> {
    let id = parse_schedule_id(&id)?;
    let view = state
        .schedules
        .get(caller.tenant, id, None)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("schedule {id}")))?;
    Ok(Json(ScheduleOut::new(&view.record, view.next_fires)))
}

/// Replace the definition (a new version). The body carries the `version` the caller read; a
/// stale version is a 409.
#[utoipa::path(patch, path = "/v1/schedules/{id}", tag = "schedules", request_body = ScheduleInput, params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = ScheduleChangeOut), (status = 409, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 429, description = "`quota_exceeded`", body = ErrorBody)))]
pub(crate) async fn update(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(id): PathParams<String>,
    body: JsonBody<ScheduleInput>,
) -> Result<Json<ScheduleChangeOut>, ApiError> {
    let id = parse_schedule_id(&id)?;
    let version = body
        .value
        .version
        .ok_or_else(|| ApiError::invalid("version is required: send the version you read"))?;
    let now = state.store.store_now().await?;
    let spec = body.value.to_spec(now)?;
    check_route(&state, &spec)?;
    let (view, change) = state
        .schedules
        .update(caller.tenant, id, version, spec, Some(now))
        .await?;
    if let Some(p) = &state.planner {
        p.notify();
    }
    Ok(Json(change_out(change, view.next_fires)))
}

async fn transition(
    state: AppState,
    caller: Caller,
    id: String,
    to: ScheduleState,
) -> Result<Json<ScheduleChangeOut>, ApiError> {
    let id = parse_schedule_id(&id)?;
    let (view, change) = state
        .schedules
        .transition(caller.tenant, id, to, None)
        .await?;
    if let Some(p) = &state.planner {
        p.notify();
    }
    Ok(Json(change_out(change, view.next_fires)))
}

/// The request's `Idempotency-Key`, if it has one; 400 if it is not 1 to 255 visible
/// characters.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers
        .get("idempotency-key")
        .map(|v| v.to_str().map(str::to_string))
    {
        Some(Ok(k)) if !k.is_empty() && k.len() <= 255 => Ok(Some(k)),
        Some(_) => Err(ApiError::bad_request(
            "Idempotency-Key must be 1 to 255 visible characters",
        )),
        None => Ok(None),
    }
}

/// The optional body of a trigger.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TriggerInput {
    /// This run's payload, any JSON, handed to its worker (or relayed) in place of the
    /// version's (default: the version's).
    #[schema(value_type = Option<Value>)]
    payload: Option<Box<serde_json::value::RawValue>>,
}

/// Run a schedule now: one occurrence of its current version, ready at once and marked
/// `manual`, under the schedule's queue, priority, retries, lease and overlap policy, with the
/// version's payload or the one the body gives (the body may be left out). With an
/// `Idempotency-Key`, a trigger sent again answers the occurrence the first made (200)
/// instead of making another; the same key with another payload is refused (422). A paused or
/// canceled schedule is not run (409).
#[utoipa::path(post, path = "/v1/schedules/{id}/trigger", tag = "schedules",
    request_body(content = Option<TriggerInput>, description = "optional: the run's own payload"),
    params(("id" = String, Path, format = Uuid),
        ("Idempotency-Key" = Option<String>, Header, nullable = false,
        description = "Makes retries safe: 1 to 255 visible ASCII characters (spaces inside)",
        min_length = 1, max_length = 255, pattern = r"^[\x21-\x7E]([\x20-\x7E]*[\x21-\x7E])?$")),
    responses((status = 201, body = OccurrenceOut), (status = 200, description = "sent again with its key: the occurrence the first made", body = OccurrenceOut),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn trigger(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    PathParams(id): PathParams<String>,
    body: OptionalJsonBody<TriggerInput>,
) -> Result<Response, ApiError> {
    let id = parse_schedule_id(&id)?;
    let key = idempotency_key(&headers)?;
    let payload = body
        .0
        .and_then(|b| b.value.payload)
        .map(|p| p.get().to_string());
    let t = state
        .store
        .schedule_trigger(ScheduleTrigger {
            tenant: caller.tenant,
            id,
            key,
            payload,
            now: None,
        })
        .await?;
    let detail = state
        .store
        .occurrence_get(OccurrenceGet {
            tenant: caller.tenant,
            key: OccurrenceKey::Id(t.occurrence_id),
            now: None,
        })
        .await?
        .ok_or_else(|| ApiError::not_found(format!("occurrence {}", t.occurrence_id.0)))?;
    let status = if t.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(OccurrenceOut::detail(&detail))).into_response())
}

/// The body of a backfill.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BackfillInput {
    /// The range's start: instants at or after it (RFC 3339).
    #[serde(deserialize_with = "crate::dto::req_instant")]
    #[schema(value_type = String, format = DateTime)]
    from: Timestamp,
    /// The range's end: instants before it (RFC 3339), at most now.
    #[serde(deserialize_with = "crate::dto::req_instant")]
    #[schema(value_type = String, format = DateTime)]
    to: Timestamp,
    /// Overlap policy for the occurrences made (default: the schedule's).
    #[schema(schema_with = crate::dto::overlap_policy)]
    overlap: Option<String>,
}

/// What a backfill made and found.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BackfillOut {
    /// The backfill (the same when sent again with its `Idempotency-Key`).
    backfill_id: uuid::Uuid,
    /// The schedule.
    #[schema(value_type = String, format = Uuid)]
    schedule_id: ScheduleId,
    /// The version whose instants were backfilled (the current one when it ran).
    version: u32,
    /// The range's start.
    #[schema(value_type = String, format = DateTime)]
    from: Timestamp,
    /// The range's end (excluded).
    #[schema(value_type = String, format = DateTime)]
    to: Timestamp,
    /// How many instants of the calendar the range holds.
    instants: u32,
    /// The occurrences made, marked `backfill`, available at the tenant's catch-up pace.
    created: Vec<OccurrenceOut>,
    /// Occurrences the misfire policy had recorded `MISSED` (they never ran), made `READY`
    /// again under the same id, marked `backfill` and paced like the made ones.
    rerun: Vec<OccurrenceOut>,
    /// Instants whose occurrence of this version ran, runs, waits, or was canceled or skipped
    /// on purpose: listed, not run again.
    existing: Vec<OccurrenceOut>,
    /// True when answered from an earlier backfill with the same `Idempotency-Key`.
    replayed: bool,
}

/// Backfill a past range: one occurrence per instant of the schedule's current version in
/// `[from, to)` that has none (at most 1000 instants; more is a 422), and each one recorded
/// `MISSED` (it never ran) made `READY` again, all marked `backfill` and made available at the
/// tenant's catch-up rate (`max_catchup_per_sec`) or at once without one. Instants whose
/// occurrence ran, runs, waits, or was canceled or skipped on purpose are listed, not run
/// again. With an
/// `Idempotency-Key`, a backfill sent again answers what the first made (200). A paused or
/// canceled schedule is not backfilled (409).
#[utoipa::path(post, path = "/v1/schedules/{id}/backfill", tag = "schedules", request_body = BackfillInput,
    params(("id" = String, Path, format = Uuid),
        ("Idempotency-Key" = Option<String>, Header, nullable = false,
        description = "Makes retries safe: 1 to 255 visible ASCII characters (spaces inside)",
        min_length = 1, max_length = 255, pattern = r"^[\x21-\x7E]([\x20-\x7E]*[\x21-\x7E])?$")),
    responses((status = 201, description = "occurrences were made", body = BackfillOut),
        (status = 200, description = "nothing new: every instant had an occurrence, or sent again with its key", body = BackfillOut),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn backfill(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    PathParams(id): PathParams<String>,
    body: JsonBody<BackfillInput>,
) -> Result<Response, ApiError> {
    let id = parse_schedule_id(&id)?;
    let key = idempotency_key(&headers)?;
    let b = body.value;
    let from = crate::dto::rfc3339_instant("from", b.from)?;
    let to = crate::dto::rfc3339_instant("to", b.to)?;
    let overlap = b
        .overlap
        .map(|o| o.parse::<campanile_core::Overlap>())
        .transpose()
        .map_err(|e| ApiError::invalid(format!("overlap: {e}")))?;
    let done = state
        .schedules
        .backfill(caller.tenant, id, from, to, overlap, key, None)
        .await?;
    let made_something = !done.created.is_empty() || !done.rerun.is_empty();
    let status = if made_something && !done.replayed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    metrics::counter!("campanile_occurrences_backfilled_total").increment(if done.replayed {
        0
    } else {
        done.created.len() as u64
    });
    let out = BackfillOut {
        backfill_id: done.backfill_id,
        schedule_id: id,
        version: done.version,
        from: done.from,
        to: done.to,
        instants: done.instants,
        created: done.created.iter().map(OccurrenceOut::new).collect(),
        rerun: done.rerun.iter().map(OccurrenceOut::new).collect(),
        existing: done.existing.iter().map(OccurrenceOut::new).collect(),
        replayed: done.replayed,
    };
    Ok((status, Json(out)).into_response())
}

/// Pause: unclaimed occurrences are canceled; on resume, what was missed follows the misfire
/// policy.
#[utoipa::path(post, path = "/v1/schedules/{id}/pause", tag = "schedules", params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = ScheduleChangeOut), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn pause(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(id): PathParams<String>,
) -> Result<Json<ScheduleChangeOut>, ApiError> {
    transition(state, caller, id, ScheduleState::Paused).await
}

/// Resume a paused schedule.
#[utoipa::path(post, path = "/v1/schedules/{id}/resume", tag = "schedules", params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = ScheduleChangeOut), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 429, description = "`quota_exceeded`", body = ErrorBody)))]
pub(crate) async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(id): PathParams<String>,
) -> Result<Json<ScheduleChangeOut>, ApiError> {
    transition(state, caller, id, ScheduleState::Active).await
}

/// Cancel for good. History stays queryable.
#[utoipa::path(post, path = "/v1/schedules/{id}/cancel", operation_id = "cancel_schedule", tag = "schedules", params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = ScheduleChangeOut), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(id): PathParams<String>,
) -> Result<Json<ScheduleChangeOut>, ApiError> {
    transition(state, caller, id, ScheduleState::Canceled).await
}

/// Body of `POST /v1/schedules/preview`: a timing as a create takes it (`cron` with its
/// `timezone` and `dst`, `every` with its `anchor`, or `at`), or a whole create body, checked
/// by the same rules; plus `after` and `count`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PreviewInput {
    /// As a create's `queue` (optional here).
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^\s$\u0000-\u001F\u007F-\u009F\u00AD\u200B-\u200F\u2028-\u202E\u2060-\u2064\u2066-\u206F\uFEFF]([^\u0000-\u001F\u007F-\u009F\u00AD\u200B-\u200F\u2028-\u202E\u2060-\u2064\u2066-\u206F\uFEFF]*[^\s\u0000-\u001F\u007F-\u009F\u00AD\u200B-\u200F\u2028-\u202E\u2060-\u2064\u2066-\u206F\uFEFF])?$"
    )]
    queue: Option<String>,
    /// As a create's `target`.
    target: Option<crate::dto::TargetDto>,
    /// As a create's `payload`.
    #[schema(value_type = Option<Value>)]
    payload: Option<Box<serde_json::value::RawValue>>,
    /// As a create's `priority`.
    priority: Option<i32>,
    /// As a create's `lease_seconds` (1–86400).
    #[schema(minimum = 1, maximum = 86400)]
    lease_seconds: Option<i64>,
    /// As a create's `misfire`.
    misfire: Option<crate::dto::MisfireDto>,
    /// As a create's `overlap`.
    #[schema(schema_with = crate::dto::overlap_policy)]
    overlap: Option<String>,
    /// As a create's `flex_window_seconds` (0–86400).
    #[schema(minimum = 0, maximum = 86400)]
    flex_window_seconds: Option<i64>,
    /// As a create's `retry`.
    retry: Option<crate::dto::RetryDto>,
    /// Cron expression (5 or 6 fields, or a macro).
    #[schema(min_length = 1)]
    cron: Option<String>,
    /// IANA zone for `cron` (default UTC), as a schedule's `timezone`.
    #[schema(
        min_length = 1,
        pattern = r"^[A-Za-z][A-Za-z0-9._+-]*(/[A-Za-z][A-Za-z0-9._+-]*)*$"
    )]
    timezone: Option<String>,
    /// DST options (cron only).
    dst: Option<DstDto>,
    /// Fixed interval, as a schedule's `every` (`"90s"`, `"1h 30m"`, `"PT15M"`).
    #[schema(min_length = 1)]
    every: Option<String>,
    /// First instant of an `every` series (default: now).
    #[serde(default, deserialize_with = "crate::dto::opt_instant")]
    #[schema(value_type = Option<String>, format = DateTime)]
    anchor: Option<Timestamp>,
    /// A one-off instant, as a schedule's `at`.
    #[serde(default, deserialize_with = "crate::dto::opt_instant")]
    #[schema(value_type = Option<String>, format = DateTime)]
    at: Option<Timestamp>,
    /// Fire times after this instant (default now).
    #[serde(default, deserialize_with = "crate::dto::opt_instant")]
    #[schema(value_type = Option<String>, format = DateTime)]
    after: Option<Timestamp>,
    /// How many (1–1000, default 10).
    #[schema(minimum = 1, maximum = 1000)]
    count: Option<usize>,
}

/// The answer of a preview.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PreviewOut {
    /// The next fire times, UTC.
    #[schema(value_type = Vec<String>)]
    next_fires: Vec<Timestamp>,
    /// The zone the wall times are in (`UTC` for `every` and `at`).
    timezone: String,
    /// The same fire times, each with its wall time in `timezone` and what the DST rules
    /// decided on the way to it.
    fires: Vec<PreviewFire>,
}

/// One fire time of a preview.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PreviewFire {
    /// The instant, UTC.
    #[schema(value_type = String, format = DateTime)]
    at: Timestamp,
    /// Its wall time and offset in the preview's zone, e.g. `2026-03-08T03:00:00-04:00`.
    local: String,
    /// Set when a DST rule shaped this fire: `after_skipped_gap` (wall times in a
    /// spring-forward gap were skipped; this is the first fire after it), `shifted_from_gap`
    /// (this fire stands for a wall time inside the gap), `fold_earlier` / `fold_later` (the
    /// wall time occurs twice; this is its first / second instant).
    #[schema(nullable = true)]
    dst: Option<&'static str>,
    /// The wall time the DST decision was about (the first skipped or shifted one).
    #[schema(nullable = true)]
    dst_wall_time: Option<String>,
}

/// List the next fire times of a timing, with each DST decision labelled, without saving
/// anything: the same checks as a create.
#[utoipa::path(post, path = "/v1/schedules/preview", tag = "schedules", request_body = PreviewInput,
    responses((status = 200, body = PreviewOut), (status = 422, body = ErrorBody)))]
pub(crate) async fn preview(
    State(state): State<AppState>,
    _caller: Caller,
    body: JsonBody<PreviewInput>,
) -> Result<Json<PreviewOut>, ApiError> {
    let p = body.value;
    let count = p.count.unwrap_or(10);
    if !(1..=1000).contains(&count) {
        return Err(ApiError::invalid("count must be between 1 and 1000"));
    }
    let now = state.store.store_now().await?;
    let after = match p.after {
        Some(a) => crate::dto::rfc3339_instant("after", a)?,
        None => now,
    };
    // Checked as a create would check it (a timing alone is previewed as if for a queue).
    let queue = match (&p.queue, &p.target) {
        (None, None) => Some("preview".into()),
        _ => p.queue,
    };
    let input = ScheduleInput {
        version: None,
        queue,
        target: p.target,
        cron: p.cron,
        timezone: p.timezone,
        at: p.at,
        every: p.every,
        anchor: p.anchor,
        payload: p.payload,
        priority: p.priority,
        lease_seconds: p.lease_seconds,
        misfire: p.misfire,
        overlap: p.overlap,
        flex_window_seconds: p.flex_window_seconds,
        retry: p.retry,
        dst: p.dst,
    };
    let spec = input.to_spec(now)?;
    // Every rule of a create (queue, lease, retries, misfire bounds), then the calendar.
    let cal = campanile_planner::schedules::validate(&spec)?;
    Ok(Json(fires_of(&spec, &cal, after, count)?))
}

/// The next `count` fires of `spec` (whose calendar is `cal`) after `after`, each with its
/// wall time in the schedule's zone (UTC for `every` and `at`) and its DST decision.
pub(crate) fn fires_of(
    spec: &campanile_store::ScheduleSpec,
    cal: &campanile_calendar::Calendar,
    after: Timestamp,
    count: usize,
) -> Result<PreviewOut, ApiError> {
    let zone = match &spec.timing {
        campanile_store::Timing::Cron { timezone, .. } => {
            Zone::get(timezone).map_err(|e| ApiError::invalid(e.to_string()))?
        }
        _ => Zone::utc(),
    };
    let mut fires = Vec::with_capacity(count);
    let mut cursor = after;
    while fires.len() < count {
        let Some(fire) = cal.next_fire(cursor) else {
            break;
        };
        cursor = fire.at;
        let (dst, dst_wall_time) = match fire.note {
            Some(FireNote::AfterSkippedGap { wall }) => {
                (Some("after_skipped_gap"), Some(wall.to_string()))
            }
            Some(FireNote::ShiftedFromGap { wall }) => {
                (Some("shifted_from_gap"), Some(wall.to_string()))
            }
            Some(FireNote::FoldEarlier) => (Some("fold_earlier"), None),
            Some(FireNote::FoldLater) => (Some("fold_later"), None),
            _ => (None, None),
        };
        let offset = zone.tz().to_offset(fire.at);
        let secs = offset.seconds();
        fires.push(PreviewFire {
            at: fire.at,
            local: format!(
                "{}{}{:02}:{:02}",
                offset.to_datetime(fire.at),
                if secs < 0 { '-' } else { '+' },
                secs.abs() / 3600,
                secs.abs() / 60 % 60
            ),
            dst,
            dst_wall_time,
        });
    }
    Ok(PreviewOut {
        next_fires: fires.iter().map(|f| f.at).collect(),
        timezone: zone.name().to_string(),
        fires,
    })
}

/// Refuses an external target no node of this deployment delivers.
fn check_route(state: &AppState, spec: &campanile_store::ScheduleSpec) -> Result<(), ApiError> {
    if campanile_core::is_reserved_queue(&spec.queue) && !state.relay {
        return Err(ApiError::invalid(
            "this server relays to no NATS server, so a NATS target would never be delivered; \
             start campanile serve with --nats-url",
        ));
    }
    Ok(())
}
