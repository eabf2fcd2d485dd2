//! Tenant classes: the bounded label of the lag metrics.
//!
//! A histogram per tenant would make the metrics' cardinality grow with the number of tenants;
//! one for all of them hides a starved tenant behind a busy one. So an operator puts tenants
//! in a few classes (`free`, `pro`, `internal`, …; `default` unless set) and the schedule-lag
//! and claim-lag histograms carry the class as their `tenant_class` label. The store keeps at
//! most [`MAX_CLASSES`] distinct classes besides the default, and the exporter drops histogram
//! series idle for 15 minutes, so the label stays bounded whatever admins do.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::{Store, StoreError, TenantId};

/// The class of a tenant whose class was never set.
pub const DEFAULT_CLASS: &str = "default";

/// Most distinct classes across all tenants besides [`DEFAULT_CLASS`] (so the label has at
/// most one more value).
pub const MAX_CLASSES: usize = 16;

/// Checks a class name: 1–32 lower-case ASCII letters, digits, `-` or `_`.
///
/// # Errors
///
/// `Invalid`, saying what is allowed.
pub fn validate(class: &str) -> Result<(), StoreError> {
    let ok = !class.is_empty()
        && class.len() <= 32
        && class
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        // Quoted back at most in part: the value may be anything a client sent.
        let shown: String = class.chars().take(40).collect();
        let more = if class.chars().count() > 40 {
            "…"
        } else {
            ""
        };
        Err(StoreError::Invalid(format!(
            "class '{shown}{more}': use 1-32 lower-case letters, digits, '-' or '_'"
        )))
    }
}

/// Refuses `class` for a tenant when the other tenants already have `others` distinct
/// classes besides the default, `class` is not one of them (`taken` false), and one more
/// would pass [`MAX_CLASSES`]. The default class is always allowed.
///
/// # Errors
///
/// `Invalid`, naming the limit.
pub fn check_count(class: &str, others: i64, taken: bool) -> Result<(), StoreError> {
    if class != DEFAULT_CLASS && !taken && others >= MAX_CLASSES as i64 {
        return Err(StoreError::Invalid(format!(
            "class '{class}': there are already {others} classes, the most allowed \
             ({MAX_CLASSES}); put the tenant in one of them"
        )));
    }
    Ok(())
}

/// How long a node trusts the classes it read before reading them again: a class changed on
/// another node (or by the CLI) shows in this node's metrics at most this much later.
const FRESH_FOR: Duration = Duration::from_secs(30);

/// How often at most an unknown tenant (created since the last read) triggers a read.
const RETRY_UNKNOWN_AFTER: Duration = Duration::from_secs(1);

/// A node's copy of the tenants' classes, read from the store as a whole (one row per tenant,
/// never per schedule) and re-read when older than 30 s or when a tenant created since is
/// seen (at most once a second). A failed read keeps the previous copy; a tenant not in it is
/// labelled `default`. Metric labels only: nothing is decided by it.
pub struct TenantClasses {
    store: Arc<dyn Store>,
    copy: RwLock<Copy>,
    /// [`DEFAULT_CLASS`], allocated once: handed out for every tenant the copy lacks.
    default: Arc<str>,
}

impl std::fmt::Debug for TenantClasses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let copy = self.copy.read().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("TenantClasses")
            .field("tenants", &copy.by_tenant.len())
            .field("read_at", &copy.read_at)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Copy {
    by_tenant: HashMap<TenantId, Arc<str>>,
    /// When the last successful read was made.
    read_at: Option<Instant>,
    /// When the last read was started (successful or not).
    tried_at: Option<Instant>,
}

impl TenantClasses {
    /// An empty copy; the first lookup reads the classes.
    pub fn new(store: Arc<dyn Store>) -> TenantClasses {
        TenantClasses {
            store,
            copy: RwLock::new(Copy::default()),
            default: Arc::from(DEFAULT_CLASS),
        }
    }

    /// The class of `tenant`, re-reading the classes first if the copy is stale or does not
    /// know the tenant.
    pub async fn class_of(&self, tenant: TenantId) -> Arc<str> {
        if self.needs_read(Some(tenant)) {
            self.read().await;
        }
        self.cached(tenant)
    }

    /// Re-reads the classes if the copy is stale: for a caller that then looks many tenants
    /// up with [`TenantClasses::cached`] (the planner, once per pass).
    pub async fn refresh(&self) {
        if self.needs_read(None) {
            self.read().await;
        }
    }

    /// The class of `tenant` in the current copy, without reading.
    pub fn cached(&self, tenant: TenantId) -> Arc<str> {
        let copy = self.copy.read().unwrap_or_else(|e| e.into_inner());
        copy.by_tenant.get(&tenant).unwrap_or(&self.default).clone()
    }

    fn needs_read(&self, tenant: Option<TenantId>) -> bool {
        let copy = self.copy.read().unwrap_or_else(|e| e.into_inner());
        let since = |t: Option<Instant>| t.map_or(Duration::MAX, |t| t.elapsed());
        if since(copy.tried_at) < RETRY_UNKNOWN_AFTER {
            return false;
        }
        since(copy.read_at) >= FRESH_FOR || tenant.is_some_and(|t| !copy.by_tenant.contains_key(&t))
    }

    async fn read(&self) {
        {
            // Marked before reading, so concurrent callers do not all read at once.
            let mut copy = self.copy.write().unwrap_or_else(|e| e.into_inner());
            copy.tried_at = Some(Instant::now());
        }
        match self.store.tenant_list().await {
            Ok(tenants) => {
                let by_tenant = tenants
                    .into_iter()
                    .map(|t| (t.id, Arc::from(t.class.as_str())))
                    .collect();
                let mut copy = self.copy.write().unwrap_or_else(|e| e.into_inner());
                copy.by_tenant = by_tenant;
                copy.read_at = Some(Instant::now());
            }
            Err(e) => {
                tracing::debug!(error = %e, "could not read the tenant classes; keeping the previous ones");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_names_are_short_lower_case_words() {
        for ok in ["default", "pro", "tier-1", "internal_batch", "a"] {
            assert!(validate(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Pro", "with space", "é", &"x".repeat(33), "a/b", "a.b"] {
            let err = validate(bad).unwrap_err();
            assert!(matches!(err, StoreError::Invalid(_)), "{bad}: {err}");
        }
        // A huge value is not echoed whole.
        let err = validate(&"y".repeat(250_000)).unwrap_err().to_string();
        assert!(err.len() < 200, "{} bytes", err.len());
    }
}
