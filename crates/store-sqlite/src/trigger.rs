//! A schedule run now by an operator: one manual occurrence of its current version.

use campanile_core::occurrence_id;
use campanile_store::*;
use rusqlite::{Connection, OptionalExtension, params};
use uuid::Uuid;

use crate::db::{R, db_err, ts};

pub(crate) fn schedule_trigger(c: &Connection, p: &ScheduleTrigger, now: i64) -> R<Triggered> {
    let rec = crate::version::schedule_get(c, p.tenant, p.id)?
        .ok_or_else(|| StoreError::NotFound(format!("schedule {}", p.id.0)))?;
    rules::check_trigger(rec.state)?;
    if let Some(key) = &p.key {
        let found: Option<(Uuid, i64, Option<String>)> = c
            .prepare_cached(
                "SELECT id, scheduled_for, payload FROM occurrences
                  WHERE schedule_id = ?1 AND trigger_key = ?2",
            )
            .and_then(|mut s| {
                s.query_row(params![p.id.0, key], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .optional()
            })
            .map_err(db_err)?;
        if let Some((id, at, payload)) = found {
            if payload != p.payload {
                return Err(rules::trigger_key_reused());
            }
            return Ok(Triggered {
                occurrence_id: campanile_core::OccurrenceId(id),
                scheduled_for: ts(at)?,
                created: false,
            });
        }
    }
    let at = ts(now)?;
    let item = NewOccurrence::manual(&rec, at);
    if crate::occurrence::insert_occurrences(c, p.tenant, &[item], now)? == 0 {
        return Err(rules::trigger_collides());
    }
    let id = occurrence_id(p.id, rec.version, at);
    if p.payload.is_some() {
        // Names the column only when there is one: the trigger that counts the occurrences
        // holding their own payload fires on an update that names it.
        c.prepare_cached(
            "UPDATE occurrences SET origin = 'manual', trigger_key = ?2, payload = ?3 WHERE id = ?1",
        )
        .and_then(|mut s| s.execute(params![id.0, p.key, p.payload]))
        .map_err(db_err)?;
    } else {
        c.prepare_cached(
            "UPDATE occurrences SET origin = 'manual', trigger_key = ?2 WHERE id = ?1",
        )
        .and_then(|mut s| s.execute(params![id.0, p.key]))
        .map_err(db_err)?;
    }
    Ok(Triggered {
        occurrence_id: id,
        scheduled_for: at,
        created: true,
    })
}
