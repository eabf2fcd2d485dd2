//! `campanile serve` against clients that do not play along: half-sent request heads and
//! bodies, silent connections, more connections than allowed, and a SIGTERM while they hang.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{free_port, http, wait_for};

struct Node {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    log: std::path::PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(extra: &[&str]) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = dir.path().join("serve.log");
    let child = Command::new(env!("CARGO_BIN_EXE_campanile"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--database",
        ])
        .arg(dir.path().join("h.db"))
        .args(extra)
        .env("CAMPANILE_LOG", "info")
        .stdout(std::fs::File::create(dir.path().join("serve.out")).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_for(port, "/readyz", 200);
    Node {
        child,
        port,
        dir,
        log,
    }
}

impl Node {
    /// The default tenant's API key, as the first start printed it.
    fn key(&self) -> String {
        let out = std::fs::read_to_string(self.dir.path().join("serve.out")).unwrap();
        out.lines()
            .find_map(|l| l.trim().strip_prefix("cmp_").map(|k| format!("cmp_{k}")))
            .expect("the first start prints the default tenant's key")
    }
}

/// POSTs `body` as JSON; the status.
fn post_json(port: u16, path: &str, key: &str, body: &str) -> u16 {
    let mut s = connect(port);
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let (_, out) = until_closed(s);
    out.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0)
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// How long until the server closes `s` (reads until EOF or a reset), and what it sent.
fn until_closed(mut s: TcpStream) -> (Duration, String) {
    let start = Instant::now();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    (start.elapsed(), String::from_utf8_lossy(&out).into_owned())
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits up to `limit` for the child to exit; how long it took.
fn exit_within(child: &mut Child, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "serve exits cleanly: {status}");
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "serve still running {limit:?} after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A half-sent head is closed after the header-read timeout; a body that stops coming is
/// answered 408 after the body-read timeout; an idle keep-alive connection is closed.
#[test]
fn slow_clients_are_cut_off_at_the_read_timeouts() {
    let node = start(&["--header-read-timeout", "2", "--body-read-timeout", "2"]);
    let mut half_head = connect(node.port);
    half_head
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut half_body = connect(node.port);
    half_body
        .write_all(
            b"POST /v1/schedules HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer cmp_x\r\n\
              Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        )
        .unwrap();
    let mut idle = connect(node.port);
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");

    let (took, _) = until_closed(half_head);
    assert!(
        took < Duration::from_secs(8),
        "half-sent head closed after {took:?}"
    );
    let (took, _) = until_closed(idle);
    assert!(
        took < Duration::from_secs(8),
        "idle keep-alive closed after {took:?}"
    );
    let (took, answer) = until_closed(half_body);
    assert!(
        took < Duration::from_secs(8),
        "stalled body answered after {took:?}"
    );
    // The key is checked before the body is read (401) or the body times out (408): either
    // way an answer, not a connection held open.
    assert!(
        answer.starts_with("HTTP/1.1 408") || answer.starts_with("HTTP/1.1 401"),
        "{answer}"
    );
}

/// A body that stops coming, sent with a valid key, is answered 408 with a JSON body.
#[test]
fn a_stalled_body_is_answered_408() {
    let node = start(&["--body-read-timeout", "1"]);
    // The first start's key is printed on stdout, which this node discards: make one.
    let out = Command::new(env!("CARGO_BIN_EXE_campanile"))
        .args(["key", "create", "--tenant", "default", "--database"])
        .arg(node.dir.path().join("h.db"))
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let key = stdout
        .split_whitespace()
        .find(|w| w.starts_with("cmp_"))
        .unwrap_or_else(|| panic!("a key: {stdout} {}", String::from_utf8_lossy(&out.stderr)))
        .to_string();
    let mut s = connect(node.port);
    write!(
        s,
        "POST /v1/schedules HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    )
    .unwrap();
    let (took, answer) = until_closed(s);
    assert!(took < Duration::from_secs(6), "answered after {took:?}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"request_timeout\""), "{answer}");
}

/// At the connection limit, new connections wait (and the log says so once) instead of the
/// node failing `accept` in a loop; they are answered as soon as a silent one is cut off.
#[test]
fn connections_past_the_limit_wait_for_a_free_slot() {
    let node = start(&["--max-connections", "2", "--header-read-timeout", "2"]);
    let silent: Vec<TcpStream> = (0..2).map(|_| connect(node.port)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let answered = http(node.port, "GET", "/healthz", None);
    assert_eq!(answered.map(|(s, _)| s), Some(200));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "answered after {:?}",
        start.elapsed()
    );
    drop(silent);
    let log = std::fs::read_to_string(&node.log).unwrap();
    assert!(log.contains("connection limit reached"), "{log}");
    assert!(!log.contains("Too many open files"), "{log}");
}

/// SIGTERM while a client holds a half-sent request: the node exits within the shutdown
/// deadline, and its shard leases are released (nothing waits for them to lapse).
#[test]
fn sigterm_with_a_request_hanging_exits_within_the_deadline() {
    let mut node = start(&[
        "--shutdown-timeout",
        "2",
        "--header-read-timeout",
        "60",
        "--body-read-timeout",
        "60",
    ]);
    let mut half_body = connect(node.port);
    half_body
        .write_all(
            b"POST /v1/schedules HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n{",
        )
        .unwrap();
    let mut half_head = connect(node.port);
    half_head
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    sigterm(&node.child);
    let took = exit_within(&mut node.child, Duration::from_secs(10));
    assert!(took < Duration::from_secs(8), "exited after {took:?}");
    let db = rusqlite::Connection::open(node.dir.path().join("h.db")).unwrap();
    let held: i64 = db
        .query_row(
            "SELECT count(*) FROM shard_leases WHERE owner IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(held, 0, "the node released its shards");
    drop((half_body, half_head));
}

/// An answer that its client leaves unread holds the node's answer memory only until the send
/// timeout: the connection is then closed, and a request that waited for that memory is
/// answered. (Without the timeout the second list would wait as long as the first client
/// likes.)
#[test]
fn an_unread_answer_is_dropped_at_the_send_timeout_and_its_memory_freed() {
    let node = start(&["--send-timeout", "2", "--answer-memory-mib", "16"]);
    let key = node.key();
    let blob = "x".repeat(200_000);
    for i in 0..40 {
        let body = format!(
            r#"{{"queue": "big", "cron": "0 3 * * *", "payload": {{"i": {i}, "blob": "{blob}"}}}}"#
        );
        assert_eq!(post_json(node.port, "/v1/schedules", &key, &body), 201);
    }
    // ~8 MB of answer, more than the connection's buffers take while nobody reads.
    let mut unread = connect(node.port);
    write!(
        unread,
        "GET /v1/schedules?limit=500 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let start = Instant::now();
    let (status, _) =
        common::http(node.port, "GET", "/v1/schedules?limit=1", Some(&key)).expect("answered");
    let waited = start.elapsed();
    assert_eq!(status, 200);
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(5),
        "the second list waits for the first answer's memory until the send timeout: {waited:?}"
    );
    // The unread answer was cut off: what the client can still read ends short of it.
    let (_, got) = until_closed(unread);
    assert!(
        got.starts_with("HTTP/1.1 200"),
        "{}",
        &got[..got.len().min(200)]
    );
    assert!(
        got.len() < 8_000_000,
        "the whole answer was sent: {} bytes",
        got.len()
    );
}
