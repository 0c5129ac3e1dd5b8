//! [`FallbackStore`]: the limiter's own in-process store for the decisions
//! it makes while the shared store is unavailable.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::{Clock, Micros, SystemClock};
use crate::error::{Result, StoreError};
use crate::model::{self, State};
use crate::quota::AlgorithmKind;
use crate::store::{Answer, Capabilities, Decisions, Request, Store};

/// Shards of the map (a caller's request locks one).
const SHARDS: usize = 16;

/// The default bound on tracked callers: 100,000.
pub const DEFAULT_FALLBACK_CALLERS: usize = 100_000;

/// A full shard looks for expired callers to drop at most this often.
const PURGE_EVERY: Micros = 100_000;

/// One quota's state within a caller's entry.
#[derive(Debug)]
struct Slot {
    name: Arc<str>,
    kind: AlgorithmKind,
    state: State,
    expires_at: Micros,
}

/// A caller's states.
#[derive(Debug, Default)]
struct Entry {
    slots: Vec<Slot>,
}

impl Entry {
    fn expires_at(&self) -> Micros {
        self.slots.iter().map(|s| s.expires_at).max().unwrap_or(0)
    }
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<Box<[u8]>, Entry>,
    /// When this shard last dropped its expired callers.
    purged_at: Micros,
}

/// A small in-process store, **per-process protection only**, that the
/// [`crate::Limiter`] decides with while its shared store is unavailable
/// (`LimiterBuilder::instances`): each quota divided by the number of
/// instances, so that together they admit about what the shared store
/// would.
///
/// A mutex-sharded map of caller → states, decided by the core model (all
/// or nothing over a request's charges, one keyspace per quota), bounded in
/// the callers it tracks. **When full** (and no tracked caller has expired)
/// it refuses to track a new caller: that request fails with
/// [`StoreError::Unavailable`], and the limiter answers it by its failure
/// policy (deny, unless fail-open was chosen). It never forgets a caller
/// whose state still counts, which would let them in again.
///
/// It is meant for minutes of degraded operation, not as the main store:
/// use `ratelimit-local`'s `LocalStore` for that.
#[derive(Debug)]
pub struct FallbackStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    per_shard: usize,
    refused: AtomicU64,
}

impl Default for FallbackStore {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock), DEFAULT_FALLBACK_CALLERS)
    }
}

impl FallbackStore {
    /// A store on `clock` that tracks at most `max_callers` callers
    /// (rounded up to a multiple of 16, at least 16).
    pub fn new(clock: Arc<dyn Clock>, max_callers: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            clock,
            per_shard: max_callers.div_ceil(SHARDS).max(1),
            refused: AtomicU64::new(0),
        }
    }

    /// Callers tracked now (expired ones not yet dropped included).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Whether no caller is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Requests of new callers refused because the store was full.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn answer(&self, request: Request<'_>) -> Result<Decisions> {
        request.check_in_time()?;
        let now = self.clock.now();
        let i = (self.hasher.hash_one(request.key) as usize) % SHARDS;
        let mut shard = lock(&self.shards[i]);
        if !shard.map.contains_key(request.key) && shard.map.len() >= self.per_shard {
            if now.saturating_sub(shard.purged_at) >= PURGE_EVERY {
                shard.purged_at = now;
                shard.map.retain(|_, e| e.expires_at() > now);
            }
            if shard.map.len() >= self.per_shard {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return Err(StoreError::Unavailable {
                    domain: "the limiter's fallback store".to_owned(),
                    reason: format!(
                        "full ({} callers tracked): a new caller is answered by the failure \
                         policy",
                        self.per_shard * SHARDS
                    ),
                });
            }
        }
        let entry = shard.map.entry(Box::from(request.key)).or_default();
        let find = |slots: &[Slot], q: &crate::Quota| {
            slots
                .iter()
                .position(|s| s.kind == q.kind() && *s.name == *q.name())
        };
        let prior = request
            .charges
            .iter()
            .map(|c| {
                find(&entry.slots, c.quota)
                    .map(|i| &entry.slots[i])
                    .filter(|s| s.expires_at > now)
                    .map(|s| s.state.clone())
            })
            .collect();
        let step = model::decide_all(request.charges, prior, now)?;
        for (c, write) in request.charges.iter().zip(step.writes) {
            let Some((state, ttl)) = write else { continue };
            let expires_at = now.saturating_add(ttl);
            match find(&entry.slots, c.quota) {
                Some(i) => {
                    entry.slots[i].state = state;
                    entry.slots[i].expires_at = expires_at;
                }
                None => entry.slots.push(Slot {
                    name: c.quota.name_arc().clone(),
                    kind: c.quota.kind(),
                    state,
                    expires_at,
                }),
            }
        }
        if entry.slots.is_empty() {
            // A first call denied: nothing to remember.
            shard.map.remove(request.key);
        }
        Ok(step.decisions.into_iter().collect::<Decisions>())
    }
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Answers in place; atomic across a request's charges; the limiter's
/// clock; reports its bound on callers ([`Capabilities::max_callers`]:
/// the bound given to [`FallbackStore::new`], rounded up).
impl Store for FallbackStore {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        Answer::ready(self.answer(request))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .atomic(true)
            .in_process(true)
            .shared_clock(Some(self.clock.clone()))
            .max_callers(Some(self.per_shard * SHARDS))
    }
}
