//! A fixed amount of work for a profiler (callgrind, perf): `n` decisions on
//! a set of `keys` callers by one implementation, on one thread.
//!
//! ```text
//! cargo build --profile bench -p ratelimit-benches --example local_profile
//! valgrind --tool=callgrind target/release/examples/local_profile store 1 200000 [plan]
//! ```
//!
//! `what` is one of `model`, `store` (`Store::decide`), `sync`
//! (`LocalStore::decide_now`), `limiter`, `governor`; the quota is the
//! admit-everything token bucket of the `local` bench (1e9/s, burst 1000),
//! or with `plan` the sold plan (100 per minute, burst 20).
#![allow(missing_docs)]

use std::hint::black_box;
use std::num::NonZeroU32;

use governor::RateLimiter;
use ratelimit_benches::{Cursor, caller_ids, decide_in_place};
use ratelimit_core::model::{self, State};
use ratelimit_core::{Limiter, Quota, Rate, Store};
use ratelimit_local::LocalStore;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map_or("store", String::as_str);
    let n_keys: usize = args.get(2).map_or(1, |s| s.parse().expect("keys"));
    let n: u64 = args
        .get(3)
        .map_or(200_000, |s| s.parse().expect("iterations"));
    let keys = caller_ids(n_keys);
    // `plan` (4th argument): the sold plan, 100 per minute with a burst of
    // 20 (a whole number of µs per token; a hot key is then mostly denied).
    let plan = args.get(4).is_some_and(|s| s == "plan");
    let quota = if plan {
        Quota::token_bucket(Rate::per_minute(100), 20).expect("valid")
    } else {
        Quota::token_bucket(Rate::per_second(1_000_000_000), 1000).expect("valid")
    };
    let governor_quota = if plan {
        governor::Quota::per_minute(NonZeroU32::new(100).expect("nz"))
            .allow_burst(NonZeroU32::new(20).expect("nz"))
    } else {
        governor::Quota::per_second(NonZeroU32::new(1_000_000_000).expect("nz"))
            .allow_burst(NonZeroU32::new(1000).expect("nz"))
    };
    let mut cur = Cursor::new(keys.len(), 0, 1);
    let mut ok = 0u64;
    match what {
        "model" => {
            let mut state: Option<State> = None;
            for i in 0..n {
                let now = 1_800_000_000_000_000 + i;
                let step = model::decide(&quota, state, black_box(now), 1).expect("cost");
                ok += u64::from(step.decision.allowed);
                state = Some(step.state);
            }
        }
        "store" => {
            // Through `dyn Store`, as a caller holding a trait object gets it.
            let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(LocalStore::new());
            for _ in 0..n {
                let k = keys[cur.next_index()].as_bytes();
                ok += u64::from(
                    decide_in_place(&*store, k, &quota, 1)
                        .expect("cost")
                        .allowed,
                );
            }
        }
        "sync" => {
            let store = LocalStore::new();
            for _ in 0..n {
                let k = keys[cur.next_index()].as_bytes();
                ok += u64::from(store.decide_now(k, &quota, 1).expect("cost").allowed);
            }
        }
        "limiter" => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let limiter = Limiter::builder(LocalStore::new())
                .quota(quota)
                .build()
                .expect("limiter");
            rt.block_on(async {
                for _ in 0..n {
                    ok += u64::from(limiter.check(&keys[cur.next_index()]).await.allowed);
                }
            });
        }
        "governor" => {
            let g = RateLimiter::keyed(governor_quota);
            for _ in 0..n {
                ok += u64::from(g.check_key(&keys[cur.next_index()]).is_ok());
            }
        }
        other => {
            panic!("unknown implementation {other:?}: model, store, sync, limiter or governor")
        }
    }
    println!("{what}: {ok} of {n} admitted");
}
