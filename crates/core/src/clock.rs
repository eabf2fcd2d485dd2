//! The clock seam: domain code asks a [`Clock`] for "now" and never the operating system.

use std::sync::Mutex;

use jiff::{SignedDuration, Timestamp};

/// A source of the current instant.
///
/// Production uses [`SystemClock`] (or, on PostgreSQL, the database's own `now()` inside the
/// statement); tests use [`ManualClock`] and step it exactly.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// The operating system's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that only moves when told to.
///
/// # Example
///
/// ```
/// use campanile_core::{Clock, ManualClock};
/// use jiff::{SignedDuration, Timestamp};
///
/// let clock = ManualClock::new(Timestamp::UNIX_EPOCH);
/// clock.advance(SignedDuration::from_secs(10));
/// assert_eq!(clock.now(), Timestamp::from_second(10)?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<Timestamp>,
}

impl ManualClock {
    /// A clock stopped at `now`.
    pub fn new(now: Timestamp) -> ManualClock {
        ManualClock {
            now: Mutex::new(now),
        }
    }

    /// Sets the current instant.
    pub fn set(&self, now: Timestamp) {
        *self.now.lock().unwrap_or_else(|e| e.into_inner()) = now;
    }

    /// Moves the clock by `by` (which may be negative, to test clocks that step back).
    pub fn advance(&self, by: SignedDuration) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        *now = now.saturating_add(by).unwrap_or(*now);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }
}
