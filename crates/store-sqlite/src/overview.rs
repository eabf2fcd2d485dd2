//! The console's overview: the due backlog, a recent window's claims and finishes, the
//! planning shards and nodes.

use campanile_core::OccurrenceId;
use campanile_store::*;
use rusqlite::{Connection, params};

use crate::db::{R, db_err, opt_ts, stored_state, ts};

pub(crate) fn overview(c: &Connection, p: &OverviewGet, now: i64) -> R<Overview> {
    let tenant = p.tenant.map(|t| t.0);
    // Bounded: at most BACKLOG_COUNT_CAP rows are read, from the two pending indexes.
    let (due, oldest): (i64, Option<i64>) = c
        .prepare_cached(
            "SELECT COUNT(*), MIN(available_at) FROM (
                 SELECT available_at FROM occurrences
                  WHERE state IN ('READY', 'RETRY_WAIT') AND overlap = 0 AND available_at <= ?1
                    AND (?3 IS NULL OR tenant_id = ?3)
                 UNION ALL
                 SELECT available_at FROM occurrences
                  WHERE state IN ('READY', 'RETRY_WAIT') AND overlap <> 0 AND available_at <= ?1
                    AND (?3 IS NULL OR tenant_id = ?3)
                 LIMIT ?2)",
        )
        .and_then(|mut s| {
            s.query_row(params![now, BACKLOG_COUNT_CAP as i64, tenant], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
        })
        .map_err(db_err)?;
    let since = p.since.as_millisecond();
    // Occurrences planned from an hour before the window on: a range of the id index.
    let floor = OccurrenceId::floor(ts(since - 3_600_000)?).0;
    let mut claim_lag_ms = Vec::new();
    let mut schedule_lag_ms = Vec::new();
    {
        let mut s = c
            .prepare_cached(
                "SELECT claimed_at - available_at, claimed_at - scheduled_for FROM occurrences
                  WHERE id >= ?1 AND claimed_at >= ?2 AND claimed_at < ?3
                    AND (?4 IS NULL OR tenant_id = ?4)
                  ORDER BY claimed_at DESC LIMIT ?5",
            )
            .map_err(db_err)?;
        let rows = s
            .query_map(params![floor, since, now, tenant, OVERVIEW_SAMPLES], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
            })
            .map_err(db_err)?;
        for row in rows {
            let (claim, schedule) = row.map_err(db_err)?;
            claim_lag_ms.push(claim.max(0));
            schedule_lag_ms.push(schedule.max(0));
        }
    }
    let mut finished = Vec::new();
    {
        let mut s = c
            .prepare_cached(
                "SELECT state, COUNT(*) FROM occurrences
                  WHERE id >= ?1 AND finished_at >= ?2 AND finished_at < ?3
                    AND (?4 IS NULL OR tenant_id = ?4)
                  GROUP BY state ORDER BY state",
            )
            .map_err(db_err)?;
        let rows = s
            .query_map(params![floor, since, now, tenant], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
            })
            .map_err(db_err)?;
        for row in rows {
            let (state, n) = row.map_err(db_err)?;
            finished.push((stored_state(&state)?, n as u64));
        }
    }
    let mut per_minute = Vec::new();
    {
        let mut s = c
            .prepare_cached(
                "SELECT finished_at / 60000, COUNT(*) FROM occurrences
                  WHERE id >= ?1 AND finished_at >= ?2 AND finished_at < ?3
                    AND (?4 IS NULL OR tenant_id = ?4)
                  GROUP BY 1 ORDER BY 1",
            )
            .map_err(db_err)?;
        let rows = s
            .query_map(params![floor, since, now, tenant], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
            })
            .map_err(db_err)?;
        for row in rows {
            let (minute, n) = row.map_err(db_err)?;
            per_minute.push((ts(minute * 60_000)?, n as u64));
        }
    }
    let shards = c
        .prepare_cached("SELECT shard, owner, epoch, lease_until FROM shard_leases ORDER BY shard")
        .and_then(|mut s| {
            s.query_map([], |r| {
                Ok((
                    r.get::<_, i32>(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get::<_, Option<i64>>(3)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(db_err)?
        .into_iter()
        .map(|(shard, owner, epoch, until)| {
            Ok(ShardHold {
                shard,
                owner,
                epoch,
                lease_until: opt_ts(until)?,
            })
        })
        .collect::<R<Vec<_>>>()?;
    let nodes = c
        .prepare_cached("SELECT node, alive_until FROM planner_nodes ORDER BY node")
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(db_err)?
        .into_iter()
        .map(|(n, t)| Ok((n, ts(t)?)))
        .collect::<R<Vec<_>>>()?;
    Ok(Overview {
        due: due as u64,
        oldest_due_at: opt_ts(oldest)?,
        claim_lag_ms,
        schedule_lag_ms,
        finished,
        per_minute,
        shards,
        nodes,
    })
}
