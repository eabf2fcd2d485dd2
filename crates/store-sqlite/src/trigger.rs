//! A schedule run now by an operator: one manual occurrence of its current version.

use campanile_core::{OccurrenceState, occurrence_id};
use campanile_store::*;
use rusqlite::{Connection, OptionalExtension, params};
use uuid::Uuid;

use crate::db::{R, db_err, ts};

pub(crate) fn schedule_trigger(c: &Connection, p: &ScheduleTrigger, now: i64) -> R<Triggered> {
    let rec = crate::version::schedule_get(c, p.tenant, p.id)?
        .ok_or_else(|| StoreError::NotFound(format!("schedule {}", p.id.0)))?;
    check_state(rec.state)?;
    if let Some(key) = &p.key {
        let found: Option<(Uuid, i64)> = c
            .prepare_cached(
                "SELECT id, scheduled_for FROM occurrences WHERE schedule_id = ?1 AND trigger_key = ?2",
            )
            .and_then(|mut s| {
                s.query_row(params![p.id.0, key], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(db_err)?;
        if let Some((id, at)) = found {
            return Ok(Triggered {
                occurrence_id: campanile_core::OccurrenceId(id),
                scheduled_for: ts(at)?,
                created: false,
            });
        }
    }
    let at = ts(now)?;
    let item = manual(&rec, at);
    if crate::occurrence::insert_occurrences(c, p.tenant, &[item], now)? == 0 {
        return Err(at_this_instant());
    }
    let id = occurrence_id(p.id, rec.version, at);
    c.prepare_cached("UPDATE occurrences SET origin = 'manual', trigger_key = ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![id.0, p.key]))
        .map_err(db_err)?;
    Ok(Triggered {
        occurrence_id: id,
        scheduled_for: at,
        created: true,
    })
}

/// Only an active schedule (or a one-off whose instant was planned) is run on demand.
pub(crate) fn check_state(state: ScheduleState) -> R<()> {
    match state {
        ScheduleState::Paused => Err(StoreError::WrongState(
            "the schedule is paused: resume it to run it".into(),
        )),
        ScheduleState::Canceled => Err(StoreError::WrongState(
            "the schedule is canceled: nothing of it runs again".into(),
        )),
        _ => Ok(()),
    }
}

/// The manual occurrence of `rec`'s current version at `at`.
pub(crate) fn manual(rec: &ScheduleRecord, at: jiff::Timestamp) -> NewOccurrence {
    NewOccurrence {
        schedule_id: rec.id,
        version: rec.version,
        scheduled_for: at,
        available_at: at,
        queue: rec.spec.queue.clone(),
        priority: rec.spec.priority,
        max_attempts: rec.spec.max_attempts,
        backoff_initial: rec.spec.backoff_initial,
        backoff_max: rec.spec.backoff_max,
        state: OccurrenceState::Ready,
        overlap: rec.spec.overlap,
        lease: rec.spec.lease,
    }
}

/// A planned occurrence of the same version holds this very millisecond.
pub(crate) fn at_this_instant() -> StoreError {
    StoreError::AlreadyExists(
        "an occurrence of this schedule is planned at this very millisecond; trigger it again"
            .into(),
    )
}
