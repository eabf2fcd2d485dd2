//! The console's overview: the due backlog, a recent window's claims and finishes, the
//! planning shards and nodes.

use campanile_core::OccurrenceId;
use campanile_store::*;
use deadpool_postgres::Client;

use crate::db::{R, opt_ts, query, resolve_now, stored_state, ts};

pub(crate) async fn overview(c: &Client, p: OverviewGet) -> R<Overview> {
    let now = resolve_now(c, p.now).await?;
    let tenant = p.tenant.map(|t| t.0);
    // Bounded: at most BACKLOG_COUNT_CAP rows are read.
    let due = query(
        c,
        "SELECT count(*), min(available_at) FROM (
             SELECT available_at FROM occurrences
              WHERE state IN ('READY', 'RETRY_WAIT') AND available_at <= $1
                AND ($3::int8 IS NULL OR tenant_id = $3) LIMIT $2) d",
        &[&now, &(BACKLOG_COUNT_CAP as i64), &tenant],
    )
    .await?;
    let (due, oldest): (i64, Option<i64>) = due.first().map_or((0, None), |r| (r.get(0), r.get(1)));
    let since = p.since.as_millisecond();
    // Occurrences planned from an hour before the window on: a range of the id index.
    let floor = OccurrenceId::floor(ts(since - 3_600_000)?).0;
    let lags = query(
        c,
        "SELECT claimed_at - available_at, claimed_at - scheduled_for FROM occurrences
          WHERE id >= $1 AND claimed_at >= $2 AND claimed_at < $3
            AND ($4::int8 IS NULL OR tenant_id = $4)
          ORDER BY claimed_at DESC LIMIT $5",
        &[&floor, &since, &now, &tenant, &i64::from(OVERVIEW_SAMPLES)],
    )
    .await?;
    let claim_lag_ms = lags.iter().map(|r| r.get::<_, i64>(0).max(0)).collect();
    let schedule_lag_ms = lags.iter().map(|r| r.get::<_, i64>(1).max(0)).collect();
    let finished = query(
        c,
        "SELECT state, count(*) FROM occurrences
          WHERE id >= $1 AND finished_at >= $2 AND finished_at < $3
            AND ($4::int8 IS NULL OR tenant_id = $4)
          GROUP BY state ORDER BY state",
        &[&floor, &since, &now, &tenant],
    )
    .await?
    .iter()
    .map(|r| {
        Ok((
            stored_state(r.get::<_, &str>(0))?,
            r.get::<_, i64>(1) as u64,
        ))
    })
    .collect::<R<Vec<_>>>()?;
    let per_minute = query(
        c,
        "SELECT finished_at / 60000, count(*) FROM occurrences
          WHERE id >= $1 AND finished_at >= $2 AND finished_at < $3
            AND ($4::int8 IS NULL OR tenant_id = $4)
          GROUP BY 1 ORDER BY 1",
        &[&floor, &since, &now, &tenant],
    )
    .await?
    .iter()
    .map(|r| Ok((ts(r.get::<_, i64>(0) * 60_000)?, r.get::<_, i64>(1) as u64)))
    .collect::<R<Vec<_>>>()?;
    let shards = query(
        c,
        "SELECT shard, owner, epoch, lease_until FROM shard_leases ORDER BY shard",
        &[],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(ShardHold {
            shard: r.get(0),
            owner: r.get(1),
            epoch: r.get(2),
            lease_until: opt_ts(r.get(3))?,
        })
    })
    .collect::<R<Vec<_>>>()?;
    let nodes = query(
        c,
        "SELECT node, alive_until FROM planner_nodes ORDER BY node",
        &[],
    )
    .await?
    .iter()
    .map(|r| Ok((r.get::<_, String>(0), ts(r.get(1))?)))
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
