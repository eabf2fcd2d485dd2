//! `campanile bench …`: benchmarks with a progress bar, a human summary, and with `--json`
//! one JSON object of figures as the last line of stdout.

mod peak;
mod plan;
mod store;
mod throughput;

use clap::{Args, Subcommand, ValueEnum};

use crate::CliError;

/// `campanile bench` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Claim + complete throughput of the store itself, at several batch sizes.
    Store(store::StoreArgs),
    /// Occurrences materialized per second, and a planning pass at N vs M stored schedules.
    Plan(plan::PlanArgs),
    /// Claim + complete end to end through the HTTP API, at several batch sizes.
    Throughput(throughput::ThroughputArgs),
    /// The top of the minute: N schedules due at once, the real planner, HTTP workers.
    Peak(peak::PeakArgs),
}

/// The backend a benchmark runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Backend {
    /// Embedded SQLite on a temporary file.
    Sqlite,
    /// PostgreSQL at `--database`, in a temporary schema.
    Postgres,
}

/// Options every benchmark shares.
#[derive(Debug, Args)]
pub(crate) struct Common {
    /// Which backend.
    #[arg(long, value_enum, default_value = "sqlite")]
    pub(crate) backend: Backend,
    /// PostgreSQL URL (required with `--backend postgres`).
    #[arg(long, env = "CAMPANILE_DATABASE")]
    pub(crate) database: Option<String>,
    /// Print the figures as one JSON object on the last line of stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) fn run(cmd: BenchCommand) -> Result<(), CliError> {
    match cmd {
        BenchCommand::Store(args) => store::run(args),
        BenchCommand::Plan(args) => plan::run(args),
        BenchCommand::Throughput(args) => throughput::run(args),
        BenchCommand::Peak(args) => peak::run(args),
    }
}
