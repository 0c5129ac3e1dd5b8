//! Sharded maps of `(policy name, key bytes) → state` that a sweep can walk
//! a bounded slice at a time.
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

use std::hash::{BuildHasher, Hasher};
use std::ops::{Deref, DerefMut};
use std::sync::{OnceLock, PoisonError, TryLockError};

use crossbeam_utils::sync::ShardedLock;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use parking_lot::RwLock;

use crate::stored_key::StoredKey;

/// One stored caller: its map key (the policy name's length, one byte, the
/// name, then the caller's key; short keys in the slot itself) and its
/// state.
pub(crate) type Item<V> = (StoredKey, V);

/// A shard's table as a map locks it: [`Exclusive`] (one lock word; what a
/// map whose every decision writes under the lock wants) or
/// [`ReadMostly`] (what a map read under the lock on every decision and
/// written only for new callers and sweeps wants).
pub(crate) trait TableLock<T> {
    /// A read guard.
    type Read<'a>: Deref<Target = T>
    where
        Self: 'a;
    /// A write guard.
    type Write<'a>: DerefMut<Target = T>
    where
        Self: 'a;
    /// The lock over `value`.
    fn new(value: T) -> Self;
    /// Read-locks, waiting for a writer.
    fn read(&self) -> Self::Read<'_>;
    /// Write-locks, waiting for every other holder.
    fn write(&self) -> Self::Write<'_>;
    /// Write-locks if no one else holds the lock.
    fn try_write(&self) -> Option<Self::Write<'_>>;
}

/// One lock word per shard (`parking_lot`'s): reading and writing cost the
/// same. Readers on one shard share the word, so two threads reading one
/// hot key move its cache line between them on every call.
pub(crate) type Exclusive<T> = RwLock<T>;

/// `crossbeam`'s sharded lock: a reader locks one of eight lock words, the
/// one its thread is given, so threads reading one shard touch no common
/// cache line; a writer locks all eight. For maps whose state is updated
/// under the read lock (by compare-and-swap) and written under the write
/// lock only when a caller is added or removed.
pub(crate) type ReadMostly<T> = ShardedLock<T>;

impl<T> TableLock<T> for RwLock<T> {
    type Read<'a>
        = parking_lot::RwLockReadGuard<'a, T>
    where
        T: 'a;
    type Write<'a>
        = parking_lot::RwLockWriteGuard<'a, T>
    where
        T: 'a;
    fn new(value: T) -> Self {
        RwLock::new(value)
    }
    #[inline]
    fn read(&self) -> Self::Read<'_> {
        RwLock::read(self)
    }
    #[inline]
    fn write(&self) -> Self::Write<'_> {
        RwLock::write(self)
    }
    fn try_write(&self) -> Option<Self::Write<'_>> {
        RwLock::try_write(self)
    }
}

/// A panic under the lock poisons a `ShardedLock`; the table is used on as
/// with `parking_lot`'s lock, which has no poisoning (every state a panic
/// can leave is one the store can decide from).
impl<T> TableLock<T> for ShardedLock<T> {
    type Read<'a>
        = crossbeam_utils::sync::ShardedLockReadGuard<'a, T>
    where
        T: 'a;
    type Write<'a>
        = crossbeam_utils::sync::ShardedLockWriteGuard<'a, T>
    where
        T: 'a;
    fn new(value: T) -> Self {
        ShardedLock::new(value)
    }
    #[inline]
    fn read(&self) -> Self::Read<'_> {
        ShardedLock::read(self).unwrap_or_else(PoisonError::into_inner)
    }
    #[inline]
    fn write(&self) -> Self::Write<'_> {
        ShardedLock::write(self).unwrap_or_else(PoisonError::into_inner)
    }
    fn try_write(&self) -> Option<Self::Write<'_>> {
        match ShardedLock::try_write(self) {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// A map read under the lock on every decision ([`ReadMostly`] shards).
pub(crate) type ReadMostlyMap<V> = ShardedMap<V, ReadMostly<HashTable<Item<V>>>>;

/// The policy name the stored keys spell as no bytes: a quota not given a
/// name (or named `"default"`) keys its callers by their bytes and one
/// byte of length.
const DEFAULT_NAME: &str = "default";

/// A map key as looked up: borrowed, never concatenated. The stored key is
/// built from it only when a caller is inserted.
///
/// The policy name is part of the key itself, not a number standing for it:
/// a table of numbers would have to remember every name it was ever asked
/// for (a service naming a state per descriptor value would grow it with
/// every value it sees, for the life of the process), while a stored key
/// leaves with its caller's state.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Key<'a> {
    /// The policy name's bytes (empty for the default name); at most 64
    /// bytes (`Quota::named` refuses longer
    /// names), so its length fits the stored key's first byte.
    pub(crate) name: &'a [u8],
    /// The caller's key.
    pub(crate) key: &'a [u8],
}

impl<'a> Key<'a> {
    /// The key of caller `key` under `quota`'s policy name.
    #[inline]
    pub(crate) fn of(quota: &'a ratelimit_core::Quota, key: &'a [u8]) -> Self {
        let name = quota.name();
        let name = if name == DEFAULT_NAME {
            &[][..]
        } else {
            name.as_bytes()
        };
        Self { name, key }
    }

    /// The key of a policy name's bytes (at most 255) and a caller.
    #[inline]
    pub(crate) fn named(name: &'a [u8], key: &'a [u8]) -> Self {
        debug_assert!(name.len() <= usize::from(u8::MAX));
        Self { name, key }
    }

    /// The name's length as the stored key's first byte.
    #[inline(always)]
    fn name_len(&self) -> u8 {
        // Names are at most 64 bytes (`Quota::named` refuses longer ones).
        u8::try_from(self.name.len()).unwrap_or(u8::MAX)
    }

    /// Whether the stored map key `stored` is this key.
    #[inline(always)]
    fn matches(&self, stored: &[u8]) -> bool {
        // Equal lengths, then the caller's bytes (where keys differ most),
        // then the name and its length.
        let n = self.name.len();
        stored.len() == 1 + n + self.key.len()
            && stored.get(1 + n..).is_some_and(|k| bytes_eq(k, self.key))
            && stored.get(1..1 + n).is_some_and(|m| bytes_eq(m, self.name))
            && stored.first() == Some(&self.name_len())
    }

    /// The stored map key.
    fn to_stored(self) -> StoredKey {
        StoredKey::from_parts(&[&[self.name_len()], self.name, self.key])
    }

    /// The key a stored map key was built from.
    fn of_stored(stored: &'a [u8]) -> Self {
        match stored.split_first() {
            Some((&n, rest)) if usize::from(n) <= rest.len() => {
                let (name, key) = rest.split_at(usize::from(n));
                Self::named(name, key)
            }
            // Not a key `to_stored` built; hashed as a whole.
            _ => Self::named(&[], stored),
        }
    }
}

/// Byte-slice equality that compares short slices (the usual caller ids and
/// policy names) as one or two machine words instead of calling `memcmp`.
#[inline(always)]
fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    match a.len() {
        0 => true,
        1..4 => a == b,
        4..8 => {
            a.first_chunk::<4>() == b.first_chunk::<4>()
                && a.last_chunk::<4>() == b.last_chunk::<4>()
        }
        8..=16 => {
            a.first_chunk::<8>() == b.first_chunk::<8>()
                && a.last_chunk::<8>() == b.last_chunk::<8>()
        }
        _ => a == b,
    }
}

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
struct Shard<L> {
    table: L,
}

/// A map from `(policy name, caller)` (stored as the name's length, one
/// byte, the name and the caller) to one algorithm's state, hashed with a randomly seeded fast
/// hasher (callers choose their keys, so the seed must be secret; foldhash
/// seeds every map from process randomness).
///
/// Lookups take the two parts borrowed ([`Key`]): the hash is computed over
/// the name and then the caller, and the stored key compared part
/// by part, so no composite key is built per call.
pub(crate) struct ShardedMap<V, L = Exclusive<HashTable<Item<V>>>> {
    shards: Box<[Shard<L>]>,
    hasher: foldhash::fast::RandomState,
    /// `shards - 1`: the shard is taken from the hash's bits 32 and up,
    /// which neither the table's bucket index (the low bits of tables
    /// below 2^32 buckets) nor its tag (the top 7) uses.
    mask: usize,
    /// Entries in every shard (kept with each insert and removal, so the
    /// store's bound on callers costs one load to check).
    entries: std::sync::atomic::AtomicUsize,
    _values: std::marker::PhantomData<fn() -> V>,
}

impl<V, L: TableLock<HashTable<Item<V>>>> Default for ShardedMap<V, L> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V, L: TableLock<HashTable<Item<V>>>> ShardedMap<V, L> {
    /// An empty map.
    pub(crate) fn new() -> Self {
        let n = shard_count();
        Self {
            shards: (0..n)
                .map(|_| Shard {
                    table: L::new(HashTable::new()),
                })
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
            mask: n - 1,
            entries: std::sync::atomic::AtomicUsize::new(0),
            _values: std::marker::PhantomData,
        }
    }

    /// The hash of a key: the name's bytes, then the caller's (each part
    /// length-mixed by the hasher, so the split is unambiguous).
    #[inline]
    fn hash(&self, key: Key<'_>) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write_u8(key.name_len());
        if !key.name.is_empty() {
            h.write(key.name);
        }
        h.write(key.key);
        h.finish()
    }

    /// The hash of a stored map key (when a table grows or shrinks).
    fn hash_stored(&self, stored: &[u8]) -> u64 {
        self.hash(Key::of_stored(stored))
    }

    #[inline]
    fn shard(&self, hash: u64) -> &L {
        let i = (hash >> 32) as usize & self.mask;
        &self.shards[i].table
    }

    /// `f` of the key's state (`None`: no state), under the shard's read
    /// lock.
    #[inline]
    pub(crate) fn read<R>(&self, key: Key<'_>, f: impl FnOnce(Option<&V>) -> R) -> R {
        let h = self.hash(key);
        let table = self.shard(h).read();
        f(table.find(h, |(k, _)| key.matches(k)).map(|(_, v)| v))
    }

    /// `f` of the key's state (`None`: no state), under the shard's write
    /// lock.
    #[inline]
    pub(crate) fn update<R>(&self, key: Key<'_>, f: impl FnOnce(Option<&mut V>) -> R) -> R {
        let h = self.hash(key);
        let mut table = self.shard(h).write();
        f(table.find_mut(h, |(k, _)| key.matches(k)).map(|(_, v)| v))
    }

    /// Under the shard's write lock: `update` the key's state if it has one,
    /// else run `insert` and store the state it returns (if any).
    pub(crate) fn update_or_insert<R>(
        &self,
        key: Key<'_>,
        update: impl FnOnce(&mut V) -> R,
        insert: impl FnOnce() -> (Option<V>, R),
    ) -> R {
        let h = self.hash(key);
        let mut table = self.shard(h).write();
        match table.entry(h, |(k, _)| key.matches(k), |(k, _)| self.hash_stored(k)) {
            Entry::Occupied(mut o) => update(&mut o.get_mut().1),
            Entry::Vacant(v) => {
                let (state, out) = insert();
                if let Some(state) = state {
                    v.insert((key.to_stored(), state));
                    self.entries
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                out
            }
        }
    }

    /// The shard a key lives in, and its hash: what [`ShardedMap::lock`]
    /// and [`Locked`] take.
    #[inline]
    pub(crate) fn locate(&self, key: Key<'_>) -> (usize, u64) {
        let h = self.hash(key);
        ((h >> 32) as usize & self.mask, h)
    }

    /// Write-locks shard `shard` for several operations (a request over
    /// several quotas holds every shard its states live in, locked in one
    /// global order: see the store's `decide_many`).
    pub(crate) fn lock(&self, shard: usize) -> Locked<'_, V, L> {
        Locked {
            map: self,
            table: self.shards[shard].table.write(),
        }
    }

    /// Removes the key's state and returns it.
    pub(crate) fn remove(&self, key: Key<'_>) -> Option<V> {
        let h = self.hash(key);
        let mut table = self.shard(h).write();
        match table.find_entry(h, |(k, _)| key.matches(k)) {
            Ok(o) => {
                self.entries
                    .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                Some(o.remove().0.1)
            }
            Err(_) => None,
        }
    }

    /// Entries stored now (one atomic load; exact once concurrent inserts
    /// and removals have finished).
    pub(crate) fn entries(&self) -> usize {
        self.entries.load(std::sync::atomic::Ordering::Relaxed)
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
            if let Ok(mut e) = table.get_bucket_entry(i)
                && !keep(&mut e.get_mut().1)
            {
                if dead.capacity() == 0 {
                    dead.reserve(budget.left / (REMOVE_COST + SLOT_COST) + 1);
                }
                dead.push(e.remove().0);
                budget.spend(REMOVE_COST);
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
        self.entries
            .fetch_sub(removed, std::sync::atomic::Ordering::Relaxed);
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
        let rehash = |(k, _): &Item<V>| self.hash_stored(k);
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

/// One shard of a map, write-locked ([`ShardedMap::lock`]).
pub(crate) struct Locked<'a, V, L: TableLock<HashTable<Item<V>>> + 'a> {
    map: &'a ShardedMap<V, L>,
    table: L::Write<'a>,
}

impl<V, L: TableLock<HashTable<Item<V>>>> Locked<'_, V, L> {
    /// The state of `key` (hashed to `hash` by [`ShardedMap::locate`]).
    pub(crate) fn get_mut(&mut self, hash: u64, key: Key<'_>) -> Option<&mut V> {
        self.table
            .find_mut(hash, |(k, _)| key.matches(k))
            .map(|(_, v)| v)
    }

    /// Stores `value` as `key`'s state, replacing any.
    pub(crate) fn insert(&mut self, hash: u64, key: Key<'_>, value: V) {
        let map = self.map;
        match self
            .table
            .entry(hash, |(k, _)| key.matches(k), |(k, _)| map.hash_stored(k))
        {
            Entry::Occupied(mut o) => o.get_mut().1 = value,
            Entry::Vacant(v) => {
                v.insert((key.to_stored(), value));
                map.entries
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// Whether `key` has state (or a new one would be a new entry).
    pub(crate) fn contains(&mut self, hash: u64, key: Key<'_>) -> bool {
        self.get_mut(hash, key).is_some()
    }

    /// Removes `key`'s state and returns it.
    pub(crate) fn remove(&mut self, hash: u64, key: Key<'_>) -> Option<V> {
        match self.table.find_entry(hash, |(k, _)| key.matches(k)) {
            Ok(o) => {
                self.map
                    .entries
                    .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                Some(o.remove().0.1)
            }
            Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_of(n: u32) -> ShardedMap<u32> {
        let map = ShardedMap::default();
        for i in 0..n {
            map.update_or_insert(
                Key::named(b"three", &i.to_be_bytes()),
                |_| (),
                || (Some(i), ()),
            );
        }
        map
    }

    /// Every even value below `n` (as [`map_of`] stored them) is still in
    /// `map`, and no odd one.
    fn assert_only_evens_left<L: TableLock<HashTable<Item<u32>>>>(
        map: &ShardedMap<u32, L>,
        n: u32,
    ) {
        for i in 0..n {
            assert_eq!(
                map.read(Key::named(b"three", &i.to_be_bytes()), |v| v.copied()),
                (i % 2 == 0).then_some(i)
            );
        }
    }

    /// Walks every shard with budgets of `units`, as the store's steps do.
    fn walk<L: TableLock<HashTable<Item<u32>>>>(
        map: &ShardedMap<u32, L>,
        units: usize,
        mut keep: impl FnMut(&mut u32) -> bool,
    ) -> usize {
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
    fn short_and_long_slices_compare_exactly() {
        for len in 0..40usize {
            let a: Vec<u8> = (0..len as u8).collect();
            assert!(bytes_eq(&a, &a.clone()));
            for i in 0..len {
                let mut b = a.clone();
                b[i] ^= 0x80;
                assert!(!bytes_eq(&a, &b), "len {len}, byte {i}");
            }
            assert!(!bytes_eq(&a, &a[..len.saturating_sub(1)]) || len == 0);
        }
    }

    #[test]
    fn keys_split_differently_are_different_and_survive_rehashing() {
        let map: ShardedMap<u32> = ShardedMap::default();
        // The same bytes split differently between the name and the
        // caller, and a caller that spells another key's stored bytes.
        let keys = [
            (&b"x"[..], &b"a"[..]),
            (b"xa", b""),
            (b"", b"xa"),
            (b"", b"\x01xa"),
            (b"\x01", b"xa"),
        ];
        for (i, (name, key)) in keys.iter().enumerate() {
            map.update_or_insert(Key::named(name, key), |_| (), || (Some(i as u32), ()));
        }
        // Enough entries to grow every table several times (rehashing the
        // stored keys), some kept in the slot and some on the heap.
        for i in 0..20_000u32 {
            let long = [i.to_le_bytes(); 8].concat();
            let key = if i % 2 == 0 { &long[..4] } else { &long[..] };
            map.update_or_insert(Key::named(b"seven", key), |_| (), || (Some(i), ()));
        }
        for (i, (name, key)) in keys.iter().enumerate() {
            assert_eq!(
                map.read(Key::named(name, key), |v| v.copied()),
                Some(i as u32)
            );
        }
        for i in 0..20_000u32 {
            let long = [i.to_le_bytes(); 8].concat();
            let key = if i % 2 == 0 { &long[..4] } else { &long[..] };
            assert_eq!(map.read(Key::named(b"seven", key), |v| v.copied()), Some(i));
        }
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
        let keep_even = |v: &mut u32| (*v).is_multiple_of(2);
        let mut budget = Budget::new(SHARD_COST + 10 * (SLOT_COST + REMOVE_COST));
        let w = map
            .sweep_shard(0, 0, &mut budget, Mode::Step, keep_even)
            .unwrap();
        assert!(w.removed <= 10, "{w:?}");
        assert_eq!(map.len(), 10_000 - w.removed);
        walk(&map, 100, keep_even);
        assert_eq!(map.len(), 5_000);
        assert_only_evens_left(&map, 10_000u32);
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
    fn a_read_mostly_shard_read_on_another_thread_is_skipped_and_then_walked() {
        let map: ReadMostlyMap<u32> = ShardedMap::default();
        for i in 0..100u32 {
            map.update_or_insert(
                Key::named(b"three", &i.to_be_bytes()),
                |_| (),
                || (Some(i), ()),
            );
        }
        let (held, release) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|s| {
            s.spawn(|| {
                // A reader on its own thread holds one of the eight words.
                let _read = map.shards[0].table.read();
                held.wait();
                release.wait();
            });
            held.wait();
            let mut budget = Budget::new(1_000);
            assert_eq!(
                map.sweep_shard(0, 0, &mut budget, Mode::Step, |_| false),
                None,
                "a writer must not pass a reader on another thread"
            );
            release.wait();
        });
        walk(&map, 1_000, |v| *v % 2 == 0);
        assert_eq!(map.len(), 50);
        assert_only_evens_left(&map, 100u32);
    }

    #[test]
    fn a_read_mostly_map_counts_every_update_made_under_its_read_lock() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let map: ReadMostlyMap<AtomicU64> = ShardedMap::default();
        let keys: Vec<[u8; 4]> = (0..64u32).map(u32::to_be_bytes).collect();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for round in 0..200 {
                        for key in &keys {
                            let k = Key::named(b"one", key);
                            let added =
                                map.read(k, |v| v.map(|v| v.fetch_add(1, Ordering::Relaxed)));
                            if added.is_none() {
                                map.update_or_insert(
                                    k,
                                    |v| {
                                        v.fetch_add(1, Ordering::Relaxed);
                                    },
                                    || (Some(AtomicU64::new(1)), ()),
                                );
                            }
                        }
                        if round % 50 == 0 {
                            // Writers between the readers: a sweep step
                            // that keeps everything.
                            let mut budget = Budget::new(100);
                            let _ = map.sweep_shard(
                                round % map.shards(),
                                0,
                                &mut budget,
                                Mode::Step,
                                |_| true,
                            );
                        }
                    }
                });
            }
        });
        for key in &keys {
            assert_eq!(
                map.read(Key::named(b"one", key), |v| v
                    .map(|v| v.load(Ordering::Relaxed))),
                Some(800)
            );
        }
        assert_eq!(map.len(), 64);
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
