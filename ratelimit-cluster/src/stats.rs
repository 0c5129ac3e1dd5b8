//! Counters of what the store had to do to reach a decision.

use std::sync::atomic::{AtomicU64, Ordering};

/// How often a [`crate::ClusterStore`] (and its clones) followed redirects
/// and retried; see [`crate::retry`] for when it does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterStats {
    /// Decisions made (script replies decoded).
    pub decisions: u64,
    /// `MOVED` redirects followed.
    pub moved: u64,
    /// `ASK` redirects followed.
    pub ask: u64,
    /// `NOSCRIPT` replies answered with the script's source.
    pub noscript: u64,
    /// Retries after an error proving the script had not run (`TRYAGAIN`,
    /// `CLUSTERDOWN`, connection refused, ...).
    pub retries: u64,
    /// Calls that failed (returned `Err`).
    pub errors: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) decisions: AtomicU64,
    pub(crate) moved: AtomicU64,
    pub(crate) ask: AtomicU64,
    pub(crate) noscript: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) errors: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> ClusterStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ClusterStats {
            decisions: get(&self.decisions),
            moved: get(&self.moved),
            ask: get(&self.ask),
            noscript: get(&self.noscript),
            retries: get(&self.retries),
            errors: get(&self.errors),
        }
    }
}
