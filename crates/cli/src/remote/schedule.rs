//! `campanile schedule …`: a tenant's schedules on a running node, over its HTTP API.

use clap::builder::PossibleValuesParser;
use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::value::RawValue;

use super::client::{Call, Connection, Remote, emit, emit_json, read_definition, record_id, run};
use super::show;
use super::table::{items, table};
use crate::error::CliError;

/// `campanile schedule`: the connection options and a subcommand.
#[derive(Debug, Args)]
pub(crate) struct ScheduleArgs {
    #[command(flatten)]
    conn: Connection,
    #[command(subcommand)]
    command: ScheduleCommand,
}

#[derive(Debug, Subcommand)]
enum ScheduleCommand {
    /// Create a schedule from flags, or from a JSON definition (--file); prints it with its
    /// next fires.
    Create(CreateArgs),
    /// List schedules, oldest first, one page at a time.
    List(ListArgs),
    /// Show one schedule with its next fires.
    Get {
        /// The schedule's id.
        id: String,
    },
    /// Pause: what no worker holds yet is canceled; what runs is left to its worker.
    Pause {
        /// The schedule's id.
        id: String,
    },
    /// Resume a paused schedule; what it missed meanwhile follows its misfire policy.
    Resume {
        /// The schedule's id.
        id: String,
    },
    /// Cancel a schedule for good (its history stays).
    Cancel {
        /// The schedule's id.
        id: String,
    },
    /// Run a schedule now: one occurrence of its current version, ready at once.
    Trigger {
        /// The schedule's id.
        id: String,
        /// Makes a retry safe: sent again with the same key, the trigger answers the
        /// occurrence the first one made instead of making another.
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
        /// This run's own payload, any JSON, in place of the version's (a string is quoted:
        /// '"hello"').
        #[arg(long, value_name = "JSON")]
        payload: Option<String>,
    },
    /// Create the occurrences a schedule's calendar has in [--from, --to) (at most 1000
    /// instants per request) and run again those recorded MISSED (rerun); instants whose
    /// occurrence ran, runs or was canceled or skipped on purpose are listed as existing.
    Backfill(BackfillArgs),
    /// List the next fire times of a timing without saving anything, each DST decision
    /// labelled: the same flags as create, or a create's --file (only its timing is sent).
    Preview(PreviewArgs),
}

/// A `--payload` argument: JSON as written (a string is quoted), exit 2 when it is not JSON.
fn payload_arg(text: &str) -> Result<Box<RawValue>, CliError> {
    RawValue::from_string(text.to_string()).map_err(|e| {
        CliError::usage(format!(
            "--payload: not JSON ({e}); a string is written in quotes: '\"text\"'"
        ))
    })
}

/// The flags that write a timing, which a preview's `--file` replaces.
const TIMING_FLAGS: [&str; 7] = [
    "cron", "every", "at", "zone", "dst_gap", "dst_fold", "anchor",
];

/// The flags that write a definition, which a create's `--file` replaces.
const DEFINITION_FLAGS: [&str; 13] = [
    "cron",
    "every",
    "at",
    "zone",
    "dst_gap",
    "dst_fold",
    "anchor",
    "queue",
    "payload",
    "overlap",
    "max_attempts",
    "lease_seconds",
    "priority",
];

/// When a schedule fires: exactly one of --cron, --every, --at.
#[derive(Debug, Args)]
struct TimingArgs {
    /// Cron expression: 5 fields (min hour dom month dow), 6 with seconds first, or a macro
    /// such as @daily.
    #[arg(long, value_name = "EXPR", conflicts_with_all = ["every", "at"])]
    cron: Option<String>,
    /// Fixed interval in hours, minutes and seconds: 90s, "1h 30m", PT15M.
    #[arg(long, value_name = "DURATION", conflicts_with = "at")]
    every: Option<String>,
    /// One-off instant (RFC 3339).
    #[arg(long, value_name = "TIMESTAMP")]
    at: Option<String>,
    /// IANA time zone whose wall clock --cron reads [default: UTC].
    #[arg(long, value_name = "ZONE", requires = "cron", conflicts_with_all = ["every", "at"])]
    zone: Option<String>,
    /// --cron wall times in a spring-forward gap: skip them, or shift to the end of the gap
    /// [default: skip].
    #[arg(long, requires = "cron", conflicts_with_all = ["every", "at"], ignore_case = true,
          value_parser = PossibleValuesParser::new(["skip", "shift"]))]
    dst_gap: Option<String>,
    /// --cron wall times in a fall-back fold: fire once (earlier instant) or twice
    /// [default: once].
    #[arg(long, requires = "cron", conflicts_with_all = ["every", "at"], ignore_case = true,
          value_parser = PossibleValuesParser::new(["once", "twice"]))]
    dst_fold: Option<String>,
    /// First instant of an --every series (RFC 3339) [default: now].
    #[arg(long, value_name = "TIMESTAMP", requires = "every", conflicts_with_all = ["cron", "at"])]
    anchor: Option<String>,
}

#[derive(Debug, Args)]
struct CreateArgs {
    /// The definition as JSON, exactly the body of POST /v1/schedules (see the README's API
    /// section), read from PATH, or from stdin with `-`. Instead of the flags below.
    #[arg(long, value_name = "PATH", conflicts_with_all = DEFINITION_FLAGS)]
    file: Option<String>,
    #[command(flatten)]
    timing: TimingArgs,
    /// The queue workers claim its occurrences from.
    #[arg(long, required_unless_present = "file")]
    queue: Option<String>,
    /// Any JSON, handed to workers with each occurrence exactly as written (a string is
    /// quoted: '"hello"').
    #[arg(long, value_name = "JSON")]
    payload: Option<String>,
    /// What to do when an occurrence comes due while the previous one still runs
    /// [default: allow].
    #[arg(long, ignore_case = true,
          value_parser = PossibleValuesParser::new(["allow", "skip_if_running", "queue_one"]))]
    overlap: Option<String>,
    /// Claims allowed per occurrence before it is a dead letter [default: 3].
    #[arg(long, value_name = "N")]
    max_attempts: Option<u32>,
    /// Lease of each claim, in seconds [default: 30].
    #[arg(long, value_name = "SECONDS")]
    lease_seconds: Option<i64>,
    /// Higher is claimed first [default: 0].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    priority: Option<i32>,
    /// Makes a retried create safe: sent again with the same key and definition, it answers
    /// the schedule the first one created.
    #[arg(long, value_name = "KEY")]
    idempotency_key: Option<String>,
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Only schedules in this state: ACTIVE, PAUSED, CANCELED or FINISHED.
    #[arg(long)]
    state: Option<String>,
    /// Only schedules of this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Page size [node's default: 50; at most 500].
    #[arg(long, value_name = "N")]
    limit: Option<u32>,
    /// The page after the one that printed this cursor.
    #[arg(long)]
    cursor: Option<String>,
}

#[derive(Debug, Args)]
struct BackfillArgs {
    /// The schedule's id.
    id: String,
    /// Start of the range, included (RFC 3339).
    #[arg(long, value_name = "TIMESTAMP")]
    from: String,
    /// End of the range, excluded (RFC 3339).
    #[arg(long, value_name = "TIMESTAMP")]
    to: String,
    /// Overlap policy for the occurrences made [default: the schedule's].
    #[arg(long, ignore_case = true,
          value_parser = PossibleValuesParser::new(["allow", "skip_if_running", "queue_one"]))]
    overlap: Option<String>,
    /// Makes a retry safe: sent again with the same key, the backfill answers what the first
    /// one did (replayed).
    #[arg(long, value_name = "KEY")]
    idempotency_key: Option<String>,
}

#[derive(Debug, Args)]
struct PreviewArgs {
    /// A definition as JSON (a create's --file; `-`: stdin): its timing fields are sent,
    /// the rest (queue, payload, policies) is left out.
    #[arg(long, value_name = "PATH", conflicts_with_all = TIMING_FLAGS)]
    file: Option<String>,
    #[command(flatten)]
    timing: TimingArgs,
    /// Fire times strictly after this instant (RFC 3339) [default: now].
    #[arg(long, value_name = "TIMESTAMP")]
    after: Option<String>,
    /// How many fire times [node's default: 10; at most 1000].
    #[arg(long, value_name = "N")]
    count: Option<u32>,
}

/// The JSON a create or a preview sends from flags; absent fields are left to the node's
/// defaults.
#[derive(Debug, Default, Serialize)]
struct Definition<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cron: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timezone: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dst: Option<Dst>,
    #[serde(skip_serializing_if = "Option::is_none")]
    every: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    anchor: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    at: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    overlap: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry: Option<Retry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    after: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    count: Option<u32>,
}

#[derive(Debug, Serialize)]
struct Dst {
    #[serde(skip_serializing_if = "Option::is_none")]
    gap: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fold: Option<String>,
}

#[derive(Debug, Serialize)]
struct Retry {
    max_attempts: u32,
}

impl TimingArgs {
    /// The timing fields of a definition; one of --cron, --every, --at is required.
    fn definition(&self) -> Result<Definition<'_>, CliError> {
        if self.cron.is_none() && self.every.is_none() && self.at.is_none() {
            return Err(CliError::usage(
                "give when it fires: --cron EXPR, --every DURATION or --at TIMESTAMP (or the \
                 whole definition with --file)",
            ));
        }
        let dst = (self.dst_gap.is_some() || self.dst_fold.is_some()).then(|| Dst {
            gap: self.dst_gap.as_deref().map(str::to_ascii_lowercase),
            fold: self.dst_fold.as_deref().map(str::to_ascii_lowercase),
        });
        Ok(Definition {
            cron: self.cron.as_deref(),
            timezone: self.zone.as_deref(),
            dst,
            every: self.every.as_deref(),
            anchor: self.anchor.as_deref(),
            at: self.at.as_deref(),
            ..Definition::default()
        })
    }
}

impl CreateArgs {
    /// The body of `POST /v1/schedules`: the file as written, or the flags' definition.
    fn body(&self) -> Result<String, CliError> {
        if let Some(path) = &self.file {
            return read_definition(path);
        }
        let payload = self.payload.as_deref().map(payload_arg).transpose()?;
        let definition = Definition {
            queue: self.queue.as_deref(),
            payload,
            priority: self.priority,
            lease_seconds: self.lease_seconds,
            overlap: self.overlap.as_deref().map(str::to_ascii_uppercase),
            retry: self.max_attempts.map(|max_attempts| Retry { max_attempts }),
            ..self.timing.definition()?
        };
        to_json(&definition)
    }
}

/// The fields of a definition that a preview does not take.
const NOT_TIMING: [&str; 10] = [
    "queue",
    "target",
    "payload",
    "priority",
    "lease_seconds",
    "misfire",
    "overlap",
    "flex_window_seconds",
    "retry",
    "version",
];

impl PreviewArgs {
    /// The body of `POST /v1/schedules/preview`.
    fn body(&self) -> Result<String, CliError> {
        let Some(path) = &self.file else {
            let definition = Definition {
                after: self.after.as_deref(),
                count: self.count,
                ..self.timing.definition()?
            };
            return to_json(&definition);
        };
        let text = read_definition(path)?;
        // Fields kept as written; what a preview does not take is left out, anything else
        // (a misspelt field too) goes to the node, which says what is wrong with it.
        let mut fields: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text)
            .map_err(|_| {
                CliError::usage(format!(
                    "--file {path}: expected a JSON object (a schedule definition)"
                ))
            })?;
        fields.retain(|k, _| !NOT_TIMING.contains(&k.as_str()));
        if let Some(after) = &self.after {
            fields.insert("after".into(), after.clone().into());
        }
        if let Some(count) = self.count {
            fields.insert("count".into(), count.into());
        }
        Ok(serde_json::Value::Object(fields).to_string())
    }
}

fn to_json(definition: &Definition<'_>) -> Result<String, CliError> {
    serde_json::to_string(definition)
        .map_err(|e| CliError::runtime(format!("cannot write the request: {e}")))
}

/// Runs `campanile schedule …`.
pub(crate) fn command(args: ScheduleArgs) -> Result<(), CliError> {
    let remote = Remote::new(&args.conn)?;
    run(async move {
        match &args.command {
            ScheduleCommand::Create(c) => {
                let body = c.body()?;
                let answer = remote
                    .send(
                        Call::post(&["schedules"])
                            .body(body)
                            .idempotency_key(c.idempotency_key.as_deref()),
                    )
                    .await?;
                if remote.json {
                    return emit_json(&answer);
                }
                emit(&show::schedule(&answer.value, &answer.text))
            }
            ScheduleCommand::List(l) => {
                let limit = l.limit.map(|n| n.to_string());
                let answer = remote
                    .send(
                        Call::get(&["schedules"])
                            .query("state", l.state.as_deref())
                            .query("queue", l.queue.as_deref())
                            .query("limit", limit.as_deref())
                            .query("cursor", l.cursor.as_deref()),
                    )
                    .await?;
                if remote.json {
                    return emit_json(&answer);
                }
                let schedules = items(&answer.value, "schedules");
                let rows: Vec<Vec<String>> = schedules.iter().map(show::schedule_row).collect();
                let mut out = table(&show::SCHEDULE_HEADERS, &rows);
                if rows.is_empty() {
                    out.push_str("(no schedules)\n");
                }
                out.push_str(&show::page_end(&answer.value));
                emit(&out)
            }
            ScheduleCommand::Get { id } => {
                let id = record_id("schedule", id)?;
                let answer = remote.send(Call::get(&["schedules", id])).await?;
                if remote.json {
                    return emit_json(&answer);
                }
                emit(&show::schedule(&answer.value, &answer.text))
            }
            ScheduleCommand::Pause { id }
            | ScheduleCommand::Resume { id }
            | ScheduleCommand::Cancel { id } => {
                let action = match &args.command {
                    ScheduleCommand::Pause { .. } => "pause",
                    ScheduleCommand::Resume { .. } => "resume",
                    _ => "cancel",
                };
                let id = record_id("schedule", id)?;
                let answer = remote.send(Call::post(&["schedules", id, action])).await?;
                if remote.json {
                    return emit_json(&answer);
                }
                emit(&show::change(&answer.value, &answer.text))
            }
            ScheduleCommand::Trigger {
                id,
                idempotency_key,
                payload,
            } => {
                let id = record_id("schedule", id)?;
                let mut call = Call::post(&["schedules", id, "trigger"])
                    .idempotency_key(idempotency_key.as_deref());
                if let Some(p) = payload {
                    let body = serde_json::json!({ "payload": payload_arg(p)? });
                    call = call.body(body.to_string());
                }
                let answer = remote.send(call).await?;
                if remote.json {
                    return emit_json(&answer);
                }
                let head = if answer.status == reqwest::StatusCode::CREATED {
                    "triggered: a new occurrence\n\n"
                } else {
                    "triggered before with this Idempotency-Key: the occurrence it made\n\n"
                };
                emit(&format!(
                    "{head}{}",
                    show::occurrence(&answer.value, &answer.text)
                ))
            }
            ScheduleCommand::Backfill(b) => {
                let id = record_id("schedule", &b.id)?;
                let mut body = serde_json::json!({"from": b.from, "to": b.to});
                if let Some(o) = &b.overlap {
                    body["overlap"] = o.to_ascii_lowercase().into();
                }
                let answer = remote
                    .send(
                        Call::post(&["schedules", id, "backfill"])
                            .body(body.to_string())
                            .idempotency_key(b.idempotency_key.as_deref()),
                    )
                    .await?;
                if remote.json {
                    return emit_json(&answer);
                }
                emit(&show::backfill(&answer.value))
            }
            ScheduleCommand::Preview(p) => {
                let body = p.body()?;
                let answer = remote
                    .send(Call::post(&["schedules", "preview"]).body(body))
                    .await?;
                if remote.json {
                    return emit_json(&answer);
                }
                emit(&show::preview(&answer.value))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: ScheduleArgs,
    }

    fn create_body(args: &[&str]) -> Result<String, String> {
        let cli = Cli::try_parse_from(
            ["schedule", "--key", "k", "create"]
                .iter()
                .chain(args)
                .copied(),
        )
        .map_err(|e| e.kind().to_string())?;
        match cli.args.command {
            ScheduleCommand::Create(c) => c.body().map_err(|e| e.message),
            other => Err(format!("{other:?}")),
        }
    }

    #[test]
    fn flags_write_the_create_body() {
        let body = create_body(&[
            "--queue",
            "emails",
            "--cron",
            "30 2 * * *",
            "--zone",
            "America/New_York",
            "--dst-gap",
            "SHIFT",
            "--payload",
            r#"{"n": 12345678901234567890123}"#,
            "--overlap",
            "skip_if_running",
            "--max-attempts",
            "1",
        ])
        .unwrap();
        assert_eq!(
            body,
            r#"{"queue":"emails","cron":"30 2 * * *","timezone":"America/New_York","dst":{"gap":"shift"},"payload":{"n": 12345678901234567890123},"overlap":"SKIP_IF_RUNNING","retry":{"max_attempts":1}}"#
        );
    }

    #[test]
    fn flags_are_checked_before_anything_is_sent() {
        // No timing.
        let e = create_body(&["--queue", "q"]).unwrap_err();
        assert!(e.contains("--cron"), "{e}");
        // Two timings, a zone without cron, a file with flags: clap refuses.
        assert!(create_body(&["--queue", "q", "--cron", "* * * * *", "--every", "1m"]).is_err());
        assert!(create_body(&["--queue", "q", "--every", "1m", "--zone", "UTC"]).is_err());
        assert!(
            create_body(&[
                "--queue",
                "q",
                "--at",
                "2030-01-01T00:00:00Z",
                "--dst-gap",
                "shift"
            ])
            .is_err()
        );
        assert!(
            create_body(&[
                "--queue",
                "q",
                "--cron",
                "* * * * *",
                "--anchor",
                "2030-01-01T00:00:00Z"
            ])
            .is_err()
        );
        assert!(create_body(&["--file", "x.json", "--queue", "q"]).is_err());
        // A payload that is not JSON.
        let e = create_body(&[
            "--queue",
            "q",
            "--at",
            "2030-01-01T00:00:00Z",
            "--payload",
            "hi",
        ])
        .unwrap_err();
        assert!(e.starts_with("--payload: not JSON"), "{e}");
    }
}
