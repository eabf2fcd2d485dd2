//! The single writer thread and its group commit.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use campanile_store::StoreError;
use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::db::db_err;

/// Runs inside the transaction; returns whether it succeeded and how to answer its caller
/// once the commit's outcome is known.
/// Called with `None` when the transaction could not start: the job then does nothing.
type Job = Box<dyn FnOnce(Option<&Connection>) -> (bool, Deliver) + Send>;
type Deliver = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

#[derive(Debug)]
pub(crate) struct Writer {
    tx: mpsc::Sender<Job>,
}

impl Writer {
    /// Starts the writer thread on `conn` and, on `checkpoints` (a second connection to the
    /// same file), the thread that checkpoints the WAL behind it.
    pub(crate) fn start(
        conn: Connection,
        checkpoints: Connection,
        max_group: usize,
        restart_pages: i64,
    ) -> Result<Writer, StoreError> {
        // The checkpointer copies the WAL into the database file off this thread — on the
        // writer, every ~4 MiB of WAL, that would be ~8% of its time in `bench plan`
        // (`git show 8d79bd7:BENCHMARKS.md`). The writer's own checkpoint, past `restart_pages`, only copies what
        // the checkpointer has not yet, and lets the next transaction start the WAL over.
        conn.pragma_update(None, "wal_autocheckpoint", restart_pages)
            .map_err(db_err)?;
        let (wrote, written) = mpsc::sync_channel::<()>(1);
        thread::Builder::new()
            .name("campanile-sqlite-checkpoint".into())
            .spawn(move || checkpointer(&checkpoints, &written))
            .map_err(|e| StoreError::Database(format!("cannot start checkpoint thread: {e}")))?;
        let (tx, rx) = mpsc::channel::<Job>();
        thread::Builder::new()
            .name("campanile-sqlite-writer".into())
            .spawn(move || run(conn, rx, max_group.max(1), &wrote))
            .map_err(|e| StoreError::Database(format!("cannot start writer thread: {e}")))?;
        Ok(Writer { tx })
    }

    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (reply, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let out = match conn {
                Some(conn) => f(conn),
                None => Err(StoreError::Unavailable(
                    "the write transaction did not start".into(),
                )),
            };
            let ok = out.is_ok();
            let deliver: Deliver = Box::new(move |commit| {
                let _ = reply.send(commit.and(out));
            });
            (ok, deliver)
        });
        self.tx
            .send(job)
            .map_err(|_| StoreError::Unavailable("the SQLite writer has stopped".into()))?;
        rx.await.map_err(|_| {
            StoreError::Database(
                "the write was abandoned (the SQLite writer stopped or the job panicked)".into(),
            )
        })?
    }
}

/// How often, at most, the checkpointer runs while writes keep coming.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(50);

/// Copies committed WAL frames into the database file behind the writer (a `PASSIVE`
/// checkpoint, which never blocks the writer or readers), woken by the writer's commits and
/// at most every [`CHECKPOINT_EVERY`]. While writes keep coming it never quite catches up,
/// so it cannot make the WAL start over; the writer's own checkpoint, past its threshold,
/// does that, and finds little left to copy. Ends, after a last checkpoint, when the writer
/// stops.
fn checkpointer(conn: &Connection, written: &mpsc::Receiver<()>) {
    let mut last = Instant::now();
    loop {
        let stop = written.recv().is_err();
        if !stop {
            let since = last.elapsed();
            if since < CHECKPOINT_EVERY {
                thread::sleep(CHECKPOINT_EVERY - since);
            }
        }
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(error = %e, "WAL checkpoint failed; the next one retries");
        }
        last = Instant::now();
        if stop {
            return;
        }
    }
}

fn run(conn: Connection, rx: mpsc::Receiver<Job>, max_group: usize, wrote: &mpsc::SyncSender<()>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while jobs.len() < max_group {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
            let e = db_err(e).to_string();
            for job in jobs {
                let (_, deliver) = job(None);
                deliver(Err(StoreError::Unavailable(e.clone())));
            }
            continue;
        }
        let mut delivers = Vec::with_capacity(jobs.len());
        // Set when a job's savepoint could not be ended: its writes may still be in the
        // transaction, so the whole group is rolled back rather than committed with them.
        let mut broken: Option<String> = None;
        for job in jobs {
            if broken.is_some() {
                delivers.push(job(None).1);
                continue;
            }
            // Cached statements, not parsed again for every job (bench store: within noise).
            if exec_cached(&conn, "SAVEPOINT job").is_err() {
                delivers.push(job(None).1);
                continue;
            }
            // A panicking job must not take the writer (and every later write) down with it.
            let (ok, deliver) =
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(Some(&conn)))) {
                    Ok(done) => done,
                    Err(_) => {
                        tracing::error!("a store job panicked; its savepoint is rolled back");
                        if let Err(e) = conn.execute_batch("ROLLBACK TO job; RELEASE job") {
                            broken = Some(db_err(e).to_string());
                        }
                        continue;
                    }
                };
            let ended = if ok {
                exec_cached(&conn, "RELEASE job")
            } else {
                conn.execute_batch("ROLLBACK TO job; RELEASE job")
            };
            if let Err(e) = ended {
                tracing::error!(error = %e, "savepoint end failed; the group is rolled back");
                broken = Some(db_err(e).to_string());
            }
            delivers.push(deliver);
        }
        let commit = match broken {
            Some(e) => Err(e),
            None => conn
                .execute_batch("COMMIT")
                .map_err(|e| db_err(e).to_string()),
        };
        if commit.is_err() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        for deliver in delivers {
            deliver(commit.clone().map_err(StoreError::Unavailable));
        }
        // Wake the checkpointer; if it is already due to run, this changes nothing.
        let _ = wrote.try_send(());
    }
}

fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn open(path: &std::path::Path) -> Connection {
        let c = Connection::open(path).unwrap();
        c.execute_batch("PRAGMA journal_mode = WAL;").unwrap();
        c
    }

    /// A job whose savepoint cannot be ended (here the job ends it itself, so the writer's
    /// `RELEASE` fails) may have left its writes in the transaction: the group is rolled back
    /// and the caller told, rather than committed with them.
    #[test]
    fn a_savepoint_that_cannot_be_ended_rolls_the_group_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        open(&path)
            .execute_batch("CREATE TABLE t (x INTEGER)")
            .unwrap();
        let writer = Writer::start(open(&path), open(&path), 16, 1_000).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let out = rt.block_on(writer.run(|c| {
            c.execute_batch("INSERT INTO t VALUES (1); RELEASE job;")
                .map_err(db_err)
        }));
        assert!(out.is_err(), "the caller is told: {out:?}");
        let ok = rt
            .block_on(writer.run(|c| c.execute_batch("INSERT INTO t VALUES (2)").map_err(db_err)));
        assert!(ok.is_ok(), "the writer goes on: {ok:?}");
        let rows: Vec<i64> = open(&path)
            .prepare("SELECT x FROM t ORDER BY x")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(rows, [2], "the broken job's write was not committed");
    }
}
