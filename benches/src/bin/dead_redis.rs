//! What a dead Redis costs each request, with and without the limiter's
//! circuit breaker, and how long the limiter takes to use Redis again once
//! it is back.
//!
//! ```text
//! cargo run --release -p ratelimit-benches --bin dead_redis
//! ```
//!
//! Starts its own `redis-server` on a free loopback port, warms a limiter
//! (fail open, 20 ms timeout) up on it, kills the server, and times
//! sequential checks: first through a limiter without a breaker, then
//! through one with the default breaker (open after 5 failures, 1 s
//! cool-down). Then it restarts the server and times how long the breaker
//! limiter takes to return to store decisions. Prints a markdown table.

use std::time::{Duration, Instant};

use ratelimit_core::{CircuitBreaker, FailurePolicy, Limiter, Quota, Rate, Source};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_server::RedisServer;

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn show(d: Duration) -> String {
    if d >= Duration::from_millis(1) {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    }
}

async fn time_checks(limiter: &Limiter, n: usize) -> (Vec<Duration>, usize) {
    let mut out = Vec::with_capacity(n);
    let mut from_store = 0;
    for i in 0..n {
        let t = Instant::now();
        let d = limiter.check(format!("caller-{}", i % 100)).await;
        out.push(t.elapsed());
        from_store += usize::from(d.source == Source::Store);
    }
    (out, from_store)
}

#[tokio::main]
async fn main() {
    let mut server = RedisServer::start_local();
    let store = RedisStore::builder(server.url())
        .prefix(server.prefix())
        .build()
        .await
        .expect("connect to the fixture's redis-server");
    let quota = Quota::token_bucket(Rate::per_second(1_000), 1_000).unwrap();
    let build = |breaker: Option<CircuitBreaker>| {
        let b = Limiter::builder(store.clone())
            .quota(quota.clone())
            .failure_policy(FailurePolicy::FailOpen)
            .timeout(Duration::from_millis(20));
        match breaker {
            Some(c) => b.circuit_breaker(c),
            None => b.no_circuit_breaker(),
        }
        .build()
        .unwrap()
    };
    let plain = build(None);
    let guarded = build(Some(CircuitBreaker::DEFAULT));
    for _ in 0..200 {
        assert_eq!(plain.check("warm").await.source, Source::Store);
        assert_eq!(guarded.check("warm").await.source, Source::Store);
    }
    let (mut alive, _) = time_checks(&guarded, 2_000).await;
    alive.sort();

    server.kill();
    let (mut without, _) = time_checks(&plain, 100).await;
    without.sort();
    let (with, _) = time_checks(&guarded, 5_000).await;
    // The first five calls time out and open the breaker; the rest are the
    // steady state while Redis stays dead.
    let mut open: Vec<Duration> = with[5..].to_vec();
    open.sort();
    let stats = guarded.stats();

    // Redis comes back: how long until the breaker limiter decides by the
    // store again (at most one cool-down, plus the probe).
    server.restart();
    let back = Instant::now();
    let mut recovered = None;
    while back.elapsed() < Duration::from_secs(10) {
        if guarded.check("again").await.source == Source::Store {
            recovered = Some(back.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    println!("| per request | p50 | p99 | p99.9 | max | requests |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (what, v) in [
        ("Redis alive", &alive),
        ("Redis dead, no breaker", &without),
        ("Redis dead, breaker open", &open),
    ] {
        println!(
            "| {what} | {} | {} | {} | {} | {} |",
            show(quantile(v, 0.5)),
            show(quantile(v, 0.99)),
            show(quantile(v, 0.999)),
            show(*v.last().unwrap()),
            v.len()
        );
    }
    println!();
    println!(
        "breaker: {} timeouts, {} errors, {} calls not sent while open",
        stats.timeouts, stats.errors, stats.short_circuits
    );
    match recovered {
        Some(t) => println!(
            "recovery: first store decision {} after redis-server was back (cool-down {:?})",
            show(t),
            CircuitBreaker::DEFAULT.cool_down()
        ),
        None => println!("recovery: no store decision within 10 s"),
    }
}
