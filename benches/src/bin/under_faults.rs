//! The limiter under load and under faults (issue 18): does it keep
//! limiting, by the store or by its in-process fallback, where nothing has
//! failed, and where something has?
//!
//! ```text
//! cargo build --release -p ratelimit-examples --bin server
//! cargo run --release -p ratelimit-benches --features fred --bin under_faults -- --runs 3
//! ```
//!
//! Every section starts its own servers on free loopback ports (through
//! `ratelimit_testkit`) and prints a markdown table, one row per run and
//! client, then the medians over the runs:
//!
//! - `healthy`: one healthy `redis-server`; `--tasks` (4,096) tasks loop on
//!   `Limiter::check` for `--seconds` (5) over `RedisStore` with each client
//!   (redis-rs; fred with `--features fred`), with the library's defaults
//!   (20 ms limiter timeout, fallback at L / 2). Reports the share of
//!   decisions made by the store (`Decision::source`), how often a node's
//!   breaker opened (sampled every 2 ms on a thread of its own from the
//!   store's failure domains; an open breaker stays open for at least its
//!   100 ms probe interval, so none is missed) and decisions per second.
//! - `servers`: two example servers (`examples/src/bin/server.rs`, release
//!   build; `--server-bin`, default: the `server` next to this program)
//!   sharing one `redis-server` (`--redis URL --instances 2`, a known-key
//!   file and policies no caller reaches, so every request is a store round
//!   trip), each under `wrk` with `--connections` (64) connections for
//!   `--seconds`, at once: more connections than cores, all on this
//!   machine, so the servers, Redis and wrk share its CPUs. Reports each
//!   server's decisions by source from its `/metrics`: store, fallback,
//!   fail-open (uncounted).
//! - `cluster`: a local Redis Cluster (3 masters + 3 replicas); `--cluster-tasks`
//!   (256) tasks loop on `Limiter::check` over `ClusterStore` for callers
//!   spread over every master; after 2 s one master is SIGKILLed, and the
//!   load runs until a replica has taken its slots, and 2 s more. Reports,
//!   for the callers whose slots live on the two healthy masters, the share
//!   of their decisions made by the store between the kill and the
//!   promotion, and for the dead master's callers the same share and the
//!   time from the promotion to their first store decision. A fresh cluster
//!   per run and client.
//!
//! Options: `--runs R` (3), `--only healthy|servers|cluster` (repeatable;
//! default all), `--tasks N`, `--seconds S`, `--connections C`,
//! `--cluster-tasks N`, `--server-bin PATH`; for `healthy` only,
//! `--timeout-ms T` (repeatable: one table per timeout; default the
//! library's), `--max-batch B` (`RedisStore::with_max_batch`) and
//! `--stores K` (the tasks spread over K stores, each its own connection
//! and limiter), `--pipeline P` (`RedisStore::with_pipeline`) and
//! `--client redis-rs|fred` (repeatable; default both), and
//! `--server-cpu N`: the `healthy` servers run on CPU `N` alone and this
//! program (the load) on every other CPU (set with `taskset`, from
//! util-linux), as a Redis on a host or a CPU reservation of its own would;
//! by default the server and the load share every CPU.
//!
//! With `UNDER_FAULTS_TIMELINE=1` the `cluster` section also prints to
//! stderr, per run, the healthy masters' callers' decisions per 250 ms and
//! what a call straight at the store for one of them answers every 100 ms
//! (the error text says which breaker is open and why).
//!
//! With `RUST_LOG` set (for example `RUST_LOG=warn`), the library's own
//! log lines go to stderr: the limiter's "store failed" warning (at most
//! once a second) names the error behind the fallback's decisions.
//!
//! The Redis restart (time from the server accepting connections again to
//! the store's first answer) is `dead_redis`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratelimit_benches::clients::{Lib, redis_store};
use ratelimit_cluster::ClusterStore;
use ratelimit_core::{BreakerState, Limiter, Quota, Rate, Source};
use ratelimit_testkit::redis_cluster::RedisCluster;
use ratelimit_testkit::redis_server::RedisServer;

/// The options (see the module docs for what each section measures).
const USAGE: &str = "usage: under_faults [--runs R] [--only healthy|servers|cluster]... \
[--tasks N] [--seconds S] [--connections C] [--cluster-tasks N] [--server-bin PATH] \
[--timeout-ms T]... [--max-batch B] [--stores K] [--pipeline P] [--client redis-rs|fred]... \
[--server-cpu N]";

#[derive(Debug, Clone)]
struct Args {
    runs: usize,
    sections: Vec<String>,
    tasks: usize,
    seconds: f64,
    connections: usize,
    cluster_tasks: usize,
    server_bin: PathBuf,
    /// `RedisStore::with_max_batch` in `healthy` (0: the default).
    max_batch: usize,
    pipeline: usize,
    clients: Vec<String>,
    /// Stores (connections), each with its limiter, the `healthy` tasks
    /// are spread over.
    stores: usize,
    /// The `healthy` limiters' timeouts, in ms: each a table of its own
    /// (default: the library's default only).
    timeouts: Vec<u64>,
    /// The CPU the `healthy` servers run on alone (the load on the others);
    /// `None`: every process on every CPU.
    server_cpu: Option<usize>,
}

fn parse_args() -> Args {
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("server")))
        .unwrap_or_else(|| PathBuf::from("server"));
    let mut a = Args {
        runs: 3,
        sections: Vec::new(),
        tasks: 4_096,
        seconds: 5.0,
        connections: 64,
        cluster_tasks: 256,
        server_bin: sibling,
        max_batch: 0,
        pipeline: 0,
        clients: Vec::new(),
        stores: 1,
        timeouts: Vec::new(),
        server_cpu: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        let number = |v: String| -> f64 { v.parse().unwrap_or_else(|e| panic!("{v}: {e}")) };
        match flag.as_str() {
            "--runs" => a.runs = number(value()) as usize,
            "--only" => a.sections.push(value()),
            "--tasks" => a.tasks = number(value()) as usize,
            "--seconds" => a.seconds = number(value()),
            "--connections" => a.connections = number(value()) as usize,
            "--cluster-tasks" => a.cluster_tasks = number(value()) as usize,
            "--server-bin" => a.server_bin = value().into(),
            "--max-batch" => a.max_batch = number(value()) as usize,
            "--pipeline" => a.pipeline = number(value()) as usize,
            "--client" => a.clients.push(value()),
            "--stores" => a.stores = number(value()) as usize,
            "--timeout-ms" => a.timeouts.push(number(value()) as u64),
            "--server-cpu" => a.server_cpu = Some(number(value()) as usize),
            "--bench" => {}
            other => ratelimit_benches::not_an_option(other, USAGE),
        }
    }
    if a.sections.is_empty() {
        a.sections = vec!["healthy".into(), "servers".into(), "cluster".into()];
    }
    assert!(a.runs > 0 && a.tasks > 0 && a.cluster_tasks > 0);
    a
}

// ---------------------------------------------------------------------------
// Shared
// ---------------------------------------------------------------------------

/// Every call admitted and every caller's state kept: each decision is a
/// store round trip that reads and writes.
fn admit_all() -> Quota {
    Quota::token_bucket(Rate::per_second(1), 1_000_000).expect("valid quota")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| !x.is_nan());
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

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        f64::NAN
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Samples the breakers of a store's failure domains every 2 ms on a
/// thread of its own (not the runtime's, which the load saturates), and
/// counts, per node, how often one was seen leaving the closed state.
struct BreakerWatch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<BTreeMap<String, u32>>>,
}

impl BreakerWatch {
    fn start(states: impl Fn() -> Vec<(String, BreakerState)> + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut opens: BTreeMap<String, u32> = BTreeMap::new();
            let mut open_now: BTreeMap<String, bool> = BTreeMap::new();
            while !flag.load(Ordering::Relaxed) {
                for (name, state) in states() {
                    let open = state != BreakerState::Closed;
                    let was = open_now.insert(name.clone(), open).unwrap_or(false);
                    let count = opens.entry(name).or_default();
                    if open && !was {
                        *count += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            opens
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Openings seen per node.
    fn finish(mut self) -> BTreeMap<String, u32> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    store: u64,
    fallback: u64,
    fail_open: u64,
    other: u64,
}

impl Tally {
    fn add(&mut self, source: Source) {
        match source {
            Source::Store => self.store += 1,
            Source::Fallback => self.fallback += 1,
            Source::FailOpen => self.fail_open += 1,
            _ => self.other += 1,
        }
    }

    fn total(&self) -> u64 {
        self.store + self.fallback + self.fail_open + self.other
    }

    fn merge(&mut self, o: &Tally) {
        self.store += o.store;
        self.fallback += o.fallback;
        self.fail_open += o.fail_open;
        self.other += o.other;
    }
}

async fn cluster_store(lib: Lib, cluster: &RedisCluster) -> ClusterStore {
    match lib {
        Lib::RedisRs => ClusterStore::builder(cluster.urls())
            .prefix(cluster.prefix())
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
                .with_performance_config(|p| p.default_command_timeout = Duration::from_millis(30))
                .with_connection_config(|c| {
                    c.connection_timeout = Duration::from_millis(50);
                    c.internal_command_timeout = Duration::from_secs(1);
                    c.max_command_attempts = 1;
                })
                .set_policy(ReconnectPolicy::new_constant(0, 20))
                .build()
                .expect("fred cluster client");
            client.init().await.expect("fred connects to the cluster");
            let store = ClusterStore::from_fred(client)
                .with_prefix(cluster.prefix())
                .expect("valid prefix");
            store
                .load_scripts()
                .await
                .expect("SCRIPT LOAD on every master");
            store
        }
    }
}

/// The clients to run: those named by `--client`, or every one this build has.
fn libs(a: &Args) -> Vec<Lib> {
    Lib::all()
        .into_iter()
        .filter(|l| a.clients.is_empty() || a.clients.iter().any(|c| c == l.name()))
        .collect()
}

// ---------------------------------------------------------------------------
// healthy: one healthy Redis, thousands of concurrent callers
// ---------------------------------------------------------------------------

struct HealthyRow {
    lib: Lib,
    tally: Tally,
    per_second: f64,
    opens: u32,
    timeouts: u64,
    errors: u64,
    p50_ms: f64,
    p99_ms: f64,
}

async fn healthy_run(
    lib: Lib,
    server: &RedisServer,
    a: &Args,
    timeout: Option<Duration>,
) -> HealthyRow {
    let (tasks, seconds) = (a.tasks, a.seconds);
    let mut limiters = Vec::new();
    let mut watched = Vec::new();
    for _ in 0..a.stores.max(1) {
        let mut store = redis_store(lib, server).await;
        if a.max_batch > 0 {
            store = store.with_max_batch(a.max_batch);
        }
        if a.pipeline > 0 {
            store = store.with_pipeline(a.pipeline);
        }
        watched.push(store.clone());
        let mut builder = Limiter::builder(store)
            .quota(admit_all())
            .namespace("healthy")
            .expect("namespace")
            .instances(2);
        if let Some(t) = timeout {
            builder = builder.timeout(t);
        }
        let limiter = builder.build().expect("limiter");
        for i in 0..100 {
            limiter.check(format!("warm-{i}")).await;
        }
        limiters.push(limiter);
    }
    let watch = BreakerWatch::start(move || {
        watched
            .iter()
            .enumerate()
            .flat_map(|(i, s)| {
                s.engine()
                    .domains()
                    .states()
                    .into_iter()
                    .map(move |(n, st)| (format!("{i}/{n}"), st))
            })
            .collect()
    });
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let callers = 10_000;
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let limiter = limiters[t % limiters.len()].clone();
        handles.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut lat: Vec<u32> = Vec::with_capacity(256);
            let mut i = callers * t / tasks;
            while Instant::now() < deadline {
                let t0 = Instant::now();
                let d = limiter.check(format!("caller-{i}")).await;
                lat.push(u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX));
                tally.add(d.source);
                i = (i + 1) % callers;
            }
            (tally, lat)
        }));
    }
    let mut tally = Tally::default();
    let mut lat = Vec::new();
    for h in handles {
        let (t, l) = h.await.expect("load task");
        tally.merge(&t);
        lat.extend(l);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let opens = watch.finish().values().sum();
    lat.sort_unstable();
    let q = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map_or(f64::NAN, |&us| f64::from(us) / 1e3)
    };
    let (timeouts, errors) = limiters.iter().fold((0, 0), |(t, e), l| {
        let s = l.stats();
        (t + s.timeouts, e + s.errors)
    });
    HealthyRow {
        lib,
        tally,
        per_second: tally.total() as f64 / elapsed,
        opens,
        timeouts,
        errors,
        p50_ms: q(0.5),
        p99_ms: q(0.99),
    }
}

async fn healthy_section(a: &Args) {
    let timeouts: Vec<Option<Duration>> = if a.timeouts.is_empty() {
        vec![None]
    } else {
        a.timeouts
            .iter()
            .map(|&ms| Some(Duration::from_millis(ms)))
            .collect()
    };
    for timeout in timeouts {
        healthy_table(a, timeout).await;
    }
}

async fn healthy_table(a: &Args, timeout: Option<Duration>) {
    let server = RedisServer::start_local();
    if let Some(cpu) = a.server_cpu {
        let pid = server.process().pid().expect("the server runs");
        ratelimit_benches::pin(pid, &cpu.to_string());
    }
    let mut rows = Vec::new();
    for run in 1..=a.runs {
        for lib in libs(a) {
            eprintln!("healthy: run {run} of {}, {}", a.runs, lib.name());
            rows.push(healthy_run(lib, &server, a, timeout).await);
        }
    }
    let setting = match timeout {
        None => "the library's defaults: 20 ms timeout".to_owned(),
        Some(t) => format!("timeout {} ms, other settings the defaults", t.as_millis()),
    };
    println!(
        "### One healthy Redis, {} concurrent `Limiter::check` loops for {} s ({setting}; fallback at L / 2; {} store(s){}{})\n",
        a.tasks,
        a.seconds,
        a.stores.max(1),
        if a.max_batch > 0 {
            format!(", batches of at most {}", a.max_batch)
        } else {
            String::new()
        },
        match a.server_cpu {
            Some(cpu) => format!("; the server alone on CPU {cpu}, the load on the others"),
            None => "; the server and the load on every CPU".to_owned(),
        }
    );
    println!(
        "| client | run | decisions | by the store | fallback | fail-open | breaker openings | timeouts | errors | decisions/s | p50 | p99 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for lib in libs(a) {
        let mine: Vec<&HealthyRow> = rows.iter().filter(|r| r.lib == lib).collect();
        for (i, r) in mine.iter().enumerate() {
            println!(
                "| {} | {} | {} | {:.3} % | {} | {} | {} | {} | {} | {:.0} | {:.1} ms | {:.1} ms |",
                lib.name(),
                i + 1,
                r.tally.total(),
                pct(r.tally.store, r.tally.total()),
                r.tally.fallback,
                r.tally.fail_open,
                r.opens,
                r.timeouts,
                r.errors,
                r.per_second,
                r.p50_ms,
                r.p99_ms
            );
        }
        let m = |f: fn(&HealthyRow) -> f64| median(mine.iter().map(|r| f(r)).collect());
        println!(
            "| **{}** | median | {:.0} | **{:.3} %** | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | **{:.0}** | {:.1} ms | {:.1} ms |",
            lib.name(),
            m(|r| r.tally.total() as f64),
            m(|r| pct(r.tally.store, r.tally.total())),
            m(|r| r.tally.fallback as f64),
            m(|r| r.tally.fail_open as f64),
            m(|r| f64::from(r.opens)),
            m(|r| r.timeouts as f64),
            m(|r| r.errors as f64),
            m(|r| r.per_second),
            m(|r| r.p50_ms),
            m(|r| r.p99_ms)
        );
    }
    println!("\nTarget: >= 99 % by the store, no breaker opening.\n");
}

// ---------------------------------------------------------------------------
// servers: two example servers sharing one Redis under CPU-saturating HTTP load
// ---------------------------------------------------------------------------

const KNOWN_KEYS: usize = 1_000;

/// A running example server, killed on drop.
struct ExampleServer {
    child: Child,
    addr: SocketAddr,
}

impl Drop for ExampleServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

fn start_server(bin: &Path, redis: &str, instances: usize, dir: &Path) -> ExampleServer {
    let addr = free_addr();
    let mut child = Command::new(bin)
        .arg("--addr")
        .arg(addr.to_string())
        .args(["--redis", redis, "--instances", &instances.to_string()])
        .arg("--config")
        .arg(dir.join("policies.toml"))
        .arg("--keys")
        .arg(dir.join("keys.txt"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "starting the example server {}: {e} (build it first: cargo build --release \
                 -p ratelimit-examples --bin server, or pass --server-bin)",
                bin.display()
            )
        });
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    loop {
        let mut line = String::new();
        let n = out.read_line(&mut line).expect("read the server's banner");
        assert!(n > 0, "the example server exited before listening");
        if line.starts_with("listening on") {
            break;
        }
    }
    // Keep reading its stdout so it never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = out.read_to_end(&mut sink);
    });
    ExampleServer { child, addr }
}

/// `GET /metrics`: `ratelimit_decisions_total` of the `api` namespace,
/// summed by source.
fn decisions_by_source(addr: SocketAddr) -> BTreeMap<String, u64> {
    let mut s = TcpStream::connect(addr).expect("connect for /metrics");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("read /metrics");
    let mut out = BTreeMap::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("ratelimit_decisions_total{") else {
            continue;
        };
        if !rest.contains("namespace=\"api\"") {
            continue;
        }
        let source = rest
            .split("source=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap_or("?")
            .to_owned();
        let n: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *out.entry(source).or_default() += n as u64;
    }
    out
}

struct WrkResult {
    requests: u64,
    per_second: f64,
    non_2xx: u64,
    errors: String,
}

fn parse_wrk(out: &str) -> WrkResult {
    let mut r = WrkResult {
        requests: 0,
        per_second: f64::NAN,
        non_2xx: 0,
        errors: String::new(),
    };
    for line in out.lines().map(str::trim) {
        if line.contains("requests in") {
            r.requests = line
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
        } else if let Some(v) = line.strip_prefix("Requests/sec:") {
            r.per_second = v.trim().parse().unwrap_or(f64::NAN);
        } else if let Some(v) = line.strip_prefix("Non-2xx or 3xx responses:") {
            r.non_2xx = v.trim().parse().unwrap_or(0);
        } else if line.starts_with("Socket errors:") {
            r.errors = line.to_owned();
        }
    }
    r
}

struct ServersRow {
    requests: u64,
    per_second: f64,
    non_2xx: u64,
    by_source: BTreeMap<String, u64>,
    wrk_errors: Vec<String>,
}

fn servers_run(a: &Args, redis: &RedisServer, dir: &Path, instances: usize) -> ServersRow {
    let servers: Vec<ExampleServer> = (0..instances)
        .map(|_| start_server(&a.server_bin, &redis.url(), instances, dir))
        .collect();
    let script = dir.join("keys.lua");
    let wrks: Vec<Child> = servers
        .iter()
        .map(|s| {
            Command::new("wrk")
                .args(["-t", "1", "-c", &a.connections.to_string()])
                .args(["-d", &format!("{}s", a.seconds.ceil() as u64)])
                .arg("-s")
                .arg(&script)
                .arg(format!("http://{}/api/hello", s.addr))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run wrk (apt-get install -y wrk)")
        })
        .collect();
    let mut row = ServersRow {
        requests: 0,
        per_second: 0.0,
        non_2xx: 0,
        by_source: BTreeMap::new(),
        wrk_errors: Vec::new(),
    };
    for w in wrks {
        let out = w.wait_with_output().expect("wrk");
        let r = parse_wrk(&String::from_utf8_lossy(&out.stdout));
        row.requests += r.requests;
        row.per_second += r.per_second;
        row.non_2xx += r.non_2xx;
        if !r.errors.is_empty() {
            row.wrk_errors.push(r.errors);
        }
    }
    for s in &servers {
        for (source, n) in decisions_by_source(s.addr) {
            *row.by_source.entry(source).or_default() += n;
        }
    }
    row
}

fn write_server_files(dir: &Path) {
    std::fs::create_dir_all(dir).expect("temporary directory");
    // Quotas no caller reaches in a run: every request is decided by a
    // store round trip that admits it (nothing from the deny cache).
    std::fs::write(
        dir.join("policies.toml"),
        "[[policies]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nrate = \"10000/s\"\nburst = 10000\n\n\
         [[policies]]\nname = \"daily\"\nalgorithm = \"sliding_window\"\nlimit = 100000\nwindow = \"1d\"\n",
    )
    .expect("write policies");
    let keys: String = (0..KNOWN_KEYS).map(|i| format!("load-key-{i}\n")).collect();
    std::fs::write(dir.join("keys.txt"), keys).expect("write keys");
    std::fs::write(
        dir.join("keys.lua"),
        format!(
            "local n = {KNOWN_KEYS}\n\
             request = function()\n  \
               return wrk.format(\"GET\", \"/api/hello\", {{[\"x-api-key\"] = \"load-key-\" .. math.random(0, n - 1)}})\n\
             end\n"
        ),
    )
    .expect("write the wrk script");
}

fn servers_section(a: &Args) {
    let dir = std::env::temp_dir().join(format!("under-faults-{}", std::process::id()));
    write_server_files(&dir);
    let redis = RedisServer::start_local();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut all: Vec<(usize, ServersRow)> = Vec::new();
    for run in 1..=a.runs {
        for instances in [2, 1] {
            eprintln!("servers: run {run} of {}, {instances} server(s)", a.runs);
            all.push((instances, servers_run(a, &redis, &dir, instances)));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "### Example servers sharing one Redis under `wrk` ({} connections per server, {} s, {cores} cores shared by the servers, Redis and wrk)\n",
        a.connections,
        a.seconds.ceil()
    );
    println!(
        "| servers | run | requests (wrk) | decisions (servers) | requests/s | by the store | fallback | fail-open (uncounted) | other | store or fallback | non-2xx |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for instances in [2, 1] {
        let mine: Vec<&ServersRow> = all
            .iter()
            .filter(|(n, _)| *n == instances)
            .map(|(_, r)| r)
            .collect();
        let get = |r: &ServersRow, s: &str| r.by_source.get(s).copied().unwrap_or(0);
        let total = |r: &ServersRow| r.by_source.values().sum::<u64>();
        let other =
            |r: &ServersRow| total(r) - get(r, "store") - get(r, "fallback") - get(r, "fail_open");
        for (i, r) in mine.iter().enumerate() {
            println!(
                "| {instances} | {} | {} | {} | {:.0} | {:.3} % | {} | {} | {} | {:.3} % | {} |",
                i + 1,
                r.requests,
                total(r),
                r.per_second,
                pct(get(r, "store"), total(r)),
                get(r, "fallback"),
                get(r, "fail_open"),
                other(r),
                pct(get(r, "store") + get(r, "fallback"), total(r)),
                r.non_2xx
            );
            for e in &r.wrk_errors {
                println!("|  |  | wrk: {e} |  |  |  |  |  |  |  |  |");
            }
        }
        let m = |f: &dyn Fn(&ServersRow) -> f64| median(mine.iter().map(|r| f(r)).collect());
        println!(
            "| **{instances}** | median | {:.0} | {:.0} | {:.0} | **{:.3} %** | {:.0} | **{:.0}** | {:.0} | **{:.3} %** | {:.0} |",
            m(&|r| r.requests as f64),
            m(&|r| total(r) as f64),
            m(&|r| r.per_second),
            m(&|r| pct(get(r, "store"), total(r))),
            m(&|r| get(r, "fallback") as f64),
            m(&|r| get(r, "fail_open") as f64),
            m(&|r| other(r) as f64),
            m(&|r| pct(get(r, "store") + get(r, "fallback"), total(r))),
            m(&|r| r.non_2xx as f64)
        );
    }
    println!(
        "\nDecisions by source from each server's `/metrics` (`ratelimit_decisions_total`, namespace `api`). \
         Target: >= 99 % by the store or the fallback, none fail-open.\n"
    );
}

// ---------------------------------------------------------------------------
// cluster: one master SIGKILLed under load
// ---------------------------------------------------------------------------

const CLUSTER_CALLERS: usize = 3_000;

struct ClusterRow {
    lib: Lib,
    full_coverage: bool,
    /// Callers on the healthy masters, between the kill and the promotion.
    healthy: Tally,
    /// The dead master's callers, in the same span.
    dead: Tally,
    /// Kill to promotion (as the fixture sees `CLUSTER NODES`).
    failover: Duration,
    /// Promotion to the dead master's callers' first store decision.
    back_after: Option<Duration>,
    /// Breaker openings seen, per node: healthy masters, dead master.
    healthy_opens: u32,
    dead_opens: u32,
}

async fn cluster_run(lib: Lib, tasks: usize, full_coverage: bool) -> ClusterRow {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(RedisCluster::start_local)
            .await
            .expect("cluster"),
    );
    if !full_coverage {
        // What ratelimit-cluster/README.md recommends for a rate limiter:
        // the healthy masters keep serving while one master is down.
        cluster.serve_without_full_coverage();
    }
    let store = cluster_store(lib, &cluster).await;
    let quota = admit_all();
    let masters = cluster.masters();
    let victim = masters[0].port;
    let victim_name = format!("127.0.0.1:{victim}");
    let victim_slot = masters[0].slots[0].0;
    // Which master serves each caller (from the key the limiter sends).
    let callers: Arc<Vec<(String, bool)>> = Arc::new(
        (0..CLUSTER_CALLERS)
            .map(|i| {
                let caller = format!("caller-{i}");
                let key = store.key(format!("fo~{caller}").as_bytes(), &quota);
                let slot = ratelimit_redis::keys::slot(key.as_bytes());
                (caller, masters[0].serves(slot))
            })
            .collect(),
    );
    let watched = store.clone();
    let probe_store = store.clone();
    let limiter = Limiter::builder(store)
        .quota(quota)
        .namespace("fo")
        .expect("namespace")
        .instances(3)
        .build()
        .expect("limiter");
    for (c, _) in callers.iter().take(300) {
        limiter.check(c).await;
    }
    let watch = BreakerWatch::start(move || watched.engine().domains().states());
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (limiter, callers, stop) = (limiter.clone(), callers.clone(), stop.clone());
        handles.push(tokio::spawn(async move {
            // (µs since start, on the dead master, by the store)
            let mut log: Vec<(u64, bool, bool)> = Vec::with_capacity(1 << 12);
            let mut i = t;
            while !stop.load(Ordering::Relaxed) {
                let (caller, on_victim) = &callers[i % callers.len()];
                let d = limiter.check(caller).await;
                let at = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
                log.push((at, *on_victim, d.source == Source::Store));
                i += tasks;
                // As a request handler would between requests: a decision
                // made in process (an open breaker, the fallback) is ready
                // at once, and a loop of them alone would never give the
                // runtime back.
                tokio::task::yield_now().await;
            }
            log
        }));
    }
    if std::env::var_os("UNDER_FAULTS_TIMELINE").is_some() {
        // Every 100 ms, one call straight at the store for a healthy
        // master's caller: what it answers.
        let (store, callers, quota) = (probe_store.clone(), callers.clone(), admit_all());
        tokio::spawn(async move {
            use ratelimit_core::StoreExt;
            let Some((caller, _)) = callers.iter().find(|(_, v)| !v) else {
                return;
            };
            for _ in 0..70 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let r = store
                    .decide_one(format!("fo~{caller}").as_bytes(), &quota, 1)
                    .await;
                eprintln!(
                    "{:>6} ms probe: {}",
                    start.elapsed().as_millis(),
                    match r {
                        Ok(d) => format!("ok {}", d.allowed),
                        Err(e) => format!("{e}"),
                    }
                );
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = cluster.clone();
    let killed_at = start.elapsed();
    tokio::task::spawn_blocking(move || c.kill(victim))
        .await
        .expect("kill");
    let c = cluster.clone();
    let promoted = tokio::task::spawn_blocking(move || {
        c.wait_for_new_master(victim_slot, victim, Duration::from_secs(30))
    })
    .await
    .expect("wait for the failover");
    let promoted_at = start.elapsed();
    assert!(
        promoted.is_some(),
        "no replica took the killed master's slots within 30 s"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let mut log = Vec::new();
    for h in handles {
        log.extend(h.await.expect("load task"));
    }
    let opens = watch.finish();
    if std::env::var_os("UNDER_FAULTS_TIMELINE").is_some() {
        // Per 250 ms: decisions of the healthy masters' callers, and how
        // many by the store.
        let mut buckets: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for &(at, on_victim, by_store) in &log {
            if !on_victim {
                let b = buckets.entry(at / 250_000).or_default();
                b.0 += 1;
                b.1 += u64::from(by_store);
            }
        }
        for (b, (n, st)) in buckets {
            eprintln!("{:>6} ms: {n:>7} decisions, {st:>6} by the store", b * 250);
        }
        eprintln!("killed at {killed_at:?}, promoted at {promoted_at:?}, breakers {opens:?}");
    }
    let (k, p) = (
        u64::try_from(killed_at.as_micros()).unwrap_or(0),
        u64::try_from(promoted_at.as_micros()).unwrap_or(0),
    );
    let mut healthy = Tally::default();
    let mut dead = Tally::default();
    let mut back: Option<u64> = None;
    for &(at, on_victim, by_store) in &log {
        let source = if by_store {
            Source::Store
        } else {
            Source::Fallback
        };
        if (k..=p).contains(&at) {
            if on_victim {
                dead.add(source);
            } else {
                healthy.add(source);
            }
        }
        if on_victim && by_store && at > k {
            back = Some(back.map_or(at, |b| b.min(at)));
        }
    }
    ClusterRow {
        lib,
        full_coverage,
        healthy,
        dead,
        failover: promoted_at - killed_at,
        back_after: back.map(|b| Duration::from_micros(b.saturating_sub(p))),
        healthy_opens: opens
            .iter()
            .filter(|(n, _)| **n != victim_name)
            .map(|(_, c)| c)
            .sum(),
        dead_opens: opens.get(&victim_name).copied().unwrap_or(0),
    }
}

async fn cluster_section(a: &Args) {
    let mut rows = Vec::new();
    for run in 1..=a.runs {
        for full_coverage in [false, true] {
            for lib in Lib::all() {
                eprintln!(
                    "cluster: run {run} of {}, {}, cluster-require-full-coverage {}",
                    a.runs,
                    lib.name(),
                    if full_coverage { "yes" } else { "no" }
                );
                rows.push(cluster_run(lib, a.cluster_tasks, full_coverage).await);
            }
        }
    }
    println!(
        "### Redis Cluster (3 masters + 3 replicas, cluster-node-timeout {} ms): one master SIGKILLed under {} concurrent `Limiter::check` loops\n",
        ratelimit_testkit::redis_cluster::NODE_TIMEOUT.as_millis(),
        a.cluster_tasks
    );
    println!(
        "| client | full coverage | run | kill to promotion | healthy masters' callers: decisions | by the store | their breakers opened | dead master's callers: decisions | by the store | its breaker opened | store again after promotion |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for full_coverage in [false, true] {
        let coverage = if full_coverage { "yes" } else { "no" };
        for lib in Lib::all() {
            let mine: Vec<&ClusterRow> = rows
                .iter()
                .filter(|r| r.lib == lib && r.full_coverage == full_coverage)
                .collect();
            for (i, r) in mine.iter().enumerate() {
                println!(
                    "| {} | {coverage} | {} | {:.0} ms | {} | {:.3} % | {} | {} | {:.1} % | {} | {} |",
                    lib.name(),
                    i + 1,
                    ms(r.failover),
                    r.healthy.total(),
                    pct(r.healthy.store, r.healthy.total()),
                    r.healthy_opens,
                    r.dead.total(),
                    pct(r.dead.store, r.dead.total()),
                    r.dead_opens,
                    r.back_after
                        .map_or("never".to_owned(), |d| format!("{:.0} ms", ms(d)))
                );
            }
            let m = |f: &dyn Fn(&ClusterRow) -> f64| median(mine.iter().map(|r| f(r)).collect());
            println!(
                "| **{}** | {coverage} | median | {:.0} ms | {:.0} | **{:.3} %** | {:.0} | {:.0} | {:.1} % | {:.0} | {:.0} ms |",
                lib.name(),
                m(&|r| ms(r.failover)),
                m(&|r| r.healthy.total() as f64),
                m(&|r| pct(r.healthy.store, r.healthy.total())),
                m(&|r| f64::from(r.healthy_opens)),
                m(&|r| r.dead.total() as f64),
                m(&|r| pct(r.dead.store, r.dead.total())),
                m(&|r| f64::from(r.dead_opens)),
                m(&|r| r.back_after.map_or(f64::NAN, ms))
            );
        }
    }
    println!(
        "\nFull coverage: `cluster-require-full-coverage` (`no`: set on every node, as ratelimit-cluster's \
         README recommends; `yes`: Redis' default, under which every node refuses every key with \
         CLUSTERDOWN from the failure's agreement to the promotion). Target: the healthy masters' callers \
         >= 99 % by the store between the kill and the promotion; the dead master's callers are decided \
         by the fallback (L / 3) meanwhile.\n"
    );
}

fn machine() -> String {
    let version = |cmd: &str| {
        Command::new(cmd)
            .arg("--version")
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_owned()
            })
            .unwrap_or_default()
    };
    format!(
        "{}; {}; {}",
        ratelimit_benches::cpus(),
        version("redis-server"),
        version("wrk")
    )
}

fn main() {
    let a = parse_args();
    // Read before the pinning below narrows the CPUs this process sees.
    let machine = machine();
    if let Some(cpu) = a.server_cpu {
        // Before the runtime's threads start: they inherit the CPUs, and
        // the runtime sizes itself by them.
        ratelimit_benches::pin_self_beside(cpu);
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(run(a, machine));
}

async fn run(a: Args, machine: String) {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    println!("## under_faults: {} run(s)\n", a.runs);
    println!("Machine: {machine}\n");
    let started = Instant::now();
    for section in a.sections.clone() {
        match section.as_str() {
            "healthy" => healthy_section(&a).await,
            "servers" => {
                let a = a.clone();
                tokio::task::spawn_blocking(move || servers_section(&a))
                    .await
                    .expect("servers section");
            }
            "cluster" => cluster_section(&a).await,
            other => panic!("unknown section {other:?}: healthy, servers or cluster"),
        }
    }
    println!("(took {:.0} s)", started.elapsed().as_secs_f64());
}
