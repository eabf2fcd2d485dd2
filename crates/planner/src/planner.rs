//! The planning loop: shard leases, batches, fenced commits, waking for the next due instant.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use campanile_calendar::Calendar;
use campanile_core::ScheduleId;

use campanile_store::*;
use jiff::{SignedDuration, Timestamp};
use tokio::sync::{Notify, watch};

use crate::materialize::{Input, plan};
use crate::{PlannerError, calendar_of};

/// Planner settings.
#[derive(Debug, Clone)]
pub struct PlannerConfig {
    /// This node's name (unique among live nodes).
    pub node: String,
    /// Number of logical shards in the deployment (all nodes must agree).
    pub shards: u32,
    /// How far ahead occurrences are materialized.
    pub horizon: SignedDuration,
    /// Shard lease length; a node that stops renewing loses its shards after this.
    pub shard_lease: SignedDuration,
    /// Schedules per planning batch (one transaction).
    pub batch: u32,
}

impl PlannerConfig {
    /// Defaults for one node: 16 shards, a 2-minute horizon, 15 s shard leases, batches of
    /// 5,000 schedules.
    pub fn new(node: impl Into<String>) -> PlannerConfig {
        PlannerConfig {
            node: node.into(),
            shards: 16,
            horizon: SignedDuration::from_mins(2),
            shard_lease: SignedDuration::from_secs(15),
            batch: 5_000,
        }
    }
}

/// What one [`Planner::tick`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Time spent reading due schedules.
    pub read: Duration,
    /// Time spent deciding (calendar arithmetic, misfire).
    pub decide: Duration,
    /// Time spent committing batches.
    pub commit: Duration,
    /// Shards held after acquiring.
    pub shards: usize,
    /// Schedules advanced.
    pub planned: u64,
    /// Occurrences inserted.
    pub inserted: u64,
    /// Items refused because the schedule moved first (another planner or an update).
    pub stale: u64,
    /// Batches refused because the shard lease was lost meanwhile.
    pub fenced: u64,
    /// Schedules left out of the pass because committing them failed (the rest of their
    /// batch was planned; they are tried again in the next pass).
    pub isolated: u64,
    /// What the pass's outage check found and did (see [`Store::shard_acquire`]).
    pub resumed: Resumed,
}

/// One node's planner.
#[derive(Debug)]
pub struct Planner {
    store: Arc<dyn Store>,
    cfg: PlannerConfig,
    wake: Notify,
    held: std::sync::Mutex<Vec<ShardLease>>,
    /// Until when this node's liveness mark is valid, by this process's clock: one lease from
    /// the start of the last acquisition that succeeded (the mark it wrote lasts at least as
    /// long).
    live_until: std::sync::Mutex<Option<std::time::Instant>>,
    /// The tenants' classes, the label of the schedule-lag histogram (shared with the node's
    /// server and relay: [`Planner::classes`]).
    classes: Arc<campanile_store::classes::TenantClasses>,
    /// Shards whose planning failed in the pass under way (a batch or a schedule).
    failed_shards: std::sync::Mutex<std::collections::HashSet<i32>>,
    /// Per shard, how many passes in a row failed to plan it all.
    failing: std::sync::Mutex<HashMap<i32, u64>>,
}

impl Planner {
    /// A planner over `store`.
    pub fn new(store: Arc<dyn Store>, cfg: PlannerConfig) -> Planner {
        Planner {
            classes: Arc::new(campanile_store::classes::TenantClasses::new(store.clone())),
            store,
            cfg,
            wake: Notify::new(),
            held: std::sync::Mutex::new(Vec::new()),
            live_until: std::sync::Mutex::new(None),
            failed_shards: std::sync::Mutex::new(std::collections::HashSet::new()),
            failing: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The settings.
    pub fn config(&self) -> &PlannerConfig {
        &self.cfg
    }

    /// Asks the loop to plan now (e.g. after a schedule was created).
    pub fn notify(&self) {
        self.wake.notify_one();
    }

    /// Whether this node's liveness mark is still valid (it renewed it less than a lease
    /// ago). A node hands out work only while it is: the others take the cluster for down
    /// once every mark has lapsed.
    pub fn is_live(&self) -> bool {
        self.live_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| std::time::Instant::now() < t)
    }

    /// Shards held after the last tick.
    pub fn shards_held(&self) -> Vec<ShardLease> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// This planner's copy of the tenants' classes, for the rest of its node to share (one
    /// copy, one re-read every 30 s, one label per tenant across the node's metrics).
    pub fn classes(&self) -> Arc<campanile_store::classes::TenantClasses> {
        Arc::clone(&self.classes)
    }

    /// One planning pass at `now` (`None`: the store's clock): renew/acquire shards, then plan
    /// every due schedule of each held shard in batches until none is due.
    ///
    /// # Errors
    ///
    /// [`PlannerError::Store`] if the store fails (a lost shard is not an error: its batch is
    /// counted in [`TickReport::fenced`]).
    pub async fn tick(&self, now: Option<Timestamp>) -> Result<TickReport, PlannerError> {
        self.failed_shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let pass = self.pass(now).await;
        self.count_failing(pass.is_err());
        if pass.is_err() {
            self.forget_lapsed_shards();
        }
        pass
    }

    /// After a pass: per held shard, how many passes in a row failed to plan all of it (the
    /// whole pass failed, a batch of it failed, or a schedule of it was isolated), and the
    /// worst of them in `campanile_planner_consecutive_failed_passes`.
    fn count_failing(&self, pass_failed: bool) {
        let failed =
            std::mem::take(&mut *self.failed_shards.lock().unwrap_or_else(|e| e.into_inner()));
        let held: Vec<i32> = self.shards_held().iter().map(|l| l.shard).collect();
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        failing.retain(|shard, _| held.contains(shard));
        for shard in held {
            let n = failing.entry(shard).or_default();
            if pass_failed || failed.contains(&shard) {
                *n += 1;
                if *n == 3 || (*n > 3 && n.is_power_of_two()) {
                    tracing::error!(
                        shard,
                        passes = *n,
                        "planning of shard {shard} has failed {n} passes in a row"
                    );
                }
            } else {
                *n = 0;
            }
        }
        let worst = failing.values().copied().max().unwrap_or(0);
        metrics::gauge!("campanile_planner_consecutive_failed_passes").set(worst as f64);
    }

    /// Per held shard, how many planning passes in a row failed to plan all of it.
    pub fn failing_passes(&self) -> HashMap<i32, u64> {
        self.failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn pass(&self, now: Option<Timestamp>) -> Result<TickReport, PlannerError> {
        let live = now.is_none();
        let now = match now {
            Some(t) => t,
            None => self.store.store_now().await?,
        };
        // The outage check runs with the pass's `now`, so that what it keeps of the instants
        // planned before an outage and what this pass plans late agree on what is late.
        let mut renewed = std::time::Instant::now();
        let clock = PassClock {
            now,
            started: renewed,
            live,
        };
        let (leases, resumed) = self.acquire(Some(now)).await?;
        self.classes.refresh().await;
        let mut report = TickReport {
            shards: leases.len(),
            resumed,
            ..TickReport::default()
        };
        let before = now.checked_add(self.cfg.horizon).unwrap_or(Timestamp::MAX);
        // Many schedules share a timing; parse each distinct one once per pass.
        let mut calendars: HashMap<Timing, Result<Calendar, String>> = HashMap::new();
        // Tenants found to have no catch-up rate in this pass (not asked again).
        let mut unpaced: std::collections::HashSet<TenantId> = std::collections::HashSet::new();
        // A pipeline over the held shards, round robin: while one shard's batch commits (on
        // the writer), the next shard's batch is read (on a reader) and decided. Never two
        // batches of one shard in flight: a read overlapping its own shard's commit would
        // return the schedules being advanced (they would be refused as stale, not doubled,
        // but it is wasted work). Bounded: each round either advances schedules or drops a
        // shard, and a shard is dropped when a read finds nothing due. The in-flight shard is
        // never in the rotation: only `settle` puts it back, after its commit.
        let mut rotation: std::collections::VecDeque<ShardLease> = leases.into();
        let mut inflight: Option<(ShardLease, bool, PlanCommit)> = None;
        // Schedules left out of this pass because their commit failed: not read again in it.
        let mut isolated: std::collections::HashSet<ScheduleId> = std::collections::HashSet::new();
        // A pass can outlast the leases (half a million schedules due at once on PostgreSQL
        // take longer than 15 s): on the store's clock, renew them (and the node's liveness
        // mark) as the loop would between passes, so that the node neither loses its shards
        // nor looks down to a node starting meanwhile. The batches keep the pass's `now`.
        // Counted from before the first acquisition: one that judged an outage's leftovers
        // for long is followed by a renewal at once.
        let renew = self.renew_interval();
        for _ in 0..1_000_000 {
            if live && renewed.elapsed() >= renew {
                let (held, _) = self.acquire(None).await?;
                renewed = std::time::Instant::now();
                // Plan on with what is still held, under its current epoch: a shard given up to
                // a new node is not read again in this pass; one lost and taken back is, under
                // its new epoch; one newly taken waits for the next pass.
                rotation = rotation
                    .into_iter()
                    .filter_map(|l| held.iter().find(|h| h.shard == l.shard).copied())
                    .collect();
            }
            let Some(lease) = rotation.pop_front() else {
                if inflight.is_none() {
                    break;
                }
                self.settle(
                    inflight.take(),
                    &mut rotation,
                    &mut report,
                    &clock,
                    &mut isolated,
                )
                .await?;
                continue;
            };
            let t_read = std::time::Instant::now();
            let (due, settled) = tokio::join!(
                self.store.schedule_due(ScheduleDueList {
                    shard: lease.shard,
                    before,
                    limit: self.cfg.batch,
                }),
                self.settle(
                    inflight.take(),
                    &mut rotation,
                    &mut report,
                    &clock,
                    &mut isolated
                ),
            );
            settled?;
            let mut due = due?;
            report.read += t_read.elapsed();
            if due.is_empty() {
                continue;
            }
            let full = due.len() as u32 == self.cfg.batch;
            if !isolated.is_empty() {
                due.retain(|d| !isolated.contains(&d.id));
                if due.is_empty() {
                    continue;
                }
            }
            let t_decide = std::time::Instant::now();
            let mut items: Vec<PlanItem> = due
                .iter()
                .map(|d| self.item(d, now, &mut calendars))
                .collect();
            self.pace_catchup(&due, &mut items, now, &mut unpaced)
                .await?;
            report.decide += t_decide.elapsed();
            inflight = Some((
                lease,
                full,
                PlanCommit {
                    node: self.cfg.node.clone(),
                    shard: lease.shard,
                    shard_epoch: lease.epoch,
                    items: items.into(),
                    now: Some(now),
                },
            ));
        }
        Ok(report)
    }

    /// Renews the node's liveness mark and shard leases (with the outage check first) and
    /// records what it holds.
    async fn acquire(
        &self,
        now: Option<Timestamp>,
    ) -> Result<(Vec<ShardLease>, Resumed), PlannerError> {
        let started = std::time::Instant::now();
        let acquired = self
            .store
            .shard_acquire(ShardAcquire {
                node: self.cfg.node.clone(),
                total: self.cfg.shards,
                lease: self.cfg.shard_lease,
                judge: Arc::new(crate::CalendarJudge::default()),
                now,
            })
            .await?;
        let r = acquired.resumed;
        if let Some(since) = r.down_since {
            metrics::counter!("campanile_occurrences_missed_total").increment(r.missed);
            tracing::warn!(
                %since,
                examined = r.examined,
                missed = r.missed,
                "no node was alive since {since}: the occurrences planned before the outage \
                 that came due during it were judged by their misfire policy"
            );
        }
        metrics::gauge!("campanile_planner_shards_held").set(acquired.leases.len() as f64);
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = acquired.leases.clone();
        let lease = self.lease();
        *self.live_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(started + lease);
        Ok((acquired.leases, r))
    }

    /// After a failed pass: once the leases taken at the last renewal have run out (the
    /// liveness mark lapses with them), the node holds nothing, and says so — during a
    /// database outage the shards gauge would otherwise keep its last value, and the alert on
    /// a cluster holding no shards could never fire.
    fn forget_lapsed_shards(&self) {
        if !self.is_live() {
            self.held.lock().unwrap_or_else(|e| e.into_inner()).clear();
            metrics::gauge!("campanile_planner_shards_held").set(0.0);
        }
    }

    /// Commits an in-flight batch (if any) and puts its shard back in the rotation unless it
    /// is done (nothing advanced and the batch was not full) or its lease was lost.
    ///
    /// A batch the store refuses with an error of its own (not a lost lease, not an
    /// unreachable database) is split in halves and committed again, down to single
    /// schedules: the one that cannot be committed is isolated (logged with its id, counted in
    /// `campanile_planner_schedules_isolated_total`) and the rest of the batch is planned. Its
    /// queue entry did not move, so the next pass tries it again.
    async fn settle(
        &self,
        inflight: Option<(ShardLease, bool, PlanCommit)>,
        rotation: &mut std::collections::VecDeque<ShardLease>,
        report: &mut TickReport,
        clock: &PassClock,
        isolated_ids: &mut std::collections::HashSet<ScheduleId>,
    ) -> Result<(), PlannerError> {
        let Some((lease, full, commit)) = inflight else {
            return Ok(());
        };
        let items = std::sync::Arc::clone(&commit.items);
        let t_commit = std::time::Instant::now();
        let committed = self.store.plan_commit(commit).await;
        let outcome = match committed {
            Ok(r) => {
                Observed::of(&items, &self.classes)
                    .without(&r.refused)
                    .record(clock.visible_now());
                Ok((r, 0))
            }
            Err(StoreError::Fenced(msg)) => Err(msg),
            Err(e) if isolatable(&e) => {
                tracing::warn!(
                    shard = lease.shard,
                    schedules = items.len(),
                    error = %e,
                    "planning batch failed; committing it in parts to isolate the schedule that fails"
                );
                self.commit_isolating(lease, &items, clock, isolated_ids)
                    .await?
            }
            Err(e) => {
                report.commit += t_commit.elapsed();
                self.failed_shards
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(lease.shard);
                return Err(e.into());
            }
        };
        report.commit += t_commit.elapsed();
        match outcome {
            Ok((r, isolated)) => {
                metrics::counter!("campanile_occurrences_planned_total").increment(r.inserted);
                report.planned += r.applied;
                report.inserted += r.inserted;
                report.stale += r.stale;
                report.isolated += isolated;
                if isolated > 0 {
                    self.failed_shards
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(lease.shard);
                }
                // A full batch whose schedules all failed would be read again as it is.
                if r.applied > 0 || (full && isolated == 0) {
                    rotation.push_back(lease);
                }
                Ok(())
            }
            Err(msg) => {
                tracing::warn!(shard = lease.shard, %msg, "shard lease lost; stopping this shard");
                report.fenced += 1;
                Ok(())
            }
        }
    }

    /// Commits `items` in parts after the whole batch failed: each part that fails is halved
    /// again, and a single schedule that fails is left out. Answers the sum of what the parts
    /// committed and how many schedules were left out, or the lost lease's message.
    async fn commit_isolating(
        &self,
        lease: ShardLease,
        items: &std::sync::Arc<[PlanItem]>,
        clock: &PassClock,
        isolated_ids: &mut std::collections::HashSet<ScheduleId>,
    ) -> Result<Result<(PlanReport, u64), String>, PlannerError> {
        let mut total = PlanReport::default();
        let mut isolated = 0u64;
        let mid = items.len() / 2;
        let mut parts = vec![(mid, items.len()), (0, mid)];
        while let Some((from, to)) = parts.pop() {
            if from >= to {
                continue;
            }
            let part: std::sync::Arc<[PlanItem]> = items[from..to].to_vec().into();
            let committed = self
                .store
                .plan_commit(PlanCommit {
                    node: self.cfg.node.clone(),
                    shard: lease.shard,
                    shard_epoch: lease.epoch,
                    items: std::sync::Arc::clone(&part),
                    now: Some(clock.now),
                })
                .await;
            match committed {
                Ok(r) => {
                    Observed::of(&part, &self.classes)
                        .without(&r.refused)
                        .record(clock.visible_now());
                    total.applied += r.applied;
                    total.stale += r.stale;
                    total.inserted += r.inserted;
                    total.refused.extend(r.refused);
                }
                Err(StoreError::Fenced(msg)) => return Ok(Err(msg)),
                Err(e) if isolatable(&e) && to - from == 1 => {
                    let item = &items[from];
                    isolated += 1;
                    isolated_ids.insert(item.schedule_id);
                    metrics::counter!("campanile_planner_schedules_isolated_total").increment(1);
                    tracing::error!(
                        schedule = %item.schedule_id,
                        tenant = item.tenant.0,
                        version = item.version,
                        shard = lease.shard,
                        error = %e,
                        "schedule cannot be planned; left out of this pass (the rest of its \
                         batch is planned) and tried again in the next one"
                    );
                }
                Err(e) if isolatable(&e) => {
                    let mid = from + (to - from) / 2;
                    parts.push((mid, to));
                    parts.push((from, mid));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Ok((total, isolated)))
    }

    /// Spaces the late runs of each tenant with a catch-up rate quota: the batch reserves
    /// that many slots of the tenant's pace ([`Store::tenant_catchup_reserve`]), which every
    /// pass, node, resume, outage check and backfill shares, so the rate holds across them. A
    /// batch whose commit fails leaves its slots unused: late runs go slower, never faster.
    async fn pace_catchup(
        &self,
        due: &[DueSchedule],
        items: &mut [PlanItem],
        now: Timestamp,
        unpaced: &mut std::collections::HashSet<TenantId>,
    ) -> Result<(), PlannerError> {
        // Per tenant, its late runs in batch order: (item, occurrence).
        let mut late: HashMap<TenantId, Vec<(usize, usize)>> = HashMap::new();
        for (n, (d, item)) in due.iter().zip(items.iter()).enumerate() {
            if unpaced.contains(&d.tenant) {
                continue;
            }
            let cutoff = now
                .checked_sub(d.spec.misfire.max_lateness())
                .unwrap_or(now);
            for (i, o) in item.occurrences.iter().enumerate() {
                if o.state == campanile_core::OccurrenceState::Ready && o.scheduled_for < cutoff {
                    late.entry(d.tenant).or_default().push((n, i));
                }
            }
        }
        for (tenant, mut runs) in late {
            // Oldest instant first, across the tenant's schedules.
            runs.sort_by_key(|&(n, i)| items[n].occurrences[i].scheduled_for);
            let slots = self
                .store
                .tenant_catchup_reserve(CatchupReserve {
                    tenant,
                    count: runs.len() as u32,
                    now: Some(now),
                })
                .await?;
            let Some(slots) = slots else {
                // No rate: nothing of this tenant is paced in this pass.
                unpaced.insert(tenant);
                continue;
            };
            for (k, (n, i)) in runs.into_iter().enumerate() {
                let o = &mut items[n].occurrences[i];
                o.available_at = o.available_at.max(slots.slot(k as u32));
            }
        }
        Ok(())
    }

    fn item(
        &self,
        d: &DueSchedule,
        now: Timestamp,
        calendars: &mut HashMap<Timing, Result<Calendar, String>>,
    ) -> PlanItem {
        let cal = calendars
            .entry(d.spec.timing.clone())
            .or_insert_with(|| calendar_of(&d.spec).map_err(|e| e.to_string()));
        let (occurrences, missed, next_run_at) = match cal {
            Ok(cal) => {
                let p = plan(&Input {
                    id: d.id,
                    version: d.version,
                    spec: &d.spec,
                    calendar: cal,
                    next_run_at: d.next_run_at,
                    now,
                    horizon: self.cfg.horizon,
                });
                (p.occurrences, p.missed, p.next_run_at)
            }
            Err(e) => {
                // Validated at creation, so only a zone removed from the system's database
                // gets here. Stop planning it, loudly, rather than loop on it.
                tracing::error!(schedule = %d.id, error = %e, "stored schedule no longer has a valid calendar; planning stopped");
                (Vec::new(), None, None)
            }
        };
        PlanItem {
            tenant: d.tenant,
            schedule_id: d.id,
            version: d.version,
            expected_next_run_at: d.next_run_at,
            next_run_at,
            occurrences,
            missed,
        }
    }

    /// Runs until `shutdown` turns true: tick, then sleep until the next due instant enters
    /// the horizon, the shard leases need renewing, or [`Planner::notify`] is called. On
    /// shutdown, releases the shards so another node takes them at once.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let renew = self.renew_interval();
        loop {
            if *shutdown.borrow() {
                break;
            }
            let sleep = match self.tick(None).await {
                // Never longer than until a third of the lease has passed since the last
                // acquisition (a long pass may have renewed last well before it ended), so
                // the node's mark, and with it `is_live`, never runs short in normal running.
                Ok(_) => self.until_next(renew).await.min(self.until_renewal(renew)),
                Err(e) => {
                    tracing::warn!(error = %e, "planning pass failed; retrying");
                    Duration::from_secs(1)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(sleep) => {}
                _ = self.wake.notified() => {}
                _ = shutdown.changed() => {}
            }
        }
        // Not live from here on: nothing is handed out under a mark given up.
        *self.live_until.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let _ = self
            .store
            .shard_release(ShardRelease {
                node: self.cfg.node.clone(),
                now: None,
            })
            .await;
    }

    /// The shard lease (and liveness mark) length.
    fn lease(&self) -> Duration {
        Duration::from_millis(self.cfg.shard_lease.as_millis().max(0) as u64)
    }

    /// How often the leases are renewed: a third of their length, within 0.1 to 60 s.
    fn renew_interval(&self) -> Duration {
        (self.lease() / 3).clamp(Duration::from_millis(100), Duration::from_secs(60))
    }

    /// How long until `renew` has passed since the start of the last acquisition.
    fn until_renewal(&self, renew: Duration) -> Duration {
        let lease = self.lease();
        match *self.live_until.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(until) => until.checked_sub(lease).map_or(Duration::ZERO, |acquired| {
                (acquired + renew).saturating_duration_since(std::time::Instant::now())
            }),
            None => Duration::ZERO,
        }
    }

    async fn until_next(&self, cap: Duration) -> Duration {
        let shards: Vec<i32> = self.shards_held().iter().map(|l| l.shard).collect();
        let (Ok(Some(next)), Ok(now)) = (
            self.store
                .schedule_next_due(ScheduleNextDue {
                    shards: shards.to_vec(),
                })
                .await,
            self.store.store_now().await,
        ) else {
            return cap;
        };
        let wake_at = next.checked_sub(self.cfg.horizon).unwrap_or(next);
        let ms = wake_at.as_millisecond() - now.as_millisecond();
        Duration::from_millis(ms.clamp(0, cap.as_millis() as i64) as u64)
    }
}

/// Whether a failed planning commit may be the fault of one of its schedules, and is worth
/// committing again in parts: not when the database is away (every part would fail the
/// same way: the pass fails and is retried whole).
fn isolatable(e: &StoreError) -> bool {
    !matches!(e, StoreError::Unavailable(_) | StoreError::Fenced(_))
}

/// When a planning pass runs, to tell when what it commits becomes visible.
struct PassClock {
    /// The pass's `now`: the instant its decisions are made for.
    now: Timestamp,
    /// When the pass started, by this process's monotonic clock.
    started: std::time::Instant,
    /// On the store's clock (`tick(None)`): time passes during the pass. With a given `now`
    /// (tests stepping time) it does not.
    live: bool,
}

impl PassClock {
    /// Now, as the pass sees it: its `now` plus, when live, the time it has run. A batch
    /// committed 8 s into a long top-of-the-hour pass became visible 8 s after the pass's
    /// `now`, and its schedule lag says so.
    fn visible_now(&self) -> Timestamp {
        if !self.live {
            return self.now;
        }
        let ran = SignedDuration::try_from(self.started.elapsed()).unwrap_or(SignedDuration::ZERO);
        self.now.checked_add(ran).unwrap_or(self.now)
    }
}

/// A planned run as the lag histogram sees it: its schedule, its tenant's class, its instant
/// and its availability (after catch-up pacing).
type Run = (ScheduleId, Arc<str>, Timestamp, Timestamp);

/// What a batch planned, kept until its commit says whether it counts: its runs, and per
/// schedule that records some, how many instants it records as missed.
struct Observed {
    runs: Vec<Run>,
    missed: Vec<(ScheduleId, u64)>,
}

impl Observed {
    fn of(items: &[PlanItem], classes: &campanile_store::classes::TenantClasses) -> Observed {
        let mut runs = Vec::new();
        let mut missed = Vec::new();
        for item in items {
            let mut item_missed = item.missed.as_ref().map_or(0, |m| m.count);
            let mut class = None;
            for o in &item.occurrences {
                if o.state == campanile_core::OccurrenceState::Missed {
                    item_missed += 1;
                } else {
                    let class = class.get_or_insert_with(|| classes.cached(item.tenant));
                    runs.push((
                        item.schedule_id,
                        class.clone(),
                        o.scheduled_for,
                        o.available_at,
                    ));
                }
            }
            if item_missed > 0 {
                missed.push((item.schedule_id, item_missed));
            }
        }
        Observed { runs, missed }
    }

    /// Without the items the commit refused as stale: they wrote nothing.
    fn without(mut self, refused: &[ScheduleId]) -> Observed {
        if !refused.is_empty() {
            let refused: std::collections::HashSet<&ScheduleId> = refused.iter().collect();
            self.runs.retain(|(id, ..)| !refused.contains(id));
            self.missed.retain(|(id, _)| !refused.contains(id));
        }
        self
    }

    /// Schedule lag (`visible_at - scheduled_for`, where an occurrence becomes visible when
    /// its batch commits or when it becomes available, whichever is later) by tenant class,
    /// and misses: recorded once the batch committed, so a fenced batch counts nothing.
    fn record(&self, committed_at: Timestamp) {
        let mut current: Option<(&Arc<str>, metrics::Histogram)> = None;
        for (_, class, scheduled_for, available_at) in &self.runs {
            let h = match &current {
                Some((c, h)) if Arc::ptr_eq(c, class) || c == &class => h,
                _ => {
                    let h = metrics::histogram!("campanile_schedule_lag_seconds", "tenant_class" => class.to_string());
                    &current.insert((class, h)).1
                }
            };
            let visible = committed_at.max(*available_at);
            let lag = (visible.as_millisecond() - scheduled_for.as_millisecond()).max(0);
            h.record(lag as f64 / 1000.0);
        }
        let missed: u64 = self.missed.iter().map(|(_, n)| n).sum();
        if missed > 0 {
            metrics::counter!("campanile_occurrences_missed_total").increment(missed);
        }
    }
}

#[cfg(test)]
mod observed_tests {
    use super::*;

    /// Only the items a commit applied count in the schedule-lag histogram: a stale item
    /// (refused) planned nothing (before, heavy update churn showed more lag samples than
    /// occurrences planned).
    #[test]
    fn refused_items_are_not_observed() {
        let t = Timestamp::from_second(1_800_000_000).unwrap();
        let class: Arc<str> = Arc::from("default");
        let (a, b) = (
            ScheduleId(uuid::Uuid::now_v7()),
            ScheduleId(uuid::Uuid::now_v7()),
        );
        let observed = Observed {
            runs: vec![
                (a, class.clone(), t, t),
                (b, class.clone(), t, t),
                (b, class, t, t),
            ],
            missed: vec![(b, 2)],
        };
        let kept = observed.without(&[b]);
        assert_eq!(kept.runs.len(), 1);
        assert_eq!(kept.runs[0].0, a);
        assert!(kept.missed.is_empty());
    }
}
