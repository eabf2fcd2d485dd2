//! Campanile's domain types and the pure helpers every layer shares.
//!
//! Nothing here does I/O or reads the wall clock: time comes in through a [`Clock`] (or as a
//! plain argument), so tests can step it exactly.

mod backoff;
mod clock;
mod ids;
mod policy;
mod state;
mod target;

pub use backoff::{Backoff, BackoffError, flex_offset};
pub use clock::{Clock, ManualClock, SystemClock};
pub use ids::{OccurrenceId, ScheduleId, occurrence_id};
pub use policy::{Misfire, Overlap};
pub use state::{ErrorClass, OccurrenceState, UnknownName};
pub use target::{
    NATS_PREFIX, RESERVED_PREFIX, Target, TargetError, check_claimable_queue, is_reserved_queue,
};
