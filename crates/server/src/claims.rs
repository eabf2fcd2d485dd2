//! A worker's claim: its checks, its share of the node's answer memory, and its answer.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use campanile_core::OccurrenceId;
use campanile_store::{ClaimKey, Claimed, OccurrenceClaim, TenantId};
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::body::{JsonBody, PathParams};
use crate::{ApiError, AppState, ErrorBody};

pub(crate) fn check_worker(worker_id: &str) -> Result<(), ApiError> {
    Ok(campanile_store::rules::check_worker(worker_id)?)
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
    let truncated = settle(&state, &mut hold, max, &got);
    let out = ClaimOut {
        occurrences: claimed_out(&state, tenant, got).await,
        truncated,
    };
    Ok(hold.attach(Json(out).into_response()))
}

/// A claim's share of the node's answer memory: what its answer could take (at most
/// [`crate::ANSWER_BYTES`]), or less when less is free (at least room for one occurrence of
/// the largest payload); the claim's size bound is set to it.
pub(crate) async fn claim_hold(
    state: &AppState,
    claim: &mut OccurrenceClaim,
) -> crate::answers::AnswerHold {
    let record = state.max_body_bytes + campanile_store::CLAIM_RECORD_BYTES as usize;
    let want = record
        .saturating_mul(claim.max as usize)
        .min(crate::ANSWER_BYTES);
    let hold = state.answers.hold(claim.tenant, want, record).await;
    claim.max_bytes = Some(hold.bytes() as u64);
    hold
}

/// Settles a claim's `hold` to what its answer `got` takes, and says whether the claim (of
/// `max`) may have stopped at its size bound: fewer than `max`, and the next occurrence (of a
/// payload up to the largest request body) might not have fit.
pub(crate) fn settle(
    state: &AppState,
    hold: &mut crate::answers::AnswerHold,
    max: u32,
    got: &[Claimed],
) -> bool {
    let bytes = got
        .iter()
        .map(|c| usize::try_from(c.answer_bytes()).unwrap_or(usize::MAX))
        .fold(0, usize::saturating_add);
    let record = state.max_body_bytes + campanile_store::CLAIM_RECORD_BYTES as usize;
    let truncated = got.len() < max as usize && bytes.saturating_add(record) > hold.bytes();
    hold.shrink_to(bytes);
    truncated
}

/// A claim's key as given, checked: `resent` means nothing without the key it resends.
pub(crate) fn claim_key(
    key: Option<uuid::Uuid>,
    resent: Option<bool>,
) -> Result<Option<ClaimKey>, ApiError> {
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
pub(crate) fn checked_claim(
    tenant: TenantId,
    queue: String,
    worker_id: String,
    max: Option<u32>,
    lease_seconds: Option<i64>,
    key: Option<ClaimKey>,
) -> Result<OccurrenceClaim, ApiError> {
    let claim = OccurrenceClaim {
        max_bytes: None,
        tenant,
        queue,
        worker_id,
        max: max.unwrap_or(1),
        lease: lease_of(lease_seconds)?,
        key,
        now: None,
    };
    campanile_store::rules::check_claim(&claim)?;
    Ok(claim)
}

pub(crate) fn node_is_live(state: &AppState) -> bool {
    state.planner.as_ref().is_none_or(|p| p.is_live())
}

/// Counts what a claim got, and answers it.
pub(crate) async fn claimed_out(
    state: &AppState,
    tenant: TenantId,
    got: Vec<Claimed>,
) -> Vec<ClaimedOut> {
    campanile_metrics::record_claims(&state.classes.class_of(tenant).await, got.iter());
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

/// A lease length asked for in seconds (`None`: the store grants each occurrence its
/// schedule's), checked by the store's rule ([`campanile_store::rules::check_lease`]) and
/// refused in the API's own terms.
pub(crate) fn lease_of(seconds: Option<i64>) -> Result<Option<SignedDuration>, ApiError> {
    let lease = seconds.map(SignedDuration::from_secs);
    campanile_store::rules::check_lease(lease).map_err(|_| {
        ApiError::invalid(format!(
            "lease_seconds must be between 1 and {}",
            campanile_store::rules::LEASE_MAX.as_secs()
        ))
    })?;
    Ok(lease)
}
