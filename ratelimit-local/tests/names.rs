//! Nothing is kept per policy name beyond the states of that name: a
//! caller that names a quota per request (the rate-limit service names one
//! per descriptor value) leaves no memory behind once those states have
//! expired and been swept. (The store once kept a process-wide table of
//! every name it had been asked for, which grew with every descriptor value
//! a service ever saw.)
//!
//! The only test of its binary: it counts the process's live heap bytes.

use std::alloc::System;
use std::time::Duration;

use ratelimit_core::store::Request;
use ratelimit_core::{Charge, ManualClock, Quota, Rate};
use ratelimit_local::LocalStore;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const T0: u64 = 1_800_000_000_000_000;

/// Heap bytes allocated and not freed since `region` began (a
/// reallocation's growth counts as allocated, its shrinking as freed).
fn live(region: &Region<'_, System>) -> isize {
    let c = region.change();
    c.bytes_allocated as isize - c.bytes_deallocated as isize
}

#[test]
fn names_leave_nothing_behind_once_their_states_are_swept() {
    const NAMES: usize = 20_000;
    let clock = ManualClock::new(T0);
    let store = LocalStore::with_clock(clock.clone()).sweep_interval(Duration::MAX);
    let window = Quota::fixed_window(Rate::per_minute(100)).unwrap();
    let bucket = Quota::token_bucket(Rate::per_minute(100), 10).unwrap();
    // A name of the service's shape: a letter and 32 hex digits.
    let name = |i: usize| format!("d{:032x}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let region = Region::new(GLOBAL);
    for i in 0..NAMES {
        let w = window.clone().named(&name(i)).unwrap();
        if i % 2 == 0 {
            // One quota a call.
            assert!(store.decide_now(b"domain", &w, 1).unwrap().allowed);
        } else {
            // Several quotas in one call.
            let b = bucket.clone().named(&name(i + NAMES)).unwrap();
            let charges = [Charge::new(&w, 1), Charge::new(&b, 1)];
            let request = Request::new(b"domain", &charges);
            assert!(
                store
                    .decide_request(request)
                    .unwrap()
                    .iter()
                    .all(|d| d.allowed)
            );
        }
    }
    let states = NAMES + NAMES / 2;
    assert_eq!(store.len(), states);
    let held = live(&region);
    assert!(
        held > (states * 24) as isize,
        "the states are held while live ({held} bytes): the count is wrong"
    );
    // Past every state's time to live, then one full sweep.
    clock.advance(Duration::from_secs(3600));
    assert_eq!(store.sweep(), states);
    assert_eq!(store.len(), 0);
    let left = live(&region);
    // (A table of every name asked for held 3.2 MB here.)
    assert!(
        left < 64 * 1024,
        "{left} bytes still held after every state of {states} names was swept (while live: {held})"
    );
}
