//! What a dead Redis costs each request once the node's breaker is open,
//! and how long the store takes to answer again once Redis is back, with
//! each client.
//!
//! ```text
//! cargo run --release -p ratelimit-benches --features fred --bin dead_redis
//! ```
//!
//! For each client (redis-rs; fred with `--features fred`): starts its own
//! `redis-server` on a free loopback port, warms a limiter up on it (the
//! default degraded mode, `instances(1)`: the built-in fallback; 20 ms
//! timeout), kills the server, and times sequential checks while it is dead
//! (the first calls open the node's breaker; then every call fails fast and
//! is decided by the fallback). Then it restarts the server and measures
//! the time from the server answering `PING` again to the first decision
//! made by the store, checking continuously. Prints a markdown table.

use std::time::{Duration, Instant};

use ratelimit_core::{Limiter, Quota, Rate, Source};
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

#[derive(Debug, Clone, Copy)]
enum Lib {
    RedisRs,
    #[cfg(feature = "fred")]
    Fred,
}

impl Lib {
    fn name(self) -> &'static str {
        match self {
            Lib::RedisRs => "redis-rs",
            #[cfg(feature = "fred")]
            Lib::Fred => "fred",
        }
    }
}

async fn store(lib: Lib, server: &RedisServer) -> RedisStore {
    match lib {
        Lib::RedisRs => RedisStore::builder(server.url())
            .prefix(server.prefix())
            .build()
            .await
            .expect("connect to the fixture's redis-server"),
        #[cfg(feature = "fred")]
        Lib::Fred => {
            use ratelimit_redis::fred_client::prelude::*;
            let client = Builder::from_config(Config::from_url(&server.url()).expect("valid URL"))
                .with_performance_config(|p| {
                    p.default_command_timeout = Duration::from_millis(30);
                })
                .with_connection_config(|c| c.connection_timeout = Duration::from_millis(50))
                .set_policy(ReconnectPolicy::new_constant(0, 20))
                .build()
                .expect("fred client");
            client.init().await.expect("fred connects");
            RedisStore::from_fred(client)
                .with_prefix(server.prefix())
                .expect("prefix")
        }
    }
}

struct Row {
    lib: &'static str,
    alive: Vec<Duration>,
    dead: Vec<Duration>,
    dead_from_store: usize,
    fallback: u64,
    recovered: Option<Duration>,
}

async fn run(lib: Lib) -> Row {
    let mut server = RedisServer::start_local();
    let limiter = Limiter::builder(store(lib, &server).await)
        .quota(Quota::token_bucket(Rate::per_second(1_000), 1_000).unwrap())
        .instances(1)
        .timeout(Duration::from_millis(20))
        .build()
        .unwrap();
    for _ in 0..200 {
        assert_eq!(limiter.check("warm").await.source, Source::Store);
    }
    let (mut alive, _) = time_checks(&limiter, 2_000).await;
    alive.sort();

    server.kill();
    let (dead, dead_from_store) = time_checks(&limiter, 5_000).await;
    // The first calls open the node's breaker; the rest are the steady
    // state while Redis stays dead.
    let mut dead: Vec<Duration> = dead[100..].to_vec();
    dead.sort();
    let fallback = limiter.stats().fallback;

    // Redis comes back (restart returns once it answers PING): how long
    // until the store decides again.
    server.restart();
    let back = Instant::now();
    let mut recovered = None;
    while back.elapsed() < Duration::from_secs(10) {
        if limiter.check("again").await.source == Source::Store {
            recovered = Some(back.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Row {
        lib: lib.name(),
        alive,
        dead,
        dead_from_store,
        fallback,
        recovered,
    }
}

#[tokio::main]
async fn main() {
    let libs = [
        Lib::RedisRs,
        #[cfg(feature = "fred")]
        Lib::Fred,
    ];
    let mut rows = Vec::new();
    for lib in libs {
        rows.push(run(lib).await);
    }
    println!("| client | per request | p50 | p99 | p99.9 | max | requests |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        for (what, v) in [
            ("Redis alive", &r.alive),
            ("Redis dead, node breaker open", &r.dead),
        ] {
            println!(
                "| {} | {what} | {} | {} | {} | {} | {} |",
                r.lib,
                show(quantile(v, 0.5)),
                show(quantile(v, 0.99)),
                show(quantile(v, 0.999)),
                show(*v.last().unwrap()),
                v.len()
            );
        }
    }
    println!();
    for r in &rows {
        println!(
            "{}: while dead, {} of 5000 decisions from the store, {} from the fallback; recovery: {}",
            r.lib,
            r.dead_from_store,
            r.fallback,
            match r.recovered {
                Some(t) => format!(
                    "first store decision {} after redis-server answered PING again",
                    show(t)
                ),
                None => "no store decision within 10 s".to_owned(),
            }
        );
    }
}
