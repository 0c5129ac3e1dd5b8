//! Which master serves each hash slot: the store's own view, for the
//! failure domains (one breaker per master: a dead master affects only the
//! callers of its slots).
//!
//! The client libraries route commands by their own slot maps; this one
//! only names the failure domain a call belongs to. It is filled from
//! `CLUSTER SLOTS` (redis-rs) or fred's cached cluster state when the store
//! is built, refreshed in the background at most once a second while calls
//! come, and corrected slot by slot on every `MOVED`. Until it is known,
//! every slot belongs to one domain, `cluster`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ratelimit_redis::keys::SLOTS;

/// How often the map is refreshed while calls come.
pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// The domain of a slot whose master is not known yet.
const UNKNOWN: &str = "cluster";

/// The masters of the hash slots.
#[derive(Debug)]
pub(crate) struct SlotMap {
    owners: RwLock<Vec<Arc<str>>>,
    unknown: Arc<str>,
    base: Instant,
    /// When the map was last refreshed (µs since `base`, 0: never).
    refreshed: AtomicU64,
    refreshing: AtomicBool,
}

impl Default for SlotMap {
    fn default() -> Self {
        Self {
            owners: RwLock::default(),
            unknown: Arc::from(UNKNOWN),
            base: Instant::now(),
            refreshed: AtomicU64::new(0),
            refreshing: AtomicBool::new(false),
        }
    }
}

impl SlotMap {
    /// The master (`host:port`) serving `slot`, as far as the map knows.
    pub(crate) fn owner(&self, slot: u16) -> Arc<str> {
        self.owners
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(usize::from(slot))
            .cloned()
            .unwrap_or_else(|| Arc::clone(&self.unknown))
    }

    /// Replaces the map with `ranges` of `(first slot, last slot, master)`.
    pub(crate) fn set_ranges(&self, ranges: &[(u16, u16, String)]) {
        if ranges.is_empty() {
            return;
        }
        let mut owners = vec![Arc::clone(&self.unknown); SLOTS];
        for (start, end, addr) in ranges {
            let addr: Arc<str> = Arc::from(addr.as_str());
            for slot in *start..=(*end).min(SLOTS as u16 - 1) {
                owners[usize::from(slot)] = Arc::clone(&addr);
            }
        }
        *self.owners.write().unwrap_or_else(|p| p.into_inner()) = owners;
        self.refreshed.store(self.now(), Ordering::Release);
    }

    /// `slot` has moved to `addr` (a `MOVED` said so).
    pub(crate) fn moved(&self, slot: u16, addr: &str) {
        let mut owners = self.owners.write().unwrap_or_else(|p| p.into_inner());
        if let Some(o) = owners.get_mut(usize::from(slot)) {
            if &**o != addr {
                *o = Arc::from(addr);
            }
        }
    }

    /// Whether a refresh is due (then the caller does it, and says when it
    /// is done with [`SlotMap::refreshed`]).
    pub(crate) fn claim_refresh(&self) -> bool {
        let last = self.refreshed.load(Ordering::Acquire);
        let every = u64::try_from(REFRESH_EVERY.as_micros()).unwrap_or(u64::MAX);
        (last == 0 || self.now().saturating_sub(last) >= every)
            && self
                .refreshing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// A refresh claimed with [`SlotMap::claim_refresh`] is over (it may
    /// have failed: the next is due a second later).
    pub(crate) fn refresh_done(&self) {
        self.refreshed.store(self.now(), Ordering::Release);
        self.refreshing.store(false, Ordering::Release);
    }

    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_then_ranges_then_moved() {
        let m = SlotMap::default();
        assert_eq!(&*m.owner(5), "cluster");
        // Never read: due at once (and claimed once).
        assert!(m.claim_refresh());
        assert!(!m.claim_refresh());
        m.refresh_done();
        m.set_ranges(&[
            (0, 5460, "127.0.0.1:7000".to_owned()),
            (5461, 16383, "127.0.0.1:7001".to_owned()),
        ]);
        assert_eq!(&*m.owner(5460), "127.0.0.1:7000");
        assert_eq!(&*m.owner(5461), "127.0.0.1:7001");
        m.moved(5461, "127.0.0.1:7002");
        assert_eq!(&*m.owner(5461), "127.0.0.1:7002");
        assert_eq!(&*m.owner(5462), "127.0.0.1:7001");
        assert!(!m.claim_refresh(), "just refreshed");
    }
}
