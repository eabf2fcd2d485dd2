//! The pure planning decision for one schedule version.
//!
//! Given where planning stands (`next_run_at`, the first instant not yet planned), `now`
//! and the horizon, decide which instants become runs, which become `MISSED` records, and
//! where planning continues. Late instants — older than `now - max_lateness` — follow the
//! misfire policy; nothing is dropped without a record, and the work and rows spent on a long
//! outage are bounded.

use std::collections::VecDeque;

use campanile_calendar::Calendar;
use campanile_core::{OccurrenceState, ScheduleId, flex_offset, occurrence_id};
use campanile_store::{MissedRange, NewOccurrence, PrePlanned, ScheduleSpec};
use jiff::{SignedDuration, Timestamp};

/// Most runs one schedule gets per planning pass; the rest waits for the next pass.
pub const MAX_RUNS_PER_PASS: usize = 10_000;
/// Up to this many missed instants are recorded one `MISSED` occurrence each; beyond it, one
/// summary record with a count and a range.
pub const MISSED_ROWS_MAX: u64 = 1_000;
/// Late instants counted one by one at most; beyond it the count is a lower bound and the
/// planner jumps to the end of the gap.
pub const LATE_SCAN_MAX: u64 = 1_000_000;

/// The planning decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// Occurrences to insert: runs (`READY`) and records (`MISSED`).
    pub occurrences: Vec<NewOccurrence>,
    /// A summary of a gap too long to record instant by instant.
    pub missed: Option<MissedRange>,
    /// Where planning continues (`None`: the calendar has no more instants).
    pub next_run_at: Option<Timestamp>,
}

/// One schedule version's planning input.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// Schedule.
    pub id: ScheduleId,
    /// Version being planned.
    pub version: u32,
    /// Its definition.
    pub spec: &'a ScheduleSpec,
    /// Its calendar.
    pub calendar: &'a Calendar,
    /// The first instant not yet planned.
    pub next_run_at: Timestamp,
    /// The planner's clock.
    pub now: Timestamp,
    /// How far ahead to plan.
    pub horizon: SignedDuration,
}

fn occurrence(
    input: &Input<'_>,
    at: Timestamp,
    available_at: Timestamp,
    state: OccurrenceState,
) -> NewOccurrence {
    new_occurrence(input.id, input.version, input.spec, at, available_at, state)
}

/// The occurrence of version `version` of schedule `id` (definition `s`) at `at`.
pub(crate) fn new_occurrence(
    id: ScheduleId,
    version: u32,
    s: &ScheduleSpec,
    at: Timestamp,
    available_at: Timestamp,
    state: OccurrenceState,
) -> NewOccurrence {
    NewOccurrence {
        schedule_id: id,
        version,
        scheduled_for: at,
        available_at,
        queue: s.queue.clone(),
        priority: s.priority,
        max_attempts: s.max_attempts,
        backoff_initial: s.backoff_initial,
        backoff_max: s.backoff_max,
        state,
        overlap: s.overlap,
        lease: s.lease,
    }
}

fn add(t: Timestamp, d: SignedDuration) -> Timestamp {
    t.checked_add(d).unwrap_or(if d.is_negative() {
        Timestamp::MIN
    } else {
        Timestamp::MAX
    })
}

/// The last `k` instants of `cal` strictly before `cutoff` and at or after `floor`, found by
/// looking back over doubling windows so that the work is bounded by the density of the
/// calendar, not by the length of the gap.
fn latest_before(
    cal: &Calendar,
    cutoff: Timestamp,
    floor: Timestamp,
    k: usize,
) -> VecDeque<Timestamp> {
    let mut window = SignedDuration::from_hours(1);
    loop {
        let start = add(cutoff, -window).max(floor);
        let mut found = VecDeque::with_capacity(k + 1);
        let mut t = if start == floor {
            Some(floor)
        } else {
            cal.next_after(add(start, SignedDuration::from_nanos(-1)))
        };
        let mut scanned = 0u64;
        while let Some(x) = t {
            if x >= cutoff || scanned >= LATE_SCAN_MAX {
                break;
            }
            found.push_back(x);
            if found.len() > k {
                found.pop_front();
            }
            scanned += 1;
            t = cal.next_after(x);
        }
        if found.len() >= k || start == floor || window > SignedDuration::from_hours(24 * 366 * 500)
        {
            return found;
        }
        window = window.checked_mul(2).unwrap_or(SignedDuration::MAX);
    }
}

/// Plans one schedule version. Pure: the same input gives the same output on every node.
pub fn plan(input: &Input<'_>) -> Planned {
    let cal = input.calendar;
    let misfire = input.spec.misfire;
    let cutoff = add(input.now, -misfire.max_lateness());
    let end = add(input.now, input.horizon);
    let keep = misfire.runs() as usize;

    // Phase 1: late instants. Keep the first few (for individual records) and the last
    // `keep + 1` (the runs, and the last one that does not run).
    let mut late_count = 0u64;
    let mut exact = true;
    let mut first_late = None;
    let mut early: Vec<Timestamp> = Vec::new();
    let mut latest: VecDeque<Timestamp> = VecDeque::with_capacity(keep + 2);
    let mut t = Some(input.next_run_at);
    while let Some(x) = t {
        if x >= cutoff {
            break;
        }
        late_count += 1;
        first_late.get_or_insert(x);
        if early.len() < MISSED_ROWS_MAX as usize + keep {
            early.push(x);
        }
        latest.push_back(x);
        if latest.len() > keep + 1 {
            latest.pop_front();
        }
        if late_count >= LATE_SCAN_MAX {
            // A gap too long to count: jump to its end, find its last instants by looking back.
            exact = false;
            latest = latest_before(cal, cutoff, x, keep + 1);
            t = cal.next_after(add(cutoff, SignedDuration::from_nanos(-1)));
            break;
        }
        t = cal.next_after(x);
    }

    let mut occurrences = Vec::new();
    let mut missed = None;
    if late_count > 0 {
        let runs: Vec<Timestamp> = latest
            .iter()
            .rev()
            .take(keep.min(late_count as usize))
            .rev()
            .copied()
            .collect();
        // Runs of late instants become available now, spaced by the catch-up interval.
        for (j, at) in runs.iter().enumerate() {
            let offset = misfire
                .interval()
                .checked_mul(j as i32)
                .unwrap_or(SignedDuration::MAX);
            occurrences.push(occurrence(
                input,
                *at,
                add(input.now, offset),
                OccurrenceState::Ready,
            ));
        }
        let not_run = late_count - runs.len() as u64;
        if not_run > 0 {
            if exact && not_run <= MISSED_ROWS_MAX {
                for at in early
                    .iter()
                    .filter(|a| !runs.contains(a))
                    .take(not_run as usize)
                {
                    occurrences.push(occurrence(input, *at, *at, OccurrenceState::Missed));
                }
            } else {
                let last_not_run = latest
                    .iter()
                    .rev()
                    .nth(runs.len())
                    .copied()
                    .or(first_late)
                    .unwrap_or(input.next_run_at);
                missed = Some(MissedRange {
                    schedule_id: input.id,
                    version: input.version,
                    first_at: first_late.unwrap_or(input.next_run_at),
                    last_at: last_not_run,
                    count: not_run,
                    count_exact: exact,
                    superseded: false,
                });
            }
        }
    }

    // Phase 2: instants on time (past but not late, or within the horizon).
    let window = input.spec.flex_window;
    let mut runs = 0;
    while let Some(x) = t {
        if x > end || runs >= MAX_RUNS_PER_PASS {
            break;
        }
        let id = occurrence_id(input.id, input.version, x);
        occurrences.push(occurrence(
            input,
            x,
            add(x, flex_offset(id, window)),
            OccurrenceState::Ready,
        ));
        runs += 1;
        t = cal.next_after(x);
    }
    Planned {
        occurrences,
        missed,
        next_run_at: t,
    }
}

/// The misfire decision for occurrences planned before an outage (see
/// [`campanile_store::Store::shard_acquire`]): which of `p.instants` to record `MISSED`.
///
/// The same rule as [`plan`]'s, over the union of these instants and the late instants the
/// planner has not planned yet (which all come after them): an instant is late if it is older
/// than `now - max_lateness`; of the late ones, the policy's `runs()` latest run. The planner
/// gives its own late instants those runs first, so only what it leaves is kept here. Work
/// is bounded by the runs kept, not by the length of the outage. `calendar` is `None` when
/// the version has none any more (a zone gone from the system): the planner plans nothing
/// more of it, so nothing of its own takes the runs.
pub fn preplanned_missed(p: &PrePlanned<'_>, calendar: Option<&Calendar>) -> Vec<Timestamp> {
    let misfire = p.spec.misfire;
    let cutoff = add(p.now, -misfire.max_lateness());
    let late: Vec<Timestamp> = p.instants.iter().copied().filter(|t| *t < cutoff).collect();
    if late.is_empty() {
        return late;
    }
    let keep = misfire.runs() as usize;
    let mut theirs = 0;
    let mut t = calendar.and_then(|c| c.next_after(p.planned_through));
    while theirs < keep {
        match t {
            Some(x) if x < cutoff => {
                theirs += 1;
                t = calendar.and_then(|c| c.next_after(x));
            }
            _ => break,
        }
    }
    let ours = keep - theirs;
    let n = late.len().saturating_sub(ours);
    late[..n].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use campanile_core::{Misfire, Overlap};
    use campanile_store::Timing;

    fn spec(misfire: Misfire) -> ScheduleSpec {
        ScheduleSpec {
            timing: Timing::At(Timestamp::UNIX_EPOCH),
            queue: "q".into(),
            payload: None,
            priority: 0,
            lease: SignedDuration::from_secs(30),
            max_attempts: 3,
            backoff_initial: SignedDuration::from_secs(1),
            backoff_max: SignedDuration::from_secs(10),
            misfire,
            overlap: Overlap::Allow,
            flex_window: SignedDuration::ZERO,
        }
    }

    fn s(n: i64) -> Timestamp {
        Timestamp::from_second(n).expect("in range")
    }

    fn run(misfire: Misfire, every: i64, from: i64, now: i64) -> Planned {
        let spec = spec(misfire);
        let cal = Calendar::every(SignedDuration::from_secs(every), s(from)).expect("valid");
        plan(&Input {
            id: ScheduleId(uuid::Uuid::nil()),
            version: 1,
            spec: &spec,
            calendar: &cal,
            next_run_at: s(from),
            now: s(now),
            horizon: SignedDuration::from_secs(15),
        })
    }

    fn summary(p: &Planned) -> Vec<(i64, OccurrenceState, i64)> {
        let mut v: Vec<_> = p
            .occurrences
            .iter()
            .map(|o| {
                (
                    o.scheduled_for.as_second(),
                    o.state,
                    o.available_at.as_second(),
                )
            })
            .collect();
        v.sort_by_key(|x| (x.0, x.2));
        v
    }

    #[test]
    fn the_seed_example_fire_once_runs_only_the_latest() {
        // Every 10 s from t=20; down until t=58 with 5 s lateness: 20, 30, 40, 50 are late.
        let p = run(
            Misfire::FireOnce {
                max_lateness: SignedDuration::from_secs(5),
            },
            10,
            20,
            58,
        );
        assert_eq!(
            summary(&p),
            vec![
                (20, OccurrenceState::Missed, 20),
                (30, OccurrenceState::Missed, 30),
                (40, OccurrenceState::Missed, 40),
                (50, OccurrenceState::Ready, 58),
                (60, OccurrenceState::Ready, 60),
                (70, OccurrenceState::Ready, 70),
            ]
        );
        assert_eq!(p.next_run_at, Some(s(80)));
        assert_eq!(p.missed, None);
    }

    #[test]
    fn skip_records_every_late_instant_and_runs_the_timely_ones() {
        let p = run(
            Misfire::Skip {
                max_lateness: SignedDuration::from_secs(5),
            },
            10,
            20,
            58,
        );
        let states: Vec<_> = summary(&p).into_iter().map(|(t, st, _)| (t, st)).collect();
        assert_eq!(
            states,
            vec![
                (20, OccurrenceState::Missed),
                (30, OccurrenceState::Missed),
                (40, OccurrenceState::Missed),
                (50, OccurrenceState::Missed),
                (60, OccurrenceState::Ready),
                (70, OccurrenceState::Ready)
            ]
        );
        // An instant past but within the lateness (55 when now is 58 with 5 s) runs at once.
        let p = run(
            Misfire::Skip {
                max_lateness: SignedDuration::from_secs(5),
            },
            5,
            20,
            58,
        );
        assert!(summary(&p).contains(&(55, OccurrenceState::Ready, 55)));
    }

    #[test]
    fn catchup_runs_the_k_latest_spaced_by_the_interval() {
        let m = Misfire::Catchup {
            max_lateness: SignedDuration::from_secs(5),
            max: 2,
            interval: SignedDuration::from_secs(3),
        };
        let p = run(m, 10, 20, 58);
        let v = summary(&p);
        assert!(v.contains(&(40, OccurrenceState::Ready, 58)), "{v:?}");
        assert!(v.contains(&(50, OccurrenceState::Ready, 61)), "{v:?}");
        assert!(
            v.contains(&(20, OccurrenceState::Missed, 20))
                && v.contains(&(30, OccurrenceState::Missed, 30))
        );
    }

    #[test]
    fn a_long_gap_is_one_summary_not_a_million_rows() {
        // Every second for three days: 259,200 late instants.
        let p = run(
            Misfire::FireOnce {
                max_lateness: SignedDuration::from_secs(60),
            },
            1,
            0,
            3 * 86_400,
        );
        let late_runs: Vec<_> = p
            .occurrences
            .iter()
            .filter(|o| o.scheduled_for < s(3 * 86_400 - 60))
            .collect();
        assert_eq!(late_runs.len(), 1);
        assert_eq!(late_runs[0].scheduled_for, s(3 * 86_400 - 61));
        assert!(
            p.occurrences
                .iter()
                .all(|o| o.state == OccurrenceState::Ready)
        );
        let m = p.missed.expect("summary");
        assert_eq!(
            (m.first_at, m.last_at, m.count, m.count_exact),
            (s(0), s(3 * 86_400 - 62), 3 * 86_400 - 61, true)
        );
        // Runs in the window [now - 60 s, now + 15 s]: 76.
        assert_eq!(p.occurrences.len(), 1 + 76);
    }

    #[test]
    fn an_enormous_gap_is_counted_as_a_lower_bound_with_bounded_work() {
        // Every second for 40 days: 3.4 M late instants, more than LATE_SCAN_MAX.
        let now = 40 * 86_400;
        let p = run(
            Misfire::Catchup {
                max_lateness: SignedDuration::from_secs(60),
                max: 2,
                interval: SignedDuration::ZERO,
            },
            1,
            0,
            now,
        );
        let m = p.missed.expect("summary");
        assert!(!m.count_exact);
        assert!(m.count >= LATE_SCAN_MAX - 2);
        let late: Vec<i64> = p
            .occurrences
            .iter()
            .filter(|o| o.scheduled_for < s(now - 60))
            .map(|o| o.scheduled_for.as_second())
            .collect();
        assert_eq!(
            late,
            vec![now - 62, now - 61],
            "the two latest late instants run"
        );
        assert_eq!(m.last_at, s(now - 63));
        assert_eq!(p.next_run_at, Some(s(now + 16)));
    }

    #[test]
    fn flexible_windows_move_availability_deterministically_and_strict_never() {
        let mut sp = spec(Misfire::default());
        sp.flex_window = SignedDuration::from_secs(30);
        let cal = Calendar::every(SignedDuration::from_secs(60), s(0)).expect("valid");
        let input = Input {
            id: ScheduleId(uuid::Uuid::nil()),
            version: 1,
            spec: &sp,
            calendar: &cal,
            next_run_at: s(60),
            now: s(0),
            horizon: SignedDuration::from_secs(600),
        };
        let a = plan(&input);
        assert_eq!(a, plan(&input), "deterministic");
        assert!(
            a.occurrences
                .iter()
                .all(|o| o.available_at >= o.scheduled_for
                    && o.available_at < add(o.scheduled_for, SignedDuration::from_secs(30)))
        );
        assert!(
            a.occurrences
                .iter()
                .any(|o| o.available_at != o.scheduled_for)
        );
        let strict = plan(&Input {
            spec: &spec(Misfire::default()),
            ..input
        });
        assert!(
            strict
                .occurrences
                .iter()
                .all(|o| o.available_at == o.scheduled_for)
        );
    }

    #[test]
    fn nothing_late_means_no_records() {
        let p = run(Misfire::default(), 10, 100, 95);
        assert_eq!(
            summary(&p).iter().map(|x| x.0).collect::<Vec<_>>(),
            vec![100, 110]
        );
        assert_eq!(p.next_run_at, Some(s(120)));
    }

    /// Splits the seed's outage: 20 and 30 were planned before it, 40 and 50 were not.
    fn split(misfire: Misfire) -> (Vec<i64>, Planned) {
        let spec = spec(misfire);
        let cal = Calendar::every(SignedDuration::from_secs(10), s(20)).expect("valid");
        let pre = [s(20), s(30)];
        let missed = preplanned_missed(
            &PrePlanned {
                schedule_id: ScheduleId(uuid::Uuid::nil()),
                version: 1,
                spec: &spec,
                planned_through: s(30),
                instants: &pre,
                now: s(58),
            },
            Some(&cal),
        );
        let planned = plan(&Input {
            id: ScheduleId(uuid::Uuid::nil()),
            version: 1,
            spec: &spec,
            calendar: &cal,
            next_run_at: s(40),
            now: s(58),
            horizon: SignedDuration::from_secs(15),
        });
        (missed.iter().map(|t| t.as_second()).collect(), planned)
    }

    #[test]
    fn the_seed_example_holds_when_the_outage_struck_after_planning() {
        let lateness = SignedDuration::from_secs(5);
        let (missed, p) = split(Misfire::FireOnce {
            max_lateness: lateness,
        });
        assert_eq!(missed, vec![20, 30], "the planner's own 50 is the latest");
        assert_eq!(
            summary(&p)[..2],
            [
                (40, OccurrenceState::Missed, 40),
                (50, OccurrenceState::Ready, 58)
            ]
        );
        // CATCHUP(3): the planner runs 40 and 50; one run is left for the latest planned, 30.
        let (missed, _) = split(Misfire::Catchup {
            max_lateness: lateness,
            max: 3,
            interval: SignedDuration::ZERO,
        });
        assert_eq!(missed, vec![20]);
        let (missed, _) = split(Misfire::Skip {
            max_lateness: lateness,
        });
        assert_eq!(missed, vec![20, 30]);
        // Without a calendar the planner plans nothing more: the planned ones take the runs.
        let spec = spec(Misfire::FireOnce {
            max_lateness: lateness,
        });
        let pre = [s(20), s(30), s(55)];
        let p = PrePlanned {
            schedule_id: ScheduleId(uuid::Uuid::nil()),
            version: 1,
            spec: &spec,
            planned_through: s(55),
            instants: &pre,
            now: s(58),
        };
        assert_eq!(preplanned_missed(&p, None), vec![s(20)], "55 is not late");
    }
}
