//! The console's sessions, kept by the node in memory: a random token (the cookie) names one;
//! the node keeps its SHA-256 only. Bounded: an idle session ends after [`IDLE`], any after
//! [`ABSOLUTE`], and past [`MAX_SESSIONS`] the least recently used is dropped. A node that
//! restarts forgets its sessions (operators sign in again); behind a load balancer, the
//! console needs requests of one browser sent to one node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use campanile_core::Clock;
use campanile_store::TenantId;
use jiff::{SignedDuration, Timestamp};
use sha2::{Digest, Sha256};

/// An unused session ends after this long.
pub(crate) const IDLE: SignedDuration = SignedDuration::from_hours(8);
/// Any session ends after this long.
pub(crate) const ABSOLUTE: SignedDuration = SignedDuration::from_hours(24);
/// Most sessions a node keeps.
pub(crate) const MAX_SESSIONS: usize = 10_000;
/// Most sessions one key keeps: signing in again and again with one key drops that key's
/// oldest sessions, never another key's.
pub(crate) const MAX_PER_KEY: usize = 50;

/// One signed-in browser.
#[derive(Debug, Clone)]
pub(crate) struct Session {
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

/// The node's sessions.
pub(crate) struct Sessions {
    inner: Mutex<HashMap<Vec<u8>, Session>>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
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

impl Sessions {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Sessions {
        Sessions {
            inner: Mutex::new(HashMap::new()),
            clock,
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Session>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a session; returns its token (the cookie's value).
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
        if mine >= MAX_PER_KEY
            && let Some(oldest) = map
                .iter()
                .filter(|(_, s)| s.key_hash == key_hash)
                .min_by_key(|(_, s)| s.seen)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        if map.len() >= MAX_SESSIONS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.seen)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            digest(&token),
            Session {
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

    /// The live session `token` names (marked as used now).
    pub(crate) fn get(&self, token: &str) -> Option<Session> {
        let now = self.clock.now();
        let mut map = self.map();
        let key = digest(token);
        let session = map.get_mut(&key)?;
        if !live(session, now) {
            map.remove(&key);
            return None;
        }
        session.seen = now;
        Some(session.clone())
    }

    /// Ends the session `token` names.
    pub(crate) fn remove(&self, token: &str) {
        self.map().remove(&digest(token));
    }

    /// How many sessions are live.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let now = self.clock.now();
        self.map().values().filter(|s| live(s, now)).count()
    }
}

fn live(s: &Session, now: Timestamp) -> bool {
    s.seen.checked_add(IDLE).is_ok_and(|t| now < t)
        && s.created.checked_add(ABSOLUTE).is_ok_and(|t| now < t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use campanile_core::ManualClock;

    #[test]
    fn sessions_end_when_idle_or_old_and_stay_bounded() {
        let clock = Arc::new(ManualClock::new(Timestamp::UNIX_EPOCH));
        let s = Sessions::new(clock.clone());
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
        // One key signing in again and again keeps its latest MAX_PER_KEY sessions and
        // drops no other key's.
        let other = s.create(vec![9], None, false, "other".into());
        for i in 0..MAX_PER_KEY + 5 {
            s.create(vec![3], None, false, format!("{i}"));
        }
        assert_eq!(s.len(), MAX_PER_KEY + 1);
        assert!(s.get(&other).is_some());
        for i in 0..MAX_SESSIONS + 5 {
            s.create(i.to_le_bytes().to_vec(), None, false, format!("{i}"));
        }
        assert_eq!(s.len(), MAX_SESSIONS);
        let c = s.create(vec![4], None, false, "c".into());
        s.remove(&c);
        assert!(s.get(&c).is_none());
    }
}
