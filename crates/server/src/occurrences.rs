//! Occurrences as records: listed by schedule, state and time, and read one by id or by its
//! planned instant.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use campanile_core::{OccurrenceId, ScheduleId};
use campanile_store::{OccurrenceGet, OccurrenceKey, TenantId};
use jiff::Timestamp;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::body::{PathParams, QueryParams};
use crate::dto::{OccurrenceList, OccurrenceOut, parse_state};
use crate::schedules::parse_schedule_id;
use crate::{ApiError, AppState, ErrorBody};

pub(crate) fn parse_occurrence_id(s: &str) -> Result<OccurrenceId, ApiError> {
    uuid::Uuid::parse_str(s)
        .map(OccurrenceId)
        .map_err(|_| ApiError::malformed_id("occurrence", s))
}

/// Query of `GET /v1/occurrences`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    /// Only this schedule.
    #[param(value_type = Option<String>, format = Uuid)]
    schedule_id: Option<String>,
    /// Only this state (`MISSED`, `DEAD`, `SKIPPED_OVERLAP`, …), in either case.
    #[param(schema_with = crate::dto::occurrence_state)]
    state: Option<String>,
    /// `scheduled_for >= from` (RFC 3339); not after `to`.
    #[param(value_type = Option<String>, format = DateTime)]
    from: Option<String>,
    /// `scheduled_for < to` (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    to: Option<String>,
    /// Page size (1–1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// From the previous page's `next_cursor` (`<milliseconds>_<occurrence id>`).
    #[param(
        min_length = 1,
        pattern = r"^-?[0-9]{1,16}_[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    cursor: Option<String>,
}

pub(crate) fn instant(name: &str, s: &str) -> Result<Timestamp, ApiError> {
    campanile_calendar::parse_instant(s).map_err(|e| ApiError::invalid(format!("{name}: {e}")))
}

/// Occurrences by schedule, state and planned-time range, in planned order.
#[utoipa::path(get, path = "/v1/occurrences", operation_id = "list_occurrences", params(ListQuery), tag = "occurrences",
    responses((status = 200, body = OccurrenceList), (status = 422, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Response, ApiError> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 1000"));
    }
    let after = match q.cursor.as_deref() {
        None => None,
        Some(c) => {
            let bad = || ApiError::invalid("cursor is not one this API returned");
            let (ms, id) = c.split_once('_').ok_or_else(bad)?;
            let ms: i64 = ms.parse().map_err(|_| bad())?;
            Some((
                Timestamp::from_millisecond(ms).map_err(|_| bad())?,
                OccurrenceId(uuid::Uuid::parse_str(id).map_err(|_| bad())?),
            ))
        }
    };
    let from = q.from.as_deref().map(|s| instant("from", s)).transpose()?;
    let to = q.to.as_deref().map(|s| instant("to", s)).transpose()?;
    if let (Some(f), Some(t)) = (from, to)
        && f > t
    {
        return Err(ApiError::invalid(format!(
            "from ({f}) is after to ({t}): the range is empty"
        )));
    }
    // A filter, not a path: a malformed one is bad input (422), not a missing record.
    let schedule_id = q
        .schedule_id
        .as_deref()
        .map(|s| {
            uuid::Uuid::parse_str(s)
                .map(ScheduleId)
                .map_err(|_| ApiError::invalid(format!("schedule_id {s:?} is not a UUID")))
        })
        .transpose()?;
    let st = q.state.as_deref().map(parse_state).transpose()?;
    let mut hold = state
        .answers
        .hold(caller.tenant, crate::ANSWER_BYTES, crate::ANSWER_BYTES)
        .await;
    let mut page = crate::answers::AnswerBudget::new();
    let mut occurrences = Vec::new();
    let (mut cursor, mut more, mut truncated) = (after, false, false);
    'read: while (occurrences.len() as u32) < limit {
        let want = (limit - occurrences.len() as u32).min(state.list_chunk);
        let rows = state
            .store
            .occurrence_list(campanile_store::OccurrenceList {
                tenant: caller.tenant,
                schedule_id,
                state: st,
                from,
                to,
                after: cursor,
                limit: want,
                now: None,
            })
            .await?;
        more = rows.len() as u32 == want;
        for o in &rows {
            let out = OccurrenceOut::new(o);
            if !page.fits(&out) {
                truncated = true;
                break 'read;
            }
            occurrences.push(out);
            cursor = Some((o.scheduled_for, o.id));
        }
        if !more {
            break;
        }
    }
    let next_cursor = (truncated || more)
        .then(|| cursor.map(|(at, id)| format!("{}_{}", at.as_millisecond(), id)))
        .flatten();
    hold.shrink_to(page.used());
    Ok(hold.attach(
        Json(OccurrenceList {
            occurrences,
            next_cursor,
            truncated,
        })
        .into_response(),
    ))
}

pub(crate) async fn get_by(
    state: &AppState,
    tenant: TenantId,
    key: OccurrenceKey,
    what: String,
) -> Result<Json<OccurrenceOut>, ApiError> {
    let d = state
        .store
        .occurrence_get(OccurrenceGet {
            tenant,
            key,
            now: None,
        })
        .await?
        .ok_or_else(|| ApiError::not_found(what))?;
    Ok(Json(OccurrenceOut::detail(&d)))
}

/// One occurrence with its attempts, result and version.
#[utoipa::path(get, path = "/v1/occurrences/{id}", operation_id = "get_occurrence", tag = "occurrences", params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = OccurrenceOut), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(id): PathParams<String>,
) -> Result<Json<OccurrenceOut>, ApiError> {
    let oid = parse_occurrence_id(&id)?;
    get_by(
        &state,
        caller.tenant,
        OccurrenceKey::Id(oid),
        format!("occurrence {id}"),
    )
    .await
}

/// One occurrence addressed by its schedule and planned instant (the highest version).
#[utoipa::path(get, path = "/v1/schedules/{id}/occurrences/{scheduled_for}", tag = "occurrences",
    params(("id" = String, Path, format = Uuid), ("scheduled_for" = String, Path, format = DateTime, description = "RFC 3339")),
    responses((status = 200, body = OccurrenceOut), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_planned(
    State(state): State<AppState>,
    caller: Caller,
    PathParams((id, at)): PathParams<(String, String)>,
) -> Result<Json<OccurrenceOut>, ApiError> {
    let schedule_id = parse_schedule_id(&id)?;
    let scheduled_for = instant("scheduled_for", &at)?;
    get_by(
        &state,
        caller.tenant,
        OccurrenceKey::Planned {
            schedule_id,
            scheduled_for,
        },
        format!("occurrence of {id} at {at}"),
    )
    .await
}
