//! Memory per active caller, per algorithm: the `used_memory` delta of a
//! fresh local redis-server over many callers, one decision each (and ten
//! for a second sliding log row, to show it grows with admitted calls).
//!
//! The crate README's table comes from:
//!
//! ```text
//! RATELIMIT_MEMORY_CALLERS=100000 cargo test --release -p ratelimit-redis --test memory -- --nocapture
//! ```
//!
//! By default it runs 5,000 callers and checks loose upper bounds.

mod common;

use ratelimit_core::StoreExt;
use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::{Quota, Rate};
use ratelimit_testkit::redis_server::RedisServer;

const TASKS: usize = 32;

async fn measure(quota: &Quota, callers: usize, calls_each: usize) -> f64 {
    // A fresh server per row: nothing else in it.
    let server = RedisServer::start_local();
    let store = Arc::new(common::redis_rs_store(&server.url(), "rl").await);
    // Load the script and settle the allocator before the baseline.
    store.decide_one(b"warm-up", quota, 1).await.unwrap();
    let before = server.info_memory_used();
    let mut handles = Vec::new();
    for t in 0..TASKS {
        let (store, quota) = (store.clone(), quota.clone());
        handles.push(tokio::spawn(async move {
            for i in (t..callers).step_by(TASKS) {
                // What a `Limiter` with namespace "api" would pass.
                let caller = format!("api:customer-{i:07}");
                for c in 0..calls_each {
                    // Distinct microseconds are not guaranteed; the store
                    // merges same-µs entries, as the model does.
                    let d = store
                        .decide_one(caller.as_bytes(), &quota, 1)
                        .await
                        .unwrap();
                    assert!(d.allowed, "call {c} of caller {i}");
                }
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let after = server.info_memory_used();
    let keys: u64 = redis::cmd("DBSIZE")
        .query(&mut server.connection())
        .unwrap();
    // The sliding log keeps two sorted sets per caller (times and
    // cumulative costs, one hash tag); the other algorithms one key.
    let per_caller = if quota.kind() == ratelimit_core::AlgorithmKind::SlidingLog {
        2
    } else {
        1
    };
    assert_eq!(keys, per_caller * (callers as u64 + 1), "keys per caller");
    (after.saturating_sub(before)) as f64 / callers as f64
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_per_active_caller() {
    let callers: usize = std::env::var("RATELIMIT_MEMORY_CALLERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    let hour = Duration::from_secs(3_600);
    let rows = [
        (
            "fixed window",
            Quota::fixed_window(Rate::new(100, hour)).unwrap(),
            1,
            200.0,
        ),
        (
            "sliding window counter",
            Quota::sliding_window(Rate::new(100, hour)).unwrap(),
            1,
            200.0,
        ),
        (
            "token bucket",
            Quota::token_bucket(Rate::new(100, hour), 20).unwrap(),
            1,
            200.0,
        ),
        (
            "sliding log, 1 entry",
            Quota::sliding_log(Rate::new(100, hour)).unwrap(),
            1,
            400.0,
        ),
        (
            "sliding log, 10 entries",
            Quota::sliding_log(Rate::new(100, hour)).unwrap(),
            10,
            1_000.0,
        ),
    ];
    println!("| algorithm | bytes per active caller ({callers} callers) |");
    println!("|---|---|");
    for (name, quota, calls_each, bound) in rows {
        let per = measure(&quota, callers, calls_each).await;
        println!("| {name} | {per:.0} |");
        assert!(
            per > 0.0 && per < bound,
            "{name}: {per:.0} bytes per caller (bound {bound})"
        );
    }
}
