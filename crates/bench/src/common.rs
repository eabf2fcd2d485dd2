//! What every benchmark shares: the backend and its temporary database, the schedule the\n//! benchmarks plan, due occurrences seeded fast, and the summary printed.

use clap::{Args, ValueEnum};

use crate::error::BenchError;

/// The backend a benchmark runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Embedded SQLite on a temporary file.
    Sqlite,
    /// PostgreSQL at `--database`, in a temporary schema.
    Postgres,
}

/// Options every benchmark shares.
#[derive(Debug, Args)]
pub struct Common {
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

/// A benchmark's database: a temporary SQLite file, or a temporary schema on the PostgreSQL
/// server given by `--database`, dropped by [`BenchDb::finish`].
pub(crate) struct BenchDb {
    pub(crate) store: std::sync::Arc<dyn campanile_store::Store>,
    pub(crate) database: String,
    pub(crate) schema: Option<String>,
    /// The SQLite file, for size measurements.
    pub(crate) sqlite_path: Option<std::path::PathBuf>,
    _tmp: tempfile::TempDir,
}

impl Common {
    /// Opens a fresh database for one benchmark run.
    pub(crate) async fn open(&self, file: &str) -> Result<BenchDb, BenchError> {
        let tmp = tempfile::tempdir().map_err(|e| {
            BenchError::runtime(format!("cannot create a temporary directory: {e}"))
        })?;
        let (database, schema, sqlite_path) = match self.backend {
            Backend::Sqlite => {
                let path = tmp.path().join(file);
                (path.display().to_string(), None, Some(path))
            }
            Backend::Postgres => {
                let url = self.database.clone().ok_or_else(|| {
                    BenchError::usage("--backend postgres needs --database postgres://…")
                })?;
                if !crate::db::is_postgres(&url) {
                    return Err(BenchError::usage(
                        "--database must be a postgres:// URL with --backend postgres",
                    ));
                }
                (
                    url,
                    Some(format!("bench_{}", uuid::Uuid::now_v7().simple())),
                    None,
                )
            }
        };
        let store = crate::db::open(&database, schema.clone()).await?;
        Ok(BenchDb {
            store,
            database,
            schema,
            sqlite_path,
            _tmp: tmp,
        })
    }
}

impl BenchDb {
    /// Drops the temporary PostgreSQL schema (the SQLite file goes with its directory).
    pub(crate) async fn finish(self) -> Result<(), BenchError> {
        if let Some(schema) = &self.schema {
            crate::db::drop_pg_schema(&self.database, schema).await?;
        }
        Ok(())
    }
}

/// Serves `app` on a loopback port: its base URL, and the task serving it (aborted when the
/// benchmark is done).
pub(crate) async fn serve(
    app: axum::Router,
) -> Result<(String, tokio::task::JoinHandle<std::io::Result<()>>), BenchError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| BenchError::runtime(e.to_string()))?;
    let addr = listener
        .local_addr()
        .map_err(|e| BenchError::runtime(e.to_string()))?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((format!("http://{addr}"), server))
}

/// A new tenant named `name`, and an API key of it.
pub(crate) async fn tenant_with_key(
    store: &dyn campanile_store::Store,
    name: &str,
) -> Result<(campanile_store::TenantId, String), BenchError> {
    let err = |e: campanile_store::StoreError| BenchError::runtime(format!("store error: {e}"));
    let tenant = store
        .tenant_create(campanile_store::TenantCreate {
            name: name.into(),
            now: None,
        })
        .await
        .map_err(err)?
        .id;
    let key = campanile_server::issue_key(store, Some(tenant), false)
        .await
        .map_err(err)?;
    Ok((tenant, key))
}

/// The definition every benchmark schedule uses: `timing` on `queue`, default policies.
pub(crate) fn bench_spec(
    timing: campanile_store::Timing,
    queue: &str,
) -> campanile_store::ScheduleSpec {
    use jiff::SignedDuration;
    campanile_store::ScheduleSpec {
        timing,
        queue: queue.into(),
        payload: Some("{\"n\":1}".into()),
        priority: 0,
        lease: SignedDuration::from_secs(60),
        max_attempts: 3,
        backoff_initial: SignedDuration::from_secs(1),
        backoff_max: SignedDuration::from_secs(60),
        misfire: campanile_core::Misfire::default(),
        overlap: campanile_core::Overlap::Allow,
        flex_window: SignedDuration::ZERO,
    }
}

/// Gives `tenant` `n` one-off occurrences on `queue`, all already due (one per millisecond
/// before now, as a planner would have written them), under one new schedule.
pub(crate) async fn seed_due(
    store: &dyn campanile_store::Store,
    tenant: campanile_store::TenantId,
    queue: &str,
    n: u32,
) -> Result<(), BenchError> {
    use campanile_store::{NewOccurrence, OccurrenceInsertMany, ScheduleCreate, Timing};
    use jiff::{SignedDuration, Timestamp};
    let err = |e: campanile_store::StoreError| BenchError::runtime(format!("store error: {e}"));
    let t0 = Timestamp::now();
    let schedule = campanile_core::ScheduleId(uuid::Uuid::now_v7());
    let spec = bench_spec(Timing::At(t0), queue);
    store
        .schedule_create(ScheduleCreate {
            tenant,
            id: schedule,
            spec: spec.clone(),
            shard: 0,
            next_run_at: None,
            fires_per_hour: 0,
            idempotency: None,
            now: None,
        })
        .await
        .map_err(err)?;
    let n = i64::from(n);
    for chunk_start in (0..n).step_by(50_000) {
        let items = (chunk_start..(chunk_start + 50_000).min(n))
            .map(|i| {
                let at = t0
                    .checked_sub(SignedDuration::from_millis(n - i))
                    .unwrap_or(t0);
                NewOccurrence {
                    schedule_id: schedule,
                    version: 1,
                    scheduled_for: at,
                    available_at: at,
                    queue: queue.into(),
                    priority: spec.priority,
                    max_attempts: spec.max_attempts,
                    backoff_initial: spec.backoff_initial,
                    backoff_max: spec.backoff_max,
                    state: campanile_core::OccurrenceState::Ready,
                    overlap: spec.overlap,
                    lease: spec.lease,
                }
            })
            .collect();
        store
            .occurrence_insert_many(OccurrenceInsertMany {
                tenant,
                items,
                now: None,
            })
            .await
            .map_err(err)?;
    }
    Ok(())
}

/// Prints a `batch / occurrences/s / seconds` table of benchmark results.
pub(crate) fn print_rates(results: &[serde_json::Value]) {
    println!(
        "{:>8}  {:>14}  {:>9}  {:>10}  {:>8}",
        "batch", "occurrences/s", "seconds", "ceiling/s", "ratio"
    );
    for r in results {
        let ceiling = r["ceiling_occurrences_per_sec"]
            .as_f64()
            .map_or("–".to_string(), |c| format!("{c:.0}"));
        let ratio = r["ratio_to_ceiling"]
            .as_f64()
            .map_or("–".to_string(), |c| format!("{c:.2}"));
        println!(
            "{:>8}  {:>14.0}  {:>9.3}  {:>10}  {:>8}",
            r["batch"],
            r["occurrences_per_sec"].as_f64().unwrap_or(0.0),
            r["seconds"].as_f64().unwrap_or(0.0),
            ceiling,
            ratio
        );
    }
}

/// The raw-SQL ceiling measured before a measurement (`None` when `skip`): with the one
/// [`ceiling_after`] measures after it, it brackets the measurement, so that the machine's
/// speed drifting during the run moves the ratio less than one ceiling on either side would.
pub(crate) async fn ceiling_before(
    common: &Common,
    skip: bool,
    occurrences: u32,
    batch: u32,
    workers: u32,
) -> Result<Option<f64>, BenchError> {
    if skip {
        return Ok(None);
    }
    Ok(Some(
        crate::ceiling::rate(common, occurrences, batch, workers).await?,
    ))
}

/// The ceiling measured after a measurement, when one was measured `before` it (same
/// occurrences, batch and workers).
pub(crate) async fn ceiling_after(
    common: &Common,
    before: Option<f64>,
    occurrences: u32,
    batch: u32,
    workers: u32,
) -> Result<Option<Ceiling>, BenchError> {
    let Some(before) = before else {
        return Ok(None);
    };
    let after = crate::ceiling::rate(common, occurrences, batch, workers).await?;
    Ok(Some(Ceiling { before, after }))
}

/// The ceilings measured before and after a measurement, in occurrences per second.
pub(crate) struct Ceiling {
    before: f64,
    after: f64,
}

impl Ceiling {
    /// Adds to the measurement `r` `ceiling_occurrences_per_sec`, the mean of the two
    /// ceilings (each also reported, as `ceiling_before_occurrences_per_sec` and
    /// `ceiling_after_occurrences_per_sec`), and `ratio_to_ceiling`, `r`'s
    /// `occurrences_per_sec` over that mean.
    pub(crate) fn record(&self, r: &mut serde_json::Value) {
        let Some(rate) = r["occurrences_per_sec"].as_f64() else {
            return;
        };
        let mean = (self.before + self.after) / 2.0;
        r["ceiling_before_occurrences_per_sec"] = serde_json::json!(self.before);
        r["ceiling_after_occurrences_per_sec"] = serde_json::json!(self.after);
        r["ceiling_occurrences_per_sec"] = serde_json::json!(mean);
        r["ratio_to_ceiling"] = serde_json::json!(rate / mean.max(1e-9));
    }
}

/// Runs `measure` between the ceiling measured right before it and right after it (over
/// `occurrences` rows at `batch` and `workers`; neither when `skip`), and records them in its
/// result ([`Ceiling::record`]).
pub(crate) async fn bracketed(
    common: &Common,
    skip: bool,
    occurrences: u32,
    batch: u32,
    workers: u32,
    measure: impl std::future::Future<Output = Result<serde_json::Value, BenchError>>,
) -> Result<serde_json::Value, BenchError> {
    let before = ceiling_before(common, skip, occurrences, batch, workers).await?;
    let mut r = measure.await?;
    if let Some(ceiling) = ceiling_after(common, before, occurrences, batch, workers).await? {
        ceiling.record(&mut r);
    }
    Ok(r)
}
