//! The schedule lifecycle: validation, creation, versioned updates, pause, resume, cancel.

use std::sync::Arc;

use campanile_calendar::Calendar;
use campanile_core::ScheduleId;
use campanile_store::*;
use jiff::{SignedDuration, Timestamp};

use crate::materialize::new_occurrence;
use crate::{PlannerError, calendar_of, shard_of};

/// A schedule with its next planned instants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleView {
    /// The stored schedule.
    pub record: ScheduleRecord,
    /// The next instants it will fire at, from now (empty when paused or canceled).
    pub next_fires: Vec<Timestamp>,
}

/// The most never-planned instants an update or a cancel records as `CANCELED` occurrences,
/// in its own transaction (a schedule paused for a year at one instant a minute has half a
/// million): past it, the rest are summarized in one missed range.
pub const MAX_SUPERSEDED: usize = 10_000;

/// How far the summary of the rest counts exactly; past it, the count is a lower bound and
/// the range runs to the change.
const MAX_SUPERSEDED_COUNTED: u64 = 100_000;

/// The longest retry backoff a schedule may ask for. Longer would be a retry nobody waits
/// for, and unbounded values overflow the instant a retry is due.
pub const MAX_BACKOFF: SignedDuration = SignedDuration::from_hours(30 * 24);

/// Checks a definition and returns its calendar.
///
/// # Errors
///
/// [`PlannerError::Invalid`] or [`PlannerError::Calendar`] naming what is wrong.
pub fn validate(spec: &ScheduleSpec) -> Result<Calendar, PlannerError> {
    let target =
        campanile_core::Target::from_queue(&spec.queue).map_err(|e| PlannerError::Invalid(e.0))?;
    if target.is_external() && spec.overlap != campanile_core::Overlap::Allow {
        return Err(PlannerError::Invalid(
            "overlap policies apply to the built-in queue; a NATS target hands each occurrence \
             to the broker, so overlap must be ALLOW"
                .into(),
        ));
    }
    if spec.max_attempts == 0 || spec.max_attempts > 1_000 {
        return Err(PlannerError::Invalid(
            "retry.max_attempts must be between 1 and 1000".into(),
        ));
    }
    if spec.lease < SignedDuration::from_secs(1) || spec.lease > SignedDuration::from_hours(24) {
        return Err(PlannerError::Invalid(
            "lease_seconds must be between 1 and 86400".into(),
        ));
    }
    if spec.backoff_initial <= SignedDuration::ZERO || spec.backoff_initial > spec.backoff_max {
        return Err(PlannerError::Invalid(
            "retry.backoff_initial_ms must be positive and at most retry.backoff_max_ms".into(),
        ));
    }
    if spec.backoff_max > MAX_BACKOFF {
        return Err(PlannerError::Invalid(format!(
            "retry.backoff_max_ms must be at most {} (30 days)",
            MAX_BACKOFF.as_millis()
        )));
    }
    if spec.flex_window.is_negative() || spec.flex_window > SignedDuration::from_hours(24) {
        return Err(PlannerError::Invalid(
            "flex_window_seconds must be between 0 and 86400".into(),
        ));
    }
    if spec.misfire.max_lateness().is_negative() {
        return Err(PlannerError::Invalid(
            "misfire.max_lateness_seconds must not be negative".into(),
        ));
    }
    if let campanile_core::Misfire::Catchup { max, interval, .. } = spec.misfire {
        if max == 0 || max > 10_000 {
            return Err(PlannerError::Invalid(
                "misfire.catchup_max must be between 1 and 10000".into(),
            ));
        }
        if interval.is_negative() || interval > SignedDuration::from_hours(24) {
            return Err(PlannerError::Invalid(
                "misfire.catchup_interval_ms must be between 0 and 86400000 (one day)".into(),
            ));
        }
    }
    // Occurrence ids sort by planned instant only from 1970 on (`campanile_core::occurrence_id`),
    // and listings read them in that order; a one-off is the only way to plan earlier.
    if let Timing::At(at) = spec.timing
        && at < Timestamp::UNIX_EPOCH
    {
        return Err(PlannerError::Invalid(format!(
            "at: {at} is before 1970-01-01T00:00:00Z; instants that early are not accepted"
        )));
    }
    if let Timing::Every { period, anchor } = spec.timing
        && anchor.checked_add(period).is_err()
    {
        return Err(PlannerError::Invalid(format!(
            "every: {period:#} is too long: the schedule would never fire a second time"
        )));
    }
    calendar_of(spec)
}

/// The first instant to plan for a definition taking effect at `now`: the calendar's first
/// instant at or after `now`. A one-off instant in the past is refused unless the misfire
/// policy runs late instants or it is not late yet (within `max_lateness`: a client's clock a
/// few seconds behind, or a slow request, should not turn "now" into an error).
fn first_instant(
    spec: &ScheduleSpec,
    cal: &Calendar,
    now: Timestamp,
) -> Result<Option<Timestamp>, PlannerError> {
    if let Timing::At(at) = spec.timing {
        let late = now.duration_since(at);
        if late > spec.misfire.max_lateness() && spec.misfire.runs() == 0 {
            return Err(PlannerError::Invalid(format!(
                "at {at} is {:#} in the past, later than the misfire policy's max_lateness \
                 ({:#}); use misfire policy fire_once to run it anyway",
                late.round(jiff::Unit::Second).unwrap_or(late),
                spec.misfire.max_lateness()
            )));
        }
        return Ok(Some(at));
    }
    Ok(cal.next_after(
        now.checked_sub(SignedDuration::from_nanos(1))
            .unwrap_or(now),
    ))
}

/// How many hours ahead [`fires_per_hour`] looks for a schedule's busiest hour: a week covers
/// daily and weekly patterns.
pub const FIRES_LOOKAHEAD_HOURS: i64 = 168;

/// The most times a calendar fires within any one hour (a sliding window) of the week from
/// `now`, for the trigger-rate quota. The whole week counts, not only the first hour: a
/// schedule quiet at creation and busy later (`* * 5 * * *` created at 02:00, or an `every: 1s`
/// anchored tomorrow) would otherwise count as zero and let a tenant past its quota. Stops
/// early at 3600, the most any calendar fires in an hour (instants are whole seconds at the
/// finest); at ~70 ns an instant, a week of a 2-second series is ~20 ms.
pub fn fires_per_hour(cal: &Calendar, now: Timestamp) -> u32 {
    const MOST: u32 = 3600;
    let hour_ms = 3_600_000;
    let end = now
        .checked_add(SignedDuration::from_hours(FIRES_LOOKAHEAD_HOURS))
        .unwrap_or(Timestamp::MAX);
    let from = now
        .checked_sub(SignedDuration::from_nanos(1))
        .unwrap_or(now);
    // The instants of the last hour up to each instant: a sliding window, so an hour of
    // activity straddling two clock hours counts whole.
    let mut window: std::collections::VecDeque<i64> = std::collections::VecDeque::new();
    let mut busiest = 0u32;
    for t in cal.iter_after(from).take_while(|t| *t < end) {
        let ms = t.as_millisecond();
        window.push_back(ms);
        while window.front().is_some_and(|first| *first <= ms - hour_ms) {
            window.pop_front();
        }
        busiest = busiest.max(window.len() as u32);
        if busiest >= MOST {
            break;
        }
    }
    busiest
}

#[cfg(test)]
mod fires_tests {
    use super::*;
    use campanile_core::{Misfire, Overlap};

    fn cal(timing: Timing) -> Calendar {
        validate(&ScheduleSpec {
            timing,
            queue: "q".into(),
            payload: None,
            priority: 0,
            lease: SignedDuration::from_secs(30),
            max_attempts: 1,
            backoff_initial: SignedDuration::from_secs(1),
            backoff_max: SignedDuration::from_secs(1),
            misfire: Misfire::default(),
            overlap: Overlap::Allow,
            flex_window: SignedDuration::ZERO,
        })
        .expect("valid")
    }

    fn cron(expr: &str) -> Calendar {
        cal(Timing::Cron {
            expr: expr.into(),
            timezone: "UTC".into(),
            dst_gap: Default::default(),
            dst_fold: Default::default(),
        })
    }

    #[test]
    fn the_busiest_hour_of_the_week_counts_not_the_first() {
        let now: Timestamp = "2026-12-01T02:30:00Z".parse().unwrap();
        // Quiet now, every second from 05:00.
        assert_eq!(fires_per_hour(&cron("* * 5 * * *"), now), 3600);
        let tomorrow: Timestamp = "2026-12-02T00:00:00Z".parse().unwrap();
        let every = |secs| {
            cal(Timing::Every {
                period: SignedDuration::from_secs(secs),
                anchor: tomorrow,
            })
        };
        assert_eq!(fires_per_hour(&every(1), now), 3600);
        assert_eq!(fires_per_hour(&every(2), now), 1800);
        // Steady rates, and a weekly one (a Tuesday: next Monday is within the week).
        assert_eq!(fires_per_hour(&cron("*/5 * * * *"), now), 12);
        assert_eq!(fires_per_hour(&cron("0 9 * * MON"), now), 1);
        assert_eq!(
            fires_per_hour(&cron("0 0 1 1 *"), now),
            0,
            "beyond the week"
        );
        let once = cal(Timing::At(tomorrow));
        assert_eq!(fires_per_hour(&once, now), 1);
    }
}

/// The next `n` instants a schedule's definition fires at, from `now` (inclusive): an active
/// one's, and a finished one's (a one-off planned ahead of its instant still fires then); none
/// when paused or canceled.
pub fn upcoming(record: &ScheduleRecord, now: Timestamp, n: usize) -> Vec<Timestamp> {
    match (record.state, calendar_of(&record.spec)) {
        (ScheduleState::Active | ScheduleState::Finished, Ok(cal)) => next_fires(
            &cal,
            now.checked_sub(SignedDuration::from_nanos(1))
                .unwrap_or(now),
            n,
        ),
        _ => Vec::new(),
    }
}

/// The next `n` fire times after `after`.
pub fn next_fires(cal: &Calendar, after: Timestamp, n: usize) -> Vec<Timestamp> {
    cal.iter_after(after).take(n).collect()
}

/// Schedule operations over a store, with the deployment's shard count.
#[derive(Debug, Clone)]
pub struct Schedules {
    store: Arc<dyn Store>,
    shards: u32,
}

async fn now_of(store: &dyn Store, now: Option<Timestamp>) -> Result<Timestamp, PlannerError> {
    Ok(match now {
        Some(t) => t,
        None => store.store_now().await?,
    })
}

impl Schedules {
    /// Schedule operations on `store`, spreading schedules over `shards` shards.
    pub fn new(store: Arc<dyn Store>, shards: u32) -> Schedules {
        Schedules {
            store,
            shards: shards.max(1),
        }
    }

    fn view(record: ScheduleRecord, now: Timestamp) -> ScheduleView {
        // Instants are stored to the millisecond (an interval's anchor too), so "from now"
        // starts at now's millisecond: an anchor of "now" is the first fire, as planned.
        let now = Timestamp::from_millisecond(now.as_millisecond()).unwrap_or(now);
        let next_fires = upcoming(&record, now, 5);
        ScheduleView { record, next_fires }
    }

    /// Creates a schedule (version 1).
    ///
    /// # Errors
    ///
    /// [`PlannerError::Invalid`] / [`PlannerError::Calendar`] for a bad definition.
    pub async fn create(
        &self,
        tenant: TenantId,
        spec: ScheduleSpec,
        now: Option<Timestamp>,
    ) -> Result<ScheduleView, PlannerError> {
        self.create_under_key(tenant, spec, None, now).await
    }

    /// As [`Schedules::create`], for a request holding an `Idempotency-Key` reservation: the
    /// create commits only while the reservation is still `idempotency`'s, and records the
    /// schedule on it in the same transaction.
    ///
    /// # Errors
    ///
    /// As [`Schedules::create`], and [`StoreError::Superseded`] when a retry took the
    /// reservation over (nothing written).
    pub async fn create_under_key(
        &self,
        tenant: TenantId,
        spec: ScheduleSpec,
        idempotency: Option<IdempotencyToken>,
        now: Option<Timestamp>,
    ) -> Result<ScheduleView, PlannerError> {
        let cal = validate(&spec)?;
        let now = now_of(self.store.as_ref(), now).await?;
        let next = first_instant(&spec, &cal, now)?;
        let id = ScheduleId(uuid::Uuid::now_v7());
        self.store
            .schedule_create(ScheduleCreate {
                tenant,
                id,
                spec,
                shard: shard_of(id, self.shards),
                next_run_at: next,
                fires_per_hour: fires_per_hour(&cal, now),
                idempotency,
                now: Some(now),
            })
            .await?;
        let record = self
            .store
            .schedule_get(ScheduleGet { tenant, id })
            .await?
            .ok_or_else(|| PlannerError::Store(StoreError::NotFound(format!("schedule {id}"))))?;
        Ok(Self::view(record, now))
    }

    /// One schedule with its next fires.
    ///
    /// # Errors
    ///
    /// [`PlannerError::Store`] if the store fails.
    pub async fn get(
        &self,
        tenant: TenantId,
        id: ScheduleId,
        now: Option<Timestamp>,
    ) -> Result<Option<ScheduleView>, PlannerError> {
        let now = now_of(self.store.as_ref(), now).await?;
        Ok(self
            .store
            .schedule_get(ScheduleGet { tenant, id })
            .await?
            .map(|r| Self::view(r, now)))
    }

    /// Replaces the definition, optimistically against `expected_version`. The new version
    /// plans from now; unclaimed occurrences of older versions are canceled.
    ///
    /// # Errors
    ///
    /// As [`Schedules::create`], plus [`StoreError::VersionConflict`] and
    /// [`StoreError::NotFound`] inside [`PlannerError::Store`].
    pub async fn update(
        &self,
        tenant: TenantId,
        id: ScheduleId,
        expected_version: u32,
        spec: ScheduleSpec,
        now: Option<Timestamp>,
    ) -> Result<(ScheduleView, ScheduleChange), PlannerError> {
        let cal = validate(&spec)?;
        let now = now_of(self.store.as_ref(), now).await?;
        let next = first_instant(&spec, &cal, now)?;
        let fires_per_hour = fires_per_hour(&cal, now);
        let change = self
            .superseding(tenant, id, now, true, |superseded| {
                self.store.schedule_update(ScheduleUpdate {
                    tenant,
                    id,
                    expected_version,
                    spec: spec.clone(),
                    next_run_at: next,
                    fires_per_hour,
                    superseded,
                    now: Some(now),
                })
            })
            .await?;
        Ok((Self::view(change.schedule.clone(), now), change))
    }

    /// Runs `change` (an update, or a transition that records what it supersedes when
    /// `record`: a cancel) with the list of what it supersedes, read before its transaction.
    /// A change refused as a version conflict although the list named the current version is
    /// a stale caller and answered as such; a list made stale by a change that landed since it
    /// was read is read again (up to five times).
    async fn superseding<F, Fut>(
        &self,
        tenant: TenantId,
        id: ScheduleId,
        now: Timestamp,
        record: bool,
        mut change: F,
    ) -> Result<ScheduleChange, PlannerError>
    where
        F: FnMut(Superseded) -> Fut,
        Fut: std::future::Future<Output = Result<ScheduleChange, StoreError>>,
    {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let list = if record {
                self.superseded(tenant, id, now).await?
            } else {
                Superseded::default()
            };
            let read_for = list.version;
            match change(list).await {
                Err(StoreError::VersionConflict { current })
                    if record && current != read_for && attempts < 5 => {}
                other => return Ok(other?),
            }
        }
    }

    /// The current definition's instants from where its planning stands up to `now`: due
    /// before an update or a cancel at `now` and never planned (the planner lagged behind, or
    /// the schedule was paused). The change records them, as `CANCELED` occurrences (at most
    /// [`MAX_SUPERSEDED`], the rest in one summary), instead of dropping them unrecorded.
    /// Instants already recorded under any version (a pause retires what it had planned) are
    /// left out.
    async fn superseded(
        &self,
        tenant: TenantId,
        id: ScheduleId,
        now: Timestamp,
    ) -> Result<Superseded, PlannerError> {
        let Some(record) = self.store.schedule_get(ScheduleGet { tenant, id }).await? else {
            return Ok(Superseded::default()); // the change itself answers "not found"
        };
        // Even an empty list names its version: the store refuses it if a change landed since.
        let none = Superseded {
            version: record.version,
            ..Superseded::default()
        };
        let position = match record.state {
            ScheduleState::Active => {
                self.store
                    .schedule_position(SchedulePosition { tenant, id })
                    .await?
            }
            ScheduleState::Paused => record.next_run_at,
            _ => None,
        };
        let Some(from) = position.filter(|p| *p < now) else {
            return Ok(none);
        };
        // A definition whose calendar no longer builds (its zone left the system database)
        // must stay cancelable: nothing can be computed, nothing is recorded.
        let cal = match calendar_of(&record.spec) {
            Ok(cal) => cal,
            Err(e) => {
                tracing::warn!(schedule = %id, error = %e, "cannot list the instants this change supersedes");
                return Ok(none);
            }
        };
        let recorded =
            crate::reconcile::occurrences(self.store.as_ref(), tenant, id, from, now, now).await?;
        let start = from
            .checked_sub(SignedDuration::from_nanos(1))
            .unwrap_or(from);
        let mut instants = cal
            .iter_after(start)
            .take_while(|t| *t < now)
            .filter(|t| !recorded.contains_key(t));
        let rows: Vec<NewOccurrence> = instants
            .by_ref()
            .take(MAX_SUPERSEDED)
            .map(|at| {
                let canceled = campanile_core::OccurrenceState::Canceled;
                new_occurrence(id, record.version, &record.spec, at, at, canceled)
            })
            .collect();
        // The rest, counted up to a bound (a definition firing every second for years).
        let rest = instants.next().map(|first| {
            let mut last = first;
            let mut count = 1u64;
            let mut exact = true;
            for t in instants.by_ref() {
                last = t;
                count += 1;
                if count >= MAX_SUPERSEDED_COUNTED {
                    exact = instants.next().is_none();
                    break;
                }
            }
            let last = if exact {
                last
            } else {
                now.checked_sub(SignedDuration::from_millis(1))
                    .unwrap_or(now)
            };
            MissedRange {
                schedule_id: id,
                version: record.version,
                first_at: first,
                last_at: last,
                count,
                count_exact: exact,
                superseded: true,
            }
        });
        Ok(Superseded {
            version: record.version,
            rows,
            rest,
        })
    }

    /// Pauses, resumes (`to = Active`) or cancels.
    ///
    /// # Errors
    ///
    /// [`StoreError::NotFound`] / [`StoreError::WrongState`] inside [`PlannerError::Store`].
    pub async fn transition(
        &self,
        tenant: TenantId,
        id: ScheduleId,
        to: ScheduleState,
        now: Option<Timestamp>,
    ) -> Result<(ScheduleView, ScheduleChange), PlannerError> {
        let now = now_of(self.store.as_ref(), now).await?;
        let cancel = to == ScheduleState::Canceled;
        let change = self
            .superseding(tenant, id, now, cancel, |superseded| {
                self.store.schedule_transition(ScheduleTransition {
                    tenant,
                    id,
                    to,
                    superseded,
                    now: Some(now),
                })
            })
            .await?;
        Ok((Self::view(change.schedule.clone(), now), change))
    }

    /// Backfills `[from, to)` of the schedule's current version: its calendar's instants in
    /// that range (at most [`rules::BACKFILL_MAX`]; more is `Invalid`) made into occurrences
    /// by [`Store::schedule_backfill`]. A change landing between the read and the backfill
    /// is a `VersionConflict` (nothing of the old version is made): send it again.
    ///
    /// # Errors
    ///
    /// [`StoreError`]s of [`Store::schedule_backfill`] inside [`PlannerError::Store`].
    #[allow(clippy::too_many_arguments)]
    pub async fn backfill(
        &self,
        tenant: TenantId,
        id: ScheduleId,
        from: Timestamp,
        to: Timestamp,
        overlap: Option<campanile_core::Overlap>,
        key: Option<String>,
        now: Option<Timestamp>,
    ) -> Result<Backfilled, PlannerError> {
        let rec = self
            .store
            .schedule_get(ScheduleGet { tenant, id })
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("schedule {}", id.0)))?;
        let cal = calendar_of(&rec.spec)?;
        // Instants are stored to the millisecond: so is the range.
        let ms = |t: Timestamp| Timestamp::from_millisecond(t.as_millisecond()).unwrap_or(t);
        let (from, to) = (ms(from), ms(to));
        let start = from
            .checked_sub(SignedDuration::from_nanos(1))
            .unwrap_or(from);
        let instants: Vec<Timestamp> = cal
            .iter_after(start)
            .take_while(|t| *t < to)
            .take(rules::BACKFILL_MAX + 1)
            .collect();
        Ok(self
            .store
            .schedule_backfill(ScheduleBackfill {
                tenant,
                id,
                version: rec.version,
                from,
                to,
                instants,
                overlap,
                key,
                now,
            })
            .await?)
    }
}
