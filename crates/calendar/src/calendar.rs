//! The three kinds of calendar and `next_after`.

use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, Offset};
use jiff::{SignedDuration, Timestamp};

use crate::{CalendarError, CronExpr, DstFold, DstGap, DstPolicy, Zone};

/// When a schedule fires.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Calendar {
    /// A cron expression evaluated on the wall clock of an IANA zone, under a DST policy.
    Cron {
        /// The expression.
        expr: CronExpr,
        /// The zone whose wall clock the expression reads.
        zone: Zone,
        /// What to do in gaps and folds.
        dst: DstPolicy,
    },
    /// Exactly one instant.
    Once {
        /// The instant.
        at: Timestamp,
    },
    /// Every `period` of elapsed time from `anchor` (anchor included). Elapsed time knows no
    /// DST: an hourly interval fires 23 times on a spring-forward day.
    Every {
        /// The interval, always positive.
        period: SignedDuration,
        /// The first instant of the series.
        anchor: Timestamp,
    },
}

/// One firing instant, with a note when a DST rule shaped it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fire {
    /// The instant to fire at.
    pub at: Timestamp,
    /// Set when the DST contract decided something on the way to this instant.
    pub note: Option<FireNote>,
}

/// What the DST contract did on the way to a [`Fire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FireNote {
    /// Matching wall times fell in a gap and were skipped (`dst.gap = skip`); `wall` is the
    /// first of them. This fire is the first one after the gap.
    AfterSkippedGap {
        /// The first skipped wall time.
        wall: DateTime,
    },
    /// This fire stands for wall time(s) inside a gap, moved to the first instant after it
    /// (`dst.gap = shift`); `wall` is the first such wall time.
    ShiftedFromGap {
        /// The first wall time that did not exist.
        wall: DateTime,
    },
    /// The wall time occurs twice; this is the earlier instant.
    FoldEarlier,
    /// The wall time occurs twice; this is the later instant (`dst.fold = twice` only).
    FoldLater,
}

impl Calendar {
    /// A cron calendar: parses `expr` and looks up `zone`.
    ///
    /// # Errors
    ///
    /// Any [`CalendarError`] from [`CronExpr::parse`], or [`CalendarError::UnknownZone`].
    pub fn cron(expr: &str, zone: &str, dst: DstPolicy) -> Result<Calendar, CalendarError> {
        let expr = CronExpr::parse(expr)?;
        let zone = Zone::get(zone)?;
        Ok(Calendar::Cron { expr, zone, dst })
    }

    /// A one-off calendar.
    pub fn once(at: Timestamp) -> Calendar {
        Calendar::Once { at }
    }

    /// A fixed-interval calendar.
    ///
    /// # Errors
    ///
    /// [`CalendarError::NonPositiveInterval`] if `period` is zero or negative.
    pub fn every(period: SignedDuration, anchor: Timestamp) -> Result<Calendar, CalendarError> {
        if period <= SignedDuration::ZERO {
            return Err(CalendarError::NonPositiveInterval(format!("{period:#}")));
        }
        Ok(Calendar::Every { period, anchor })
    }

    /// The first instant strictly after `after` at which this calendar fires, or `None` if it
    /// never fires again.
    ///
    /// The planner calls this from the previously planned instant, never from "now", so no
    /// instant is skipped after downtime. Work is bounded for every input: a cron search
    /// stops 401 years past `after`.
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        self.next_fire(after).map(|f| f.at)
    }

    /// Like [`Calendar::next_after`], but also says what the DST contract did.
    pub fn next_fire(&self, after: Timestamp) -> Option<Fire> {
        match self {
            Calendar::Once { at } => (*at > after).then_some(Fire {
                at: *at,
                note: None,
            }),
            Calendar::Every { period, anchor } => {
                let at = if after < *anchor {
                    *anchor
                } else {
                    let p = period.as_nanos();
                    let k = (after.as_nanosecond() - anchor.as_nanosecond()).div_euclid(p) + 1;
                    Timestamp::from_nanosecond(anchor.as_nanosecond().checked_add(k * p)?).ok()?
                };
                Some(Fire { at, note: None })
            }
            Calendar::Cron { expr, zone, dst } => {
                let first = next_fire_once(expr, zone, dst.gap, after);
                if dst.fold == DstFold::Twice {
                    let late = next_fold_later(expr, zone, after, first.map(|f| f.at));
                    return match (first, late) {
                        (Some(a), Some(b)) if b.at < a.at => Some(b),
                        (None, Some(b)) => Some(b),
                        (a, _) => a,
                    };
                }
                first
            }
        }
    }

    /// The instants strictly after `after`, in increasing order.
    pub fn iter_after(&self, after: Timestamp) -> IterAfter<'_> {
        IterAfter {
            cal: self,
            cursor: after,
        }
    }
}

/// Iterator returned by [`Calendar::iter_after`].
#[derive(Debug)]
pub struct IterAfter<'a> {
    cal: &'a Calendar,
    cursor: Timestamp,
}

impl Iterator for IterAfter<'_> {
    type Item = Timestamp;
    fn next(&mut self) -> Option<Timestamp> {
        let at = self.cal.next_after(self.cursor)?;
        self.cursor = at;
        Some(at)
    }
}

fn civil(ts: Timestamp, offset: Offset) -> DateTime {
    offset.to_datetime(ts)
}

fn plus_second(dt: DateTime) -> Option<DateTime> {
    dt.checked_add(SignedDuration::from_secs(1)).ok()
}

/// The first transition strictly after `ts`.
fn transition_after(zone: &Zone, ts: Timestamp) -> Option<Timestamp> {
    zone.tz().following(ts).next().map(|t| t.timestamp())
}

/// The earliest non-"later fold" fire strictly after `after`.
///
/// Mapping each matching wall time to its instant — the only one, the earlier one in a fold,
/// the end of the gap under `shift` — is non-decreasing in wall time, so scanning wall times
/// upwards from the wall time of `after` and taking the first instant past `after` is exact.
fn next_fire_once(expr: &CronExpr, zone: &Zone, gap: DstGap, after: Timestamp) -> Option<Fire> {
    let tz = zone.tz();
    let start = tz.to_datetime(after);
    let limit_year = (i32::from(start.year()) + 401).min(9999);
    // Drop sub-seconds: candidates are whole seconds and must map past `after` anyway.
    let mut cursor = start.with().subsec_nanosecond(0).build().ok()?;
    let mut skipped: Option<DateTime> = None;
    loop {
        let c = expr.next_civil(cursor, limit_year)?;
        match tz.to_ambiguous_timestamp(c).offset() {
            AmbiguousOffset::Unambiguous { offset } => {
                let at = offset.to_timestamp(c).ok()?;
                if at > after {
                    let note = skipped.map(|wall| FireNote::AfterSkippedGap { wall });
                    return Some(Fire { at, note });
                }
                cursor = plus_second(c)?;
            }
            AmbiguousOffset::Gap {
                after: off_after, ..
            } => {
                // `c - off_after` is before the transition, so the next transition is it.
                let end = transition_after(zone, off_after.to_timestamp(c).ok()?)?;
                match gap {
                    DstGap::Skip => {
                        skipped.get_or_insert(c);
                    }
                    DstGap::Shift if end > after => {
                        return Some(Fire {
                            at: end,
                            note: Some(FireNote::ShiftedFromGap { wall: c }),
                        });
                    }
                    DstGap::Shift => {}
                }
                // Every wall time left in this gap maps to the same place: jump past it.
                cursor = civil(end, off_after).max(plus_second(c)?);
            }
            AmbiguousOffset::Fold { before, .. } => {
                let early = before.to_timestamp(c).ok()?;
                if early > after {
                    return Some(Fire {
                        at: early,
                        note: Some(FireNote::FoldEarlier),
                    });
                }
                cursor = plus_second(c)?;
                let end = transition_after(zone, early)?;
                if after >= end {
                    // `after` is in the second pass of the fold: every earlier instance of
                    // the remaining folded wall times is already behind us.
                    cursor = cursor.max(civil(end, before));
                }
            }
        }
    }
}

/// Under `dst.fold = twice`: the earliest *later* instance of a folded wall time that is
/// strictly after `after` and no later than `bound` (the best fire found otherwise).
fn next_fold_later(
    expr: &CronExpr,
    zone: &Zone,
    after: Timestamp,
    bound: Option<Timestamp>,
) -> Option<Fire> {
    let tz = zone.tz();
    // Folds are shorter than a day; a fold that began up to a day ago may still be open.
    let from = after.checked_sub(SignedDuration::from_hours(24)).ok()?;
    let limit = bound.unwrap_or(Timestamp::MAX);
    for tr in tz.following(from) {
        let t = tr.timestamp();
        if t > limit {
            return None;
        }
        let off_after = tr.offset();
        let off_before = tz.to_offset(t.checked_sub(SignedDuration::from_secs(1)).ok()?);
        if off_after >= off_before {
            continue; // a gap, or a change of name only
        }
        // The later instances of folded wall times fill [t, t + len): wall times
        // [civil(t, after), civil(t, before)) read with the later offset.
        let lo = civil(t, off_after);
        let hi = civil(t, off_before);
        let mut cursor = lo.max(
            civil(after, off_after)
                .with()
                .subsec_nanosecond(0)
                .build()
                .ok()?,
        );
        while cursor < hi {
            let c = expr.next_civil(cursor, i32::from(hi.year()))?;
            if c >= hi {
                break;
            }
            let at = off_after.to_timestamp(c).ok()?;
            if at > after {
                return (at <= limit).then_some(Fire {
                    at,
                    note: Some(FireNote::FoldLater),
                });
            }
            cursor = plus_second(c)?;
        }
    }
    None
}
