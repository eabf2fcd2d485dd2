//! `/v1/occurrences`, `/v1/queues/{queue}/claim`, `/v1/leases/renew`, `/v1/completions`: reading
//! occurrences, and the worker protocol (claim, renew, complete, fail, redrive).

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use campanile_core::{ErrorClass, OccurrenceId, ScheduleId};
use campanile_store::{
    Ack, ClaimKey, Claimed, Conflict, Finish, FinishItem, LeaseRef, LeaseRenew, OccurrenceCancel,
    OccurrenceClaim, OccurrenceFinishMany, OccurrenceGet, OccurrenceKey, OccurrenceRedrive,
    TenantId,
};
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::body::{JsonBody, PathParams, QueryParams};
use crate::dto::{OccurrenceList, OccurrenceOut, parse_state};
use crate::schedules::parse_schedule_id;
use crate::{ApiError, AppState, ErrorBody};

fn parse_occurrence_id(s: &str) -> Result<OccurrenceId, ApiError> {
    uuid::Uuid::parse_str(s)
        .map(OccurrenceId)
        .map_err(|_| ApiError::malformed_id("occurrence", s))
}

fn check_worker(worker_id: &str) -> Result<(), ApiError> {
    if worker_id.trim().is_empty() {
        return Err(ApiError::invalid("worker_id must not be blank"));
    }
    if worker_id.len() > 200 {
        return Err(ApiError::invalid(format!(
            "worker_id is at most 200 bytes of UTF-8 ({} given)",
            worker_id.len()
        )));
    }
    // PostgreSQL cannot store NUL in text (it answered 500); SQLite would store it as given.
    if worker_id.contains('\0') {
        return Err(ApiError::invalid(
            "worker_id must not contain NUL characters",
        ));
    }
    Ok(())
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

fn instant(name: &str, s: &str) -> Result<Timestamp, ApiError> {
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
    if let (Some(f), Some(t)) = (from, to) {
        if f > t {
            return Err(ApiError::invalid(format!(
                "from ({f}) is after to ({t}): the range is empty"
            )));
        }
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
        .hold(crate::ANSWER_BYTES, crate::ANSWER_BYTES)
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

async fn get_by(
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

/// Body of a claim.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClaimInput {
    /// Who claims; completions must come from the same id. Not blank, at most 200 bytes of
    /// UTF-8, no NUL.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"
    )]
    worker_id: String,
    /// At most this many (1–1000, default 1).
    #[schema(minimum = 1, maximum = 1000)]
    max: Option<u32>,
    /// Lease length for every occurrence claimed (1–86400); absent, each gets its schedule's
    /// `lease_seconds` (default 30).
    #[schema(minimum = 1, maximum = 86400)]
    lease_seconds: Option<i64>,
    /// This claim's own key (a UUID), new for each claim the worker means to make: recorded on
    /// what it claims, so that the claim sent again with `resent` gets what it claimed.
    #[schema(value_type = Option<String>, format = Uuid)]
    claim_key: Option<uuid::Uuid>,
    /// The claim was sent before with the same `claim_key` and its answer may have been lost
    /// (no answer, a broken connection): the occurrences that sending claimed, if this worker
    /// still holds them, are the answer, as they were claimed, and nothing new is claimed;
    /// when there are none, the claim is made as usual. Needs `claim_key`.
    resent: Option<bool>,
}

/// A claimed occurrence.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ClaimedOut {
    /// The occurrence id: use it as the idempotency key of the work.
    #[schema(value_type = String, format = Uuid)]
    id: OccurrenceId,
    /// Schedule.
    #[schema(value_type = String, format = Uuid)]
    schedule_id: campanile_core::ScheduleId,
    /// Schedule version.
    version: u32,
    /// Planned instant.
    #[schema(value_type = String, format = DateTime)]
    scheduled_for: Timestamp,
    /// When it became claimable: the planned instant, moved by a flexible window, a retry's
    /// backoff or catch-up pacing.
    #[schema(value_type = String, format = DateTime)]
    available_at: Timestamp,
    /// When this claim was made (server clock); minus `available_at`, the claim lag.
    #[schema(value_type = String, format = DateTime)]
    claimed_at: Timestamp,
    /// The fencing token: send it back with renew, complete and fail.
    epoch: i64,
    /// The lease ends here (server clock).
    #[schema(value_type = String, format = DateTime)]
    lease_until: Timestamp,
    /// Attempt number (1-based).
    attempt: u32,
    /// The schedule's payload.
    #[schema(value_type = Option<Value>)]
    payload: Option<Box<serde_json::value::RawValue>>,
}

/// The answer of a claim.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ClaimOut {
    /// What was claimed (possibly nothing).
    occurrences: Vec<ClaimedOut>,
    /// The answer stopped at its size bound (at most 8 MiB of payloads, less while the node's
    /// answer memory is busy; always at least one occurrence): more may be due now, so claim
    /// again without waiting. Absent when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
}

/// Claim due occurrences of one of the tenant's queues.
#[utoipa::path(post, path = "/v1/queues/{queue}/claim", tag = "workers", request_body = ClaimInput, params(("queue" = String, Path, min_length = 1, max_length = 200, pattern = r"^[^$\u0000][^\u0000]*$",
        description = "The tenant's queue: 1 to 200 bytes of UTF-8, not starting with `$` (the relay's), no NUL")),
    responses((status = 200, body = ClaimOut), (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub(crate) async fn claim(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(queue): PathParams<String>,
    body: JsonBody<ClaimInput>,
) -> Result<Response, ApiError> {
    let b = body.value;
    check_worker(&b.worker_id)?;
    let key = claim_key(b.claim_key, b.resent)?;
    let mut claim = checked_claim(
        caller.tenant,
        queue,
        b.worker_id,
        b.max,
        b.lease_seconds,
        key,
    )?;
    // A node hands out work only while the others can see it alive: otherwise a node starting
    // now would take the cluster for down and judge this work by the misfire policy, and after
    // a database outage the outage check (made by the next planning pass) must come first.
    // What a claim sent again already holds is handed out already: it comes back.
    let mut hold = claim_hold(&state, &mut claim).await;
    let (tenant, max) = (claim.tenant, claim.max);
    let got = if node_is_live(&state) {
        state.store.occurrence_claim(claim).await?
    } else {
        let held = state.store.occurrence_claimed_with_key(claim).await?;
        if held.is_empty() {
            return Err(ApiError::node_not_live());
        }
        held
    };
    let truncated = cut_short(&state, &hold, max, &got);
    hold.shrink_to(answer_bytes(&got));
    let out = ClaimOut {
        occurrences: claimed_out(&state, tenant, got).await,
        truncated,
    };
    Ok(hold.attach(Json(out).into_response()))
}

/// A claim's share of the node's answer memory: what its answer could take (at most
/// [`crate::ANSWER_BYTES`]), or less when less is free (at least room for one occurrence of
/// the largest payload); the claim's size bound is set to it.
async fn claim_hold(state: &AppState, claim: &mut OccurrenceClaim) -> crate::answers::AnswerHold {
    let record = state.max_body_bytes + campanile_store::CLAIM_RECORD_BYTES as usize;
    let want = record
        .saturating_mul(claim.max as usize)
        .min(crate::ANSWER_BYTES);
    let hold = state.answers.hold(want, record).await;
    claim.max_bytes = Some(hold.bytes() as u64);
    hold
}

/// What `got` counts against its claim's size bound.
fn answer_bytes(got: &[Claimed]) -> usize {
    got.iter()
        .map(|c| usize::try_from(c.answer_bytes()).unwrap_or(usize::MAX))
        .fold(0, usize::saturating_add)
}

/// Whether a claim of `max` that answered `got` within `hold` may have stopped at its size
/// bound: fewer than `max`, and the next occurrence (of a payload up to the largest request
/// body) might not have fit.
fn cut_short(
    state: &AppState,
    hold: &crate::answers::AnswerHold,
    max: u32,
    got: &[Claimed],
) -> bool {
    let record = state.max_body_bytes + campanile_store::CLAIM_RECORD_BYTES as usize;
    got.len() < max as usize && answer_bytes(got).saturating_add(record) > hold.bytes()
}

/// A claim's key as given, checked: `resent` means nothing without the key it resends.
fn claim_key(key: Option<uuid::Uuid>, resent: Option<bool>) -> Result<Option<ClaimKey>, ApiError> {
    let resent = resent.unwrap_or(false);
    match key {
        None if resent => Err(ApiError::invalid(
            "resent needs claim_key: the key of the claim sent before",
        )),
        None => Ok(None),
        Some(id) => Ok(Some(ClaimKey { id, resent })),
    }
}

/// A claim's queue, count and lease, checked (the caller checks the worker id).
fn checked_claim(
    tenant: TenantId,
    queue: String,
    worker_id: String,
    max: Option<u32>,
    lease_seconds: Option<i64>,
    key: Option<ClaimKey>,
) -> Result<OccurrenceClaim, ApiError> {
    if campanile_core::is_reserved_queue(&queue) {
        return Err(ApiError::invalid(format!(
            "queue {queue:?} is reserved: the relay delivers its occurrences, workers cannot \
             claim them"
        )));
    }
    // No schedule can target an empty name, a longer one or one with NUL (creation refuses
    // them since the first release): a worker polling one is misconfigured and should hear
    // so, not wait forever.
    if queue.is_empty() || queue.contains('\0') {
        return Err(ApiError::invalid(format!(
            "queue {queue:?}: no schedule can target an empty queue name or one with NUL"
        )));
    }
    if queue.len() > 200 {
        return Err(ApiError::invalid(format!(
            "queue names are at most 200 bytes ({} given): no schedule can target this queue",
            queue.len()
        )));
    }
    let max = max.unwrap_or(1);
    if !(1..=1000).contains(&max) {
        return Err(ApiError::invalid("max must be between 1 and 1000"));
    }
    Ok(OccurrenceClaim {
        max_bytes: None,
        tenant,
        queue,
        worker_id,
        max,
        lease: lease_of(lease_seconds)?,
        key,
        now: None,
    })
}

fn node_is_live(state: &AppState) -> bool {
    state.planner.as_ref().is_none_or(|p| p.is_live())
}

/// Runs a checked claim and counts what it got.
/// Counts what a claim got, and answers it.
async fn claimed_out(state: &AppState, tenant: TenantId, got: Vec<Claimed>) -> Vec<ClaimedOut> {
    Claimed::count(&state.classes.class_of(tenant).await, got.iter());
    got.into_iter()
        .map(|c| ClaimedOut {
            id: c.id,
            schedule_id: c.schedule_id,
            version: c.version,
            scheduled_for: c.scheduled_for,
            available_at: c.available_at,
            claimed_at: c.claimed_at,
            epoch: c.epoch,
            lease_until: c.lease_until,
            attempt: c.attempt,
            payload: c.payload.as_deref().and_then(crate::dto::stored_json),
        })
        .collect()
}

/// A lease length asked for in seconds, checked; `None` when not given (the store then grants
/// each occurrence its schedule's).
fn lease_of(seconds: Option<i64>) -> Result<Option<SignedDuration>, ApiError> {
    match seconds {
        Some(s) if !(1..=86_400).contains(&s) => Err(ApiError::invalid(
            "lease_seconds must be between 1 and 86400",
        )),
        s => Ok(s.map(SignedDuration::from_secs)),
    }
}

/// A held lease.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct LeaseIn {
    /// Occurrence.
    #[schema(value_type = String, format = Uuid)]
    occurrence_id: OccurrenceId,
    /// Epoch of the claim.
    epoch: i64,
}

/// Body of a renewal.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RenewInput {
    /// The owner (as it claimed).
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"
    )]
    worker_id: String,
    /// Leases to extend (up to 1000).
    #[schema(max_items = 1000)]
    leases: Vec<LeaseIn>,
    /// New lease length from now (1–86400); absent, each occurrence's schedule's
    /// `lease_seconds` (default 30).
    #[schema(minimum = 1, maximum = 86400)]
    lease_seconds: Option<i64>,
}

/// One renewal result.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RenewedOut {
    /// Occurrence.
    #[schema(value_type = String, format = Uuid)]
    occurrence_id: OccurrenceId,
    /// Epoch sent.
    epoch: i64,
    /// False: the lease is lost; stop the work.
    renewed: bool,
    /// New lease end.
    #[schema(value_type = Option<String>, format = DateTime)]
    lease_until: Option<Timestamp>,
    /// Someone asked to cancel this occurrence: stop before side effects.
    cancel_requested: bool,
    /// When not renewed, why: the failed check, as a refused completion names it
    /// (`stale_epoch`, `not_owner`, `lease_expired`, `wrong_state`, `not_claimed`,
    /// `not_found`).
    #[serde(skip_serializing_if = "Option::is_none")]
    check: Option<&'static str>,
    /// When not renewed, the same in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

/// The answer of a renewal.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RenewOut {
    /// One per lease sent, in order.
    leases: Vec<RenewedOut>,
}

/// Extend held leases in one call; says which were renewed and which are cancel-requested.
#[utoipa::path(post, path = "/v1/leases/renew", tag = "workers", request_body = RenewInput,
    responses((status = 200, body = RenewOut), (status = 422, body = ErrorBody)))]
pub(crate) async fn renew(
    State(state): State<AppState>,
    caller: Caller,
    body: JsonBody<RenewInput>,
) -> Result<Json<RenewOut>, ApiError> {
    let b = body.value;
    check_worker(&b.worker_id)?;
    if b.leases.len() > 1000 {
        return Err(ApiError::invalid("at most 1000 leases per renewal"));
    }
    let lease = lease_of(b.lease_seconds)?;
    let out = state
        .store
        .lease_renew(LeaseRenew {
            tenant: caller.tenant,
            worker_id: b.worker_id,
            leases: b
                .leases
                .iter()
                .map(|l| LeaseRef {
                    occurrence_id: l.occurrence_id,
                    epoch: l.epoch,
                })
                .collect(),
            lease,
            now: None,
        })
        .await?;
    let lost = out.iter().filter(|r| !r.renewed).count() as u64;
    metrics::counter!("campanile_lease_renewals_failed_total").increment(lost);
    Ok(Json(RenewOut {
        leases: out
            .into_iter()
            .map(|r| RenewedOut {
                occurrence_id: r.lease.occurrence_id,
                epoch: r.lease.epoch,
                renewed: r.renewed,
                lease_until: r.lease_until,
                cancel_requested: r.cancel_requested,
                check: r.lost.as_ref().map(Conflict::check),
                message: r.lost.as_ref().map(ToString::to_string),
            })
            .collect(),
    }))
}

/// Body of a completion.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompleteInput {
    /// The owner (as it claimed).
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"
    )]
    worker_id: String,
    /// Epoch of the claim.
    epoch: i64,
    /// Any JSON result, stored exactly as sent.
    #[schema(value_type = Option<Value>)]
    result: Option<Box<serde_json::value::RawValue>>,
}

/// Body of a failure.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FailInput {
    /// The owner (as it claimed).
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"
    )]
    worker_id: String,
    /// Epoch of the claim.
    epoch: i64,
    /// `transient` (retried with backoff) or `permanent` (dead letter).
    #[schema(schema_with = crate::dto::error_class)]
    class: String,
    /// What went wrong (at most 10000 bytes of UTF-8).
    #[schema(max_length = 10_000)]
    message: Option<String>,
}

/// An accepted outcome.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AckOut {
    /// Occurrence.
    #[schema(value_type = String, format = Uuid)]
    occurrence_id: OccurrenceId,
    /// `accepted` or `conflict`.
    outcome: &'static str,
    /// The state after an accepted write; for a `wrong_state` or `not_claimed` conflict, the
    /// state the occurrence is in.
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<String>,
    /// When a transient failure becomes claimable again.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    retry_at: Option<Timestamp>,
    /// For conflicts: the failed check. `stale_epoch`: the occurrence was claimed again since
    /// (or the epoch was never issued); `not_owner`: it runs under another worker's claim;
    /// `lease_expired`: the caller's lease has passed; `wrong_state`: the caller's claim of
    /// this epoch has ended otherwise (its outcome was written, or it was canceled);
    /// `not_claimed`: no worker holds it (it is not `RUNNING`) and the caller did not hold it
    /// at this epoch (never claimed, or released by a redrive); `not_found`.
    #[serde(skip_serializing_if = "Option::is_none")]
    check: Option<&'static str>,
    /// For conflicts: what happened, for people.
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

fn ack_out(a: &Ack) -> AckOut {
    match &a.conflict {
        None => AckOut {
            occurrence_id: a.occurrence_id,
            outcome: "accepted",
            state: a.state.map(|s| s.as_str().into()),
            retry_at: a.retry_at,
            check: None,
            message: None,
        },
        Some(c) => AckOut {
            occurrence_id: a.occurrence_id,
            outcome: "conflict",
            // A `wrong_state` refusal names the state, as a refused single completion does in
            // its `details`: a worker whose report is refused as `SUCCEEDED` at its own epoch
            // knows its earlier sending was written. A `not_claimed` one names it too.
            state: match c {
                Conflict::WrongState { state } | Conflict::NotClaimed { state } => {
                    Some(state.as_str().into())
                }
                _ => None,
            },
            retry_at: None,
            check: Some(c.check()),
            message: Some(c.to_string()),
        },
    }
}

async fn finish_one(
    state: &AppState,
    tenant: TenantId,
    worker_id: String,
    id: &str,
    epoch: i64,
    finish: Finish,
) -> Result<Json<AckOut>, ApiError> {
    check_worker(&worker_id)?;
    let occurrence_id = parse_occurrence_id(id)?;
    let succeeded = finish.succeeded();
    let acks = state
        .store
        .occurrence_finish_many(OccurrenceFinishMany {
            tenant,
            worker_id,
            items: vec![FinishItem {
                lease: LeaseRef {
                    occurrence_id,
                    epoch,
                },
                finish,
            }],
            now: None,
        })
        .await?;
    Ack::count_outcomes(&acks, [succeeded]);
    let ack = acks
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::bad_request("no outcome"))?;
    ack_reply(&ack, id, ApiError::lease_conflict)
}

/// The HTTP answer to one fenced write: 200 with the outcome, 404 for an occurrence the tenant
/// does not have, or the conflict `on_conflict` describes.
fn ack_reply(
    ack: &Ack,
    id: &str,
    on_conflict: impl FnOnce(&Conflict) -> ApiError,
) -> Result<Json<AckOut>, ApiError> {
    match &ack.conflict {
        None => Ok(Json(ack_out(ack))),
        Some(Conflict::NotFound) => Err(ApiError::not_found(format!("occurrence {id}"))),
        Some(c) => Err(on_conflict(c)),
    }
}

fn wrong_state(message: String) -> ApiError {
    ApiError::new(axum::http::StatusCode::CONFLICT, "wrong_state", message)
}

fn failure(class: &str, message: Option<String>) -> Result<Finish, ApiError> {
    let class: ErrorClass = class
        .parse()
        .map_err(|e: campanile_core::UnknownName| ApiError::invalid(e.to_string()))?;
    let mut message = message.unwrap_or_default();
    if message.len() > 10_000 {
        return Err(ApiError::invalid("message must be at most 10000 bytes"));
    }
    // A NUL (PostgreSQL cannot store it in text) becomes U+FFFD rather than refusing the
    // report: an error text quoting binary data should not keep the outcome from being
    // recorded.
    if message.contains('\0') {
        message = message.replace('\0', "\u{FFFD}");
    }
    Ok(Finish::Failed { class, message })
}

/// Complete a claimed occurrence. Accepted only from the current owner, with the current
/// epoch, inside a valid lease; otherwise 409 `lease_conflict` naming the failed check in
/// `details.check` (`stale_epoch`, `not_owner`, `lease_expired`, `wrong_state`, `not_claimed`;
/// see the completions' results).
#[utoipa::path(post, path = "/v1/occurrences/{id}/complete", tag = "workers", request_body = CompleteInput, params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = AckOut), (status = 409, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn complete(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(id): PathParams<String>,
    body: JsonBody<CompleteInput>,
) -> Result<Json<AckOut>, ApiError> {
    let b = body.value;
    finish_one(
        &state,
        caller.tenant,
        b.worker_id,
        &id,
        b.epoch,
        Finish::Succeeded {
            result: b.result.map(|r| r.get().to_string()),
        },
    )
    .await
}

/// Report a failure: `transient` retries with exponential backoff and full jitter while
/// attempts remain; `permanent` goes to `DEAD`. Fenced as a completion is (409
/// `lease_conflict` naming the failed check).
#[utoipa::path(post, path = "/v1/occurrences/{id}/fail", tag = "workers", request_body = FailInput, params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = AckOut), (status = 409, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn fail(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(id): PathParams<String>,
    body: JsonBody<FailInput>,
) -> Result<Json<AckOut>, ApiError> {
    let b = body.value;
    let finish = failure(&b.class, b.message)?;
    finish_one(&state, caller.tenant, b.worker_id, &id, b.epoch, finish).await
}

/// One item of a batch of outcomes: `result` for a success, or `failure` (not both).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompletionItem {
    /// Occurrence.
    #[schema(value_type = String, format = Uuid)]
    occurrence_id: OccurrenceId,
    /// Epoch of the claim.
    epoch: i64,
    /// A success's result, stored exactly as sent.
    #[schema(value_type = Option<Value>)]
    result: Option<Box<serde_json::value::RawValue>>,
    /// A failure.
    failure: Option<FailureIn>,
}

/// A failure inside a batch.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FailureIn {
    /// `transient` or `permanent`.
    #[schema(schema_with = crate::dto::error_class)]
    class: String,
    /// What went wrong (at most 10000 bytes of UTF-8).
    #[schema(max_length = 10_000)]
    message: Option<String>,
}

/// Body of `POST /v1/completions`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompletionsInput {
    /// The owner of every item (as it claimed).
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"
    )]
    worker_id: String,
    /// 1 to 1000 outcomes, each fenced on its own.
    #[schema(min_items = 1, max_items = 1000)]
    items: Vec<CompletionItem>,
    /// Claim more work in the same request, once the outcomes are written: a worker that
    /// reports and asks for its next occurrences makes one round trip instead of two.
    claim: Option<ClaimNext>,
}

/// A claim riding on a batch of outcomes: what `POST /v1/queues/{queue}/claim` takes, plus
/// the queue.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClaimNext {
    /// The tenant's queue to claim from: 1 to 200 bytes of UTF-8, not starting with `$`
    /// (the relay's), no NUL.
    #[schema(min_length = 1, max_length = 200, pattern = r"^[^$\u0000][^\u0000]*$")]
    queue: String,
    /// At most this many (1–1000, default 1).
    #[schema(minimum = 1, maximum = 1000)]
    max: Option<u32>,
    /// Lease length for every occurrence claimed (1–86400); absent, each gets its schedule's
    /// `lease_seconds` (default 30).
    #[schema(minimum = 1, maximum = 86400)]
    lease_seconds: Option<i64>,
    /// This claim's own key (a UUID), new for each claim the worker means to make: recorded on
    /// what it claims, so that the claim sent again with `resent` gets what it claimed.
    #[schema(value_type = Option<String>, format = Uuid)]
    claim_key: Option<uuid::Uuid>,
    /// The claim was sent before with the same `claim_key` and its answer may have been lost
    /// (no answer, a broken connection): the occurrences that sending claimed, if this worker
    /// still holds them, are the answer, as they were claimed, and nothing new is claimed;
    /// when there are none, the claim is made as usual. Needs `claim_key`.
    resent: Option<bool>,
}

/// The answer of a batch.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CompletionsOut {
    /// One per item, in order.
    results: Vec<AckOut>,
    /// With `claim` in the request: what was claimed after the outcomes were written
    /// (possibly nothing — also when the claim could not run: this node hands out no work
    /// right now, or the database failed after the outcomes were written; a plain claim
    /// answers those with 503).
    #[serde(skip_serializing_if = "Option::is_none")]
    claimed: Option<Vec<ClaimedOut>>,
    /// `claimed` stopped at its size bound, as a claim's `truncated` says. Absent when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    claimed_truncated: bool,
}

/// Many outcomes in one request, each fenced on its own; with `claim`, then a claim of more
/// work for the same worker.
#[utoipa::path(post, path = "/v1/completions", tag = "workers", request_body = CompletionsInput,
    responses((status = 200, body = CompletionsOut), (status = 422, body = ErrorBody)))]
pub(crate) async fn completions(
    State(state): State<AppState>,
    caller: Caller,
    body: JsonBody<CompletionsInput>,
) -> Result<Response, ApiError> {
    let b = body.value;
    check_worker(&b.worker_id)?;
    if b.items.is_empty() || b.items.len() > 1000 {
        return Err(ApiError::invalid("items must hold 1 to 1000 outcomes"));
    }
    // The claim is checked before anything is written: a request refused is refused whole.
    let claim = b
        .claim
        .map(|c| {
            checked_claim(
                caller.tenant,
                c.queue,
                b.worker_id.clone(),
                c.max,
                c.lease_seconds,
                claim_key(c.claim_key, c.resent)?,
            )
        })
        .transpose()
        .map_err(|e| ApiError::invalid(format!("claim: {}", e.message())))?;
    let mut items = Vec::with_capacity(b.items.len());
    for (i, it) in b.items.into_iter().enumerate() {
        let finish = match (it.result, it.failure) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(format!(
                    "items[{i}]: give either result (a success) or failure, not both"
                )));
            }
            (None, Some(f)) => failure(&f.class, f.message)
                .map_err(|e| ApiError::invalid(format!("items[{i}]: {}", e.message())))?,
            (r, None) => Finish::Succeeded {
                result: r.map(|r| r.get().to_string()),
            },
        };
        items.push(FinishItem {
            lease: LeaseRef {
                occurrence_id: it.occurrence_id,
                epoch: it.epoch,
            },
            finish,
        });
    }
    let succeeded: Vec<bool> = items.iter().map(|i| i.finish.succeeded()).collect();
    let finish = OccurrenceFinishMany {
        tenant: caller.tenant,
        worker_id: b.worker_id,
        items,
        now: None,
    };
    // The outcomes are written whatever the claim does: a claim that cannot run now answers
    // nothing, as an empty queue would, rather than turn recorded outcomes into an error
    // that a worker might take for unrecorded.
    let mut claim = claim;
    let max = claim.as_ref().map_or(0, |c| c.max);
    let mut hold = match claim.as_mut() {
        Some(c) => Some(claim_hold(&state, c).await),
        None => None,
    };
    let (acks, got) = match claim {
        Some(c) if node_is_live(&state) => {
            let (acks, got) = state.store.occurrence_finish_and_claim(finish, c).await?;
            let got = got.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "the claim after a batch of outcomes failed");
                Vec::new()
            });
            (acks, Some(got))
        }
        // A node not live claims nothing new, but a claim sent again gets what its key holds.
        Some(c) if c.key.is_some_and(|k| k.resent) => {
            let acks = state.store.occurrence_finish_many(finish).await?;
            let got = state
                .store
                .occurrence_claimed_with_key(c)
                .await
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "looking up a resent claim's occurrences failed");
                    Vec::new()
                });
            (acks, Some(got))
        }
        claim => (
            state.store.occurrence_finish_many(finish).await?,
            claim.map(|_| Vec::new()),
        ),
    };
    Ack::count_outcomes(&acks, succeeded);
    let mut claimed_truncated = false;
    let claimed = match got {
        Some(got) => {
            if let Some(hold) = hold.as_mut() {
                claimed_truncated = cut_short(&state, hold, max, &got);
                hold.shrink_to(answer_bytes(&got));
            }
            Some(claimed_out(&state, caller.tenant, got).await)
        }
        None => None,
    };
    let out = Json(CompletionsOut {
        results: acks.iter().map(ack_out).collect(),
        claimed,
        claimed_truncated,
    })
    .into_response();
    Ok(match hold {
        Some(hold) => hold.attach(out),
        None => out,
    })
}

/// Re-ready a `DEAD` occurrence under the same id, history kept, attempt budget reset.
#[utoipa::path(post, path = "/v1/occurrences/{id}/redrive", tag = "occurrences", params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = AckOut), (status = 409, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn redrive(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(id): PathParams<String>,
) -> Result<Json<AckOut>, ApiError> {
    let occurrence_id = parse_occurrence_id(&id)?;
    let ack = state
        .store
        .occurrence_redrive(OccurrenceRedrive {
            tenant: caller.tenant,
            occurrence_id,
            now: None,
        })
        .await?;
    ack_reply(&ack, &id, |c| {
        wrong_state(format!("only a DEAD occurrence can be redriven: {c}"))
    })
}

/// Ask to cancel one occurrence: pending ones are canceled, running ones flagged.
#[utoipa::path(post, path = "/v1/occurrences/{id}/cancel", operation_id = "cancel_occurrence", tag = "occurrences", params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = AckOut), (status = 409, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(id): PathParams<String>,
) -> Result<Json<AckOut>, ApiError> {
    let occurrence_id = parse_occurrence_id(&id)?;
    let ack = state
        .store
        .occurrence_cancel(OccurrenceCancel {
            tenant: caller.tenant,
            occurrence_id,
            now: None,
        })
        .await?;
    ack_reply(&ack, &id, |c| wrong_state(c.to_string()))
}
