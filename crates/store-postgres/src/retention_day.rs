//! Occurrences partitioned by UTC day (migration 23): the days created ahead, and retention
//! taking a whole day out of the hot store by detaching and dropping its partition instead of
//! deleting its rows (docs/DESIGN.md, "Why are occurrences partitioned by day on
//! PostgreSQL?").
//!
//! A day goes through `retention_days` states, each step restartable, under the
//! `retention_lock` row that row-by-row batches take too: sealed (a trigger on the partition
//! refuses every insert, update and delete: what is archived is what is dropped), decided (its
//! survivors, rollups and newest row recorded), detached (its partition out of `occurrences`,
//! survivors moved to the default partition and rollups added, in one transaction), then
//! dropped with the attempts and settled deliveries of the rows that left.

use campanile_store::*;
use deadpool_postgres::{Client, GenericClient, Transaction};
use uuid::Uuid;

use crate::db::{R, dur_ms, execute, pg_err, query, resolve_now, ts};
use crate::retention::lock_retention;

const DAY_MS: i64 = 86_400_000;

/// How long detaching a day waits for the statements using `occurrences` (it needs the table
/// to itself for a moment, and the statements that come after wait behind it meanwhile); past
/// it the step fails and is tried again on a later pass.
const DETACH_LOCK_TIMEOUT: &str = "1s";

/// How long sealing a day waits for the writers of its partition (the writers that come after
/// wait behind it meanwhile).
const SEAL_LOCK_TIMEOUT: &str = "500ms";

pub(crate) async fn days_prepare(c: &mut Client, p: OccurrenceDaysPrepare) -> R<u32> {
    let now = resolve_now(&*c, p.now).await?;
    let today = now.div_euclid(DAY_MS) * DAY_MS;
    // One creator at a time across nodes, for the whole preparation (its steps are several
    // transactions); released on every way out (and by the server if the session dies).
    execute(
        &*c,
        "SELECT pg_advisory_lock(hashtextextended('campanile/occurrence_days', 0))",
        &[],
    )
    .await?;
    let mut created = 0;
    let mut result = Ok(());
    for k in -1..=i64::from(p.ahead) {
        match prepare_day(c, today + k * DAY_MS, k > 0).await {
            Ok(made) => created += u32::from(made),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let unlocked = execute(
        &*c,
        "SELECT pg_advisory_unlock(hashtextextended('campanile/occurrence_days', 0))",
        &[],
    )
    .await;
    result?;
    unlocked?;
    Ok(created)
}

/// Creates the day starting at `day` if it has no partition; whether it did. A day still to
/// come (`future`) is first proved absent from the default partition by a check validated
/// without blocking writers, so that attaching it does not scan the default partition while
/// holding it (claims would wait for that scan); the check goes in the attaching transaction.
async fn prepare_day(c: &mut Client, day: i64, future: bool) -> R<bool> {
    let name = day_name(day)?;
    let proof = format!("{name}_not_default");
    if day_exists(&*c, &name).await? {
        // A proof a node left behind (it stopped before attaching) would refuse the day's
        // rows from the default partition once the day is dropped.
        if proof_exists(&*c, &proof).await? {
            c.batch_execute(&format!(
                "BEGIN; SET LOCAL lock_timeout = '{DETACH_LOCK_TIMEOUT}';
                 ALTER TABLE occurrences_default DROP CONSTRAINT IF EXISTS {proof}; COMMIT;"
            ))
            .await
            .map_err(pg_err)?;
        }
        return Ok(false);
    }
    let proved = future && prove_absent(c, day, &proof).await?;
    let tx = c.transaction().await.map_err(pg_err)?;
    // Attaching locks the default partition (claims wait behind it): it waits for the lock at
    // most this long, and is tried again on a later pass.
    tx.batch_execute(&format!("SET LOCAL lock_timeout = '{DETACH_LOCK_TIMEOUT}'"))
        .await
        .map_err(pg_err)?;
    query(&tx, "SELECT campanile_occurrence_day($1)", &[&day]).await?;
    if proved {
        tx.batch_execute(&format!(
            "ALTER TABLE occurrences_default DROP CONSTRAINT IF EXISTS {proof}"
        ))
        .await
        .map_err(pg_err)?;
    }
    tx.commit().await.map_err(pg_err)?;
    Ok(true)
}

async fn proof_exists<C: GenericClient>(c: &C, proof: &str) -> R<bool> {
    Ok(query(
        c,
        "SELECT EXISTS (SELECT 1 FROM pg_constraint
                         WHERE conrelid = 'occurrences_default'::regclass AND conname = $1)",
        &[&proof],
    )
    .await?
    .first()
    .is_some_and(|r| r.get(0)))
}

/// Adds to the default partition a check that it holds no row of the day, and validates it
/// (a scan that does not block writers); whether it holds. When the default partition does
/// hold rows of the day, the check goes again and the day is created the slow way.
async fn prove_absent(c: &Client, day: i64, proof: &str) -> R<bool> {
    let (lo, hi) = (day_bound(day), day_bound(day + DAY_MS));
    if !proof_exists(c, proof).await? {
        c.batch_execute(&format!(
            "BEGIN; SET LOCAL lock_timeout = '{DETACH_LOCK_TIMEOUT}';
             ALTER TABLE occurrences_default ADD CONSTRAINT {proof}
                 CHECK (NOT (id >= '{lo}' AND id < '{hi}')) NOT VALID;
             COMMIT;"
        ))
        .await
        .map_err(pg_err)?;
    }
    match c
        .batch_execute(&format!(
            "ALTER TABLE occurrences_default VALIDATE CONSTRAINT {proof}"
        ))
        .await
    {
        Ok(()) => Ok(true),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION) => {
            c.batch_execute(&format!(
                "ALTER TABLE occurrences_default DROP CONSTRAINT IF EXISTS {proof}"
            ))
            .await
            .map_err(pg_err)?;
            Ok(false)
        }
        Err(e) => Err(pg_err(e)),
    }
}

/// The partition name of the UTC day starting at `day` (ms): `occurrences_YYYYMMDD`.
fn day_name(day: i64) -> R<String> {
    let date = jiff::tz::Offset::UTC.to_datetime(ts(day)?).date();
    Ok(format!(
        "occurrences_{:04}{:02}{:02}",
        date.year(),
        date.month(),
        date.day()
    ))
}

/// The UTC midnight (ms) a day partition's name stands for.
fn day_of(name: &str) -> Option<i64> {
    let digits = name.strip_prefix("occurrences_")?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let year: i16 = digits[..4].parse().ok()?;
    let month: i8 = digits[4..6].parse().ok()?;
    let day: i8 = digits[6..].parse().ok()?;
    let date = jiff::civil::Date::new(year, month, day).ok()?;
    let midnight = jiff::tz::Offset::UTC
        .to_timestamp(date.to_datetime(jiff::civil::Time::midnight()))
        .ok()?;
    Some(midnight.as_millisecond())
}

async fn day_exists<C: GenericClient>(c: &C, name: &str) -> R<bool> {
    Ok(query(
        c,
        "SELECT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class k ON k.oid = i.inhrelid
                         WHERE i.inhparent = 'occurrences'::regclass AND k.relname = $1)",
        &[&name],
    )
    .await?
    .first()
    .is_some_and(|r| r.get(0)))
}

/// The lowest id of the day starting at `day` (ms): its milliseconds, then zeros.
fn day_bound(day: i64) -> Uuid {
    let mut b = [0u8; 16];
    b[..6].copy_from_slice(&(day as u64).to_be_bytes()[2..]);
    Uuid::from_bytes(b)
}

/// A day partition's name, checked to be one (it is spliced into statements).
fn checked(name: &str) -> R<&str> {
    if day_of(name).is_some() {
        Ok(name)
    } else {
        Err(StoreError::Invalid(format!(
            "'{name}' is not a day of occurrences"
        )))
    }
}

pub(crate) async fn day_open(c: &mut Client, p: RetentionDayOpen) -> R<Option<RetentionDay>> {
    let Some(default) = p.default_retention.map(dur_ms) else {
        return Ok(None);
    };
    let now = resolve_now(&*c, p.now).await?;
    let lease_until = now.saturating_add(dur_ms(p.lease));
    let tx = c.transaction().await.map_err(pg_err)?;
    lock_retention(&tx).await?;
    let open = query(
        &tx,
        "SELECT name, owner, lease_until, state FROM retention_days ORDER BY day LIMIT 1",
        &[],
    )
    .await?;
    if let Some(row) = open.first() {
        let (name, owner, until, state): (String, Option<String>, Option<i64>, String) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        if owner.as_deref().is_some_and(|o| o != p.node) && until.is_some_and(|u| u > now) {
            return Ok(None); // another node's, and it is alive
        }
        execute(
            &tx,
            "UPDATE retention_days SET owner = $2, lease_until = $3 WHERE name = $1",
            &[&name, &p.node, &lease_until],
        )
        .await?;
        if state == "sealed" {
            decide(&tx, &name, now, default).await?;
        }
        let day = described(&tx, &name, true).await?;
        tx.commit().await.map_err(pg_err)?;
        return Ok(Some(day));
    }
    // A batch of row-by-row retention left open may hold rows of the day: finished first.
    let batch_open = query(&tx, "SELECT 1 FROM retention_batches LIMIT 1", &[]).await?;
    if !batch_open.is_empty() {
        return Ok(None);
    }
    tx.commit().await.map_err(pg_err)?;
    // The days whose whole span is older than the default retention, oldest first; a day
    // that cannot be sealed (work or a delivery still pending on it) is left for row-by-row
    // retention, and the next one tried.
    let due: Vec<(String, i64)> = query(
        &*c,
        "SELECT k.relname FROM pg_inherits i JOIN pg_class k ON k.oid = i.inhrelid
          WHERE i.inhparent = 'occurrences'::regclass AND k.relname ~ '^occurrences_[0-9]{8}$'
          ORDER BY k.relname",
        &[],
    )
    .await?
    .iter()
    .filter_map(|r| {
        let name: String = r.get(0);
        day_of(&name).map(|d| (name, d))
    })
    .filter(|(_, d)| d + DAY_MS <= now - default)
    .collect();
    for (name, day) in due {
        if let Some(sealed) = seal(c, &p.node, &name, day, now, lease_until, default).await? {
            return Ok(Some(sealed));
        }
    }
    Ok(None)
}

/// Seals a day (a short transaction: its writers wait for it), then decides it (another: the
/// day's rows are read, not locked); `None` (nothing changed) when work or a delivery is still
/// pending on it, or another day or a batch was opened meanwhile.
async fn seal(
    c: &mut Client,
    node: &str,
    name: &str,
    day: i64,
    now: i64,
    lease_until: i64,
    default: i64,
) -> R<Option<RetentionDay>> {
    let name = checked(name)?;
    let tx = c.transaction().await.map_err(pg_err)?;
    lock_retention(&tx).await?;
    let busy = query(
        &tx,
        "SELECT 1 FROM retention_days UNION ALL SELECT 1 FROM retention_batches LIMIT 1",
        &[],
    )
    .await?;
    if !busy.is_empty() {
        return Ok(None);
    }
    let sealed = tx
        .batch_execute(&format!(
            "SET LOCAL lock_timeout = '{SEAL_LOCK_TIMEOUT}';
             CREATE TRIGGER retention_sealed BEFORE INSERT OR UPDATE OR DELETE ON {name}
                 FOR EACH ROW EXECUTE FUNCTION campanile_sealed_day();"
        ))
        .await;
    match sealed {
        Ok(()) => {}
        // Its writers did not let go in time: as good as held, for this pass.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
            tracing::debug!(
                day = name,
                "retention: a day's writers kept it; tried again later"
            );
            return Ok(None);
        }
        Err(e) => return Err(pg_err(e)),
    }
    let pending: bool = tx
        .query_one(
            &format!(
                "SELECT EXISTS (SELECT 1 FROM {name}
                                 WHERE state IN ('READY', 'RETRY_WAIT', 'RUNNING'))
                     OR EXISTS (SELECT 1 FROM outbox b JOIN {name} o ON o.id = b.occurrence_id
                                 WHERE b.settled_at IS NULL)"
            ),
            &[],
        )
        .await
        .map_err(pg_err)?
        .get(0);
    if pending {
        tracing::debug!(
            day = name,
            "retention: a day with work or a delivery pending is left to row-by-row retention"
        );
        metrics::counter!("campanile_retention_days_held_total").increment(1);
        return Ok(None); // rolled back: the trigger goes with it
    }
    execute(
        &tx,
        "INSERT INTO retention_days (name, day, lo, hi, state, sealed_at, owner, lease_until)
         VALUES ($1, $2, $3, $4, 'sealed', $5, $6, $7)",
        &[
            &name,
            &day,
            &day_bound(day),
            &day_bound(day + DAY_MS),
            &now,
            &node,
            &lease_until,
        ],
    )
    .await?;
    tx.commit().await.map_err(pg_err)?;
    let tx = c.transaction().await.map_err(pg_err)?;
    lock_retention(&tx).await?;
    decide(&tx, name, now, default).await?;
    let sealed = described(&tx, name, false).await?;
    tx.commit().await.map_err(pg_err)?;
    Ok(Some(sealed))
}

/// Records which rows of a sealed day stay (their schedule's latest, or their tenant keeps
/// history longer than the default or forever, judged at `now`), what the others add to the
/// rollups, and the day's newest row. Whether a row is its schedule's latest is asked once per
/// schedule of the day (of its last instant in the day), not once per row.
async fn decide(tx: &Transaction<'_>, name: &str, now: i64, default: i64) -> R<()> {
    let name = checked(name)?;
    let sql = format!(
        "WITH last_in_day AS (
             SELECT schedule_id, max(scheduled_for) AS at FROM {name} GROUP BY schedule_id),
         latest AS (
             SELECT l.schedule_id, l.at FROM last_in_day l
              WHERE NOT EXISTS (SELECT 1 FROM occurrences n
                                 WHERE n.schedule_id = l.schedule_id AND n.scheduled_for > l.at)),
         stay AS (
             SELECT o.id FROM {name} o JOIN tenants t ON t.id = o.tenant_id
              WHERE COALESCE(t.retention_ms, $2) = 0
                 OR o.scheduled_for >= $1 - COALESCE(t.retention_ms, $2)
                 OR COALESCE(o.finished_at, o.scheduled_for) >= $1 - COALESCE(t.retention_ms, $2)
                 OR EXISTS (SELECT 1 FROM latest l
                             WHERE l.schedule_id = o.schedule_id AND l.at = o.scheduled_for)),
         leaving AS (
             SELECT o.* FROM {name} o WHERE NOT EXISTS (SELECT 1 FROM stay s WHERE s.id = o.id)),
         counted AS (
             SELECT tenant_id, schedule_id, version,
                    scheduled_for - ((scheduled_for % 86400000) + 86400000) % 86400000 AS day,
                    state, count(*) AS count, min(scheduled_for) AS first_at,
                    max(scheduled_for) AS last_at
               FROM leaving GROUP BY 1, 2, 3, 4, 5)
         UPDATE retention_days
            SET state = 'decided',
                survivors = (SELECT COALESCE(array_agg(id ORDER BY id), '{{}}') FROM stay),
                rollups = (SELECT COALESCE(jsonb_agg(to_jsonb(counted)), '[]') FROM counted),
                max_seq = (SELECT max(seq) FROM {name}),
                archived = (SELECT count(*) FROM leaving)
          WHERE name = $3"
    );
    tx.execute(&sql, &[&now, &default, &name])
        .await
        .map_err(pg_err)?;
    Ok(())
}

async fn described<C: GenericClient>(c: &C, name: &str, resumed: bool) -> R<RetentionDay> {
    let rows = query(
        c,
        "SELECT day, state, COALESCE(archived, 0), COALESCE(cardinality(survivors), 0)
           FROM retention_days WHERE name = $1",
        &[&name],
    )
    .await?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::WrongState(format!("day {name} is not open")))?;
    Ok(RetentionDay {
        name: name.to_string(),
        day: ts(row.get(0))?,
        resumed,
        detached: row.get::<_, String>(1) == "detached",
        leaving: row.get::<_, i64>(2).max(0) as u64,
        survivors: u64::try_from(row.get::<_, i32>(3)).unwrap_or(0),
    })
}

pub(crate) async fn day_read(c: &Client, p: RetentionDayRead) -> R<Vec<Retired>> {
    let name = checked(&p.name)?;
    let now = resolve_now(c, p.now).await?;
    // The hold, renewed, or this node's no longer: it must not write the day's files.
    let held = execute(
        c,
        "UPDATE retention_days SET lease_until = $3
          WHERE name = $1 AND owner = $2 AND state = 'decided'",
        &[&name, &p.node, &now.saturating_add(dur_ms(p.lease))],
    )
    .await?;
    if held == 0 {
        return Err(StoreError::WrongState(format!(
            "day {name} is not open for '{}' to archive",
            p.node
        )));
    }
    let after = p.after.map_or(Uuid::nil(), |a| a.0);
    let ids: Vec<Uuid> = c
        .query(
            &format!(
                "SELECT o.id FROM {name} o, retention_days d
                  WHERE d.name = $1 AND d.state = 'decided' AND o.id > $2
                    AND NOT (o.id = ANY(d.survivors))
                  ORDER BY o.id LIMIT $3"
            ),
            &[&name, &after, &i64::from(p.limit)],
        )
        .await
        .map_err(pg_err)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut rows = crate::retention::read_retired(c, &ids, now).await?;
    // Every row chosen, or none: a row left out here would be dropped with the day unarchived.
    if rows.len() != ids.len() {
        return Err(StoreError::Database(format!(
            "day {name}: {} of {} rows could be read for the archive",
            rows.len(),
            ids.len()
        )));
    }
    rows.sort_by_key(|r| r.detail.occurrence.id);
    Ok(rows)
}

pub(crate) async fn day_close(c: &mut Client, p: RetentionDayClose) -> R<RetentionDayClosed> {
    let name = checked(&p.name)?.to_string();
    let name = name.as_str();
    let tx = c.transaction().await.map_err(pg_err)?;
    lock_retention(&tx).await?;
    let rows = query(
        &tx,
        "SELECT owner, state, max_seq, COALESCE(archived, 0), COALESCE(cardinality(survivors), 0)
           FROM retention_days WHERE name = $1",
        &[&name],
    )
    .await?;
    let Some(row) = rows.first() else {
        return Err(StoreError::WrongState(format!("day {name} is not open")));
    };
    let (owner, state, max_seq): (Option<String>, String, Option<i64>) =
        (row.get(0), row.get(1), row.get(2));
    let removed = row.get::<_, i64>(3).max(0) as u64;
    let kept = u64::try_from(row.get::<_, i32>(4)).unwrap_or(0);
    if owner.as_deref() != Some(p.node.as_str()) {
        return Err(StoreError::WrongState(format!(
            "day {name} is held by '{}'",
            owner.unwrap_or_default()
        )));
    }
    match state.as_str() {
        "decided" => {
            let newest: Option<i64> = tx
                .query_one(&format!("SELECT max(seq) FROM {name}"), &[])
                .await
                .map_err(pg_err)?
                .get(0);
            if newest != max_seq {
                execute(
                    &tx,
                    "UPDATE retention_days SET state = 'sealed' WHERE name = $1",
                    &[&name],
                )
                .await?;
                tx.commit().await.map_err(pg_err)?;
                return Ok(RetentionDayClosed {
                    redo: true,
                    ..RetentionDayClosed::default()
                });
            }
            execute(
                &tx,
                "INSERT INTO occurrence_rollups AS r
                        (tenant_id, schedule_id, version, day, state, count, first_at, last_at)
                 SELECT x.tenant_id, x.schedule_id, x.version, x.day, x.state, x.count,
                        x.first_at, x.last_at
                   FROM retention_days d,
                        jsonb_to_recordset(d.rollups) AS x(tenant_id bigint, schedule_id uuid,
                            version int, day bigint, state text, count bigint, first_at bigint,
                            last_at bigint)
                  WHERE d.name = $1
                 ON CONFLICT (schedule_id, version, day, state) DO UPDATE
                    SET count = r.count + excluded.count,
                        first_at = LEAST(r.first_at, excluded.first_at),
                        last_at = GREATEST(r.last_at, excluded.last_at)",
                &[&name],
            )
            .await?;
            // Counted first (the same transaction), so that `occurrences` is this
            // transaction's alone for as short as can be: the partition leaves and its
            // survivors come back into the default partition.
            tx.batch_execute(&format!(
                "SET LOCAL lock_timeout = '{DETACH_LOCK_TIMEOUT}';
                 ALTER TABLE occurrences DETACH PARTITION {name};"
            ))
            .await
            .map_err(pg_err)?;
            tx.execute(
                &format!(
                    "INSERT INTO occurrences SELECT o.* FROM {name} o, retention_days d
                      WHERE d.name = $1 AND o.id = ANY(d.survivors)"
                ),
                &[&name],
            )
            .await
            .map_err(pg_err)?;
            execute(
                &tx,
                "UPDATE retention_days SET state = 'detached' WHERE name = $1",
                &[&name],
            )
            .await?;
            tx.commit().await.map_err(pg_err)?;
        }
        "detached" => {
            tx.commit().await.map_err(pg_err)?;
        }
        other => {
            return Err(StoreError::WrongState(format!(
                "day {name} is {other}, not archived"
            )));
        }
    }
    // Detached: what is left is the partition itself, and the attempts and settled
    // deliveries of the rows that left with it.
    let tx = c.transaction().await.map_err(pg_err)?;
    // One statement, which picks the rows that left once.
    let attempts_removed: i64 = tx
        .query_one(
            &format!(
                "WITH gone AS (
                     SELECT o.seq, o.id FROM {name} o, retention_days d
                      WHERE d.name = $1 AND NOT (o.id = ANY(d.survivors))),
                 attempts_gone AS (
                     DELETE FROM attempts a USING gone g WHERE a.occurrence_seq = g.seq
                     RETURNING 1),
                 outbox_gone AS (
                     DELETE FROM outbox b USING gone g
                      WHERE b.occurrence_id = g.id AND b.settled_at IS NOT NULL RETURNING 1),
                 keys_gone AS (
                     DELETE FROM occurrence_triggers k USING gone g
                      WHERE k.occurrence_id = g.id RETURNING 1)
                 SELECT (SELECT count(*) FROM attempts_gone)"
            ),
            &[&name],
        )
        .await
        .map_err(pg_err)?
        .get(0);
    tx.batch_execute(&format!("DROP TABLE {name}"))
        .await
        .map_err(pg_err)?;
    execute(&tx, "DELETE FROM retention_days WHERE name = $1", &[&name]).await?;
    tx.commit().await.map_err(pg_err)?;
    Ok(RetentionDayClosed {
        removed,
        kept,
        attempts_removed: attempts_removed.max(0) as u64,
        redo: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_is_named_by_its_utc_date_and_read_back() {
        let day = 1_800_000_000_000_i64.div_euclid(DAY_MS) * DAY_MS;
        let name = day_name(day).unwrap_or_default();
        assert_eq!(name, "occurrences_20270115");
        assert_eq!(day_of(&name), Some(day));
        for bad in [
            "occurrences_default",
            "occurrences_2027011",
            "occurrences_2027o115",
            "x",
        ] {
            assert_eq!(day_of(bad), None, "{bad}");
        }
        // The day's lowest id sorts after every id of the day before.
        let id = campanile_core::occurrence_id(
            campanile_core::ScheduleId(Uuid::nil()),
            1,
            ts(day - 1).unwrap_or(jiff::Timestamp::UNIX_EPOCH),
        );
        assert!(id.0 < day_bound(day));
        assert!(
            day_bound(day)
                <= campanile_core::occurrence_id(
                    campanile_core::ScheduleId(Uuid::nil()),
                    1,
                    ts(day).unwrap_or(jiff::Timestamp::UNIX_EPOCH),
                )
                .0
        );
    }
}
