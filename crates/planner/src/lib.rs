//! Campanile's planner: from schedules to occurrences.
//!
//! - [`schedules`]: validate a schedule definition, create it with its first instant to
//!   plan, update / pause / resume / cancel it (each a new version).
//! - [`materialize`]: the pure decision for one schedule — which instants to insert as runs,
//!   which as `MISSED` records (or one summary for a very long gap), where to continue.
//! - [`reconcile`]: recompute the instants a schedule's versions expect in a range and
//!   classify each by what was recorded (`MISSING` is a bug).
//! - [`Planner`]: holds shard leases and commits planning batches, fenced by those leases; its
//!   loop wakes for the next due instant.

mod engine;
pub mod materialize;
mod planner;
pub mod reconcile;
pub mod schedules;

pub use engine::{Engine, SweepConfig};
pub use planner::{Planner, PlannerConfig, TickReport};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use campanile_calendar::{Calendar, CalendarError, DstPolicy};
use campanile_store::{PrePlanned, PrePlannedJudge, ScheduleSpec, StoreError, Timing};
use jiff::Timestamp;

/// The planner layer's error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlannerError {
    /// The schedule definition is invalid; the message says what and where.
    #[error("{0}")]
    Invalid(String),
    /// The calendar part of the definition is invalid.
    #[error(transparent)]
    Calendar(#[from] CalendarError),
    /// The store failed or refused.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The calendar a schedule version fires by.
///
/// # Errors
///
/// [`PlannerError::Calendar`] for a bad expression, zone or interval.
pub fn calendar_of(spec: &ScheduleSpec) -> Result<Calendar, PlannerError> {
    Ok(match &spec.timing {
        Timing::Cron {
            expr,
            timezone,
            dst_gap,
            dst_fold,
        } => Calendar::cron(
            expr,
            timezone,
            DstPolicy {
                gap: *dst_gap,
                fold: *dst_fold,
            },
        )?,
        Timing::At(at) => Calendar::once(*at),
        Timing::Every { period, anchor } => Calendar::every(*period, *anchor)?,
        _ => return Err(PlannerError::Invalid("unsupported timing".into())),
    })
}

/// The planning shard of a schedule: `hash(schedule_id) mod shards`. Schedule ids are
/// UUIDv7, whose last 62 bits are random.
pub fn shard_of(id: campanile_core::ScheduleId, shards: u32) -> i32 {
    ((id.0.as_u128() as u64) % u64::from(shards.max(1))) as i32
}

/// The planner's [`PrePlannedJudge`]: [`materialize::preplanned_missed`] with each distinct
/// calendar parsed once.
#[derive(Default)]
pub struct CalendarJudge {
    calendars: Mutex<HashMap<Timing, Option<Arc<Calendar>>>>,
}

impl PrePlannedJudge for CalendarJudge {
    fn missed(&self, p: &PrePlanned<'_>) -> Vec<Timestamp> {
        let cal = self
            .calendars
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(p.spec.timing.clone())
            .or_insert_with(|| calendar_of(p.spec).ok().map(Arc::new))
            .clone();
        materialize::preplanned_missed(p, cal.as_deref())
    }
}
