//! The `campanile` binary: one entry point for the service, its tools and its benchmarks.

mod admin;
mod db;
mod error;
mod preview;
mod reconcile;
mod remote;
mod serve;

use crate::error::CliError;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Campanile: a multi-tenant job scheduler that never fires twice, never forgets, and keeps
/// its promises across DST changes.
#[derive(Debug, Parser)]
#[command(name = "campanile", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the service: the HTTP API, the planner and the recovery sweep.
    Serve(serve::ServeArgs),
    /// List the next fire times of a cron expression in a time zone.
    Preview(preview::PreviewArgs),
    /// Manage tenants.
    #[command(subcommand)]
    Tenant(admin::TenantCommand),
    /// Manage API keys.
    #[command(subcommand)]
    Key(admin::KeyCommand),
    /// Recompute, for a tenant and a time range, the occurrences every schedule version should
    /// have and classify each (succeeded, failed, canceled, missed, skipped, pending, not
    /// planned yet, or missing); exit status 3 when any is missing or unexpected.
    Reconcile(reconcile::ReconcileArgs),
    /// Create or upgrade the database schema (also done on every start).
    Migrate {
        /// SQLite file path, or a postgres:// URL.
        #[arg(long, env = "CAMPANILE_DATABASE", default_value = "./campanile.db")]
        database: String,
    },
    /// A tenant's schedules on a running node, over HTTP (--server, --key).
    Schedule(remote::ScheduleArgs),
    /// A tenant's occurrences on a running node, over HTTP (--server, --key).
    Occurrence(remote::OccurrenceArgs),
    /// Benchmarks; each prints one JSON object of figures as its last line with --json.
    #[command(subcommand)]
    Bench(campanile_bench::BenchCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Preview(args) => preview::run(&args),
        Command::Tenant(cmd) => admin::tenant(cmd),
        Command::Key(cmd) => admin::key(cmd),
        Command::Reconcile(args) => reconcile::run(args),
        Command::Migrate { database } => migrate(&database),
        Command::Schedule(args) => remote::schedule(args),
        Command::Occurrence(args) => remote::occurrence(args),
        Command::Bench(cmd) => campanile_bench::run(cmd).map_err(CliError::from),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}

fn migrate(database: &str) -> Result<(), CliError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the runtime: {e}")))?;
    rt.block_on(db::open(database, None))?;
    println!(
        "{} is at schema version {}",
        db::redact(database),
        db::latest_version(database)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn every_command_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
