//! Zones and the DST contract.

use std::fmt;

use jiff::tz::TimeZone;

use crate::CalendarError;

/// What to do with a wall-clock time that does not exist (a spring-forward gap).
///
/// The default is [`DstGap::Skip`]: a 02:30 job does not run on the day 02:30 does not exist.
/// Vixie cron instead runs fixed-time jobs right after the gap; choose [`DstGap::Shift`] for
/// that. See `docs/DESIGN.md`, "Why skip a gap by default?".
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DstGap {
    /// Do not fire for a wall time inside a gap (default).
    #[default]
    Skip,
    /// Fire once, at the first instant after the gap, however many matching wall times the
    /// gap swallowed.
    Shift,
}

/// What to do with a wall-clock time that occurs twice (a fall-back fold).
///
/// The default is [`DstFold::Once`]: fire at the earlier of the two instants only, so that no
/// wall time ever fires twice.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DstFold {
    /// Fire once, at the earlier instant (default).
    #[default]
    Once,
    /// Fire at both instants (e.g. hourly financial reconciliation that must see every hour
    /// of elapsed time).
    Twice,
}

/// A schedule's DST options. The default is `{gap: skip, fold: once}`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct DstPolicy {
    /// What happens to wall times in a spring-forward gap.
    #[serde(default)]
    pub gap: DstGap,
    /// What happens to wall times in a fall-back fold.
    #[serde(default)]
    pub fold: DstFold,
}

impl fmt::Display for DstGap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DstGap::Skip => "skip",
            DstGap::Shift => "shift",
        })
    }
}

impl fmt::Display for DstFold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DstFold::Once => "once",
            DstFold::Twice => "twice",
        })
    }
}

impl std::str::FromStr for DstGap {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "skip" => Ok(DstGap::Skip),
            "shift" => Ok(DstGap::Shift),
            other => Err(format!(
                "unknown dst gap policy '{}': expected skip or shift",
                crate::error::echo(other)
            )),
        }
    }
}

impl std::str::FromStr for DstFold {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "once" => Ok(DstFold::Once),
            "twice" => Ok(DstFold::Twice),
            other => Err(format!(
                "unknown dst fold policy '{}': expected once or twice",
                crate::error::echo(other)
            )),
        }
    }
}

/// An IANA time zone, looked up in the system's zone database ([`Zone::get`]).
#[derive(Debug, Clone)]
pub struct Zone {
    name: String,
    tz: TimeZone,
}

impl PartialEq for Zone {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}
impl Eq for Zone {}

/// Names a zone database holds that are not a place's zone, with why each is refused. Compared
/// without regard to ASCII case, as the database looks names up.
const NOT_PLACES: [(&str, &str); 3] = [
    (
        "localtime",
        "it is the host's own zone setting, which can differ from node to node",
    ),
    (
        "posixrules",
        "it is the zone database's rules for POSIX TZ strings, not a place's zone",
    ),
    (
        "Factory",
        "it is the zone database's placeholder for a host with no zone set, not a place's zone",
    ),
];

/// Directories of a zone database that hold copies of it rather than zones: `posix/` (the same
/// rules) and `right/` (the rules counting leap seconds, which no clock here does).
const COPIES: [&str; 2] = ["posix/", "right/"];

/// Whether `name` is shaped like an IANA zone name: parts separated by single slashes, each
/// starting with an ASCII letter and made of ASCII letters, digits, `.`, `-`, `_` and `+`
/// (`Etc/GMT+5`, `EST5EDT`, `America/Port-au-Prince`). A file path (`/etc/localtime`,
/// `../x`, `./UTC`) is not.
fn iana_shaped(name: &str) -> bool {
    name.split('/').all(|part| {
        let mut chars = part.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+'))
    })
}

impl Zone {
    /// Looks a zone up by its IANA name (`Europe/Paris`, `UTC`) or one of its links in the
    /// zone database (`US/Eastern`), without regard to ASCII case; the zone keeps the
    /// database's spelling (`utc` is `UTC`, `us/eastern` is `US/Eastern`).
    ///
    /// This is the one check of a zone name a user gives: see `docs/DESIGN.md`, "Why are
    /// zone names checked before the zone database is asked?".
    ///
    /// # Errors
    ///
    /// [`CalendarError::RefusedZone`] for a name that is not a place's zone although a zone
    /// database may hold it: a file path, `localtime` (the host's own setting), `posixrules`,
    /// `Factory`, or a name under `posix/` or `right/`. [`CalendarError::UnknownZone`] if the
    /// system's zone database has no such zone. Fixed offsets such as `+02:00` and POSIX TZ
    /// strings are refused on purpose: a schedule names a place, whose rules may change, not
    /// an offset.
    pub fn get(name: &str) -> Result<Zone, CalendarError> {
        let trimmed = name.trim();
        if trimmed.is_empty() {
            return Err(CalendarError::UnknownZone(crate::error::echo(name)));
        }
        let refused = |reason: &'static str| CalendarError::RefusedZone {
            name: crate::error::echo(trimmed),
            reason,
        };
        if !iana_shaped(trimmed) {
            return Err(refused(
                "an IANA zone name is not a file path: its parts, between single slashes, \
                 start with a letter and hold only letters, digits, '.', '-', '_' and '+'",
            ));
        }
        if let Some((_, reason)) = NOT_PLACES
            .iter()
            .find(|(not, _)| not.eq_ignore_ascii_case(trimmed))
        {
            return Err(refused(reason));
        }
        if COPIES.iter().any(|dir| {
            trimmed
                .get(..dir.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(dir))
        }) {
            return Err(refused(
                "it is a copy of the zone database; give the name without the directory",
            ));
        }
        let unknown = || CalendarError::UnknownZone(crate::error::echo(name));
        let tz = TimeZone::get(trimmed).map_err(|_| unknown())?;
        // `Etc/Unknown` is found, as a zone with no name: it is not a place either.
        let name = tz.iana_name().ok_or_else(unknown)?.to_string();
        Ok(Zone { name, tz })
    }

    /// UTC.
    pub fn utc() -> Zone {
        Zone {
            name: "UTC".to_string(),
            tz: TimeZone::UTC,
        }
    }

    /// The zone's canonical IANA name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The underlying jiff zone.
    pub fn tz(&self) -> &TimeZone {
        &self.tz
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iana_names_and_links_are_accepted_in_the_databases_spelling() {
        for (given, kept) in [
            ("UTC", "UTC"),
            ("utc", "UTC"),
            (" UTC ", "UTC"),
            ("Etc/UTC", "Etc/UTC"),
            ("Europe/Paris", "Europe/Paris"),
            ("europe/PARIS", "Europe/Paris"),
            ("US/Eastern", "US/Eastern"),
            ("us/eastern", "US/Eastern"),
            (
                "America/Argentina/Buenos_Aires",
                "America/Argentina/Buenos_Aires",
            ),
            ("America/Port-au-Prince", "America/Port-au-Prince"),
            ("Etc/GMT+5", "Etc/GMT+5"),
            ("EST5EDT", "EST5EDT"),
        ] {
            let zone = Zone::get(given).unwrap_or_else(|e| panic!("{given:?}: {e}"));
            assert_eq!(zone.name(), kept, "{given:?}");
        }
    }

    #[test]
    fn names_that_are_not_a_places_zone_are_refused() {
        for name in [
            "localtime",
            "LocalTime",
            "posixrules",
            "Factory",
            "factory",
            "posix/Europe/Paris",
            "right/UTC",
            "RIGHT/UTC",
        ] {
            match Zone::get(name) {
                Err(e @ CalendarError::RefusedZone { .. }) => {
                    assert!(e.to_string().contains(name), "{name}: {e}");
                    assert!(e.to_string().contains("Europe/Paris"), "{name}: {e}");
                }
                other => panic!("{name}: {other:?}"),
            }
        }
        // The database finds it, as a zone without a name.
        assert!(matches!(
            Zone::get("Etc/Unknown"),
            Err(CalendarError::UnknownZone(_))
        ));
    }

    #[test]
    fn file_paths_are_refused() {
        for name in [
            "/etc/localtime",
            "/usr/share/zoneinfo/UTC",
            "../../../etc/localtime",
            "./UTC",
            "Europe/../UTC",
            "Europe//Paris",
            "Europe/Paris/",
            "Europe\\Paris",
            "UTC\0",
            "+02:00",
            "-0500",
            "EST5EDT,M3.2.0,M11.1.0",
        ] {
            assert!(
                matches!(Zone::get(name), Err(CalendarError::RefusedZone { .. })),
                "{name:?}: {:?}",
                Zone::get(name)
            );
        }
    }

    #[test]
    fn every_zone_of_the_system_database_is_accepted_but_the_ones_refused_on_purpose() {
        let mut seen = 0;
        for name in jiff::tz::db().available() {
            let name = name.as_str();
            if NOT_PLACES.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
                assert!(Zone::get(name).is_err(), "{name}");
                continue;
            }
            let zone = Zone::get(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(zone.name(), name);
            seen += 1;
        }
        assert!(seen > 300, "only {seen} zones: is tzdata installed?");
    }
}
