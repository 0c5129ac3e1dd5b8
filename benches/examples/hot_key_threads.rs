//! Threads deciding on one hot key at once, for a profiler: `n` decisions
//! per thread by the local store's fastest path (`LocalStore::decide_now`)
//! or by governor's keyed limiter, on the sold plan (100 per minute, burst
//! 20: after the burst, every call is a denial, which reads the key's
//! state and writes nothing).
//!
//! ```text
//! cargo build --profile bench -p ratelimit-benches --example hot_key_threads
//! target/release/examples/hot_key_threads store 2 20000000
//! target/release/examples/hot_key_threads governor 2 20000000
//! perf record -e cpu-clock target/release/examples/hot_key_threads store 2 20000000
//! ```
//!
//! Prints the wall time per decision per thread. What two threads share is
//! what a lock word costs them: the cache line of a lock both read-lock
//! moves between their cores on every call.
#![allow(missing_docs)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Instant;

use governor::RateLimiter;
use ratelimit_core::{Quota, Rate};
use ratelimit_local::LocalStore;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map_or("store", String::as_str);
    let threads: usize = args.get(2).map_or(2, |s| s.parse().expect("threads"));
    let n: u64 = args
        .get(3)
        .map_or(20_000_000, |s| s.parse().expect("decisions per thread"));
    let quota = Quota::token_bucket(Rate::per_minute(100), 20).expect("valid quota");
    let governor_quota = governor::Quota::per_minute(NonZeroU32::new(100).expect("non-zero"))
        .allow_burst(NonZeroU32::new(20).expect("non-zero"));
    let store = LocalStore::new();
    let governor = RateLimiter::keyed(governor_quota);
    let key = "caller-0".to_owned();
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut admitted = 0u64;
                for _ in 0..n {
                    let ok = match what {
                        "store" => {
                            store
                                .decide_now(black_box(key.as_bytes()), &quota, 1)
                                .expect("a valid cost")
                                .allowed
                        }
                        "governor" => governor.check_key(black_box(&key)).is_ok(),
                        other => panic!("unknown {other:?}: store or governor"),
                    };
                    admitted += u64::from(ok);
                }
                black_box(admitted);
            });
        }
    });
    println!(
        "{what}, {threads} threads on one key: {:.1} ns per decision per thread",
        started.elapsed().as_nanos() as f64 / n as f64
    );
}
