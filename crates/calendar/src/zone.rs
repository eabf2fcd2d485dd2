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

/// An IANA time zone, looked up in the system's zone database.
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

impl Zone {
    /// Looks a zone up by its IANA name (`Europe/Paris`, `UTC`).
    ///
    /// # Errors
    ///
    /// [`CalendarError::UnknownZone`] if the system's zone database has no such zone.
    /// Fixed offsets such as `+02:00` and POSIX TZ strings are refused on purpose: a schedule
    /// names a place, whose rules may change, not an offset.
    pub fn get(name: &str) -> Result<Zone, CalendarError> {
        let trimmed = name.trim();
        if trimmed.is_empty() {
            return Err(CalendarError::UnknownZone(crate::error::echo(name)));
        }
        let tz = TimeZone::get(trimmed)
            .map_err(|_| CalendarError::UnknownZone(crate::error::echo(name)))?;
        let name = tz.iana_name().unwrap_or(trimmed).to_string();
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
