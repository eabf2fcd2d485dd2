//! `campanile schedule …` and `campanile occurrence …` as a user runs them, against a real
//! node (`campanile serve` on a temporary database, over a socket), and against a one-request
//! stand-in where the node's answer must be chosen (the backfill's contract).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::free_port;
use serde_json::{Value, json};

type Server = common::Node;

/// `campanile serve` on a database of its own and a free port; its first start prints the
/// default tenant's key.
fn start_server() -> Server {
    common::Node::start("remote.db")
}

/// The binary with `args`, none of the connection variables of the caller's environment,
/// and `stdin` as its input.
fn run_with(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_campanile"));
    cmd.args(args)
        .env_remove("CAMPANILE_SERVER")
        .env_remove("CAMPANILE_KEY")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("the binary runs");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

/// `campanile <args> --server <node> --key <key>`.
fn cli(s: &Server, args: &[&str]) -> Output {
    cli_in(s, args, None)
}

fn cli_in(s: &Server, args: &[&str], stdin: Option<&str>) -> Output {
    let mut all = args.to_vec();
    all.extend(["--server", &s.url, "--key", &s.key]);
    run_with(&all, &[], stdin)
}

/// [`cli`] with `line` split at whitespace (for arguments without spaces).
fn sh(s: &Server, line: &str) -> Output {
    cli(s, &line.split_whitespace().collect::<Vec<_>>())
}

/// The binary with `line` split at whitespace, and `env`.
fn sh_env(line: &str, env: &[(&str, &str)]) -> Output {
    run_with(&line.split_whitespace().collect::<Vec<_>>(), env, None)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit 0; the stdout.
fn ok(o: &Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        stdout(o),
        stderr(o)
    );
    stdout(o)
}

/// Exit 2 with one `error: …` line on stderr and nothing on stdout; the message.
fn refused(o: &Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(2),
        "stdout: {}\nstderr: {}",
        stdout(o),
        stderr(o)
    );
    assert_eq!(stdout(o), "", "nothing on stdout when refused");
    let err = stderr(o);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    err.strip_prefix("error: ")
        .unwrap_or_else(|| panic!("starts with 'error: ': {err}"))
        .trim_end()
        .to_string()
}

/// The JSON on stdout (one line).
fn json_of(o: &Output) -> Value {
    let out = ok(o);
    assert_eq!(out.lines().count(), 1, "--json prints one line: {out}");
    serde_json::from_str(&out).unwrap()
}

/// The value of a `name  value` line of a block.
fn field(out: &str, name: &str) -> String {
    out.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .filter(|rest| rest.starts_with("  "))
                .map(|rest| rest.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no '{name}' line in:\n{out}"))
}

#[test]
fn schedules_from_the_command_line() {
    let s = start_server();

    // Flags build the body; the payload keeps every digit.
    let payload = r#"{"to": "ops@example.com", "n": 12345678901234567890123}"#;
    let out = ok(&cli(
        &s,
        &[
            "schedule",
            "create",
            "--queue",
            "emails",
            "--cron",
            "0 3 * * *",
            "--zone",
            "Europe/Paris",
            "--payload",
            payload,
        ],
    ));
    let daily = field(&out, "id");
    assert_eq!(field(&out, "state"), "ACTIVE");
    assert_eq!(field(&out, "queue"), "emails");
    let timing = "cron '0 3 * * *' Europe/Paris (dst gap skip, fold once)";
    assert_eq!(field(&out, "timing"), timing);
    assert_eq!(field(&out, "payload"), payload);
    let fires: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("next fires"))
        .collect();
    assert_eq!(fires.len(), 5, "five next fires:\n{out}");
    assert!(fires.iter().all(|l| l.ends_with(":00:00Z")), "{out}");

    // --file with a path, printed as the node's JSON.
    let file = s.dir.path().join("hourly.json");
    let definition = r#"{"queue": "reports", "every": "1h", "payload": [1, 2]}"#;
    std::fs::write(&file, definition).unwrap();
    let file = file.to_str().unwrap();
    let created = json_of(&sh(&s, &format!("schedule create --json --file {file}")));
    let hourly = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["queue"], "reports");
    assert_eq!(created["payload"], json!([1, 2]));
    assert_eq!(created["next_fires"].as_array().unwrap().len(), 5);

    // --file - reads stdin.
    let once = r#"{"queue": "once", "at": "2099-01-01T00:00:00Z"}"#;
    let out = ok(&cli_in(
        &s,
        &["schedule", "create", "--file", "-"],
        Some(once),
    ));
    let once = field(&out, "id");
    assert_eq!(field(&out, "timing"), "at 2099-01-01T00:00:00Z");

    // The list as a table: a header and one row per schedule, oldest first.
    let out = ok(&sh(&s, "schedule list"));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(
        lines[0].starts_with("id ") && lines[0].contains("  state  "),
        "{out}"
    );
    for (line, id) in lines[1..].iter().zip([&daily, &hourly, &once]) {
        assert!(line.starts_with(id.as_str()), "{out}");
        assert!(line.contains("  ACTIVE  "), "{out}");
    }
    // As JSON, and a page at a time.
    let page = json_of(&sh(&s, "schedule list --json"));
    let ids: Vec<&str> = page["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [daily.as_str(), hourly.as_str(), once.as_str()]);
    let out = ok(&sh(&s, "schedule list --limit 2"));
    let next = out
        .lines()
        .find_map(|l| l.strip_prefix("next page: --cursor "))
        .unwrap_or_else(|| panic!("a cursor for the next page:\n{out}"))
        .to_string();
    let rest = json_of(&sh(
        &s,
        &format!("schedule list --json --limit 2 --cursor {next}"),
    ));
    assert_eq!(rest["schedules"][0]["id"], once.as_str());
    assert!(rest.get("next_cursor").is_none());
    let paused = json_of(&sh(&s, "schedule list --json --state paused"));
    assert_eq!(paused["schedules"], json!([]));

    // Get: the table, and the node's JSON exactly (its digits too).
    let out = ok(&sh(&s, &format!("schedule get {daily}")));
    assert_eq!(field(&out, "id"), daily);
    assert_eq!(field(&out, "overlap"), "ALLOW");
    let raw = ok(&sh(&s, &format!("schedule get {daily} --json")));
    assert!(raw.contains(r#""n": 12345678901234567890123"#), "{raw}");
    assert_eq!(
        serde_json::from_str::<Value>(&raw).unwrap()["id"],
        daily.as_str()
    );

    // Preview: flags, as JSON, and a create's --file (its queue and payload left out).
    let preview = |more: &[&str]| {
        let mut args = vec!["schedule", "preview", "--cron", "30 2 * * *"];
        args.extend([
            "--zone",
            "America/New_York",
            "--after",
            "2026-03-07T00:00:00Z",
        ]);
        args.extend(more);
        cli(&s, &args)
    };
    let out = ok(&preview(&["--count", "3"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(lines[0].contains("local (America/New_York)"), "{out}");
    assert!(lines[1].starts_with("1  2026-03-07T07:30:00Z"), "{out}");
    assert!(
        lines[2].contains("2026-03-09T06:30:00Z") && lines[2].contains("DST gap"),
        "{out}"
    );
    let p = json_of(&preview(&["--json", "--dst-gap", "shift", "--count", "2"]));
    let shifted = json!(["2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z"]);
    assert_eq!(p["next_fires"], shifted);
    let p = json_of(&sh(
        &s,
        &format!("schedule preview --json --file {file} --count 4"),
    ));
    assert_eq!(p["next_fires"].as_array().unwrap().len(), 4);
    assert_eq!(p["timezone"], "UTC");

    // Pause; a paused schedule is not triggered (409: exit 2 with the node's message);
    // resume.
    let out = ok(&sh(&s, &format!("schedule pause {daily}")));
    assert_eq!(field(&out, "state"), "PAUSED");
    assert_eq!(field(&out, "next fires"), "none");
    assert_eq!(
        refused(&sh(&s, &format!("schedule trigger {daily}"))),
        "the schedule is paused: resume it to run it"
    );
    let out = ok(&sh(&s, &format!("schedule resume {daily}")));
    assert_eq!(field(&out, "state"), "ACTIVE");

    // A trigger sent twice with one key makes one occurrence; without a key, another.
    let trigger = format!("schedule trigger {daily} --idempotency-key rerun-1");
    let first = json_of(&sh(&s, &format!("{trigger} --json")));
    assert_eq!(first["origin"], "manual");
    assert_eq!(first["state"], "READY");
    let first_id = first["id"].as_str().unwrap();
    let out = ok(&sh(&s, &trigger));
    assert!(
        out.starts_with("triggered before with this Idempotency-Key"),
        "{out}"
    );
    assert_eq!(field(&out, "id"), first_id);
    let third = json_of(&sh(&s, &format!("schedule trigger {daily} --json")));
    assert_ne!(third["id"].as_str().unwrap(), first_id);
    // A run with its own payload; its key answers again only with the same payload.
    let own = format!("schedule trigger {daily} --idempotency-key own-1 --payload {{\"rerun\":7}}");
    let made = json_of(&sh(&s, &format!("{own} --json")));
    assert_eq!(made["origin"], "manual");
    let out = ok(&sh(&s, &own));
    assert_eq!(field(&out, "id"), made["id"].as_str().unwrap());
    assert_eq!(field(&out, "payload"), r#"{"rerun":7}"#);
    assert_eq!(made["payload"], json!({"rerun": 7}));
    assert_eq!(
        refused(&sh(
            &s,
            &format!("schedule trigger {daily} --idempotency-key own-1 --payload 8")
        )),
        "this Idempotency-Key was used by a trigger with another payload: use a new key for a \
         new run"
    );
    let bad = sh(&s, &format!("schedule trigger {daily} --payload {{rerun"));
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("--payload: not JSON"),
        "{}",
        stderr(&bad)
    );

    // Cancel, for good.
    let out = ok(&sh(&s, &format!("schedule cancel {daily}")));
    assert_eq!(field(&out, "state"), "CANCELED");
    assert!(!refused(&sh(&s, &format!("schedule resume {daily}"))).is_empty());

    // The connection from the environment instead of flags.
    let env = [
        ("CAMPANILE_SERVER", s.url.as_str()),
        ("CAMPANILE_KEY", &s.key),
    ];
    let out = ok(&sh_env(&format!("schedule get {hourly}"), &env));
    assert_eq!(field(&out, "id"), hourly);
    // Given before the subcommand, too.
    let before = format!("schedule --server {} --key {} get {once}", s.url, s.key);
    assert_eq!(field(&ok(&sh_env(&before, &[])), "id"), once);
}

#[test]
fn occurrences_from_the_command_line() {
    let s = start_server();
    // Nothing planned for decades: the trigger's occurrence is the schedule's only one.
    let definition =
        r#"{"queue": "dl", "at": "2099-01-01T00:00:00Z", "retry": {"max_attempts": 1}}"#;
    let created = json_of(&cli_in(
        &s,
        &["schedule", "create", "--json", "--file", "-"],
        Some(definition),
    ));
    let schedule = created["id"].as_str().unwrap().to_string();
    let triggered = json_of(&sh(&s, &format!("schedule trigger {schedule} --json")));
    let id = triggered["id"].as_str().unwrap().to_string();

    // List: table and JSON, filtered by schedule and state.
    let out = ok(&sh(&s, &format!("occurrence list --schedule {schedule}")));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].starts_with("id ") && lines[0].contains("scheduled for"),
        "{out}"
    );
    assert!(lines[1].starts_with(id.as_str()), "{out}");
    assert!(
        lines[1].contains("  READY  ") && lines[1].ends_with("manual"),
        "{out}"
    );
    let list = format!("occurrence list --schedule {schedule}");
    let page = json_of(&sh(&s, &format!("{list} --json --state ready")));
    assert_eq!(page["occurrences"].as_array().unwrap().len(), 1);
    assert_eq!(page["occurrences"][0]["id"], id.as_str());
    let out = ok(&sh(&s, &format!("{list} --state DEAD")));
    assert!(out.ends_with("(no occurrences)\n"), "{out}");

    // Get.
    let out = ok(&sh(&s, &format!("occurrence get {id}")));
    assert_eq!(field(&out, "id"), id);
    assert_eq!(field(&out, "state"), "READY");
    assert_eq!(field(&out, "attempts"), "0 of 1");

    // Only a dead letter is redriven: 409, exit 2, the node's message.
    let message = refused(&sh(&s, &format!("occurrence redrive {id}")));
    assert!(
        message.contains("only a DEAD occurrence can be redriven"),
        "{message}"
    );

    // A worker claims it and fails it for good: a dead letter, with its attempt shown.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = campanile_sdk::Client::new(&s.url, &s.key).unwrap();
        let claimed = client.claim("dl", "w-1", 1, 30).await.unwrap();
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].id.to_string(), id);
        client
            .fail(claimed[0].id, "w-1", claimed[0].epoch, "permanent", "boom")
            .await
            .unwrap();
    });
    let out = ok(&sh(&s, &format!("occurrence get {id}")));
    assert_eq!(field(&out, "state"), "DEAD");
    let attempt = out
        .lines()
        .find(|l| l.contains("w-1"))
        .unwrap_or_else(|| panic!("the attempt's row:\n{out}"));
    assert!(
        attempt.contains("failed") && attempt.ends_with("permanent: boom"),
        "{out}"
    );

    // Redrive: ready again.
    let out = ok(&sh(&s, &format!("occurrence redrive {id}")));
    assert_eq!(field(&out, "occurrence"), id);
    assert_eq!(field(&out, "outcome"), "accepted");
    assert_eq!(field(&out, "state"), "READY");

    // Cancel; a second cancel is refused with the node's message.
    let ack = json_of(&sh(&s, &format!("occurrence cancel {id} --json")));
    assert_eq!(ack["state"], "CANCELED");
    assert!(!refused(&sh(&s, &format!("occurrence cancel {id}"))).is_empty());
    let page = json_of(&sh(&s, "occurrence list --json --state CANCELED"));
    assert_eq!(page["occurrences"][0]["id"], id.as_str());
}

#[test]
fn mistakes_exit_2_with_the_nodes_message_and_an_absent_node_exits_1() {
    let s = start_server();
    let unknown = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        refused(&sh(&s, &format!("schedule get {unknown}"))),
        format!("schedule {unknown} not found")
    );
    assert_eq!(
        refused(&sh(&s, &format!("occurrence get {unknown}"))),
        format!("occurrence {unknown} not found")
    );
    assert_eq!(
        refused(&sh(&s, "schedule pause nope")),
        "schedule id 'nope' is not a UUID"
    );
    // The node's validation, named as it names it.
    let bad_cron = ["schedule", "create", "--queue", "q", "--cron", "61 * * * *"];
    let message = refused(&cli(&s, &bad_cron));
    assert!(message.contains("minute"), "{message}");
    let message = refused(&sh(&s, "occurrence list --state sleeping"));
    assert!(message.contains("sleeping"), "{message}");

    // A key the node does not know; no key at all.
    let url = &s.url;
    let message = refused(&sh_env(
        &format!("schedule list --server {url} --key cmp_no"),
        &[],
    ));
    assert!(message.contains("a valid API key is required"), "{message}");
    let message = refused(&sh_env(&format!("schedule list --server {url}"), &[]));
    assert!(message.starts_with("no API key"), "{message}");
    // A URL this client cannot use, a file that is not there or not JSON, flags that
    // conflict (clap: exit 2 too).
    let scheme = format!("schedule list --server ftp://127.0.0.1:1 --key {}", s.key);
    let message = refused(&sh_env(&scheme, &[]));
    assert!(message.contains("is not http or https"), "{message}");
    let missing = s.dir.path().join("missing.json");
    let missing = missing.to_str().unwrap();
    assert!(refused(&sh(&s, &format!("schedule create --file {missing}"))).contains(missing));
    let message = refused(&cli_in(
        &s,
        &["schedule", "create", "--file", "-"],
        Some("{not json"),
    ));
    assert!(message.starts_with("--file -: not JSON"), "{message}");
    let o = sh(&s, "schedule create --file - --queue q");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));

    // No node there: a one-line message naming the URL, exit 1.
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let o = sh_env(
        &format!("occurrence list --server {nowhere} --key cmp_x"),
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    let expected = format!("error: cannot reach the node at {nowhere}: ");
    assert!(err.starts_with(&expected), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A one-request HTTP server: answers `status` with `body` and hands back the request.
fn stand_in(status: &str, body: &str) -> (String, std::thread::JoinHandle<String>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let handle = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = conn.read(&mut buf).unwrap();
            request.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&request).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>().unwrap())
                    })
                    .unwrap_or(0);
                if body.len() >= length {
                    break;
                }
            }
            assert!(n > 0, "the request ended early: {text}");
        }
        conn.write_all(answer.as_bytes()).unwrap();
        String::from_utf8(request).unwrap()
    });
    (url, handle)
}

/// An answer as the backfill route's contract writes it.
const BACKFILL_ANSWER: &str = r#"{"backfill_id":"4c1f4f0e-0000-4000-8000-000000000001","schedule_id":"0192f0c4-8a1e-7000-8000-000000000000","version":3,"from":"2026-01-01T00:00:00Z","to":"2026-01-01T03:00:00Z","instants":3,"created":[{"id":"0192f0c4-8a1e-7000-8000-0000000000a1","scheduled_for":"2026-01-01T01:00:00Z","available_at":"2026-01-01T01:00:00Z","state":"READY","origin":"backfill"},{"id":"0192f0c4-8a1e-7000-8000-0000000000a2","scheduled_for":"2026-01-01T02:00:00Z","available_at":"2026-01-01T02:00:00Z","state":"READY","origin":"backfill"}],"existing":[{"id":"0192f0c4-8a1e-7000-8000-0000000000a0","scheduled_for":"2026-01-01T00:00:00Z","available_at":"2026-01-01T00:00:00Z","state":"SUCCEEDED","origin":"planned"}],"replayed":false}"#;

#[test]
fn backfill_sends_the_contracts_request_and_prints_its_answer() {
    let schedule = "0192f0c4-8a1e-7000-8000-000000000000";
    let (url, request) = stand_in("201 Created", BACKFILL_ANSWER);
    let line = format!(
        "schedule backfill {schedule} --from 2026-01-01T00:00:00Z --to 2026-01-01T03:00:00Z \
         --overlap SKIP_IF_RUNNING --idempotency-key bf-1"
    );
    let out = ok(&sh_env(
        &line,
        &[("CAMPANILE_SERVER", &url), ("CAMPANILE_KEY", "cmp_k")],
    ));
    let request = request.join().unwrap();
    let (head, body) = request.split_once("\r\n\r\n").unwrap();
    let head = head.to_ascii_lowercase();
    let start = format!("post /v1/schedules/{schedule}/backfill http/1.1\r\n");
    assert!(head.starts_with(&start), "{head}");
    assert!(
        head.contains("\r\nauthorization: bearer cmp_k\r\n"),
        "{head}"
    );
    assert!(head.contains("\r\nidempotency-key: bf-1\r\n"), "{head}");
    assert!(
        head.contains("\r\ncontent-type: application/json\r\n"),
        "{head}"
    );
    assert_eq!(
        serde_json::from_str::<Value>(body).unwrap(),
        json!({"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T03:00:00Z",
               "overlap": "skip_if_running"})
    );
    assert_eq!(field(&out, "created"), "2");
    assert_eq!(field(&out, "existing"), "1");
    assert_eq!(field(&out, "instants"), "3");
    let rows: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("id ")).collect();
    assert_eq!(rows.len(), 4, "{out}");
    assert!(
        rows[1].ends_with("created") && rows[3].ends_with("existing"),
        "{out}"
    );
    assert!(rows[3].contains("SUCCEEDED"), "{out}");

    // --json: the answer as the node sent it, on one line.
    let (url, request) = stand_in("200 OK", BACKFILL_ANSWER);
    let line = format!("schedule backfill {schedule} --from a --to b --json --server {url}");
    let o = sh_env(&format!("{line} --key cmp_k"), &[]);
    assert_eq!(ok(&o), format!("{BACKFILL_ANSWER}\n"));
    let request = request.join().unwrap();
    assert!(
        !request.to_ascii_lowercase().contains("idempotency-key"),
        "{request}"
    );
    assert!(!request.contains("overlap"), "{request}");

    // Past the bound: 422, exit 2 with the node's message.
    let message = "the range holds 1440 instants; at most 1000 per request";
    let (url, request) = stand_in(
        "422 Unprocessable Entity",
        &format!(r#"{{"code":"validation_failed","message":"{message}"}}"#),
    );
    let line = format!("schedule backfill {schedule} --from a --to b --server {url} --key k");
    assert_eq!(refused(&sh_env(&line, &[])), message);
    request.join().unwrap();
}

#[test]
fn backfill_of_an_unknown_schedule_is_refused_cleanly() {
    let s = start_server();
    let unknown = uuid::Uuid::new_v4().to_string();
    let line = format!(
        "schedule backfill {unknown} --from 2026-01-01T00:00:00Z --to 2026-01-01T03:00:00Z"
    );
    let message = refused(&sh(&s, &line));
    // A node without the backfill route answers that no such route exists; with it, that
    // no such schedule does: either way a 404, exit 2, the node's message.
    assert!(
        message.contains("not found") || message == "no such route; see /openapi.json",
        "{message}"
    );
}

/// The hour `n` hours before the current one, RFC 3339.
fn hours_ago(n: i64) -> String {
    let now = jiff::Timestamp::now().as_second();
    let hour = now - now.rem_euclid(3600);
    jiff::Timestamp::from_second(hour - n * 3600)
        .unwrap()
        .to_string()
}

#[test]
fn backfill_against_a_real_node() {
    let s = start_server();
    let hourly = [
        "schedule",
        "create",
        "--json",
        "--queue",
        "bf",
        "--cron",
        "0 * * * *",
    ];
    let id = json_of(&cli(&s, &hourly))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (from, to) = (hours_ago(5), hours_ago(2));

    // Three past instants, none there: all created (201).
    let keyed = format!("schedule backfill {id} --from {from} --to {to} --idempotency-key bf-1");
    let out = ok(&sh(&s, &keyed));
    assert_eq!(field(&out, "instants"), "3");
    assert_eq!(field(&out, "created"), "3");
    assert_eq!(field(&out, "existing"), "0");
    assert_eq!(field(&out, "replayed"), "no");
    let backfill = field(&out, "backfill");

    // The same key again: the same answer, replayed.
    let again = json_of(&sh(&s, &format!("{keyed} --json")));
    assert_eq!(again["replayed"], true);
    assert_eq!(again["backfill_id"], backfill.as_str());

    // A wider range without a key: the three are existing, one more is created.
    let six = hours_ago(6);
    let line = format!("schedule backfill {id} --from {six} --to {to} --overlap queue_one");
    let wider = json_of(&sh(&s, &format!("{line} --json")));
    assert_eq!(wider["created"].as_array().unwrap().len(), 1);
    assert_eq!(wider["existing"].as_array().unwrap().len(), 3);
    let line = format!("occurrence list --json --schedule {id} --from {six} --to {to}");
    let listed = json_of(&sh(&s, &line));
    assert_eq!(listed["occurrences"].as_array().unwrap().len(), 4);

    // Past the bound (1000 instants per request), an empty range, a paused schedule.
    let minutely = [
        "schedule",
        "create",
        "--json",
        "--queue",
        "bf",
        "--cron",
        "* * * * *",
    ];
    let minutely = json_of(&cli(&s, &minutely))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let thirty = hours_ago(30);
    refused(&sh(
        &s,
        &format!("schedule backfill {minutely} --from {thirty} --to {to}"),
    ));
    refused(&sh(
        &s,
        &format!("schedule backfill {id} --from {to} --to {from}"),
    ));
    ok(&sh(&s, &format!("schedule pause {id}")));
    refused(&sh(
        &s,
        &format!("schedule backfill {id} --from {from} --to {to}"),
    ));
}
