//! `campanile serve`: the API, the planner and the recovery sweep in one process.

use std::net::SocketAddr;
use std::sync::Arc;

use campanile_planner::{Engine, PlannerConfig, SweepConfig};
use campanile_server::{AppState, ServerConfig, issue_key, router};
use campanile_store::{DeploymentShards, ShardRelease, Store, TenantCreate};
use clap::Args;

use crate::db;
use crate::error::CliError;

/// Arguments of `campanile serve`. Each setting comes from, in order: the flag, the
/// environment variable, the config file, the built-in default.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:7070].
    #[arg(long, env = "CAMPANILE_LISTEN")]
    listen: Option<SocketAddr>,
    /// SQLite file path (created if missing), or a postgres:// URL [default: ./campanile.db].
    #[arg(long, env = "CAMPANILE_DATABASE")]
    database: Option<String>,
    /// Planner shards; every node of a deployment must use the same number [default: 16].
    #[arg(long, env = "CAMPANILE_SHARDS")]
    shards: Option<u32>,
    /// Largest accepted request body in bytes [default: 262144].
    #[arg(long, env = "CAMPANILE_MAX_BODY_BYTES")]
    max_body_bytes: Option<usize>,
    /// NATS server for external targets (e.g. nats://127.0.0.1:4222): this node relays
    /// occurrences of schedules with a NATS target to JetStream. Without it, such schedules
    /// are refused.
    #[arg(long, env = "CAMPANILE_NATS_URL")]
    nats_url: Option<String>,
    /// How long a verified API key is trusted before it is read again, in milliseconds: the
    /// longest a key revoked with `campanile key revoke` keeps working on a running node; 0
    /// reads the key on every request [default: 1000].
    #[arg(long, env = "CAMPANILE_KEY_CACHE_MS")]
    key_cache_ms: Option<u64>,
    /// Seconds a client has to send a request's head (line and headers); also how long an
    /// idle keep-alive connection stays open [default: 10].
    #[arg(long, env = "CAMPANILE_HEADER_READ_TIMEOUT")]
    header_read_timeout: Option<u64>,
    /// Seconds a client has to send a request's body once its head is read (408 after)
    /// [default: 30].
    #[arg(long, env = "CAMPANILE_BODY_READ_TIMEOUT")]
    body_read_timeout: Option<u64>,
    /// Most client connections open at once; more wait in the listen backlog [default: 1024,
    /// or the open-files limit minus 64 when that is lower].
    #[arg(long, env = "CAMPANILE_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// On SIGTERM or Ctrl-C, seconds the requests in flight get to finish before their
    /// connections are closed; the node then stops planning and releases its shards
    /// [default: 30].
    #[arg(long, env = "CAMPANILE_SHUTDOWN_TIMEOUT")]
    shutdown_timeout: Option<u64>,
    /// Seconds a client may leave an answer unread before its connection is closed
    /// [default: 30].
    #[arg(long, env = "CAMPANILE_SEND_TIMEOUT")]
    send_timeout: Option<u64>,
    /// MiB that the answers in flight (lists, claims) may hold at once, from before their
    /// records are read until they are sent, an answer counting twice its size while it is
    /// built; one tenant's answers hold at most half of it; at least 16 (one whole answer
    /// being built) [default: 64].
    #[arg(long, env = "CAMPANILE_ANSWER_MEMORY_MIB")]
    answer_memory_mib: Option<usize>,
    /// Days a tenant's finished occurrences stay in the database before they are archived
    /// and removed, for tenants without a retention of their own (`campanile tenant
    /// retention`); 0 keeps them forever [default: 14].
    #[arg(long, env = "CAMPANILE_RETENTION_DAYS")]
    retention_days: Option<u32>,
    /// Where retention writes its archive: gzip-compressed JSON Lines files per tenant and
    /// day [default: `campanile-archive` beside the SQLite file, or in the working directory
    /// for PostgreSQL].
    #[arg(long, env = "CAMPANILE_ARCHIVE_DIR")]
    archive_dir: Option<std::path::PathBuf>,
    /// Remove finished history under retention without archiving it (only the per-day counts
    /// stay in the database).
    #[arg(long, env = "CAMPANILE_NO_ARCHIVE")]
    no_archive: bool,
    /// A TOML file with any of: listen, database, shards, max_body_bytes, nats_url,
    /// key_cache_ms, header_read_timeout, body_read_timeout, max_connections,
    /// shutdown_timeout, send_timeout, answer_memory_mib, retention_days, archive_dir,
    /// no_archive.
    #[arg(long, env = "CAMPANILE_CONFIG")]
    config: Option<std::path::PathBuf>,
}

/// The config file's shape.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<SocketAddr>,
    database: Option<String>,
    shards: Option<u32>,
    max_body_bytes: Option<usize>,
    nats_url: Option<String>,
    key_cache_ms: Option<u64>,
    header_read_timeout: Option<u64>,
    body_read_timeout: Option<u64>,
    max_connections: Option<usize>,
    shutdown_timeout: Option<u64>,
    send_timeout: Option<u64>,
    answer_memory_mib: Option<usize>,
    retention_days: Option<u32>,
    archive_dir: Option<std::path::PathBuf>,
    no_archive: Option<bool>,
}

/// The resolved settings.
#[derive(Debug)]
struct Settings {
    listen: SocketAddr,
    database: String,
    shards: u32,
    max_body_bytes: usize,
    nats_url: Option<String>,
    key_cache: std::time::Duration,
    answer_memory: usize,
    http: campanile_server::http::HttpLimits,
    retention: Option<jiff::SignedDuration>,
    archive: Option<std::path::PathBuf>,
}

fn settings(args: ServeArgs) -> Result<Settings, CliError> {
    let file = match &args.config {
        None => FileConfig::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                CliError::usage(format!("cannot read config file {}: {e}", path.display()))
            })?;
            toml::from_str(&text).map_err(|e| {
                CliError::usage(format!("config file {}: {}", path.display(), e.message()))
            })?
        }
    };
    let http = http_limits(&args, &file)?;
    let answer_memory = match args.answer_memory_mib.or(file.answer_memory_mib) {
        None => 64 << 20,
        Some(mib) if !(16..=1 << 20).contains(&mib) => {
            return Err(CliError::usage(
                "--answer-memory-mib must be between 16 (one whole answer being built) and 1048576",
            ));
        }
        Some(mib) => mib << 20,
    };
    let retention = match args.retention_days.or(file.retention_days).unwrap_or(14) {
        0 => None,
        days if days > 36_500 => {
            return Err(CliError::usage(
                "--retention-days must be at most 36500 (100 years); 0 keeps history forever",
            ));
        }
        days => Some(jiff::SignedDuration::from_hours(i64::from(days) * 24)),
    };
    let database = args
        .database
        .clone()
        .or(file.database.clone())
        .unwrap_or_else(|| "./campanile.db".into());
    let archive = if args.no_archive || file.no_archive == Some(true) {
        None
    } else {
        Some(
            args.archive_dir
                .clone()
                .or(file.archive_dir.clone())
                .unwrap_or_else(|| default_archive_dir(&database)),
        )
    };
    let default_listen: SocketAddr = "127.0.0.1:7070"
        .parse()
        .map_err(|e| CliError::runtime(format!("{e}")))?;
    Ok(Settings {
        listen: args.listen.or(file.listen).unwrap_or(default_listen),
        database,
        shards: args.shards.or(file.shards).unwrap_or(16),
        max_body_bytes: args
            .max_body_bytes
            .or(file.max_body_bytes)
            .unwrap_or(256 * 1024),
        nats_url: args.nats_url.or(file.nats_url),
        key_cache: std::time::Duration::from_millis(
            args.key_cache_ms.or(file.key_cache_ms).unwrap_or(1000),
        ),
        answer_memory,
        http,
        retention,
        archive,
    })
}

/// `campanile-archive` beside the SQLite file, or in the working directory for PostgreSQL.
fn default_archive_dir(database: &str) -> std::path::PathBuf {
    let here = std::path::PathBuf::from("campanile-archive");
    if db::is_postgres(database) {
        return here;
    }
    match std::path::Path::new(database).parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join("campanile-archive"),
        _ => here,
    }
}

/// The HTTP limits from the flags, the config file and the defaults.
fn http_limits(
    args: &ServeArgs,
    file: &FileConfig,
) -> Result<campanile_server::http::HttpLimits, CliError> {
    let d = campanile_server::http::HttpLimits::default();
    let secs =
        |flag: Option<u64>, file: Option<u64>, name: &str, default: std::time::Duration| match flag
            .or(file)
        {
            None => Ok(default),
            Some(0) => Err(CliError::usage(format!(
                "--{name} must be at least 1 second"
            ))),
            Some(n) if n > 86_400 => Err(CliError::usage(format!(
                "--{name} must be at most 86400 seconds (a day)"
            ))),
            Some(n) => Ok(std::time::Duration::from_secs(n)),
        };
    let max_connections = match args.max_connections.or(file.max_connections) {
        None => d.max_connections,
        Some(0) => return Err(CliError::usage("--max-connections must be at least 1")),
        Some(n) => n,
    };
    Ok(campanile_server::http::HttpLimits {
        header_read_timeout: secs(
            args.header_read_timeout,
            file.header_read_timeout,
            "header-read-timeout",
            d.header_read_timeout,
        )?,
        body_read_timeout: secs(
            args.body_read_timeout,
            file.body_read_timeout,
            "body-read-timeout",
            d.body_read_timeout,
        )?,
        max_connections,
        shutdown_timeout: secs(
            args.shutdown_timeout,
            file.shutdown_timeout,
            "shutdown-timeout",
            d.shutdown_timeout,
        )?,
        send_timeout: secs(
            args.send_timeout,
            file.send_timeout,
            "send-timeout",
            d.send_timeout,
        )?,
    })
}

pub(crate) fn run(args: ServeArgs) -> Result<(), CliError> {
    let args = settings(args)?;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CAMPANILE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: a log file, a pipe or journald gets plain
        // text (field `key=value` pairs a log shipper can parse).
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if !(1..=4096).contains(&args.shards) {
        return Err(CliError::usage("--shards must be between 1 and 4096"));
    }
    crate::error::block_on(serve(args))
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
    // Written without `println!`: a closed stdout (`campanile serve | head`, a supervisor
    // that stopped reading) must not take the server down with a panic on EPIPE.
    use std::io::Write;
    let _ = write!(
        std::io::stdout().lock(),
        "First start: created tenant \"default\". Its API key, shown only this once:\n\n    \
         {key}\n\nUse it as: Authorization: Bearer <key>. More tenants: campanile tenant create \
         NAME --database {}\n",
        db::redact(database)
    );
    Ok(())
}

/// The first planning pass is retried after this, doubling up to [`FIRST_PASS_RETRY_MAX`]: a
/// database that is back is noticed within seconds, one that stays away is not hammered.
const FIRST_PASS_RETRY_MIN: std::time::Duration = std::time::Duration::from_millis(500);
const FIRST_PASS_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(15);

async fn serve(args: Settings) -> Result<(), CliError> {
    use std::io::Write;
    let store = db::open(&args.database, None).await?;
    let recorded = store
        .deployment_shards(DeploymentShards {
            shards: args.shards,
        })
        .await
        .map_err(|e| CliError::runtime(format!("cannot read the deployment settings: {e}")))?;
    if recorded != args.shards {
        return Err(CliError::usage(format!(
            "this database was set up with {recorded} planner shards, and every node must use \
             the same count: start with --shards {recorded} (this node was given {}). Changing \
             the shard count of an existing deployment is not supported yet.",
            args.shards
        )));
    }
    first_run(store.as_ref(), &args.database).await?;
    let node = format!("node-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    // One shutdown signal for the whole start-up and the serving that follows (a signal is
    // not lost between the two).
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    // What can refuse the start (NATS, the listening address) is settled before the node
    // marks itself alive and judges anything.
    let nats = match &args.nats_url {
        None => None,
        Some(url) => Some((
            url.clone(),
            campanile_relay::connect(url)
                .await
                .map_err(|e| CliError::nats(&e))?,
        )),
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::runtime(format!("cannot listen on {}: {e}", args.listen)))?;
    // Metrics from the first planning pass on are exported.
    campanile_server::install_metrics();
    // Served from now on: until the first pass is done (it is retried for as long as the
    // database is away) the starting router answers — `/healthz` 200, everything else a 503
    // with `Retry-After` — so a probe or a client gets an answer, not a timeout; then the full
    // router, through the same server and connections.
    let full = Arc::new(std::sync::OnceLock::new());
    let server = tokio::spawn(campanile_server::http::serve(
        listener,
        campanile_server::until_ready(Arc::clone(&full)),
        args.http,
        stopped(stop_rx.clone()),
    ));
    let mut planner = PlannerConfig::new(node.clone());
    planner.shards = args.shards;
    // Before anything is claimed or relayed: if the whole control plane was down, what it had
    // planned and could not hand out on time is judged by its misfire policy first. A failing
    // first pass (the database gone again) is retried, not a reason to exit.
    let first_pass = async {
        let mut delay = FIRST_PASS_RETRY_MIN;
        let mut attempt = 0u64;
        loop {
            attempt += 1;
            match Engine::start_after_first_pass(
                Arc::clone(&store),
                planner.clone(),
                SweepConfig::default(),
            )
            .await
            {
                Ok(engine) => return engine,
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        attempt,
                        retry_in_ms = delay.as_millis() as u64,
                        "first planning pass failed; this node serves nothing until one succeeds"
                    );
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(FIRST_PASS_RETRY_MAX);
                }
            }
        }
    };
    let engine = tokio::select! {
        engine = first_pass => engine,
        _ = stopped(stop_rx.clone()) => {
            // The server stops accepting on the same signal; what it is answering finishes
            // (within the shutdown deadline).
            let _ = server.await;
            // Stopped during the first pass: give up what it may have taken, as a graceful
            // stop does, so that another node need not wait out the lease.
            let release = store.shard_release(ShardRelease { node, now: None });
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), release).await;
            return Ok(());
        }
    };
    let relay = nats.map(|(url, client)| {
        let planner = engine.planner().clone();
        let relay = campanile_relay::Relay::new(
            Arc::clone(&store),
            client,
            campanile_relay::RelayConfig::new(node.clone()),
        )
        .with_classes(planner.classes())
        .with_liveness(campanile_relay::Liveness(Arc::new(move || {
            planner.is_live()
        })));
        tracing::info!(nats = %db::redact(&url), "relaying external targets to NATS JetStream");
        campanile_relay::spawn(relay)
    });
    let retention = {
        let mut cfg = campanile_retention::RetentionConfig::new(node.clone());
        cfg.default_retention = args.retention;
        cfg.archive = args.archive.clone().map(campanile_retention::Archive::new);
        tracing::info!(
            default_days = args.retention.map(|d| d.as_hours() / 24),
            archive = %args.archive.as_ref().map_or("none".into(), |a| a.display().to_string()),
            "retention"
        );
        campanile_retention::spawn(campanile_retention::Retention::new(Arc::clone(&store), cfg))
    };
    let cfg = ServerConfig {
        max_body_bytes: args.max_body_bytes,
        shards: args.shards,
        relay: relay.is_some(),
        key_cache: args.key_cache,
        answer_memory: args.answer_memory,
    };
    let app = router(
        AppState::new(Arc::clone(&store), &cfg, Some(engine.planner().clone())),
        &cfg,
    );
    tracing::info!(listen = %args.listen, database = %db::redact(&args.database), "campanile is serving");
    let _ = writeln!(
        std::io::stderr(),
        "campanile listening on http://{} (database {})",
        args.listen,
        db::redact(&args.database)
    );
    // From the next request on, every connection is answered by the full router.
    let _ = full.set(app);
    let served = match server.await {
        Ok(served) => served,
        Err(e) => Err(std::io::Error::other(format!(
            "the server task failed: {e}"
        ))),
    };
    // In-flight requests are done, or their connections closed at the shutdown deadline (or
    // the server failed); stop relaying, then planning and sweeping, and hand the shards over.
    if let Some((stop, task)) = relay {
        let _ = stop.send(true);
        let _ = task.await;
    }
    // A batch cut short stays open and is finished by the next pass, here or on another node.
    let _ = retention.0.send(true);
    let _ = retention.1.await;
    engine.shutdown().await;
    served.map_err(|e| CliError::runtime(format!("server failed: {e}")))?;
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
