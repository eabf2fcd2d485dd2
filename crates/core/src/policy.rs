//! Per-schedule policies: what to do with late instants (misfire) and with overlapping runs.

use std::fmt;
use std::str::FromStr;

use jiff::SignedDuration;

use crate::UnknownName;

/// What to do with planned instants that are already later than `max_lateness` when the
/// planner reaches them (the service was down, or the schedule was paused).
///
/// Nothing is ever dropped silently: every instant that does not run is recorded, as a
/// `MISSED` occurrence or, for very long gaps, as one summary record with a count and a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "policy", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Misfire {
    /// Record every late instant as `MISSED`; run none of them. The default: a late "send the
    /// 09:00 report" run at 14:00 is usually worse than none.
    Skip {
        /// Lateness beyond which an instant counts as missed.
        #[serde(default = "default_lateness", with = "secs")]
        max_lateness: SignedDuration,
    },
    /// Run only the latest late instant; record the others as `MISSED`.
    FireOnce {
        /// Lateness beyond which an instant counts as missed.
        #[serde(default = "default_lateness", with = "secs")]
        max_lateness: SignedDuration,
    },
    /// Run at most the `max` latest late instants, spaced `interval` apart; record the rest.
    Catchup {
        /// Lateness beyond which an instant counts as missed.
        #[serde(default = "default_lateness", with = "secs")]
        max_lateness: SignedDuration,
        /// How many late instants to run at most.
        max: u32,
        /// Spacing between catch-up runs (rate limit).
        #[serde(default = "default_interval", with = "millis")]
        interval: SignedDuration,
    },
}

fn default_lateness() -> SignedDuration {
    SignedDuration::from_secs(60)
}

fn default_interval() -> SignedDuration {
    SignedDuration::from_secs(1)
}

mod secs {
    use jiff::SignedDuration;
    pub(super) fn serialize<S: serde::Serializer>(
        d: &SignedDuration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_i64(d.as_secs())
    }
    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<SignedDuration, D::Error> {
        let v: i64 = serde::Deserialize::deserialize(d)?;
        Ok(SignedDuration::from_secs(v))
    }
}

mod millis {
    use jiff::SignedDuration;
    pub(super) fn serialize<S: serde::Serializer>(
        d: &SignedDuration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_i64(d.as_millis() as i64)
    }
    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<SignedDuration, D::Error> {
        let v: i64 = serde::Deserialize::deserialize(d)?;
        Ok(SignedDuration::from_millis(v))
    }
}

impl Default for Misfire {
    fn default() -> Self {
        Misfire::Skip {
            max_lateness: default_lateness(),
        }
    }
}

impl Misfire {
    /// Lateness beyond which an instant counts as missed.
    pub fn max_lateness(&self) -> SignedDuration {
        match self {
            Misfire::Skip { max_lateness }
            | Misfire::FireOnce { max_lateness }
            | Misfire::Catchup { max_lateness, .. } => *max_lateness,
        }
    }

    /// How many of the latest late instants run.
    pub fn runs(&self) -> u32 {
        match self {
            Misfire::Skip { .. } => 0,
            Misfire::FireOnce { .. } => 1,
            Misfire::Catchup { max, .. } => *max,
        }
    }

    /// Spacing between the late instants that run.
    pub fn interval(&self) -> SignedDuration {
        match self {
            Misfire::Catchup { interval, .. } => *interval,
            _ => SignedDuration::ZERO,
        }
    }

    /// The stored form (JSON).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{\"policy\":\"skip\"}".to_string())
    }

    /// Parses the stored form.
    ///
    /// # Errors
    ///
    /// A message naming what is wrong.
    pub fn from_json(s: &str) -> Result<Misfire, String> {
        serde_json::from_str(s).map_err(|e| format!("invalid misfire policy: {e}"))
    }
}

/// What to do when an occurrence comes due while an earlier one of the same schedule is
/// still running. Decided at claim time, atomically with the other occurrence's state.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum Overlap {
    /// Run regardless (default).
    #[default]
    Allow,
    /// Record it as `SKIPPED_OVERLAP` instead of running it.
    SkipIfRunning,
    /// Let one wait behind the running one; record any further as `SKIPPED_OVERLAP`.
    QueueOne,
}

impl Overlap {
    /// The stored code (0, 1, 2).
    pub fn code(self) -> i32 {
        match self {
            Overlap::Allow => 0,
            Overlap::SkipIfRunning => 1,
            Overlap::QueueOne => 2,
        }
    }

    /// From the stored code.
    pub fn from_code(c: i32) -> Overlap {
        match c {
            1 => Overlap::SkipIfRunning,
            2 => Overlap::QueueOne,
            _ => Overlap::Allow,
        }
    }

    /// The API name.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Allow => "ALLOW",
            Overlap::SkipIfRunning => "SKIP_IF_RUNNING",
            Overlap::QueueOne => "QUEUE_ONE",
        }
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Overlap {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Overlap::Allow, Overlap::SkipIfRunning, Overlap::QueueOne]
            .into_iter()
            .find(|o| o.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                UnknownName::new("overlap policy", s, "ALLOW, SKIP_IF_RUNNING, QUEUE_ONE")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misfire_round_trips_through_json() {
        for m in [
            Misfire::default(),
            Misfire::FireOnce {
                max_lateness: SignedDuration::from_secs(5),
            },
            Misfire::Catchup {
                max_lateness: SignedDuration::from_secs(5),
                max: 3,
                interval: SignedDuration::from_millis(250),
            },
        ] {
            assert_eq!(Misfire::from_json(&m.to_json()), Ok(m));
        }
        assert_eq!(
            Misfire::from_json("{\"policy\":\"fire_once\"}"),
            Ok(Misfire::FireOnce {
                max_lateness: SignedDuration::from_secs(60)
            })
        );
        assert!(Misfire::from_json("{\"policy\":\"yolo\"}").is_err());
        assert_eq!(
            "skip_if_running".parse::<Overlap>(),
            Ok(Overlap::SkipIfRunning)
        );
        assert!("sometimes".parse::<Overlap>().is_err());
    }
}
