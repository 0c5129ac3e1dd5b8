//! [`LocalStore`]: its maps, its settings and what it tracks. How it
//! decides is in `decide.rs` (and `many.rs` for several quotas at once),
//! how it forgets idle callers in `sweep.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratelimit_core::model::{
    FixedWindowState, SlidingLogState, SlidingWindowState, TokenBucketState,
};
use ratelimit_core::{Clock, Micros};

use crate::clock::FastClock;
use crate::shards::{ReadMostlyMap, ShardedMap};

/// The default clock time in which the automatic sweep walks every map once.
const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// A window algorithm's state and the time after which it equals a fresh
/// caller's.
pub(crate) struct Timed<S> {
    pub(crate) state: S,
    pub(crate) expires_at: Micros,
}

/// Where the automatic sweep stands. A pass walks every shard of every map
/// in order, one bounded slice per step.
#[derive(Debug, Default)]
pub(crate) struct Cursor {
    /// Whether a pass is under way.
    pub(crate) active: bool,
    pub(crate) map: usize,
    pub(crate) shard: usize,
    pub(crate) bucket: usize,
    /// Clock time of the pass's first step.
    pub(crate) started: Micros,
    /// Clock time the pass is paced to take: the sweep interval, or longer
    /// for a store too large to walk at `MAX_WALK_PER_SECOND` (`sweep.rs`) in it.
    pub(crate) length: Micros,
    /// Buckets and shards in every map when the pass started.
    pub(crate) total: u64,
    /// Buckets and shards walked so far in this pass.
    pub(crate) walked: u64,
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
    pub(crate) clock: Arc<dyn Clock>,
    /// The same clock when it is a [`FastClock`], read without the trait
    /// object's indirect call.
    pub(crate) fast_clock: Option<Arc<FastClock>>,
    pub(crate) sweep_interval: Micros,
    /// Clock time at or after which the next call takes a sweep step.
    pub(crate) next_step: AtomicU64,
    /// Held (never waited for) by the call taking a step.
    pub(crate) cursor: Mutex<Cursor>,
    /// The most entries (caller and policy) tracked at once.
    pub(crate) max_callers: usize,
    /// New callers refused at the bound.
    pub(crate) refused: AtomicU64,
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
}
