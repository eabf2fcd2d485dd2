//! The HTTP side of `campanile schedule …` and `campanile occurrence …`: where the node is,
//! the key, one request, and what its answer means for the exit code.

use std::io::{Read as _, Write as _};
use std::time::Duration;

use clap::Args;
use reqwest::{Method, StatusCode, Url};
use serde_json::Value;

use crate::error::CliError;

/// How long one request may take, connection included.
const TIMEOUT: Duration = Duration::from_secs(30);

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the node is and which key to use, shared by every remote command (given before or
/// after the subcommand).
#[derive(Debug, Args)]
pub(crate) struct Connection {
    /// The node's base URL (http, or https trusted by the platform's roots).
    #[arg(
        long,
        global = true,
        env = "CAMPANILE_SERVER",
        default_value = "http://127.0.0.1:7070",
        value_name = "URL",
        help_heading = "Connection"
    )]
    server: String,
    /// The tenant's API key (cmp_…), sent as `Authorization: Bearer <key>`.
    #[arg(
        long,
        global = true,
        env = "CAMPANILE_KEY",
        hide_env_values = true,
        value_name = "KEY",
        help_heading = "Connection"
    )]
    key: Option<String>,
    /// Print the node's JSON answer exactly as it sent it (compact, one JSON value per line)
    /// instead of a table.
    #[arg(long, global = true, help_heading = "Output")]
    json: bool,
}

/// A node's API, as one tenant's key reaches it.
#[derive(Debug)]
pub(crate) struct Remote {
    http: reqwest::Client,
    base: Url,
    /// The URL as the user wrote it, for messages.
    shown: String,
    key: String,
    /// `--json`: print answers as they came.
    pub(crate) json: bool,
}

/// A successful answer: its status, its text exactly as sent, and that text parsed.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) text: String,
    pub(crate) value: Value,
}

/// One request: method, path segments under the base URL, query pairs, JSON body and
/// `Idempotency-Key`.
#[derive(Debug)]
pub(crate) struct Call<'a> {
    method: Method,
    path: Vec<&'a str>,
    query: Vec<(&'static str, &'a str)>,
    body: Option<String>,
    idempotency_key: Option<&'a str>,
}

impl<'a> Call<'a> {
    /// `GET` of `path` (its segments, each percent-encoded).
    pub(crate) fn get(path: &[&'a str]) -> Call<'a> {
        Call::new(Method::GET, path)
    }

    /// `POST` of `path`.
    pub(crate) fn post(path: &[&'a str]) -> Call<'a> {
        Call::new(Method::POST, path)
    }

    fn new(method: Method, path: &[&'a str]) -> Call<'a> {
        Call {
            method,
            path: path.to_vec(),
            query: Vec::new(),
            body: None,
            idempotency_key: None,
        }
    }

    /// Adds `name=value` to the query when `value` is given.
    pub(crate) fn query(mut self, name: &'static str, value: Option<&'a str>) -> Call<'a> {
        if let Some(v) = value {
            self.query.push((name, v));
        }
        self
    }

    /// The JSON body, as text.
    pub(crate) fn body(mut self, json: String) -> Call<'a> {
        self.body = Some(json);
        self
    }

    /// The `Idempotency-Key` header, when given.
    pub(crate) fn idempotency_key(mut self, key: Option<&'a str>) -> Call<'a> {
        self.idempotency_key = key;
        self
    }
}

impl Remote {
    /// Checks the URL and the key; nothing is sent yet.
    pub(crate) fn new(conn: &Connection) -> Result<Remote, CliError> {
        let shown = conn.server.trim().to_string();
        let mut base = Url::parse(&shown).map_err(|e| {
            CliError::usage(format!(
                "--server '{shown}': {e} (expected e.g. http://127.0.0.1:7070)"
            ))
        })?;
        match base.scheme() {
            // https: a node behind a TLS-terminating proxy, trusted by the platform's roots.
            "http" | "https" => {}
            other => {
                return Err(CliError::usage(format!(
                    "--server '{shown}': scheme '{other}' is not http or https"
                )));
            }
        }
        if base.host_str().is_none_or(str::is_empty) {
            return Err(CliError::usage(format!("--server '{shown}': no host")));
        }
        base.set_query(None);
        base.set_fragment(None);
        let key = match conn.key.as_deref().map(str::trim) {
            None | Some("") => {
                return Err(CliError::usage(
                    "no API key: give --key cmp_… or set CAMPANILE_KEY (campanile tenant \
                     create or the first start of campanile serve prints one)",
                ));
            }
            Some(k) if !k.bytes().all(|b| b.is_ascii_graphic()) => {
                return Err(CliError::usage(
                    "--key: an API key is visible ASCII characters only (cmp_…)",
                ));
            }
            Some(k) => k.to_string(),
        };
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| CliError::runtime(format!("cannot set up the HTTP client: {e}")))?;
        Ok(Remote {
            http,
            base,
            shown,
            key,
            json: conn.json,
        })
    }

    /// Sends `call` under `/v1`. A 4xx answer is the user's mistake (exit 2, the node's
    /// message); a 5xx, an answer that is not JSON, or no answer at all is the environment's
    /// (exit 1).
    pub(crate) async fn send(&self, call: Call<'_>) -> Result<Answer, CliError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| CliError::usage(format!("--server '{}': not a base URL", self.shown)))?
            .pop_if_empty()
            .push("v1")
            .extend(&call.path);
        if !call.query.is_empty() {
            url.query_pairs_mut().extend_pairs(&call.query);
        }
        let mut req = self
            .http
            .request(call.method.clone(), url)
            .bearer_auth(&self.key)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(k) = call.idempotency_key {
            req = req.header("idempotency-key", k);
        }
        if let Some(body) = call.body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        let resp = req.send().await.map_err(|e| self.unreachable(&e))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| self.unreachable(&e))?;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if !status.is_success() {
            return Err(refusal(status, &text));
        }
        let value = serde_json::from_str(&text).map_err(|e| {
            CliError::runtime(format!(
                "the node at {} answered {status} with something that is not JSON ({e}): {}",
                self.shown,
                excerpt(&text)
            ))
        })?;
        Ok(Answer {
            status,
            text,
            value,
        })
    }

    /// A request that got no (whole) answer.
    fn unreachable(&self, e: &reqwest::Error) -> CliError {
        let why = if e.is_timeout() {
            format!("no answer within {} s", TIMEOUT.as_secs())
        } else {
            root_cause(e)
        };
        CliError::runtime(format!(
            "cannot reach the node at {}: {why} (is campanile serve running there? --server \
             or CAMPANILE_SERVER names it)",
            self.shown
        ))
    }
}

/// The innermost cause of an error (reqwest's own message only says which URL failed; its
/// sources say why, down to the operating system's "Connection refused").
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// The error a refused request becomes: the node's `message` (`{code, message, details}`),
/// or, when the body is not one (a proxy's page, hyper's empty 414), the status.
fn refusal(status: StatusCode, text: &str) -> CliError {
    let message = serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string));
    if status.is_client_error() {
        CliError::usage(
            message.unwrap_or_else(|| format!("the node answered {status}{}", suffix(text))),
        )
    } else {
        CliError::runtime(match message {
            Some(m) => format!("the node answered {status}: {m}"),
            None => format!("the node answered {status}{}", suffix(text)),
        })
    }
}

fn suffix(text: &str) -> String {
    if text.trim().is_empty() {
        String::new()
    } else {
        format!(": {}", excerpt(text))
    }
}

/// The first 200 characters of a body, on one line.
fn excerpt(text: &str) -> String {
    let one_line: String = text
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect();
    if text.trim().chars().count() > 200 {
        format!("{one_line}…")
    } else {
        one_line
    }
}

/// Runs a remote command's body on a current-thread runtime.
pub(crate) fn run<T>(
    body: impl std::future::Future<Output = Result<T, CliError>>,
) -> Result<T, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the runtime: {e}")))?
        .block_on(body)
}

/// Writes `text` to stdout. A reader that went away (`| head`) is not an error.
pub(crate) fn emit(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::runtime(format!("cannot write to stdout: {e}"))),
    }
}

/// Prints an answer as the node sent it, on one line.
pub(crate) fn emit_json(answer: &Answer) -> Result<(), CliError> {
    emit(&format!("{}\n", answer.text.trim()))
}

/// The JSON text of `--file PATH` (`-`: stdin), checked to be JSON and otherwise sent as
/// written (a payload keeps every digit).
pub(crate) fn read_definition(path: &str) -> Result<String, CliError> {
    let text = if path == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| CliError::usage(format!("--file -: cannot read stdin: {e}")))?;
        text
    } else {
        std::fs::read_to_string(path).map_err(|e| CliError::usage(format!("--file {path}: {e}")))?
    };
    serde_json::from_str::<serde::de::IgnoredAny>(&text)
        .map_err(|e| CliError::usage(format!("--file {path}: not JSON: {e}")))?;
    Ok(text)
}

/// A record id given on the command line: a UUID, as every id of the API is (checked here so
/// that no argument can turn into another path).
pub(crate) fn record_id<'a>(kind: &str, id: &'a str) -> Result<&'a str, CliError> {
    uuid::Uuid::parse_str(id)
        .map(|_| id)
        .map_err(|_| CliError::usage(format!("{kind} id '{id}' is not a UUID")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_error_is_the_nodes_message_and_exit_2() {
        let e = refusal(
            StatusCode::NOT_FOUND,
            r#"{"code":"not_found","message":"schedule 1 not found"}"#,
        );
        assert_eq!((e.code, e.message.as_str()), (2, "schedule 1 not found"));
        let e = refusal(StatusCode::URI_TOO_LONG, "");
        assert_eq!(
            (e.code, e.message.as_str()),
            (2, "the node answered 414 URI Too Long")
        );
    }

    #[test]
    fn a_server_error_is_exit_1_with_its_status() {
        let e = refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"code":"unavailable","message":"the database is unavailable; retry later"}"#,
        );
        assert_eq!(e.code, 1);
        assert_eq!(
            e.message,
            "the node answered 503 Service Unavailable: the database is unavailable; retry later"
        );
        let e = refusal(StatusCode::BAD_GATEWAY, "<html>\n<b>oops</b></html>");
        assert_eq!(
            e.message,
            "the node answered 502 Bad Gateway: <html> <b>oops</b></html>"
        );
    }

    #[test]
    fn ids_must_be_uuids() {
        assert!(record_id("schedule", "..").is_err());
        assert!(record_id("schedule", "0192f0c4-8a1e-7000-8000-000000000000").is_ok());
    }
}
