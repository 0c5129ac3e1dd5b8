use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use ratelimit_core::model::{
    self, Charge, FixedWindowState, SlidingLogState, SlidingWindowState, State, TokenBucketState,
};
use ratelimit_core::{Algorithm, Bucket, Clock, Decision, Micros, Quota, Result, Store};

use crate::clock::FastClock;
use crate::multi::MultiMap;

/// The default minimum clock time between two automatic sweeps.
const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// A map from `policy name 0xFF caller` to one algorithm's state, hashed
/// with a randomly seeded fast hasher (callers choose their keys, so the
/// seed must be secret; foldhash seeds every map from process randomness).
type Map<V> = DashMap<Box<[u8]>, V, foldhash::fast::RandomState>;

fn new_map<V>() -> Map<V> {
    DashMap::with_hasher(foldhash::fast::RandomState::default())
}

/// A window algorithm's state and the time after which it equals a fresh
/// caller's.
struct Timed<S> {
    state: S,
    expires_at: Micros,
}

/// An in-process store: [`DashMap`]s of caller → state over the core model.
///
/// **Per-process protection only**: with N instances behind a load balancer,
/// a limit of L becomes N × L. Share state through Redis to enforce one limit
/// across instances.
///
/// State is kept per `(quota name, algorithm, key)`, one map per algorithm,
/// each entry only as large as its algorithm needs:
///
/// | algorithm | entry |
/// |---|---|
/// | token bucket, whole µs per token (`refill == 1`) | one `AtomicU64`: the theoretical arrival time, updated by compare-and-swap under the map's read lock |
/// | token bucket, sub-µs remainder (`refill > 1`) | the two-word state, under the shard's write lock |
/// | fixed window, sliding window counter | the counters and an expiry |
/// | sliding log | the log and an expiry |
///
/// Idle entries are evicted after their derived TTL by an amortized sweep
/// (see the crate docs). The default clock is a [`FastClock`].
pub struct DashMapStore {
    multi: MultiMap,
    buckets: Map<AtomicU64>,
    fine_buckets: Map<TokenBucketState>,
    fixed: Map<Timed<FixedWindowState>>,
    sliding: Map<Timed<SlidingWindowState>>,
    logs: Map<Timed<SlidingLogState>>,
    clock: Arc<dyn Clock>,
    sweep_interval: Micros,
    next_sweep: AtomicU64,
}

impl std::fmt::Debug for DashMapStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DashMapStore")
            .field("entries", &self.len())
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
    /// A store on a [`FastClock`] (the system's wall clock, cheaply read).
    pub fn new() -> Self {
        Self::with_clock(FastClock::new())
    }

    /// A store that takes "now" from `clock` (a `ManualClock` in tests).
    pub fn with_clock(clock: impl Clock + 'static) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(clock);
        let interval = ratelimit_core::clock::duration_to_micros(DEFAULT_SWEEP_INTERVAL);
        Self {
            buckets: new_map(),
            fine_buckets: new_map(),
            fixed: new_map(),
            sliding: new_map(),
            logs: new_map(),
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

    /// Number of callers with stored state (including expired ones not yet swept).
    pub fn len(&self) -> usize {
        self.buckets.len()
            + self.fine_buckets.len()
            + self.fixed.len()
            + self.sliding.len()
            + self.logs.len()
            + self.multi.len()
    }

    /// Whether no caller has stored state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every entry whose TTL has passed; returns how many were removed.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        let before = self.len();
        self.retain_live(now);
        self.buckets.shrink_to_fit();
        self.fine_buckets.shrink_to_fit();
        self.fixed.shrink_to_fit();
        self.sliding.shrink_to_fit();
        self.logs.shrink_to_fit();
        self.multi.shrink_to_fit();
        before.saturating_sub(self.len())
    }

    /// Drops the entries equal to a fresh caller's at `now`.
    fn retain_live(&self, now: Micros) {
        // A bucket is full (fresh) once its theoretical arrival time has passed.
        self.buckets.retain(|_, a| a.load(Ordering::Acquire) > now);
        self.fine_buckets
            .retain(|_, s| s.tat > now || (s.tat == now && s.rem > 0));
        self.fixed.retain(|_, e| e.expires_at > now);
        self.sliding.retain(|_, e| e.expires_at > now);
        self.logs.retain(|_, e| e.expires_at > now);
        self.multi.sweep(now);
    }

    fn maybe_sweep(&self, now: Micros) {
        let due = self.next_sweep.load(Ordering::Relaxed);
        if now < due {
            return;
        }
        self.sweep_from(due, now);
    }

    #[cold]
    fn sweep_from(&self, due: Micros, now: Micros) {
        let next = now.saturating_add(self.sweep_interval);
        // Only the call that moves `next_sweep` sweeps.
        if self
            .next_sweep
            .compare_exchange(due, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.retain_live(now);
        }
    }
}

/// Map keys up to this many bytes are built on the stack, so a call for a
/// caller that already has state allocates nothing.
const INLINE_KEY: usize = 64;

/// Calls `f` with the map key of `(quota name, key)` (the algorithm is the
/// map's).
///
/// Policy names are ASCII without 0xFF, so `name 0xFF key` is unambiguous
/// for every key.
#[inline]
fn with_map_key<R>(key: &[u8], quota: &Quota, f: impl FnOnce(&[u8]) -> R) -> R {
    let name = quota.name().as_bytes();
    let len = name.len() + 1 + key.len();
    if len <= INLINE_KEY {
        let mut buf = [0u8; INLINE_KEY];
        buf[..name.len()].copy_from_slice(name);
        buf[name.len()] = 0xFF;
        buf[name.len() + 1..len].copy_from_slice(key);
        f(&buf[..len])
    } else {
        f(&[name, &[0xFF], key].concat())
    }
}

/// One token bucket step on a one-word state: read, decide with the model,
/// and on admission publish the new theoretical arrival time with one
/// compare-and-swap (retried if another call got there first). A denial
/// writes nothing.
#[inline]
fn bucket_step(word: &AtomicU64, b: &Bucket, now: Micros, cost: u64) -> Decision {
    let mut tat = word.load(Ordering::Acquire);
    loop {
        let (decision, next, _) =
            model::token_bucket_step(b, Some(TokenBucketState { tat, rem: 0 }), now, cost);
        if !decision.allowed {
            return decision;
        }
        match word.compare_exchange_weak(tat, next.tat, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return decision,
            Err(actual) => tat = actual,
        }
    }
}

/// How a window algorithm's state sits in [`State`].
trait Windowed: Sized {
    fn wrap(self) -> State;
    fn unwrap(state: State) -> Option<Self>;
}

macro_rules! windowed {
    ($t:ty, $v:ident) => {
        impl Windowed for $t {
            fn wrap(self) -> State {
                State::$v(self)
            }
            fn unwrap(state: State) -> Option<Self> {
                match state {
                    State::$v(s) => Some(s),
                    _ => None,
                }
            }
        }
    };
}
windowed!(FixedWindowState, FixedWindow);
windowed!(SlidingWindowState, SlidingWindow);
windowed!(SlidingLogState, SlidingLog);

/// One model step on an existing window entry, in place.
fn step_timed<S: Windowed + Default>(
    e: &mut Timed<S>,
    quota: &Quota,
    now: Micros,
    cost: u64,
) -> Result<Decision> {
    let prior = (e.expires_at > now).then(|| std::mem::take(&mut e.state).wrap());
    let step = model::decide(quota, prior, now, cost)?;
    // The model's state for a denial is the stored one: this puts it back.
    e.state = S::unwrap(step.state).unwrap_or_default();
    e.expires_at = now.saturating_add(step.ttl);
    Ok(step.decision)
}

impl DashMapStore {
    /// One decision, synchronously: what [`Store::decide`] does, without the
    /// boxed future of an object-safe async trait. The [`ratelimit_core::Limiter`]
    /// reaches it through [`Store::decide_sync`].
    pub fn decide_now(&self, key: &[u8], quota: &Quota, cost: u64) -> Result<Decision> {
        quota.check_cost(cost)?;
        let now = self.clock.now();
        self.maybe_sweep(now);
        match quota.algorithm() {
            Algorithm::TokenBucket(b) if b.refill() == 1 => {
                Ok(with_map_key(key, quota, |k| self.bucket(k, b, now, cost)))
            }
            Algorithm::TokenBucket(b) => Ok(with_map_key(key, quota, |k| {
                self.fine_bucket(k, b, now, cost)
            })),
            Algorithm::FixedWindow(_) => {
                with_map_key(key, quota, |k| windowed(&self.fixed, k, quota, now, cost))
            }
            Algorithm::SlidingWindow(_) => {
                with_map_key(key, quota, |k| windowed(&self.sliding, k, quota, now, cost))
            }
            Algorithm::SlidingLog(_) => {
                with_map_key(key, quota, |k| windowed(&self.logs, k, quota, now, cost))
            }
        }
    }

    /// A token bucket of whole microseconds per token: the hot path takes
    /// the map's read lock and updates one atomic word.
    #[inline]
    fn bucket(&self, k: &[u8], b: &Bucket, now: Micros, cost: u64) -> Decision {
        if let Some(word) = self.buckets.get(k) {
            return bucket_step(word.value(), b, now, cost);
        }
        self.new_bucket(k, b, now, cost)
    }

    #[cold]
    fn new_bucket(&self, k: &[u8], b: &Bucket, now: Micros, cost: u64) -> Decision {
        // The policy had a rate with a sub-µs remainder: the state stays in
        // that map (a denial keeps the remainder, as the model does).
        if let Some(mut s) = self.fine_buckets.get_mut(k) {
            return fine_step(s.value_mut(), b, now, cost);
        }
        // The entry API re-checks under the shard lock: another call may
        // have inserted the key in the meantime.
        let word = self
            .buckets
            .entry(Box::from(k))
            .or_insert_with(|| AtomicU64::new(0));
        bucket_step(word.value(), b, now, cost)
    }

    /// A token bucket whose rate leaves a sub-microsecond remainder: two
    /// words, updated under the shard's write lock.
    fn fine_bucket(&self, k: &[u8], b: &Bucket, now: Micros, cost: u64) -> Decision {
        if let Some(mut s) = self.fine_buckets.get_mut(k) {
            return fine_step(s.value_mut(), b, now, cost);
        }
        // The policy had a rate of whole µs per token: carry its state over
        // (a remainder of 0, so nothing is lost).
        let carried = self.buckets.remove(k).map(|(_, a)| TokenBucketState {
            tat: a.into_inner(),
            rem: 0,
        });
        let mut s = self
            .fine_buckets
            .entry(Box::from(k))
            .or_insert(carried.unwrap_or_default());
        fine_step(s.value_mut(), b, now, cost)
    }
}

/// One token bucket step on a two-word state the caller holds exclusively.
fn fine_step(s: &mut TokenBucketState, b: &Bucket, now: Micros, cost: u64) -> Decision {
    let (decision, next, _) = model::token_bucket_step(b, Some(*s), now, cost);
    if decision.allowed {
        *s = next;
    }
    decision
}

/// A window algorithm: its entry under the shard's write lock.
fn windowed<S: Windowed + Default>(
    map: &Map<Timed<S>>,
    k: &[u8],
    quota: &Quota,
    now: Micros,
    cost: u64,
) -> Result<Decision> {
    // Fast path: the caller has state; look it up by the borrowed key.
    if let Some(mut e) = map.get_mut(k) {
        return step_timed(e.value_mut(), quota, now, cost);
    }
    // A new caller: the entry API re-checks under the shard lock, as
    // another call may have inserted the key in the meantime.
    match map.entry(Box::from(k)) {
        dashmap::Entry::Occupied(mut o) => step_timed(o.get_mut(), quota, now, cost),
        dashmap::Entry::Vacant(v) => {
            let step = model::decide(quota, None, now, cost)?;
            v.insert(Timed {
                state: S::unwrap(step.state).unwrap_or_default(),
                expires_at: now.saturating_add(step.ttl),
            });
            Ok(step.decision)
        }
    }
}

#[async_trait]
impl Store for DashMapStore {
    async fn decide(&self, key: &[u8], quota: &Quota, cost: u64) -> Result<Decision> {
        self.decide_now(key, quota, cost)
    }

    fn decide_sync(&self, key: &[u8], quota: &Quota, cost: u64) -> Option<Result<Decision>> {
        Some(self.decide_now(key, quota, cost))
    }

    /// All or nothing under one lock: see the crate's `multi` module.
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

    /// A policy whose rate changes between one of whole microseconds per
    /// token and one with a sub-µs remainder (two different maps) keeps the
    /// caller's state, exactly as the model carries it over.
    #[test]
    fn a_bucket_keeps_its_state_across_a_change_of_rate() {
        let t0 = 1_800_000_000_000_000;
        let clock = ManualClock::new(t0);
        let store = DashMapStore::with_clock(clock.clone());
        let whole = Quota::token_bucket(Rate::per_second(10), 5).unwrap();
        let fine = Quota::token_bucket(Rate::per_second(7), 5).unwrap();
        let mut state = None;
        for i in 0..60u64 {
            let now = t0 + i * 37_003;
            clock.set(now);
            let q = if (i / 7) % 2 == 0 { &whole } else { &fine };
            let cost = 1 + i % 3;
            let want = model::decide(q, state.take(), now, cost).unwrap();
            let got = store.decide_now(b"k", q, cost).unwrap();
            assert_eq!(got, want.decision, "call {i}");
            state = Some(want.state);
        }
        assert_eq!(store.len(), 1);
    }

    /// Many threads on one hot bucket (the compare-and-swap path) admit
    /// exactly the burst under a frozen clock.
    #[test]
    fn concurrent_calls_on_one_bucket_never_over_admit() {
        let clock = ManualClock::new(1_800_000_000_000_000);
        let store = Arc::new(DashMapStore::with_clock(clock));
        let q = Quota::token_bucket(Rate::per_minute(100), 1_000).unwrap();
        let admitted = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1_000 {
                        if store.decide_now(b"hot", &q, 1).unwrap().allowed {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.load(Ordering::Relaxed), 1_000);
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
