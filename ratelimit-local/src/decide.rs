//! How a [`LocalStore`] decides one request: a single quota by its
//! algorithm's path (a one-word token bucket by compare-and-swap under the
//! shard's read lock; a two-word bucket or a window under its write lock),
//! several quotas all or nothing (`many.rs`), and new callers refused at
//! the store's bound.

use std::sync::atomic::{AtomicU64, Ordering};

use ratelimit_core::model::{
    self, FixedWindowState, SlidingLogState, SlidingWindowState, State, TokenBucketState,
};
use ratelimit_core::store::{Answer, Capabilities, Decisions, Request};
use ratelimit_core::{Algorithm, Bucket, Clock, Decision, Micros, Quota, Result, Store};

use crate::cas::{bucket_step, bucket_try, denied};
use crate::packed::{pack, packs, unpack};
use crate::shards::{Key, ShardedMap};
use crate::store::{LocalStore, Timed};

/// The cost error for a cost a quota can never admit (kept off the hot
/// path).
#[cold]
#[inline(never)]
fn cost_error(quota: &Quota, cost: u64) -> ratelimit_core::StoreError {
    match quota.check_cost(cost) {
        Err(e) => e.into(),
        // Unreachable: called only for a cost outside `1..=limit`.
        Ok(()) => ratelimit_core::CostError::Zero.into(),
    }
}

/// How a window algorithm's state sits in [`State`].
pub(crate) trait Windowed: Sized {
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

impl LocalStore {
    /// One decision for one quota: what [`Store::decide`] answers (in
    /// place) for a single-charge request, without building the request.
    #[inline]
    pub fn decide_now(&self, key: &[u8], quota: &Quota, cost: u64) -> Result<Decision> {
        self.decide_single(key, quota, cost, Ok, Err)
    }

    /// [`LocalStore::decide_now`]'s body, inlined into [`Store::decide`]
    /// too, with what each path hands back made by `ok` or `err` where the
    /// path ends: the trait object's call writes each decision straight
    /// into its answer, with no result in between that the paths share
    /// (copying such a result read, in whole words, fields that had just
    /// been written a byte at a time: a store-forwarding stall).
    #[inline(always)]
    fn decide_single<T>(
        &self,
        key: &[u8],
        quota: &Quota,
        cost: u64,
        ok: impl Fn(Decision) -> T,
        err: impl Fn(ratelimit_core::StoreError) -> T,
    ) -> T {
        // What `Quota::check_cost` checks, inline; the error is built off
        // the hot path.
        if cost == 0 || cost > quota.limit() {
            return err(cost_error(quota, cost));
        }
        let now = self.now();
        self.maybe_sweep(now);
        let k = Key::of(quota, key);
        let result = match quota.algorithm() {
            Algorithm::TokenBucket(b) => {
                if packs(b, now) {
                    return self.bucket(k, b, now, cost, ok, err);
                }
                self.fine_bucket(k, b, now, cost)
            }
            Algorithm::FixedWindow(_) => self.windowed(&self.fixed, k, quota, now, cost),
            Algorithm::SlidingWindow(_) => self.windowed(&self.sliding, k, quota, now, cost),
            Algorithm::SlidingLog(_) => self.windowed(&self.logs, k, quota, now, cost),
        };
        match result {
            Ok(d) => ok(d),
            Err(e) => err(e),
        }
    }

    /// The store's time: the default [`FastClock`] read directly, any
    /// other clock through its trait object.
    #[inline]
    fn now(&self) -> Micros {
        match &self.fast_clock {
            Some(c) => c.now(),
            None => self.clock.now(),
        }
    }

    /// A token bucket whose state packs into one word: the hot path takes
    /// the shard's read lock and updates the word by compare-and-swap.
    #[inline(always)]
    fn bucket<T>(
        &self,
        k: Key<'_>,
        b: &Bucket,
        now: Micros,
        cost: u64,
        ok: impl Fn(Decision) -> T,
        err: impl Fn(ratelimit_core::StoreError) -> T,
    ) -> T {
        let tried = self
            .buckets
            .read(k, |word| word.map(|w| bucket_try(w, b, now, cost)));
        let read = match tried {
            Some(Ok(decision)) => return ok(decision),
            Some(Err(read)) => read,
            None => {
                return match self.new_bucket(k, b, now, cost) {
                    Ok(d) => ok(d),
                    Err(e) => err(e),
                };
            }
        };
        // A denial, decided after the shard's lock is released: two
        // threads denying one hot key hold it for a load and a comparison.
        ok(denied(read, b, now, cost))
    }

    #[cold]
    fn new_bucket(&self, k: Key<'_>, b: &Bucket, now: Micros, cost: u64) -> Result<Decision> {
        // The caller's state is in the two-word map (written under a rate
        // or at a time that does not pack): it stays there.
        if let Some(decided) = self
            .fine_buckets
            .update(k, |s| s.map(|s| fine_step(s, b, now, cost)))
        {
            return Ok(decided);
        }
        self.admit_new()?;
        // The insert re-checks under the shard lock: another call may have
        // inserted the key in the meantime.
        Ok(self.buckets.update_or_insert(
            k,
            |word| bucket_step(word, b, now, cost),
            || {
                let (d, next, _) = model::token_bucket_step(b, None, now, cost);
                (d.allowed.then(|| AtomicU64::new(pack(next))), d)
            },
        ))
    }

    /// Whether a new caller may be tracked: always, unless the store is at
    /// its bound ([`LocalStore::max_callers`]); then the refusal, counted.
    #[inline]
    pub(crate) fn admit_new(&self) -> Result<()> {
        if self.max_callers == usize::MAX || self.tracked() < self.max_callers {
            return Ok(());
        }
        Err(self.refuse())
    }

    #[cold]
    fn refuse(&self) -> ratelimit_core::StoreError {
        self.refused.fetch_add(1, Ordering::Relaxed);
        ratelimit_core::StoreError::Unavailable {
            domain: "the local store".to_owned(),
            reason: format!(
                "full: {} callers tracked, its bound (LocalStore::max_callers); a new caller is \
                 decided by the limiter's failure policy until idle callers expire",
                self.tracked()
            ),
        }
    }

    /// A window algorithm: its entry under the shard's write lock.
    fn windowed<S: Windowed + Default>(
        &self,
        map: &ShardedMap<Timed<S>>,
        k: Key<'_>,
        quota: &Quota,
        now: Micros,
        cost: u64,
    ) -> Result<Decision> {
        // Fast path: the caller has state; look it up by the borrowed key.
        if let Some(decided) = map.update(k, |e| e.map(|e| step_timed(e, quota, now, cost))) {
            return decided;
        }
        self.admit_new()?;
        // A new caller: the insert re-checks under the shard lock, as another
        // call may have inserted the key in the meantime.
        map.update_or_insert(
            k,
            |e| step_timed(e, quota, now, cost),
            || match model::decide(quota, None, now, cost) {
                Ok(step) => (
                    Some(Timed {
                        state: S::unwrap(step.state).unwrap_or_default(),
                        expires_at: now.saturating_add(step.ttl),
                    }),
                    Ok(step.decision),
                ),
                Err(e) => (None, Err(e.into())),
            },
        )
    }

    /// A token bucket whose state does not pack (more than
    /// [`crate::packed::PACK_MAX_REFILL`] units per µs, or a clock past
    /// [`crate::packed::PACK_BEFORE`]): two words, updated under the shard's
    /// write lock.
    #[cold]
    fn fine_bucket(&self, k: Key<'_>, b: &Bucket, now: Micros, cost: u64) -> Result<Decision> {
        if let Some(decided) = self
            .fine_buckets
            .update(k, |s| s.map(|s| fine_step(s, b, now, cost)))
        {
            return Ok(decided);
        }
        // The caller's state was written in one word: carry it over exactly.
        let carried = self.buckets.remove(k).map(|a| unpack(a.into_inner()));
        if carried.is_none() {
            self.admit_new()?;
        }
        Ok(self.fine_buckets.update_or_insert(
            k,
            |s| fine_step(s, b, now, cost),
            || {
                let mut s = carried;
                let (d, next, _) = model::token_bucket_step(b, s, now, cost);
                if d.allowed {
                    s = Some(next);
                }
                (s, d)
            },
        ))
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

impl LocalStore {
    /// Answers a request in place: what [`Store::decide`] answers, without
    /// wrapping it in an [`Answer`]. One charge takes
    /// [`LocalStore::decide_now`]; several are decided all or nothing on
    /// the same states (see the crate docs).
    #[inline]
    pub fn decide_request(&self, request: Request<'_>) -> Result<Decisions> {
        if request.deadline.has_passed() {
            return Err(ratelimit_core::StoreError::Expired);
        }
        match request.charges {
            [c] => self
                .decide_now(request.key, c.quota, c.cost)
                .map(Decisions::one),
            charges => {
                request.check()?;
                let now = self.now();
                self.maybe_sweep(now);
                self.decide_many(request.key, charges, now)
            }
        }
    }

    /// [`Store::decide`] for a request of several charges (or none): out
    /// of line, so that a single charge's frame holds none of its state.
    #[cold]
    #[inline(never)]
    fn decide_several<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        Answer::ready(self.decide_request(request))
    }
}

/// Answers in place, always ([`Capabilities::in_process`]); atomic across a
/// request's charges; decides by the store's clock; reports its bound on
/// entries ([`Capabilities::max_callers`]) when one was set.
impl Store for LocalStore {
    #[inline]
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        if let [c] = request.charges {
            if request.deadline.has_passed() {
                return Answer::ready(Err(ratelimit_core::StoreError::Expired));
            }
            return self.decide_single(request.key, c.quota, c.cost, Answer::decided, |e| {
                Answer::ready(Err(e))
            });
        }
        self.decide_several(request)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .atomic(true)
            .in_process(true)
            .shared_clock(Some(self.clock.clone()))
            .max_callers((self.max_callers != usize::MAX).then_some(self.max_callers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::StoreExt;
    use ratelimit_core::{ManualClock, Rate};
    use std::sync::Arc;

    /// Keys of every length the short-key comparison treats apart (and
    /// longer ones, kept in the slot or boxed) keep their state and stay
    /// isolated, also from a key that spells another name's stored bytes.
    #[tokio::test]
    async fn keys_of_every_length_keep_state_and_stay_isolated() {
        let store = LocalStore::with_clock(ManualClock::new(1_800_000_000_000_000));
        let q = Quota::fixed_window(Rate::per_minute(3)).unwrap();
        // (21 and 22: the longest key kept in the table's slot, with the
        // default name's one byte of length, and the shortest boxed.)
        let lens = [
            1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 18, 19, 20, 21, 22, 23, 44, 51, 52, 64, 300,
        ];
        for len in lens {
            let a = vec![b'a'; len];
            let mut b = a.clone();
            *b.last_mut().unwrap() = b'b';
            assert_eq!(store.decide_one(&a, &q, 1).await.unwrap().remaining, 2);
            assert_eq!(store.decide_one(&a, &q, 1).await.unwrap().remaining, 1);
            assert_eq!(
                store.decide_one(&b, &q, 1).await.unwrap().remaining,
                2,
                "len {len}"
            );
        }
        assert_eq!(store.len(), 2 * lens.len());
        // Names and callers that spell the same bytes together are
        // different callers: `x` and "a", `xa` and "", the default name and
        // the bytes `x` and "a" are stored as (the name's length, 1, then
        // "xa").
        let x = q.clone().named("x").unwrap();
        let xa = q.clone().named("xa").unwrap();
        assert_eq!(store.decide_one(b"a", &x, 1).await.unwrap().remaining, 2);
        assert_eq!(store.decide_one(b"a", &x, 1).await.unwrap().remaining, 1);
        assert_eq!(store.decide_one(b"", &xa, 1).await.unwrap().remaining, 2);
        let spelled = b"\x01xa";
        assert_eq!(store.decide_one(spelled, &q, 1).await.unwrap().remaining, 2);
    }

    /// Quotas built apart under one name are one policy (their state is
    /// keyed by the name, the same for both; the default name given
    /// explicitly is the default name);
    /// another name is another policy, in the slot and on the heap alike.
    #[tokio::test]
    async fn quotas_of_one_name_share_state_and_other_names_do_not() {
        let store = LocalStore::with_clock(ManualClock::new(1_800_000_000_000_000));
        let rate = Rate::per_minute(3);
        let a = Quota::fixed_window(rate).unwrap().named("plan-a").unwrap();
        let a_again = Quota::fixed_window(rate).unwrap().named("plan-a").unwrap();
        let b = Quota::fixed_window(rate).unwrap().named("plan-b").unwrap();
        for caller in [&b"c"[..], &[b'c'; 40]] {
            assert_eq!(store.decide_one(caller, &a, 1).await.unwrap().remaining, 2);
            assert_eq!(
                store
                    .decide_one(caller, &a_again, 1)
                    .await
                    .unwrap()
                    .remaining,
                1
            );
            assert_eq!(store.decide_one(caller, &b, 1).await.unwrap().remaining, 2);
        }
        let default = Quota::fixed_window(rate).unwrap();
        let named_default = default.clone().named("default").unwrap();
        assert_eq!(
            store.decide_one(b"d", &default, 1).await.unwrap().remaining,
            2
        );
        assert_eq!(
            store
                .decide_one(b"d", &named_default, 1)
                .await
                .unwrap()
                .remaining,
            1
        );
    }

    /// A policy whose rate changes between one of whole microseconds per
    /// token and one with a sub-µs remainder (two different maps) keeps the
    /// caller's state, exactly as the model carries it over.
    #[test]
    fn a_bucket_keeps_its_state_across_a_change_of_rate() {
        let t0 = 1_800_000_000_000_000;
        let clock = ManualClock::new(t0);
        let store = LocalStore::with_clock(clock.clone());
        let whole = Quota::token_bucket(Rate::per_second(10), 5).unwrap();
        // A sub-µs remainder that packs in the word, and one that does not.
        let fine = Quota::token_bucket(Rate::per_second(7), 5).unwrap();
        let finest = Quota::token_bucket(Rate::per_second(3_000_000_000), 5).unwrap();
        let mut state = None;
        for i in 0..90u64 {
            let now = t0 + i * 37_003;
            clock.set(now);
            let q = [&whole, &fine, &finest, &fine, &whole][(i / 7 % 5) as usize];
            let cost = 1 + i % 3;
            let want = model::decide(q, state.take(), now, cost).unwrap();
            let got = store.decide_now(b"k", q, cost).unwrap();
            assert_eq!(got, want.decision, "call {i}");
            state = Some(want.state);
        }
        assert_eq!(store.len(), 1);
    }

    /// Many threads on one hot bucket (the compare-and-swap path, with and
    /// without a sub-µs remainder) admit exactly the burst under a frozen
    /// clock.
    #[test]
    fn concurrent_calls_on_one_bucket_never_over_admit() {
        for rate in [Rate::per_minute(100), Rate::per_second(7)] {
            concurrent_calls_admit_the_burst(Quota::token_bucket(rate, 1_000).unwrap());
        }
    }

    fn concurrent_calls_admit_the_burst(q: Quota) {
        let clock = ManualClock::new(1_800_000_000_000_000);
        let store = Arc::new(LocalStore::with_clock(clock));
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
        let store = LocalStore::new();
        let q = Quota::fixed_window(Rate::per_second(10)).unwrap();
        assert!(store.decide_one(b"k", &q, 11).await.is_err());
        assert!(store.decide_one(b"k", &q, 0).await.is_err());
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
        let limiter = Limiter::builder(LocalStore::with_clock(clock.clone()))
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
