//! Rust client and worker for Campanile's HTTP API.
//!
//! [`Client`] is a typed client for the API; [`Worker`] runs registered handlers for one queue:
//! it claims in batches, runs up to `concurrency` handlers at once, renews every held lease in
//! one call per heartbeat, stops a handler whose lease was lost (so it cannot overwrite its
//! successor's result — the server would refuse it anyway), reports transient and permanent
//! failures, and shuts down gracefully. Handlers receive the occurrence id: use it as the
//! idempotency key of whatever side effect they have.
//!
//! An `https://` base URL is reached over TLS (rustls), trusting the platform's roots;
//! [`Client::builder`] adds a private CA ([`ClientBuilder::ca_pem`]), such as that of a
//! TLS-terminating proxy in front of the nodes.
//!
//! # Example
//!
//! ```no_run
//! use campanile_sdk::{Client, Job, JobError, Worker, WorkerConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new("http://127.0.0.1:7070", "cmp_…")?;
//! let worker = Worker::new(client, WorkerConfig::new("emails", "worker-1"));
//! let (_stop, stopped) = tokio::sync::watch::channel(false);
//! worker
//!     .run(|job: Job| async move {
//!         // job.id is stable across retries and failovers: an idempotency key.
//!         Ok::<_, JobError>(serde_json::json!({ "sent_with_key": job.id.to_string() }))
//!     }, stopped)
//!     .await?;
//! # Ok(())
//! # }
//! ```

mod client;
mod payload;
mod worker;

pub use client::{
    ApiErrorBody, ClaimKey, Claimed, Client, ClientBuilder, Outcome, Renewal, SdkError,
};
pub use payload::Payload;
pub use worker::{Job, JobError, Worker, WorkerConfig, WorkerReport};
