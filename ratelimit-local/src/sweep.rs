//! The sweep: how a [`LocalStore`] forgets idle callers. Every entry whose
//! TTL has passed equals a fresh caller's state and may go; an automatic,
//! incremental sweep removes them a bounded slice per decision, paced to
//! walk every map once per sweep interval, and [`LocalStore::sweep`] removes
//! them all at once.

use std::sync::TryLockError;
use std::sync::atomic::Ordering;

use ratelimit_core::Micros;
use ratelimit_core::model::TokenBucketState;

use crate::packed::unpack;
use crate::shards::{Budget, Mode, Walk};
use crate::store::{Cursor, LocalStore};

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

impl LocalStore {
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
    pub(crate) fn maybe_sweep(&self, now: Micros) {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::shards::{REMOVE_COST, SLOT_COST};
    use ratelimit_core::StoreExt;
    use ratelimit_core::{ManualClock, Quota, Rate};

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
}
