//! Identities of schedules and occurrences.

use std::fmt;

use jiff::Timestamp;
use uuid::Uuid;

/// Identity of a schedule (all of its versions).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct ScheduleId(pub Uuid);

/// Identity of one occurrence: derived from `(schedule_id, version, scheduled_for)`, so every
/// node, every retry and every replay computes the same id. Handlers use it as their
/// idempotency key.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct OccurrenceId(pub Uuid);

impl fmt::Display for ScheduleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for OccurrenceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The UUIDv5 namespace of occurrence ids (a fixed random UUID; never change it, or every
/// stored id stops matching its key).
const OCCURRENCE_NAMESPACE: Uuid = Uuid::from_u128(0x6b0f_3c2e_9a57_4d1b_8e44_2f5c_1d7a_90e3);

/// The deterministic id of the occurrence `(schedule_id, version, scheduled_for)`.
///
/// A UUIDv5 (SHA-1, namespaced) of `"{schedule_id}/{version}/{unix milliseconds}"`.
/// Instants are keyed at millisecond precision, the precision the store keeps.
///
/// # Example
///
/// ```
/// use campanile_core::{occurrence_id, ScheduleId};
/// use uuid::Uuid;
///
/// let s = ScheduleId(Uuid::nil());
/// let at = "2026-03-09T06:30:00Z".parse()?;
/// assert_eq!(occurrence_id(s, 1, at), occurrence_id(s, 1, at));
/// assert_ne!(occurrence_id(s, 1, at), occurrence_id(s, 2, at));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn occurrence_id(
    schedule_id: ScheduleId,
    version: u32,
    scheduled_for: Timestamp,
) -> OccurrenceId {
    let name = format!(
        "{}/{}/{}",
        schedule_id.0,
        version,
        scheduled_for.as_millisecond()
    );
    OccurrenceId(Uuid::new_v5(&OCCURRENCE_NAMESPACE, name.as_bytes()))
}

impl OccurrenceId {
    /// 64 well-mixed bits of the id (the SHA-1 output minus the UUID version and variant
    /// bits), for deterministic jitter.
    pub fn hash64(&self) -> u64 {
        let v = self.0.as_u128();
        // Bytes 0..6 and 9..16 never hold version/variant bits.
        let hi = (v >> 80) as u64; // 48 bits
        let lo = v as u64 & 0x00ff_ffff_ffff_ffff; // 56 bits
        hi.rotate_left(16) ^ lo.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
}
