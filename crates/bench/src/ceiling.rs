//! `campanile bench ceiling`: the raw-SQL claim + complete that keeps Campanile's guarantees,
//! with nothing else — the ceiling the throughput benchmarks measure themselves against.
//!
//! The same durability (SQLite: WAL with `synchronous = FULL`, as the store opens it;
//! PostgreSQL: `synchronous_commit = on`), the same unique key `(schedule_id, version,
//! scheduled_for)`, the same lease and epoch columns: a claim takes due rows and rows whose
//! lease has expired (an index of running leases finds them: without it, a dead worker's rows
//! would never run), oldest first, sets owner, epoch + 1 and a lease, and commits; a completion
//! is accepted only from the owner at the current epoch inside the lease, and commits. What it
//! leaves out is all Campanile adds: tenants, quotas, overlap policies, attempts history,
//! payloads, the HTTP layer. On SQLite one connection does both (the file has one writer);
//! on PostgreSQL each of `--workers` connections loops claim, complete (`FOR UPDATE SKIP
//! LOCKED`), and the figure is the better of `--workers` and 2 connections.
//!
//! Each step is one transaction that completes the batch held and claims the next, as a worker
//! whose report carries its next claim does; a batch of 1 is the fsync-bound ceiling of that:
//! a commit per occurrence. (Campanile also commits several workers' requests together on
//! SQLite's writer, which the ceiling does not: at batch 1 the store can pass it.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Args;
use serde_json::json;

use crate::common::{Backend, Common};
use crate::error::BenchError;

/// The ceiling's workers unless `--workers` says otherwise.
pub(crate) const WORKERS: u32 = 8;

/// Arguments of `campanile bench ceiling`.
#[derive(Debug, Args)]
pub struct CeilingArgs {
    #[command(flatten)]
    common: Common,
    /// Occurrences per batch size.
    #[arg(long, default_value_t = 100_000)]
    occurrences: u32,
    /// Batch sizes to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
    batch: Vec<u32>,
    /// Concurrent workers (PostgreSQL; SQLite has one writer).
    #[arg(long, default_value_t = WORKERS)]
    workers: u32,
}

pub(crate) fn run(args: CeilingArgs) -> Result<(), BenchError> {
    if args.occurrences == 0 || args.workers == 0 || args.batch.contains(&0) {
        return Err(BenchError::usage(
            "--occurrences, --workers and every --batch must be positive",
        ));
    }
    crate::error::block_on(async {
        let mut results = Vec::new();
        for &batch in &args.batch {
            let r = rate(&args.common, args.occurrences, batch, args.workers).await?;
            results.push(json!({"batch": batch, "occurrences": args.occurrences,
                                "seconds": f64::from(args.occurrences) / r.max(1e-9),
                                "occurrences_per_sec": r}));
        }
        println!(
            "campanile bench ceiling — {:?}, raw SQL claim + complete, {} occurrences per batch \
             size, {} workers",
            args.common.backend, args.occurrences, args.workers
        );
        crate::common::print_rates(&results);
        if args.common.json {
            println!(
                "{}",
                json!({"bench": "ceiling", "backend": args.common.backend,
                       "occurrences": args.occurrences, "workers": args.workers,
                       "results": results})
            );
        }
        Ok(())
    })
}

/// Whether a benchmark measures the ceiling beside itself (`--no-ceiling` skips it).
#[derive(Debug, Args)]
pub(crate) struct CeilingFlag {
    /// Do not measure the raw-SQL ceiling beside the benchmark (no `ratio_to_ceiling`).
    #[arg(long)]
    pub(crate) no_ceiling: bool,
}

/// Occurrences claimed and completed per second by the ceiling, on `common`'s backend, over
/// a fresh table of `occurrences` due rows.
pub(crate) async fn rate(
    common: &Common,
    occurrences: u32,
    batch: u32,
    workers: u32,
) -> Result<f64, BenchError> {
    match common.backend {
        Backend::Sqlite => {
            let tmp = tempfile::tempdir()
                .map_err(|e| BenchError::runtime(format!("temporary directory: {e}")))?;
            let path = tmp.path().join("ceiling.db");
            tokio::task::spawn_blocking(move || sqlite(&path, occurrences, batch))
                .await
                .map_err(|e| BenchError::runtime(format!("ceiling thread: {e}")))?
        }
        Backend::Postgres => {
            let url = common
                .database
                .clone()
                .ok_or_else(|| BenchError::usage("--backend postgres needs --database"))?;
            // The best of two connection counts: on 2 cores, 8 connections claiming with
            // SKIP LOCKED from one index walk past each other's locked and dead entries, and
            // the raw SQL can go faster with fewer. A ceiling is the best it does.
            let mut best = postgres(&url, occurrences, batch, workers).await?;
            if workers > 2 {
                best = best.max(postgres(&url, occurrences, batch, 2).await?);
            }
            Ok(best)
        }
    }
}

const SCHEMA: &str = "
    CREATE TABLE ceiling (
        seq           INTEGER PRIMARY KEY,
        id            BLOB    NOT NULL UNIQUE,
        schedule_id   BLOB    NOT NULL,
        version       INTEGER NOT NULL,
        scheduled_for INTEGER NOT NULL,
        available_at  INTEGER NOT NULL,
        state         TEXT    NOT NULL,
        owner         TEXT,
        epoch         INTEGER NOT NULL DEFAULT 0,
        lease_until   INTEGER,
        finished_at   INTEGER,
        result        TEXT,
        UNIQUE (schedule_id, version, scheduled_for));
    CREATE INDEX ceiling_ready ON ceiling (available_at) WHERE state = 'READY';
    CREATE INDEX ceiling_leased ON ceiling (lease_until) WHERE state = 'RUNNING';";

/// The SQLite ceiling's claim: at most `?2` rows due at `?1` or whose lease expired by then,
/// oldest first, taken by worker `w` with a new epoch and a lease of a minute.
const SQLITE_CLAIM: &str = "
    UPDATE ceiling SET state = 'RUNNING', owner = 'w', epoch = epoch + 1, lease_until = ?1 + 60000
     WHERE seq IN (
           SELECT seq FROM (
               SELECT * FROM (SELECT seq, available_at AS at FROM ceiling
                               WHERE state = 'READY' AND available_at <= ?1
                               ORDER BY available_at LIMIT ?2)
               UNION ALL
               SELECT * FROM (SELECT seq, lease_until AS at FROM ceiling
                               WHERE state = 'RUNNING' AND lease_until <= ?1
                               ORDER BY lease_until LIMIT ?2))
            ORDER BY at LIMIT ?2)
    RETURNING seq, epoch";

fn sqlite(path: &std::path::Path, n: u32, batch: u32) -> Result<f64, BenchError> {
    use rusqlite::params;
    let err = |e: rusqlite::Error| BenchError::runtime(format!("ceiling (SQLite): {e}"));
    let mut c = rusqlite::Connection::open(path).map_err(err)?;
    // The store writer's settings (its page cache is kept small for the same reason: see
    // `WRITER_CACHE_KIB` in campanile-store-sqlite).
    c.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA temp_store = MEMORY;
         PRAGMA cache_size = -8192; PRAGMA mmap_size = 1073741824;",
    )
    .map_err(err)?;
    c.execute_batch(SCHEMA).map_err(err)?;
    let now = jiff::Timestamp::now().as_millisecond();
    let schedule = uuid::Uuid::now_v7();
    {
        let tx = c.transaction().map_err(err)?;
        {
            let mut ins = tx
                .prepare(
                    "INSERT INTO ceiling (id, schedule_id, version, scheduled_for, available_at, state)
                     VALUES (?1, ?2, 1, ?3, ?3, 'READY')",
                )
                .map_err(err)?;
            for i in 0..i64::from(n) {
                ins.execute(params![uuid::Uuid::now_v7(), schedule, now - 1 - i])
                    .map_err(err)?;
            }
        }
        tx.commit().map_err(err)?;
    }
    let started = Instant::now();
    let mut done = 0u64;
    // As a worker whose report carries its next claim: one transaction completes the batch
    // held and claims the next; the lease is checked against the clock.
    let mut held: Vec<(i64, i64)> = Vec::new();
    loop {
        let now = jiff::Timestamp::now().as_millisecond();
        let tx = c
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        {
            let mut s = tx
                .prepare_cached(
                    "UPDATE ceiling SET state = 'SUCCEEDED', result = 'true', finished_at = ?4
                      WHERE seq = ?1 AND owner = ?2 AND epoch = ?3 AND state = 'RUNNING'
                        AND lease_until > ?4",
                )
                .map_err(err)?;
            for (seq, epoch) in &held {
                done += s.execute(params![seq, "w", epoch, now]).map_err(err)? as u64;
            }
        }
        let claimed: Vec<(i64, i64)> = {
            let mut s = tx.prepare_cached(SQLITE_CLAIM).map_err(err)?;
            s.query_map(params![now, batch], |r| Ok((r.get(0)?, r.get(1)?)))
                .map_err(err)?
                .collect::<rusqlite::Result<_>>()
                .map_err(err)?
        };
        tx.commit().map_err(err)?;
        if claimed.is_empty() {
            break;
        }
        held = claimed;
    }
    let secs = started.elapsed().as_secs_f64();
    if done != u64::from(n) {
        return Err(BenchError::runtime(format!(
            "ceiling completed {done} of {n}"
        )));
    }
    Ok(done as f64 / secs)
}

/// The PostgreSQL ceiling's claim: at most `$3` rows due at `$2` or whose lease expired by
/// then, oldest first, taken by worker `$1` with a new epoch and a lease of a minute. The
/// picked rows as an array: `seq IN (subquery)` (or a join with a CTE) is planned as a hash
/// join over a scan of the whole table.
const PG_CLAIM: &str = "
    WITH ready AS (
           SELECT seq, available_at AS at FROM ceiling
            WHERE state = 'READY' AND available_at <= $2
            ORDER BY available_at LIMIT $3 FOR UPDATE SKIP LOCKED),
         expired AS (
           SELECT seq, lease_until AS at FROM ceiling
            WHERE state = 'RUNNING' AND lease_until <= $2
            ORDER BY lease_until LIMIT $3 FOR UPDATE SKIP LOCKED)
    UPDATE ceiling SET state = 'RUNNING', owner = $1, epoch = epoch + 1, lease_until = $2 + 60000
     WHERE seq = ANY(ARRAY(SELECT seq FROM (SELECT * FROM ready UNION ALL SELECT * FROM expired) c
                            ORDER BY at LIMIT $3))
    RETURNING seq, epoch";

async fn postgres(url: &str, n: u32, batch: u32, workers: u32) -> Result<f64, BenchError> {
    let err = |e: tokio_postgres::Error| BenchError::runtime(format!("ceiling (PostgreSQL): {e}"));
    let schema = format!("ceiling_{}", uuid::Uuid::now_v7().simple());
    let connect = || async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .map_err(err)?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok::<_, BenchError>(client)
    };
    let admin = connect().await?;
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; SET search_path = {schema};
             CREATE TABLE ceiling (
                 seq           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 id            UUID    NOT NULL UNIQUE,
                 schedule_id   UUID    NOT NULL,
                 version       INTEGER NOT NULL,
                 scheduled_for BIGINT  NOT NULL,
                 available_at  BIGINT  NOT NULL,
                 state         TEXT    NOT NULL,
                 owner         TEXT,
                 epoch         BIGINT  NOT NULL DEFAULT 0,
                 lease_until   BIGINT,
                 finished_at   BIGINT,
                 result        TEXT,
                 UNIQUE (schedule_id, version, scheduled_for));
             CREATE INDEX ceiling_ready ON ceiling (available_at) WHERE state = 'READY';
             CREATE INDEX ceiling_leased ON ceiling (lease_until) WHERE state = 'RUNNING';"
        ))
        .await
        .map_err(err)?;
    let now = jiff::Timestamp::now().as_millisecond();
    admin
        .execute(
            "INSERT INTO ceiling (id, schedule_id, version, scheduled_for, available_at, state)
             SELECT gen_random_uuid(), $1, 1, $2 - g, $2 - g, 'READY'
               FROM generate_series(1, $3::int8) AS g",
            &[&uuid::Uuid::now_v7(), &now, &i64::from(n)],
        )
        .await
        .map_err(err)?;
    admin.batch_execute("ANALYZE ceiling").await.map_err(err)?;
    // Connections first, out of the timed part.
    let mut clients = Vec::new();
    for _ in 0..workers {
        let client = connect().await?;
        client
            .batch_execute(&format!(
                "SET search_path = {schema}; SET synchronous_commit = on"
            ))
            .await
            .map_err(err)?;
        clients.push(client);
    }
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (w, mut client) in clients.into_iter().enumerate() {
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let worker = format!("w{w}");
            // As a worker whose report carries its next claim: one transaction completes the
            // batch held and claims the next; the lease is checked against the database's
            // clock. The completion reads the rows by primary key and pairs each with its
            // epoch by position: a join with `unnest` of the pairs was planned as a nested
            // loop over every `RUNNING` row (the statistics, taken when all were `READY`, say
            // there are none), quadratic in the rows held, which made this "ceiling" slower
            // over 50k–100k rows than over 200k.
            let mut held: (Vec<i64>, Vec<i64>) = (Vec::new(), Vec::new());
            loop {
                let tx = client.transaction().await?;
                let now: i64 = tx
                    .query_one("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8", &[])
                    .await?
                    .get(0);
                if !held.0.is_empty() {
                    let n = tx
                        .execute(
                            "UPDATE ceiling c SET state = 'SUCCEEDED', result = 'true', finished_at = $4
                              WHERE c.seq = ANY($1::int8[])
                                AND c.epoch = ($2::int8[])[array_position($1::int8[], c.seq)]
                                AND c.owner = $3 AND c.state = 'RUNNING' AND c.lease_until > $4",
                            &[&held.0, &held.1, &worker, &now],
                        )
                        .await?;
                    done.fetch_add(n, Ordering::Relaxed);
                }
                let rows = tx
                    .query(
                        PG_CLAIM,
                        &[&worker, &now, &i64::from(batch)],
                    )
                    .await?;
                tx.commit().await?;
                if rows.is_empty() {
                    return Ok::<(), tokio_postgres::Error>(());
                }
                held = (
                    rows.iter().map(|r| r.get(0)).collect(),
                    rows.iter().map(|r| r.get(1)).collect(),
                );
            }
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| BenchError::runtime(format!("ceiling worker: {e}")))?
            .map_err(err)?;
    }
    let secs = started.elapsed().as_secs_f64();
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .map_err(err)?;
    let done = done.load(Ordering::Relaxed);
    if done != u64::from(n) {
        return Err(BenchError::runtime(format!(
            "ceiling completed {done} of {n}"
        )));
    }
    Ok(done as f64 / secs)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A row as `(seq, state, owner, epoch, available_at, lease_until)`.
    type Row = (
        i64,
        &'static str,
        Option<&'static str>,
        i64,
        i64,
        Option<i64>,
    );

    /// One due, one whose lease expired at 90, one still leased until 200, one not due until
    /// 150.
    const ROWS: [Row; 4] = [
        (1, "READY", None, 0, 50, None),
        (2, "RUNNING", Some("dead"), 3, 10, Some(90)),
        (3, "RUNNING", Some("live"), 1, 20, Some(200)),
        (4, "READY", None, 0, 150, None),
    ];

    /// The claim takes a dead worker's rows once their lease has passed, as Campanile's claim
    /// does, oldest first, and leaves live leases and rows not yet due alone.
    #[test]
    fn the_sqlite_claim_takes_due_rows_and_expired_leases() {
        let c = rusqlite::Connection::open_in_memory().unwrap();
        c.execute_batch(SCHEMA).unwrap();
        for (seq, state, owner, epoch, at, lease) in ROWS {
            c.execute(
                "INSERT INTO ceiling (seq, id, schedule_id, version, scheduled_for, available_at,
                                      state, owner, epoch, lease_until)
                 VALUES (?1, randomblob(16), x'00', 1, ?1, ?2, ?3, ?4, ?5, ?6)",
                rusqlite::params![seq, at, state, owner, epoch, lease],
            )
            .unwrap();
        }
        let claimed: Vec<(i64, i64)> = c
            .prepare(SQLITE_CLAIM)
            .unwrap()
            .query_map(rusqlite::params![100, 10], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let mut claimed = claimed;
        claimed.sort_unstable();
        assert_eq!(claimed, [(1, 1), (2, 4)]);
        // Oldest first across both: at 300 the row due since 150 goes before the lease that
        // ended at 200.
        let one: Vec<i64> = c
            .prepare(SQLITE_CLAIM)
            .unwrap()
            .query_map(rusqlite::params![300, 1], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(one, [4]);
    }

    /// The same on PostgreSQL, in a schema of its own (skipped without
    /// `CAMPANILE_TEST_PG_URL`).
    #[test]
    fn the_postgres_claim_takes_due_rows_and_expired_leases() {
        let Ok(url) = std::env::var("CAMPANILE_TEST_PG_URL") else {
            eprintln!("CAMPANILE_TEST_PG_URL is not set; skipping the PostgreSQL ceiling test");
            return;
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            let schema = format!("ceiling_test_{}", uuid::Uuid::now_v7().simple());
            client
                .batch_execute(&format!(
                    "CREATE SCHEMA {schema}; SET search_path = {schema};
                     CREATE TABLE ceiling (seq BIGINT PRIMARY KEY, state TEXT NOT NULL,
                         owner TEXT, epoch BIGINT NOT NULL, available_at BIGINT NOT NULL,
                         lease_until BIGINT);
                     CREATE INDEX ceiling_ready ON ceiling (available_at) WHERE state = 'READY';
                     CREATE INDEX ceiling_leased ON ceiling (lease_until) WHERE state = 'RUNNING';"
                ))
                .await
                .unwrap();
            for (seq, state, owner, epoch, at, lease) in ROWS {
                client
                    .execute(
                        "INSERT INTO ceiling VALUES ($1, $2, $3, $4, $5, $6)",
                        &[&seq, &state, &owner, &epoch, &at, &lease],
                    )
                    .await
                    .unwrap();
            }
            let mut claimed: Vec<(i64, i64)> = client
                .query(PG_CLAIM, &[&"w", &100i64, &10i64])
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            claimed.sort_unstable();
            client
                .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
                .await
                .unwrap();
            assert_eq!(claimed, [(1, 1), (2, 4)]);
        });
    }
}
