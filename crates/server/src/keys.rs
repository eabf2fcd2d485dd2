//! The node's cache of verified API keys.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use campanile_core::Clock;
use campanile_store::ApiKeyRecord;
use jiff::{SignedDuration, Timestamp};

/// Keys this node verified recently, so that a worker's every claim and completion does not
/// also read the key table: a verified key is trusted for `ttl` after it was read, so a key
/// revoked elsewhere (`campanile key revoke`, another node) is refused by this node at most
/// `ttl` later. Only keys found valid are kept (an unknown or revoked key is looked up every
/// time), and the map is bounded: when full, expired entries go, and if none had expired, all.
/// A zero `ttl` turns the cache off.
pub(crate) struct KeyCache {
    ttl: SignedDuration,
    clock: Arc<dyn Clock>,
    entries: Mutex<HashMap<Vec<u8>, (ApiKeyRecord, Timestamp)>>,
}

/// Most keys a node keeps verified at once.
const KEY_CACHE_CAPACITY: usize = 4096;

impl KeyCache {
    pub(crate) fn new(ttl: std::time::Duration, clock: Arc<dyn Clock>) -> KeyCache {
        KeyCache {
            ttl: SignedDuration::try_from(ttl).unwrap_or(SignedDuration::MAX),
            clock,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// An empty cache with the same period, timed by `clock`.
    pub(crate) fn with_clock(&self, clock: Arc<dyn Clock>) -> KeyCache {
        KeyCache {
            ttl: self.ttl,
            clock,
            entries: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn get(&self, hash: &[u8]) -> Option<ApiKeyRecord> {
        if self.ttl.is_zero() {
            return None;
        }
        let now = self.clock.now();
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(hash)
            .filter(|(_, read_at)| now.duration_since(*read_at) < self.ttl)
            .map(|(record, _)| record.clone())
    }

    pub(crate) fn put(&self, hash: Vec<u8>, record: &ApiKeyRecord) {
        if self.ttl.is_zero() {
            return;
        }
        let now = self.clock.now();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= KEY_CACHE_CAPACITY && !entries.contains_key(&hash) {
            entries.retain(|_, (_, read_at)| now.duration_since(*read_at) < self.ttl);
            if entries.len() >= KEY_CACHE_CAPACITY {
                entries.clear();
            }
        }
        entries.insert(hash, (record.clone(), now));
    }
}
