//! `campanile bench …`: the benchmarks, a library the `campanile` binary runs. Each shows a
//! progress bar and a human summary, and with `--json` prints one JSON object of figures as the
//! last line of stdout.

mod ceiling;
mod common;
mod db;
mod error;
mod peak;
mod plan;
mod plot;
mod relay;
mod scale;
mod soak;
mod store;
mod throughput;

use clap::Subcommand;

pub use common::{Backend, Common};
pub use error::BenchError;
pub use peak::PeakArgs;
pub use plan::PlanArgs;
pub use relay::RelayArgs;
pub use scale::ScaleArgs;
pub use soak::SoakArgs;
pub use store::StoreArgs;
pub use throughput::ThroughputArgs;

/// `campanile bench` subcommands.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Claim + complete throughput of the store itself, at several batch sizes.
    Store(store::StoreArgs),
    /// Occurrences materialized per second, and a planning pass at N vs M stored schedules.
    Plan(plan::PlanArgs),
    /// Claim + complete end to end through the HTTP API, at several batch sizes.
    Throughput(throughput::ThroughputArgs),
    /// The top of the minute: N schedules due at once, the real planner, HTTP workers.
    Peak(peak::PeakArgs),
    /// Database bytes per stored schedule, a planner pass and `serve`'s memory at N schedules.
    Scale(scale::ScaleArgs),
    /// Due occurrences with a NATS target delivered by the relay into JetStream.
    Relay(relay::RelayArgs),
    /// The raw-SQL claim + complete with the same guarantees and nothing else: the ceiling
    /// the throughput benchmarks report their `ratio_to_ceiling` against.
    Ceiling(ceiling::CeilingArgs),
    /// Steady load for minutes with a short retention: database size over time (it must
    /// level off) and throughput in the first vs the last minute.
    Soak(soak::SoakArgs),
}

/// Runs one benchmark.
///
/// # Errors
///
/// Bad options ([`BenchError::Usage`]) or a failing database, NATS or runtime
/// ([`BenchError::Runtime`]).
pub fn run(cmd: BenchCommand) -> Result<(), BenchError> {
    match cmd {
        BenchCommand::Store(args) => store::run(args),
        BenchCommand::Plan(args) => plan::run(args),
        BenchCommand::Throughput(args) => throughput::run(args),
        BenchCommand::Peak(args) => peak::run(args),
        BenchCommand::Scale(args) => scale::run(args),
        BenchCommand::Relay(args) => relay::run(args),
        BenchCommand::Soak(args) => soak::run(args),
        BenchCommand::Ceiling(args) => ceiling::run(args),
    }
}
