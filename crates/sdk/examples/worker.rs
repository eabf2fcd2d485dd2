//! An example worker: for each occurrence of a queue, writes a receipt file named after the
//! occurrence id — idempotently, so a re-run after a crash or a lost lease does not write a
//! second, different receipt.
//!
//! ```text
//! CAMPANILE_URL=http://127.0.0.1:7070 CAMPANILE_KEY=cmp_… \
//!   cargo run -p campanile-sdk --example worker -- emails ./receipts
//! ```
//!
//! An `https://` URL is reached over TLS, trusting the platform's roots and, when
//! `CAMPANILE_CA` names a PEM file, the CAs in it too.

use std::io::Write;
use std::path::PathBuf;

use campanile_sdk::{Client, Job, JobError, Worker, WorkerConfig};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let queue = args.next().unwrap_or_else(|| "default".into());
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "./receipts".into()));
    std::fs::create_dir_all(&dir)?;
    let url = std::env::var("CAMPANILE_URL").unwrap_or_else(|_| "http://127.0.0.1:7070".into());
    let key =
        std::env::var("CAMPANILE_KEY").map_err(|_| "set CAMPANILE_KEY to a tenant API key")?;
    let worker_id = format!("example-{}", std::process::id());
    let mut client = Client::builder(&url, &key);
    if let Ok(ca) = std::env::var("CAMPANILE_CA") {
        client = client.ca_pem(std::fs::read(&ca).map_err(|e| format!("CAMPANILE_CA {ca}: {e}"))?);
    }
    let client = client.build()?;
    let worker = Worker::new(client, WorkerConfig::new(queue.clone(), worker_id.clone()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        let _ = stop.send(true);
    });
    eprintln!(
        "{worker_id} working on queue '{queue}', receipts in {}",
        dir.display()
    );
    let report = worker
        .run(
            move |job: Job| {
                let dir = dir.clone();
                async move { write_receipt(&dir, &job) }
            },
            stopped,
        )
        .await?;
    eprintln!("stopped: {report:?}");
    Ok(())
}

/// The side effect, keyed by the occurrence id: `create_new` makes a second attempt find the
/// first one's receipt instead of writing another.
fn write_receipt(dir: &std::path::Path, job: &Job) -> Result<serde_json::Value, JobError> {
    if job.cancel_requested() {
        return Err(JobError::Permanent(
            "canceled before the side effect".into(),
        ));
    }
    let path = dir.join(format!("{}.json", job.id));
    let receipt = json!({ "occurrence_id": job.id, "scheduled_for": job.scheduled_for, "payload": job.payload });
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(mut f) => {
            f.write_all(receipt.to_string().as_bytes())
                .map_err(|e| JobError::Transient(e.to_string()))?;
            f.sync_all()
                .map_err(|e| JobError::Transient(e.to_string()))?;
            Ok(json!({ "receipt": path.display().to_string(), "written": true }))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Ok(json!({ "receipt": path.display().to_string(), "written": false }))
        }
        Err(e) => Err(JobError::Transient(e.to_string())),
    }
}
