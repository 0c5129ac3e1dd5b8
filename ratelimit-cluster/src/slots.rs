//! Which master serves each hash slot: the store's own view, which routes
//! its calls (one connection per node, [`crate::nodes`]) and names their
//! failure domains (one breaker per master: a dead master affects only the
//! callers of its slots).
//!
//! It is filled from `CLUSTER SLOTS` (or fred's cached cluster state) when
//! the store is built, refreshed in the background once a second while
//! calls come (every [`REFRESH_SOON`] once a call found a node unreachable
//! or was redirected: a failover or a resharding is under way), and
//! corrected slot by slot on every `MOVED`. Until it is known, every slot
//! belongs to one domain, `cluster`. It routes the calls of the builder's
//! store and of a store over fred (one client per node); with a
//! `ClusterConnection` you bring, which routes by its own map, it only
//! names the failure domains.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ratelimit_redis::keys::SLOTS;

/// How often the map is refreshed while calls come.
pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// How often the map is refreshed while it is stale (a node was
/// unreachable, a call was redirected).
pub(crate) const REFRESH_SOON: Duration = Duration::from_millis(100);

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
    /// A call suggested the map is out of date.
    stale: AtomicBool,
}

impl Default for SlotMap {
    fn default() -> Self {
        Self {
            owners: RwLock::default(),
            unknown: Arc::from(UNKNOWN),
            base: Instant::now(),
            refreshed: AtomicU64::new(0),
            refreshing: AtomicBool::new(false),
            stale: AtomicBool::new(false),
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

    /// The distinct masters of the map, in slot order.
    pub(crate) fn masters(&self) -> Vec<Arc<str>> {
        let mut masters: Vec<Arc<str>> = Vec::new();
        for (_, _, master) in self.ranges() {
            if !masters.contains(&master) {
                masters.push(master);
            }
        }
        masters
    }

    /// The map as ranges of `(first slot, last slot, master)`, slots whose
    /// master is not known left out.
    pub(crate) fn ranges(&self) -> Vec<(u16, u16, Arc<str>)> {
        let owners = self.owners.read().unwrap_or_else(|p| p.into_inner());
        let mut ranges: Vec<(u16, u16, Arc<str>)> = Vec::new();
        for (slot, owner) in (0u16..).zip(owners.iter()) {
            if Arc::ptr_eq(owner, &self.unknown) {
                continue;
            }
            match ranges.last_mut() {
                Some((_, end, m)) if *end + 1 == slot && Arc::ptr_eq(m, owner) => *end = slot,
                _ => ranges.push((slot, slot, Arc::clone(owner))),
            }
        }
        ranges
    }

    /// A call suggests the map is out of date (a node was unreachable, a
    /// `MOVED`): the next refresh is due [`REFRESH_SOON`] after the last.
    pub(crate) fn suspect(&self) {
        self.stale.store(true, Ordering::Relaxed);
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
        if let Some(o) = owners.get_mut(usize::from(slot))
            && &**o != addr
        {
            *o = Arc::from(addr);
        }
    }

    /// Whether a refresh is due (then the caller does it, and says when it
    /// is done with [`SlotMap::refreshed`]).
    pub(crate) fn claim_refresh(&self) -> bool {
        let last = self.refreshed.load(Ordering::Acquire);
        let every = if self.stale.load(Ordering::Relaxed) {
            REFRESH_SOON
        } else {
            REFRESH_EVERY
        };
        let every = u64::try_from(every.as_micros()).unwrap_or(u64::MAX);
        (last == 0 || self.now().saturating_sub(last) >= every)
            && self
                .refreshing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// A refresh claimed with [`SlotMap::claim_refresh`] is over (it may
    /// have failed: the next is due a second later).
    pub(crate) fn refresh_done(&self) {
        self.stale.store(false, Ordering::Relaxed);
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
        assert_eq!(
            m.ranges()
                .iter()
                .map(|(a, b, o)| (*a, *b, o.to_string()))
                .collect::<Vec<_>>(),
            [
                (0, 5460, "127.0.0.1:7000".to_owned()),
                (5461, 5461, "127.0.0.1:7002".to_owned()),
                (5462, 16383, "127.0.0.1:7001".to_owned()),
            ]
        );
        let masters: Vec<String> = m.masters().iter().map(|o| o.to_string()).collect();
        assert_eq!(
            masters,
            ["127.0.0.1:7000", "127.0.0.1:7002", "127.0.0.1:7001"]
        );
    }

    #[test]
    fn a_suspect_map_is_refreshed_sooner() {
        // A map whose clock started 10 s ago; its last refresh is set by hand.
        let m = SlotMap {
            base: Instant::now()
                .checked_sub(Duration::from_secs(10))
                .expect("a monotonic clock 10 s old"),
            ..SlotMap::default()
        };
        m.set_ranges(&[(0, 16383, "127.0.0.1:7000".to_owned())]);
        assert!(!m.claim_refresh(), "just refreshed");
        let soon = u64::try_from(REFRESH_SOON.as_micros()).unwrap();
        m.refreshed.store(m.now() - soon, Ordering::Release);
        assert!(!m.claim_refresh(), "not suspected: due after a second");
        m.suspect();
        assert!(m.claim_refresh(), "suspected: due after REFRESH_SOON");
        m.refresh_done();
        m.refreshed.store(m.now() - soon, Ordering::Release);
        assert!(!m.claim_refresh(), "the refresh cleared the suspicion");
    }
}
