use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use ratelimit_core::model::{self, Charge, State};
use ratelimit_core::{Clock, Decision, Micros, Quota, Result, Store, SystemClock};

use crate::multi::MultiMap;

/// The default minimum clock time between two automatic sweeps.
const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

struct Entry {
    state: State,
    expires_at: Micros,
}

/// An in-process store: a [`DashMap`] of caller → state over the core model.
///
/// **Per-process protection only**: with N instances behind a load balancer,
/// a limit of L becomes N × L. Share state through Redis to enforce one limit
/// across instances.
///
/// State is kept per `(quota name, algorithm, key)`. Idle entries are evicted
/// after their derived TTL by an amortized sweep (see the crate docs).
pub struct DashMapStore {
    map: DashMap<Box<[u8]>, Entry>,
    multi: MultiMap,
    clock: Arc<dyn Clock>,
    sweep_interval: Micros,
    next_sweep: AtomicU64,
}

impl std::fmt::Debug for DashMapStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DashMapStore")
            .field("entries", &self.map.len())
            .field("clock", &self.clock)
            .field("sweep_interval_micros", &self.sweep_interval)
            .finish()
    }
}

impl Default for DashMapStore {
    fn default() -> Self {
        Self::new()
    }
}

impl DashMapStore {
    /// A store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// A store that takes "now" from `clock` (a `ManualClock` in tests).
    pub fn with_clock(clock: impl Clock + 'static) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(clock);
        let interval = ratelimit_core::clock::duration_to_micros(DEFAULT_SWEEP_INTERVAL);
        Self {
            map: DashMap::new(),
            multi: MultiMap::default(),
            next_sweep: AtomicU64::new(clock.now().saturating_add(interval)),
            clock,
            sweep_interval: interval,
        }
    }

    /// Sets the minimum clock time between automatic sweeps. `Duration::MAX`
    /// turns automatic sweeps off (call [`DashMapStore::sweep`] yourself).
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = ratelimit_core::clock::duration_to_micros(interval);
        self.next_sweep = AtomicU64::new(self.clock.now().saturating_add(self.sweep_interval));
        self
    }

    /// Number of callers with stored state (including expired ones not yet
    /// swept): one per caller and quota, and one per caller checked against
    /// several quotas at once.
    pub fn len(&self) -> usize {
        self.map.len() + self.multi.len()
    }

    /// Whether no caller has stored state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every entry whose TTL has passed; returns how many were removed.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        let before = self.map.len();
        self.map.retain(|_, e| e.expires_at > now);
        self.map.shrink_to_fit();
        let multi = self.multi.sweep(now);
        self.multi.shrink_to_fit();
        before.saturating_sub(self.map.len()) + multi
    }

    fn maybe_sweep(&self, now: Micros) {
        let due = self.next_sweep.load(Ordering::Relaxed);
        if now < due {
            return;
        }
        let next = now.saturating_add(self.sweep_interval);
        // Only the call that moves `next_sweep` sweeps.
        if self
            .next_sweep
            .compare_exchange(due, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.map.retain(|_, e| e.expires_at > now);
            self.multi.sweep(now);
        }
    }
}

/// Map keys up to this many bytes are built on the stack, so a call for a
/// caller that already has state allocates nothing.
const INLINE_KEY: usize = 128;

/// Calls `f` with the map key of `(quota name, algorithm, key)`.
///
/// Policy names are ASCII without 0xFF, so `name 0xFF code 0xFF key` is
/// unambiguous for every key.
fn with_map_key<R>(key: &[u8], quota: &Quota, f: impl FnOnce(&[u8]) -> R) -> R {
    let parts: [&[u8]; 5] = [
        quota.name().as_bytes(),
        &[0xFF],
        quota.kind().code().as_bytes(),
        &[0xFF],
        key,
    ];
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len <= INLINE_KEY {
        let mut buf = [0u8; INLINE_KEY];
        let mut at = 0;
        for p in parts {
            buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        f(&buf[..len])
    } else {
        f(&parts.concat())
    }
}

/// One model step on an existing entry, in place.
fn step_entry(e: &mut Entry, quota: &Quota, now: Micros, cost: u64) -> Result<Decision> {
    let prior = if e.expires_at > now {
        Some(std::mem::replace(
            &mut e.state,
            State::FixedWindow(Default::default()),
        ))
    } else {
        None
    };
    let step = model::decide(quota, prior, now, cost)?;
    e.state = step.state;
    e.expires_at = now.saturating_add(step.ttl);
    Ok(step.decision)
}

impl DashMapStore {
    /// One decision, synchronously: what [`Store::decide`] does, without the
    /// boxed future of an object-safe async trait. For callers on a hot path
    /// that hold the concrete store (the local store never waits).
    pub fn decide_now(&self, key: &[u8], quota: &Quota, cost: u64) -> Result<Decision> {
        quota.check_cost(cost)?;
        let now = self.clock.now();
        self.maybe_sweep(now);
        with_map_key(key, quota, |k| {
            // Fast path: the caller has state; look it up by the borrowed key.
            if let Some(mut e) = self.map.get_mut(k) {
                return step_entry(e.value_mut(), quota, now, cost);
            }
            // A new caller: the entry API re-checks under the shard lock, as
            // another call may have inserted the key in the meantime.
            match self.map.entry(Box::from(k)) {
                dashmap::Entry::Occupied(mut o) => step_entry(o.get_mut(), quota, now, cost),
                dashmap::Entry::Vacant(v) => {
                    let step = model::decide(quota, None, now, cost)?;
                    v.insert(Entry {
                        state: step.state,
                        expires_at: now.saturating_add(step.ttl),
                    });
                    Ok(step.decision)
                }
            }
        })
    }
}

#[async_trait]
impl Store for DashMapStore {
    async fn decide(&self, key: &[u8], quota: &Quota, cost: u64) -> Result<Decision> {
        self.decide_now(key, quota, cost)
    }

    /// All or nothing under one lock: see the `multi` module docs.
    async fn decide_all(&self, key: &[u8], charges: &[Charge<'_>]) -> Result<Vec<Decision>> {
        let now = self.clock.now();
        self.maybe_sweep(now);
        self.multi.decide_all(key, charges, now)
    }

    fn atomic_all(&self) -> bool {
        true
    }

    fn clock(&self) -> Option<Arc<dyn Clock>> {
        Some(self.clock.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::{ManualClock, Rate};

    #[tokio::test]
    async fn idle_callers_are_evicted() {
        let clock = ManualClock::new(1_800_000_000_000_000);
        let store = DashMapStore::with_clock(clock.clone()).sweep_interval(Duration::MAX);
        let quotas = [
            Quota::token_bucket(Rate::per_minute(100), 20).unwrap(),
            Quota::sliding_window(Rate::per_minute(100)).unwrap(),
        ];
        for i in 0..100_000u32 {
            let q = &quotas[(i % 2) as usize];
            assert!(store.decide(&i.to_be_bytes(), q, 1).await.unwrap().allowed);
        }
        assert_eq!(store.len(), 100_000);
        // The token bucket refills 1 token in 0.6 s; the sliding window keeps
        // state until the end of the next window (at most 2 minutes).
        clock.advance(Duration::from_millis(600));
        assert_eq!(store.sweep(), 50_000, "token buckets are full again");
        clock.advance(Duration::from_secs(120));
        assert_eq!(store.sweep(), 50_000);
        assert!(store.is_empty());
    }

    #[tokio::test]
    async fn automatic_sweep_runs_on_the_request_path() {
        let clock = ManualClock::new(1_800_000_000_000_000);
        let store = DashMapStore::with_clock(clock.clone());
        let q = Quota::fixed_window(Rate::per_second(10)).unwrap();
        for i in 0..1000u32 {
            store.decide(&i.to_be_bytes(), &q, 1).await.unwrap();
        }
        assert_eq!(store.len(), 1000);
        clock.advance(Duration::from_secs(2));
        store.decide(b"new", &q, 1).await.unwrap();
        assert_eq!(store.len(), 1, "only the new caller is left");
    }

    #[tokio::test]
    async fn keys_longer_than_the_inline_buffer_keep_state_and_stay_isolated() {
        let store = DashMapStore::with_clock(ManualClock::new(1_800_000_000_000_000));
        let q = Quota::fixed_window(Rate::per_minute(3)).unwrap();
        for len in [
            INLINE_KEY - 20,
            INLINE_KEY - 13,
            INLINE_KEY - 12,
            INLINE_KEY,
            300,
        ] {
            let a = vec![b'a'; len];
            let mut b = a.clone();
            *b.last_mut().unwrap() = b'b';
            assert_eq!(store.decide(&a, &q, 1).await.unwrap().remaining, 2);
            assert_eq!(store.decide(&a, &q, 1).await.unwrap().remaining, 1);
            assert_eq!(
                store.decide(&b, &q, 1).await.unwrap().remaining,
                2,
                "len {len}"
            );
        }
        assert_eq!(store.len(), 10);
    }

    #[tokio::test]
    async fn bad_costs_are_errors() {
        let store = DashMapStore::new();
        let q = Quota::fixed_window(Rate::per_second(10)).unwrap();
        assert!(store.decide(b"k", &q, 11).await.is_err());
        assert!(store.decide(b"k", &q, 0).await.is_err());
    }
}

#[cfg(test)]
mod clock_tests {
    use super::*;
    use ratelimit_core::{Limiter, ManualClock, Rate};

    /// Regression: a limiter over a store on an injected clock must stamp
    /// `X-RateLimit-Reset` with that clock, not the system's.
    #[tokio::test]
    async fn the_limiter_reads_the_store_clock() {
        let clock = ManualClock::new(1_800_000_000_000_000);
        let limiter = Limiter::builder(DashMapStore::with_clock(clock.clone()))
            .quota(Quota::fixed_window(Rate::per_minute(5)).unwrap())
            .build()
            .unwrap();
        let d = limiter.check("k").await;
        assert_eq!(
            limiter.headers(&d).get("X-RateLimit-Reset"),
            Some("1800000060")
        );
    }
}
