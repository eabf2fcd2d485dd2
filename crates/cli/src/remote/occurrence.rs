//! `campanile occurrence …`: a tenant's occurrences on a running node, over its HTTP API.

use clap::{Args, Subcommand};

use super::client::{Call, Connection, Remote, emit, emit_json, record_id, run};
use super::show;
use super::table::{items, table};
use crate::error::CliError;

/// `campanile occurrence`: the connection options and a subcommand.
#[derive(Debug, Args)]
pub(crate) struct OccurrenceArgs {
    #[command(flatten)]
    conn: Connection,
    #[command(subcommand)]
    command: OccurrenceCommand,
}

#[derive(Debug, Subcommand)]
enum OccurrenceCommand {
    /// List occurrences in planned order, one page at a time (MISSED, DEAD, SKIPPED_OVERLAP
    /// and CANCELED ones included).
    List(ListArgs),
    /// Show one occurrence with its attempts and result.
    Get {
        /// The occurrence's id.
        id: String,
    },
    /// Make a dead letter (DEAD) ready to be claimed again.
    Redrive {
        /// The occurrence's id.
        id: String,
    },
    /// Cancel one occurrence: a pending one is canceled; a running one is flagged, its
    /// worker sees it on its next renewal.
    Cancel {
        /// The occurrence's id.
        id: String,
    },
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Only this schedule's (its id).
    #[arg(long, value_name = "ID")]
    schedule: Option<String>,
    /// Only occurrences in this state: SCHEDULED, READY, RUNNING, SUCCEEDED, RETRY_WAIT,
    /// DEAD, MISSED, CANCELED, SKIPPED_OVERLAP.
    #[arg(long)]
    state: Option<String>,
    /// Planned at or after this instant (RFC 3339).
    #[arg(long, value_name = "TIMESTAMP")]
    from: Option<String>,
    /// Planned before this instant (RFC 3339).
    #[arg(long, value_name = "TIMESTAMP")]
    to: Option<String>,
    /// Page size [node's default: 100; at most 1000].
    #[arg(long, value_name = "N")]
    limit: Option<u32>,
    /// The page after the one that printed this cursor.
    #[arg(long)]
    cursor: Option<String>,
}

/// Runs `campanile occurrence …`.
pub(crate) fn command(args: OccurrenceArgs) -> Result<(), CliError> {
    let remote = Remote::new(&args.conn)?;
    run(async move {
        match &args.command {
            OccurrenceCommand::List(l) => {
                let limit = l.limit.map(|n| n.to_string());
                let answer = remote
                    .send(
                        Call::get(&["occurrences"])
                            .query("schedule_id", l.schedule.as_deref())
                            .query("state", l.state.as_deref())
                            .query("from", l.from.as_deref())
                            .query("to", l.to.as_deref())
                            .query("limit", limit.as_deref())
                            .query("cursor", l.cursor.as_deref()),
                    )
                    .await?;
                if remote.json {
                    return emit_json(&answer);
                }
                let rows: Vec<Vec<String>> = items(&answer.value, "occurrences")
                    .iter()
                    .map(show::occurrence_row)
                    .collect();
                let mut out = table(&show::OCCURRENCE_HEADERS, &rows);
                if rows.is_empty() {
                    out.push_str("(no occurrences)\n");
                }
                out.push_str(&show::page_end(&answer.value));
                emit(&out)
            }
            OccurrenceCommand::Get { id } => {
                let id = record_id("occurrence", id)?;
                let answer = remote.send(Call::get(&["occurrences", id])).await?;
                if remote.json {
                    return emit_json(&answer);
                }
                emit(&show::occurrence(&answer.value, &answer.text))
            }
            OccurrenceCommand::Redrive { id } | OccurrenceCommand::Cancel { id } => {
                let action = match &args.command {
                    OccurrenceCommand::Redrive { .. } => "redrive",
                    _ => "cancel",
                };
                let id = record_id("occurrence", id)?;
                let answer = remote
                    .send(Call::post(&["occurrences", id, action]))
                    .await?;
                if remote.json {
                    return emit_json(&answer);
                }
                emit(&show::ack(&answer.value))
            }
        }
    })
}
