//! Sharded maps of `key bytes → state` that a sweep can walk a bounded
//! slice at a time.
//!
//! Each map is split into shards, as `dashmap` does: a read-write lock over
//! one hash table per shard, the shard chosen by the key's hash. Unlike
//! `dashmap`, a shard here can be walked *by bucket index*
//! ([`hashbrown::HashTable::get_bucket_entry`]): a sweep step write-locks
//! one shard (only if no other call holds it), visits a bounded run of
//! buckets from where the previous step stopped, removes the entries that
//! are idle, and lets go. Removing an entry moves no other entry, so the
//! next step resumes at the same index. A table that grows between two steps
//! is rehashed; the walk then may visit an entry twice or miss one until the
//! next pass, and never removes a live entry (every removal is decided on
//! the entry itself, under the lock).

use std::hash::BuildHasher;
use std::sync::OnceLock;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use parking_lot::{
    MappedRwLockReadGuard, MappedRwLockWriteGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

/// One stored caller: its map key and its state.
type Item<V> = (Box<[u8]>, V);

/// Work units a sweep spends per bucket it visits.
pub(crate) const SLOT_COST: usize = 1;
/// Extra work units per entry it removes (unlinking it and freeing its key
/// and state cost far more than looking at a bucket).
pub(crate) const REMOVE_COST: usize = 32;
/// Work units per shard it locks.
const SHARD_COST: usize = 8;
/// Work units per entry a shrink moves to the smaller table.
const MOVE_COST: usize = 8;

/// A shard's table is shrunk after a sweep has walked it when at most a
/// quarter of its capacity is used ...
const SHRINK_WHEN_USED_AT_MOST: usize = 4;
/// ... its capacity is above this (small tables are not worth it) ...
const SHRINK_ABOVE_CAPACITY: usize = 128;
/// ... and, on the request path, at most this many entries must move (a
/// shrink rehashes every remaining entry under the shard's write lock).
const SHRINK_AT_MOST_ENTRIES: usize = 1024;

/// What a sweep may still spend, in work units (see the `*_COST` constants).
#[derive(Debug)]
pub(crate) struct Budget {
    left: usize,
}

impl Budget {
    pub(crate) fn new(units: usize) -> Self {
        Self { left: units }
    }

    fn spend(&mut self, units: usize) {
        self.left = self.left.saturating_sub(units);
    }

    pub(crate) fn is_spent(&self) -> bool {
        self.left == 0
    }
}

/// How a sweep treats a shard it has walked to the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A step on the request path: skip a shard another call holds, and
    /// shrink a walked shard only if it is mostly empty and the move small.
    Step,
    /// An explicit full sweep: wait for each shard's lock, and shrink every
    /// walked shard to fit.
    Full,
}

/// What one call of [`ShardedMap::sweep_shard`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Walk {
    /// The bucket index to resume at, or `None` once the shard is walked to
    /// its end.
    pub(crate) next: Option<usize>,
    /// Buckets visited.
    pub(crate) visited: usize,
    /// Entries removed.
    pub(crate) removed: usize,
}

/// Shards per map: as many as `dashmap` would use (four per available
/// core, rounded up to a power of two), at least two.
fn shard_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        (cores * 4).next_power_of_two().max(2)
    })
}

/// One shard, on a cache-line pair of its own so that threads locking
/// neighbouring shards do not contend on one line.
#[repr(align(128))]
struct Shard<V> {
    table: RwLock<HashTable<Item<V>>>,
}

/// A map from `policy name 0xFF caller` to one algorithm's state, hashed
/// with a randomly seeded fast hasher (callers choose their keys, so the
/// seed must be secret; foldhash seeds every map from process randomness).
pub(crate) struct ShardedMap<V> {
    shards: Box<[Shard<V>]>,
    hasher: foldhash::fast::RandomState,
    /// `64 - log2(shards)`: the shard is taken from the hash's bits below
    /// the top 7 (which the table itself uses as the bucket's tag).
    shift: u32,
}

impl<V> Default for ShardedMap<V> {
    fn default() -> Self {
        let n = shard_count();
        Self {
            shards: (0..n)
                .map(|_| Shard {
                    table: RwLock::new(HashTable::new()),
                })
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
            shift: u64::BITS - n.trailing_zeros(),
        }
    }
}

impl<V> ShardedMap<V> {
    #[inline]
    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    #[inline]
    fn shard(&self, hash: u64) -> &RwLock<HashTable<Item<V>>> {
        let i = ((hash << 7) >> self.shift) as usize & (self.shards.len() - 1);
        &self.shards[i].table
    }

    /// The key's state, under the shard's read lock while the guard lives.
    #[inline]
    pub(crate) fn get(&self, key: &[u8]) -> Option<MappedRwLockReadGuard<'_, V>> {
        let h = self.hash(key);
        RwLockReadGuard::try_map(self.shard(h).read(), |t| {
            t.find(h, |(k, _)| **k == *key).map(|(_, v)| v)
        })
        .ok()
    }

    /// The key's state, under the shard's write lock while the guard lives.
    #[inline]
    pub(crate) fn get_mut(&self, key: &[u8]) -> Option<MappedRwLockWriteGuard<'_, V>> {
        let h = self.hash(key);
        RwLockWriteGuard::try_map(self.shard(h).write(), |t| {
            t.find_mut(h, |(k, _)| **k == *key).map(|(_, v)| v)
        })
        .ok()
    }

    /// Under the shard's write lock: `update` the key's state if it has one,
    /// else run `insert` and store the state it returns (if any).
    pub(crate) fn update_or_insert<R>(
        &self,
        key: &[u8],
        update: impl FnOnce(&mut V) -> R,
        insert: impl FnOnce() -> (Option<V>, R),
    ) -> R {
        let h = self.hash(key);
        let mut table = self.shard(h).write();
        let hasher = &self.hasher;
        match table.entry(h, |(k, _)| **k == *key, |(k, _)| hasher.hash_one(&**k)) {
            Entry::Occupied(mut o) => update(&mut o.get_mut().1),
            Entry::Vacant(v) => {
                let (state, out) = insert();
                if let Some(state) = state {
                    v.insert((Box::from(key), state));
                }
                out
            }
        }
    }

    /// Removes the key's state and returns it.
    pub(crate) fn remove(&self, key: &[u8]) -> Option<V> {
        let h = self.hash(key);
        let mut table = self.shard(h).write();
        match table.find_entry(h, |(k, _)| **k == *key) {
            Ok(o) => Some(o.remove().0.1),
            Err(_) => None,
        }
    }

    /// Number of shards.
    pub(crate) fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Number of entries (each shard read-locked in turn).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.table.read().len()).sum()
    }

    /// Number of entries the shards hold without reallocating.
    pub(crate) fn capacity(&self) -> usize {
        self.shards.iter().map(|s| s.table.read().capacity()).sum()
    }

    /// Number of buckets a full walk visits, plus one per shard.
    pub(crate) fn walk_len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.table.read().num_buckets() + 1)
            .sum()
    }

    /// Walks shard `shard` from bucket `from` until its end or until
    /// `budget` is spent, removing every entry for which `keep` is false.
    /// When the walk reaches the end of the shard, shrinks its table as
    /// `mode` says. Entries are dropped after the lock is released.
    ///
    /// Returns `None`, having done nothing, if `mode` is [`Mode::Step`] and
    /// another call holds the shard's lock.
    pub(crate) fn sweep_shard(
        &self,
        shard: usize,
        from: usize,
        budget: &mut Budget,
        mode: Mode,
        mut keep: impl FnMut(&mut V) -> bool,
    ) -> Option<Walk> {
        let Some(s) = self.shards.get(shard) else {
            return Some(Walk {
                next: None,
                visited: 0,
                removed: 0,
            });
        };
        let mut table = match mode {
            Mode::Full => s.table.write(),
            Mode::Step => s.table.try_write()?,
        };
        budget.spend(SHARD_COST);
        let end = table.num_buckets();
        let mut dead: Vec<Item<V>> = Vec::new();
        let mut i = from;
        while i < end && !budget.is_spent() {
            if let Ok(mut e) = table.get_bucket_entry(i) {
                if !keep(&mut e.get_mut().1) {
                    if dead.capacity() == 0 {
                        dead.reserve(budget.left / (REMOVE_COST + SLOT_COST) + 1);
                    }
                    dead.push(e.remove().0);
                    budget.spend(REMOVE_COST);
                }
            }
            budget.spend(SLOT_COST);
            i += 1;
        }
        let visited = i.saturating_sub(from);
        let mut old = None;
        let next = if i < end {
            Some(i)
        } else {
            old = self.shrink(&mut table, budget, mode);
            None
        };
        drop(table);
        // Freeing is done without the lock: a large table goes back to the
        // operating system, which takes time in proportion to its size.
        drop(old);
        let removed = dead.len();
        drop(dead);
        Some(Walk {
            next,
            visited,
            removed,
        })
    }

    /// Shrinks a walked shard's table as `mode` says; returns the old table
    /// for the caller to drop once it has let go of the lock.
    fn shrink(
        &self,
        table: &mut HashTable<Item<V>>,
        budget: &mut Budget,
        mode: Mode,
    ) -> Option<HashTable<Item<V>>> {
        let (len, capacity) = (table.len(), table.capacity());
        let hasher = &self.hasher;
        let rehash = |(k, _): &Item<V>| hasher.hash_one(&**k);
        match mode {
            Mode::Full if len == 0 => (capacity > 0).then(|| std::mem::take(table)),
            // Under the lock; a no-op if the table is as small as it can be.
            Mode::Full => {
                table.shrink_to(len, rehash);
                None
            }
            Mode::Step
                if capacity > SHRINK_ABOVE_CAPACITY
                    && len <= capacity / SHRINK_WHEN_USED_AT_MOST
                    && len <= SHRINK_AT_MOST_ENTRIES =>
            {
                // Move the entries left into a table sized for them.
                let mut smaller = HashTable::with_capacity(len);
                for item in table.drain() {
                    smaller.insert_unique(rehash(&item), item, rehash);
                }
                budget.spend(len.saturating_mul(MOVE_COST));
                Some(std::mem::replace(table, smaller))
            }
            Mode::Step => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_of(n: u32) -> ShardedMap<u32> {
        let map = ShardedMap::default();
        for i in 0..n {
            map.update_or_insert(&i.to_be_bytes(), |_| (), || (Some(i), ()));
        }
        map
    }

    /// Walks every shard with budgets of `units`, as the store's steps do.
    fn walk(map: &ShardedMap<u32>, units: usize, mut keep: impl FnMut(&mut u32) -> bool) -> usize {
        let mut removed = 0;
        for shard in 0..map.shards() {
            let mut from = 0;
            loop {
                let mut budget = Budget::new(units);
                let w = map
                    .sweep_shard(shard, from, &mut budget, Mode::Step, &mut keep)
                    .expect("no other call holds the lock");
                removed += w.removed;
                match w.next {
                    Some(n) => from = n,
                    None => break,
                }
            }
        }
        removed
    }

    #[test]
    fn a_walk_in_small_steps_visits_every_entry_once() {
        let map = map_of(10_000);
        let mut seen = vec![0u8; 10_000];
        walk(&map, 50, |v| {
            seen[*v as usize] += 1;
            true
        });
        assert!(seen.iter().all(|&n| n == 1));
        assert_eq!(map.len(), 10_000);
    }

    #[test]
    fn a_step_removes_at_most_its_budget_and_a_walk_only_the_idle() {
        let map = map_of(10_000);
        // Odd values are idle.
        let keep_even = |v: &mut u32| *v % 2 == 0;
        let mut budget = Budget::new(SHARD_COST + 10 * (SLOT_COST + REMOVE_COST));
        let w = map
            .sweep_shard(0, 0, &mut budget, Mode::Step, keep_even)
            .unwrap();
        assert!(w.removed <= 10, "{w:?}");
        assert_eq!(map.len(), 10_000 - w.removed);
        walk(&map, 100, keep_even);
        assert_eq!(map.len(), 5_000);
        for i in 0..10_000u32 {
            assert_eq!(
                map.get(&i.to_be_bytes()).map(|v| *v),
                (i % 2 == 0).then_some(i)
            );
        }
    }

    #[test]
    fn a_contended_shard_is_skipped() {
        let map = map_of(100);
        let _held = map.shards[0].table.read();
        let mut budget = Budget::new(1_000);
        assert_eq!(
            map.sweep_shard(0, 0, &mut budget, Mode::Step, |_| false),
            None
        );
    }

    #[test]
    fn an_emptied_shard_is_shrunk() {
        let map = map_of(50_000);
        let before = map.capacity();
        assert!(before >= 50_000);
        walk(&map, 1_000, |_| false);
        assert_eq!(map.len(), 0);
        assert_eq!(map.capacity(), 0, "every table freed");
    }
}
