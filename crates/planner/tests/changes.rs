//! A schedule change (pause, update, cancel) racing a planning commit: once the change has
//! answered, nothing more of the superseded version is planned, no queue entry of it is left,
//! and a schedule never has two queue entries.
//!
//! On PostgreSQL each order is held open at its critical point by a trigger that waits on an
//! advisory lock the test holds: a planning commit after it moved the queue entry and before
//! it inserted its occurrences; a change after it retired the old version's occurrences and
//! before it took the queue entry out. Then many schedules race many changes while planners
//! run, on both backends.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use campanile_calendar::DstPolicy;
use campanile_core::{OccurrenceState, ScheduleId};
use campanile_planner::reconcile::{Range, reconcile};
use campanile_store::*;
use jiff::{SignedDuration, Timestamp};

use crate::both;
use crate::harness::*;

/// Checks schedule `id`: every occurrence of a version superseded before its instant is
/// `CANCELED`, and reconcile finds nothing unexpected up to `until`.
async fn superseded_runs_nothing(env: &Env, id: ScheduleId, until: Timestamp) {
    let versions = env
        .store
        .schedule_versions(ScheduleGet {
            tenant: env.tenant,
            id,
        })
        .await
        .unwrap();
    let superseded_at: BTreeMap<u32, Timestamp> = versions
        .windows(2)
        .map(|w| (w[0].version, w[1].created_at))
        .collect();
    let leftovers: Vec<_> = occurrences(env, id)
        .await
        .into_iter()
        .filter(|o| {
            superseded_at
                .get(&o.version)
                .is_some_and(|s| *s < o.scheduled_for)
                && o.state != OccurrenceState::Canceled
        })
        .map(|o| (o.version, o.scheduled_for, o.state))
        .collect();
    assert!(
        leftovers.is_empty(),
        "schedule {id}: occurrences of a version superseded before their instant: {leftovers:?}"
    );
    let first = versions.first().unwrap().created_at;
    let r = reconcile(
        env.store.as_ref(),
        env.tenant,
        id,
        &Range {
            from: first,
            to: until,
            now: until,
            max_instants: 1_000_000,
            stall_after: SignedDuration::from_hours(24 * 365),
        },
    )
    .await
    .unwrap();
    assert!(
        r.unexpected.is_empty(),
        "schedule {id}: reconcile found {:?}",
        r.unexpected
    );
}

/// Many schedules, changed (paused, resumed, updated) from three tasks while two planners
/// plan them in small batches; then planning goes on undisturbed. Every schedule's
/// occurrences belong to its version of the time, and planning never fails.
async fn changes_racing_planners_leave_nothing_of_superseded_versions(env: Env) {
    let t0 = ts("2026-09-01T00:00:00Z");
    let s = Arc::new(schedules(&env));
    let mut ids = Vec::new();
    for _ in 0..40 {
        ids.push(minutely(&env, t0).await);
    }
    let ids = Arc::new(ids);
    // The time every party uses: the planners step it, the changers read it.
    let clock = Arc::new(AtomicI64::new(t0.as_millisecond()));
    // Changers still at work: the planners tick until every changer is done.
    let changing = Arc::new(AtomicUsize::new(3));
    let now =
        |clock: &AtomicI64| Timestamp::from_millisecond(clock.load(Ordering::SeqCst)).unwrap();
    let planners: Vec<Arc<campanile_planner::Planner>> = (0..2)
        .map(|i| {
            let mut cfg = planner(&env, &format!("racing-{i}")).config().clone();
            cfg.batch = 4;
            Arc::new(campanile_planner::Planner::new(env.store.clone(), cfg))
        })
        .collect();
    let mut changers = Vec::new();
    for c in 0..3u64 {
        let (s, ids, clock, changing, tenant) = (
            s.clone(),
            ids.clone(),
            clock.clone(),
            changing.clone(),
            env.tenant,
        );
        changers.push(tokio::spawn(async move {
            let mut changes = 0u64;
            let mut k = c;
            // Each changer makes 20 changes (tries that lost to another changer do not count).
            while changes < 20 {
                k = k
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let id = ids[(k >> 33) as usize % ids.len()];
                let at = Some(now(&clock));
                let rec = s
                    .get(tenant, id, at)
                    .await
                    .unwrap()
                    .expect("the schedule exists")
                    .record;
                let done = match (rec.state, (k >> 20) % 3) {
                    (ScheduleState::Active, 0) => s
                        .transition(tenant, id, ScheduleState::Paused, at)
                        .await
                        .map(|_| ()),
                    (ScheduleState::Paused, _) => s
                        .transition(tenant, id, ScheduleState::Active, at)
                        .await
                        .map(|_| ()),
                    (ScheduleState::Active, _) => {
                        let mut spec = rec.spec.clone();
                        spec.payload = Some(format!("{{\"change\":{k}}}"));
                        s.update(tenant, id, rec.version, spec, at)
                            .await
                            .map(|_| ())
                    }
                    _ => Ok(()),
                };
                match done {
                    Ok(()) => changes += 1,
                    // Another changer got there first.
                    Err(campanile_planner::PlannerError::Store(
                        StoreError::VersionConflict { .. } | StoreError::WrongState(_),
                    )) => {}
                    Err(e) => panic!("change failed: {e}"),
                }
            }
            changing.fetch_sub(1, Ordering::SeqCst);
            changes
        }));
    }
    let mut ticks = Vec::new();
    for p in &planners {
        let (p, clock, changing) = (p.clone(), clock.clone(), changing.clone());
        ticks.push(tokio::spawn(async move {
            let mut isolated = 0;
            // At least 40 passes, and on until the changers are done.
            let mut passes = 0;
            while passes < 40 || changing.load(Ordering::SeqCst) > 0 {
                passes += 1;
                assert!(passes < 100_000, "the changers never finished");
                let at =
                    Timestamp::from_millisecond(clock.fetch_add(7_000, Ordering::SeqCst) + 7_000)
                        .unwrap();
                isolated += p.tick(Some(at)).await.unwrap().isolated;
            }
            isolated
        }));
    }
    let mut isolated = 0;
    for t in ticks {
        isolated += t.await.unwrap();
    }
    let mut changes = 0;
    for c in changers {
        changes += c.await.unwrap();
    }
    assert_eq!(changes, 60);
    assert_eq!(isolated, 0, "no planning commit failed");
    // Planning goes on: every active schedule is planned under its current version, and no
    // pass fails on a second queue entry.
    let later = plus(now(&clock), 60);
    for step in 0..3 {
        for p in &planners {
            let r = p.tick(Some(plus(later, step * 300))).await.unwrap();
            assert_eq!(r.isolated, 0);
        }
    }
    let until = plus(later, 2 * 300 + 15 * 60);
    for id in ids.iter() {
        superseded_runs_nothing(&env, *id, until).await;
        let rec = record(&env, *id).await;
        if rec.state == ScheduleState::Active {
            let position = env
                .store
                .schedule_position(SchedulePosition {
                    tenant: env.tenant,
                    id: *id,
                })
                .await
                .unwrap();
            assert!(
                position.is_some_and(|p| p > plus(later, 2 * 300)),
                "schedule {id} is planned on: {position:?}"
            );
        }
    }
}
both!(changes_racing_planners_leave_nothing_of_superseded_versions);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

/// A new schedule firing every minute, created at `t0`.
async fn minutely(env: &Env, t0: Timestamp) -> ScheduleId {
    schedules(env)
        .create(
            env.tenant,
            cron("* * * * *", "UTC", DstPolicy::default()),
            Some(t0),
        )
        .await
        .unwrap()
        .record
        .id
}

/// A connection of the test's own to the schema of a PostgreSQL store, and the advisory lock
/// key the schema's hold triggers wait on.
struct Holder {
    client: tokio_postgres::Client,
    key: i64,
    schema: String,
}

impl Holder {
    async fn connect(schema: &str) -> Holder {
        let url = std::env::var("CAMPANILE_TEST_PG_URL").unwrap();
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let key = i64::from(rand_key());
        client
            .batch_execute(&format!(
                "CREATE FUNCTION {schema}.hold() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN PERFORM pg_advisory_xact_lock_shared({key}); RETURN NEW; END $$"
            ))
            .await
            .unwrap();
        Holder {
            client,
            key,
            schema: schema.to_string(),
        }
    }

    /// Makes `event ON table WHEN (condition)` wait while the test holds the lock.
    async fn trigger(&self, name: &str, event: &str, table: &str, condition: &str) {
        self.client
            .batch_execute(&format!(
                "CREATE TRIGGER {name} BEFORE {event} ON {schema}.{table} FOR EACH ROW
                 WHEN ({condition}) EXECUTE FUNCTION {schema}.hold()",
                schema = self.schema
            ))
            .await
            .unwrap();
    }

    async fn hold(&self) {
        self.client
            .execute("SELECT pg_advisory_lock($1)", &[&self.key])
            .await
            .unwrap();
    }

    async fn release(&self) {
        self.client
            .execute("SELECT pg_advisory_unlock($1)", &[&self.key])
            .await
            .unwrap();
    }

    /// Waits until a backend waits on the test's lock.
    async fn until_held_up(&self) {
        for _ in 0..500 {
            let waiting: i64 = self
                .client
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                       AND objid = ($1::int8 & 4294967295)::oid AND classid = ($1::int8 >> 32)::oid",
                    &[&self.key],
                )
                .await
                .unwrap()
                .get(0);
            if waiting > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("nothing came to wait on the held trigger");
    }

    /// Waits until `task` finished or a backend of this database waits on a lock while
    /// running a statement that contains `statement` (it queued behind the held
    /// transaction); at most 5 s, after which the test goes on either way.
    async fn until_done_or_waiting<T>(&self, task: &tokio::task::JoinHandle<T>, statement: &str) {
        for _ in 0..250 {
            if task.is_finished() {
                return;
            }
            let waiting: i64 = self
                .client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                      WHERE datname = current_database() AND wait_event_type = 'Lock'
                        AND strpos(query, $1) > 0",
                    &[&statement],
                )
                .await
                .unwrap()
                .get(0);
            if waiting > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The planning-queue entries of `id`: `(version, next_run_at)`.
    async fn queue(&self, id: ScheduleId) -> Vec<(i32, i64)> {
        self.client
            .query(
                &format!(
                    "SELECT version, next_run_at FROM {}.schedule_queue WHERE schedule_id = $1 ORDER BY next_run_at",
                    self.schema
                ),
                &[&id.0],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }
}

fn rand_key() -> i32 {
    (uuid::Uuid::new_v4().as_u128() & 0x3fff_ffff) as i32 + 1
}

/// The change sent while a planning commit is held open.
#[derive(Clone, Copy)]
enum Change {
    Pause,
    Update,
}

/// A planning commit held between moving the schedule's queue entry and inserting its
/// occurrences while a change of the same schedule is sent: the change waits for the commit
/// and then retires what it wrote (before, it answered at once, and the commit's
/// occurrences and queue entry of the old version outlived it).
async fn planning_commit_held_open_while_a_schedule_changes(change: Change) {
    let Some((env, schema)) = postgres_named().await else {
        return;
    };
    let t0 = ts("2026-09-01T00:00:00Z");
    let id = minutely(&env, t0).await;
    let holder = Holder::connect(&schema).await;
    holder
        .trigger(
            "hold_planned",
            "INSERT",
            "occurrences",
            "NEW.state = 'READY'",
        )
        .await;
    holder.hold().await;
    let p = Arc::new(planner(&env, "held"));
    let planning = {
        let p = p.clone();
        tokio::spawn(async move { p.tick(Some(plus(t0, 1))).await })
    };
    holder.until_held_up().await;
    let changed_at = plus(t0, 2);
    let changing = {
        let (s, tenant) = (schedules(&env), env.tenant);
        tokio::spawn(async move {
            match change {
                Change::Pause => s
                    .transition(tenant, id, ScheduleState::Paused, Some(changed_at))
                    .await
                    .map(|(v, _)| v.record.version),
                Change::Update => {
                    let mut spec = cron("* * * * *", "UTC", DstPolicy::default());
                    spec.payload = Some("{\"k\":2}".into());
                    s.update(tenant, id, 1, spec, Some(changed_at))
                        .await
                        .map(|(v, _)| v.record.version)
                }
            }
        })
    };
    holder
        .until_done_or_waiting(&changing, "campanile/planning/")
        .await;
    holder.release().await;
    let planned = planning.await.unwrap().unwrap();
    assert!(planned.planned <= 1);
    assert_eq!(changing.await.unwrap().unwrap(), 2);
    superseded_runs_nothing(&env, id, plus(t0, 3600)).await;
    let queue = holder.queue(id).await;
    match change {
        Change::Pause => assert!(queue.is_empty(), "a paused schedule left {queue:?}"),
        Change::Update => assert!(
            queue.len() == 1 && queue[0].0 == 2,
            "an updated schedule has one queue entry, of version 2: {queue:?}"
        ),
    }
    // Planning goes on, under the current version only, and no pass fails.
    let later = p.tick(Some(plus(t0, 600))).await.unwrap();
    assert_eq!(later.isolated, 0);
    superseded_runs_nothing(&env, id, plus(t0, 3600)).await;
    let after = occurrences(&env, id).await;
    match change {
        Change::Pause => assert!(
            after.iter().all(|o| o.state == OccurrenceState::Canceled),
            "nothing of a paused schedule is pending: {after:?}"
        ),
        Change::Update => assert!(
            after
                .iter()
                .any(|o| o.version == 2 && o.state == OccurrenceState::Ready),
            "the update is planned"
        ),
    }
}

#[test]
fn pause_sent_while_a_planning_commit_is_held_open_postgres() {
    let rt = runtime();
    rt.block_on(planning_commit_held_open_while_a_schedule_changes(
        Change::Pause,
    ));
}

#[test]
fn update_sent_while_a_planning_commit_is_held_open_postgres() {
    let rt = runtime();
    rt.block_on(planning_commit_held_open_while_a_schedule_changes(
        Change::Update,
    ));
}

/// The reverse order: a pause held after it retired the old version's occurrences and before
/// it took the queue entry out, while a planning pass commits the schedule: the commit waits
/// for the pause and then plans nothing of the paused version (before, it committed at once
/// and its occurrences were never retired).
#[test]
fn planning_commit_sent_while_a_pause_is_held_open_postgres() {
    let rt = runtime();
    rt.block_on(async {
        let Some((env, schema)) = postgres_named().await else {
            return;
        };
        let t0 = ts("2026-09-01T00:00:00Z");
        let id = minutely(&env, t0).await;
        let holder = Holder::connect(&schema).await;
        holder
            .trigger(
                "hold_change",
                "UPDATE",
                "schedules",
                "OLD.version <> NEW.version",
            )
            .await;
        holder.hold().await;
        let pausing = {
            let (s, tenant) = (schedules(&env), env.tenant);
            tokio::spawn(async move {
                s.transition(tenant, id, ScheduleState::Paused, Some(plus(t0, 1)))
                    .await
                    .map(|(v, _)| v.record.version)
            })
        };
        holder.until_held_up().await;
        let p = Arc::new(planner(&env, "second"));
        let planning = {
            let p = p.clone();
            tokio::spawn(async move { p.tick(Some(plus(t0, 2))).await })
        };
        holder
            .until_done_or_waiting(&planning, "campanile/planning/")
            .await;
        holder.release().await;
        assert_eq!(pausing.await.unwrap().unwrap(), 2);
        planning.await.unwrap().unwrap();
        superseded_runs_nothing(&env, id, plus(t0, 3600)).await;
        assert!(holder.queue(id).await.is_empty());
        p.tick(Some(plus(t0, 600))).await.unwrap();
        let after = occurrences(&env, id).await;
        assert!(
            after.iter().all(|o| o.state == OccurrenceState::Canceled),
            "nothing of a paused schedule is pending: {after:?}"
        );
    });
}

/// Reconcile flags an occurrence of a version superseded before its instant that is not
/// `CANCELED` (what the race left) as unexpected; the canceled ones a pause retired are not.
async fn reconcile_flags_a_superseded_version_planned_after_the_change(env: Env) {
    let t0 = ts("2026-09-01T00:00:00Z");
    let s = schedules(&env);
    let id = minutely(&env, t0).await;
    planner(&env, "n").tick(Some(t0)).await.unwrap();
    s.transition(env.tenant, id, ScheduleState::Paused, Some(plus(t0, 90)))
        .await
        .unwrap();
    superseded_runs_nothing(&env, id, plus(t0, 3600)).await;
    // Version 1 planned on after the pause, as the race did.
    let rec = record(&env, id).await;
    let o = |at: Timestamp| NewOccurrence {
        schedule_id: id,
        version: 1,
        scheduled_for: at,
        available_at: at,
        queue: rec.spec.queue.clone(),
        priority: 0,
        max_attempts: 3,
        backoff_initial: SignedDuration::from_secs(1),
        backoff_max: SignedDuration::from_secs(30),
        state: OccurrenceState::Ready,
        overlap: rec.spec.overlap,
        lease: SignedDuration::from_secs(30),
    };
    env.store
        .occurrence_insert_many(OccurrenceInsertMany {
            tenant: env.tenant,
            items: vec![o(plus(t0, 20 * 60)), o(plus(t0, 21 * 60))],
            now: Some(plus(t0, 100)),
        })
        .await
        .unwrap();
    let r = reconcile(
        env.store.as_ref(),
        env.tenant,
        id,
        &Range {
            from: t0,
            to: plus(t0, 3600),
            now: plus(t0, 3600),
            max_instants: 10_000,
            stall_after: SignedDuration::from_hours(1),
        },
    )
    .await
    .unwrap();
    let flagged: Vec<(u32, Timestamp)> = r
        .unexpected
        .iter()
        .map(|f| (f.version, f.scheduled_for))
        .collect();
    assert_eq!(
        flagged,
        [(1, plus(t0, 20 * 60)), (1, plus(t0, 21 * 60))],
        "{r:?}"
    );
    assert!(r.has_problems());
}
both!(reconcile_flags_a_superseded_version_planned_after_the_change);

/// Makes every insert of an occurrence of schedule `id` fail, until [`unbreak`].
async fn break_schedule(db: &Db, id: ScheduleId) {
    match db {
        Db::Sqlite(path) => {
            rusqlite::Connection::open(path)
                .unwrap()
                .execute_batch(&format!(
                    "CREATE TRIGGER broken BEFORE INSERT ON occurrences
                      WHEN NEW.schedule_id = X'{}'
                     BEGIN SELECT RAISE(ABORT, 'this row cannot be written'); END",
                    id.0.simple()
                ))
                .unwrap();
        }
        Db::Postgres(c, schema) => {
            c.batch_execute(&format!(
                "CREATE FUNCTION {schema}.broken() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN RAISE EXCEPTION 'this row cannot be written'; END $$;
                 CREATE TRIGGER broken BEFORE INSERT ON {schema}.occurrences FOR EACH ROW
                  WHEN (NEW.schedule_id = '{id}') EXECUTE FUNCTION {schema}.broken()",
                id = id.0
            ))
            .await
            .unwrap();
        }
    }
}

async fn unbreak(db: &Db) {
    match db {
        Db::Sqlite(path) => rusqlite::Connection::open(path)
            .unwrap()
            .execute_batch("DROP TRIGGER broken")
            .unwrap(),
        Db::Postgres(c, schema) => c
            .batch_execute(&format!("DROP TRIGGER broken ON {schema}.occurrences"))
            .await
            .unwrap(),
    }
}

/// Raw access to a store's database, for a test to break it.
enum Db {
    Sqlite(std::path::PathBuf),
    Postgres(tokio_postgres::Client, String),
}

/// One schedule whose planning commit fails (a trigger refuses its rows) is left out of the
/// pass, counted and retried; the rest of its batch and every other shard are planned, and
/// the shard's run of failed passes is counted until the schedule commits again.
async fn a_schedule_that_cannot_be_committed_is_isolated(env: Env, db: Db) {
    let t0 = ts("2026-09-01T00:00:00Z");
    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(minutely(&env, t0).await);
    }
    let bad = ids[5];
    let shard = record(&env, bad).await.shard;
    break_schedule(&db, bad).await;
    let p = planner(&env, "isolating");
    for pass in 1..=2u64 {
        let r = p.tick(Some(plus(t0, 60 * pass as i64))).await.unwrap();
        assert_eq!(r.isolated, 1, "pass {pass}: {r:?}");
        assert!(occurrences(&env, bad).await.is_empty());
        for id in ids.iter().filter(|id| **id != bad) {
            assert!(
                !occurrences(&env, *id).await.is_empty(),
                "pass {pass}: schedule {id} is planned"
            );
        }
        let failing = p.failing_passes();
        assert_eq!(failing.get(&shard), Some(&pass), "{failing:?}");
        assert!(
            failing.iter().all(|(s, n)| *s == shard || *n == 0),
            "{failing:?}"
        );
    }
    unbreak(&db).await;
    let r = p.tick(Some(plus(t0, 180))).await.unwrap();
    assert_eq!(r.isolated, 0);
    assert!(!occurrences(&env, bad).await.is_empty());
    assert!(p.failing_passes().values().all(|n| *n == 0));
}

#[test]
fn a_schedule_that_cannot_be_committed_is_isolated_sqlite() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("isolated.db");
    rt.block_on(async {
        let env = sqlite_at(&path).await;
        a_schedule_that_cannot_be_committed_is_isolated(env, Db::Sqlite(path.clone())).await;
    });
}

#[test]
fn a_schedule_that_cannot_be_committed_is_isolated_postgres() {
    let rt = runtime();
    rt.block_on(async {
        let Some((env, schema)) = postgres_named().await else {
            return;
        };
        let url = std::env::var("CAMPANILE_TEST_PG_URL").unwrap();
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        a_schedule_that_cannot_be_committed_is_isolated(env, Db::Postgres(client, schema)).await;
    });
}
