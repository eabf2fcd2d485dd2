//! Occurrence states and failure classes.

use std::fmt;
use std::str::FromStr;

/// The state of an occurrence. See DESIGN.md, "Occurrence states".
///
/// ```text
/// SCHEDULED -> READY -> RUNNING -> SUCCEEDED
///                ^         |  \-> RETRY_WAIT -> READY
///                |         |  \-> DEAD
///                +--lease expired
/// side states: MISSED, CANCELED, SKIPPED_OVERLAP
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum OccurrenceState {
    /// Planned; `available_at` not reached yet.
    Scheduled,
    /// Due and claimable.
    Ready,
    /// Claimed by a worker under a lease.
    Running,
    /// Completed by the current lease holder. The only success.
    Succeeded,
    /// Failed transiently; becomes claimable again after its backoff.
    RetryWait,
    /// Failed permanently or out of attempts: a dead letter, redrivable.
    Dead,
    /// Not run because it was too late (misfire policy).
    Missed,
    /// Not run because its schedule was updated, paused or canceled before a claim.
    Canceled,
    /// Not run because the previous occurrence was still running (overlap policy).
    SkippedOverlap,
}

impl OccurrenceState {
    /// Every state, in lifecycle order.
    pub const ALL: [OccurrenceState; 9] = [
        OccurrenceState::Scheduled,
        OccurrenceState::Ready,
        OccurrenceState::Running,
        OccurrenceState::Succeeded,
        OccurrenceState::RetryWait,
        OccurrenceState::Dead,
        OccurrenceState::Missed,
        OccurrenceState::Canceled,
        OccurrenceState::SkippedOverlap,
    ];

    /// The stable name used in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            OccurrenceState::Scheduled => "SCHEDULED",
            OccurrenceState::Ready => "READY",
            OccurrenceState::Running => "RUNNING",
            OccurrenceState::Succeeded => "SUCCEEDED",
            OccurrenceState::RetryWait => "RETRY_WAIT",
            OccurrenceState::Dead => "DEAD",
            OccurrenceState::Missed => "MISSED",
            OccurrenceState::Canceled => "CANCELED",
            OccurrenceState::SkippedOverlap => "SKIPPED_OVERLAP",
        }
    }

    /// Whether no further transition can happen without an operator (redrive).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            OccurrenceState::Succeeded
                | OccurrenceState::Dead
                | OccurrenceState::Missed
                | OccurrenceState::Canceled
                | OccurrenceState::SkippedOverlap
        )
    }
}

/// A name that is not one of the accepted values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} '{name}'; expected one of: {expected}")]
pub struct UnknownName {
    kind: &'static str,
    name: String,
    expected: &'static str,
}

impl UnknownName {
    /// A refusal of `name` as a `kind`, listing what is `expected`.
    pub fn new(kind: &'static str, name: &str, expected: &'static str) -> UnknownName {
        UnknownName {
            kind,
            name: campanile_calendar::echo(name),
            expected,
        }
    }
}

impl fmt::Display for OccurrenceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OccurrenceState {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OccurrenceState::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownName {
                kind: "occurrence state",
                name: campanile_calendar::echo(s),
                expected: "SCHEDULED, READY, RUNNING, SUCCEEDED, RETRY_WAIT, DEAD, MISSED, \
                           CANCELED, SKIPPED_OVERLAP",
            })
    }
}

/// How a worker classifies a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorClass {
    /// Worth retrying: backs off, then becomes claimable again while attempts remain.
    Transient,
    /// Retrying cannot help: the occurrence goes straight to `DEAD`.
    Permanent,
}

impl ErrorClass {
    /// The stable name used in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::Permanent => "permanent",
        }
    }
}

impl FromStr for ErrorClass {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "transient" => Ok(ErrorClass::Transient),
            "permanent" => Ok(ErrorClass::Permanent),
            _ => Err(UnknownName {
                kind: "error class",
                name: s.to_string(),
                expected: "transient, permanent",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_names_round_trip_and_unknown_names_are_refused() {
        for st in OccurrenceState::ALL {
            assert_eq!(st.as_str().parse::<OccurrenceState>(), Ok(st));
        }
        let err = "FINISHED".parse::<OccurrenceState>().unwrap_err();
        assert!(err.to_string().contains("'FINISHED'"), "{err}");
        assert_eq!("transient".parse::<ErrorClass>(), Ok(ErrorClass::Transient));
        assert!("fatal".parse::<ErrorClass>().is_err());
    }
}
