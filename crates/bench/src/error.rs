//! The benchmarks' error, and the runtime each benchmark's async body runs on.

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Bad input from the user (the CLI exits 2).
    #[error("{0}")]
    Usage(String),
    /// The environment failed: a database, NATS, the runtime (the CLI exits 1).
    #[error("{0}")]
    Runtime(String),
}

impl BenchError {
    /// Bad input from the user.
    pub(crate) fn usage(message: impl Into<String>) -> BenchError {
        BenchError::Usage(message.into())
    }

    /// The environment failed.
    pub(crate) fn runtime(message: impl Into<String>) -> BenchError {
        BenchError::Runtime(message.into())
    }

    /// NATS refused or failed: a refusal (bad credentials, a bad URL) is the user's input.
    pub(crate) fn nats(e: &campanile_relay::RelayError) -> BenchError {
        let message = format!("{e} (check --nats-url)");
        match e {
            campanile_relay::RelayError::Refused { .. } => BenchError::Usage(message),
            _ => BenchError::Runtime(message),
        }
    }
}

/// Runs a benchmark's async body on a multi-threaded runtime.
pub(crate) fn block_on<T>(
    body: impl std::future::Future<Output = Result<T, BenchError>>,
) -> Result<T, BenchError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::runtime(format!("cannot start the runtime: {e}")))?
        .block_on(body)
}
