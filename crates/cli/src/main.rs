//! The `campanile` binary: one entry point for the service, its tools and its benchmarks.

mod preview;

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
    /// List the next fire times of a cron expression in a time zone.
    Preview(preview::PreviewArgs),
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Preview(args) => preview::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}
