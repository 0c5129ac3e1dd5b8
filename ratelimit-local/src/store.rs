use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use ratelimit_core::model::{
    self, FixedWindowState, SlidingLogState, SlidingWindowState, State, TokenBucketState,
};
use ratelimit_core::store::{Answer, Capabilities, Decisions, Request};
use ratelimit_core::{Algorithm, Bucket, Clock, Decision, Micros, Quota, Result, Store};

use crate::cas::{bucket_step, bucket_try, denied};
use crate::clock::FastClock;
use crate::packed::{pack, packs, unpack};
use crate::shards::{Budget, Key, Mode, ReadMostlyMap, ShardedMap, Walk};

/// The default clock time in which the automatic sweep walks every map once.
const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Work units one automatic sweep step may spend (see `shards.rs`: a bucket
/// visited costs 1, an entry removed 33, a shard locked 8): 2,048 buckets
/// looked at, or about 60 idle entries removed, a few microseconds (see
/// `BENCHMARKS.md`, "The local store's sweep").
const STEP_BUDGET: usize = 2_048;

/// The automatic sweep walks at most this many buckets per second of clock
/// time: a pass over a large store takes longer than the sweep interval
/// rather than walking millions of buckets (and evicting the callers' hot
/// cache lines) every second. A store of 1,000,000 callers (about
/// 1,400,000 buckets) is walked in about 14 s.
const MAX_WALK_PER_SECOND: u64 = 100_000;

/// Work units an explicit [`LocalStore::sweep`] spends per shard lock it
/// takes, so that it never holds one long.
const FULL_SWEEP_CHUNK: usize = 8 * STEP_BUDGET;

/// Maps walked by a sweep, in order: one-word token buckets, two-word
/// token buckets, fixed windows, sliding window counters, sliding logs.
const MAPS: usize = 5;

/// A window algorithm's state and the time after which it equals a fresh
/// caller's.
pub(crate) struct Timed<S> {
    pub(crate) state: S,
    pub(crate) expires_at: Micros,
}

/// Where the automatic sweep stands. A pass walks every shard of every map
/// in order, one bounded slice per step.
#[derive(Debug, Default)]
struct Cursor {
    /// Whether a pass is under way.
    active: bool,
    map: usize,
    shard: usize,
    bucket: usize,
    /// Clock time of the pass's first step.
    started: Micros,
    /// Clock time the pass is paced to take: the sweep interval, or longer
    /// for a store too large to walk at [`MAX_WALK_PER_SECOND`] in it.
    length: Micros,
    /// Buckets and shards in every map when the pass started.
    total: u64,
    /// Buckets and shards walked so far in this pass.
    walked: u64,
}

/// An in-process store: sharded hash maps of caller → state over the core
/// model.
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
/// | token bucket, up to 1,024 bucket units per µs (every rate up to 1e9 per second, and any whole number of µs per token) | one `AtomicU64`: the theoretical arrival time and its sub-µs remainder packed (`tat << 10 \| rem`), updated by compare-and-swap under the shard's read lock (one of eight lock words per shard, by thread) |
/// | token bucket, finer rates (or a clock past 2^53 µs) | the two-word state, under the shard's write lock |
/// | fixed window, sliding window counter | the counters and an expiry |
/// | sliding log | the log and an expiry |
///
/// Each map is split into shards the way `dashmap` splits one (a read-write
/// lock over a `hashbrown` table per shard, four shards per core rounded up
/// to a power of two); the shards are the crate's own so that a sweep can
/// walk one a few thousand buckets at a time.
///
/// A request over several quotas is decided all or nothing on the same
/// states single-quota requests use (see the crate docs).
///
/// Idle entries are evicted after their derived TTL by an incremental sweep
/// that costs each request at most a bounded slice of work (see the crate
/// docs). The default clock is a [`FastClock`].
pub struct LocalStore {
    pub(crate) buckets: ReadMostlyMap<AtomicU64>,
    pub(crate) fine_buckets: ShardedMap<TokenBucketState>,
    pub(crate) fixed: ShardedMap<Timed<FixedWindowState>>,
    pub(crate) sliding: ShardedMap<Timed<SlidingWindowState>>,
    pub(crate) logs: ShardedMap<Timed<SlidingLogState>>,
    clock: Arc<dyn Clock>,
    /// The same clock when it is a [`FastClock`], read without the trait
    /// object's indirect call.
    fast_clock: Option<Arc<FastClock>>,
    sweep_interval: Micros,
    /// Clock time at or after which the next call takes a sweep step.
    next_step: AtomicU64,
    /// Held (never waited for) by the call taking a step.
    cursor: Mutex<Cursor>,
    /// The most entries (caller and policy) tracked at once.
    max_callers: usize,
    /// New callers refused at the bound.
    refused: AtomicU64,
}

impl std::fmt::Debug for LocalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalStore")
            .field("entries", &self.len())
            .field("capacity", &self.capacity())
            .field("clock", &self.clock)
            .field("sweep_interval_micros", &self.sweep_interval)
            .finish()
    }
}

impl Default for LocalStore {
    fn default() -> Self {
        Self::new()
    }
}

impl LocalStore {
    /// A store on a [`FastClock`] (the system's wall clock, cheaply read).
    pub fn new() -> Self {
        Self::with_clock(FastClock::new())
    }

    /// A store that takes "now" from `clock` (a `ManualClock` in tests).
    pub fn with_clock(clock: impl Clock + 'static) -> Self {
        // The default clock is read directly on the hot path.
        let mut slot = Some(clock);
        let fast_clock = (&mut slot as &mut dyn std::any::Any)
            .downcast_mut::<Option<FastClock>>()
            .and_then(Option::take)
            .map(Arc::new);
        let clock: Arc<dyn Clock> = match (&fast_clock, slot) {
            (Some(fast), _) => fast.clone(),
            (None, Some(other)) => Arc::new(other),
            // Unreachable: the slot is emptied only when it held a `FastClock`.
            (None, None) => Arc::new(FastClock::new()),
        };
        let interval = ratelimit_core::clock::duration_to_micros(DEFAULT_SWEEP_INTERVAL);
        Self {
            buckets: ReadMostlyMap::default(),
            fine_buckets: ShardedMap::default(),
            fixed: ShardedMap::default(),
            sliding: ShardedMap::default(),
            logs: ShardedMap::default(),
            next_step: AtomicU64::new(clock.now().saturating_add(interval)),
            clock,
            fast_clock,
            sweep_interval: interval,
            cursor: Mutex::new(Cursor::default()),
            max_callers: usize::MAX,
            refused: AtomicU64::new(0),
        }
    }

    /// Sets the clock time in which the automatic sweep walks every map once
    /// (default 1 s; the first pass starts one interval after this call).
    /// A pass walks at most 100,000 table slots per second, so a large
    /// store's pass takes longer (about 14 s for 1,000,000 callers). An idle
    /// entry is evicted within about two passes of its TTL passing, given
    /// traffic (steps are taken by decisions). `Duration::MAX`
    /// turns automatic sweeps off (call [`LocalStore::sweep`] yourself).
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = ratelimit_core::clock::duration_to_micros(interval);
        self.next_step = AtomicU64::new(self.clock.now().saturating_add(self.sweep_interval));
        self.cursor = Mutex::new(Cursor::default());
        self
    }

    /// Bounds the entries (one per caller and policy) the store tracks at
    /// once (default: no bound). **When full**, a request that would track
    /// a new entry is refused ([`ratelimit_core::StoreError::Unavailable`],
    /// counted in [`LocalStore::refused`]): the limiter answers it by its
    /// failure policy (deny, unless fail-open was chosen). A tracked caller
    /// is **never** forgotten to make room (that would let a caller over
    /// its limit in again); room comes back as idle callers expire and the
    /// sweep evicts them. A flood of distinct keys (an unauthenticated key
    /// header) then costs at most this many entries of memory.
    pub fn max_callers(mut self, max: usize) -> Self {
        self.max_callers = max.max(1);
        self
    }

    /// Entries tracked now, from counters kept with every insert and
    /// removal (expired ones not yet swept included).
    pub fn tracked(&self) -> usize {
        self.buckets.entries()
            + self.fine_buckets.entries()
            + self.fixed.entries()
            + self.sliding.entries()
            + self.logs.entries()
    }

    /// Requests of new callers refused at the bound
    /// ([`LocalStore::max_callers`]).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Number of callers with stored state (including expired ones not yet swept).
    pub fn len(&self) -> usize {
        self.buckets.len()
            + self.fine_buckets.len()
            + self.fixed.len()
            + self.sliding.len()
            + self.logs.len()
    }

    /// Whether no caller has stored state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of callers the store's tables hold without growing. It falls
    /// back after a large eviction: the sweep shrinks the tables it empties.
    pub fn capacity(&self) -> usize {
        self.buckets.capacity()
            + self.fine_buckets.capacity()
            + self.fixed.capacity()
            + self.sliding.capacity()
            + self.logs.capacity()
    }

    /// Removes every entry whose TTL has passed and shrinks every table to
    /// fit; returns how many entries were removed.
    ///
    /// This walks every map: its cost grows with the number of stored
    /// callers (tens of milliseconds for a few hundred thousand), so it is
    /// meant for a background task or a maintenance hook, not for the
    /// request path, which the automatic sweep already serves a bounded
    /// slice at a time. It holds each shard's lock for a bounded slice of
    /// the walk, so decisions proceed in between (the shrink at the end of
    /// a shard moves that shard's remaining entries under its lock).
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        let mut removed = 0;
        for map in 0..MAPS {
            for shard in 0..self.shards() {
                let mut from = 0;
                loop {
                    let mut budget = Budget::new(FULL_SWEEP_CHUNK);
                    let Some(w) = self.sweep_shard(map, shard, from, &mut budget, Mode::Full, now)
                    else {
                        break;
                    };
                    removed += w.removed;
                    match w.next {
                        Some(next) => from = next,
                        None => break,
                    }
                }
            }
        }
        removed
    }

    /// Shards per map (every map has as many).
    fn shards(&self) -> usize {
        self.buckets.shards()
    }

    /// Buckets and shards a pass walks.
    fn walk_len(&self) -> usize {
        self.buckets.walk_len()
            + self.fine_buckets.walk_len()
            + self.fixed.walk_len()
            + self.sliding.walk_len()
            + self.logs.walk_len()
    }

    /// One bounded slice of shard `shard` of map `map`, dropping the entries
    /// equal to a fresh caller's at `now`.
    fn sweep_shard(
        &self,
        map: usize,
        shard: usize,
        from: usize,
        budget: &mut Budget,
        mode: Mode,
        now: Micros,
    ) -> Option<Walk> {
        match map {
            // A bucket is full (fresh) once its theoretical arrival time has passed.
            0 => self.buckets.sweep_shard(shard, from, budget, mode, |w| {
                !bucket_is_full(&unpack(*w.get_mut()), now)
            }),
            1 => self
                .fine_buckets
                .sweep_shard(shard, from, budget, mode, |s| !bucket_is_full(s, now)),
            2 => self
                .fixed
                .sweep_shard(shard, from, budget, mode, |e| e.expires_at > now),
            3 => self
                .sliding
                .sweep_shard(shard, from, budget, mode, |e| e.expires_at > now),
            _ => self
                .logs
                .sweep_shard(shard, from, budget, mode, |e| e.expires_at > now),
        }
    }

    #[inline]
    fn maybe_sweep(&self, now: Micros) {
        if now >= self.next_step.load(Ordering::Relaxed) {
            self.sweep_step(now);
        }
    }

    /// One step of the automatic sweep: at most [`STEP_BUDGET`] work units
    /// from where the previous step stopped, skipping a shard another call
    /// holds. Steps are paced so that a pass walks every map in about one
    /// sweep interval; passes start at most once per interval.
    #[cold]
    fn sweep_step(&self, now: Micros) {
        let mut c = match self.cursor.try_lock() {
            Ok(c) => c,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            // Another call is taking a step.
            Err(TryLockError::WouldBlock) => return,
        };
        if now < self.next_step.load(Ordering::Relaxed) {
            // Another call took this step in the meantime.
            return;
        }
        if !c.active {
            let total = self.walk_len() as u64;
            *c = Cursor {
                active: true,
                started: now,
                length: pass_length(self.sweep_interval, total),
                total,
                ..Cursor::default()
            };
        }
        let shards = self.shards();
        let mut budget = Budget::new(STEP_BUDGET);
        while c.active && !budget.is_spent() {
            let Some(w) = self.sweep_shard(c.map, c.shard, c.bucket, &mut budget, Mode::Step, now)
            else {
                // Contended: the next call tries this shard again.
                break;
            };
            c.walked += w.visited as u64;
            match w.next {
                Some(next) => c.bucket = next,
                None => {
                    c.walked += 1;
                    c.bucket = 0;
                    c.shard += 1;
                    if c.shard >= shards {
                        c.shard = 0;
                        c.map += 1;
                    }
                    c.active = c.map < MAPS;
                }
            }
        }
        let next = if c.active {
            pace(c.started, c.length, c.walked, c.total)
        } else {
            c.started.saturating_add(c.length)
        };
        self.next_step.store(next, Ordering::Relaxed);
    }
}

/// How long a pass over `total` buckets is paced to take: the sweep
/// interval, or as long as walking them at [`MAX_WALK_PER_SECOND`] takes.
fn pass_length(interval: Micros, total: u64) -> Micros {
    let at_max_rate = u128::from(total) * 1_000_000 / u128::from(MAX_WALK_PER_SECOND);
    interval.max(u64::try_from(at_max_rate).unwrap_or(u64::MAX))
}

/// When a pass that started at `started` and walks `total` buckets in
/// `interval` is due to have walked `walked`: the time of the next step.
/// A pass that has fallen behind (more idle entries than usual to remove,
/// or few calls to take steps) is due at once.
fn pace(started: Micros, interval: Micros, walked: u64, total: u64) -> Micros {
    if total == 0 {
        return started;
    }
    let at = u128::from(interval) * u128::from(walked.min(total)) / u128::from(total);
    started.saturating_add(u64::try_from(at).unwrap_or(u64::MAX))
}

/// Whether a bucket is back to full (a fresh caller's state) at `now`.
#[inline]
fn bucket_is_full(s: &TokenBucketState, now: Micros) -> bool {
    s.tat < now || (s.tat == now && s.rem == 0)
}

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
        let k = Key::named(quota.name_id(), key);
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
/// request's charges; decides by the store's clock.
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shards::{REMOVE_COST, SLOT_COST};
    use ratelimit_core::StoreExt;
    use ratelimit_core::{ManualClock, Rate};

    #[tokio::test]
    async fn idle_callers_are_evicted() {
        let clock = ManualClock::new(1_800_000_000_000_000);
        let store = LocalStore::with_clock(clock.clone()).sweep_interval(Duration::MAX);
        let quotas = [
            Quota::token_bucket(Rate::per_minute(100), 20).unwrap(),
            Quota::sliding_window(Rate::per_minute(100)).unwrap(),
        ];
        for i in 0..100_000u32 {
            let q = &quotas[(i % 2) as usize];
            assert!(
                store
                    .decide_one(&i.to_be_bytes(), q, 1)
                    .await
                    .unwrap()
                    .allowed
            );
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
        let store = LocalStore::with_clock(clock.clone());
        let q = Quota::fixed_window(Rate::per_second(10)).unwrap();
        for i in 0..1000u32 {
            store.decide_one(&i.to_be_bytes(), &q, 1).await.unwrap();
        }
        assert_eq!(store.len(), 1000);
        clock.advance(Duration::from_secs(2));
        // Calls over the next interval take the sweep's steps.
        for _ in 0..1000 {
            clock.advance(Duration::from_millis(1));
            store.decide_one(b"new", &q, 1).await.unwrap();
        }
        assert_eq!(store.len(), 1, "only the new caller is left");
    }

    /// At most this many entries are removed by one automatic step.
    const STEP_REMOVES_AT_MOST: usize = STEP_BUDGET / (REMOVE_COST + SLOT_COST) + 1;

    const CALLERS: u32 = 200_000;

    /// Quotas over every map of the store, each `(quota for idle callers,
    /// quota for live ones)`: the idle ones keep state for at most 2 s, the
    /// live ones for at least 20 minutes.
    fn quotas() -> Vec<(Quota, Quota)> {
        vec![
            (
                Quota::token_bucket(Rate::per_second(100), 10).unwrap(),
                Quota::token_bucket(Rate::per_hour(3), 3).unwrap(),
            ),
            (
                // Rates of more than 1,024 bucket units per µs (1,031 per
                // second; 1,031 per 30 days): the two-word map.
                Quota::token_bucket(Rate::new(1_031, Duration::from_secs(1)), 3).unwrap(),
                Quota::token_bucket(Rate::new(1_031, Duration::from_secs(30 * 86_400)), 3).unwrap(),
            ),
            (
                Quota::fixed_window(Rate::per_second(3)).unwrap(),
                Quota::fixed_window(Rate::per_hour(3)).unwrap(),
            ),
            (
                Quota::sliding_window(Rate::per_second(3)).unwrap(),
                Quota::sliding_window(Rate::per_hour(3)).unwrap(),
            ),
            (
                Quota::sliding_log(Rate::per_second(3)).unwrap(),
                Quota::sliding_log(Rate::per_hour(3)).unwrap(),
            ),
        ]
    }

    /// `CALLERS` idle callers spread over all five maps, and `live` live
    /// callers per map; every caller has made one call.
    async fn filled(clock: &ManualClock, live: u32) -> LocalStore {
        let store = LocalStore::with_clock(clock.clone());
        let quotas = quotas();
        let maps = quotas.len() as u32;
        for i in 0..CALLERS + live * maps {
            let live_caller = i >= CALLERS;
            let m = (i % maps) as usize;
            let key = i.to_be_bytes();
            let q = if live_caller {
                &quotas[m].1
            } else {
                &quotas[m].0
            };
            assert!(store.decide_one(&key, q, 1).await.unwrap().allowed);
        }
        assert_eq!(store.len(), (CALLERS + live * maps) as usize);
        let per_map = [
            store.buckets.len(),
            store.fine_buckets.len(),
            store.fixed.len(),
            store.sliding.len(),
            store.logs.len(),
        ];
        assert!(
            per_map.iter().all(|&n| n > 0),
            "every map is used: {per_map:?}"
        );
        store
    }

    /// The first decision after the interval, when 200,000 callers have
    /// expired, removes a bounded slice of them, not all.
    #[tokio::test]
    async fn one_decision_removes_a_bounded_slice_of_idle_callers() {
        let clock = ManualClock::new(1_800_000_000_000_000);
        let store = filled(&clock, 0).await;
        clock.advance(Duration::from_secs(3));
        let q = Quota::fixed_window(Rate::per_second(10)).unwrap();
        store.decide_one(b"new", &q, 1).await.unwrap();
        let removed = CALLERS as usize + 1 - store.len();
        assert!(removed >= 1, "the step removed nothing");
        assert!(
            removed <= STEP_REMOVES_AT_MOST,
            "one decision removed {removed} callers"
        );
        // The explicit sweep still removes every idle caller at once.
        assert_eq!(store.sweep(), CALLERS as usize - removed);
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn a_large_store_is_walked_at_a_bounded_rate() {
        let second = 1_000_000;
        assert_eq!(pass_length(second, 0), second);
        assert_eq!(pass_length(second, 50_000), second);
        assert_eq!(pass_length(second, 1_400_000), 14 * second);
        assert_eq!(pass_length(10 * second, 500_000), 10 * second);
    }

    /// Decisions over simulated time evict every idle caller, a bounded
    /// slice per decision, keep every live caller's state, and give the
    /// tables' memory back.
    #[tokio::test]
    async fn decisions_over_time_evict_every_idle_caller_and_no_live_one() {
        let clock = ManualClock::new(1_800_000_000_000_000);
        let live = 100;
        let store = filled(&clock, live).await;
        let capacity = store.capacity();
        assert!(capacity >= CALLERS as usize);
        clock.advance(Duration::from_secs(3));
        let traffic = Quota::token_bucket(Rate::per_second(1_000_000), 1_000).unwrap();
        let live_total = (live * 5) as usize;
        let mut len = store.len();
        let mut calls = 0;
        while len > live_total + 1 {
            assert!(calls < 100_000, "{len} callers left after {calls} calls");
            clock.advance(Duration::from_millis(1));
            store.decide_one(b"traffic", &traffic, 1).await.unwrap();
            let now = store.len();
            assert!(
                len + 1 - now <= STEP_REMOVES_AT_MOST,
                "one decision removed {} callers",
                len + 1 - now
            );
            len = now;
            calls += 1;
        }
        assert_eq!(store.len(), live_total + 1);
        // Every live caller kept its state: its second call leaves 1 of 3.
        let quotas = quotas();
        let maps = quotas.len() as u32;
        for i in CALLERS..CALLERS + live * maps {
            let m = (i % maps) as usize;
            let key = i.to_be_bytes();
            let d = store.decide_one(&key, &quotas[m].1, 1).await.unwrap();
            assert_eq!(d.remaining, 1, "caller {i}, map {m}");
        }
        // The emptied tables were shrunk.
        assert!(
            store.capacity() < capacity / 20,
            "capacity {} after eviction, {capacity} before",
            store.capacity()
        );
    }

    /// Keys of every length the short-key comparison treats apart (and
    /// longer ones, kept in the slot or boxed) keep their state and stay
    /// isolated, also from a key that holds another name's number.
    #[tokio::test]
    async fn keys_of_every_length_keep_state_and_stay_isolated() {
        let store = LocalStore::with_clock(ManualClock::new(1_800_000_000_000_000));
        let q = Quota::fixed_window(Rate::per_minute(3)).unwrap();
        // (18 and 19: the longest key kept in the table's slot, with the
        // name's four bytes, and the shortest boxed.)
        let lens = [
            1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 18, 19, 22, 23, 44, 51, 52, 64, 300,
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
        // `x`'s number followed by "a".
        let x = q.clone().named("x").unwrap();
        let xa = q.clone().named("xa").unwrap();
        assert_eq!(store.decide_one(b"a", &x, 1).await.unwrap().remaining, 2);
        assert_eq!(store.decide_one(b"a", &x, 1).await.unwrap().remaining, 1);
        assert_eq!(store.decide_one(b"", &xa, 1).await.unwrap().remaining, 2);
        let spelled = [&x.name_id().to_le_bytes()[..], b"a"].concat();
        assert_eq!(
            store.decide_one(&spelled, &q, 1).await.unwrap().remaining,
            2
        );
    }

    /// Quotas built apart under one name are one policy (their state is
    /// keyed by the name's number in the process, the same for both);
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
