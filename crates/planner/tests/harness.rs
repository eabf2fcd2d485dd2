//! Stores to run against, and helpers.

use std::collections::BTreeSet;
use std::sync::Arc;

use campanile_calendar::DstPolicy;
use campanile_core::{Misfire, Overlap};
use campanile_planner::schedules::Schedules;
use campanile_planner::{Planner, PlannerConfig};
use campanile_store::*;
use campanile_store_sqlite::SqliteStore;
use jiff::{SignedDuration, Timestamp};

pub(crate) struct Env {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) tenant: TenantId,
    _guard: Box<dyn std::any::Any + Send + Sync>,
}

pub(crate) async fn sqlite() -> Option<Env> {
    let (store, dir) = campanile_testkit::sqlite_store();
    let store: Arc<dyn Store> = Arc::new(store);
    let tenant = store
        .tenant_create(TenantCreate {
            name: "acme".into(),
            now: None,
        })
        .await
        .unwrap()
        .id;
    Some(Env {
        store,
        tenant,
        _guard: Box::new(dir),
    })
}

/// A SQLite store at a given path (for tests that share it with child processes).
pub(crate) async fn sqlite_at(path: &std::path::Path) -> Env {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(path).unwrap());
    let tenant = store
        .tenant_create(TenantCreate {
            name: "acme".into(),
            now: None,
        })
        .await
        .unwrap()
        .id;
    Env {
        store,
        tenant,
        _guard: Box::new(()),
    }
}

/// A PostgreSQL store in a fresh schema, with the schema's name for child processes.
pub(crate) async fn postgres_named() -> Option<(Env, String)> {
    let url = campanile_testkit::pg_url("PostgreSQL planner test")?;
    let (pg, schema) = campanile_testkit::pg_store(&url, 10).await;
    let store: Arc<dyn Store> = Arc::new(pg.clone());
    let tenant = store
        .tenant_create(TenantCreate {
            name: "acme".into(),
            now: None,
        })
        .await
        .unwrap()
        .id;
    Some((
        Env {
            store,
            tenant,
            _guard: Box::new(pg.drop_schema_on_drop()),
        },
        schema,
    ))
}

pub(crate) async fn postgres() -> Option<Env> {
    postgres_named().await.map(|(env, _)| env)
}

/// Runs an `async fn(Env)` test body on SQLite and on PostgreSQL.
#[macro_export]
macro_rules! both {
    ($body:ident) => {
        mod $body {
            #[test]
            fn sqlite() {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(4)
                    .enable_all()
                    .build()
                    .unwrap();
                let env = rt.block_on($crate::harness::sqlite()).unwrap();
                rt.block_on(super::$body(env));
            }
            #[test]
            fn postgres() {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(4)
                    .enable_all()
                    .build()
                    .unwrap();
                let Some(env) = rt.block_on($crate::harness::postgres()) else {
                    return;
                };
                rt.block_on(super::$body(env));
            }
        }
    };
}

pub(crate) fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

pub(crate) fn plus(t: Timestamp, secs: i64) -> Timestamp {
    t.checked_add(SignedDuration::from_secs(secs)).unwrap()
}

pub(crate) fn cron(expr: &str, zone: &str, dst: DstPolicy) -> ScheduleSpec {
    spec(Timing::Cron {
        expr: expr.into(),
        timezone: zone.into(),
        dst_gap: dst.gap,
        dst_fold: dst.fold,
    })
}

pub(crate) fn spec(timing: Timing) -> ScheduleSpec {
    ScheduleSpec {
        timing,
        queue: "jobs".into(),
        payload: Some("{\"k\":1}".into()),
        priority: 0,
        lease: SignedDuration::from_secs(30),
        max_attempts: 3,
        backoff_initial: SignedDuration::from_secs(1),
        backoff_max: SignedDuration::from_secs(30),
        misfire: Misfire::Skip {
            max_lateness: SignedDuration::from_secs(600),
        },
        overlap: Overlap::Allow,
        flex_window: SignedDuration::ZERO,
    }
}

/// A planner whose shard leases (and liveness mark) last a day, so that the time jumps of a
/// test are not taken for outages of the whole control plane; see [`planner_leased`].
pub(crate) fn planner(env: &Env, node: &str) -> Planner {
    planner_leased(env, node, SignedDuration::from_hours(24))
}

/// A planner with leases of `lease`: for the tests about a lease running out (a failover, an
/// outage).
pub(crate) fn planner_leased(env: &Env, node: &str, lease: SignedDuration) -> Planner {
    let mut cfg = PlannerConfig::new(node);
    cfg.shards = 4;
    cfg.horizon = SignedDuration::from_mins(15);
    cfg.batch = 100;
    cfg.shard_lease = lease;
    Planner::new(env.store.clone(), cfg)
}

pub(crate) fn schedules(env: &Env) -> Schedules {
    Schedules::new(env.store.clone(), 4)
}

/// The instants of schedule `id`'s stored calendar in `[from, until]`.
pub(crate) async fn calendar_instants(
    env: &Env,
    id: campanile_core::ScheduleId,
    from: Timestamp,
    until: Timestamp,
) -> BTreeSet<Timestamp> {
    let rec = record(env, id).await;
    campanile_planner::calendar_of(&rec.spec)
        .unwrap()
        .iter_after(from.checked_sub(SignedDuration::from_nanos(1)).unwrap())
        .take_while(|t| *t <= until)
        .collect()
}

/// Every occurrence of a schedule, all states, in order.
pub(crate) async fn occurrences(env: &Env, id: campanile_core::ScheduleId) -> Vec<Occurrence> {
    occurrences_of(env, Some(id)).await
}

/// Every occurrence of the tenant (of one schedule, or of all), all states, in order.
pub(crate) async fn occurrences_of(
    env: &Env,
    schedule: Option<campanile_core::ScheduleId>,
) -> Vec<Occurrence> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = env
            .store
            .occurrence_list(OccurrenceList {
                tenant: env.tenant,
                schedule_id: schedule,
                after,
                limit: 1000,
                now: None,
                ..Default::default()
            })
            .await
            .unwrap();
        if page.is_empty() {
            return out;
        }
        after = page.last().map(|o| (o.scheduled_for, o.id));
        out.extend(page);
    }
}

pub(crate) async fn instants(env: &Env, id: campanile_core::ScheduleId) -> BTreeSet<Timestamp> {
    let occ = occurrences(env, id).await;
    let set: BTreeSet<Timestamp> = occ.iter().map(|o| o.scheduled_for).collect();
    assert_eq!(set.len(), occ.len(), "one occurrence per instant");
    set
}

/// Schedule `id` as stored now (it must exist).
pub(crate) async fn record(env: &Env, id: campanile_core::ScheduleId) -> ScheduleRecord {
    env.store
        .schedule_get(ScheduleGet {
            tenant: env.tenant,
            id,
        })
        .await
        .unwrap()
        .unwrap()
}

/// Sets the tenant's active-schedules quota.
pub(crate) async fn limit_active_schedules(env: &Env, limit: i64) {
    env.store
        .tenant_quota_set(TenantQuota {
            tenant: env.tenant,
            max_active_schedules: Some(limit),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// Claims up to 10 of the tenant's `jobs` queue as `worker`, with leases of `lease_secs`.
pub(crate) async fn claim_jobs(
    env: &Env,
    worker: &str,
    lease_secs: i64,
    now: Timestamp,
) -> Vec<Claimed> {
    env.store
        .occurrence_claim(OccurrenceClaim {
            max_bytes: None,
            tenant: env.tenant,
            queue: "jobs".into(),
            worker_id: worker.into(),
            max: 10,
            lease: Some(SignedDuration::from_secs(lease_secs)),
            key: None,
            now: Some(now),
        })
        .await
        .unwrap()
}
