//! Retention: tenants' policies, the open batch (chosen on the writer, read on a reader,
//! closed on the writer), the rollups left behind and where retention stands.

use campanile_store::*;
use rusqlite::{Connection, OptionalExtension, params};
use uuid::Uuid;

use campanile_core::OccurrenceId;
use jiff::Timestamp;

use crate::db::{R, db_err, stored_state, ts};
use crate::occurrence::{OCC_COLS, occurrence_row};

/// A day in milliseconds: rollups count by the UTC day of the planned instant.
const DAY_MS: i64 = 86_400_000;

pub(crate) fn tenant_retention_set(c: &Connection, p: &TenantRetentionSet) -> R<()> {
    let n = c
        .prepare_cached("UPDATE tenants SET retention_ms = ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![p.tenant.0, p.retention.to_ms()]))
        .map_err(db_err)?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("tenant {}", p.tenant.0)));
    }
    Ok(())
}

/// A batch a node is to archive (or, given up, to clean up after).
pub(crate) struct OpenBatch {
    pub(crate) id: i64,
    pub(crate) resumed: bool,
    pub(crate) abandoned: bool,
    pub(crate) ids: Vec<Uuid>,
}

/// The batch, where the scan goes on from, and whether another node holds the open batch.
pub(crate) type Opened = (Option<OpenBatch>, Option<OccurrenceId>, bool);

/// Opens a batch, or hands back the open one when this node may finish it (writer).
pub(crate) fn batch_open(c: &Connection, p: &RetentionBatchOpen, now: i64) -> R<Opened> {
    let lease_until = now.saturating_add(crate::db::dur_ms(p.lease));
    let open: Option<(i64, String, i64, Vec<u8>, bool)> = c
        .prepare_cached(
            "SELECT id, owner, lease_until, ids, abandoned FROM retention_batches ORDER BY id LIMIT 1",
        )
        .and_then(|mut s| {
            s.query_row([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .optional()
        })
        .map_err(db_err)?;
    if let Some((id, owner, until, ids, abandoned)) = open {
        if owner != p.node && until > now {
            return Ok((None, p.after, true));
        }
        c.prepare_cached("UPDATE retention_batches SET owner = ?2, lease_until = ?3 WHERE id = ?1")
            .and_then(|mut s| s.execute(params![id, p.node, lease_until]))
            .map_err(db_err)?;
        let ids = if abandoned { Vec::new() } else { uuids(&ids)? };
        let batch = OpenBatch {
            id,
            resumed: true,
            abandoned,
            ids,
        };
        return Ok((Some(batch), p.after, false));
    }
    let default_ms = p.default_retention.map(crate::db::dur_ms);
    // Only occurrences planned before the shortest retention in force can be due: ids lead
    // with the planned instant, so that is an id bound.
    let shortest: Option<i64> = c
        .prepare_cached(
            "SELECT MIN(COALESCE(retention_ms, ?1)) FROM tenants
              WHERE COALESCE(retention_ms, ?1) > 0",
        )
        .and_then(|mut s| s.query_row(params![default_ms], |r| r.get(0)))
        .map_err(db_err)?;
    let Some(shortest) = shortest else {
        return Ok((None, None, false));
    };
    let bound =
        OccurrenceId::floor(ts(now.saturating_sub(shortest)).unwrap_or(Timestamp::UNIX_EPOCH)).0;
    let after = p.after.map_or(Uuid::nil(), |a| a.0);
    // The window: at most `window` ids after the cursor, below the bound.
    let window_end: Option<Uuid> = c
        .prepare_cached(
            "SELECT id FROM occurrences WHERE id > ?1 AND id < ?2 ORDER BY id LIMIT 1 OFFSET ?3",
        )
        .and_then(|mut s| {
            s.query_row(params![after, bound, p.window.max(1) - 1], |r| r.get(0))
                .optional()
        })
        .map_err(db_err)?;
    let high = window_end.unwrap_or(bound);
    let ids: Vec<Uuid> = c
        .prepare_cached(ELIGIBLE)
        .and_then(|mut s| {
            s.query_map(params![now, default_ms, p.limit, after, high], |r| {
                r.get::<_, Uuid>(0)
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(db_err)?;
    let scanned_to = match (ids.last(), window_end) {
        (Some(last), _) if ids.len() >= p.limit as usize => Some(OccurrenceId(*last)),
        (_, Some(end)) => Some(OccurrenceId(end)),
        (_, None) => None,
    };
    if ids.is_empty() {
        return Ok((None, scanned_to, false));
    }
    let blob: Vec<u8> = ids.iter().flat_map(|u| *u.as_bytes()).collect();
    let id: i64 = c
        .prepare_cached(
            "INSERT INTO retention_batches (owner, lease_until, ids, opened_at)
             VALUES (?1, ?2, ?3, ?4) RETURNING id",
        )
        .and_then(|mut s| s.query_row(params![p.node, lease_until, blob, now], |r| r.get(0)))
        .map_err(db_err)?;
    let batch = OpenBatch {
        id,
        resumed: false,
        abandoned: false,
        ids,
    };
    Ok((Some(batch), scanned_to, false))
}

/// Occurrences retention may take, oldest first (`?1` now, `?2` the operator's default in
/// milliseconds or NULL for forever, `?3` the most, ids in `(?4, ?5]`): final, planned and
/// finished longer ago than their tenant's retention, not their schedule's latest, no delivery
/// pending.
const ELIGIBLE: &str = "
SELECT o.id FROM occurrences o JOIN tenants t ON t.id = o.tenant_id
 WHERE o.id > ?4 AND o.id <= ?5
   AND o.state IN ('SUCCEEDED', 'DEAD', 'CANCELED', 'MISSED', 'SKIPPED_OVERLAP')
   AND COALESCE(t.retention_ms, ?2) > 0
   AND o.scheduled_for < ?1 - COALESCE(t.retention_ms, ?2)
   AND COALESCE(o.finished_at, o.scheduled_for) < ?1 - COALESCE(t.retention_ms, ?2)
   AND EXISTS (SELECT 1 FROM occurrences n
                WHERE n.schedule_id = o.schedule_id AND n.scheduled_for > o.scheduled_for)
   AND NOT EXISTS (SELECT 1 FROM outbox b WHERE b.occurrence_id = o.id AND b.settled_at IS NULL)
 ORDER BY o.id LIMIT ?3";

fn uuids(blob: &[u8]) -> R<Vec<Uuid>> {
    if !blob.len().is_multiple_of(16) {
        return Err(StoreError::Database(format!(
            "a retention batch's ids are {} bytes, not a multiple of 16",
            blob.len()
        )));
    }
    Ok(blob
        .chunks_exact(16)
        .filter_map(|b| Uuid::from_slice(b).ok())
        .collect())
}

/// The batch's occurrences still final, with their attempts and tenants, in one snapshot
/// (reader).
pub(crate) fn read_retired(c: &Connection, ids: &[Uuid], now: i64) -> R<Vec<Retired>> {
    let snapshot = c.unchecked_transaction().map_err(db_err)?;
    let c: &Connection = &snapshot;
    let sql = format!(
        "SELECT {OCC_COLS}, claimed_at, tenant_id,
                (SELECT name FROM tenants WHERE tenants.id = occurrences.tenant_id), origin,
                payload
           FROM occurrences WHERE id = ?1"
    );
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let found = c
            .prepare_cached(&sql)
            .and_then(|mut s| {
                s.query_row(params![id], |r| {
                    Ok((
                        occurrence_row(r, now)?,
                        r.get::<_, Option<i64>>(19)?,
                        r.get::<_, i64>(20)?,
                        r.get::<_, String>(21)?,
                        r.get::<_, Option<String>>(23)?,
                    ))
                })
                .optional()
            })
            .map_err(db_err)?;
        let Some((row, claimed_at, tenant, tenant_name, payload)) = found else {
            continue;
        };
        let (seq, occurrence) = row?;
        if !occurrence.state.is_final() {
            continue;
        }
        let attempts = crate::occurrence::attempts_of(c, seq)?;
        out.push(Retired {
            tenant: TenantId(tenant),
            tenant_name,
            detail: OccurrenceDetail::assemble(
                occurrence,
                crate::db::opt_ts(claimed_at)?,
                attempts,
            ),
            payload,
        });
    }
    out.sort_by(|a, b| {
        (a.tenant, a.detail.occurrence.id.0).cmp(&(b.tenant, b.detail.occurrence.id.0))
    });
    Ok(out)
}

/// Closes a batch: removes what it archived and counts it in the rollups, or gives it up
/// when any of it changed (writer).
pub(crate) fn batch_close(
    c: &Connection,
    p: &RetentionBatchClose,
    _now: i64,
) -> R<RetentionClosed> {
    let open: Option<(String, Vec<u8>, bool)> = c
        .prepare_cached("SELECT owner, ids, abandoned FROM retention_batches WHERE id = ?1")
        .and_then(|mut s| {
            s.query_row(params![p.batch], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()
        })
        .map_err(db_err)?;
    let Some((owner, ids, abandoned)) = open else {
        return Err(StoreError::WrongState(format!(
            "retention batch {} is not open",
            p.batch
        )));
    };
    if owner != p.node {
        return Err(StoreError::WrongState(format!(
            "retention batch {} is held by '{owner}'",
            p.batch
        )));
    }
    let given_up = RetentionClosed {
        abandoned: true,
        ..RetentionClosed::default()
    };
    if abandoned {
        // Its files are gone (the caller deleted them): forget it.
        delete_batch(c, p.batch)?;
        return Ok(given_up);
    }
    let give_up = |c: &Connection| -> R<RetentionClosed> {
        c.prepare_cached("UPDATE retention_batches SET abandoned = 1 WHERE id = ?1")
            .and_then(|mut s| s.execute(params![p.batch]))
            .map_err(db_err)?;
        Ok(given_up)
    };
    let mut chosen = uuids(&ids)?;
    chosen.sort();
    let mut archived: Vec<Uuid> = p.items.iter().map(|k| k.id.0).collect();
    archived.sort();
    archived.dedup();
    if archived != chosen {
        return give_up(c);
    }
    // Every occurrence as the archive holds it, with no delivery pending, or nothing is
    // removed.
    let mut rows = Vec::with_capacity(p.items.len());
    for key in &p.items {
        let row: Option<Held> = c
            .prepare_cached(
                "SELECT seq, tenant_id, schedule_id, version, scheduled_for, state, epoch, finished_at,
                        EXISTS (SELECT 1 FROM outbox b
                                 WHERE b.occurrence_id = occurrences.id AND b.settled_at IS NULL)
                   FROM occurrences WHERE id = ?1",
            )
            .and_then(|mut s| {
                s.query_row(params![key.id.0], |r| {
                    Ok(Held {
                        seq: r.get(0)?,
                        tenant: r.get(1)?,
                        schedule: r.get(2)?,
                        version: r.get(3)?,
                        at: r.get(4)?,
                        state: r.get(5)?,
                        epoch: r.get(6)?,
                        finished_at: r.get(7)?,
                        pending_delivery: r.get(8)?,
                    })
                })
                .optional()
            })
            .map_err(db_err)?;
        match row {
            Some(h)
                if h.epoch == key.epoch
                    && h.state == key.state.as_str()
                    && key.state.is_final()
                    && h.finished_at == key.finished_at.map(|t| t.as_millisecond())
                    && !h.pending_delivery =>
            {
                rows.push((key.id, h));
            }
            _ => return give_up(c),
        }
    }
    let mut closed = RetentionClosed::default();
    for (id, h) in rows {
        let Held {
            seq,
            tenant,
            schedule,
            version,
            at,
            state,
            ..
        } = h;
        closed.attempts_removed += c
            .prepare_cached("DELETE FROM attempts WHERE occurrence_seq = ?1")
            .and_then(|mut s| s.execute(params![seq]))
            .map_err(db_err)? as u64;
        c.prepare_cached("DELETE FROM outbox WHERE occurrence_id = ?1 AND settled_at IS NOT NULL")
            .and_then(|mut s| s.execute(params![id.0]))
            .map_err(db_err)?;
        closed.removed += c
            .prepare_cached("DELETE FROM occurrences WHERE seq = ?1")
            .and_then(|mut s| s.execute(params![seq]))
            .map_err(db_err)? as u64;
        c.prepare_cached(
            "INSERT INTO occurrence_rollups
                 (tenant_id, schedule_id, version, day, state, count, first_at, last_at)
             VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?6)
             ON CONFLICT (schedule_id, version, day, state) DO UPDATE
                SET count = count + 1,
                    first_at = MIN(first_at, excluded.first_at),
                    last_at = MAX(last_at, excluded.last_at)",
        )
        .and_then(|mut s| {
            s.execute(params![
                tenant,
                schedule,
                version,
                at - at.rem_euclid(DAY_MS),
                state,
                at
            ])
        })
        .map_err(db_err)?;
    }
    delete_batch(c, p.batch)?;
    Ok(closed)
}

/// An occurrence of a batch as it is now.
struct Held {
    seq: i64,
    tenant: i64,
    schedule: Uuid,
    version: u32,
    at: i64,
    state: String,
    epoch: i64,
    finished_at: Option<i64>,
    pending_delivery: bool,
}

fn delete_batch(c: &Connection, id: i64) -> R<()> {
    c.prepare_cached("DELETE FROM retention_batches WHERE id = ?1")
        .and_then(|mut s| s.execute(params![id]))
        .map_err(db_err)?;
    Ok(())
}

pub(crate) fn rollup_list(c: &Connection, p: &RollupList) -> R<Vec<Rollup>> {
    c.prepare_cached(
        "SELECT version, day, state, count, first_at, last_at FROM occurrence_rollups
          WHERE schedule_id = ?1 AND tenant_id = ?2 ORDER BY day, version, state",
    )
    .and_then(|mut s| {
        s.query_map(params![p.schedule_id.0, p.tenant.0], |r| {
            Ok((
                r.get::<_, u32>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, i64>(5)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()
    })
    .map_err(db_err)?
    .into_iter()
    .map(|(version, day, state, count, first, last)| {
        Ok(Rollup {
            version,
            day: ts(day)?,
            state: stored_state(&state)?,
            count: count.max(0) as u64,
            first_at: ts(first)?,
            last_at: ts(last)?,
        })
    })
    .collect()
}

pub(crate) fn retention_status(c: &Connection) -> R<RetentionStatus> {
    // Ids lead with their planned instant (campanile_core::occurrence_id): the first id is
    // the oldest occurrence, one index step away.
    let oldest: Option<i64> = c
        .prepare_cached("SELECT scheduled_for FROM occurrences ORDER BY id LIMIT 1")
        .and_then(|mut s| s.query_row([], |r| r.get(0)).optional())
        .map_err(db_err)?;
    Ok(RetentionStatus {
        oldest: oldest.map(ts).transpose()?,
    })
}
