//! Deterministic jitter: flexible windows and retry backoff.
//!
//! Both are derived from the occurrence id, not from a random number generator, so every node
//! computes the same answer for the same occurrence: a failover does not move an occurrence
//! inside its window, and a retried request does not pick a new delay.

use jiff::SignedDuration;

use crate::OccurrenceId;

/// Where inside its flexible window an occurrence becomes available:
/// `hash(occurrence_id) mod window`, at millisecond granularity.
///
/// A strict schedule (`window <= 0`) is never moved.
///
/// # Example
///
/// ```
/// use campanile_core::{flex_offset, occurrence_id, ScheduleId};
/// use jiff::SignedDuration;
/// use uuid::Uuid;
///
/// let id = occurrence_id(ScheduleId(Uuid::nil()), 1, "2026-01-01T00:00:00Z".parse()?);
/// let w = SignedDuration::from_secs(60);
/// let off = flex_offset(id, w);
/// assert!(off >= SignedDuration::ZERO && off < w);
/// assert_eq!(off, flex_offset(id, w)); // stable
/// assert_eq!(flex_offset(id, SignedDuration::ZERO), SignedDuration::ZERO);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn flex_offset(id: OccurrenceId, window: SignedDuration) -> SignedDuration {
    let w = window.as_millis();
    if w <= 0 {
        return SignedDuration::ZERO;
    }
    let w = u64::try_from(w).unwrap_or(u64::MAX);
    SignedDuration::from_millis((id.hash64() % w) as i64)
}

/// Exponential backoff with full jitter, bounded: the delay before retry number `attempt`
/// (1 = after the first failure) is uniform in `[0, min(max, initial * 2^(attempt-1))]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    initial: SignedDuration,
    max: SignedDuration,
}

/// An invalid backoff configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackoffError {
    /// `initial` must be positive and no greater than `max`.
    #[error(
        "backoff initial delay must be positive and at most the maximum (initial {initial}, max {max})"
    )]
    Invalid {
        /// The initial delay given.
        initial: String,
        /// The maximum delay given.
        max: String,
    },
}

impl Backoff {
    /// A backoff from `initial` doubling up to `max`.
    ///
    /// # Errors
    ///
    /// [`BackoffError::Invalid`] unless `0 < initial <= max`.
    pub fn new(initial: SignedDuration, max: SignedDuration) -> Result<Backoff, BackoffError> {
        if initial <= SignedDuration::ZERO || initial > max {
            return Err(BackoffError::Invalid {
                initial: format!("{initial:#}"),
                max: format!("{max:#}"),
            });
        }
        Ok(Backoff { initial, max })
    }

    /// The ceiling of the delay before retry `attempt`: `min(max, initial * 2^(attempt-1))`.
    pub fn ceiling(&self, attempt: u32) -> SignedDuration {
        let shift = attempt.saturating_sub(1).min(62);
        let init = self.initial.as_millis();
        let cap = self.max.as_millis();
        let grown = init.checked_mul(1i128 << shift).unwrap_or(i128::MAX);
        SignedDuration::from_millis(grown.min(cap) as i64)
    }

    /// The jittered delay before retry `attempt` of occurrence `id`: uniform in
    /// `[0, ceiling(attempt)]`, derived deterministically from `(id, attempt)`.
    pub fn delay(&self, id: OccurrenceId, attempt: u32) -> SignedDuration {
        let cap = self.ceiling(attempt).as_millis() as u64;
        let seed = splitmix64(id.hash64() ^ u64::from(attempt).wrapping_mul(0xd1b5_4a32_d192_ed03));
        SignedDuration::from_millis((seed % (cap + 1)) as i64)
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ScheduleId, occurrence_id};
    use jiff::Timestamp;
    use proptest::prelude::*;
    use uuid::Uuid;

    fn id(n: u128, secs: i64) -> OccurrenceId {
        occurrence_id(
            ScheduleId(Uuid::from_u128(n)),
            1,
            Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH),
        )
    }

    #[test]
    fn backoff_ceiling_doubles_then_caps() {
        let b = Backoff::new(
            SignedDuration::from_millis(100),
            SignedDuration::from_secs(1),
        )
        .expect("valid");
        let ceil: Vec<i64> = (1..=6).map(|a| b.ceiling(a).as_millis() as i64).collect();
        assert_eq!(ceil, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.ceiling(u32::MAX).as_millis(), 1000);
    }

    #[test]
    fn backoff_refuses_nonsense() {
        assert!(Backoff::new(SignedDuration::ZERO, SignedDuration::from_secs(1)).is_err());
        assert!(Backoff::new(SignedDuration::from_secs(2), SignedDuration::from_secs(1)).is_err());
    }

    #[test]
    fn flex_offsets_spread_over_the_window() {
        // 10k occurrences over a 10-slot window: each slot gets a fair share.
        let w = SignedDuration::from_millis(10);
        let mut slots = [0u32; 10];
        for n in 0..10_000 {
            slots[flex_offset(id(n, 0), w).as_millis() as usize] += 1;
        }
        assert!(slots.iter().all(|&c| (800..1200).contains(&c)), "{slots:?}");
    }

    proptest! {
        #[test]
        fn backoff_delay_is_within_bounds_and_stable(n in any::<u128>(), attempt in 1u32..100, init in 1i64..10_000, extra in 0i64..1_000_000) {
            let b = Backoff::new(SignedDuration::from_millis(init), SignedDuration::from_millis(init + extra)).expect("valid");
            let d = b.delay(id(n, 0), attempt);
            prop_assert!(d >= SignedDuration::ZERO && d <= b.ceiling(attempt));
            prop_assert_eq!(d, b.delay(id(n, 0), attempt));
        }

        #[test]
        fn flex_offset_is_inside_window(n in any::<u128>(), secs in 0i64..4_000_000_000, w in 1i64..86_400_000) {
            let w = SignedDuration::from_millis(w);
            let off = flex_offset(id(n, secs), w);
            prop_assert!(off >= SignedDuration::ZERO && off < w);
        }
    }
}
