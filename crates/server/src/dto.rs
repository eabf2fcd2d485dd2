//! The public JSON shapes (DESIGN.md, Interfaces): `snake_case` fields, RFC 3339 UTC instants.

use campanile_calendar::{DstFold, DstGap, DstPolicy};
use campanile_core::{Misfire, OccurrenceId, OccurrenceState, Overlap, ScheduleId};
use campanile_store::{
    Attempt, Occurrence, OccurrenceDetail, ScheduleRecord, ScheduleSpec, Timing,
};
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;

use crate::ApiError;

/// Misfire policy as sent and shown.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MisfireDto {
    /// `skip` (default), `fire_once` or `catchup`, in either case.
    #[schema(schema_with = misfire_policy)]
    pub policy: String,
    /// Lateness beyond which an instant counts as missed (0–31622400, default 60).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 31_622_400)]
    pub max_lateness_seconds: Option<i64>,
    /// For `catchup` (and only for it; required there): how many late instants run at most
    /// (1–10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 10_000)]
    pub catchup_max: Option<u32>,
    /// For `catchup` only: spacing between catch-up runs in milliseconds (0–86400000, default
    /// 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 86_400_000)]
    pub catchup_interval_ms: Option<i64>,
}

/// A string schema that takes one of `names` (and null, when `optional`): how the document
/// states what an enumerated field accepts.
fn names(description: &str, names: &[&str], optional: bool) -> utoipa::openapi::Object {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    let (ty, none): (SchemaType, Option<serde_json::Value>) = if optional {
        (
            [Type::String, Type::Null].into_iter().collect(),
            Some(serde_json::Value::Null),
        )
    } else {
        (SchemaType::new(Type::String), None)
    };
    ObjectBuilder::new()
        .schema_type(ty)
        .description(Some(description))
        .enum_values(Some(
            names
                .iter()
                .map(|n| serde_json::Value::from(*n))
                .chain(none),
        ))
        .build()
}

fn misfire_policy() -> utoipa::openapi::Object {
    names(
        "`skip` (default), `fire_once` or `catchup`, in either case.",
        &[
            "skip",
            "fire_once",
            "catchup",
            "SKIP",
            "FIRE_ONCE",
            "CATCHUP",
        ],
        false,
    )
}

pub(crate) fn overlap_policy() -> utoipa::openapi::Object {
    names(
        "`ALLOW` (default), `SKIP_IF_RUNNING` or `QUEUE_ONE`, in either case; a NATS target \
         takes `ALLOW` only.",
        &[
            "ALLOW",
            "SKIP_IF_RUNNING",
            "QUEUE_ONE",
            "allow",
            "skip_if_running",
            "queue_one",
        ],
        true,
    )
}

fn dst_gap() -> utoipa::openapi::Object {
    names(
        "`skip` (default) or `shift`, in either case.",
        &["skip", "shift", "SKIP", "SHIFT"],
        true,
    )
}

fn dst_fold() -> utoipa::openapi::Object {
    names(
        "`once` (default) or `twice`, in either case.",
        &["once", "twice", "ONCE", "TWICE"],
        true,
    )
}

fn target_type() -> utoipa::openapi::Object {
    names(
        "`nats` (a NATS JetStream subject; the only external target so far).",
        &["nats"],
        false,
    )
}

/// `transient` or `permanent` (`FailInput.class`, `FailureIn.class`).
pub(crate) fn error_class() -> utoipa::openapi::Object {
    names(
        "`transient` (retried with backoff while attempts remain) or `permanent` (dead letter).",
        &["transient", "permanent"],
        false,
    )
}

/// A schedule state filter, in either case.
pub(crate) fn schedule_state() -> utoipa::openapi::Object {
    names(
        "Only schedules in this state: `ACTIVE`, `PAUSED`, `CANCELED` or `FINISHED`, in either \
         case.",
        &[
            "ACTIVE", "PAUSED", "CANCELED", "FINISHED", "active", "paused", "canceled", "finished",
        ],
        false,
    )
}

/// An occurrence state filter, in either case.
pub(crate) fn occurrence_state() -> utoipa::openapi::Object {
    let all: Vec<String> = OccurrenceState::ALL
        .iter()
        .map(|s| s.as_str().to_string())
        .collect();
    let lower: Vec<String> = all.iter().map(|s| s.to_ascii_lowercase()).collect();
    let both: Vec<&str> = all.iter().chain(&lower).map(String::as_str).collect();
    names(
        "Only occurrences in this state, in either case.",
        &both,
        false,
    )
}

/// Retry policy.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryDto {
    /// Claims allowed per occurrence (1–1000, default 3).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000)]
    pub max_attempts: Option<u32>,
    /// First backoff ceiling, ms (default 1000); at most `backoff_max_ms`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2_592_000_000_i64)]
    pub backoff_initial_ms: Option<i64>,
    /// Largest backoff ceiling, ms (default 60000; at most 2592000000, 30 days); at least
    /// `backoff_initial_ms` (so below 1000 only with a `backoff_initial_ms` as low).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2_592_000_000_i64)]
    pub backoff_max_ms: Option<i64>,
}

/// DST options of a cron schedule.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DstDto {
    /// `skip` (default) or `shift`, in either case.
    #[serde(default)]
    #[schema(schema_with = dst_gap)]
    pub gap: Option<String>,
    /// `once` (default) or `twice`, in either case.
    #[serde(default)]
    #[schema(schema_with = dst_fold)]
    pub fold: Option<String>,
}

impl DstDto {
    /// The policy these options (absent: the defaults) name, in either case — the one reading
    /// of DST options for creates, updates and previews.
    pub fn policy(dst: Option<&DstDto>) -> Result<DstPolicy, ApiError> {
        let (gap, fold) = dst.map_or((None, None), |d| (d.gap.as_deref(), d.fold.as_deref()));
        Ok(DstPolicy {
            gap: gap
                .unwrap_or("skip")
                .to_ascii_lowercase()
                .parse::<DstGap>()
                .map_err(|e| ApiError::invalid(format!("dst.gap: {e}")))?,
            fold: fold
                .unwrap_or("once")
                .to_ascii_lowercase()
                .parse::<DstFold>()
                .map_err(|e| ApiError::invalid(format!("dst.fold: {e}")))?,
        })
    }
}

/// An external target: where the relay publishes each occurrence instead of a queue.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TargetDto {
    /// `nats` (a NATS JetStream subject; the only external target so far).
    #[serde(rename = "type")]
    #[schema(schema_with = target_type)]
    pub kind: String,
    /// The subject to publish to: literal (no `*` or `>`), dot-separated non-empty tokens
    /// without whitespace or control characters, 1 to 190 bytes of UTF-8; a stream must take
    /// it.
    #[schema(
        min_length = 1,
        max_length = 190,
        pattern = r"^[^.\s*>]+(\.[^.\s*>]+)*$"
    )]
    pub subject: String,
}

/// A schedule definition, as created (`POST /v1/schedules`) or replaced (`PATCH`, with
/// `version`). Give `queue` or `target`, not both, and exactly one of `cron`, `at` or
/// `every`; `timezone` and `dst` go with `cron` only, `anchor` with `every` only. The document
/// shows it as `ScheduleCreate` (no `version`) and `ScheduleUpdate` (`version` required).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleInput {
    /// For `PATCH`, required there: the version the caller read. Refused on create.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub version: Option<u32>,
    /// Target queue (per tenant); give either this or `target`. 1 to 200 bytes of UTF-8,
    /// printable (no control or invisible format characters), not starting with `$` (reserved)
    /// and neither starting nor ending with whitespace.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^\s$\u0000-\u001F\u007F-\u009F\u00AD\u200B-\u200F\u2028-\u202E\u2060-\u2064\u2066-\u206F\uFEFF]([^\u0000-\u001F\u007F-\u009F\u00AD\u200B-\u200F\u2028-\u202E\u2060-\u2064\u2066-\u206F\uFEFF]*[^\s\u0000-\u001F\u007F-\u009F\u00AD\u200B-\u200F\u2028-\u202E\u2060-\u2064\u2066-\u206F\uFEFF])?$"
    )]
    pub queue: Option<String>,
    /// An external target instead of a queue: the relay publishes each occurrence to it,
    /// with the occurrence id as the broker's de-duplication id. Refused by a deployment that
    /// relays to no NATS server.
    pub target: Option<TargetDto>,
    /// Cron expression (5 or 6 fields, or a macro).
    #[schema(min_length = 1)]
    pub cron: Option<String>,
    /// IANA zone for `cron` (default UTC): a name of the zone database (or one of its links),
    /// in any ASCII case; not `localtime`, `posixrules`, `Factory`, a `posix/` or `right/`
    /// name, or a file path.
    #[schema(
        min_length = 1,
        pattern = r"^[A-Za-z][A-Za-z0-9._+-]*(/[A-Za-z][A-Za-z0-9._+-]*)*$"
    )]
    pub timezone: Option<String>,
    /// One-off instant (RFC 3339, from 1970 on), not further in the past than the misfire
    /// policy's `max_lateness_seconds` unless the policy runs late instants.
    #[serde(default, deserialize_with = "opt_instant")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub at: Option<Timestamp>,
    /// Fixed interval of at least one second, in hours, minutes and seconds, e.g. `"90s"`,
    /// `"1h 30m"` or `"PT15M"` (no days: a time of day in a zone is a cron schedule).
    #[schema(min_length = 1)]
    pub every: Option<String>,
    /// First instant of an `every` series (default: now).
    #[serde(default, deserialize_with = "opt_instant")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub anchor: Option<Timestamp>,
    /// Any JSON, handed to workers on claim exactly as sent (numbers of any size and
    /// precision included).
    #[schema(value_type = Option<Value>)]
    pub payload: Option<Box<RawValue>>,
    /// Higher is claimed first (default 0).
    pub priority: Option<i32>,
    /// Lease length of its occurrences (1–86400, default 30): what a claim or a renewal that
    /// names no `lease_seconds` grants. A claim that names one uses it for everything it claims
    /// (the Rust SDK's worker always names its own, as the NATS relay does).
    #[schema(minimum = 1, maximum = 86400)]
    pub lease_seconds: Option<i64>,
    /// What to do with late instants.
    pub misfire: Option<MisfireDto>,
    /// `ALLOW` (default), `SKIP_IF_RUNNING` or `QUEUE_ONE`.
    #[schema(schema_with = overlap_policy)]
    pub overlap: Option<String>,
    /// Flexible window in seconds (default 0: strict).
    #[schema(minimum = 0, maximum = 86400)]
    pub flex_window_seconds: Option<i64>,
    /// Retry policy.
    pub retry: Option<RetryDto>,
    /// DST options (cron only).
    pub dst: Option<DstDto>,
}

fn secs(d: SignedDuration) -> i64 {
    d.as_secs()
}

impl ScheduleInput {
    /// The store's definition, with defaults filled in and every field checked.
    pub fn to_spec(&self, now: Timestamp) -> Result<ScheduleSpec, ApiError> {
        let queue = match (&self.queue, &self.target) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid("give either queue or target, not both"));
            }
            (None, None) => {
                return Err(ApiError::invalid(
                    "queue (or an external target) is required",
                ));
            }
            (Some(q), None) => {
                if campanile_core::is_reserved_queue(q) {
                    return Err(ApiError::invalid(format!(
                        "queue names starting with '{}' are reserved; for NATS use \
                         \"target\": {{\"type\": \"nats\", \"subject\": \"…\"}}",
                        campanile_core::RESERVED_PREFIX
                    )));
                }
                q.clone()
            }
            (None, Some(t)) if t.kind == "nats" => campanile_core::Target::Nats {
                subject: t.subject.clone(),
            }
            .queue(),
            (None, Some(t)) => {
                return Err(ApiError::invalid(format!(
                    "target.type {:?} is not supported; expected \"nats\"",
                    t.kind
                )));
            }
        };
        let kinds = [self.cron.is_some(), self.at.is_some(), self.every.is_some()]
            .iter()
            .filter(|x| **x)
            .count();
        if kinds != 1 {
            return Err(ApiError::invalid(
                "exactly one of cron, at or every is required",
            ));
        }
        if self.cron.is_none() && (self.timezone.is_some() || self.dst.is_some()) {
            return Err(ApiError::invalid(
                "timezone and dst apply to cron schedules only",
            ));
        }
        if self.every.is_none() && self.anchor.is_some() {
            return Err(ApiError::invalid("anchor applies to every schedules only"));
        }
        let timing = if let Some(expr) = &self.cron {
            let dst = DstDto::policy(self.dst.as_ref())?;
            // Stored as the zone database spells it (`utc` is `UTC`), once checked.
            let zone = match &self.timezone {
                Some(name) => campanile_calendar::Zone::get(name)
                    .map_err(|e| ApiError::invalid(e.to_string()))?,
                None => campanile_calendar::Zone::utc(),
            };
            Timing::Cron {
                expr: expr.clone(),
                timezone: zone.name().to_string(),
                dst_gap: dst.gap,
                dst_fold: dst.fold,
            }
        } else if let Some(at) = self.at {
            Timing::At(rfc3339_instant("at", at)?)
        } else {
            let text = self.every.as_deref().unwrap_or_default();
            let period: SignedDuration = text.parse().map_err(|_| {
                // jiff's own message suggests a Rust type; say what to write instead. An
                // interval is exact, so days (which DST makes 23 or 25 hours) are not
                // accepted: a daily job at a local time is a cron schedule.
                ApiError::invalid(format!(
                    "every: '{}' is not a duration in hours, minutes and seconds (e.g. 90s, \
                     1h 30m, 24h, PT15M); for a time of day in a zone, use cron",
                    campanile_calendar::echo(text)
                ))
            })?;
            if period < SignedDuration::from_secs(1) {
                return Err(ApiError::invalid("every must be at least 1 second"));
            }
            Timing::Every {
                period,
                anchor: self
                    .anchor
                    .map(|a| rfc3339_instant("anchor", a))
                    .transpose()?
                    .unwrap_or(now),
            }
        };
        let lateness =
            |m: &MisfireDto| SignedDuration::from_secs(m.max_lateness_seconds.unwrap_or(60));
        let misfire = match &self.misfire {
            None => Misfire::default(),
            Some(m) => {
                if m.max_lateness_seconds
                    .is_some_and(|s| !(0..=366 * 86_400).contains(&s))
                {
                    return Err(ApiError::invalid(
                        "misfire.max_lateness_seconds must be between 0 and 31622400",
                    ));
                }
                // The contract writes the policies in capitals (`FIRE_ONCE`); either case.
                let policy = m.policy.to_ascii_lowercase();
                if policy != "catchup"
                    && (m.catchup_max.is_some() || m.catchup_interval_ms.is_some())
                {
                    return Err(ApiError::invalid(format!(
                        "misfire.catchup_max and misfire.catchup_interval_ms apply only to the \
                         catchup policy, not to '{}'",
                        m.policy
                    )));
                }
                match policy.as_str() {
                    "skip" => Misfire::Skip {
                        max_lateness: lateness(m),
                    },
                    "fire_once" => Misfire::FireOnce {
                        max_lateness: lateness(m),
                    },
                    "catchup" => Misfire::Catchup {
                        max_lateness: lateness(m),
                        max: m.catchup_max.ok_or_else(|| {
                            ApiError::invalid("misfire.catchup_max is required for catchup")
                        })?,
                        interval: SignedDuration::from_millis(
                            m.catchup_interval_ms.unwrap_or(1000),
                        ),
                    },
                    other => {
                        return Err(ApiError::invalid(format!(
                            "misfire.policy '{}': expected skip, fire_once or catchup",
                            campanile_calendar::echo(other)
                        )));
                    }
                }
            }
        };
        let overlap = match &self.overlap {
            None => Overlap::Allow,
            Some(o) => o
                .parse::<Overlap>()
                .map_err(|e| ApiError::invalid(format!("overlap: {e}")))?,
        };
        let retry = self.retry.clone().unwrap_or(RetryDto {
            max_attempts: None,
            backoff_initial_ms: None,
            backoff_max_ms: None,
        });
        let lease = self.lease_seconds.unwrap_or(30);
        let flex = self.flex_window_seconds.unwrap_or(0);
        if !(1..=86_400).contains(&lease) {
            return Err(ApiError::invalid(
                "lease_seconds must be between 1 and 86400",
            ));
        }
        if !(0..=86_400).contains(&flex) {
            return Err(ApiError::invalid(
                "flex_window_seconds must be between 0 and 86400",
            ));
        }
        Ok(ScheduleSpec {
            timing,
            queue,
            payload: self.payload.as_ref().map(|p| p.get().to_string()),
            priority: self.priority.unwrap_or(0),
            lease: SignedDuration::from_secs(lease),
            max_attempts: retry.max_attempts.unwrap_or(3),
            backoff_initial: SignedDuration::from_millis(retry.backoff_initial_ms.unwrap_or(1_000)),
            backoff_max: SignedDuration::from_millis(retry.backoff_max_ms.unwrap_or(60_000)),
            misfire,
            overlap,
            flex_window: SignedDuration::from_secs(flex),
        })
    }
}

/// A schedule as shown.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ScheduleOut {
    /// Id.
    #[schema(value_type = String, format = Uuid)]
    pub id: ScheduleId,
    /// Current version.
    pub version: u32,
    /// `ACTIVE`, `PAUSED`, `CANCELED` or `FINISHED` (nothing left to plan: a one-off whose
    /// instant has been planned; it no longer counts against the active-schedule quotas).
    pub state: String,
    /// The route: the target queue, or `$nats:<subject>` for a NATS target.
    pub queue: String,
    /// The external target, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<TargetDto>,
    /// Cron expression, for cron schedules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// Zone, for cron schedules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// DST options, for cron schedules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dst: Option<DstDto>,
    /// The instant, for one-off schedules.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub at: Option<Timestamp>,
    /// The interval, for `every` schedules (ISO 8601).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// The anchor, for `every` schedules.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub anchor: Option<Timestamp>,
    /// Payload.
    #[schema(value_type = Option<Value>)]
    pub payload: Option<Box<RawValue>>,
    /// Priority.
    pub priority: i32,
    /// Lease length.
    pub lease_seconds: i64,
    /// Misfire policy.
    pub misfire: MisfireDto,
    /// Overlap policy.
    pub overlap: String,
    /// Flexible window.
    pub flex_window_seconds: i64,
    /// Retry policy.
    pub retry: RetryDto,
    /// The definition's next instants from now (up to 5; empty when paused or canceled; a
    /// `FINISHED` one-off lists its instant until it has passed).
    #[schema(value_type = Vec<String>)]
    pub next_fires: Vec<Timestamp>,
    /// Creation.
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    /// Last change.
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
}

impl ScheduleOut {
    /// From a stored schedule and its next fires.
    pub fn new(r: &ScheduleRecord, next_fires: Vec<Timestamp>) -> ScheduleOut {
        let s = &r.spec;
        let (cron, timezone, dst, at, every, anchor) = match &s.timing {
            Timing::Cron {
                expr,
                timezone,
                dst_gap,
                dst_fold,
            } => (
                Some(expr.clone()),
                Some(timezone.clone()),
                Some(DstDto {
                    gap: Some(dst_gap.to_string()),
                    fold: Some(dst_fold.to_string()),
                }),
                None,
                None,
                None,
            ),
            Timing::At(t) => (None, None, None, Some(*t), None, None),
            Timing::Every { period, anchor } => (
                None,
                None,
                None,
                None,
                Some(format!("{period}")),
                Some(*anchor),
            ),
            _ => (None, None, None, None, None, None),
        };
        let (policy, catchup_max, interval) = match s.misfire {
            Misfire::Skip { .. } => ("skip", None, None),
            Misfire::FireOnce { .. } => ("fire_once", None, None),
            Misfire::Catchup { max, interval, .. } => {
                ("catchup", Some(max), Some(interval.as_millis() as i64))
            }
            _ => ("skip", None, None),
        };
        ScheduleOut {
            id: r.id,
            version: r.version,
            state: r.state.as_str().to_string(),
            queue: s.queue.clone(),
            target: match campanile_core::Target::from_queue(&s.queue) {
                Ok(campanile_core::Target::Nats { subject }) => Some(TargetDto {
                    kind: "nats".into(),
                    subject,
                }),
                _ => None,
            },
            cron,
            timezone,
            dst,
            at,
            every,
            anchor,
            payload: s.payload.as_deref().and_then(stored_json),
            priority: s.priority,
            lease_seconds: secs(s.lease),
            misfire: MisfireDto {
                policy: policy.into(),
                max_lateness_seconds: Some(secs(s.misfire.max_lateness())),
                catchup_max,
                catchup_interval_ms: interval,
            },
            overlap: s.overlap.as_str().into(),
            flex_window_seconds: secs(s.flex_window),
            retry: RetryDto {
                max_attempts: Some(s.max_attempts),
                backoff_initial_ms: Some(s.backoff_initial.as_millis() as i64),
                backoff_max_ms: Some(s.backoff_max.as_millis() as i64),
            },
            next_fires,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// An occurrence of a schedule in flight, reported by a state change.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct InFlight {
    /// Occurrence id.
    #[schema(value_type = String, format = Uuid)]
    pub id: OccurrenceId,
    /// Its actual state.
    pub state: String,
}

/// The answer to update / pause / resume / cancel.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ScheduleChangeOut {
    /// The schedule after the change.
    pub schedule: ScheduleOut,
    /// Occurrences of older versions no worker held (pending, or waiting to retry) that
    /// became `CANCELED`.
    pub canceled: u64,
    /// Running occurrences of older versions, left to their workers (they see the cancel
    /// flag on renew; a lapsed lease ends them `CANCELED`).
    pub in_flight: Vec<InFlight>,
}

/// A page of schedules.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ScheduleList {
    /// The schedules.
    pub schedules: Vec<ScheduleOut>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// Present (and true) when the page holds fewer than `limit` records because the answer
    /// reached its size bound ([`crate::ANSWER_BYTES`], 8 MiB of JSON; always at least one
    /// record): `next_cursor` goes on after the last record given.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// One attempt of an occurrence.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AttemptOut {
    /// The claim's epoch.
    pub epoch: i64,
    /// The worker.
    pub worker_id: String,
    /// Claimed at.
    #[schema(value_type = String, format = DateTime)]
    pub started_at: Timestamp,
    /// End of the last lease granted to this attempt: its claim's, or its last renewal's.
    #[schema(value_type = String, format = DateTime)]
    pub lease_until: Timestamp,
    /// Ended at.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<Timestamp>,
    /// `running`, `succeeded`, `failed` or `lease_expired`.
    pub outcome: String,
    /// `transient` or `permanent`, for failures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_class: Option<String>,
    /// Failure message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

impl From<&Attempt> for AttemptOut {
    fn from(a: &Attempt) -> AttemptOut {
        AttemptOut {
            epoch: a.epoch,
            worker_id: a.owner.clone(),
            started_at: a.started_at,
            lease_until: a.lease_until,
            finished_at: a.finished_at,
            outcome: a.outcome.as_str().into(),
            error_class: a.error_class.map(|c| c.as_str().into()),
            error_message: a.error_message.clone(),
        }
    }
}

/// An occurrence as shown.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OccurrenceOut {
    /// Id: the handler's idempotency key.
    #[schema(value_type = String, format = Uuid)]
    pub id: OccurrenceId,
    /// Schedule.
    #[schema(value_type = String, format = Uuid)]
    pub schedule_id: ScheduleId,
    /// The schedule version it belongs to.
    pub version: u32,
    /// Planned instant.
    #[schema(value_type = String, format = DateTime)]
    pub scheduled_for: Timestamp,
    /// Claimable from.
    #[schema(value_type = String, format = DateTime)]
    pub available_at: Timestamp,
    /// State (`SCHEDULED`, `READY`, `RUNNING`, `SUCCEEDED`, `RETRY_WAIT`, `DEAD`, `MISSED`,
    /// `CANCELED`, `SKIPPED_OVERLAP`).
    pub state: String,
    /// Fencing epoch of the latest claim.
    pub epoch: i64,
    /// The worker holding it, while it is `RUNNING`; null in every other state, where no
    /// worker holds it (`attempts` says who ran it).
    pub owner: Option<String>,
    /// End of the lease it is held under, while it is `RUNNING`; null in every other state.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub lease_until: Option<Timestamp>,
    /// Claims so far.
    pub attempt_count: u32,
    /// Claims allowed.
    pub max_attempts: u32,
    /// Whether cancellation was requested.
    pub cancel_requested: bool,
    /// The accepted result.
    #[schema(value_type = Option<Value>)]
    pub result: Option<Box<RawValue>>,
    /// Last error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When it reached a final state.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<Timestamp>,
    /// `planned` (from the schedule's calendar), `manual` (run on demand with
    /// `POST /v1/schedules/{id}/trigger`) or `backfill` (an instant of a past range run after
    /// the fact with `POST /v1/schedules/{id}/backfill`).
    pub origin: &'static str,
    /// Attempts, oldest first (single-occurrence reads only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<Vec<AttemptOut>>,
    /// The run's own payload, for a run triggered with one (single-occurrence reads only;
    /// absent for every other occurrence, which runs with its version's).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Value>)]
    pub payload: Option<Box<RawValue>>,
}

impl OccurrenceOut {
    /// From a stored occurrence. Owner and lease only while it runs: the store keeps the
    /// last claim's on a row the sweep took back, a retry waits on or a run ended, and no
    /// worker holds any of those.
    pub fn new(o: &Occurrence) -> OccurrenceOut {
        let held = o.state == OccurrenceState::Running;
        OccurrenceOut {
            id: o.id,
            schedule_id: o.schedule_id,
            version: o.version,
            scheduled_for: o.scheduled_for,
            available_at: o.available_at,
            state: o.state.as_str().into(),
            epoch: o.epoch,
            owner: o.owner.clone().filter(|_| held),
            lease_until: o.lease_until.filter(|_| held),
            attempt_count: o.attempts,
            max_attempts: o.max_attempts,
            cancel_requested: o.cancel_requested,
            result: o.result.as_deref().and_then(stored_json),
            last_error: o.last_error.clone(),
            finished_at: o.finished_at,
            origin: o.origin.as_str(),
            attempts: None,
            payload: None,
        }
    }

    /// From a stored occurrence with its attempts.
    pub fn detail(d: &OccurrenceDetail) -> OccurrenceOut {
        OccurrenceOut {
            attempts: Some(d.attempts.iter().map(AttemptOut::from).collect()),
            payload: d.payload.as_deref().and_then(stored_json),
            ..OccurrenceOut::new(&d.occurrence)
        }
    }
}

/// A page of occurrences.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OccurrenceList {
    /// The occurrences.
    pub occurrences: Vec<OccurrenceOut>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// Present (and true) when the page holds fewer than `limit` records because the answer
    /// reached its size bound ([`crate::ANSWER_BYTES`], 8 MiB of JSON; always at least one
    /// record): `next_cursor` goes on after the last record given.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// An instant the API takes: RFC 3339 writes years 0000–9999 only, so an instant outside
/// them (jiff reads `-009000-01-01T00:00:00Z`) is refused rather than stored and echoed in a
/// form no RFC 3339 client can read.
pub fn rfc3339_instant(name: &str, t: Timestamp) -> Result<Timestamp, ApiError> {
    campanile_calendar::writable_instant(t).map_err(|e| ApiError::invalid(format!("{name} {e}")))
}

/// An optional instant in a request body, read by [`campanile_calendar::parse_instant`] (RFC
/// 3339, offsets within ±23:59) rather than by jiff alone: refused, it is a 422 naming the
/// field.
pub(crate) fn opt_instant<'de, D: serde::Deserializer<'de>>(
    de: D,
) -> Result<Option<Timestamp>, D::Error> {
    Option::<String>::deserialize(de)?
        .map(|text| campanile_calendar::parse_instant(&text).map_err(serde::de::Error::custom))
        .transpose()
}

/// A required instant in a request body, read like [`opt_instant`].
pub(crate) fn req_instant<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Timestamp, D::Error> {
    let text = String::deserialize(de)?;
    campanile_calendar::parse_instant(&text).map_err(serde::de::Error::custom)
}

/// Stored JSON (a payload, a result) as it was sent: numbers keep every digit (parsed into a
/// `Value`, an integer beyond 64 bits became a float, silently rounded).
pub fn stored_json(text: &str) -> Option<Box<RawValue>> {
    RawValue::from_string(text.to_string()).ok()
}

/// Parses an occurrence state filter.
pub fn parse_state(s: &str) -> Result<OccurrenceState, ApiError> {
    s.parse()
        .map_err(|e: campanile_core::UnknownName| ApiError::invalid(e.to_string()))
}
