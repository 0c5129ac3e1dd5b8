//! What TLS costs the Redis store: the handshake, and each decision with
//! one caller and with 256 callers, TLS against plain text side by side.
//!
//! Starts its own two `redis-server`s through the testkit's fixtures, one
//! in plain text and one serving TLS only with client certificates
//! required (`RedisServer::start_tls`, certificates made by the testkit),
//! and in each round measures, alternating which goes first:
//!
//! - **handshake**: a new connection and its first `PING` (redis-rs
//!   multiplexed connection with the store's settings: `TCP_NODELAY`, over
//!   TLS with the CA and the client certificate), 200 times: the median;
//! - **decisions**: `Limiter::check` over `RedisStore` (redis-rs), a token
//!   bucket no caller exhausts, for `--seconds` with 1 caller and then with
//!   256 concurrent callers: decisions per second, and the median and 99th
//!   percentile latency.
//!
//! The table gives the median of the rounds for each cell, and the
//! TLS/plain ratio of those medians.
//!
//! ```text
//! cargo run --release -p ratelimit-benches --bin tls_cost -- --runs 5 --seconds 3
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimit_core::{FailurePolicy, Limiter, Quota, Rate};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_server::RedisServer;
use ratelimit_testkit::tls::TestCerts;

/// A row of the table: its name, the measure, its unit.
type Row = (&'static str, fn(&Round) -> f64, &'static str);

#[derive(Debug, Default, Clone)]
struct Round {
    handshake_us: f64,
    one_rate: f64,
    one_p50_us: f64,
    one_p99_us: f64,
    many_rate: f64,
    many_p50_us: f64,
    many_p99_us: f64,
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

async fn store(server: &RedisServer) -> RedisStore {
    let certs = TestCerts::shared();
    let mut b = RedisStore::builder(server.url())
        .prefix(server.prefix())
        .connection_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_millis(200));
    if server.url().starts_with("rediss://") {
        b = b
            .tls_ca_file(certs.ca())
            .tls_client_cert(certs.client_cert(), certs.client_key());
    }
    b.build().await.expect("connect")
}

async fn handshake(server: &RedisServer) -> f64 {
    // The store's own client settings: TCP_NODELAY, the CA and the client
    // certificate for TLS.
    let certs = TestCerts::shared();
    let mut security = ratelimit_redis::tls::Security::default();
    if server.url().starts_with("rediss://") {
        security.ca_file = Some(certs.ca());
        security.cert_file = Some(certs.client_cert());
        security.key_file = Some(certs.client_key());
    }
    let client = security.redis_client(&server.url()).expect("client");
    let mut times = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .expect("PING");
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    median(times)
}

/// `callers` tasks calling `check` for `seconds`: decisions per second and
/// the latencies.
async fn decisions(limiter: Arc<Limiter>, callers: usize, seconds: u64) -> (f64, Vec<Duration>) {
    let until = Instant::now() + Duration::from_secs(seconds);
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let caller = format!("caller-{i}");
                let mut lat = Vec::new();
                while Instant::now() < until {
                    let t = Instant::now();
                    let d = limiter.check(&caller).await;
                    // Only what the store decided (a quota no caller
                    // exhausts: every such decision admits).
                    if d.allowed {
                        lat.push(t.elapsed());
                    }
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    let rate = all.len() as f64 / start.elapsed().as_secs_f64();
    all.sort();
    (rate, all)
}

async fn round(server: &RedisServer, seconds: u64) -> Round {
    let handshake_us = handshake(server).await;
    let limiter = Arc::new(
        Limiter::builder(store(server).await)
            .quota(Quota::token_bucket(Rate::per_second(1_000_000_000), 1_000_000_000).unwrap())
            .failure_policy(FailurePolicy::FailClosed)
            .timeout(Duration::from_secs(1))
            .build()
            .expect("limiter"),
    );
    let (one_rate, one) = decisions(Arc::clone(&limiter), 1, seconds).await;
    let (many_rate, many) = decisions(limiter, 256, seconds).await;
    Round {
        handshake_us,
        one_rate,
        one_p50_us: percentile(&one, 0.5),
        one_p99_us: percentile(&one, 0.99),
        many_rate,
        many_p50_us: percentile(&many, 0.5),
        many_p99_us: percentile(&many, 0.99),
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let runs = arg("--runs", 5);
    let seconds = arg("--seconds", 3);
    ratelimit_testkit::tls::install_crypto_provider();
    let plain = RedisServer::start_local();
    let tls = RedisServer::start_tls();
    let (mut p, mut t) = (Vec::new(), Vec::new());
    for r in 0..runs {
        // Alternate which goes first.
        if r % 2 == 0 {
            p.push(round(&plain, seconds).await);
            t.push(round(&tls, seconds).await);
        } else {
            t.push(round(&tls, seconds).await);
            p.push(round(&plain, seconds).await);
        }
        let (a, b) = (p.last().unwrap(), t.last().unwrap());
        eprintln!(
            "round {}: plain {:.0}/s, {:.0}/s; TLS {:.0}/s, {:.0}/s",
            r + 1,
            a.one_rate,
            a.many_rate,
            b.one_rate,
            b.many_rate
        );
    }
    let m = |v: &[Round], f: fn(&Round) -> f64| median(v.iter().map(f).collect());
    let rows: [Row; 7] = [
        (
            "handshake: connect + first PING, median",
            |r| r.handshake_us,
            "µs",
        ),
        ("1 caller: decisions/s", |r| r.one_rate, "/s"),
        ("1 caller: latency p50", |r| r.one_p50_us, "µs"),
        ("1 caller: latency p99", |r| r.one_p99_us, "µs"),
        ("256 callers: decisions/s", |r| r.many_rate, "/s"),
        ("256 callers: latency p50", |r| r.many_p50_us, "µs"),
        ("256 callers: latency p99", |r| r.many_p99_us, "µs"),
    ];
    println!(
        "| measure (median of {runs} alternated rounds, {seconds} s each) | plain text | TLS | TLS / plain |"
    );
    println!("|---|---|---|---|");
    for (name, f, unit) in rows {
        let (a, b) = (m(&p, f), m(&t, f));
        println!("| {name} | {a:.0} {unit} | {b:.0} {unit} | {:.2} |", b / a);
    }
}
