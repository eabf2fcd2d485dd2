//! `campanile tenant …` and `campanile key …`: tenants and API keys.

use campanile_server::issue_key;
use campanile_store::{ApiKeyRevoke, QueueLimitSet, TenantByName, TenantCreate};
use clap::Subcommand;

use crate::db;
use crate::error::CliError;

/// `campanile tenant` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum TenantCommand {
    /// Create a tenant; prints its first API key alone on stdout.
    Create {
        /// Unique name.
        name: String,
        /// SQLite file path, or a postgres:// URL.
        #[arg(long, env = "CAMPANILE_DATABASE", default_value = "./campanile.db")]
        database: String,
    },
    /// Set a tenant's quotas: every limit at once, each omitted flag removing its limit
    /// (`--clear` alone removes them all).
    Quota {
        /// The tenant's name.
        name: String,
        /// Most ACTIVE schedules; creating more answers 429.
        #[arg(long)]
        max_active_schedules: Option<i64>,
        /// Most occurrences RUNNING at once across the tenant's queues.
        #[arg(long)]
        max_running: Option<i64>,
        /// Most fires per second summed over the tenant's active schedules.
        #[arg(long)]
        max_triggers_per_sec: Option<i64>,
        /// Most late (catch-up) runs made available per second across its schedules.
        #[arg(long)]
        max_catchup_per_sec: Option<i64>,
        /// Remove every limit (the only way to give no limit flag: without it, a bare `quota
        /// NAME` would remove them all by accident).
        #[arg(long)]
        clear: bool,
        /// SQLite file path, or a postgres:// URL.
        #[arg(long, env = "CAMPANILE_DATABASE", default_value = "./campanile.db")]
        database: String,
    },
    /// Limit how many occurrences of one of the tenant's queues run at once, across all
    /// workers and nodes (omit --max-running to remove the limit).
    QueueLimit {
        /// The tenant's name.
        name: String,
        /// The queue.
        queue: String,
        /// Most RUNNING at once.
        #[arg(long)]
        max_running: Option<i64>,
        /// SQLite file path, or a postgres:// URL.
        #[arg(long, env = "CAMPANILE_DATABASE", default_value = "./campanile.db")]
        database: String,
    },
    /// Put a tenant in a class: the `tenant_class` label of its lag metrics (at most 16
    /// distinct classes; `default` unless set). Running nodes pick it up within 30 s.
    Class {
        /// The tenant's name.
        name: String,
        /// The class: 1-32 lower-case letters, digits, '-' or '_'.
        class: String,
        /// SQLite file path, or a postgres:// URL.
        #[arg(long, env = "CAMPANILE_DATABASE", default_value = "./campanile.db")]
        database: String,
    },
    /// Set how long a tenant's finished occurrences stay in the database before retention
    /// archives and removes them: `--days N`, `--forever`, or `--default` (the serving
    /// node's `--retention-days`).
    Retention {
        /// The tenant's name.
        name: String,
        /// Keep finished occurrences this many days (1-36500).
        #[arg(long, conflicts_with_all = ["forever", "default"], required_unless_present_any = ["forever", "default"])]
        days: Option<u32>,
        /// Keep them forever.
        #[arg(long, conflicts_with = "default")]
        forever: bool,
        /// Follow the operator's default.
        #[arg(long)]
        default: bool,
        /// SQLite file path, or a postgres:// URL.
        #[arg(long, env = "CAMPANILE_DATABASE", default_value = "./campanile.db")]
        database: String,
    },
    /// Show one tenant: its class, retention, quotas and per-queue limits, one per line.
    Show {
        /// The tenant's name.
        name: String,
        /// SQLite file path, or a postgres:// URL.
        #[arg(long, env = "CAMPANILE_DATABASE", default_value = "./campanile.db")]
        database: String,
    },
    /// List tenants: name, creation time, class, retention (`default`, `forever`, or days as
    /// `14d`) and quotas (`-` for none; `tenant show` has the per-queue limits),
    /// tab-separated.
    List {
        /// SQLite file path, or a postgres:// URL.
        #[arg(long, env = "CAMPANILE_DATABASE", default_value = "./campanile.db")]
        database: String,
    },
}

/// `campanile key` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum KeyCommand {
    /// Create an API key for a tenant (or an admin key); prints it alone on stdout.
    Create {
        /// The tenant's name.
        #[arg(long, required_unless_present = "admin")]
        tenant: Option<String>,
        /// An admin key (tenant and key management), instead of a tenant key.
        #[arg(long, conflicts_with = "tenant")]
        admin: bool,
        /// SQLite file path, or a postgres:// URL.
        #[arg(long, env = "CAMPANILE_DATABASE", default_value = "./campanile.db")]
        database: String,
    },
    /// Revoke the key(s) starting with PREFIX (the first 12 characters are stored).
    Revoke {
        /// The key, or its first 12 characters.
        prefix: String,
        /// SQLite file path, or a postgres:// URL.
        #[arg(long, env = "CAMPANILE_DATABASE", default_value = "./campanile.db")]
        database: String,
    },
}

fn rt() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the runtime: {e}")))
}

fn store_err(e: campanile_store::StoreError) -> CliError {
    match e {
        campanile_store::StoreError::AlreadyExists(m) => {
            CliError::usage(format!("{m} already exists"))
        }
        campanile_store::StoreError::Invalid(m) => CliError::usage(m),
        other => CliError::runtime(other.to_string()),
    }
}

/// A retention as `tenant list` shows it: `default`, `forever`, `14d`, or seconds (`90s`)
/// when not whole days.
pub(crate) fn retention_text(r: campanile_store::Retention) -> String {
    match r {
        campanile_store::Retention::Default => "default".into(),
        campanile_store::Retention::Forever => "forever".into(),
        campanile_store::Retention::For(d) if d.as_secs() % 86_400 == 0 => {
            format!("{}d", d.as_secs() / 86_400)
        }
        campanile_store::Retention::For(d) => format!("{}s", d.as_secs()),
    }
}

/// A tenant's quotas as `tenant list` shows them: `name=value` for each one set,
/// comma-separated, or `-`.
fn quota_text(q: &campanile_store::TenantQuota) -> String {
    let set: Vec<String> = [
        ("max_active_schedules", q.max_active_schedules),
        ("max_running", q.max_running),
        ("max_triggers_per_sec", q.max_triggers_per_sec),
        ("max_catchup_per_sec", q.max_catchup_per_sec),
    ]
    .iter()
    .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
    .collect();
    if set.is_empty() {
        "-".into()
    } else {
        set.join(",")
    }
}

fn valid_name(name: &str) -> Result<(), CliError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(CliError::usage(format!(
            "tenant name '{name}': use 1-64 letters, digits, '-', '_' or '.'"
        )))
    }
}

/// The tenant called `name`; a usage error if there is none.
async fn tenant_named(
    store: &dyn campanile_store::Store,
    name: &str,
) -> Result<campanile_store::Tenant, CliError> {
    store
        .tenant_by_name(TenantByName {
            name: name.to_string(),
        })
        .await
        .map_err(store_err)?
        .ok_or_else(|| CliError::usage(format!("no tenant named '{name}'")))
}

pub(crate) fn tenant(cmd: TenantCommand) -> Result<(), CliError> {
    rt()?.block_on(async {
        match cmd {
            TenantCommand::Create { name, database } => {
                valid_name(&name)?;
                let store = db::open(&database, None).await?;
                let t = store
                    .tenant_create(TenantCreate { name, now: None })
                    .await
                    .map_err(store_err)?;
                let key = issue_key(store.as_ref(), Some(t.id), false)
                    .await
                    .map_err(store_err)?;
                println!("{key}");
            }
            TenantCommand::Quota {
                name,
                max_active_schedules,
                max_running,
                max_triggers_per_sec,
                max_catchup_per_sec,
                clear,
                database,
            } => {
                let quotas = [
                    max_active_schedules,
                    max_running,
                    max_triggers_per_sec,
                    max_catchup_per_sec,
                ];
                if quotas.iter().any(|q| q.is_some_and(|m| m < 0)) {
                    return Err(CliError::usage("quotas must not be negative"));
                }
                match (quotas.iter().any(Option::is_some), clear) {
                    (false, false) => {
                        return Err(CliError::usage(
                            "give the limits to keep (--max-active-schedules, --max-running, \
                             --max-triggers-per-sec, --max-catchup-per-sec: each one omitted is \
                             removed), or --clear to remove them all",
                        ));
                    }
                    (true, true) => {
                        return Err(CliError::usage("--clear takes no limit flag"));
                    }
                    _ => {}
                }
                let store = db::open(&database, None).await?;
                let tenant = tenant_named(store.as_ref(), &name).await?;
                store
                    .tenant_quota_set(campanile_store::TenantQuota {
                        tenant: tenant.id,
                        max_active_schedules,
                        max_running,
                        max_triggers_per_sec,
                        max_catchup_per_sec,
                    })
                    .await
                    .map_err(store_err)?;
            }
            TenantCommand::QueueLimit {
                name,
                queue,
                max_running,
                database,
            } => {
                if max_running.is_some_and(|m| m < 0) {
                    return Err(CliError::usage("--max-running must not be negative"));
                }
                let store = db::open(&database, None).await?;
                let tenant = tenant_named(store.as_ref(), &name).await?;
                store
                    .queue_limit_set(QueueLimitSet {
                        tenant: tenant.id,
                        queue: queue.clone(),
                        max_running,
                    })
                    .await
                    .map_err(store_err)?;
            }
            TenantCommand::Class {
                name,
                class,
                database,
            } => {
                campanile_store::classes::validate(&class).map_err(store_err)?;
                let store = db::open(&database, None).await?;
                let tenant = tenant_named(store.as_ref(), &name).await?;
                store
                    .tenant_class_set(campanile_store::TenantClassSet {
                        tenant: tenant.id,
                        class,
                    })
                    .await
                    .map_err(store_err)?;
            }
            TenantCommand::List { database } => {
                let store = db::open(&database, None).await?;
                for t in store.tenant_list().await.map_err(store_err)? {
                    let q = store
                        .tenant_quota_get(campanile_store::TenantQuotaGet { tenant: t.id })
                        .await
                        .map_err(store_err)?;
                    println!(
                        "{}\t{}\t{}\t{}\t{}",
                        t.name,
                        t.created_at,
                        t.class,
                        retention_text(t.retention),
                        quota_text(&q)
                    );
                }
            }
            TenantCommand::Show { name, database } => {
                let store = db::open(&database, None).await?;
                let t = tenant_named(store.as_ref(), &name).await?;
                let q = store
                    .tenant_quota_get(campanile_store::TenantQuotaGet { tenant: t.id })
                    .await
                    .map_err(store_err)?;
                let limits = store
                    .queue_limit_list(campanile_store::QueueLimitList { tenant: t.id })
                    .await
                    .map_err(store_err)?;
                let or_none = |v: Option<i64>| v.map_or("none".to_string(), |v| v.to_string());
                println!("name                  {}", t.name);
                println!("created_at            {}", t.created_at);
                println!("class                 {}", t.class);
                println!("retention             {}", retention_text(t.retention));
                println!("max_active_schedules  {}", or_none(q.max_active_schedules));
                println!("max_running           {}", or_none(q.max_running));
                println!("max_triggers_per_sec  {}", or_none(q.max_triggers_per_sec));
                println!("max_catchup_per_sec   {}", or_none(q.max_catchup_per_sec));
                if limits.is_empty() {
                    println!("queue limits          none");
                }
                for l in limits {
                    println!("queue limit           {}\tmax_running {}", l.queue, l.max_running);
                }
            }
            TenantCommand::Retention {
                name,
                days,
                forever,
                default: _,
                database,
            } => {
                let retention = match (days, forever) {
                    (Some(d), _) if !(1..=36_500).contains(&d) => {
                        return Err(CliError::usage(
                            "--days must be between 1 and 36500 (use --forever to keep history forever)",
                        ));
                    }
                    (Some(d), _) => campanile_store::Retention::For(
                        jiff::SignedDuration::from_hours(i64::from(d) * 24),
                    ),
                    (None, true) => campanile_store::Retention::Forever,
                    (None, false) => campanile_store::Retention::Default,
                };
                let store = db::open(&database, None).await?;
                let tenant = tenant_named(store.as_ref(), &name).await?;
                store
                    .tenant_retention_set(campanile_store::TenantRetentionSet {
                        tenant: tenant.id,
                        retention,
                    })
                    .await
                    .map_err(store_err)?;
            }
        }
        Ok(())
    })
}

pub(crate) fn key(cmd: KeyCommand) -> Result<(), CliError> {
    rt()?.block_on(async {
        match cmd {
            KeyCommand::Create {
                tenant,
                admin,
                database,
            } => {
                let store = db::open(&database, None).await?;
                let tenant_id = match tenant {
                    Some(name) => Some(tenant_named(store.as_ref(), &name).await?.id),
                    None => None,
                };
                println!(
                    "{}",
                    issue_key(store.as_ref(), tenant_id, admin)
                        .await
                        .map_err(store_err)?
                );
            }
            KeyCommand::Revoke { prefix, database } => {
                let prefix = campanile_server::key_prefix(&prefix);
                if prefix.len() < 12 {
                    return Err(CliError::usage(
                        "give at least the first 12 characters of the key",
                    ));
                }
                let store = db::open(&database, None).await?;
                let n = store
                    .api_key_revoke(ApiKeyRevoke {
                        prefix: prefix.clone(),
                        now: None,
                    })
                    .await
                    .map_err(store_err)?;
                if n == 0 {
                    return Err(CliError::usage(format!(
                        "no active key starts with '{prefix}'"
                    )));
                }
                eprintln!("revoked {n} key(s)");
            }
        }
        Ok(())
    })
}
