//! PostgreSQL itself crashes under a running node and its workers: a private cluster of the
//! test's own (initdb in a temporary directory, on a free port) is stopped with `pg_ctl stop
//! -m immediate` — every server process killed, no checkpoint, crash recovery from the WAL at
//! the next start — while `campanile serve` plans and workers claim and complete (half of them
//! with reports that claim their next work, the other half with requests of their own), then
//! started again. Every completion the API acknowledged before the crash is there after it,
//! with its result; every claim it acknowledged can still be completed by its worker; every
//! epoch the database handed out reached a worker (claims carry keys and are sent again after
//! a lost answer); the node
//! answers nothing but 503 meanwhile, becomes ready again by itself, and `campanile reconcile`
//! finds nothing missing.
//!
//! Needs the PostgreSQL server binaries: `CAMPANILE_TEST_PG_BIN` names their directory
//! (`.ci/run` sets it); unset, the test is skipped with a notice. Run as root, the cluster is
//! run as the `postgres` user (`runuser`), since PostgreSQL refuses to run as root.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use campanile_sdk::{ClaimKey, Claimed, Client, SdkError};
use common::{free_port, http, wait_for};
use serde_json::{Value, json};
use uuid::Uuid;

/// A PostgreSQL cluster of the test's own; stopped (immediately) when dropped.
struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    /// Run its commands as `postgres` (the test runs as root).
    as_postgres: bool,
}

impl Cluster {
    fn init(bin: PathBuf) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let as_postgres = output("id", &["-u"]) == "0";
        if as_postgres {
            let uid: u32 = output("id", &["-u", "postgres"]).parse().unwrap();
            let gid: u32 = output("id", &["-g", "postgres"]).parse().unwrap();
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        }
        let c = Cluster {
            bin,
            dir,
            port: free_port(),
            as_postgres,
        };
        let data = c.data();
        c.run(
            "initdb",
            &["-D", &data, "-A", "trust", "-U", "postgres", "--no-sync"],
        );
        c.start();
        c
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// One of the server's programs, run as `postgres` where needed.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(&path);
            cmd
        } else {
            Command::new(&path)
        }
    }

    /// Runs one of the server's programs; panics if it fails.
    fn run(&self, program: &str, args: &[&str]) {
        let out = self.command(program).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn start(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log").display().to_string();
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-o", &opts, "-l", &log, "-w", "start"],
        );
    }

    /// Kills every server process at once: what is not in the WAL on disk is gone.
    fn crash(&self) {
        self.run("pg_ctl", &["-D", &self.data(), "-m", "immediate", "stop"]);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args(["-D", &self.data(), "-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn output(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(out.status.success(), "{program} {args:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the workers were told, and every error status the API answered.
#[derive(Default)]
struct Record {
    /// Completions acknowledged (`accepted`): occurrence → (epoch, result sent, after the
    /// crash began).
    completed: HashMap<Uuid, (i64, Value, bool)>,
    /// Claims acknowledged, by occurrence: the epochs handed out.
    claimed: HashMap<Uuid, Vec<i64>>,
    /// Completions refused with a conflict after being sent again (an answer lost in the crash).
    refused_after_retry: Vec<(Uuid, i64, Value, String)>,
    /// Completions of claims acknowledged before the crash, acknowledged after it began.
    carried: usize,
    /// Claims acknowledged and not yet answered with an outcome.
    held: usize,
    /// Occurrences claimed by reports that carried a claim.
    claimed_by_reports: usize,
    /// Every HTTP error status answered.
    statuses: Vec<u16>,
}

/// Claims and completes until `stop`, each occurrence taking 100 ms of work (so that the
/// crash finds claims held), sending a report again (backoff, up to 30 s) while it gets no
/// answer or a 503, so that a claim acknowledged before the crash is completed after it. With
/// `reports_claim`, each report also claims the worker's next work, as the SDK's worker does
/// (on PostgreSQL, the shared report-and-claim transaction); otherwise claims and completions
/// are requests of their own. Every claim carries a key, and a claim (or a report that claims)
/// that got no answer is sent again with it, as the SDK's worker does; a worker told to stop
/// still sends again a claim that got no answer, so that nothing it may have been given is
/// left behind.
async fn work(
    client: Client,
    name: String,
    record: Arc<Mutex<Record>>,
    crashed: Arc<AtomicBool>,
    stop: tokio::sync::watch::Receiver<bool>,
    reports_claim: bool,
) {
    let note = |e: &SdkError| {
        if let SdkError::Api { status, .. } = e {
            record.lock().unwrap().statuses.push(*status);
        }
    };
    // Claims held, each with whether it was acknowledged before the crash began.
    let mut held: VecDeque<(Claimed, bool)> = VecDeque::new();
    let take = |held: &mut VecDeque<(Claimed, bool)>, got: Vec<Claimed>| {
        let before = !crashed.load(Ordering::SeqCst);
        let mut r = record.lock().unwrap();
        r.held += got.len();
        for c in got {
            r.claimed.entry(c.id).or_default().push(c.epoch);
            held.push_back((c, before));
        }
    };
    let mut key = ClaimKey::new();
    let mut tries_after_stop = 0;
    loop {
        let Some((c, claimed_before)) = held.pop_front() else {
            if *stop.borrow() {
                tries_after_stop += 1;
                if !key.resent || tries_after_stop > 200 {
                    return;
                }
            }
            match client.claim_keyed("crash", &name, 5, 30, Some(key)).await {
                Ok(got) => {
                    key = ClaimKey::new();
                    if got.is_empty() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    } else {
                        take(&mut held, got);
                    }
                }
                Err(e) => {
                    note(&e);
                    key = key.again();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            continue;
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let result = json!({ "worker": name, "epoch": c.epoch });
        let want = if reports_claim && !*stop.borrow() {
            5 - held.len() as u32
        } else {
            0
        };
        let began = Instant::now();
        let mut sent_before = false;
        let mut report_key = ClaimKey::new();
        loop {
            let during = crashed.load(Ordering::SeqCst);
            let answer = if want > 0 {
                let item = json!({"occurrence_id": c.id, "epoch": c.epoch, "result": result});
                client
                    .completions_and_claim_keyed(
                        &name,
                        vec![item],
                        "crash",
                        want,
                        30,
                        Some(report_key),
                    )
                    .await
            } else {
                client
                    .complete(c.id, &name, c.epoch, result.clone())
                    .await
                    .map(|o| (vec![o], Vec::new()))
            };
            let refused = match answer {
                Ok((outcomes, claimed)) => {
                    record.lock().unwrap().claimed_by_reports += claimed.len();
                    take(&mut held, claimed);
                    let o = &outcomes[0];
                    if o.outcome == "accepted" {
                        let mut r = record.lock().unwrap();
                        r.completed.insert(c.id, (c.epoch, result.clone(), during));
                        r.carried += usize::from(during && claimed_before);
                        r.held -= 1;
                        break;
                    }
                    format!("{o:?}")
                }
                Err(e) if e.lease_conflict().is_some() => e.to_string(),
                Err(e) => {
                    note(&e);
                    let retry = matches!(e, SdkError::Transport(_))
                        || matches!(e, SdkError::Api { status: 503, .. });
                    assert!(retry, "report of {} refused: {e}", c.id);
                    assert!(
                        began.elapsed() < Duration::from_secs(30),
                        "report of {} never answered: {e}",
                        c.id
                    );
                    sent_before = true;
                    report_key = report_key.again();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Refused: only a report sent again, whose first sending was written, may be.
            assert!(sent_before, "report of {} refused: {refused}", c.id);
            let mut r = record.lock().unwrap();
            r.held -= 1;
            r.refused_after_retry
                .push((c.id, c.epoch, result.clone(), refused));
            break;
        }
    }
}

#[test]
fn acknowledged_work_survives_a_postgres_crash() {
    let Ok(bin) = std::env::var("CAMPANILE_TEST_PG_BIN") else {
        eprintln!("skipped: CAMPANILE_TEST_PG_BIN is not set (PostgreSQL crash test)");
        return;
    };
    let cluster = Cluster::init(PathBuf::from(bin));
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_campanile"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--database", &cluster.url()])
        .env("CAMPANILE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _serve = Serve(child);
    let key = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.trim().strip_prefix("cmp_").map(|k| format!("cmp_{k}")))
        .expect("the first start prints the default tenant's key");
    wait_for(port, "/readyz", 200);
    let url = format!("http://127.0.0.1:{port}");
    let started = jiff::Timestamp::now();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let record = Arc::new(Mutex::new(Record::default()));
    let crashed = Arc::new(AtomicBool::new(false));
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let workers = rt.block_on(async {
        let client = Client::new(&url, &key).unwrap();
        // 20 occurrences a second, planned ahead by the node's planner.
        for i in 0..20 {
            client
                .create_schedule(
                    &json!({"queue": "crash", "cron": "* * * * * *", "payload": {"n": i}}),
                    None,
                )
                .await
                .unwrap();
        }
        (0..4)
            .map(|w| {
                tokio::spawn(work(
                    client.clone(),
                    format!("w{w}"),
                    record.clone(),
                    crashed.clone(),
                    stopping.clone(),
                    w % 2 == 0,
                ))
            })
            .collect::<Vec<_>>()
    });

    let completed = || record.lock().unwrap().completed.len();
    let wait_until = |what: &str, done: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(60), "never {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // The crash comes while the workers hold claims (each second's occurrences come due
    // together, so between them nothing is held).
    wait_until("40 completions before the crash, and claims held", &|| {
        let r = record.lock().unwrap();
        r.completed.len() >= 40 && r.held >= 8
    });
    crashed.store(true, Ordering::SeqCst);
    let before = completed();
    cluster.crash();
    // While the database is down the node answers, and says it is not ready.
    std::thread::sleep(Duration::from_secs(2));
    let (ready, _) = http(port, "GET", "/readyz", None).expect("the node answers");
    assert_eq!(ready, 503, "ready while its database is down");
    cluster.start();
    wait_for(port, "/readyz", 200);
    wait_until("40 completions after the restart", &|| {
        completed() >= before + 40
    });
    let ended = jiff::Timestamp::now();
    stop.send(true).unwrap();
    rt.block_on(async {
        for w in workers {
            w.await.unwrap();
        }
    });

    let record = record.lock().unwrap();
    assert!(
        record.statuses.iter().all(|s| *s == 503),
        "the node answered {:?}",
        record.statuses
    );
    // Every acknowledged completion is there, with its result and its epoch; every claim
    // acknowledged and then refused when sent again was written by that same report (its
    // answer was lost) — a claim the crash lost would show another result or none.
    let client = Client::new(&url, &key).unwrap();
    let acknowledged = record
        .completed
        .iter()
        .map(|(id, (epoch, result, _))| (id, epoch, result, "acknowledged"))
        .chain(
            record
                .refused_after_retry
                .iter()
                .map(|(id, epoch, result, why)| (id, epoch, result, why.as_str())),
        );
    rt.block_on(async {
        for (id, epoch, result, why) in acknowledged {
            let o = client.get_occurrence(*id).await.unwrap();
            assert_eq!(o["state"], "SUCCEEDED", "{why}: {o}");
            assert_eq!(&o["result"], result, "{why}: {o}");
            assert_eq!(o["epoch"], json!(epoch), "{why}: {o}");
        }
    });
    // No occurrence was handed out twice for the same epoch (a claim lost in the crash would
    // hand the same epoch out again).
    for (id, epochs) in &record.claimed {
        let mut sorted = epochs.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), epochs.len(), "{id} claimed as {epochs:?}");
    }
    // Nor was a claim lost to a worker: every epoch the database handed out was answered to
    // one. A claim that committed and whose answer the crash cut off was sent again with its
    // key and answered with what it had claimed (docs/DESIGN.md, "Why does a claim carry a
    // key?"); without keys such an occurrence would lie leased to nobody, under an epoch no
    // worker heard of, until its lease ended.
    rt.block_on(async {
        for state in ["RUNNING", "SUCCEEDED", "READY", "RETRY_WAIT", "DEAD"] {
            let v = client
                .list_occurrences(&format!("state={state}&limit=1000"))
                .await
                .unwrap();
            let page = v["occurrences"].as_array().unwrap();
            assert!(state == "READY" || page.len() < 1000, "{state}: one page");
            for o in page {
                let epoch = o["epoch"].as_i64().unwrap();
                let id: Uuid = o["id"].as_str().unwrap().parse().unwrap();
                let mut told = record.claimed.get(&id).cloned().unwrap_or_default();
                told.sort_unstable();
                assert_eq!(
                    told,
                    (1..=epoch).collect::<Vec<_>>(),
                    "epochs handed out to workers, against the stored {o}"
                );
            }
        }
    });
    let after = record.completed.values().filter(|(_, _, d)| *d).count();
    eprintln!(
        "{} claims and {} completions acknowledged ({after} after the crash began), {} sent \
         again and refused as already written, {} claimed before the crash and completed \
         after it, {} claimed by reports; {} error answers, all 503",
        record.claimed.values().map(Vec::len).sum::<usize>(),
        record.completed.len(),
        record.refused_after_retry.len(),
        record.carried,
        record.claimed_by_reports,
        record.statuses.len()
    );
    assert!(after >= 40, "{after} completions after the crash began");
    assert!(record.carried > 0, "no claim was held across the crash");
    assert!(record.claimed_by_reports > 0, "no report claimed more work");

    // Nothing planned was lost: every instant of every schedule in the run is accounted for.
    let out = Command::new(env!("CARGO_BIN_EXE_campanile"))
        .args(["reconcile", "--tenant", "default", "--json"])
        .args(["--database", &cluster.url()])
        .args(["--from", &started.to_string(), "--to", &ended.to_string()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "reconcile: {stdout}");
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["counts"]["missing"], json!(0), "{report}");
}
