//! Campanile's planner: from schedules to occurrences.
//!
//! - [`schedules`]: validate a schedule definition, create it with its first instant to
//!   plan, update / pause / resume / cancel it (each a new version).
//! - [`materialize`]: the pure decision for one schedule — which instants to insert as runs,
//!   which as `MISSED` records (or one summary for a very long gap), where to continue.
//! - [`reconcile`]: recompute the instants a schedule's versions expect in a range and
//!   classify each by what was recorded (`MISSING` is a bug).
//! - [`Planner`]: holds shard leases and commits planning batches, fenced by those leases; its
//!   loop wakes for the next due instant.

mod calendar;
mod engine;
mod error;
pub mod materialize;
mod planner;
pub mod reconcile;
pub mod schedules;

pub use calendar::{CalendarJudge, calendar_of, shard_of};
pub use engine::{Engine, SweepConfig};
pub use error::PlannerError;
pub use planner::{Planner, PlannerConfig, TickReport};
