//! The CLI's error (its message and exit code) and the runtime commands run on.

/// A failure to report on stderr as one line, with its exit code.
#[derive(Debug)]
pub(crate) struct CliError {
    pub(crate) code: u8,
    pub(crate) message: String,
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

impl From<campanile_bench::BenchError> for CliError {
    fn from(e: campanile_bench::BenchError) -> CliError {
        match e {
            campanile_bench::BenchError::Usage(m) => CliError::usage(m),
            campanile_bench::BenchError::Runtime(m) => CliError::runtime(m),
        }
    }
}
