//! A schedule's calendar from its definition, its shard, and the judge of what was planned\n//! before an outage.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use campanile_calendar::{Calendar, DstPolicy};
use campanile_store::{PrePlanned, PrePlannedJudge, ScheduleSpec, Timing};
use jiff::Timestamp;

use crate::error::PlannerError;
use crate::materialize;

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
