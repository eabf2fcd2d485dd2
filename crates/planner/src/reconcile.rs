//! Offline reconciliation: recompute, from a schedule's versions and their calendars, the
//! instants that should have an occurrence in a time range, and classify every one by what
//! the store recorded — or as `MISSING`, which is a bug.
//!
//! What is expected: version `v` (a definition that took effect at `created_at(v)`) expects
//! its calendar's instants from `created_at(v)` (a one-off instant: whenever it is) up to the
//! next version's `created_at`; the version that cancels a schedule expects nothing. An
//! instant is classified by the occurrences recorded for it under any version (a pause retires
//! an occurrence as `CANCELED` under the old version and the new one plans it again on
//! resume), the summaries of long misfire gaps, and where the schedule's planning stands:
//! an instant at or after that position, or after `now`, is not planned yet, which is not a
//! loss; one with no row inside the range of planned instants retention archived
//! (the schedule's rollups) is archived. An occurrence at an instant its own version's calendar does not fire is reported as
//! unexpected, and so is one of a version superseded (updated, paused, canceled) before its
//! instant that is not `CANCELED`: the change promised that nothing more of that version runs.
//! An occurrence a backfill made is an instant of its version's calendar run after the fact:
//! it accounts for its instant by its state (and is counted); one an operator triggered is
//! not an instant of the calendar and is left out.

use std::collections::{BTreeMap, HashMap};

use campanile_calendar::Calendar;
use campanile_core::{OccurrenceState, ScheduleId};
use campanile_store::SchedulePosition;
use campanile_store::{
    MissedRange, MissedRangeList, OccurrenceList, Origin, RollupList, ScheduleGet, ScheduleRecord,
    ScheduleState, Store, StoreError, TenantId, Timing,
};
use jiff::{SignedDuration, Timestamp};

use crate::{PlannerError, calendar_of};

/// What each expected instant turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// Its occurrence succeeded.
    Succeeded,
    /// Its occurrence is a dead letter.
    Failed,
    /// Its occurrence was canceled (by the schedule's update, pause or cancel, or on its own).
    Canceled,
    /// Recorded as missed: a `MISSED` occurrence or inside a summarized misfire gap.
    Missed,
    /// Skipped by the overlap policy.
    Skipped,
    /// Planned and not finished: scheduled, ready, running or waiting to retry.
    Pending,
    /// Finished and archived by retention: no row is left, and the schedule's rollups count
    /// an occurrence of that day within a range of planned instants that holds it.
    Archived,
    /// Not planned yet: at or after where the schedule's planning stands, or in the future.
    NotPlannedYet,
    /// Not planned yet although the schedule is active and the instant is older than the
    /// range's `stall_after`: planning of this schedule is stuck (a finding).
    Stalled,
    /// Should have an occurrence and has none, nor any record of why: a bug.
    Missing,
}

impl Class {
    /// Every class, in report order.
    pub const ALL: [Class; 10] = [
        Class::Succeeded,
        Class::Failed,
        Class::Canceled,
        Class::Missed,
        Class::Skipped,
        Class::Pending,
        Class::Archived,
        Class::NotPlannedYet,
        Class::Stalled,
        Class::Missing,
    ];

    /// The name in reports (`snake_case`).
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Succeeded => "succeeded",
            Class::Failed => "failed",
            Class::Canceled => "canceled",
            Class::Missed => "missed",
            Class::Skipped => "skipped",
            Class::Pending => "pending",
            Class::Archived => "archived",
            Class::NotPlannedYet => "not_planned_yet",
            Class::Stalled => "stalled",
            Class::Missing => "missing",
        }
    }

    fn of(state: OccurrenceState) -> Class {
        match state {
            OccurrenceState::Succeeded => Class::Succeeded,
            OccurrenceState::Dead => Class::Failed,
            OccurrenceState::Canceled => Class::Canceled,
            OccurrenceState::Missed => Class::Missed,
            OccurrenceState::SkippedOverlap => Class::Skipped,
            _ => Class::Pending,
        }
    }
}

/// The time range to reconcile.
#[derive(Debug, Clone, Copy)]
pub struct Range {
    /// Instants at or after this.
    pub from: Timestamp,
    /// Instants before this.
    pub to: Timestamp,
    /// The present: later instants are not expected to be planned yet.
    pub now: Timestamp,
    /// At most this many expected instants per schedule; past it the result says `truncated`
    /// and covers the range up to `covered_to`.
    pub max_instants: usize,
    /// An active schedule's unplanned instant older than `now` minus this is `Stalled`, not
    /// lag: planning runs a horizon ahead, so even a planner recovering from an outage
    /// reaches it within minutes.
    pub stall_after: SignedDuration,
}

/// One instant worth reporting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The version that expects it (missing) or that planned it (unexpected).
    pub version: u32,
    /// The instant.
    pub scheduled_for: Timestamp,
    /// The recorded state (unexpected occurrences).
    pub state: Option<OccurrenceState>,
}

/// A day whose archived instants outnumber what retention counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    /// The UTC day (its midnight).
    pub day: Timestamp,
    /// Expected instants of that day classified archived.
    pub instants: u64,
    /// Occurrences of that day the rollups count.
    pub archived: u64,
}

/// One schedule's reconciliation.
#[derive(Debug, Clone)]
pub struct Reconciliation {
    /// The schedule.
    pub schedule_id: ScheduleId,
    /// Expected instants per class.
    pub counts: BTreeMap<Class, u64>,
    /// Expected instants with no occurrence and no record of why.
    pub missing: Vec<Finding>,
    /// Expected instants of an active schedule left unplanned for longer than `stall_after`.
    pub stalled: Vec<Finding>,
    /// Occurrences at instants their version's calendar does not fire, or planned under a
    /// version that was superseded before their instant (and not canceled).
    pub unexpected: Vec<Finding>,
    /// Days where more expected instants have no row left than retention archived
    /// occurrences (by the rollups: every version and state counted): some of those instants
    /// had no occurrence before retention ran, which the archive cannot tell apart.
    pub archive_shortfall: Vec<Shortfall>,
    /// Occurrences in the range a backfill made (`POST /v1/schedules/{id}/backfill`); each
    /// accounts for its instant by its state, like a planned one.
    pub backfilled: u64,
    /// Whether `max_instants` cut the range short.
    pub truncated: bool,
    /// The range actually covered ends here (the range's end unless truncated).
    pub covered_to: Timestamp,
}

impl Reconciliation {
    /// Whether anything is wrong: a missing or an unexpected occurrence.
    pub fn has_problems(&self) -> bool {
        !self.missing.is_empty()
            || !self.unexpected.is_empty()
            || !self.stalled.is_empty()
            || !self.archive_shortfall.is_empty()
    }
}

/// Reconciles one schedule of `tenant` over `range`.
///
/// # Errors
///
/// [`StoreError::NotFound`] (inside [`PlannerError::Store`]) for a schedule the tenant does
/// not have; store failures; a stored definition whose calendar no longer builds (e.g. a time
/// zone the system database lost).
pub async fn reconcile(
    store: &dyn Store,
    tenant: TenantId,
    id: ScheduleId,
    range: &Range,
) -> Result<Reconciliation, PlannerError> {
    // Instants are stored to the millisecond: so is the range, or an instant in the last
    // millisecond before a finer `to` would be expected and its row not read.
    let ms = |t: Timestamp| Timestamp::from_millisecond(t.as_millisecond()).unwrap_or(t);
    let range = &Range {
        from: ms(range.from),
        to: ms(range.to),
        now: ms(range.now),
        max_instants: range.max_instants,
        stall_after: range.stall_after,
    };
    // The schedule and its versions, read again if a change landed between the reads (they
    // are not one snapshot).
    let get = ScheduleGet { tenant, id };
    let mut reads = 0;
    let (record, versions) = loop {
        reads += 1;
        let record = store
            .schedule_get(get.clone())
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("schedule {id}")))?;
        let versions = store.schedule_versions(get.clone()).await?;
        let again = store.schedule_get(get.clone()).await?;
        if versions.last().map(|v| v.version) == Some(record.version) && unchanged(&record, again) {
            break (record, versions);
        }
        if reads >= 5 {
            return Err(changing(id, reads));
        }
    };
    let calendars: HashMap<u32, Calendar> = versions
        .iter()
        .map(|v| Ok((v.version, calendar_of(&v.spec)?)))
        .collect::<Result<_, PlannerError>>()?;

    // The expected instants, each with the version that expects it and whether it falls on
    // that version's first millisecond (the definition took effect within that millisecond,
    // so whether it planned the instant is not decidable from the stored instants).
    let mut expected: BTreeMap<Timestamp, (u32, bool)> = BTreeMap::new();
    let mut covered_to = range.to;
    let mut truncated = false;
    for (i, v) in versions.iter().enumerate() {
        let next = versions.get(i + 1).map(|n| n.created_at);
        if next.is_none() && record.state == ScheduleState::Canceled {
            break; // The cancel's own version expects nothing.
        }
        let one_off = matches!(v.spec.timing, Timing::At(_));
        let low = if one_off {
            range.from
        } else {
            range.from.max(v.created_at)
        };
        let high = next.map_or(covered_to, |n| n.min(covered_to));
        let Some(cal) = calendars.get(&v.version) else {
            continue;
        };
        let start = low
            .checked_sub(SignedDuration::from_nanos(1))
            .unwrap_or(low);
        for at in cal.iter_after(start).take_while(|t| *t < high) {
            if expected.len() >= range.max_instants && !expected.contains_key(&at) {
                truncated = true;
                covered_to = at;
                break;
            }
            let boundary = !one_off && at == v.created_at;
            expected.entry(at).or_insert((v.version, boundary));
        }
    }
    expected.retain(|t, _| *t < covered_to);

    let (recorded, backfilled) =
        counted(store, tenant, id, (range.from, covered_to), range.now).await?;
    let gaps = store
        .missed_range_list(MissedRangeList {
            tenant,
            schedule_id: id,
        })
        .await?;
    let gap_of = |t: Timestamp| {
        gaps.iter()
            .find(|g: &&MissedRange| g.first_at <= t && t <= g.last_at)
    };
    // What retention archived: an instant with no row left inside a rollup's range of
    // planned instants was archived (rollups never span a day, and a schedule's rows leave
    // oldest first, so the ranges are dense).
    let rollups = store
        .rollup_list(RollupList {
            tenant,
            schedule_id: id,
        })
        .await?;
    let archived = |t: Timestamp| rollups.iter().any(|r| r.first_at <= t && t <= r.last_at);

    // Where planning stands (later instants are not planned yet), read only when an instant
    // due by now has no record at all: an active schedule's position is a scan of its shard's
    // planning queue, and a healthy schedule has a record for everything due.
    let unrecorded = expected.keys().any(|at| {
        *at <= range.now && !recorded.contains_key(at) && gap_of(*at).is_none() && !archived(*at)
    });
    let position = match record.state {
        ScheduleState::Active if unrecorded => {
            let position = store
                .schedule_position(SchedulePosition { tenant, id })
                .await?;
            if !unchanged(&record, store.schedule_get(get).await?) {
                return Err(changing(id, reads + 1));
            }
            position
        }
        ScheduleState::Paused => record.next_run_at,
        _ => None,
    };

    let mut out = Reconciliation {
        schedule_id: id,
        counts: BTreeMap::new(),
        missing: Vec::new(),
        stalled: Vec::new(),
        unexpected: Vec::new(),
        archive_shortfall: Vec::new(),
        backfilled,
        truncated,
        covered_to,
    };
    let mut archived_by_day: BTreeMap<i64, u64> = BTreeMap::new();
    for (&at, &(version, boundary)) in &expected {
        let class = match recorded.get(&at) {
            Some(found) => found
                .iter()
                .filter(|(_, s)| *s != OccurrenceState::Canceled)
                .max_by_key(|(v, _)| *v)
                .map_or(Class::Canceled, |(_, s)| Class::of(*s)),
            None => match gap_of(at) {
                // A summarized gap: judged late by the misfire policy, or superseded by a
                // change.
                Some(g) if g.superseded => Class::Canceled,
                Some(_) => Class::Missed,
                None if archived(at) => {
                    *archived_by_day.entry(day_of(at)).or_default() += 1;
                    Class::Archived
                }
                None if at > range.now => Class::NotPlannedYet,
                None if position.is_some_and(|p| at >= p) => {
                    let stuck = record.state == ScheduleState::Active
                        && range
                            .now
                            .checked_sub(range.stall_after)
                            .is_ok_and(|limit| at < limit);
                    if stuck {
                        out.stalled.push(Finding {
                            version,
                            scheduled_for: at,
                            state: None,
                        });
                        Class::Stalled
                    } else {
                        Class::NotPlannedYet
                    }
                }
                None if boundary => continue,
                None => {
                    out.missing.push(Finding {
                        version,
                        scheduled_for: at,
                        state: None,
                    });
                    Class::Missing
                }
            },
        };
        *out.counts.entry(class).or_default() += 1;
    }
    for (day, instants) in archived_by_day {
        // The day's rollups whose instants reach into the range.
        let counted: u64 = rollups
            .iter()
            .filter(|r| r.day.as_millisecond() == day)
            .filter(|r| r.last_at >= range.from && r.first_at < covered_to)
            .map(|r| r.count)
            .sum();
        if instants > counted {
            out.archive_shortfall.push(Shortfall {
                day: Timestamp::from_millisecond(day).unwrap_or(Timestamp::UNIX_EPOCH),
                instants,
                archived: counted,
            });
        }
    }
    // When each version was superseded: the next version's start.
    let superseded_at: HashMap<u32, Timestamp> = versions
        .windows(2)
        .map(|w| (w[0].version, w[1].created_at))
        .collect();
    for (&at, found) in &recorded {
        for &(version, state) in found {
            let fires = calendars.get(&version).is_some_and(|cal| {
                let before = at.checked_sub(SignedDuration::from_nanos(1)).unwrap_or(at);
                cal.next_after(before) == Some(at)
            });
            // A version superseded before this instant plans nothing for it: the change
            // canceled what it had planned (a worker's run is only flagged, and a run is only
            // claimed once due, before the change). Anything else was planned, or kept,
            // after the change answered.
            let after_superseded = superseded_at.get(&version).is_some_and(|s| *s < at);
            if (!fires || after_superseded) && state != OccurrenceState::Canceled {
                out.unexpected.push(Finding {
                    version,
                    scheduled_for: at,
                    state: Some(state),
                });
            }
        }
    }
    Ok(out)
}

/// The UTC midnight of `t`, in milliseconds (the rollups' day).
fn day_of(t: Timestamp) -> i64 {
    let ms = t.as_millisecond();
    ms - ms.rem_euclid(86_400_000)
}

/// Whether the schedule read `again` is still the one `record` describes (a change bumps the
/// version; a resume keeps it and changes the state).
fn unchanged(record: &ScheduleRecord, again: Option<ScheduleRecord>) -> bool {
    again.is_some_and(|a| a.version == record.version && a.state == record.state)
}

fn changing(id: ScheduleId, reads: u32) -> PlannerError {
    PlannerError::Invalid(format!(
        "schedule {id} changed during each of {reads} reads; reconcile it again"
    ))
}

/// Per instant, each recorded occurrence's version and state.
type Recorded = BTreeMap<Timestamp, Vec<(u32, OccurrenceState)>>;

/// The schedule's occurrences in `[from, to)`: per instant, each one's version and state.
pub(crate) async fn occurrences(
    store: &dyn Store,
    tenant: TenantId,
    id: ScheduleId,
    from: Timestamp,
    to: Timestamp,
    now: Timestamp,
) -> Result<Recorded, PlannerError> {
    Ok(counted(store, tenant, id, (from, to), now).await?.0)
}

/// [`occurrences`], with how many of them a backfill made.
async fn counted(
    store: &dyn Store,
    tenant: TenantId,
    id: ScheduleId,
    (from, to): (Timestamp, Timestamp),
    now: Timestamp,
) -> Result<(Recorded, u64), PlannerError> {
    const PAGE: u32 = 1_000;
    let mut out: Recorded = BTreeMap::new();
    let mut backfilled = 0;
    let mut after = None;
    loop {
        let page = store
            .occurrence_list(OccurrenceList {
                tenant,
                schedule_id: Some(id),
                state: None,
                from: Some(from),
                to: Some(to),
                after,
                limit: PAGE,
                now: Some(now),
            })
            .await?;
        // Runs an operator triggered are no instant of the calendar: not expected, not
        // unexpected. A backfill's are instants of their version's calendar, run after the
        // fact: they account for their instant like a planned one.
        for o in page.iter().filter(|o| o.origin != Origin::Manual) {
            backfilled += u64::from(o.origin == Origin::Backfill);
            out.entry(o.scheduled_for)
                .or_default()
                .push((o.version, o.state));
        }
        match page.last() {
            Some(last) if page.len() == PAGE as usize => {
                after = Some((last.scheduled_for, last.id));
            }
            _ => return Ok((out, backfilled)),
        }
    }
}
