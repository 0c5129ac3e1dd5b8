//! What one `ShouldRateLimit` request costs the service in process (no
//! gRPC): heap allocations and bytes per request, counted exactly by a
//! counting allocator, and the time per request, for requests of one, two
//! and three descriptors on the local store, side by side (the sizes
//! interleaved in short slices, medians of the rounds).
//!
//! ```sh
//! cargo bench -p ratelimit-server --bench request_cost
//! cargo bench -p ratelimit-server --bench request_cost -- --rounds 21 --requests 20000
//! ```
//!
//! The line for several quotas in one call: three descriptors cost at
//! most twice one (`3 / 1` in the table). `tests/allocations.rs` holds
//! the allocation counts to their budget.

#[path = "../tests/request_fixture/mod.rs"]
mod request_fixture;

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use ratelimit_local::LocalStore;
use ratelimit_server::{Config, RateLimitService, Settings};
use request_fixture::{CONFIG, GLOBAL, request};
use stats_alloc::Region;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut rounds = 11usize;
    let mut requests = 10_000u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).unwrap_or(rounds),
            "--requests" => requests = args.next().and_then(|v| v.parse().ok()).unwrap_or(requests),
            "--bench" => {}
            other => {
                eprintln!("usage: request_cost [--rounds R] [--requests N] (not {other:?})");
                std::process::exit(2);
            }
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let service = Arc::new(
        RateLimitService::new(
            Arc::new(LocalStore::new()),
            Config::from_yaml_str("cost.yaml", CONFIG).expect("config"),
            Settings::default(),
            "local",
        )
        .expect("service"),
    );
    let sizes = [1usize, 2, 3];
    // Per size: allocations and bytes per request (exact), ns per request
    // per round.
    let mut allocations = [0f64; 3];
    let mut bytes = [0f64; 3];
    let mut ns: [Vec<f64>; 3] = Default::default();
    rt.block_on(async {
        // Requests built ahead (their allocations are the caller's, not
        // the service's), keys cycling over 1,000 callers.
        let prepared: Vec<Vec<RateLimitRequest>> = sizes
            .iter()
            .map(|&n| (0..1_000).map(|k| request(n, k)).collect())
            .collect();
        // Warm-up: every caller's state exists.
        for reqs in &prepared {
            for r in reqs {
                service.should_rate_limit(r).await.expect("answer");
            }
        }
        for round in 0..rounds {
            for s in 0..sizes.len() {
                // Rotate the order each round.
                let s = (s + round) % sizes.len();
                let reqs = &prepared[s];
                let region = Region::new(GLOBAL);
                let start = Instant::now();
                for i in 0..requests {
                    let r = &reqs[(i % 1_000) as usize];
                    let answer = service.should_rate_limit(r).await.expect("answer");
                    std::hint::black_box(answer);
                }
                let took = start.elapsed().as_secs_f64() * 1e9 / requests as f64;
                let used = region.change();
                allocations[s] = (used.allocations + used.reallocations) as f64 / requests as f64;
                bytes[s] = (used.bytes_allocated + used.bytes_reallocated.max(0) as usize) as f64
                    / requests as f64;
                ns[s].push(took);
            }
        }
    });
    println!(
        "### One request to the service in process (local store, no gRPC): {rounds} rounds of {requests} requests per size, interleaved\n"
    );
    println!(
        "| descriptors | allocations per request | bytes allocated per request | ns per request (median) | ÷ one descriptor |"
    );
    println!("|--:|--:|--:|--:|--:|");
    let one = median(ns[0].clone());
    for (s, n) in sizes.iter().enumerate() {
        let m = median(ns[s].clone());
        println!(
            "| {n} | {:.1} | {:.0} | {m:.0} | {:.2} |",
            allocations[s],
            bytes[s],
            m / one
        );
    }
}
