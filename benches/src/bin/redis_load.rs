//! Load generator for the Redis store. Starts its own `redis-server` (through
//! `ratelimit_testkit::redis_server`) on a free loopback port and measures,
//! in one run and on that one server:
//!
//! 1. **Throughput and latency**: N concurrent tasks over M connections
//!    calling `Limiter::check` over `RedisStore`, for each algorithm and each
//!    client library (redis-rs; fred with `--features fred`); beside them the
//!    same token bucket script sent as a bare `EVALSHA` (no store, no
//!    limiter) and the two naive reference scripts (`INCR`+`EXPIRE` fixed
//!    window; hash-of-floats token bucket, see `benches/lua/`); and
//!    `redis-benchmark` running each script with `EVALSHA` at the same
//!    concurrency (N connections, one request in flight each).
//! 2. **Limiter overhead**: one task, one connection: latency of `PING`, of
//!    a bare `EVALSHA`, of `RedisStore::decide` and of `Limiter::check`.
//! 3. **Memory**: `used_memory` delta over many callers (one decision each)
//!    on a fresh server per layout.
//!
//! Sections 1 and 2 repeat `--runs` times; the tables give the median of the
//! runs and, for ratios, the median of the per-run ratios.
//!
//! ```text
//! cargo run --release -p ratelimit-benches --features fred --bin redis_load -- --runs 3
//! ```
//!
//! Options (defaults in parentheses): `--runs R` (3), `--tasks N` (32),
//! `--connections M` (4), `--callers K` (10000), `--seconds S` (3),
//! `--bench-requests Q` (per redis-benchmark test) (150000),
//! `--memory-callers C` (100000), `--deny` (use "100/min, burst 20" so most
//! calls are denied, instead of quotas no caller reaches), `--skip-memory`,
//! `--skip-overhead`, `--skip-throughput`, `--ratio-only` (instead of the
//! throughput section, only the token bucket through `RedisStore::decide`
//! and through `Limiter::check` against its bare `EVALSHA`, in interleaved
//! slices of 200 ms: the client-side ratios per round and their medians),
//! `--cluster` (also drive
//! `ClusterStore` on a local 6-node cluster: 3 masters + 3 replicas).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use ratelimit_benches::clients::Lib;
use ratelimit_cluster::ClusterStore;
use ratelimit_core::{AlgorithmKind, Limiter, Quota, Rate, Store, StoreExt};
use ratelimit_redis::{RedisStore, keys, scripts};
use ratelimit_testkit::redis_cluster::RedisCluster;
use ratelimit_testkit::redis_server::RedisServer;
use redis::aio::ConnectionManager;

const NAIVE_TOKEN_BUCKET: &str = include_str!("../../lua/naive_token_bucket.lua");
const NAIVE_FIXED_WINDOW: &str = include_str!("../../lua/naive_fixed_window.lua");
const TRIVIAL_SCRIPT: &str = "return {1, 0, 0, -1}";
/// The Redis commands of our token bucket and nothing else: the cost of the
/// calls themselves, without arithmetic.
const COMMANDS_ONLY_OURS: &str = "redis.call('TIME') redis.call('GET', KEYS[1]) \
     redis.call('SET', KEYS[1], '1764538000123456', 'PX', '3600000') return {1, 0, 0, -1}";
/// The Redis commands of the naive hash-of-floats script and nothing else.
const COMMANDS_ONLY_NAIVE: &str = "redis.call('TIME') redis.call('HMGET', KEYS[1], 'tokens', 'ts') \
     redis.call('HSET', KEYS[1], 'tokens', 19.000000000000004, 'ts', 1764538000.123456) \
     redis.call('PEXPIRE', KEYS[1], 3600000) return {1, 0}";
/// The prototype's arguments (`benches/lua/`): the server's clock, no
/// minimum expiry, cost 1, then the bucket's unit, refill and full.
fn prototype_args(tb: &Quota) -> Vec<String> {
    let ratelimit_core::Algorithm::TokenBucket(b) = tb.algorithm() else {
        unreachable!("the prototype is a token bucket")
    };
    vec![
        String::new(),
        "0".to_owned(),
        "1".to_owned(),
        b.unit().to_string(),
        b.refill().to_string(),
        b.full().to_string(),
    ]
}

const PROTOTYPE_TOKEN_BUCKET: &str =
    include_str!("../../lua/prototype_token_bucket_one_integer.lua");
const GENEROUS: Duration = Duration::from_secs(2);
const NAMESPACE: &str = "api";

/// The options (see the module docs for what each does).
const USAGE: &str = "usage: redis_load [--runs R] [--tasks N] [--connections M] [--callers K] \
[--seconds S] [--bench-requests Q] [--memory-callers C] [--deny] [--skip-memory] \
[--skip-overhead] [--skip-throughput] [--ratio-only] [--cluster]";

#[derive(Debug, Clone)]
struct Args {
    runs: usize,
    tasks: usize,
    connections: usize,
    callers: usize,
    seconds: f64,
    bench_requests: usize,
    memory_callers: usize,
    deny: bool,
    memory: bool,
    overhead: bool,
    throughput: bool,
    /// Only what the client-side ratio needs: the token bucket through
    /// `Limiter::check` and its bare `EVALSHA`, per client.
    ratio_only: bool,
    cluster: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        runs: 3,
        tasks: 32,
        connections: 4,
        callers: 10_000,
        seconds: 3.0,
        bench_requests: 150_000,
        memory_callers: 100_000,
        deny: false,
        memory: true,
        overhead: true,
        throughput: true,
        ratio_only: false,
        cluster: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| panic!("{flag} needs a value"))
                .parse::<f64>()
                .unwrap_or_else(|e| panic!("{flag}: {e}"))
        };
        match flag.as_str() {
            "--runs" => a.runs = value() as usize,
            "--tasks" => a.tasks = value() as usize,
            "--connections" => a.connections = value() as usize,
            "--callers" => a.callers = value() as usize,
            "--seconds" => a.seconds = value(),
            "--bench-requests" => a.bench_requests = value() as usize,
            "--memory-callers" => a.memory_callers = value() as usize,
            "--deny" => a.deny = true,
            "--skip-memory" => a.memory = false,
            "--skip-overhead" => a.overhead = false,
            "--skip-throughput" => a.throughput = false,
            "--ratio-only" => a.ratio_only = true,
            "--cluster" => a.cluster = true,
            // `cargo bench` passes --bench to every target.
            "--bench" => {}
            other => ratelimit_benches::not_an_option(other, USAGE),
        }
    }
    assert!(a.runs > 0 && a.tasks > 0 && a.connections > 0 && a.callers > 0);
    a
}

// ---------------------------------------------------------------------------
// Quotas
// ---------------------------------------------------------------------------

/// Which quotas a section uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Throughput, default: every call admitted and every caller's state
    /// kept between its calls, so every script reads existing state and
    /// writes, ours and the naive ones alike. Windows: 1000 per second (a
    /// caller is visited every ~0.1-0.3 s, within the window's life). Token
    /// buckets: 1 per second, burst 1,000,000 (a bucket that is never full
    /// again during the run, so its key never expires; no caller gets near
    /// a million calls).
    Admit,
    /// Throughput with `--deny`: the sold plan, 100 per minute (token
    /// bucket burst 20): after its first calls almost every call is denied.
    Deny,
    /// Memory: 100 per hour (token bucket burst 20), so no key expires while
    /// it is counted.
    Memory,
}

#[derive(Debug, Clone)]
struct Quotas {
    mode: Mode,
}

impl Quotas {
    fn ours(&self, kind: AlgorithmKind) -> Quota {
        let (window_rate, tb_rate, burst) = match self.mode {
            Mode::Admit => (Rate::per_second(1000), Rate::per_second(1), 1_000_000),
            Mode::Deny => (Rate::per_minute(100), Rate::per_minute(100), 20),
            Mode::Memory => (Rate::per_hour(100), Rate::per_hour(100), 20),
        };
        match kind {
            AlgorithmKind::FixedWindow => Quota::fixed_window(window_rate),
            AlgorithmKind::SlidingWindow => Quota::sliding_window(window_rate),
            AlgorithmKind::SlidingLog => Quota::sliding_log(window_rate),
            _ => Quota::token_bucket(tb_rate, burst),
        }
        .expect("valid quota")
    }

    /// ARGV of the naive token bucket (rate per second, capacity, cost):
    /// the same rate and burst as ours.
    fn naive_tb_args(&self) -> Vec<String> {
        let (rate, cap) = match self.mode {
            Mode::Admit => (1.0, 1_000_000),
            Mode::Deny => (100.0 / 60.0, 20),
            Mode::Memory => (100.0 / 3600.0, 20),
        };
        vec![format!("{rate}"), cap.to_string(), "1".into()]
    }

    /// ARGV of the naive fixed window (limit, window in seconds): the same
    /// limit and window as ours.
    fn naive_fw_args(&self) -> Vec<String> {
        let (limit, secs) = match self.mode {
            Mode::Admit => (1000, 1),
            Mode::Deny => (100, 60),
            Mode::Memory => (100, 3600),
        };
        vec![limit.to_string(), secs.to_string()]
    }

    fn describe(&self) -> &'static str {
        match self.mode {
            Mode::Admit => {
                "every call admitted, state kept: windows 1000/s; token buckets 1/s burst 1,000,000"
            }
            Mode::Deny => "the plan, 100/min (token bucket burst 20): most calls denied",
            Mode::Memory => "100/hour (token bucket burst 20)",
        }
    }
}

fn algo_name(kind: AlgorithmKind) -> &'static str {
    match kind {
        AlgorithmKind::FixedWindow => "fixed_window",
        AlgorithmKind::SlidingWindow => "sliding_window",
        AlgorithmKind::SlidingLog => "sliding_log",
        _ => "token_bucket",
    }
}

// ---------------------------------------------------------------------------
// Driving load
// ---------------------------------------------------------------------------

type CallFuture = Pin<Box<dyn Future<Output = Result<bool, String>> + Send>>;
/// One decision for caller number `idx` on connection `conn`: admitted?
type Call = Arc<dyn Fn(usize, usize) -> CallFuture + Send + Sync>;

#[derive(Debug, Default, Clone)]
struct Measured {
    decisions: u64,
    allowed: u64,
    errors: u64,
    per_second: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    /// Server time per `EVALSHA` (`INFO commandstats`), µs; NaN if unknown.
    server_us: f64,
}

async fn phase(
    call: &Call,
    tasks: usize,
    connections: usize,
    callers: usize,
    duration: Duration,
) -> Measured {
    let start = Instant::now();
    let deadline = start + duration;
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let call = call.clone();
        handles.push(tokio::spawn(async move {
            let conn = t % connections;
            let mut idx = callers * t / tasks;
            let mut lat: Vec<u32> = Vec::with_capacity(1 << 16);
            let (mut n, mut ok, mut err) = (0u64, 0u64, 0u64);
            while Instant::now() < deadline {
                let t0 = Instant::now();
                match call(conn, idx).await {
                    Ok(a) => ok += u64::from(a),
                    Err(_) => err += 1,
                }
                lat.push(u32::try_from(t0.elapsed().as_nanos()).unwrap_or(u32::MAX));
                n += 1;
                idx += 1;
                if idx == callers {
                    idx = 0;
                }
            }
            (n, ok, err, lat)
        }));
    }
    let mut m = Measured::default();
    let mut lat = Vec::new();
    for h in handles {
        let (n, ok, err, l) = h.await.expect("load task");
        m.decisions += n;
        m.allowed += ok;
        m.errors += err;
        lat.extend(l);
    }
    let elapsed = start.elapsed();
    m.per_second = m.decisions as f64 / elapsed.as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| {
        if lat.is_empty() {
            return f64::NAN;
        }
        let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
        f64::from(lat[i]) / 1000.0
    };
    m.p50_us = pct(0.50);
    m.p99_us = pct(0.99);
    m.p999_us = pct(0.999);
    m
}

/// A short unrecorded warm-up (connections, script cache, allocator), then
/// the measured phase. With `url`, the server's command statistics are reset
/// after the warm-up and its time per `EVALSHA` read after the phase.
async fn drive(
    call: &Call,
    tasks: usize,
    connections: usize,
    callers: usize,
    secs: f64,
    url: Option<&str>,
) -> Measured {
    let _ = phase(
        call,
        tasks,
        connections,
        callers,
        Duration::from_millis(500),
    )
    .await;
    if let Some(url) = url {
        reset_server_stats(url);
    }
    let mut m = phase(
        call,
        tasks,
        connections,
        callers,
        Duration::from_secs_f64(secs),
    )
    .await;
    m.server_us = url.map_or(f64::NAN, evalsha_usec_per_call);
    m
}

fn sync_connection(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .expect("valid URL")
        .get_connection()
        .expect("connect")
}

/// `CONFIG RESETSTAT`: zeroes the server's command statistics.
fn reset_server_stats(url: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut sync_connection(url))
        .expect("CONFIG RESETSTAT");
}

/// `usec_per_call` of `EVALSHA` since the last reset: the server's own time
/// per script call (parsing, the script and its commands), without the
/// network or the client.
fn evalsha_usec_per_call(url: &str) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut sync_connection(url))
        .expect("INFO commandstats");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|l| {
            l.split(',')
                .find_map(|kv| kv.strip_prefix("usec_per_call="))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(f64::NAN)
}

// ---------------------------------------------------------------------------
// Contenders
// ---------------------------------------------------------------------------

fn caller_id(i: usize) -> String {
    format!("customer-{i:07}")
}

async fn store(lib: Lib, url: &str) -> RedisStore {
    match lib {
        Lib::RedisRs => RedisStore::builder(url)
            .response_timeout(GENEROUS)
            .connection_timeout(GENEROUS)
            .timeout(2 * GENEROUS)
            .build()
            .await
            .expect("connect redis-rs store"),
        #[cfg(feature = "fred")]
        Lib::Fred => RedisStore::from_fred(fred_client(url).await).with_timeout(2 * GENEROUS),
    }
}

#[cfg(feature = "fred")]
async fn fred_client(url: &str) -> ratelimit_redis::fred_client::clients::Client {
    ratelimit_benches::clients::fred_client(url, GENEROUS).await
}

async fn manager(url: &str) -> ConnectionManager {
    let client = redis::Client::open(url).expect("valid URL");
    ConnectionManager::new(client).await.expect("connect")
}

/// `Limiter::check` over `RedisStore`, one store (connection) per `conn`.
async fn ours_limiter(lib: Lib, url: &str, quota: &Quota, conns: usize, callers: usize) -> Call {
    let mut stores = Vec::new();
    for _ in 0..conns {
        stores.push(store(lib, url).await);
    }
    limiter_call(stores, quota, callers)
}

/// `Limiter::check` over each of `stores` (one per connection index).
fn limiter_call<S: Store + 'static>(stores: Vec<S>, quota: &Quota, callers: usize) -> Call {
    let limiters: Vec<Limiter> = stores
        .into_iter()
        .map(|s| {
            Limiter::builder(s)
                .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
                .quota(quota.clone())
                .namespace(NAMESPACE)
                .expect("valid namespace")
                .timeout(GENEROUS)
                .build()
                .expect("limiter")
        })
        .collect();
    let ids: Arc<Vec<String>> = Arc::new((0..callers).map(caller_id).collect());
    let limiters = Arc::new(limiters);
    Arc::new(move |c, i| {
        let (l, ids) = (limiters[c].clone(), ids.clone());
        Box::pin(async move {
            let d = l.check(&ids[i]).await;
            if d.is_from_store() {
                Ok(d.allowed)
            } else {
                Err("decided by the failure policy".to_owned())
            }
        })
    })
}

// ---------------------------------------------------------------------------
// Redis Cluster
// ---------------------------------------------------------------------------

async fn cluster_store(lib: Lib, cluster: &RedisCluster) -> ClusterStore {
    match lib {
        Lib::RedisRs => ClusterStore::builder(cluster.urls())
            .response_timeout(GENEROUS)
            .connection_timeout(Duration::from_secs(1))
            .timeout(2 * GENEROUS)
            .build()
            .await
            .expect("connect to the cluster"),
        #[cfg(feature = "fred")]
        Lib::Fred => {
            use ratelimit_cluster::fred_client::prelude::*;
            let config = Config {
                server: ServerConfig::new_clustered(cluster.addrs()),
                ..Config::default()
            };
            let client = Builder::from_config(config)
                .with_performance_config(|p| p.default_command_timeout = GENEROUS)
                .with_connection_config(|c| {
                    c.connection_timeout = Duration::from_secs(1);
                    c.max_command_attempts = 1;
                })
                .build()
                .expect("fred cluster client");
            client.init().await.expect("fred connects to the cluster");
            ClusterStore::from_fred(client).with_timeout(2 * GENEROUS)
        }
    }
}

/// `Limiter::check` over `ClusterStore` on a local 3-master + 3-replica
/// cluster, each algorithm and client library, `runs` times.
async fn cluster_section(a: &Args, q: &Quotas) {
    eprintln!("starting a local 6-node Redis Cluster");
    let cluster = RedisCluster::start_local();
    let (n, m, k, s) = (a.tasks, a.connections, a.callers, a.seconds);
    let mut book = Book::default();
    for run in 1..=a.runs {
        eprintln!("cluster run {run} of {}", a.runs);
        for lib in Lib::all() {
            for kind in ALGORITHMS {
                let mut stores = Vec::new();
                for _ in 0..m {
                    stores.push(cluster_store(lib, &cluster).await);
                }
                let call = limiter_call(stores, &q.ours(kind), k);
                book.add(
                    &format!(
                        "cluster: ours {} ({}, Limiter::check)",
                        algo_name(kind),
                        lib.name()
                    ),
                    drive(&call, n, m, k, s, None).await,
                );
            }
        }
    }
    book.print_table(
        &format!(
            "### Redis Cluster (3 masters + 3 replicas, all on this machine): {n} tasks over {m} cluster clients"
        ),
        &book.order,
    );
}

/// `RedisStore::decide` alone, with the key a `Limiter` would pass.
async fn ours_store(lib: Lib, url: &str, quota: &Quota, conns: usize, callers: usize) -> Call {
    let mut stores = Vec::new();
    for _ in 0..conns {
        stores.push(Arc::new(store(lib, url).await));
    }
    let ids: Arc<Vec<String>> = Arc::new(
        (0..callers)
            .map(|i| format!("{NAMESPACE}:{}", caller_id(i)))
            .collect(),
    );
    let stores = Arc::new(stores);
    let quota = Arc::new(quota.clone());
    Arc::new(move |c, i| {
        let (s, ids, q) = (stores[c].clone(), ids.clone(), quota.clone());
        Box::pin(async move {
            s.decide_one(ids[i].as_bytes(), &q, 1)
                .await
                .map(|d| d.allowed)
                .map_err(|e| e.to_string())
        })
    })
}

/// A bare `EVALSHA` of `lua` with prebuilt keys and arguments: what the
/// script costs through the client library, without store or limiter.
/// `allowed` is the first element of the reply.
async fn bare_evalsha(
    lib: Lib,
    url: &str,
    lua: &str,
    keys: Arc<Vec<String>>,
    args: Vec<String>,
    conns: usize,
) -> Call {
    let sha = load_script(url, lua).await;
    let args = Arc::new(args);
    match lib {
        Lib::RedisRs => {
            let mut managers = Vec::new();
            for _ in 0..conns {
                managers.push(manager(url).await);
            }
            let managers = Arc::new(managers);
            let sha: Arc<str> = Arc::from(sha);
            Arc::new(move |c, i| {
                let mut m = managers[c].clone();
                let (sha, keys, args) = (sha.clone(), keys.clone(), args.clone());
                Box::pin(async move {
                    let mut cmd = redis::cmd("EVALSHA");
                    cmd.arg(&*sha).arg(1).arg(&keys[i]);
                    for a in args.iter() {
                        cmd.arg(a);
                    }
                    let ratelimit_redis::decode::Integers(reply) =
                        cmd.query_async(&mut m).await.map_err(|e| e.to_string())?;
                    Ok(ratelimit_benches::admitted(&reply))
                })
            })
        }
        #[cfg(feature = "fred")]
        Lib::Fred => {
            use ratelimit_redis::fred_client::interfaces::LuaInterface;
            let mut clients = Vec::new();
            for _ in 0..conns {
                clients.push(fred_client(url).await);
            }
            let clients = Arc::new(clients);
            let sha: Arc<str> = Arc::from(sha);
            Arc::new(move |c, i| {
                let client = clients[c].clone();
                let (sha, keys, args) = (sha.clone(), keys.clone(), args.clone());
                Box::pin(async move {
                    let reply: Vec<i64> = client
                        .evalsha(&*sha, keys[i].as_str(), args.to_vec())
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(ratelimit_benches::admitted(&reply))
                })
            })
        }
    }
}

/// `PING` round trips over redis-rs: the floor under every decision.
async fn ping(url: &str) -> Call {
    let m = manager(url).await;
    Arc::new(move |_, _| {
        let mut m = m.clone();
        Box::pin(async move {
            let _: String = redis::cmd("PING")
                .query_async(&mut m)
                .await
                .map_err(|e| e.to_string())?;
            Ok(true)
        })
    })
}

async fn load_script(url: &str, lua: &str) -> String {
    let mut m = manager(url).await;
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(lua)
        .query_async(&mut m)
        .await
        .expect("SCRIPT LOAD")
}

/// The Redis keys our store writes for the callers under `quota`.
fn our_keys(quota: &Quota, callers: usize) -> Arc<Vec<String>> {
    Arc::new(
        (0..callers)
            .map(|i| {
                keys::key(
                    "rl",
                    format!("{NAMESPACE}:{}", caller_id(i)).as_bytes(),
                    quota,
                )
            })
            .collect(),
    )
}

/// Keys for the one-integer prototype: ours with `:tb` replaced by `:t1`
/// (same length, so memory compares like for like).
fn prototype_keys(quota: &Quota, callers: usize) -> Arc<Vec<String>> {
    Arc::new(
        our_keys(quota, callers)
            .iter()
            .map(|k| format!("{}t1", &k[..k.len() - 2]))
            .collect(),
    )
}

/// Naive keys: `naive:<what>:customer-<i>`.
fn naive_keys(what: &str, callers: usize) -> Arc<Vec<String>> {
    Arc::new(
        (0..callers)
            .map(|i| format!("naive:{what}:{}", caller_id(i)))
            .collect(),
    )
}

// ---------------------------------------------------------------------------
// redis-benchmark
// ---------------------------------------------------------------------------

/// `redis-benchmark` sending `EVALSHA sha 1 <key with __rand_int__> args...`
/// from `clients` connections, `pipeline` requests in flight on each.
/// Returns requests/s, p50 and p99 in µs.
fn redis_benchmark(
    port: u16,
    (clients, pipeline): (usize, usize),
    requests: usize,
    keyspace: usize,
    sha: &str,
    key: &str,
    args: &[String],
) -> Option<(f64, f64, f64)> {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &clients.to_string(), "-n", &requests.to_string()])
        .args(["-P", &pipeline.to_string()])
        .args(["-r", &keyspace.to_string(), "--csv"])
        .args(["EVALSHA", sha, "1", key])
        .args(args)
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "redis-benchmark could not run ({e}): install Debian's redis-tools \
                 (`apt-get install -y redis-tools`)"
            );
            return None;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let line = text.lines().rfind(|l| l.starts_with("\"EVALSHA"))?;
    let f: Vec<f64> = line
        .split("\",\"")
        .skip(1)
        .map(|s| s.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    Some((f[0], f[3] * 1000.0, f[5] * 1000.0))
}

// ---------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------

#[derive(Debug, Default)]
struct Book {
    /// name -> one measurement per run.
    rows: BTreeMap<String, Vec<Measured>>,
    /// Insertion order of names, for printing.
    order: Vec<String>,
}

impl Book {
    fn add(&mut self, name: &str, m: Measured) {
        if !self.rows.contains_key(name) {
            self.order.push(name.to_owned());
        }
        eprintln!(
            "  {name}: {:.0}/s, p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs, server {:.2} µs/EVALSHA, admitted {:.1}%, errors {}",
            m.per_second,
            m.p50_us,
            m.p99_us,
            m.p999_us,
            m.server_us,
            100.0 * m.allowed as f64 / m.decisions.max(1) as f64,
            m.errors
        );
        self.rows.entry(name.to_owned()).or_default().push(m);
    }

    fn median_of(&self, name: &str, f: impl Fn(&Measured) -> f64) -> Option<f64> {
        median(self.rows.get(name)?.iter().map(f).collect())
    }

    /// Median over runs of `a / b` within each run.
    fn ratio(&self, a: &str, b: &str, f: impl Fn(&Measured) -> f64) -> Option<f64> {
        let (a, b) = (self.rows.get(a)?, self.rows.get(b)?);
        median(a.iter().zip(b).map(|(x, y)| f(x) / f(y)).collect())
    }

    fn print_table(&self, title: &str, names: &[String]) {
        println!("{title}\n");
        println!(
            "| contender | decisions/s | p50 µs | p99 µs | p99.9 µs | server µs per EVALSHA | admitted | errors | runs |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for name in names {
            let Some(rows) = self.rows.get(name) else {
                continue;
            };
            let g = |f: fn(&Measured) -> f64| self.median_of(name, f).unwrap_or(f64::NAN);
            // redis-benchmark does not report what the scripts answered.
            let admitted = if name.starts_with("redis-benchmark") {
                "–".to_owned()
            } else {
                format!(
                    "{:.1}%",
                    100.0 * g(|m| m.allowed as f64 / m.decisions.max(1) as f64)
                )
            };
            let errors: u64 = rows.iter().map(|m| m.errors).sum();
            println!(
                "| {name} | {:.0} | {:.0} | {:.0} | {} | {} | {admitted} | {errors} | {} |",
                g(|m| m.per_second),
                g(|m| m.p50_us),
                g(|m| m.p99_us),
                fmt_opt(self.median_of(name, |m| m.p999_us), 0),
                fmt_opt(self.median_of(name, |m| m.server_us), 2),
                rows.len()
            );
        }
        println!();
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_owned(), |x| format!("{x:.digits$}"))
}

// ---------------------------------------------------------------------------
// Sections
// ---------------------------------------------------------------------------

const ALGORITHMS: [AlgorithmKind; 4] = [
    AlgorithmKind::FixedWindow,
    AlgorithmKind::SlidingWindow,
    AlgorithmKind::SlidingLog,
    AlgorithmKind::TokenBucket,
];

/// `--ratio-only`: `RedisStore::decide` and `Limiter::check` over that
/// store against the bare `EVALSHA` of the same script, in slices of
/// 200 ms taken in turn (the order rotating from round to round), for as
/// many rounds as fit in `secs` x 2 per run; prints each round's ratios of
/// decisions/s and their medians. Slices next to each other share the
/// machine's load, which on a shared host moves a contender's throughput
/// by 2x over seconds.
#[allow(clippy::too_many_arguments)]
async fn interleaved_ratio(
    lib: Lib,
    store: &Call,
    limiter: &Call,
    bare: &Call,
    tasks: usize,
    connections: usize,
    callers: usize,
    secs: f64,
) {
    const SLICE: Duration = Duration::from_millis(200);
    let warm = Duration::from_millis(500);
    let contenders = [store, limiter, bare];
    for c in contenders {
        let _ = phase(c, tasks, connections, callers, warm).await;
    }
    let rounds = ((secs * 2.0) / (2.0 * SLICE.as_secs_f64())).max(1.0) as usize;
    let (mut of_store, mut of_limiter) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut per_second = [0.0; 3];
        for k in 0..3 {
            let c = (round + k) % 3;
            per_second[c] = phase(contenders[c], tasks, connections, callers, SLICE)
                .await
                .per_second;
        }
        of_store.push(per_second[0] / per_second[2]);
        of_limiter.push(per_second[1] / per_second[2]);
    }
    for (what, ratios) in [
        ("RedisStore::decide", of_store),
        ("Limiter::check", of_limiter),
    ] {
        let mut sorted = ratios.clone();
        sorted.sort_by(f64::total_cmp);
        let q = |f: f64| sorted[((sorted.len() - 1) as f64 * f).round() as usize];
        println!(
            "  ratio, {what} / bare EVALSHA ({}), {} rounds of 3 x {:?}: median {:.3}, quartiles {:.3}-{:.3}, rounds {}",
            lib.name(),
            rounds,
            SLICE,
            q(0.5),
            q(0.25),
            q(0.75),
            ratios
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
}

/// The bare `EVALSHA` of the token bucket's own script with the arguments
/// the store sends: the reference of the client-side ratio.
async fn bare_token_bucket(lib: Lib, url: &str, tb: &Quota, callers: usize, conns: usize) -> Call {
    bare_evalsha(
        lib,
        url,
        scripts::single(tb).lua(),
        our_keys(tb, callers),
        scripts::single_args(tb, None, 1),
        conns,
    )
    .await
}

async fn throughput_run(a: &Args, q: &Quotas, server: &RedisServer, book: &mut Book) {
    let url = server.url();
    let (n, m, k, s) = (a.tasks, a.connections, a.callers, a.seconds);
    let tb = q.ours(AlgorithmKind::TokenBucket);
    if a.ratio_only {
        for lib in Lib::all() {
            let store = ours_store(lib, &url, &tb, m, k).await;
            let limiter = ours_limiter(lib, &url, &tb, m, k).await;
            let bare = bare_token_bucket(lib, &url, &tb, k, m).await;
            interleaved_ratio(lib, &store, &limiter, &bare, n, m, k, s).await;
        }
        return;
    }
    for lib in Lib::all() {
        for kind in ALGORITHMS {
            let quota = q.ours(kind);
            let call = ours_limiter(lib, &url, &quota, m, k).await;
            book.add(
                &format!("ours {} ({}, Limiter::check)", algo_name(kind), lib.name()),
                drive(&call, n, m, k, s, Some(&url)).await,
            );
        }
        let bare = bare_token_bucket(lib, &url, &tb, k, m).await;
        book.add(
            &format!("ours token_bucket script, bare EVALSHA ({})", lib.name()),
            drive(&bare, n, m, k, s, Some(&url)).await,
        );
    }
    let naive_tb = bare_evalsha(
        Lib::RedisRs,
        &url,
        NAIVE_TOKEN_BUCKET,
        naive_keys("tb", k),
        q.naive_tb_args(),
        m,
    )
    .await;
    book.add(
        "naive hash-of-floats token bucket, bare EVALSHA (redis-rs)",
        drive(&naive_tb, n, m, k, s, Some(&url)).await,
    );
    let naive_fw = bare_evalsha(
        Lib::RedisRs,
        &url,
        NAIVE_FIXED_WINDOW,
        naive_keys("fw", k),
        q.naive_fw_args(),
        m,
    )
    .await;
    let proto = bare_evalsha(
        Lib::RedisRs,
        &url,
        PROTOTYPE_TOKEN_BUCKET,
        prototype_keys(&tb, k),
        prototype_args(&tb),
        m,
    )
    .await;
    book.add(
        "prototype one-integer token bucket, bare EVALSHA (redis-rs)",
        drive(&proto, n, m, k, s, Some(&url)).await,
    );
    book.add(
        "naive INCR+EXPIRE fixed window, bare EVALSHA (redis-rs)",
        drive(&naive_fw, n, m, k, s, Some(&url)).await,
    );

    // redis-benchmark: the same scripts. First N connections with one
    // request in flight each (N concurrent requests, as our N tasks); then,
    // for the token buckets, M connections pipelining N/M requests each (our
    // client's shape: N requests in flight over M multiplexed connections).
    let pipelined = (n / m).max(1);
    let mut bench =
        |label: &str, conns: usize, pipe: usize, lua: &str, key: &str, args: Vec<String>| {
            let sha = scripts_sha(&url, lua);
            if let Some((rps, p50, p99)) = redis_benchmark(
                server.port(),
                (conns, pipe),
                a.bench_requests,
                k,
                &sha,
                key,
                &args,
            ) {
                let shape = if pipe > 1 {
                    format!("-c {conns} -P {pipe}")
                } else {
                    format!("-c {conns}")
                };
                book.add(
                    &format!("redis-benchmark {shape}: {label}"),
                    Measured {
                        decisions: a.bench_requests as u64,
                        allowed: 0,
                        errors: 0,
                        per_second: rps,
                        p50_us: p50,
                        p99_us: p99,
                        p999_us: f64::NAN,
                        server_us: evalsha_usec_per_call(&url),
                    },
                );
            }
        };
    for kind in ALGORITHMS {
        let quota = q.ours(kind);
        // The key a limiter writes (default policy name left out, layout code).
        let key = format!(
            "rl:{{{NAMESPACE}%3Acustomer-__rand_int__}}:{}",
            keys::layout_code(kind)
        );
        bench(
            &format!("ours {}", algo_name(kind)),
            n,
            1,
            scripts::single(&quota).lua(),
            &key,
            scripts::single_args(&quota, None, 1),
        );
    }
    for (conns, pipe) in [(n, 1), (m, pipelined)] {
        bench(
            "naive hash-of-floats token bucket",
            conns,
            pipe,
            NAIVE_TOKEN_BUCKET,
            "naive:tb:customer-__rand_int__",
            q.naive_tb_args(),
        );
        if pipe > 1 {
            bench(
                "ours token_bucket",
                conns,
                pipe,
                scripts::single(&tb).lua(),
                &format!("rl:{{{NAMESPACE}%3Acustomer-__rand_int__}}:tb2"),
                scripts::single_args(&tb, None, 1),
            );
        }
        bench(
            "prototype one-integer token bucket",
            conns,
            pipe,
            PROTOTYPE_TOKEN_BUCKET,
            &format!("rl:{{{NAMESPACE}%3Acustomer-__rand_int__}}:t1"),
            prototype_args(&tb),
        );
    }
    bench(
        "naive INCR+EXPIRE fixed window",
        n,
        1,
        NAIVE_FIXED_WINDOW,
        "naive:fw:customer-__rand_int__",
        q.naive_fw_args(),
    );
}

/// The server's own time per call of each script (`INFO commandstats`
/// `usec_per_call` of `EVALSHA`), from `redis-benchmark` on ONE connection:
/// the benchmark client waits for every reply, so it never competes with
/// the server for a core mid-command and the figure is the script's cost,
/// not CPU contention. Its requests/s (round-trip bound) are not used.
fn script_costs_run(a: &Args, q: &Quotas, server: &RedisServer, book: &mut Book) {
    let url = server.url();
    let tb = q.ours(AlgorithmKind::TokenBucket);
    let requests = (a.bench_requests / 5).max(1000);
    let mut cost = |label: &str, lua: &str, key: &str, args: Vec<String>| {
        let sha = scripts_sha(&url, lua);
        // Warm-up: the keys exist, as in steady state.
        let _ = redis_benchmark(
            server.port(),
            (8, 1),
            a.callers * 2,
            a.callers,
            &sha,
            key,
            &args,
        );
        reset_server_stats(&url);
        if redis_benchmark(server.port(), (1, 1), requests, a.callers, &sha, key, &args).is_some() {
            book.add(
                label,
                Measured {
                    decisions: requests as u64,
                    per_second: f64::NAN,
                    p50_us: f64::NAN,
                    p99_us: f64::NAN,
                    p999_us: f64::NAN,
                    server_us: evalsha_usec_per_call(&url),
                    ..Measured::default()
                },
            );
        }
    };
    let our_key = |code: &str| format!("rl:{{{NAMESPACE}%3Acustomer-__rand_int__}}:{code}");
    for kind in ALGORITHMS {
        let quota = q.ours(kind);
        cost(
            &format!("ours {}", algo_name(kind)),
            scripts::single(&quota).lua(),
            &our_key(keys::layout_code(kind)),
            scripts::single_args(&quota, None, 1),
        );
    }
    cost(
        "naive hash-of-floats token bucket",
        NAIVE_TOKEN_BUCKET,
        "naive:tb:customer-__rand_int__",
        q.naive_tb_args(),
    );
    cost(
        "naive INCR+EXPIRE fixed window",
        NAIVE_FIXED_WINDOW,
        "naive:fw:customer-__rand_int__",
        q.naive_fw_args(),
    );
    cost(
        "prototype one-integer token bucket",
        PROTOTYPE_TOKEN_BUCKET,
        &our_key("t1"),
        prototype_args(&tb),
    );
    cost(
        "floor: script returning {1, 0, 0, -1}",
        TRIVIAL_SCRIPT,
        "floor:customer-__rand_int__",
        Vec::new(),
    );
    cost(
        "floor: TIME + GET + SET only (our token bucket's commands)",
        COMMANDS_ONLY_OURS,
        "floor:ours:customer-__rand_int__",
        Vec::new(),
    );
    cost(
        "floor: TIME + HMGET + HSET + PEXPIRE only (the naive script's commands)",
        COMMANDS_ONLY_NAIVE,
        "floor:naive:customer-__rand_int__",
        Vec::new(),
    );
}

fn print_script_costs(book: &Book) {
    println!(
        "### Script cost: server time per EVALSHA (`usec_per_call`, redis-benchmark on one connection)\n"
    );
    println!(
        "| script | server µs per call | naive hash-of-floats token bucket / this (speed-up) | runs |"
    );
    println!("|---|---:|---:|---:|");
    let naive = "naive hash-of-floats token bucket";
    for name in &book.order {
        println!(
            "| {name} | {} | {} | {} |",
            fmt_opt(book.median_of(name, |m| m.server_us), 2),
            fmt_opt(book.ratio(naive, name, |m| m.server_us), 2),
            book.rows.get(name).map_or(0, Vec::len)
        );
    }
    println!();
}

/// SCRIPT LOAD over a blocking connection (used between async phases).
fn scripts_sha(url: &str, lua: &str) -> String {
    let mut c = sync_connection(url);
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(lua)
        .query(&mut c)
        .expect("SCRIPT LOAD")
}

/// The overhead section runs on its own current-thread runtime: caller,
/// connection driver and socket on one thread, so the differences between
/// contenders are their own CPU time, not cross-thread wake-ups.
fn overhead_run_isolated(a: &Args, q: &Quotas, url: &str, book: &mut Book) {
    tokio::task::block_in_place(|| {
        std::thread::scope(|s| {
            s.spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime")
                    .block_on(overhead_run(a, q, url, book));
            })
            .join()
            .expect("overhead run");
        });
    });
}

async fn overhead_run(a: &Args, q: &Quotas, url: &str, book: &mut Book) {
    let url = url.to_owned();
    let (k, s) = (a.callers, a.seconds);
    let tb = q.ours(AlgorithmKind::TokenBucket);
    book.add(
        "seq: PING (redis-rs)",
        drive(&ping(&url).await, 1, 1, k, s, None).await,
    );
    for lib in Lib::all() {
        let bare = bare_evalsha(
            lib,
            &url,
            scripts::single(&tb).lua(),
            our_keys(&tb, k),
            scripts::single_args(&tb, None, 1),
            1,
        )
        .await;
        book.add(
            &format!("seq: bare EVALSHA token_bucket ({})", lib.name()),
            drive(&bare, 1, 1, k, s, None).await,
        );
        let st = ours_store(lib, &url, &tb, 1, k).await;
        book.add(
            &format!("seq: RedisStore::decide token_bucket ({})", lib.name()),
            drive(&st, 1, 1, k, s, None).await,
        );
        let lim = ours_limiter(lib, &url, &tb, 1, k).await;
        book.add(
            &format!("seq: Limiter::check token_bucket ({})", lib.name()),
            drive(&lim, 1, 1, k, s, None).await,
        );
    }
}

/// `used_memory` per caller for one layout, on a fresh server: `populate`
/// makes one decision for each of `callers` callers.
async fn memory_row<F, Fut>(callers: usize, populate: F) -> f64
where
    F: Fn(String, usize) -> Fut,
    Fut: Future<Output = ()>,
{
    let server = RedisServer::start_local();
    let url = server.url();
    // Warm-up: a connection, the script cache, one key of another caller.
    populate(url.clone(), 0).await;
    let before = server.info_memory_used();
    populate(url, callers).await;
    let after = server.info_memory_used();
    after.saturating_sub(before) as f64 / callers as f64
}

async fn run_all(call: Call, callers: usize) {
    let tasks = 32;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let call = call.clone();
        handles.push(tokio::spawn(async move {
            for i in (t..callers).step_by(tasks) {
                call(0, i).await.expect("decision");
            }
        }));
    }
    for h in handles {
        h.await.expect("populate task");
    }
}

async fn memory_section(a: &Args) {
    let q = &Quotas { mode: Mode::Memory };
    let c = a.memory_callers;
    // Callers are numbered from 1 so that the warm-up caller (index 0 of a
    // zero-length population) never counts; populate(url, 0) runs caller 0.
    let mut rows: Vec<(String, f64)> = Vec::new();
    for kind in ALGORITHMS {
        let quota = q.ours(kind);
        let per = memory_row(c, |url, n| {
            let quota = quota.clone();
            async move {
                let call = ours_limiter(Lib::RedisRs, &url, &quota, 1, n.max(1) + 1).await;
                if n == 0 {
                    call(0, 0).await.expect("warm-up");
                } else {
                    let shifted: Call = Arc::new(move |c, i| call(c, i + 1));
                    run_all(shifted, n).await;
                }
            }
        })
        .await;
        let key = keys::key(
            "rl",
            format!("{NAMESPACE}:{}", caller_id(42)).as_bytes(),
            &quota,
        );
        rows.push((format!("ours {} (`{key}`)", algo_name(kind)), per));
    }
    let tb = q.ours(AlgorithmKind::TokenBucket);
    let naive = |lua: &'static str,
                 keys: fn(&Quota, usize) -> Arc<Vec<String>>,
                 args: Vec<String>| {
        let tb = tb.clone();
        move |url: String, n: usize| {
            let (tb, args) = (tb.clone(), args.clone());
            async move {
                let call =
                    bare_evalsha(Lib::RedisRs, &url, lua, keys(&tb, n.max(1) + 1), args, 1).await;
                if n == 0 {
                    call(0, 0).await.expect("warm-up");
                } else {
                    let shifted: Call = Arc::new(move |c, i| call(c, i + 1));
                    run_all(shifted, n).await;
                }
            }
        }
    };
    let same_key: fn(&Quota, usize) -> Arc<Vec<String>> = |q, n| our_keys(q, n);
    let natural_tb: fn(&Quota, usize) -> Arc<Vec<String>> = |_, n| naive_keys("tb", n);
    let natural_fw: fn(&Quota, usize) -> Arc<Vec<String>> = |_, n| naive_keys("fw", n);
    let per = memory_row(c, naive(NAIVE_TOKEN_BUCKET, same_key, q.naive_tb_args())).await;
    rows.push((
        "naive hash-of-floats token bucket, same key as ours".to_owned(),
        per,
    ));
    let proto_key: fn(&Quota, usize) -> Arc<Vec<String>> = |q, n| prototype_keys(q, n);
    let per = memory_row(
        c,
        naive(PROTOTYPE_TOKEN_BUCKET, proto_key, prototype_args(&tb)),
    )
    .await;
    rows.push((
        "prototype one-integer token bucket (`rl:{api%3Acustomer-0000042}:t1`)".to_owned(),
        per,
    ));
    let per = memory_row(c, naive(NAIVE_TOKEN_BUCKET, natural_tb, q.naive_tb_args())).await;
    rows.push((
        "naive hash-of-floats token bucket (`naive:tb:customer-0000042`)".to_owned(),
        per,
    ));
    let per = memory_row(c, naive(NAIVE_FIXED_WINDOW, natural_fw, q.naive_fw_args())).await;
    rows.push((
        "naive INCR+EXPIRE fixed window (`naive:fw:customer-0000042:<window>`)".to_owned(),
        per,
    ));

    println!(
        "### Memory per active caller ({c} callers, one decision each, fresh server per row; quotas {})\n",
        q.describe()
    );
    println!("| layout | bytes per caller |");
    println!("|---|---:|");
    for (name, per) in &rows {
        println!("| {name} | {per:.1} |");
    }
    let find = |s: &str| rows.iter().find(|(n, _)| n.starts_with(s)).map(|r| r.1);
    println!(
        "\nRatio prototype one-integer token bucket / naive hash (same key length): {}\n",
        fmt_opt(
            find("prototype one-integer")
                .zip(find("naive hash-of-floats token bucket, same key"))
                .map(|(a, b)| a / b),
            2
        )
    );
    println!(
        "\nRatio ours token_bucket / naive hash (same key): **{}** (target <= 0.75)\n",
        fmt_opt(
            find("ours token_bucket")
                .zip(find("naive hash-of-floats token bucket, same key"))
                .map(|(a, b)| a / b),
            2
        )
    );
}

fn machine() -> String {
    let redis = Command::new("redis-server")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!("{}; {redis}", ratelimit_benches::cpus())
}

#[tokio::main]
async fn main() {
    let a = parse_args();
    let q = Quotas {
        mode: if a.deny { Mode::Deny } else { Mode::Admit },
    };
    let started = SystemTime::now();
    println!(
        "## redis_load: {} run(s), {} tasks over {} connections, {} callers, {} s per contender, quotas: {}\n",
        a.runs,
        a.tasks,
        a.connections,
        a.callers,
        a.seconds,
        q.describe()
    );
    println!("Machine: {}\n", machine());
    let server = RedisServer::start_local();
    let mut load = Book::default();
    let mut seq = Book::default();
    let mut costs = Book::default();
    for run in 1..=a.runs {
        eprintln!("run {run} of {}", a.runs);
        if a.throughput {
            if !a.ratio_only {
                script_costs_run(&a, &q, &server, &mut costs);
            }
            throughput_run(&a, &q, &server, &mut load).await;
        }
        if a.overhead {
            overhead_run_isolated(&a, &q, &server.url(), &mut seq);
        }
    }
    // `--ratio-only` printed its ratios as it went: no tables to print.
    if a.throughput && !a.ratio_only {
        load.print_table(
            &format!(
                "### Throughput and latency: {} concurrent requests ({} tasks over {} connections; redis-benchmark: {} connections)",
                a.tasks, a.tasks, a.connections, a.tasks
            ),
            &load.order,
        );
        print_script_costs(&costs);
        println!("Same-run ratios (median over runs):\n");
        println!("| ratio | value | target |");
        println!("|---|---:|---|");
        let ps = |m: &Measured| m.per_second;
        let naive_rb = format!(
            "redis-benchmark -c {}: naive hash-of-floats token bucket",
            a.tasks
        );
        let ours_rb = format!("redis-benchmark -c {}: ours token_bucket", a.tasks);
        let pipe = (a.tasks / a.connections).max(1);
        let ours_rb_p = format!(
            "redis-benchmark -c {} -P {pipe}: ours token_bucket",
            a.connections
        );
        let naive_rb_p = format!(
            "redis-benchmark -c {} -P {pipe}: naive hash-of-floats token bucket",
            a.connections
        );
        let naive_client = "naive hash-of-floats token bucket, bare EVALSHA (redis-rs)";
        let row = |label: &str, v: Option<f64>, target: &str| {
            println!("| {label} | {} | {target} |", fmt_opt(v, 2));
        };
        row(
            &format!(
                "ours token bucket script / naive hash-of-floats script, redis-benchmark -c {}",
                a.tasks
            ),
            load.ratio(&ours_rb, &naive_rb, ps),
            ">= 1.3",
        );
        row(
            &format!(
                "ours token bucket script / naive hash-of-floats script, redis-benchmark -c {} -P {pipe}",
                a.connections
            ),
            load.ratio(&ours_rb_p, &naive_rb_p, ps),
            ">= 1.3",
        );
        let su = |m: &Measured| m.server_us;
        row(
            "ours token bucket script / naive hash-of-floats script: server time per call, naive / ours (one connection)",
            costs.ratio("naive hash-of-floats token bucket", "ours token_bucket", su),
            ">= 1.3",
        );
        row(
            "(prototype) one-integer token bucket: server time per call, naive / prototype (one connection)",
            costs.ratio(
                "naive hash-of-floats token bucket",
                "prototype one-integer token bucket",
                su,
            ),
            "(what a one-integer layout would give)",
        );
        let proto_rb = format!(
            "redis-benchmark -c {}: prototype one-integer token bucket",
            a.tasks
        );
        let proto_rb_p = format!(
            "redis-benchmark -c {} -P {pipe}: prototype one-integer token bucket",
            a.connections
        );
        row(
            &format!(
                "(prototype) one-integer token bucket / naive hash-of-floats, redis-benchmark -c {}",
                a.tasks
            ),
            load.ratio(&proto_rb, &naive_rb, ps),
            "(what a one-integer layout would give)",
        );
        row(
            &format!(
                "(prototype) one-integer token bucket / naive hash-of-floats, redis-benchmark -c {} -P {pipe}",
                a.connections
            ),
            load.ratio(&proto_rb_p, &naive_rb_p, ps),
            "(what a one-integer layout would give)",
        );
        row(
            "ours token bucket script / naive script, both bare EVALSHA over redis-rs",
            load.ratio(
                "ours token_bucket script, bare EVALSHA (redis-rs)",
                naive_client,
                ps,
            ),
            ">= 1.3",
        );
        for lib in Lib::all() {
            let ours = format!("ours token_bucket ({}, Limiter::check)", lib.name());
            row(
                &format!(
                    "ours token bucket through Limiter ({}) / naive script (bare, redis-rs)",
                    lib.name()
                ),
                load.ratio(&ours, naive_client, ps),
                "(for reference)",
            );
            // Issue 19: the client's overhead over the raw script call, the
            // same script on the same client and connections (>= 0.95:
            // at most 1.05x the raw call's time per decision).
            row(
                &format!(
                    "ours token bucket through Limiter ({0}) / the same script, bare EVALSHA ({0})",
                    lib.name()
                ),
                load.ratio(
                    &ours,
                    &format!("ours token_bucket script, bare EVALSHA ({})", lib.name()),
                    ps,
                ),
                ">= 0.95",
            );
            row(
                &format!(
                    "ours token bucket through Limiter ({}) / redis-benchmark -c {}, same script",
                    lib.name(),
                    a.tasks
                ),
                load.ratio(&ours, &ours_rb, ps),
                ">= 0.9",
            );
            row(
                &format!(
                    "ours token bucket through Limiter ({}) / redis-benchmark -c {} -P {pipe}, same script",
                    lib.name(),
                    a.connections
                ),
                load.ratio(&ours, &ours_rb_p, ps),
                ">= 0.9",
            );
        }
        println!();
    }
    if a.overhead {
        seq.print_table(
            "### Limiter overhead: one task, one connection (sequential round trips)",
            &seq.order,
        );
        println!("| overhead over a bare EVALSHA of the same script | p50 µs | p99 µs | target |");
        println!("|---|---:|---:|---|");
        for lib in Lib::all() {
            let bare = format!("seq: bare EVALSHA token_bucket ({})", lib.name());
            for (what, name) in [
                (
                    "RedisStore::decide",
                    format!("seq: RedisStore::decide token_bucket ({})", lib.name()),
                ),
                (
                    "Limiter::check",
                    format!("seq: Limiter::check token_bucket ({})", lib.name()),
                ),
            ] {
                let d = |f: fn(&Measured) -> f64| {
                    let (x, y) = (seq.rows.get(&name)?, seq.rows.get(&bare)?);
                    median(x.iter().zip(y).map(|(x, y)| f(x) - f(y)).collect())
                };
                println!(
                    "| {what} ({}) | {} | {} | p99 < 50 |",
                    lib.name(),
                    fmt_opt(d(|m| m.p50_us), 1),
                    fmt_opt(d(|m| m.p99_us), 1)
                );
            }
        }
        println!();
    }
    drop(server);
    if a.memory {
        memory_section(&a).await;
    }
    if a.cluster {
        cluster_section(&a, &q).await;
    }
    let took = started.elapsed().unwrap_or_default();
    println!("(took {:.0} s)", took.as_secs_f64());
}
