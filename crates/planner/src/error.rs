//! The planner's error.

use campanile_calendar::CalendarError;
use campanile_store::StoreError;

/// The planner layer's error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlannerError {
    /// The schedule definition is invalid; the message says what and where.
    #[error("{0}")]
    Invalid(String),
    /// The calendar part of the definition is invalid.
    #[error(transparent)]
    Calendar(#[from] CalendarError),
    /// The store failed or refused.
    #[error(transparent)]
    Store(#[from] StoreError),
}
