//! The `campanile` binary: one entry point for the service, its tools and its benchmarks.

mod admin;
mod bench;
mod db;
mod preview;
mod reconcile;
mod serve;

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
    /// Benchmarks; each prints one JSON object of figures as its last line with --json.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

/// A failure to report on stderr as one line, with its exit code.
#[derive(Debug)]
pub(crate) struct CliError {
    code: u8,
    message: String,
}

impl CliError {
    /// Bad input from the user: exit code 2.
    pub(crate) fn usage(message: impl Into<String>) -> CliError {
        CliError {
            code: 2,
            message: message.into(),
        }
    }

    /// A check that ran and found problems (`reconcile`): exit code 3.
    pub(crate) fn findings(message: impl Into<String>) -> CliError {
        CliError {
            code: 3,
            message: message.into(),
        }
    }

    /// A failure of the environment (database down, disk full): exit code 1.
    pub(crate) fn runtime(message: impl Into<String>) -> CliError {
        CliError {
            code: 1,
            message: message.into(),
        }
    }

    /// A failed connection to NATS: a malformed URL or rejected credentials are the user's
    /// input (2); a server that does not answer is the environment (1), as for the database.
    pub(crate) fn nats(e: &campanile_relay::RelayError) -> CliError {
        let message = format!("{e} (check --nats-url)");
        match e {
            campanile_relay::RelayError::Refused { .. } => CliError::usage(message),
            _ => CliError::runtime(message),
        }
    }
}

/// Runs a command's async body on a multi-threaded runtime (`serve` and the benchmarks).
pub(crate) fn block_on<T>(
    body: impl std::future::Future<Output = Result<T, CliError>>,
) -> Result<T, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the runtime: {e}")))?
        .block_on(body)
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
        Command::Bench(cmd) => bench::run(cmd),
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
