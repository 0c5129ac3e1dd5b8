//! Peers side by side on one `redis-server`, in one run.
//!
//! Starts its own server on a free loopback port (with redis-cell's module
//! loaded when `--cell PATH` names the built `libredis_cell.so`; see
//! `benches/peers/README.md`) and drives, at each number of concurrent
//! callers (default 1, 32 and 256 tokio tasks):
//!
//! - `ours (batched)`: `RedisStore::decide` on a token bucket, redis-rs,
//!   decisions waiting for the connection sent together as one batch call;
//! - `ours (single)`: the same store with batching off (`with_max_batch(1)`):
//!   one script call per decision;
//! - `naive script`: the hash-of-floats token bucket (`benches/lua/`) sent as
//!   one `EVALSHA` per decision over the same client (redis-rs
//!   `ConnectionManager`) and the same number of connections;
//! - `redis-cell`: `CL.THROTTLE` (GCRA in a native module), same client;
//! - `Limitador (Redis)`: `AsyncRateLimiter` over `AsyncRedisStorage`
//!   (a fixed window; its own redis-rs 0.27 connection);
//! - `Limitador (cached)`: the same over `CachedRedisStorage` (counters kept
//!   locally and flushed to Redis in batches: approximate by design).
//!
//! For each: decisions per second, the server's CPU time per decision
//! (`INFO cpu`: user + system, over the measured phase: the script, the
//! parsing and the network I/O that a call costs the server), p50 and p99
//! latency of a decision as its caller sees it. Then, per peer, **within
//! its limit?**: two instances (two connections), 256 concurrent callers,
//! one key with a burst of 1,000 and almost no refill (1,000 per hour), and
//! 10,000 attempts: the number admitted, against the limit. And **bytes per
//! caller**: `used_memory` after one decision for each of 10,000 callers on
//! an emptied server, over the callers.
//!
//! ```text
//! benches/peers/run.sh              # builds redis-cell, then runs this
//! cargo run --release --manifest-path benches/peers/Cargo.toml -- \
//!     --cell /path/to/libredis_cell.so --runs 3 --seconds 3
//! ```
//!
//! Options (defaults in parentheses): `--runs R` (3: every contender once
//! per run, runs interleaved; tables give medians), `--seconds S` (3),
//! `--callers 1,32,256`, `--keys K` (10000), `--cell PATH` (none: the
//! redis-cell rows say "not loaded"), `--only NAME,...` (contenders whose
//! name contains one of the words), `--pipeline N` (ours: the most script
//! calls in flight per connection, `RedisStore::with_pipeline`; default the
//! store's).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use limitador::AsyncRateLimiter;
use limitador::limit::{Context, Expression, Limit};
use limitador::storage::AsyncCounterStorage;
use limitador::storage::redis::{AsyncRedisStorage, CachedRedisStorageBuilder};
use ratelimit_core::{Quota, Rate, StoreExt};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::server_process::{ServerOptions, ServerProcess};
use redis::aio::ConnectionManager;

const NAIVE_TOKEN_BUCKET: &str = include_str!("../../lua/naive_token_bucket.lua");
const GENEROUS: Duration = Duration::from_secs(5);

/// `--pipeline N`: ours with `RedisStore::with_pipeline(N)`.
static PIPELINE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// What every contender is asked to enforce: `count` per `period_secs`
/// seconds with a burst of `burst` (a token bucket or GCRA of that rate and
/// capacity; for Limitador, which counts fixed windows, `burst` per window
/// of `burst / rate` seconds).
#[derive(Debug, Clone, Copy)]
struct Spec {
    burst: u64,
    count: u64,
    period_secs: u64,
}

impl Spec {
    /// Throughput: every call admitted and the caller's state kept (a rate
    /// of 1 per second and a burst of 1,000,000: no bucket is full again,
    /// so no key expires during the run).
    const ADMIT: Spec = Spec {
        burst: 1_000_000,
        count: 1,
        period_secs: 1,
    };
    /// Within its limit: burst 1,000, 1,000 per hour.
    const LIMIT: Spec = Spec {
        burst: 1_000,
        count: 1_000,
        period_secs: 3_600,
    };

    fn per_second(self) -> f64 {
        self.count as f64 / self.period_secs as f64
    }

    fn window_secs(self) -> u64 {
        (self.burst * self.period_secs).div_ceil(self.count)
    }
}

type Fut = Pin<Box<dyn Future<Output = Result<bool, String>> + Send>>;
/// One decision for caller number `caller` through instance `instance`:
/// admitted?
type Decide = Arc<dyn Fn(usize, usize) -> Fut + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// No store: a decision that is ready at once. The load generator's
    /// own cost per decision, the floor under every row's client time.
    Floor,
    OursBatched,
    OursSingle,
    Naive,
    Cell,
    Limitador,
    LimitadorCached,
}

impl Peer {
    const ALL: [Peer; 7] = [
        Peer::Floor,
        Peer::OursBatched,
        Peer::OursSingle,
        Peer::Naive,
        Peer::Cell,
        Peer::Limitador,
        Peer::LimitadorCached,
    ];

    fn name(self) -> &'static str {
        match self {
            Peer::Floor => "load generator alone",
            Peer::OursBatched => "ours (batched)",
            Peer::OursSingle => "ours (single)",
            Peer::Naive => "naive script",
            Peer::Cell => "redis-cell CL.THROTTLE",
            Peer::Limitador => "Limitador (Redis)",
            Peer::LimitadorCached => "Limitador (cached)",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Peer::Floor => "floor",
            Peer::OursBatched => "b",
            Peer::OursSingle => "s",
            Peer::Naive => "naive",
            Peer::Cell => "cell",
            Peer::Limitador => "lim",
            Peer::LimitadorCached => "limc",
        }
    }
}

#[derive(Debug, Clone)]
struct Args {
    runs: usize,
    seconds: f64,
    callers: Vec<usize>,
    keys: usize,
    cell: Option<String>,
    only: Vec<String>,
    pin: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        runs: 3,
        seconds: 3.0,
        callers: vec![1, 32, 256],
        keys: 10_000,
        cell: None,
        only: Vec::new(),
        pin: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| panic!("{flag} needs a value (see the crate docs)"))
        };
        match flag.as_str() {
            "--runs" => a.runs = value().parse().expect("--runs: a number"),
            "--seconds" => a.seconds = value().parse().expect("--seconds: a number"),
            "--keys" => a.keys = value().parse().expect("--keys: a number"),
            "--callers" => {
                a.callers = value()
                    .split(',')
                    .map(|c| {
                        c.trim()
                            .parse()
                            .expect("--callers: numbers, comma-separated")
                    })
                    .collect();
            }
            "--cell" => a.cell = Some(value()),
            "--pin" => a.pin = true,
            "--pipeline" => {
                let n = value().parse().expect("--pipeline: a number");
                let _ = PIPELINE.set(n);
            }
            "--only" => {
                a.only = value()
                    .split(',')
                    .map(|s| s.trim().to_lowercase())
                    .collect()
            }
            other => panic!("unknown option {other} (see the crate docs for the options)"),
        }
    }
    a
}

/// The instances (connections) of one contender, each deciding for the
/// callers `0..keys` of its own key space.
async fn contender(
    peer: Peer,
    url: &str,
    spec: Spec,
    keys: usize,
    instances: usize,
    tag: &str,
) -> Decide {
    let ids: Arc<Vec<String>> = Arc::new(
        (0..keys)
            .map(|i| format!("{}{tag}:caller-{i:07}", peer.prefix()))
            .collect(),
    );
    match peer {
        Peer::Floor => Arc::new(|_, _| Box::pin(std::future::ready(Ok(true)))),
        Peer::OursBatched | Peer::OursSingle => {
            let quota = Arc::new(
                Quota::token_bucket(
                    Rate::new(spec.count, Duration::from_secs(spec.period_secs)),
                    spec.burst,
                )
                .expect("valid quota"),
            );
            let mut stores = Vec::new();
            for _ in 0..instances {
                let store = RedisStore::builder(url)
                    .response_timeout(GENEROUS)
                    .connection_timeout(GENEROUS)
                    .timeout(GENEROUS)
                    .max_in_flight(1 << 20)
                    .build()
                    .await
                    .expect("connect the store");
                let store = if peer == Peer::OursSingle {
                    store.with_max_batch(1)
                } else {
                    store
                };
                let store = match PIPELINE.get() {
                    Some(&n) => store.with_pipeline(n),
                    None => store,
                };
                stores.push(Arc::new(store));
            }
            let stores = Arc::new(stores);
            Arc::new(move |i, c| {
                let (s, ids, q) = (stores[i].clone(), ids.clone(), quota.clone());
                Box::pin(async move {
                    s.decide_one(ids[c].as_bytes(), &q, 1)
                        .await
                        .map(|d| d.allowed)
                        .map_err(|e| e.to_string())
                })
            })
        }
        Peer::Naive => {
            let sha = load_script(url, NAIVE_TOKEN_BUCKET).await;
            let args = Arc::new([
                format!("{}", spec.per_second()),
                spec.burst.to_string(),
                "1".to_string(),
            ]);
            let managers = Arc::new(managers(url, instances).await);
            Arc::new(move |i, c| {
                let mut m = managers[i].clone();
                let (sha, ids, args) = (sha.clone(), ids.clone(), args.clone());
                Box::pin(async move {
                    let reply: Vec<i64> = redis::cmd("EVALSHA")
                        .arg(&*sha)
                        .arg(1)
                        .arg(&ids[c])
                        .arg(&args[..])
                        .query_async(&mut m)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(reply.first() == Some(&1))
                })
            })
        }
        Peer::Cell => {
            // CL.THROTTLE key max_burst count period quantity: a capacity of
            // max_burst + 1; the reply's first element is 1 when limited.
            let args = Arc::new([spec.burst - 1, spec.count, spec.period_secs, 1]);
            let managers = Arc::new(managers(url, instances).await);
            Arc::new(move |i, c| {
                let mut m = managers[i].clone();
                let (ids, args) = (ids.clone(), args.clone());
                Box::pin(async move {
                    let reply: Vec<i64> = redis::cmd("CL.THROTTLE")
                        .arg(&ids[c])
                        .arg(&args[..])
                        .query_async(&mut m)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(reply.first() == Some(&0))
                })
            })
        }
        Peer::Limitador | Peer::LimitadorCached => {
            let limit = Limit::new(
                "bench",
                spec.burst,
                spec.window_secs(),
                vec![],
                vec![Expression::parse("caller").expect("a CEL variable")],
            );
            let mut limiters = Vec::new();
            for _ in 0..instances {
                let storage: Box<dyn AsyncCounterStorage> = if peer == Peer::Limitador {
                    Box::new(
                        AsyncRedisStorage::new(url)
                            .await
                            .expect("Limitador connects"),
                    )
                } else {
                    Box::new(
                        CachedRedisStorageBuilder::new(url)
                            .build()
                            .await
                            .expect("Limitador (cached) connects"),
                    )
                };
                let limiter = AsyncRateLimiter::new_with_storage(storage);
                limiter.add_limit(limit.clone());
                limiters.push(Arc::new(limiter));
            }
            let limiters = Arc::new(limiters);
            Arc::new(move |i, c| {
                let (l, ids) = (limiters[i].clone(), ids.clone());
                // The cached storage holds a DashMap shard's write lock
                // across an await (a semaphore's `acquire` in its batcher);
                // when tokio's cooperative budget makes that await yield,
                // its flusher's `len()` blocks a worker thread on the same
                // lock and the runtime deadlocks (seen at one caller).
                // Unconstrained, the await completes at once while permits
                // are left, as the storage expects.
                Box::pin(tokio::task::unconstrained(async move {
                    let ctx =
                        Context::from(HashMap::from([("caller".to_string(), ids[c].clone())]));
                    let result = l
                        .check_rate_limited_and_update(&"bench".into(), &ctx, 1)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(!result.limited)
                }))
            })
        }
    }
}

async fn managers(url: &str, n: usize) -> Vec<ConnectionManager> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let client = redis::Client::open(url).expect("valid URL");
        v.push(ConnectionManager::new(client).await.expect("connect"));
    }
    v
}

async fn load_script(url: &str, lua: &str) -> Arc<str> {
    let mut m = managers(url, 1).await.remove(0);
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(lua)
        .query_async(&mut m)
        .await
        .expect("SCRIPT LOAD");
    Arc::from(sha)
}

#[derive(Debug, Default, Clone, Copy)]
struct Measured {
    per_second: f64,
    server_us: f64,
    client_us: f64,
    /// Decisions per top-level script or module call (`EVALSHA`,
    /// `CL.THROTTLE`), from `INFO commandstats`.
    per_call: f64,
    p50_us: f64,
    p99_us: f64,
    errors: u64,
    allowed: u64,
    decisions: u64,
}

/// `tasks` callers, each deciding in a loop until `until` says stop: caller
/// `t` walks the key space from its own starting point, through instance
/// `t % instances`.
async fn load<S>(decide: &Decide, tasks: usize, instances: usize, keys: usize, until: S) -> Measured
where
    S: Fn() -> bool + Send + Sync + Clone + 'static,
{
    let start = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let (decide, until) = (decide.clone(), until.clone());
        handles.push(tokio::spawn(async move {
            let instance = t % instances;
            let mut key = keys * t / tasks;
            let mut lat: Vec<u32> = Vec::with_capacity(1 << 14);
            let (mut ok, mut err) = (0u64, 0u64);
            while !until() {
                let t0 = Instant::now();
                match decide(instance, key).await {
                    Ok(a) => ok += u64::from(a),
                    Err(_) => err += 1,
                }
                lat.push(u32::try_from(t0.elapsed().as_nanos()).unwrap_or(u32::MAX));
                key += 1;
                if key == keys {
                    key = 0;
                }
            }
            (ok, err, lat)
        }));
    }
    let mut m = Measured::default();
    let mut lat = Vec::new();
    for h in handles {
        let (ok, err, l) = h.await.expect("load task");
        m.allowed += ok;
        m.errors += err;
        lat.extend(l);
    }
    m.decisions = lat.len() as u64;
    m.per_second = m.decisions as f64 / start.elapsed().as_secs_f64();
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
    m
}

fn for_duration(d: Duration) -> impl Fn() -> bool + Send + Sync + Clone + 'static {
    let end = Instant::now() + d;
    move || Instant::now() >= end
}

/// The server's CPU seconds so far (user + system, `INFO cpu`).
fn server_cpu(url: &str) -> f64 {
    let info = info(url, "cpu");
    ["used_cpu_user:", "used_cpu_sys:"]
        .iter()
        .map(|field| {
            info.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("INFO cpu without {field}"))
        })
        .sum()
}

/// `used_memory`: the data and the server's own structures. The scripting
/// engine's heap is not in it (Lua allocates outside Redis' accounting:
/// a script that leaves 16 MB of garbage moves `used_memory_vm_eval` by
/// 16 MB and `used_memory` by the script's text alone), so nothing is
/// subtracted for it; subtracting `used_memory_vm_eval` counted Lua's
/// collector freeing garbage during a measurement as bytes per caller.
fn used_memory(url: &str) -> f64 {
    info(url, "memory")
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO memory: used_memory")
}

fn info(url: &str, section: &str) -> String {
    sync(url, redis::cmd("INFO").arg(section))
}

fn sync<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> T {
    let mut c = redis::Client::open(url)
        .expect("valid URL")
        .get_connection()
        .expect("connect");
    cmd.query(&mut c).expect("command")
}

fn flush(url: &str) {
    let () = sync(url, &redis::cmd("FLUSHALL"));
}

/// Warm-up (connections, script cache), then the measured phase with the
/// server's CPU time read around it.
async fn throughput(url: &str, decide: &Decide, tasks: usize, keys: usize, secs: f64) -> Measured {
    let _ = load(
        decide,
        tasks,
        1,
        keys,
        for_duration(Duration::from_millis(300)),
    )
    .await;
    let () = sync(url, redis::cmd("CONFIG").arg("RESETSTAT"));
    let (cpu0, own0) = (server_cpu(url), own_cpu());
    let mut m = load(
        decide,
        tasks,
        1,
        keys,
        for_duration(Duration::from_secs_f64(secs)),
    )
    .await;
    let (cpu, own) = (server_cpu(url) - cpu0, own_cpu() - own0);
    m.server_us = cpu * 1e6 / m.decisions as f64;
    m.client_us = own * 1e6 / m.decisions as f64;
    let stats = info(url, "commandstats");
    let calls: f64 = ["cmdstat_evalsha:", "cmdstat_cl.throttle:"]
        .iter()
        .filter_map(|name| stats.lines().find_map(|l| l.strip_prefix(name)))
        .filter_map(|l| {
            l.split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .sum();
    m.per_call = m.decisions as f64 / calls;
    m
}

/// This process's CPU seconds so far (user + system, every thread:
/// `/proc/self/stat`, in clock ticks of 10 ms).
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')').expect("stat's command name") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime: fields 14 and 15 of the line, 12 and 13 after ')'.
    let ticks: f64 =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    ticks / 100.0
}

/// Two instances, 256 callers, one key, 10,000 attempts: how many admitted.
async fn within_limit(url: &str, peer: Peer) -> Measured {
    flush(url);
    let decide = contender(peer, url, Spec::LIMIT, 1, 2, "limit").await;
    let attempts = Arc::new(AtomicU64::new(0));
    let counter = attempts.clone();
    let m = load(&decide, 256, 2, 1, move || {
        counter.fetch_add(1, Ordering::Relaxed) >= 10_000
    })
    .await;
    if peer == Peer::LimitadorCached {
        // Its counters reach Redis at the next flush (every second).
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    }
    m
}

/// `used_memory` per caller after one decision for each of `keys` callers.
async fn bytes_per_caller(url: &str, peer: Peer, keys: usize) -> f64 {
    flush(url);
    let decide = contender(peer, url, Spec::LIMIT, keys, 1, "mem").await;
    let before = used_memory(url);
    let next = Arc::new(AtomicU64::new(0));
    let n = next.clone();
    let decided = Arc::new(AtomicU64::new(0));
    // 32 callers, each taking the next caller id until every id is used.
    let mut handles = Vec::new();
    for _ in 0..32 {
        let (decide, n, decided) = (decide.clone(), n.clone(), decided.clone());
        handles.push(tokio::spawn(async move {
            loop {
                let i = n.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= keys {
                    break;
                }
                decide(0, i).await.expect("a decision");
                decided.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for h in handles {
        h.await.expect("memory task");
    }
    assert_eq!(decided.load(Ordering::Relaxed), keys as u64);
    if peer == Peer::LimitadorCached {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    }
    (used_memory(url) - before) / keys as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores ({cpu})")
}

/// Sets the CPU affinity of every thread of process `pid` (`taskset`).
fn pin(pid: u32, cpu: usize) {
    let status = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", &cpu.to_string(), &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("taskset (util-linux) for --pin");
    assert!(status.success(), "taskset -p -c {cpu} {pid} failed");
}

fn main() {
    let a = parse_args();
    if a.pin {
        // Before the runtime exists: it then sizes itself to one core.
        pin(std::process::id(), 1);
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(run(a));
}

/// Runs one phase of one contender on a runtime of its own, shut down when
/// the phase ends: what the contender spawned stops with it. (Limitador's
/// cached storage flushes its counters from a task of its own, which on a
/// shared runtime kept writing to the server through the contenders after
/// it: their throughput and their bytes per caller.)
async fn isolated<T, F, Fut>(phase: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
{
    tokio::task::spawn_blocking(move || {
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            let out = rt.block_on(phase());
            rt.shutdown_timeout(Duration::from_secs(1));
            out
        })
        .join()
        .expect("a contender's phase")
    })
    .await
    .expect("a contender's phase")
}

async fn run(a: Args) {
    let mut options = ServerOptions::new().args(["--save", "", "--appendonly", "no"]);
    if let Some(cell) = &a.cell {
        options = options.arg("--loadmodule").arg(cell.clone());
    }
    let server = ServerProcess::start(&options);
    if a.pin {
        pin(server.pid().expect("the server's pid"), 0);
    }
    let url = server.url();
    let version: String = info(&url, "server")
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_string();
    let peers: Vec<Peer> = Peer::ALL
        .into_iter()
        .filter(|p| a.cell.is_some() || *p != Peer::Cell)
        .filter(|p| a.only.is_empty() || a.only.iter().any(|w| p.name().to_lowercase().contains(w)))
        .collect();
    println!(
        "peers on one redis-server {version} (loopback), {}{}; {} runs of {} s, {} callers' keys",
        machine(),
        if a.pin {
            ": the server pinned to CPU 0, this process (one tokio worker) to CPU 1"
        } else {
            ": server and load generator sharing both"
        },
        a.runs,
        a.seconds,
        a.keys
    );
    if a.cell.is_none() {
        println!("redis-cell: not loaded (pass --cell PATH to libredis_cell.so; see run.sh)");
    }

    // Throughput: runs interleaved, medians per (callers, peer).
    let mut book: HashMap<(usize, &'static str), Vec<Measured>> = HashMap::new();
    for run in 0..a.runs {
        for &tasks in &a.callers {
            for &peer in &peers {
                flush(&url);
                let (url, keys, seconds) = (url.clone(), a.keys, a.seconds);
                let m = isolated(move || async move {
                    let decide = contender(peer, &url, Spec::ADMIT, keys, 1, "").await;
                    throughput(&url, &decide, tasks, keys, seconds).await
                })
                .await;
                eprintln!(
                    "run {run} callers {tasks:>3} {:<24} {:>9.0}/s server {:>6.2} µs client {:>6.2} µs per call {:>5.1} p50 {:>8.1} µs p99 {:>8.1} µs errors {}",
                    peer.name(),
                    m.per_second,
                    m.server_us,
                    m.client_us,
                    m.per_call,
                    m.p50_us,
                    m.p99_us,
                    m.errors
                );
                book.entry((tasks, peer.name())).or_default().push(m);
            }
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n| callers | contender | decisions/s | × naive | server µs/decision | × naive | client µs/decision | decisions per call | p50 µs | p99 µs | errors |"
    );
    let _ = writeln!(
        out,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for &tasks in &a.callers {
        let get = |name: &str, f: fn(&Measured) -> f64| {
            median(book[&(tasks, name)].iter().map(f).collect())
        };
        let naive = peers.contains(&Peer::Naive);
        for &peer in &peers {
            let n = peer.name();
            let rate = get(n, |m| m.per_second);
            let us = get(n, |m| m.server_us);
            let (rate_x, us_x) = if naive {
                // Ratios of the same run, then their median.
                let per_run = |f: fn(&Measured) -> f64| {
                    median(
                        book[&(tasks, n)]
                            .iter()
                            .zip(&book[&(tasks, Peer::Naive.name())])
                            .map(|(m, b)| f(m) / f(b))
                            .collect(),
                    )
                };
                (per_run(|m| m.per_second), per_run(|m| m.server_us))
            } else {
                (f64::NAN, f64::NAN)
            };
            let errors: u64 = book[&(tasks, n)].iter().map(|m| m.errors).sum();
            let _ = writeln!(
                out,
                "| {tasks} | {n} | {rate:.0} | {rate_x:.2} | {us:.2} | {us_x:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {errors} |",
                get(n, |m| m.client_us),
                get(n, |m| m.per_call),
                get(n, |m| m.p50_us),
                get(n, |m| m.p99_us),
            );
        }
    }

    let _ = writeln!(
        out,
        "\n| contender | admitted of 10,000 attempts (limit 1,000; 2 instances, 256 callers, one key) | within its limit? | bytes per caller |"
    );
    let _ = writeln!(out, "|---|---:|---|---:|");
    for &peer in peers.iter().filter(|p| **p != Peer::Floor) {
        let m = isolated({
            let url = url.clone();
            move || async move { within_limit(&url, peer).await }
        })
        .await;
        let bytes = isolated({
            let (url, keys) = (url.clone(), a.keys);
            move || async move { bytes_per_caller(&url, peer, keys).await }
        })
        .await;
        // One token may refill during the run (1,000 per hour).
        let verdict = if m.allowed <= Spec::LIMIT.burst + 1 {
            "yes".to_string()
        } else {
            format!("no: {} over", m.allowed - Spec::LIMIT.burst)
        };
        let errors = if m.errors > 0 {
            format!(" ({} errors)", m.errors)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "| {} | {}{errors} | {verdict} | {bytes:.0} |",
            peer.name(),
            m.allowed
        );
    }
    println!("{out}");
}
