//! End to end through a real socket: `campanile serve` on a temporary database, the SDK worker,
//! a seconds-precision cron schedule, and a worker killed with SIGKILL mid-run.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use campanile_sdk::{Client, Job, JobError, Worker, WorkerConfig};
use common::{free_port, wait_for};
use serde_json::json;

struct Server {
    child: Child,
    url: String,
    key: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server() -> Server {
    start_server_with(&[])
}

/// `campanile serve` on a database in `dir`, listening on `port`, with stdout piped.
fn serve_command(dir: &tempfile::TempDir, port: u16, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_campanile"));
    cmd.args([
        "serve",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--database",
    ])
    .arg(dir.path().join("e2e.db"))
    .args(extra)
    .env("CAMPANILE_LOG", "warn")
    .stdout(Stdio::piped());
    cmd
}

fn start_server_with(extra: &[&str]) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = serve_command(&dir, port, extra)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let key = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.trim().strip_prefix("cmp_").map(|k| format!("cmp_{k}")))
        .expect("the first start prints the default tenant's key");
    let url = format!("http://127.0.0.1:{port}");
    wait_for(port, "/readyz", 200);
    Server {
        child,
        url,
        key,
        _dir: dir,
    }
}

/// Only acts when re-run by the SIGKILL test: claims one occurrence, says so, and hangs.
#[test]
fn e2e_doomed_worker() {
    let (Ok(url), Ok(key)) = (std::env::var("E2E_URL"), std::env::var("E2E_KEY")) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = Client::new(&url, &key).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "nothing to claim");
            let got = client.claim("slow", "doomed", 1, 2).await.unwrap();
            if let Some(c) = got.first() {
                println!("CLAIMED {} {}", c.id, c.epoch);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(3600)).await;
    });
}

#[test]
fn serve_runs_schedules_through_the_sdk_and_survives_a_killed_worker() {
    let server = start_server();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = Client::new(&server.url, &server.key).unwrap();

        // A cron schedule with seconds precision, run by the SDK worker.
        let created = client
            .create_schedule(
                &json!({"queue": "ticks", "cron": "* * * * * *", "payload": {"hello": "world"}}),
                Some("ticks-1"),
            )
            .await
            .unwrap();
        let schedule_id = created["id"].as_str().unwrap().to_string();
        let mut cfg = WorkerConfig::new("ticks", "sdk-worker");
        cfg.idle_poll = Duration::from_millis(100);
        let worker = Worker::new(client.clone(), cfg);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let run = tokio::spawn(async move {
            worker
                .run(
                    |job: Job| async move {
                        Ok::<_, JobError>(json!({"seen": job.id, "payload": job.payload}))
                    },
                    stopped,
                )
                .await
        });
        tokio::time::sleep(Duration::from_millis(3500)).await;
        stop.send(true).unwrap();
        let report = run.await.unwrap().unwrap();
        assert!(report.completed >= 2, "{report:?}");
        let done = client
            .list_occurrences(&format!("schedule_id={schedule_id}&state=SUCCEEDED"))
            .await
            .unwrap();
        let done = done["occurrences"].as_array().unwrap().clone();
        assert!(done.len() as u64 >= report.completed.min(2));
        let one = client
            .get_occurrence(done[0]["id"].as_str().unwrap().parse().unwrap())
            .await
            .unwrap();
        assert_eq!(one["result"]["payload"], json!({"hello": "world"}));
        assert_eq!(one["result"]["seen"], one["id"]);

        // A worker killed with SIGKILL mid-run: its occurrence runs again on another worker
        // after the lease, and its late completion is refused.
        let at = jiff::Timestamp::now()
            .checked_add(jiff::SignedDuration::from_millis(500))
            .unwrap();
        client
            .create_schedule(
                &json!({"queue": "slow", "at": at.to_string(), "lease_seconds": 2}),
                None,
            )
            .await
            .unwrap();
        let mut doomed = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "e2e_doomed_worker",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("E2E_URL", &server.url)
            .env("E2E_KEY", &server.key)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // libtest prints "test e2e_doomed_worker ... " before the child's own output.
        let line = BufReader::new(doomed.stdout.take().unwrap())
            .lines()
            .map_while(Result::ok)
            .find(|l| l.contains("CLAIMED"))
            .unwrap();
        let mut parts = line[line.find("CLAIMED").unwrap()..]
            .split_whitespace()
            .skip(1);
        let (id, epoch): (uuid::Uuid, i64) = (
            parts.next().unwrap().parse().unwrap(),
            parts.next().unwrap().parse().unwrap(),
        );
        doomed.kill().unwrap(); // SIGKILL
        doomed.wait().unwrap();

        let mut cfg = WorkerConfig::new("slow", "rescuer");
        cfg.idle_poll = Duration::from_millis(100);
        let rescuer = Worker::new(client.clone(), cfg);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let run = tokio::spawn(async move {
            rescuer
                .run(
                    |_job: Job| async move { Ok::<_, JobError>(json!("rescued")) },
                    stopped,
                )
                .await
        });
        let start = Instant::now();
        loop {
            let o = client.get_occurrence(id).await.unwrap();
            if o["state"] == "SUCCEEDED" {
                assert_eq!(o["result"], json!("rescued"));
                assert_eq!(o["epoch"], 2, "re-claimed under a new epoch");
                let outcomes: Vec<&str> = o["attempts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a["outcome"].as_str().unwrap())
                    .collect();
                assert_eq!(outcomes, ["lease_expired", "succeeded"]);
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the killed worker's occurrence was never re-run: {o}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.send(true).unwrap();
        run.await.unwrap().unwrap();
        let late = client
            .complete(id, "doomed", epoch, json!("zombie"))
            .await
            .unwrap_err();
        assert_eq!(late.lease_conflict(), Some("stale_epoch"), "{late}");
        assert_eq!(
            client.get_occurrence(id).await.unwrap()["result"],
            json!("rescued")
        );
    });
    // Graceful shutdown on SIGTERM.
    let mut server = server;
    let pid = server.child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            assert!(status.success(), "serve exits cleanly on SIGTERM: {status}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "serve did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The whole node is killed with SIGKILL after planning two minutes ahead and stays down
/// longer than the schedule's lateness allows: when it starts again, what it had planned and
/// could not hand out on time is on record as `MISSED` (the `SKIP` policy), not run late.
#[test]
fn serve_killed_after_planning_records_what_came_due_while_down_as_missed() {
    let mut server = start_server();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let schedule_id = rt.block_on(async {
        let client = Client::new(&server.url, &server.key).unwrap();
        let created = client
            .create_schedule(
                &json!({"queue": "down", "cron": "* * * * * *",
                        "misfire": {"policy": "skip", "max_lateness_seconds": 2}}),
                None,
            )
            .await
            .unwrap();
        let id = created["id"].as_str().unwrap().to_string();
        let start = Instant::now();
        loop {
            let page = client
                .list_occurrences(&format!("schedule_id={id}&limit=1000"))
                .await
                .unwrap();
            if page["occurrences"].as_array().unwrap().len() >= 100 {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "nothing planned");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        id
    });
    let killed = jiff::Timestamp::now();
    server.child.kill().unwrap(); // SIGKILL: no release of its shards or its liveness mark
    server.child.wait().unwrap();
    // Longer than its liveness mark lasts (the 15 s shard lease) and the lateness.
    std::thread::sleep(Duration::from_secs(19));
    let restarted = jiff::Timestamp::now();
    let port = free_port();
    server.child = serve_command(&server._dir, port, &[])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    server.url = format!("http://127.0.0.1:{port}");
    wait_for(port, "/readyz", 200);
    rt.block_on(async {
        let client = Client::new(&server.url, &server.key).unwrap();
        let page = client
            .list_occurrences(&format!("schedule_id={schedule_id}&limit=1000"))
            .await
            .unwrap();
        let mut judged = 0;
        for o in page["occurrences"].as_array().unwrap() {
            let at: jiff::Timestamp = o["scheduled_for"].as_str().unwrap().parse().unwrap();
            let due_while_down = at >= killed + jiff::SignedDuration::from_secs(1)
                && at <= restarted - jiff::SignedDuration::from_secs(3);
            if due_while_down {
                assert_eq!(o["state"], "MISSED", "{o}");
                judged += 1;
            } else if at > restarted + jiff::SignedDuration::from_secs(30) {
                // Due after the node was back (its start takes well under 30 s).
                assert_ne!(o["state"], "MISSED", "{o}");
            }
        }
        assert!(judged >= 14, "{judged} instants judged");
        // Nothing handed out is older than the lateness allows.
        let got = client.claim("down", "w", 100, 30).await.unwrap();
        assert!(!got.is_empty());
        for c in &got {
            assert!(
                c.scheduled_for < killed + jiff::SignedDuration::from_secs(1)
                    || c.scheduled_for > restarted - jiff::SignedDuration::from_secs(3),
                "{c:?}"
            );
        }
    });
}

/// A NATS-targeted cron schedule through a real `serve --nats-url`: every second's occurrence
/// lands in the stream once, keyed by its occurrence id, and is SUCCEEDED with the ack.
#[test]
fn serve_relays_nats_targets_to_jetstream() {
    let Ok(nats) = std::env::var("CAMPANILE_TEST_NATS_URL") else {
        eprintln!("skipped: CAMPANILE_TEST_NATS_URL is not set (relay end to end)");
        return;
    };
    let server = start_server_with(&["--nats-url", &nats]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let nc = async_nats::connect(nats.as_str()).await.unwrap();
        let js = async_nats::jetstream::new(nc);
        let id = uuid::Uuid::now_v7().simple().to_string();
        let stream_name = format!("CAMPANILE_E2E_{id}");
        let subject = format!("campanile.e2e.{id}.ticks");
        js.create_stream(async_nats::jetstream::stream::Config {
            name: stream_name.clone(),
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
        let client = Client::new(&server.url, &server.key).unwrap();
        let created = client
            .create_schedule(
                &json!({"target": {"type": "nats", "subject": subject}, "cron": "* * * * * *",
                        "payload": {"report": "tick"}}),
                None,
            )
            .await
            .unwrap();
        let schedule_id = created["id"].as_str().unwrap().to_string();
        tokio::time::sleep(Duration::from_millis(3500)).await;
        client
            .schedule_action(schedule_id.parse().unwrap(), "pause")
            .await
            .unwrap();
        // Let the last due one be relayed (the relay polls every 200 ms).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut stream = js.get_stream(&stream_name).await.unwrap();
        let n = stream.info().await.unwrap().state.messages;
        assert!(
            n >= 2,
            "only {n} messages relayed in 3.5 s of a per-second schedule"
        );
        let done = client
            .list_occurrences(&format!("schedule_id={schedule_id}&state=SUCCEEDED"))
            .await
            .unwrap();
        let mut succeeded: Vec<String> = done["occurrences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["id"].as_str().unwrap().to_string())
            .collect();
        let mut ids = Vec::new();
        for seq in 1..=n {
            let m = stream.get_raw_message(seq).await.unwrap();
            assert_eq!(&m.payload[..], br#"{"report":"tick"}"#);
            ids.push(m.headers.get("Nats-Msg-Id").unwrap().as_str().to_string());
        }
        ids.sort();
        succeeded.sort();
        assert_eq!(
            ids, succeeded,
            "one message per SUCCEEDED occurrence, keyed by its id"
        );
        let one = client
            .get_occurrence(ids[0].parse().unwrap())
            .await
            .unwrap();
        assert_eq!(one["result"]["stream"], stream_name.as_str());
        let _ = js.delete_stream(&stream_name).await;
    });
}

#[test]
fn serve_refuses_to_start_with_an_unreachable_nats() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let nats = format!("nats://127.0.0.1:{}", free_port());
    let out = serve_command(&dir, port, &["--nats-url", &nats])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot connect to NATS"), "{stderr}");
}

/// A supervisor that stops reading the server's output (here: stdout closed before the first
/// start prints the key) must not bring the server down.
#[test]
fn serve_survives_a_closed_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = serve_command(&dir, port, &[])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let start = Instant::now();
    let answered = loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            break out;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("serve exited with {status} when its stdout was closed");
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        answered.starts_with("HTTP/1.0 200") || answered.starts_with("HTTP/1.1 200"),
        "{answered}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Over a real socket: a schedule run now with a trigger (sent twice with one key: one run),
/// claimed at once; an admin key made with the CLI while the node serves sets and reads the
/// tenant's quotas over HTTP.
#[test]
fn serve_triggers_a_schedule_and_takes_quotas_over_a_real_socket() {
    let server = start_server();
    let port: u16 = server.url.rsplit(':').next().unwrap().parse().unwrap();
    let key = server.key.as_str();
    let json = |body: &str| -> serde_json::Value { serde_json::from_str(body).unwrap() };
    let (s, created) = common::http_with(
        port,
        "POST",
        "/v1/schedules",
        Some(key),
        &[],
        r#"{"queue": "reports", "cron": "0 3 * * *", "payload": {"report": "daily"}}"#,
    )
    .unwrap();
    assert_eq!(s, 201, "{created}");
    let id = json(&created)["id"].as_str().unwrap().to_string();
    let trigger = || {
        common::http_with(
            port,
            "POST",
            &format!("/v1/schedules/{id}/trigger"),
            Some(key),
            &[("Idempotency-Key", "rerun-1")],
            "",
        )
        .unwrap()
    };
    let (s1, first) = trigger();
    let (s2, again) = trigger();
    assert_eq!((s1, s2), (201, 200), "{first} / {again}");
    assert_eq!(json(&first)["id"], json(&again)["id"]);
    assert_eq!(json(&first)["origin"], "manual");
    let (s, claimed) = common::http_with(
        port,
        "POST",
        "/v1/queues/reports/claim",
        Some(key),
        &[],
        r#"{"worker_id": "w", "max": 10}"#,
    )
    .unwrap();
    assert_eq!(s, 200, "{claimed}");
    let claimed = json(&claimed)["occurrences"].as_array().unwrap().clone();
    assert_eq!(claimed.len(), 1, "one run, however often it was triggered");
    assert_eq!(claimed[0]["payload"], json!({"report": "daily"}));

    let out = Command::new(env!("CARGO_BIN_EXE_campanile"))
        .args(["key", "create", "--admin", "--database"])
        .arg(server._dir.path().join("e2e.db"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let admin = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let (s, set) = common::http_with(
        port,
        "PUT",
        "/v1/admin/tenants/default/quotas",
        Some(&admin),
        &[],
        r#"{"max_running": 4}"#,
    )
    .unwrap();
    assert_eq!(s, 200, "{set}");
    let (s, read) = common::http_with(
        port,
        "GET",
        "/v1/admin/tenants/default/quotas",
        Some(&admin),
        &[],
        "",
    )
    .unwrap();
    assert_eq!(s, 200, "{read}");
    assert_eq!(json(&read)["max_running"], 4);
}
