//! Campanile's calendar engine: which instants a schedule fires at.
//!
//! A [`Calendar`] is one of three things — a cron expression in an IANA time zone, a one-off
//! instant, or a fixed interval from an anchor — and has one operation,
//! [`Calendar::next_after`], which returns the first firing instant strictly after a given
//! instant. The planner calls it repeatedly, always from the previously planned instant.
//!
//! The crate is pure: no I/O besides reading the system's zone database when a zone is
//! looked up by name, and no clock. Time is always an argument.
//!
//! # The DST contract
//!
//! Cron expressions describe *local wall-clock times*. Around daylight-saving transitions a
//! wall-clock time may not exist (a spring-forward *gap*) or may exist twice (a fall-back
//! *fold*). By default Campanile skips a wall time in a gap and fires a folded wall time once,
//! at the earlier instant. Each schedule may opt into [`DstGap::Shift`] (fire once at the first
//! instant after the gap) and/or [`DstFold::Twice`] (fire at both instants). See
//! `docs/DESIGN.md` for why these are the defaults.
//!
//! # Example
//!
//! ```
//! use campanile_calendar::{Calendar, DstPolicy};
//! use jiff::Timestamp;
//!
//! let cal = Calendar::cron("30 2 * * *", "America/New_York", DstPolicy::default())?;
//! let after: Timestamp = "2026-03-07T00:00:00Z".parse()?;
//! let fires: Vec<String> = cal.iter_after(after).take(3).map(|t| t.to_string()).collect();
//! // 2026-03-08 has no 02:30 in New York: it is skipped.
//! assert_eq!(fires, ["2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod calendar;
pub mod cron;
mod error;
mod instant;
mod zone;

pub use calendar::{Calendar, Fire, FireNote, IterAfter};
pub use cron::{CronExpr, Field};
pub use error::{CalendarError, echo};
pub use instant::{parse_instant, writable_instant};
pub use zone::{DstFold, DstGap, DstPolicy, Zone};
