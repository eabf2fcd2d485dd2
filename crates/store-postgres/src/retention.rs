//! Retention: tenants' policies, the open batch (one at a time across nodes, under the
//! `retention_lock` row), the rollups left behind and where retention stands.

use campanile_core::OccurrenceId;
use campanile_store::*;
use deadpool_postgres::{Client, GenericClient};
use uuid::Uuid;

use crate::db::{R, dur_ms, execute, opt_ts, pg_err, query, resolve_now, stored_state, ts, u32_of};
use crate::occurrence::{attempt_row, occurrence_row};

pub(crate) async fn tenant_retention_set(c: &Client, p: TenantRetentionSet) -> R<()> {
    let n = execute(
        c,
        "UPDATE tenants SET retention_ms = $2 WHERE id = $1",
        &[&p.tenant.0, &p.retention.to_ms()],
    )
    .await?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("tenant {}", p.tenant.0)));
    }
    Ok(())
}

/// Takes the `retention_lock` row for the transaction: one retention step at a time across
/// nodes (batches and whole days alike).
pub(crate) async fn lock_retention<C: GenericClient>(c: &C) -> R<()> {
    execute(
        c,
        "SELECT id FROM retention_lock WHERE id = 1 FOR UPDATE",
        &[],
    )
    .await?;
    Ok(())
}

/// Occurrences retention may take, oldest first: see `sql/retention_eligible.sql`.
const ELIGIBLE: &str = include_str!("sql/retention_eligible.sql");

/// Removes a closed batch's occurrences with their attempts and settled outbox rows, and
/// counts them in the rollups: see `sql/retention_remove.sql`.
const REMOVE: &str = include_str!("sql/retention_remove.sql");

/// A batch's occurrences with their attempts and tenants: see `sql/retention_read.sql`.
const READ: &str = include_str!("sql/retention_read.sql");

pub(crate) async fn batch_open(c: &mut Client, p: RetentionBatchOpen) -> R<RetentionScan> {
    let tx = c.transaction().await.map_err(pg_err)?;
    let now = resolve_now(&tx, p.now).await?;
    let lease_until = now.saturating_add(dur_ms(p.lease));
    lock_retention(&tx).await?;
    let open = query(
        &tx,
        "SELECT id, owner, lease_until, ids, abandoned FROM retention_batches ORDER BY id LIMIT 1",
        &[],
    )
    .await?;
    let (id, resumed, abandoned, ids, scanned_to) = match open.first() {
        Some(row) => {
            let (id, owner, until, ids, abandoned): (i64, String, i64, Vec<Uuid>, bool) =
                (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
            if owner != p.node && until > now {
                return Ok(RetentionScan {
                    batch: None,
                    scanned_to: p.after,
                    busy: true,
                });
            }
            execute(
                &tx,
                "UPDATE retention_batches SET owner = $2, lease_until = $3 WHERE id = $1",
                &[&id, &p.node, &lease_until],
            )
            .await?;
            let ids = if abandoned { Vec::new() } else { ids };
            (id, true, abandoned, ids, p.after)
        }
        None => {
            let default_ms = p.default_retention.map(dur_ms);
            // Only occurrences planned before the shortest retention in force can be due:
            // ids lead with the planned instant, so that is an id bound.
            let shortest: Option<i64> = query(
                &tx,
                "SELECT min(COALESCE(retention_ms, $1::bigint)) FROM tenants
                  WHERE COALESCE(retention_ms, $1::bigint) > 0",
                &[&default_ms],
            )
            .await?
            .first()
            .and_then(|r| r.get(0));
            let Some(shortest) = shortest else {
                return Ok(RetentionScan::default());
            };
            let bound = OccurrenceId::floor(
                ts(now.saturating_sub(shortest)).unwrap_or(jiff::Timestamp::UNIX_EPOCH),
            )
            .0;
            let after = p.after.map_or(Uuid::nil(), |a| a.0);
            // The window: at most `window` ids after the cursor, below the bound.
            let window_end: Option<Uuid> = query(
                &tx,
                "SELECT id FROM occurrences WHERE id > $1 AND id < $2 ORDER BY id OFFSET $3 LIMIT 1",
                &[&after, &bound, &(i64::from(p.window.max(1)) - 1)],
            )
            .await?
            .first()
            .map(|r| r.get(0));
            let high = window_end.unwrap_or(bound);
            let ids: Vec<Uuid> = query(
                &tx,
                ELIGIBLE,
                &[&now, &default_ms, &i64::from(p.limit), &after, &high],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
            let scanned_to = match (ids.last(), window_end) {
                (Some(last), _) if ids.len() >= p.limit as usize => Some(OccurrenceId(*last)),
                (_, Some(end)) => Some(OccurrenceId(end)),
                (_, None) => None,
            };
            if ids.is_empty() {
                return Ok(RetentionScan {
                    batch: None,
                    scanned_to,
                    busy: false,
                });
            }
            let rows = query(
                &tx,
                "INSERT INTO retention_batches (owner, lease_until, ids, opened_at)
                 VALUES ($1, $2, $3, $4) RETURNING id",
                &[&p.node, &lease_until, &ids, &now],
            )
            .await?;
            let id: i64 = rows
                .first()
                .ok_or_else(|| StoreError::Database("no batch id returned".into()))?
                .get(0);
            (id, false, false, ids, scanned_to)
        }
    };
    tx.commit().await.map_err(pg_err)?;
    let items = read_retired(&*c, &ids, now).await?;
    Ok(RetentionScan {
        batch: Some(RetentionBatch {
            id,
            resumed,
            abandoned,
            items,
        }),
        scanned_to,
        busy: false,
    })
}

/// The batch's occurrences still final, with their attempts and tenants, in one statement.
pub(crate) async fn read_retired<C: GenericClient>(
    c: &C,
    ids: &[Uuid],
    now: i64,
) -> R<Vec<Retired>> {
    let rows = query(c, READ, &[&ids]).await?;
    let mut out: Vec<Retired> = Vec::new();
    let mut current: Option<(i64, Retired, Option<jiff::Timestamp>, Vec<Attempt>)> = None;
    let finish = |(_, mut r, claimed_at, attempts): (i64, Retired, _, Vec<Attempt>)| {
        r.detail = OccurrenceDetail::assemble(r.detail.occurrence, claimed_at, attempts);
        r
    };
    for row in &rows {
        let (seq, occurrence) = occurrence_row(row, now)?;
        if current.as_ref().is_none_or(|(s, ..)| *s != seq) {
            if let Some(done) = current.take() {
                out.push(finish(done));
            }
            current = Some((
                seq,
                Retired {
                    tenant: TenantId(row.get(28)),
                    tenant_name: row.get(29),
                    detail: OccurrenceDetail {
                        occurrence,
                        attempts: Vec::new(),
                        payload: None,
                    },
                    payload: row.get(31),
                },
                opt_ts(row.get(19))?,
                Vec::new(),
            ));
        }
        if row.get::<_, Option<i64>>(20).is_some()
            && let Some((_, _, _, attempts)) = current.as_mut()
        {
            attempts.push(attempt_row(row)?);
        }
    }
    if let Some(done) = current.take() {
        out.push(finish(done));
    }
    out.retain(|r| r.detail.occurrence.state.is_final());
    Ok(out)
}

pub(crate) async fn batch_close(c: &mut Client, p: RetentionBatchClose) -> R<RetentionClosed> {
    let tx = c.transaction().await.map_err(pg_err)?;
    lock_retention(&tx).await?;
    let open = query(
        &tx,
        "SELECT owner, ids, abandoned FROM retention_batches WHERE id = $1",
        &[&p.batch],
    )
    .await?;
    let Some(row) = open.first() else {
        return Err(StoreError::WrongState(format!(
            "retention batch {} is not open",
            p.batch
        )));
    };
    let (owner, mut chosen, abandoned): (String, Vec<Uuid>, bool) =
        (row.get(0), row.get(1), row.get(2));
    if owner != p.node {
        return Err(StoreError::WrongState(format!(
            "retention batch {} is held by '{owner}'",
            p.batch
        )));
    }
    if abandoned {
        // Its files are gone (the caller deleted them): forget it.
        execute(
            &tx,
            "DELETE FROM retention_batches WHERE id = $1",
            &[&p.batch],
        )
        .await?;
        tx.commit().await.map_err(pg_err)?;
        return Ok(RetentionClosed {
            abandoned: true,
            ..RetentionClosed::default()
        });
    }
    chosen.sort();
    let mut archived: Vec<Uuid> = p.items.iter().map(|k| k.id.0).collect();
    archived.sort();
    archived.dedup();
    // Every occurrence as the archive holds it (locked against a redrive until the end, in id
    // order), with no delivery pending, or nothing is removed.
    let unchanged = archived == chosen && {
        let held = query(
            &tx,
            "SELECT o.id, o.epoch, o.state, o.finished_at,
                    EXISTS (SELECT 1 FROM outbox b
                             WHERE b.occurrence_id = o.id AND b.settled_at IS NULL)
               FROM occurrences o WHERE o.id = ANY($1) ORDER BY o.id FOR UPDATE",
            &[&chosen],
        )
        .await?;
        let keys: std::collections::HashMap<Uuid, &ArchivedKey> =
            p.items.iter().map(|k| (k.id.0, k)).collect();
        held.len() == chosen.len()
            && held.iter().all(|r| {
                keys.get(&r.get::<_, Uuid>(0)).is_some_and(|k| {
                    k.epoch == r.get::<_, i64>(1)
                        && k.state.is_final()
                        && stored_state(r.get(2)).is_ok_and(|s| s == k.state)
                        && k.finished_at.map(|t| t.as_millisecond()) == r.get::<_, Option<i64>>(3)
                        && !r.get::<_, bool>(4)
                })
            })
    };
    let closed = if unchanged {
        let rows = query(&tx, REMOVE, &[&chosen]).await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Database("no removal counts returned".into()))?;
        RetentionClosed {
            removed: row.get::<_, i64>(0).max(0) as u64,
            attempts_removed: row.get::<_, i64>(1).max(0) as u64,
            abandoned: false,
        }
    } else {
        // Given up: marked, kept open until its files are deleted.
        execute(
            &tx,
            "UPDATE retention_batches SET abandoned = true WHERE id = $1",
            &[&p.batch],
        )
        .await?;
        tx.commit().await.map_err(pg_err)?;
        return Ok(RetentionClosed {
            abandoned: true,
            ..RetentionClosed::default()
        });
    };
    execute(
        &tx,
        "DELETE FROM retention_batches WHERE id = $1",
        &[&p.batch],
    )
    .await?;
    tx.commit().await.map_err(pg_err)?;
    Ok(closed)
}

pub(crate) async fn rollup_list(c: &Client, p: RollupList) -> R<Vec<Rollup>> {
    query(
        c,
        "SELECT version, day, state, count, first_at, last_at FROM occurrence_rollups
          WHERE schedule_id = $1 AND tenant_id = $2 ORDER BY day, version, state",
        &[&p.schedule_id.0, &p.tenant.0],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(Rollup {
            version: u32_of(r.get(0)),
            day: ts(r.get(1))?,
            state: stored_state(r.get(2))?,
            count: r.get::<_, i64>(3).max(0) as u64,
            first_at: ts(r.get(4))?,
            last_at: ts(r.get(5))?,
        })
    })
    .collect()
}

pub(crate) async fn retention_status(c: &Client) -> R<RetentionStatus> {
    // Ids lead with their planned instant (campanile_core::occurrence_id): the first id is
    // the oldest occurrence, one index step away.
    let rows = query(
        c,
        "SELECT scheduled_for FROM occurrences ORDER BY id LIMIT 1",
        &[],
    )
    .await?;
    Ok(RetentionStatus {
        oldest: rows.first().map(|r| ts(r.get(0))).transpose()?,
    })
}
