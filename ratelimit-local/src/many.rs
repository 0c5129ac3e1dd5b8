//! Several quotas of one caller, decided all or nothing, on the same states
//! a single-quota request uses (one keyspace per quota).
//!
//! Every shard the caller's states live in is write-locked first, in one
//! global order (map by map, then shard by shard, each once), so two such
//! requests never wait for each other in a cycle, and a single-quota
//! request (which holds one shard lock at a time, never waiting for a
//! second) cannot come in between. Then the states are read, the model
//! decides over all of them ([`model::decide_all`]), and the writes go back
//! before any lock is let go: a denied call is counted in no quota, and no
//! other call on the caller sees half of one.

use std::sync::atomic::AtomicU64;

use ratelimit_core::model::SlidingWindowState;
use ratelimit_core::model::{self, Charge, FixedWindowState, SlidingLogState, State};
use ratelimit_core::store::Decisions;
use ratelimit_core::{Algorithm, Micros, Result, StoreError};
use smallvec::SmallVec;

use hashbrown::HashTable;

use crate::decide::Windowed;
use crate::packed::{pack, packs, unpack};
use crate::shards::{Item, Key, Locked, ShardedMap, TableLock};
use crate::store::{LocalStore, Timed};

/// Where one charge's state lives: `(shard, hash)` in its map; a token
/// bucket's state is in the one-word map or the two-word one.
#[derive(Clone, Copy)]
enum Place {
    Bucket {
        word: (usize, u64),
        fine: (usize, u64),
    },
    Fixed(usize, u64),
    Sliding(usize, u64),
    Log(usize, u64),
}

/// The locked shards of one map, each once, in shard order.
struct Held<'a, V, L: TableLock<HashTable<Item<V>>> + 'a> {
    guards: SmallVec<[(usize, Locked<'a, V, L>); 2]>,
}

impl<'a, V, L: TableLock<HashTable<Item<V>>>> Held<'a, V, L> {
    fn lock(map: &'a ShardedMap<V, L>, mut shards: SmallVec<[usize; 4]>) -> Self {
        shards.sort_unstable();
        shards.dedup();
        Self {
            guards: shards.into_iter().map(|s| (s, map.lock(s))).collect(),
        }
    }

    /// The locked shard `shard` (every place's shard is locked first).
    fn shard(&mut self, shard: usize) -> Result<&mut Locked<'a, V, L>> {
        self.guards
            .iter_mut()
            .find(|(s, _)| *s == shard)
            .map(|(_, g)| g)
            .ok_or_else(|| StoreError::message("local store: a shard was not locked", false))
    }
}

/// A window entry's state at `now`: `None` once it has expired.
fn window_state<S: Windowed + Clone>(entry: Option<&mut Timed<S>>, now: Micros) -> Option<State> {
    entry
        .filter(|e| e.expires_at > now)
        .map(|e| e.state.clone().wrap())
}

/// A window entry holding `state` until `expires_at`.
fn timed<S: Windowed + Default>(state: State, expires_at: Micros) -> Timed<S> {
    Timed {
        state: S::unwrap(state).unwrap_or_default(),
        expires_at,
    }
}

impl LocalStore {
    /// One all-or-nothing decision over `charges` (already checked: costs
    /// within limits, no quota twice) at `now`.
    pub(crate) fn decide_many(
        &self,
        key: &[u8],
        charges: &[Charge<'_>],
        now: Micros,
    ) -> Result<Decisions> {
        let places: SmallVec<[Place; 4]> = charges
            .iter()
            .map(|c| {
                let k = Key::of(c.quota, key);
                match c.quota.algorithm() {
                    Algorithm::TokenBucket(_) => Place::Bucket {
                        word: self.buckets.locate(k),
                        fine: self.fine_buckets.locate(k),
                    },
                    Algorithm::FixedWindow(_) => {
                        let (s, h) = self.fixed.locate(k);
                        Place::Fixed(s, h)
                    }
                    Algorithm::SlidingWindow(_) => {
                        let (s, h) = self.sliding.locate(k);
                        Place::Sliding(s, h)
                    }
                    Algorithm::SlidingLog(_) => {
                        let (s, h) = self.logs.locate(k);
                        Place::Log(s, h)
                    }
                }
            })
            .collect();
        let mut need: [SmallVec<[usize; 4]>; 5] = Default::default();
        for p in &places {
            match *p {
                Place::Bucket { word, fine } => {
                    need[0].push(word.0);
                    need[1].push(fine.0);
                }
                Place::Fixed(s, _) => need[2].push(s),
                Place::Sliding(s, _) => need[3].push(s),
                Place::Log(s, _) => need[4].push(s),
            }
        }
        // The global lock order: map by map, shard by shard.
        let [n0, n1, n2, n3, n4] = need;
        let mut words = Held::lock(&self.buckets, n0);
        let mut fines = Held::lock(&self.fine_buckets, n1);
        let mut fixed = Held::lock(&self.fixed, n2);
        let mut sliding = Held::lock(&self.sliding, n3);
        let mut logs = Held::lock(&self.logs, n4);

        let mut prior = Vec::with_capacity(charges.len());
        for (c, p) in charges.iter().zip(&places) {
            let k = Key::of(c.quota, key);
            prior.push(match *p {
                Place::Bucket { word, fine } => {
                    // A state in the two-word map stays there (see the
                    // single-quota path); else the one-word map's.
                    let in_fine = fines.shard(fine.0)?.get_mut(fine.1, k).map(|s| *s);
                    match in_fine {
                        Some(s) => Some(State::TokenBucket(s)),
                        None => words
                            .shard(word.0)?
                            .get_mut(word.1, k)
                            .map(|w| State::TokenBucket(unpack(*w.get_mut()))),
                    }
                }
                Place::Fixed(s, h) => window_state(fixed.shard(s)?.get_mut(h, k), now),
                Place::Sliding(s, h) => window_state(sliding.shard(s)?.get_mut(h, k), now),
                Place::Log(s, h) => window_state(logs.shard(s)?.get_mut(h, k), now),
            });
        }
        // A request that would track a new entry is refused at the bound
        // (before anything is decided or written).
        let mut new = false;
        for (c, p) in charges.iter().zip(&places) {
            let k = Key::of(c.quota, key);
            new |= match *p {
                Place::Bucket { word, fine } => {
                    !fines.shard(fine.0)?.contains(fine.1, k)
                        && !words.shard(word.0)?.contains(word.1, k)
                }
                Place::Fixed(s, h) => !fixed.shard(s)?.contains(h, k),
                Place::Sliding(s, h) => !sliding.shard(s)?.contains(h, k),
                Place::Log(s, h) => !logs.shard(s)?.contains(h, k),
            };
        }
        if new {
            self.admit_new()?;
        }
        let step = model::decide_all(charges, prior, now)?;
        for ((c, p), write) in charges.iter().zip(&places).zip(step.writes) {
            let Some((state, ttl)) = write else { continue };
            let k = Key::of(c.quota, key);
            let expires_at = now.saturating_add(ttl);
            match *p {
                Place::Bucket { word, fine } => {
                    let State::TokenBucket(s) = state else {
                        continue;
                    };
                    let f = fines.shard(fine.0)?;
                    if let Some(slot) = f.get_mut(fine.1, k) {
                        *slot = s;
                        continue;
                    }
                    let Algorithm::TokenBucket(b) = c.quota.algorithm() else {
                        continue;
                    };
                    if packs(b, now) {
                        words
                            .shard(word.0)?
                            .insert(word.1, k, AtomicU64::new(pack(s)));
                    } else {
                        words.shard(word.0)?.remove(word.1, k);
                        fines.shard(fine.0)?.insert(fine.1, k, s);
                    }
                }
                Place::Fixed(s, h) => {
                    let t: Timed<FixedWindowState> = timed(state, expires_at);
                    fixed.shard(s)?.insert(h, k, t);
                }
                Place::Sliding(s, h) => {
                    let t: Timed<SlidingWindowState> = timed(state, expires_at);
                    sliding.shard(s)?.insert(h, k, t);
                }
                Place::Log(s, h) => {
                    let t: Timed<SlidingLogState> = timed(state, expires_at);
                    logs.shard(s)?.insert(h, k, t);
                }
            }
        }
        Ok(step.decisions.into())
    }
}
