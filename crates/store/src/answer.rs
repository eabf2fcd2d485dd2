//! What a claim's answer may hold: its size bound, counted occurrence by occurrence.

/// What an occurrence whose payload has `payload_len` bytes counts against a claim's size
/// bound ([`crate::Claimed::answer_bytes`]).
pub fn payload_answer_bytes(payload_len: usize) -> u64 {
    payload_len as u64 + crate::CLAIM_RECORD_BYTES
}

/// What is left of a claim's size bound ([`crate::OccurrenceClaim::max_bytes`]) as
/// occurrences are added to its answer in claim order: the first always fits; once one does
/// not, none after it does (the answer is a prefix of the claim order).
#[derive(Debug, Clone, Copy)]
pub struct ClaimRoom {
    left: u64,
    empty: bool,
    full: bool,
}

impl ClaimRoom {
    /// Room for an answer of at most `max_bytes`.
    pub fn new(max_bytes: u64) -> ClaimRoom {
        ClaimRoom {
            left: max_bytes,
            empty: true,
            full: false,
        }
    }

    /// Whether an occurrence counting `size` ([`crate::Claimed::answer_bytes`]) fits; counted if it
    /// does.
    pub fn take(&mut self, size: u64) -> bool {
        if self.full || (!self.empty && size > self.left) {
            self.full = true;
            return false;
        }
        self.left = self.left.saturating_sub(size);
        self.empty = false;
        true
    }

    /// Whether `n` more occurrences of at most `each` bytes all fit; counted (at `each`) if
    /// they do. Nothing is counted when they might not.
    pub fn take_all(&mut self, n: usize, each: u64) -> bool {
        let worst = each.saturating_mul(n as u64);
        if self.full || worst > self.left {
            return false;
        }
        self.left -= worst;
        self.empty &= n == 0;
        true
    }

    /// An occurrence did not fit: nothing more does.
    pub fn is_full(&self) -> bool {
        self.full
    }
}

#[cfg(test)]
mod claim_room_tests {
    use super::ClaimRoom;

    #[test]
    fn the_first_always_fits_and_the_answer_stops_at_the_first_that_does_not() {
        let mut room = ClaimRoom::new(100);
        assert!(room.take(150), "the first fits whatever its size");
        assert!(!room.take(1), "nothing is left after it");
        assert!(room.is_full());
        let mut room = ClaimRoom::new(100);
        assert!(room.take(60) && room.take(40));
        assert!(
            !room.take(1) && !room.take(0),
            "a prefix: nothing after the first refused"
        );
        let mut room = ClaimRoom::new(100);
        assert!(room.take_all(2, 50) && !room.take_all(1, 1) && room.take(0));
        assert!(!room.take(1));
    }
}
