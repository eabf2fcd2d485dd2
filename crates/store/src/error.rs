//! The store's error type, and the fencing conflicts.

use campanile_core::OccurrenceState;
use jiff::Timestamp;

/// Why a fenced operation was refused. Nothing changed in the store.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "check", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Conflict {
    /// No such occurrence for this tenant.
    NotFound,
    /// The occurrence was re-claimed: the caller's epoch is not the current one.
    StaleEpoch {
        /// The epoch the caller sent.
        sent: i64,
        /// The occurrence's current epoch.
        current: i64,
    },
    /// The occurrence is `RUNNING` under another worker's claim.
    NotOwner {
        /// The current owner, if any.
        owner: Option<String>,
    },
    /// The caller's lease has passed (`now >= lease_until`), whether or not the sweep has
    /// taken the occurrence back since.
    LeaseExpired {
        /// When the lease ended.
        lease_until: Timestamp,
    },
    /// The occurrence is not in a state the operation applies to (already finished, not
    /// dead for a redrive, ...). For a completion, failure or renewal: the caller's own claim
    /// at this epoch has ended (its report was written, or it was canceled), and the state
    /// says how.
    WrongState {
        /// Its current state.
        state: OccurrenceState,
    },
    /// No worker holds the occurrence (it is not `RUNNING`) and the caller never held it at
    /// this epoch: it was never claimed, a redrive released it, or the claim of this epoch
    /// was another worker's and has ended.
    NotClaimed {
        /// Its current state.
        state: OccurrenceState,
    },
}

impl Conflict {
    /// A stable machine-readable name of the failed check.
    pub fn check(&self) -> &'static str {
        match self {
            Conflict::NotFound => "not_found",
            Conflict::StaleEpoch { .. } => "stale_epoch",
            Conflict::NotOwner { .. } => "not_owner",
            Conflict::LeaseExpired { .. } => "lease_expired",
            Conflict::WrongState { .. } => "wrong_state",
            Conflict::NotClaimed { .. } => "not_claimed",
        }
    }
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Conflict::NotFound => write!(f, "no such occurrence"),
            // Claims issue epochs from 1: a lower one was never issued, whatever the current.
            Conflict::StaleEpoch { sent, current } if *sent < 1 => write!(
                f,
                "epoch {sent} was never issued (epochs start at 1; this occurrence's is {current})"
            ),
            Conflict::StaleEpoch { sent, current } if sent < current => {
                write!(
                    f,
                    "stale epoch {sent}: the occurrence was re-claimed (epoch {current})"
                )
            }
            Conflict::StaleEpoch { sent, current } => write!(
                f,
                "epoch {sent} was never issued for this occurrence (its epoch is {current})"
            ),
            Conflict::NotOwner { owner: Some(o) } => write!(f, "lease is held by '{o}'"),
            Conflict::NotOwner { owner: None } => write!(f, "occurrence has no owner"),
            Conflict::LeaseExpired { lease_until } => write!(f, "lease expired at {lease_until}"),
            Conflict::WrongState { state } => write!(f, "occurrence is {state}"),
            Conflict::NotClaimed { state } => {
                write!(f, "no worker holds this occurrence: it is {state}")
            }
        }
    }
}

/// A failure of the store itself (never a fencing refusal: those are [`Conflict`]s inside
/// an [`crate::Ack`]). `Clone`, so that one failed statement shared by several requests can
/// answer each of them.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database cannot be reached or answered with an I/O-level error. Retryable.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A uniqueness rule was violated (e.g. a tenant name that exists).
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// The caller passed something the store cannot hold (e.g. a negative lease).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The schema is newer than this binary, or a migration failed.
    #[error("migration: {0}")]
    Migration(String),
    /// No such record for this tenant.
    #[error("not found: {0}")]
    NotFound(String),
    /// An optimistic update carried a version that is no longer current.
    #[error("version conflict: the schedule is at version {current}")]
    VersionConflict {
        /// The current version.
        current: u32,
    },
    /// The operation is not allowed in the record's current state.
    #[error("{0}")]
    WrongState(String),
    /// A tenant quota would be exceeded.
    #[error("quota exceeded: {message}")]
    QuotaExceeded {
        /// Which quota.
        quota: Quota,
        /// What the limit is and where the tenant stands.
        message: String,
    },
    /// No planner node's liveness mark is valid: the control plane is down (or was, and no
    /// node has started since), so no work is handed out until a node's start has judged what
    /// came due meanwhile ([`crate::fence::hands_out_work`]). Retryable.
    #[error(
        "no node is live: every planner node's liveness mark has lapsed; what came due meanwhile \
         is judged against its misfire policy when a node starts, and work is handed out again then"
    )]
    NoLiveNode,
    /// The `Idempotency-Key` reservation a create was made under was taken over by a retry of
    /// the same request, which creates instead: nothing was written.
    #[error("{0}")]
    Superseded(String),
    /// A fenced batch was refused: the caller's shard lease is no longer current.
    #[error("fenced: {0}")]
    Fenced(String),
    /// Any other database error, with context.
    #[error("database error: {0}")]
    Database(String),
}

impl StoreError {
    /// The create of a request whose `Idempotency-Key` reservation a retry took over.
    pub fn superseded() -> StoreError {
        StoreError::Superseded(
            "a retry of this request took over its Idempotency-Key and creates the schedule \
             instead; nothing was written: send the request again to read that retry's answer"
                .into(),
        )
    }
}

/// A tenant quota that refuses a request (the others pace work instead: running, catch-up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Quota {
    /// Most `ACTIVE` schedules.
    ActiveSchedules,
    /// Most fires per second summed over the active schedules.
    TriggersPerSec,
}

impl Quota {
    /// Every quota that refuses requests.
    pub const ALL: [Quota; 2] = [Quota::ActiveSchedules, Quota::TriggersPerSec];

    /// Its name, as in the metrics' `quota` label and the API's error details.
    pub fn as_str(self) -> &'static str {
        match self {
            Quota::ActiveSchedules => "max_active_schedules",
            Quota::TriggersPerSec => "max_triggers_per_sec",
        }
    }
}
