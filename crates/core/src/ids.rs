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

/// The namespace of the hash inside occurrence ids (a fixed random UUID; never change it, or
/// every stored id stops matching its key).
const OCCURRENCE_NAMESPACE: Uuid = Uuid::from_u128(0x6b0f_3c2e_9a57_4d1b_8e44_2f5c_1d7a_90e3);

/// The deterministic id of the occurrence `(schedule_id, version, scheduled_for)`.
///
/// A time-ordered UUIDv8: the first 48 bits are `scheduled_for` in Unix milliseconds (like
/// UUIDv7), the remaining 74 free bits come from a namespaced SHA-1 (UUIDv5) of
/// `"{schedule_id}/{version}/{unix milliseconds}"`. Any node computes the same id for the same
/// key, and ids sort by planned time, so the store's id index grows at its end the way
/// occurrences are planned (see docs/DESIGN.md, "Why are occurrence ids time-ordered?").
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
/// let later = "2026-03-09T06:30:01Z".parse()?;
/// assert!(occurrence_id(s, 1, at) < occurrence_id(s, 1, later));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn occurrence_id(
    schedule_id: ScheduleId,
    version: u32,
    scheduled_for: Timestamp,
) -> OccurrenceId {
    let ms = scheduled_for.as_millisecond();
    let mut name = [0; KEY_NAME_MAX];
    let hash = Uuid::new_v5(
        &OCCURRENCE_NAMESPACE,
        key_name(&mut name, schedule_id, version, ms),
    )
    .into_bytes();
    let mut b = [0u8; 16];
    // 48-bit big-endian milliseconds; instants before 1970 wrap (later ones cannot: the
    // 48 bits reach the year 10889, past the last instant a `Timestamp` holds), which only
    // costs ordering, never uniqueness (the hash still covers the full key). The planner
    // refuses instants before 1970 (`campanile_planner::validate`), so stored ids sort
    // exactly as `(scheduled_for, id)` does, and listings page through the id index.
    b[..6].copy_from_slice(&(ms as u64).to_be_bytes()[2..]);
    b[6..].copy_from_slice(&hash[6..]);
    OccurrenceId(Uuid::new_v8(b))
}

/// Room for the hashed name of an occurrence key: a hyphenated UUID, two slashes, a `u32` and
/// an `i64` (36 + 1 + 10 + 1 + 20).
const KEY_NAME_MAX: usize = 68;

/// The hashed name of an occurrence key, `"{schedule_id}/{version}/{unix milliseconds}"`,
/// written into `buf`: the planner computes one id per planned occurrence inside the store's
/// single writer, where `format!` cost as much as the SHA-1 itself.
fn key_name(buf: &mut [u8; KEY_NAME_MAX], schedule_id: ScheduleId, version: u32, ms: i64) -> &[u8] {
    let mut at = uuid::fmt::Hyphenated::LENGTH;
    schedule_id.0.hyphenated().encode_lower(&mut buf[..at]);
    for part in [
        itoa::Buffer::new().format(version).as_bytes(),
        itoa::Buffer::new().format(ms).as_bytes(),
    ] {
        buf[at] = b'/';
        buf[at + 1..at + 1 + part.len()].copy_from_slice(part);
        at += 1 + part.len();
    }
    &buf[..at]
}

impl OccurrenceId {
    /// The least id of any occurrence planned at `at` or later (for instants from 1970 on):
    /// `scheduled_for >= at` is `id >= OccurrenceId::floor(at)`, and `scheduled_for < at` is
    /// `id < OccurrenceId::floor(at)`, so a range of planned instants is a range of the id
    /// index. An instant before 1970 gives the least id of all.
    ///
    /// ```
    /// use campanile_core::{occurrence_id, OccurrenceId, ScheduleId};
    /// use uuid::Uuid;
    ///
    /// let at: jiff::Timestamp = "2026-03-09T06:30:00Z".parse()?;
    /// let id = occurrence_id(ScheduleId(Uuid::max()), u32::MAX, at);
    /// assert!(OccurrenceId::floor(at) <= id);
    /// assert!(id < OccurrenceId::floor("2026-03-09T06:30:00.001Z".parse()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn floor(at: Timestamp) -> OccurrenceId {
        let ms = at.as_millisecond().max(0) as u64;
        let mut b = [0u8; 16];
        b[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
        OccurrenceId(Uuid::from_bytes(b))
    }

    /// 64 well-mixed bits of the id's hash part (bytes 9..16 are SHA-1 output, free of the
    /// timestamp and of the UUID version and variant bits), for deterministic jitter.
    pub fn hash64(&self) -> u64 {
        let b = self.0.as_bytes();
        let mut x = [0u8; 8];
        x[1..].copy_from_slice(&b[9..16]);
        x[0] = b[7]; // 8 more hash bits (byte 6 holds the version nibble)
        u64::from_be_bytes(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Ids from 1970 on sort as `(scheduled_for, id)`, and the floors bound each instant's
        /// ids: what lets a listing in planned order read the id index.
        #[test]
        fn ids_sort_by_planned_instant_and_floors_bound_them(
            a in (any::<u128>(), any::<u32>(), 0..=Timestamp::MAX.as_millisecond()),
            b in (any::<u128>(), any::<u32>(), 0..=Timestamp::MAX.as_millisecond()),
        ) {
            let id = |(s, v, ms): (u128, u32, i64)| {
                let at = Timestamp::from_millisecond(ms).expect("in range");
                (at, occurrence_id(ScheduleId(Uuid::from_u128(s)), v, at))
            };
            let (ta, ia) = id(a);
            let (tb, ib) = id(b);
            prop_assert_eq!((ta, ia).cmp(&(tb, ib)), ia.cmp(&ib));
            prop_assert!(OccurrenceId::floor(ta) <= ia);
            prop_assert_eq!(tb < ta, ib < OccurrenceId::floor(ta));
            prop_assert_eq!(tb >= ta, ib >= OccurrenceId::floor(ta));
        }
    }

    /// Stored ids must keep matching their keys across releases: these two were computed by
    /// an independent implementation (Python's `uuid.uuid5` over the same name and
    /// namespace, then the 48-bit millisecond prefix and the v8 version and variant bits).
    #[test]
    fn ids_are_stable_across_releases() {
        let at = Timestamp::from_millisecond(1_773_037_800_000).expect("in range");
        assert_eq!(
            occurrence_id(ScheduleId(Uuid::nil()), 1, at).to_string(),
            "019cd149-ca40-80b9-b9f6-2d2911f9cf4a"
        );
        let schedule = ScheduleId(
            "0192f3a4-5b6c-7d8e-9fa0-b1c2d3e4f506"
                .parse()
                .expect("a valid uuid"),
        );
        let before_1970 = Timestamp::from_millisecond(-1).expect("in range");
        assert_eq!(
            occurrence_id(schedule, u32::MAX, before_1970).to_string(),
            "ffffffff-ffff-8fad-bbc8-14db95d6990d"
        );
    }

    proptest! {
        /// The name hashed into an id is the documented text, whatever the lengths of its
        /// numbers.
        #[test]
        fn the_hashed_name_is_the_documented_text(s in any::<u128>(), v in any::<u32>(), ms in any::<i64>()) {
            let schedule = ScheduleId(Uuid::from_u128(s));
            let mut name = [0; KEY_NAME_MAX];
            prop_assert_eq!(
                std::str::from_utf8(key_name(&mut name, schedule, v, ms)).expect("ascii"),
                format!("{}/{v}/{ms}", schedule.0)
            );
        }
    }

    #[test]
    fn an_instant_before_1970_floors_to_the_least_id() {
        let before = Timestamp::from_millisecond(-1).expect("in range");
        assert_eq!(OccurrenceId::floor(before), OccurrenceId(Uuid::nil()));
        assert_eq!(
            OccurrenceId::floor(Timestamp::UNIX_EPOCH),
            OccurrenceId(Uuid::nil())
        );
    }
}
