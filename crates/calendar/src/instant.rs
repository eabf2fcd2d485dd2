//! Instants as users write them: RFC 3339.

use jiff::Timestamp;
use jiff::fmt::temporal::{Pieces, PiecesOffset};

use crate::CalendarError;

/// The largest UTC offset RFC 3339 can write, in seconds: `±23:59`.
const MAX_OFFSET_SECONDS: i32 = 23 * 3600 + 59 * 60;

/// Reads an instant a user gives (a one-off `at`, an `anchor`, a range's ends, `--after`):
/// RFC 3339 with a `Z` or a numeric offset of hours and minutes within `±23:59`, in the years
/// 0000 to 9999 (in UTC).
///
/// jiff alone also reads offsets up to `±25:59:59` and years outside 0000–9999; an instant
/// written with one is refused rather than read as something the sender cannot have meant or
/// answered in a form no RFC 3339 client can read.
///
/// # Errors
///
/// [`CalendarError::InvalidInstant`] for text that is not such an instant,
/// [`CalendarError::InstantOutOfRange`] for one outside the years 0000 to 9999.
pub fn parse_instant(text: &str) -> Result<Timestamp, CalendarError> {
    let invalid = |reason: String| CalendarError::InvalidInstant {
        text: crate::error::echo(text),
        reason,
    };
    let t: Timestamp = text.parse().map_err(|e| invalid(format!("{e}")))?;
    let pieces = Pieces::parse(text).map_err(|e| invalid(format!("{e}")))?;
    if let Some(PiecesOffset::Numeric(n)) = pieces.offset() {
        let seconds = n.offset().seconds();
        if seconds % 60 != 0 || seconds.abs() > MAX_OFFSET_SECONDS {
            let (sign, abs) = (if seconds < 0 { '-' } else { '+' }, seconds.unsigned_abs());
            let mut offset = format!("{sign}{:02}:{:02}", abs / 3600, abs / 60 % 60);
            if abs % 60 != 0 {
                offset.push_str(&format!(":{:02}", abs % 60));
            }
            return Err(invalid(format!(
                "its UTC offset {offset} is not hours and minutes within -23:59 to +23:59"
            )));
        }
    }
    writable_instant(t)
}

/// `t` if RFC 3339 can write it: in the years 0000 to 9999, in UTC.
///
/// # Errors
///
/// [`CalendarError::InstantOutOfRange`] otherwise (jiff reads `-009000-01-01T00:00:00Z`).
pub fn writable_instant(t: Timestamp) -> Result<Timestamp, CalendarError> {
    let year = t.to_zoned_datetime(jiff::tz::TimeZone::UTC).year();
    if (0..=9999).contains(&year) {
        Ok(t)
    } else {
        Err(CalendarError::InstantOutOfRange(t.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_within_a_day_are_read() {
        for (text, utc) in [
            ("2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z"),
            ("2026-01-01T00:00:00+23:59", "2025-12-31T00:01:00Z"),
            ("2026-01-01T00:00:00-23:59", "2026-01-01T23:59:00Z"),
            ("2026-01-01T05:30:00+05:30", "2026-01-01T00:00:00Z"),
            ("2026-01-01T00:00:00-00:00", "2026-01-01T00:00:00Z"),
            ("0000-01-01T00:00:00Z", "0000-01-01T00:00:00Z"),
            ("9999-12-30T00:00:00Z", "9999-12-30T00:00:00Z"),
        ] {
            assert_eq!(
                parse_instant(text).map(|t| t.to_string()),
                Ok(utc.to_string()),
                "{text}"
            );
        }
    }

    #[test]
    fn offsets_beyond_23_59_are_refused() {
        // jiff reads the first five; RFC 3339 writes none of them.
        for text in [
            "2026-01-01T00:00:00+25:00",
            "2026-01-01T00:00:00-25:59",
            "2026-01-01T00:00:00+24:00",
            "2026-01-01T00:00:00+23:59:59",
            "2026-01-01T00:00:00+05:30:15",
            "2026-01-01T00:00:00+26:00",
        ] {
            let e = parse_instant(text).expect_err(text);
            assert!(
                matches!(e, CalendarError::InvalidInstant { .. }),
                "{text}: {e:?}"
            );
            assert!(e.to_string().contains(text), "{text}: {e}");
        }
        let e = parse_instant("2026-01-01T00:00:00+25:00").expect_err("+25:00");
        assert!(e.to_string().contains("offset +25:00 is not"), "{e}");
        let e = parse_instant("2026-01-01T00:00:00-05:30:15").expect_err("seconds");
        assert!(e.to_string().contains("offset -05:30:15 is not"), "{e}");
    }

    #[test]
    fn years_rfc_3339_cannot_write_are_refused() {
        for text in ["-009000-01-01T00:00:00Z", "-000001-12-31T23:59:59Z"] {
            let e = parse_instant(text).expect_err(text);
            assert!(e.to_string().contains("0000 to 9999"), "{text}: {e}");
        }
        // An offset can carry an instant across the edge, too.
        assert!(parse_instant("0000-01-01T00:00:00+01:00").is_err());
    }

    #[test]
    fn what_is_not_an_instant_is_refused() {
        for text in ["", "yesterday", "2026-01-01", "2026-01-01T00:00:00"] {
            assert!(
                matches!(
                    parse_instant(text),
                    Err(CalendarError::InvalidInstant { .. })
                ),
                "{text}"
            );
        }
    }
}
