//! What a dead Redis costs each request once the node's breaker is open,
//! and how long the store takes to answer again once Redis is back, with
//! each client.
//!
//! ```text
//! cargo run --release -p ratelimit-benches --features fred --bin dead_redis -- --runs 5
//! ```
//!
//! For each client (redis-rs; fred with `--features fred`): starts its own
//! `redis-server` on a free loopback port, warms a limiter up on it (the
//! default degraded mode, `instances(1)`: the built-in fallback; 20 ms
//! timeout), kills the server, and times sequential checks while it is dead
//! (the first calls open the node's breaker; then every call fails fast and
//! is decided by the fallback). Then it restarts the server while a check
//! runs every millisecond, and measures the time from the server
//! **accepting connections** again (a thread of its own tries to connect
//! to the port every 0.2 ms) to the first decision made by the store; and,
//! for comparison, from the fixture seeing its first `PING` answered.
//! Redis stays dead for `--down-for S` seconds (default 2) before the
//! restart, with a check every millisecond meanwhile, so that the client's
//! reconnection backoff has grown as it would in a real outage.
//! Repeats `--runs R` times (default 5), a fresh server each time, and
//! prints markdown tables: every run, then the medians.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratelimit_benches::clients::{Lib, redis_store};
use ratelimit_core::{Limiter, Quota, Rate, Source};
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

struct Row {
    lib: &'static str,
    alive: Vec<Duration>,
    dead: Vec<Duration>,
    dead_from_store: usize,
    fallback: u64,
    /// From the port accepting connections again to the first store
    /// decision.
    recovered: Option<Duration>,
    /// From the fixture's first `PING` answered to the first store
    /// decision (negative: the store answered first).
    after_ping: Option<f64>,
}

/// Tries to connect to `addr` every 0.2 ms on a thread of its own until it
/// succeeds or `stop` is set; returns when it first succeeded.
fn watch_accepting(
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Option<Instant>> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(5)).is_ok() {
                return Some(Instant::now());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        None
    })
}

async fn run_once(lib: Lib, down_for: Duration) -> Row {
    let mut server = RedisServer::start_local();
    let limiter = Limiter::builder(redis_store(lib, &server).await)
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
    let killed = Instant::now();
    let (dead, dead_from_store) = time_checks(&limiter, 5_000).await;
    // The first calls open the node's breaker; the rest are the steady
    // state while Redis stays dead.
    let mut dead: Vec<Duration> = dead[100..].to_vec();
    dead.sort();
    let fallback = limiter.stats().fallback;
    // Redis stays dead for `down_for` in all, with a check every
    // millisecond meanwhile: the probes find it dead, the client keeps
    // trying to reconnect.
    while killed.elapsed() < down_for {
        limiter.check("meanwhile").await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    // Redis comes back: the restart runs on a blocking thread (it returns
    // once the new server answers PING) while a thread watches for the port
    // to accept connections and this task checks every millisecond.
    let stop = Arc::new(AtomicBool::new(false));
    let accepting = watch_accepting(server.process().addr(), stop.clone());
    let restart = tokio::task::spawn_blocking(move || {
        server.restart();
        (server, Instant::now())
    });
    let began = Instant::now();
    let mut first_store = None;
    while began.elapsed() < Duration::from_secs(10) {
        if limiter.check("again").await.source == Source::Store {
            first_store = Some(Instant::now());
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (server, pinged) = restart.await.expect("restart");
    stop.store(true, Ordering::Relaxed);
    let accepted = accepting.join().expect("watcher");
    drop(server);
    let recovered = first_store
        .zip(accepted)
        .map(|(s, a)| s.saturating_duration_since(a));
    let after_ping = first_store.map(|s| {
        if s >= pinged {
            (s - pinged).as_secs_f64()
        } else {
            -(pinged - s).as_secs_f64()
        }
    });
    Row {
        lib: lib.name(),
        alive,
        dead,
        dead_from_store,
        fallback,
        recovered,
        after_ping,
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

fn parse_args() -> (usize, Duration) {
    let mut runs = 5;
    let mut down_for = Duration::from_secs(2);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--down-for" => {
                down_for = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .map(Duration::from_secs_f64)
                    .expect("--down-for needs a number of seconds")
            }
            "--runs" => {
                runs = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| n > 0)
                    .expect("--runs needs a positive number")
            }
            "--bench" => {}
            other => ratelimit_benches::not_an_option(
                other,
                "usage: dead_redis [--runs R] [--down-for SECONDS]",
            ),
        }
    }
    (runs, down_for)
}

#[tokio::main]
async fn main() {
    let (runs, down_for) = parse_args();
    println!(
        "Redis killed, dead for {:.1} s (checks continuing), then restarted; {runs} runs per client.\n",
        down_for.as_secs_f64()
    );
    let libs = [
        Lib::RedisRs,
        #[cfg(feature = "fred")]
        Lib::Fred,
    ];
    let mut rows = Vec::new();
    for run in 1..=runs {
        for lib in libs {
            eprintln!("run {run} of {runs}, {}", lib.name());
            rows.push(run_once(lib, down_for).await);
        }
    }
    println!("| client | run | per request | p50 | p99 | p99.9 | max | requests |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    for (i, r) in rows.iter().enumerate() {
        for (what, v) in [
            ("Redis alive", &r.alive),
            ("Redis dead, node breaker open", &r.dead),
        ] {
            println!(
                "| {} | {} | {what} | {} | {} | {} | {} | {} |",
                r.lib,
                i / libs.len() + 1,
                show(quantile(v, 0.5)),
                show(quantile(v, 0.99)),
                show(quantile(v, 0.999)),
                show(*v.last().unwrap()),
                v.len()
            );
        }
    }
    println!();
    println!(
        "| client | run | decisions from the store while dead (of 5000) | from the fallback | store again after the port accepts | after the first PING answered |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let ms = |s: f64| format!("{:.1} ms", s * 1e3);
    for (i, r) in rows.iter().enumerate() {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r.lib,
            i / libs.len() + 1,
            r.dead_from_store,
            r.fallback,
            r.recovered
                .map_or("not within 10 s".to_owned(), |d| ms(d.as_secs_f64())),
            r.after_ping.map_or("-".to_owned(), ms)
        );
    }
    for lib in libs {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.lib == lib.name()).collect();
        let rec = median(
            mine.iter()
                .filter_map(|r| r.recovered.map(|d| d.as_secs_f64()))
                .collect(),
        );
        let ping = median(mine.iter().filter_map(|r| r.after_ping).collect());
        let worst = mine
            .iter()
            .filter_map(|r| r.recovered)
            .max()
            .map(|d| d.as_secs_f64());
        let p50 = median(
            mine.iter()
                .map(|r| quantile(&r.dead, 0.5).as_secs_f64())
                .collect(),
        );
        println!(
            "| **{}** | median of {} | dead p50 {} |  | **{}** (worst {}) | {} |",
            lib.name(),
            mine.len(),
            p50.map_or("-".to_owned(), |s| show(Duration::from_secs_f64(s))),
            rec.map_or("-".to_owned(), ms),
            worst.map_or("-".to_owned(), ms),
            ping.map_or("-".to_owned(), ms)
        );
    }
    println!("\nTarget: the store answers again <= 200 ms after the server accepts connections.");
}
