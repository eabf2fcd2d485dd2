//! The search for the next wall-clock (civil) time that a cron expression matches.
//!
//! This knows nothing of zones: [`crate::zone`] maps the civil times it yields to instants
//! under the DST contract.

use jiff::civil::DateTime;

use super::CronExpr;

/// Day of the week, 0 = Sunday (Sakamoto's method).
pub(crate) fn weekday(y: i32, m: u32, d: u32) -> u32 {
    const T: [i32; 12] = [0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4];
    let y = if m < 3 { y - 1 } else { y };
    (y + y.div_euclid(4) - y.div_euclid(100) + y.div_euclid(400) + T[(m - 1) as usize] + d as i32)
        .rem_euclid(7) as u32
}

pub(crate) fn days_in_month(y: i32, m: u32) -> u32 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// The lowest set bit at position `>= from`, if any.
fn next_bit(mask: u64, from: u32) -> Option<u32> {
    if from >= 64 {
        return None;
    }
    let m = mask & (u64::MAX << from);
    (m != 0).then(|| m.trailing_zeros())
}

impl CronExpr {
    /// The first civil second at or after `start` that matches, or `None` if there is none
    /// before the end of year `limit_year`.
    ///
    /// Work is bounded: every step moves at least to the next matching second, minute, hour,
    /// day or month, and the year bound stops the search.
    pub(crate) fn next_civil(&self, start: DateTime, limit_year: i32) -> Option<DateTime> {
        let (mut y, mut mo, mut d) = (
            i32::from(start.year()),
            start.month() as u32,
            start.day() as u32,
        );
        let (mut h, mut mi, mut s) = (
            start.hour() as u32,
            start.minute() as u32,
            start.second() as u32,
        );
        let months = u64::from(self.months);
        loop {
            if y > limit_year {
                return None;
            }
            if months & (1 << mo) == 0 {
                match next_bit(months, mo + 1) {
                    Some(m2) => mo = m2,
                    None => {
                        y += 1;
                        mo = months.trailing_zeros();
                    }
                }
                (d, h, mi, s) = (1, 0, 0, 0);
                continue;
            }
            let dim = days_in_month(y, mo);
            if d > dim {
                (mo, d, h, mi, s) = (mo + 1, 1, 0, 0, 0);
                if mo > 12 {
                    (y, mo) = (y + 1, 1);
                }
                continue;
            }
            let mut wd = weekday(y, mo, d);
            if !self.day_matches(y, mo, d, wd) {
                let mut found = None;
                for dd in d + 1..=dim {
                    wd = (wd + 1) % 7;
                    if self.day_matches(y, mo, dd, wd) {
                        found = Some(dd);
                        break;
                    }
                }
                match found {
                    Some(dd) => (d, h, mi, s) = (dd, 0, 0, 0),
                    None => d = dim + 1,
                }
                continue;
            }
            match next_bit(u64::from(self.hours), h) {
                Some(hh) if hh != h => (h, mi, s) = (hh, 0, 0),
                Some(_) => {}
                None => {
                    (d, h, mi, s) = (d + 1, 0, 0, 0);
                    continue;
                }
            }
            match next_bit(self.minutes, mi) {
                Some(mm) if mm != mi => (mi, s) = (mm, 0),
                Some(_) => {}
                None => {
                    (h, mi, s) = (h + 1, 0, 0);
                    if h > 23 {
                        (d, h) = (d + 1, 0);
                    }
                    continue;
                }
            }
            match next_bit(self.seconds, s) {
                Some(ss) => {
                    // All components are in range by construction; `ok()` only guards years
                    // beyond jiff's supported range, where there is no next time.
                    return DateTime::new(
                        i16::try_from(y).ok()?,
                        mo as i8,
                        d as i8,
                        h as i8,
                        mi as i8,
                        ss as i8,
                        0,
                    )
                    .ok();
                }
                None => {
                    (mi, s) = (mi + 1, 0);
                    if mi > 59 {
                        (h, mi) = (h + 1, 0);
                        if h > 23 {
                            (d, h) = (d + 1, 0);
                        }
                    }
                    continue;
                }
            }
        }
    }
}
