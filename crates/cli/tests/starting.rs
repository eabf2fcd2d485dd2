//! `campanile serve` while its first planning pass cannot finish (here: another session holds
//! a lock the pass needs): probes and clients get answers, not timeouts, and the node serves
//! fully once the pass is done. Needs `CAMPANILE_TEST_PG_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{free_port, http, wait_for};

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(database: &str, port: u16, stderr: Stdio) -> Serve {
    Serve(
        Command::new(env!("CARGO_BIN_EXE_campanile"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--database", database])
            .env("CAMPANILE_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap(),
    )
}

/// One `GET` on a keep-alive connection: the status and the body of its one response.
fn exchange(s: &mut std::net::TcpStream, path: &str, key: &str) -> (u16, String) {
    use std::io::{Read, Write};
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte)
            .expect("a response on the kept connection");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .expect("a content-length");
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).unwrap();
    (
        head[9..12].parse().unwrap(),
        String::from_utf8(body).unwrap(),
    )
}

/// The test's schema, dropped when the test ends, passed or not.
struct Scratch {
    rt: tokio::runtime::Runtime,
    admin: tokio_postgres::Client,
    schema: String,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let drop = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema);
        let _ = self.rt.block_on(self.admin.batch_execute(&drop));
    }
}

/// A schema of its own on `CAMPANILE_TEST_PG_URL` (dropped at the end), set up by a first
/// `serve` that is then stopped: the database URL and the default tenant's key. `None` (with
/// a notice) when the variable is unset.
fn set_up() -> Option<(Scratch, String, String)> {
    let base = campanile_testkit::pg_url("serve during its first planning pass")?;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let schema = format!("cli_{}", uuid::Uuid::new_v4().simple());
    let (admin, conn) = rt
        .block_on(tokio_postgres::connect(&base, tokio_postgres::NoTls))
        .unwrap();
    rt.spawn(conn);
    rt.block_on(admin.batch_execute(&format!("CREATE SCHEMA {schema}")))
        .unwrap();
    let scratch = Scratch { rt, admin, schema };
    let sep = if base.contains('?') { '&' } else { '?' };
    let database = format!("{base}{sep}options=-csearch_path%3D{}", scratch.schema);

    // A first start sets the schema up and prints the default tenant's key.
    let port = free_port();
    let mut first = serve(&database, port, Stdio::null());
    let key = BufReader::new(first.0.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.trim().strip_prefix("cmp_").map(|k| format!("cmp_{k}")))
        .expect("the first start prints the default tenant's key");
    wait_for(port, "/readyz", 200);
    drop(first);
    Some((scratch, database, key))
}

#[test]
fn serve_answers_probes_while_its_first_pass_waits() {
    let Some((scratch, database, key)) = set_up() else {
        return;
    };
    let rt = &scratch.rt;

    // Another session holds the table of liveness marks: the next node's first pass (which
    // writes its mark) waits behind it.
    let (holder, conn) = rt
        .block_on(tokio_postgres::connect(&database, tokio_postgres::NoTls))
        .unwrap();
    rt.spawn(conn);
    rt.block_on(holder.batch_execute("BEGIN; LOCK TABLE planner_nodes IN ACCESS EXCLUSIVE MODE"))
        .unwrap();
    let port = free_port();
    let mut second = serve(&database, port, Stdio::null());

    // Alive, not ready, and every API route a 503 that says why and when to retry.
    wait_for(port, "/healthz", 200);
    let (status, out) = http(port, "GET", "/readyz", None).expect("/readyz answers");
    assert_eq!(status, 503, "{out}");
    assert!(out.contains("\"unavailable\""), "{out}");
    assert!(out.contains("first planning pass"), "{out}");
    assert!(out.to_ascii_lowercase().contains("retry-after: 1"), "{out}");
    let (status, out) = http(port, "POST", "/v1/queues/q/claim", Some(&key)).unwrap();
    assert_eq!(status, 503, "{out}");
    assert!(out.contains("first planning pass"), "{out}");
    let (status, out) = http(port, "POST", "/healthz", None).unwrap();
    assert_eq!(status, 503, "a wrong method answers JSON too: {out}");
    assert!(out.contains("\"unavailable\""), "{out}");
    // A keep-alive connection opened now is answered by the full router later.
    let mut kept = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    kept.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (status, _) = exchange(&mut kept, "/readyz", &key);
    assert_eq!(status, 503);
    let (status, out) = http(port, "GET", "/metrics", None).unwrap();
    assert_eq!(status, 200, "{out}");
    assert!(out.contains("campanile_occurrences_planned_total"), "{out}");
    // Still waiting, still answering.
    std::thread::sleep(Duration::from_secs(2));
    assert!(second.0.try_wait().unwrap().is_none(), "serve exited");
    let (status, _) = http(port, "GET", "/readyz", None).unwrap();
    assert_eq!(status, 503);

    // The lock goes: the pass finishes and the node serves the API.
    rt.block_on(holder.batch_execute("COMMIT")).unwrap();
    wait_for(port, "/readyz", 200);
    let (status, out) = http(port, "GET", "/v1/schedules", Some(&key)).unwrap();
    assert_eq!(status, 200, "{out}");
    let (status, out) = http(port, "GET", "/v1/no-such-route", Some(&key)).unwrap();
    assert_eq!(status, 404, "the full router answers: {out}");
    let (status, body) = exchange(&mut kept, "/v1/schedules", &key);
    assert_eq!(
        status, 200,
        "the kept connection now reaches the API: {body}"
    );

    drop(second.0.stdout.take());
    drop(second);
}

/// A first pass that fails (here: a table it writes is missing) is retried with a WARN line
/// per failure while the node answers probes, and the node serves once a pass succeeds.
#[test]
fn serve_retries_a_failing_first_pass_until_it_succeeds() {
    let Some((scratch, database, key)) = set_up() else {
        return;
    };
    let (rt, admin, schema) = (&scratch.rt, &scratch.admin, &scratch.schema);
    rt.block_on(admin.batch_execute(&format!(
        "ALTER TABLE {schema}.planner_nodes RENAME TO planner_nodes_away"
    )))
    .unwrap();
    let port = free_port();
    let mut node = serve(&database, port, Stdio::piped());
    let stderr = node.0.stderr.take().unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    // Two failures, the second after a backoff: retried, not given up.
    let mut failures = Vec::new();
    while failures.len() < 2 {
        let line = lines
            .recv_timeout(Duration::from_secs(30))
            .expect("a WARN line for each failed first pass");
        if line.contains("first planning pass failed") {
            failures.push(line);
        }
    }
    assert!(failures[0].contains("attempt=1"), "{failures:?}");
    assert!(failures[1].contains("attempt=2"), "{failures:?}");
    assert!(
        failures[1].contains("planner_nodes"),
        "says what failed: {failures:?}"
    );
    assert_eq!(http(port, "GET", "/healthz", None).unwrap().0, 200);
    assert_eq!(http(port, "GET", "/readyz", None).unwrap().0, 503);
    assert!(node.0.try_wait().unwrap().is_none(), "serve exited");

    // The table is back: the next attempt succeeds.
    rt.block_on(admin.batch_execute(&format!(
        "ALTER TABLE {schema}.planner_nodes_away RENAME TO planner_nodes"
    )))
    .unwrap();
    wait_for(port, "/readyz", 200);
    let (status, out) = http(port, "GET", "/v1/schedules", Some(&key)).unwrap();
    assert_eq!(status, 200, "{out}");
}
