//! Helpers shared by the CLI's integration tests: a free port and plain HTTP/1.1 requests
//! to a `campanile serve` child.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::time::{Duration, Instant};

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 request; `(status, the whole response)`, or `None` when nothing answers
/// within 5 s.
pub(crate) fn http(
    port: u16,
    method: &str,
    path: &str,
    key: Option<&str>,
) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let body = if method == "POST" { "{}" } else { "" };
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.get(9..12)?.parse().ok()?;
    Some((status, out))
}

pub(crate) fn wait_for(port: u16, path: &str, status: u16) -> String {
    let start = Instant::now();
    loop {
        if let Some((s, out)) = http(port, "GET", path, None)
            && s == status
        {
            return out;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "GET {path} never answered {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One HTTP/1.1 request with extra headers and a JSON body; `(status, the response body)`.
pub(crate) fn http_with(
    port: u16,
    method: &str,
    path: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    if let Some(k) = key {
        head.push_str(&format!("Authorization: Bearer {k}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    write!(
        s,
        "{head}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.get(9..12)?.parse().ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Some((
        status,
        if chunked {
            dechunk(body)?
        } else {
            body.to_string()
        },
    ))
}

/// The body of a chunked answer.
fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(after.get(..size)?);
        rest = after.get(size + 2..)?;
    }
}

/// The default tenant's key, read from a first start's stdout (printed once, `cmp_…`).
pub(crate) fn first_key(stdout: std::process::ChildStdout) -> String {
    use std::io::BufRead;
    std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.trim().strip_prefix("cmp_").map(|k| format!("cmp_{k}")))
        .expect("the first start prints the default tenant's key")
}

/// `campanile serve` on a SQLite database of its own (`dir/db_name`) and a free port, ready;
/// killed when dropped.
pub(crate) struct Node {
    pub(crate) child: std::process::Child,
    pub(crate) port: u16,
    pub(crate) url: String,
    pub(crate) key: String,
    pub(crate) db: std::path::PathBuf,
    pub(crate) dir: tempfile::TempDir,
}

impl Node {
    pub(crate) fn start(db_name: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join(db_name);
        let port = free_port();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_campanile"))
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--database",
            ])
            .arg(&db)
            .env("CAMPANILE_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let key = first_key(child.stdout.take().unwrap());
        wait_for(port, "/readyz", 200);
        Node {
            child,
            port,
            url: format!("http://127.0.0.1:{port}"),
            key,
            db,
            dir,
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
