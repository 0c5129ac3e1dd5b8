//! Memory per caller in the local store, and back to baseline after idle
//! eviction, counted by a global allocator that tracks live heap bytes.
//!
//! For each algorithm: 1,000,000 callers make one call each on a
//! `LocalStore` driven by a `ManualClock`; the clock then moves past every
//! TTL and `sweep()` runs. The same callers go through governor 0.10's keyed
//! DashMap limiter (on its fake clock, evicted with `retain_recent` +
//! `shrink_to_fit`) for comparison.
//!
//! `cargo bench -p ratelimit-benches --bench local_memory`; see `BENCHMARKS.md`.
#![allow(missing_docs)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use governor::RateLimiter;
use governor::clock::FakeRelativeClock;
use ratelimit_benches::{caller_ids, decide_in_place};
use ratelimit_core::{ManualClock, Quota, Rate};
use ratelimit_local::LocalStore;

/// Live heap bytes: requested sizes of every allocation not yet freed.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// The only unsafe code in the workspace: forwarding to the system allocator
// while counting. Every method passes its arguments through unchanged.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as our caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as our caller's.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as our caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

const CALLERS: usize = 1_000_000;
const START: u64 = 1_800_000_000_000_000;

struct Row {
    what: String,
    per_caller: f64,
    after_eviction: isize,
    remaining_entries: usize,
}

fn ours(name: &str, quota: Quota, ids: &[String]) -> Row {
    let clock = ManualClock::new(START);
    let store = LocalStore::with_clock(clock.clone()).sweep_interval(Duration::MAX);
    // The empty store's own allocation (its shards) is the baseline.
    let baseline = live();
    for id in ids {
        let d = decide_in_place(&store, id.as_bytes(), &quota, 1).expect("valid cost");
        assert!(d.allowed);
    }
    let active = live() - baseline;
    // Past every TTL of these quotas (at most two windows of one minute).
    clock.advance(Duration::from_secs(3600));
    let evicted = store.sweep();
    assert_eq!(evicted, ids.len());
    let remaining_entries = store.len();
    let after = live() - baseline;
    drop(store);
    Row {
        what: format!("ours: LocalStore, {name}"),
        per_caller: active as f64 / ids.len() as f64,
        after_eviction: after,
        remaining_entries,
    }
}

fn governor_row(ids: &[String]) -> Row {
    let clock = FakeRelativeClock::default();
    let quota = governor::Quota::per_minute(NonZeroU32::new(100).expect("non-zero"))
        .allow_burst(NonZeroU32::new(20).expect("non-zero"));
    let limiter = RateLimiter::dashmap_with_clock(quota, clock.clone());
    let baseline = live();
    for id in ids {
        assert!(limiter.check_key(id).is_ok());
    }
    let active = live() - baseline;
    clock.advance(Duration::from_secs(3600));
    limiter.retain_recent();
    limiter.shrink_to_fit();
    let remaining_entries = limiter.len();
    let after = live() - baseline;
    drop(limiter);
    Row {
        what: "governor 0.10 keyed DashMap, GCRA 100/min burst 20".into(),
        per_caller: active as f64 / ids.len() as f64,
        after_eviction: after,
        remaining_entries,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let ids = caller_ids(CALLERS);
    let id_bytes: usize = ids.iter().map(String::len).sum();
    let empty = {
        let base = live();
        let s = LocalStore::with_clock(ManualClock::new(START));
        let size = live() - base;
        drop(s);
        size
    };
    println!(
        "local_memory: {CALLERS} callers, ids `customer-<i>` averaging {:.1} bytes; \
         an empty LocalStore holds {empty} heap bytes",
        id_bytes as f64 / CALLERS as f64
    );
    let rows = [
        ours(
            "fixed window 100/min",
            Quota::fixed_window(Rate::per_minute(100)).expect("valid"),
            &ids,
        ),
        ours(
            "sliding window 100/min",
            Quota::sliding_window(Rate::per_minute(100)).expect("valid"),
            &ids,
        ),
        ours(
            "sliding log 100/min",
            Quota::sliding_log(Rate::per_minute(100)).expect("valid"),
            &ids,
        ),
        ours(
            "token bucket 100/min burst 20",
            Quota::token_bucket(Rate::per_minute(100), 20).expect("valid"),
            &ids,
        ),
        governor_row(&ids),
    ];
    println!(
        "| store | live heap bytes per active caller | after idle eviction: bytes above the empty store | entries left |"
    );
    println!("|---|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {:.1} | {} | {} |",
            r.what, r.per_caller, r.after_eviction, r.remaining_entries
        );
    }
}
