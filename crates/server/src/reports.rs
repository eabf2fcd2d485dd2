//! What workers and operators report on occurrences: renewals, outcomes (one, or a batch that
//! may claim more), redrive and cancel.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use campanile_core::{ErrorClass, OccurrenceId};
use campanile_store::{
    Ack, Conflict, Finish, FinishItem, LeaseRef, LeaseRenew, OccurrenceCancel,
    OccurrenceFinishMany, OccurrenceRedrive, TenantId,
};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::body::{JsonBody, PathParams};
use crate::claims::{
    ClaimedOut, check_worker, checked_claim, claim_hold, claim_key, claimed_out, lease_of,
    node_is_live, settle,
};
use crate::occurrences::parse_occurrence_id;
use crate::{ApiError, AppState, ErrorBody};

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

pub(crate) fn ack_out(a: &Ack) -> AckOut {
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

pub(crate) async fn finish_one(
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
    campanile_metrics::record_outcomes(&acks, [succeeded]);
    let ack = acks
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::bad_request("no outcome"))?;
    ack_reply(&ack, id, ApiError::lease_conflict)
}

/// The HTTP answer to one fenced write: 200 with the outcome, 404 for an occurrence the tenant
/// does not have, or the conflict `on_conflict` describes.
pub(crate) fn ack_reply(
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

pub(crate) fn wrong_state(message: String) -> ApiError {
    ApiError::new(axum::http::StatusCode::CONFLICT, "wrong_state", message)
}

pub(crate) fn failure(class: &str, message: Option<String>) -> Result<Finish, ApiError> {
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
    campanile_metrics::record_outcomes(&acks, succeeded);
    let mut claimed_truncated = false;
    let claimed = match got {
        Some(got) => {
            if let Some(hold) = hold.as_mut() {
                claimed_truncated = settle(&state, hold, max, &got);
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
