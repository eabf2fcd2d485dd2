//! `campanile serve`: the API, the planner and the recovery sweep in one process.

use std::net::SocketAddr;
use std::sync::Arc;

use campanile_planner::{Engine, PlannerConfig, SweepConfig};
use campanile_server::{AppState, ServerConfig, issue_key, router};
use campanile_store::{Store, TenantCreate};
use clap::Args;

use crate::{CliError, db};

/// Arguments of `campanile serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "CAMPANILE_LISTEN", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// SQLite file path (created if missing), or a postgres:// URL.
    #[arg(long, env = "CAMPANILE_DATABASE", default_value = "./campanile.db")]
    database: String,
    /// Planner shards; every node of a deployment must use the same number.
    #[arg(long, env = "CAMPANILE_SHARDS", default_value_t = 16)]
    shards: u32,
    /// Largest accepted request body in bytes.
    #[arg(long, env = "CAMPANILE_MAX_BODY_BYTES", default_value_t = 256 * 1024)]
    max_body_bytes: usize,
}

pub(crate) fn run(args: ServeArgs) -> Result<(), CliError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CAMPANILE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if !(1..=4096).contains(&args.shards) {
        return Err(CliError::usage("--shards must be between 1 and 4096"));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the runtime: {e}")))?;
    rt.block_on(serve(args))
}

async fn first_run(store: &dyn Store, database: &str) -> Result<(), CliError> {
    let err = |e: campanile_store::StoreError| {
        CliError::runtime(format!("cannot set up the first tenant: {e}"))
    };
    if !store.tenant_list().await.map_err(err)?.is_empty() {
        return Ok(());
    }
    let tenant = store
        .tenant_create(TenantCreate {
            name: "default".into(),
            now: None,
        })
        .await
        .map_err(err)?;
    let key = issue_key(store, Some(tenant.id), false)
        .await
        .map_err(err)?;
    println!("First start: created tenant \"default\". Its API key, shown only this once:");
    println!();
    println!("    {key}");
    println!();
    println!(
        "Use it as: Authorization: Bearer <key>. More tenants: campanile tenant create NAME --database {database}"
    );
    Ok(())
}

async fn serve(args: ServeArgs) -> Result<(), CliError> {
    let store = db::open(&args.database, None).await?;
    first_run(store.as_ref(), &args.database).await?;
    let mut planner = PlannerConfig::new(format!(
        "node-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    planner.shards = args.shards;
    let engine = Engine::start(Arc::clone(&store), planner, SweepConfig::default());
    let cfg = ServerConfig {
        max_body_bytes: args.max_body_bytes,
        shards: args.shards,
    };
    let app = router(
        AppState::new(Arc::clone(&store), &cfg, Some(engine.planner().clone())),
        &cfg,
    );
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::runtime(format!("cannot listen on {}: {e}", args.listen)))?;
    tracing::info!(listen = %args.listen, database = %db::redact(&args.database), "campanile is serving");
    eprintln!(
        "campanile listening on http://{} (database {})",
        args.listen,
        db::redact(&args.database)
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| CliError::runtime(format!("server failed: {e}")))?;
    // In-flight requests are done; stop planning and sweeping and hand the shards over.
    engine.shutdown().await;
    tracing::info!("campanile stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutting down: finishing in-flight requests");
}
