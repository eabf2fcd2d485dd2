//! The console's logins, kept by the node in memory: a random token (the cookie) names one;
//! the node keeps its SHA-256 only. Bounded: an idle login ends after [`IDLE`], any after
//! [`ABSOLUTE`], and past [`MAX_LOGINS`] the least recently used is dropped. A node that
//! restarts forgets its logins (operators sign in again); behind a load balancer, the
//! console needs requests of one browser sent to one node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use campanile_core::Clock;
use campanile_store::TenantId;
use jiff::{SignedDuration, Timestamp};
use sha2::{Digest, Sha256};

/// An unused login ends after this long.
pub(crate) const IDLE: SignedDuration = SignedDuration::from_hours(8);
/// Any login ends after this long.
pub(crate) const ABSOLUTE: SignedDuration = SignedDuration::from_hours(24);
/// Most logins a node keeps.
pub(crate) const MAX_LOGINS: usize = 10_000;
/// Most logins one key keeps: signing in again and again with one key drops that key's
/// oldest logins, never another key's.
pub(crate) const MAX_PER_KEY: usize = 50;

/// One signed-in browser.
#[derive(Debug, Clone)]
pub(crate) struct Login {
    /// The hash of the API key it signed in with (checked again on every request).
    pub(crate) key_hash: Vec<u8>,
    /// The key's tenant (`None`: admin).
    pub(crate) tenant: Option<TenantId>,
    /// Whether the key manages tenants.
    pub(crate) admin: bool,
    /// The token its forms carry.
    pub(crate) csrf: String,
    /// What the page header shows.
    pub(crate) label: String,
    created: Timestamp,
    seen: Timestamp,
}

/// The node's logins.
pub(crate) struct Logins {
    inner: Mutex<HashMap<Vec<u8>, Login>>,
    /// Most logins kept, and most per key ([`MAX_LOGINS`], [`MAX_PER_KEY`]).
    limits: (usize, usize),
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Logins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logins").finish_non_exhaustive()
    }
}

/// A random token: 244 bits from two version-4 UUIDs.
pub(crate) fn token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

fn digest(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

impl Logins {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Logins {
        Logins::with_limits(clock, MAX_LOGINS, MAX_PER_KEY)
    }

    /// Logins bounded to `max` in all and `per_key` per key.
    fn with_limits(clock: Arc<dyn Clock>, max: usize, per_key: usize) -> Logins {
        Logins {
            inner: Mutex::new(HashMap::new()),
            limits: (max, per_key),
            clock,
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Login>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a login; returns its token (the cookie's value).
    pub(crate) fn create(
        &self,
        key_hash: Vec<u8>,
        tenant: Option<TenantId>,
        admin: bool,
        label: String,
    ) -> String {
        let now = self.clock.now();
        let token = token();
        let mut map = self.map();
        map.retain(|_, s| live(s, now));
        let mine = map.values().filter(|s| s.key_hash == key_hash).count();
        if mine >= self.limits.1
            && let Some(oldest) = map
                .iter()
                .filter(|(_, s)| s.key_hash == key_hash)
                .min_by_key(|(_, s)| s.seen)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        if map.len() >= self.limits.0
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.seen)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            digest(&token),
            Login {
                key_hash,
                tenant,
                admin,
                csrf: self::token(),
                label,
                created: now,
                seen: now,
            },
        );
        token
    }

    /// The live login `token` names (marked as used now).
    pub(crate) fn get(&self, token: &str) -> Option<Login> {
        let now = self.clock.now();
        let mut map = self.map();
        let key = digest(token);
        let login = map.get_mut(&key)?;
        if !live(login, now) {
            map.remove(&key);
            return None;
        }
        login.seen = now;
        Some(login.clone())
    }

    /// Ends the login `token` names.
    pub(crate) fn remove(&self, token: &str) {
        self.map().remove(&digest(token));
    }

    /// How many logins are live.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let now = self.clock.now();
        self.map().values().filter(|s| live(s, now)).count()
    }
}

fn live(s: &Login, now: Timestamp) -> bool {
    s.seen.checked_add(IDLE).is_ok_and(|t| now < t)
        && s.created.checked_add(ABSOLUTE).is_ok_and(|t| now < t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use campanile_core::ManualClock;

    #[test]
    fn logins_end_when_idle_or_old_and_stay_bounded() {
        let clock = Arc::new(ManualClock::new(Timestamp::UNIX_EPOCH));
        // The node's limits, scaled down (the same code; a test of 10,000 sign-ins, each
        // scanning the map, takes seconds in a debug build).
        let (max, per_key) = (200, 10);
        let s = Logins::with_limits(clock.clone(), max, per_key);
        let a = s.create(vec![1], None, true, "a".into());
        assert!(s.get(&a).is_some());
        assert!(s.get("not-a-token").is_none());
        clock.advance(SignedDuration::from_hours(7));
        assert!(s.get(&a).is_some(), "used within the idle limit");
        clock.advance(SignedDuration::from_hours(7));
        assert!(s.get(&a).is_some(), "used again");
        clock.advance(SignedDuration::from_hours(11));
        assert!(s.get(&a).is_none(), "past the absolute limit");
        let b = s.create(vec![2], None, true, "b".into());
        clock.advance(SignedDuration::from_hours(9));
        assert!(s.get(&b).is_none(), "idle too long");
        // One key signing in again and again keeps its latest `per_key` logins and drops no
        // other key's.
        let other = s.create(vec![9], None, false, "other".into());
        for i in 0..per_key + 5 {
            s.create(vec![3], None, false, format!("{i}"));
        }
        assert_eq!(s.len(), per_key + 1);
        assert!(s.get(&other).is_some());
        for i in 0..max + 5 {
            s.create(i.to_le_bytes().to_vec(), None, false, format!("{i}"));
        }
        assert_eq!(s.len(), max);
        let c = s.create(vec![4], None, false, "c".into());
        s.remove(&c);
        assert!(s.get(&c).is_none());
    }
}
