//! The service under gRPC load, beside its peers: `ratelimit-server`,
//! `throttlecrab-server` and Limitador's server, the same requests from one
//! load generator on the same machine, in alternating rounds.
//!
//! ```sh
//! cargo bench -p ratelimit-server --bench loadgen
//! ```
//!
//! The peers are run when their binaries are named (each is built apart
//! from this workspace; their builds need `protoc`:
//! `apt-get install protobuf-compiler`; a build tried before `protoc` was
//! installed leaves generated code without the gRPC service behind: delete
//! its target directory before building again):
//!
//! ```sh
//! # throttlecrab-server, from crates.io:
//! CARGO_TARGET_DIR=target/throttlecrab cargo install throttlecrab-server --root target/throttlecrab
//! # Limitador's server, from its public repository (Kuadrant/limitador),
//! # built in its own checkout (its RocksDB storage also needs libclang-dev):
//! cargo build --release -p limitador-server
//!
//! THROTTLECRAB_SERVER=target/throttlecrab/bin/throttlecrab-server \
//! LIMITADOR_SERVER=/path/to/limitador/target/release/limitador-server \
//!     cargo bench -p ratelimit-server --bench loadgen
//! ```
//!
//! # Targets
//!
//! - `ratelimit-server` on the local store, on one Redis node and on a
//!   local 3-master Redis Cluster (`--no-redis`, `--no-cluster` leave them
//!   out), over Redis with `--timeout 1s` so that every decision is the
//!   store's (at the default 20 ms the generator's lag on a shared core
//!   turns some into lease answers);
//! - with `--baseline BIN`, another build of `ratelimit-server` on the
//!   local store, beside this one's in every round (an A/B of two builds);
//! - `throttlecrab-server` (its own gRPC `Throttle`, GCRA, in process);
//! - Limitador's server with its `memory` and `redis` storages, over the
//!   same Envoy `ShouldRateLimit` requests as ours;
//! - the floor: `Limiter::check` on the local store and the service's
//!   `should_rate_limit` in process (no network).
//!
//! Every server gets the same limits: 100 per minute per key (a fixed
//! window for ours and Limitador, envoyproxy/ratelimit's semantics; GCRA
//! 100 per minute, burst 100, for throttlecrab-server), one of `--keys`
//! keys (default 100,000) drawn at random per request, so that
//! nearly every request is admitted on every server.
//!
//! # Loads
//!
//! - **closed loop** at each of `--in-flight` (default `16,256`) requests
//!   in flight, one descriptor per request, and at the first of them with
//!   three descriptors per request (the Envoy RLS servers only);
//! - **open loop** at each of `--open` (default `0.5,0.8`) times the target's
//!   capacity, the capacity being its closed-loop rate at the largest
//!   in-flight count in the same round: requests are sent at their
//!   scheduled times whether or not earlier ones have been answered, and
//!   each one's latency runs from its scheduled time (no coordinated
//!   omission; the generator's timer adds up to a millisecond at low
//!   rates).
//!
//! With two CPUs or more (and `taskset`), the servers run on the last CPU
//! and the generator, with the Redis servers it starts, on the others
//! (`--no-pin` leaves them to the scheduler): on a 2-core machine the
//! generator has one core to the server's one; its own lag (the
//! `generator lag p99` column) says how much of the open loop's tail
//! latency is the generator's.
//!
//! Requests go over `--connections` HTTP/2 connections (default 4), as
//! Envoy multiplexes its calls to a rate-limit cluster, framed as gRPC by
//! the generator itself on the `h2` crate (a tonic client's per-call
//! buffer task and body encoder cost the generator more than a server
//! spends on the call), each with `grpc-timeout: 1S` as Envoy sends its
//! filter's timeout with every call. Each load runs
//! `--duration` seconds (default 4) after a one-second warm-up;
//! `--rounds` (default 3) rounds alternate the targets.
//!
//! # Output
//!
//! First, with the servers pinned, the machine's own stalls: before any
//! load, a probe process spins on each CPU at once for 5 s, then on the
//! servers' CPU alone, reading the clock; every gap over 0.5 ms in which
//! it did not run (the hypervisor or the kernel ran something else) is a
//! stall. On a virtual machine whose CPUs are shared with other guests,
//! such stalls (seen here when both of two CPUs were busy: 0.05 to 4 % of
//! the time, the longest 9 to 31 ms; with one busy, mostly none) set a
//! floor under every p99 measured, which no server can go below.
//!
//! Then a Markdown table of the medians over the rounds: requests per second,
//! p50, p99 and p99.9 of the response time, the server process's CPU time
//! per request and, for Redis backends, the Redis servers' CPU time per
//! request (both from `/proc/<pid>/stat` over the measured window), and the
//! share admitted. Then the ratios the service is held to, and every
//! round's rows.
//!
//! With `LOADGEN_TRACE` set, each open-loop load also prints (stderr) the
//! UNIX time it starts at and every 50 ms of its schedule in which some
//! answer took over 5 ms: per connection, the slowest answer, how late
//! the generator sent its requests, and how many were answered. A slow
//! spell on every connection at once is the server's or the machine's, on
//! one connection its transport's; one whose requests were sent late is
//! (at least partly) the generator's. The start time lines a spell up
//! with a `perf` recording of the server (`perf record -k mono`, after
//! subtracting the difference between the UNIX and monotonic clocks).

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use rand::Rng;
use ratelimit_core::{Limiter, Quota, Rate};
use ratelimit_local::LocalStore;
use ratelimit_server::{Config, RateLimitService, Settings};
use ratelimit_testkit::redis_cluster::RedisCluster;
use ratelimit_testkit::redis_server::RedisServer;

/// Our configuration: domain `one` (descriptor `a`) and domain `three`
/// (descriptors `a`, `b`, `c`), 100 per minute each.
const OURS_ONE: &str = "domain: one
descriptors:
  - key: a
    rate_limit:
      unit: minute
      requests_per_unit: 100
";

/// See [`OURS_ONE`].
const OURS_THREE: &str = "domain: three
descriptors:
  - key: a
    rate_limit:
      unit: minute
      requests_per_unit: 100
  - key: b
    rate_limit:
      unit: minute
      requests_per_unit: 100
  - key: c
    rate_limit:
      unit: minute
      requests_per_unit: 100
";

/// The same limits for Limitador: namespace `one` counts per value of the
/// first descriptor's `a`; namespace `three` per value of `a`, `b` and `c`
/// of the first, second and third descriptors.
const LIMITADOR_LIMITS: &str = "---
- namespace: one
  max_value: 100
  seconds: 60
  conditions: []
  variables:
    - descriptors[0].a
- namespace: three
  max_value: 100
  seconds: 60
  conditions: []
  variables:
    - descriptors[0].a
- namespace: three
  max_value: 100
  seconds: 60
  conditions: []
  variables:
    - descriptors[1].b
- namespace: three
  max_value: 100
  seconds: 60
  conditions: []
  variables:
    - descriptors[2].c
";

/// throttlecrab's `ThrottleRequest` (its proto: `throttlecrab.RateLimiter`).
#[derive(Clone, PartialEq, prost::Message)]
struct ThrottleRequest {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(int32, tag = "2")]
    max_burst: i32,
    #[prost(int32, tag = "3")]
    count_per_period: i32,
    #[prost(int32, tag = "4")]
    period: i32,
    #[prost(int32, tag = "5")]
    quantity: i32,
}

/// throttlecrab's `ThrottleResponse`.
#[derive(Clone, PartialEq, prost::Message)]
struct ThrottleResponse {
    #[prost(bool, tag = "1")]
    allowed: bool,
    #[prost(int32, tag = "2")]
    limit: i32,
    #[prost(int32, tag = "3")]
    remaining: i32,
    #[prost(int32, tag = "4")]
    retry_after: i32,
    #[prost(int32, tag = "5")]
    reset_after: i32,
}

#[derive(Debug, Clone)]
struct Opts {
    duration: Duration,
    in_flight: Vec<usize>,
    open: Vec<f64>,
    connections: usize,
    keys: u32,
    rounds: usize,
    throttlecrab: Option<PathBuf>,
    limitador: Option<PathBuf>,
    /// Another build of `ratelimit-server`, run on the local store beside
    /// this one's (an A/B of two builds in one run).
    baseline: Option<PathBuf>,
    redis: bool,
    cluster: bool,
    /// The CPUs of the servers and of the generator (with Redis), when
    /// pinned.
    pin: Option<(String, String)>,
}

fn usage(msg: &str) -> ! {
    eprintln!(
        "loadgen: {msg}\nusage: loadgen [--duration S] [--in-flight N,N] [--open F,F] \
         [--connections N] [--keys N] [--rounds N] [--throttlecrab BIN] [--limitador BIN] \
         [--baseline BIN] [--no-redis] [--no-cluster] [--no-pin]"
    );
    std::process::exit(2)
}

fn list<T: std::str::FromStr>(flag: &str, v: &str) -> Vec<T> {
    v.split(',')
        .map(|x| {
            x.trim()
                .parse()
                .unwrap_or_else(|_| usage(&format!("{flag}: cannot read {x:?}")))
        })
        .collect()
}

fn opts() -> Opts {
    let mut o = Opts {
        duration: Duration::from_secs(4),
        in_flight: vec![16, 256],
        open: vec![0.5, 0.8],
        connections: 4,
        keys: 100_000,
        rounds: 3,
        throttlecrab: std::env::var_os("THROTTLECRAB_SERVER").map(PathBuf::from),
        limitador: std::env::var_os("LIMITADOR_SERVER").map(PathBuf::from),
        baseline: None,
        redis: true,
        cluster: true,
        pin: pinning(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--duration" => {
                let s: f64 = list("--duration", &value())[0];
                if s.is_nan() || s <= 0.0 {
                    usage("--duration must be above 0");
                }
                o.duration = Duration::from_secs_f64(s);
            }
            "--in-flight" => o.in_flight = list("--in-flight", &value()),
            "--open" => o.open = list("--open", &value()),
            "--connections" => o.connections = list("--connections", &value())[0],
            "--keys" => o.keys = list("--keys", &value())[0],
            "--rounds" => o.rounds = list("--rounds", &value())[0],
            "--throttlecrab" => o.throttlecrab = Some(PathBuf::from(value())),
            "--limitador" => o.limitador = Some(PathBuf::from(value())),
            "--baseline" => o.baseline = Some(PathBuf::from(value())),
            "--no-redis" => o.redis = false,
            "--no-cluster" => o.cluster = false,
            "--no-pin" => o.pin = None,
            // cargo bench passes --bench.
            "--bench" => {}
            other => usage(&format!("unknown option {other:?}")),
        }
    }
    o.throttlecrab = o.throttlecrab.map(|p| binary(&p));
    o.limitador = o.limitador.map(|p| binary(&p));
    o.baseline = o.baseline.map(|p| binary(&p));
    if o.in_flight.is_empty() || o.in_flight.contains(&0) {
        usage("--in-flight needs counts above 0");
    }
    if o.open.iter().any(|f| f.is_nan() || *f <= 0.0) {
        usage("--open needs fractions above 0");
    }
    if o.connections == 0 || o.keys == 0 || o.rounds == 0 {
        usage("--connections, --keys and --rounds must be above 0");
    }
    o
}

/// A peer's binary: as given, or relative to the workspace (`cargo bench`
/// runs this program in the package's directory).
fn binary(p: &Path) -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    [p.to_path_buf(), workspace.join(p)]
        .into_iter()
        .find(|c| c.is_file())
        .and_then(|c| c.canonicalize().ok())
        .unwrap_or_else(|| usage(&format!("no such binary: {}", p.display())))
}

/// The servers on the last CPU, the generator (and the Redis servers it
/// starts) on the others, when there are two or more and `taskset` is
/// there.
fn pinning() -> Option<(String, String)> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let taskset = Command::new("taskset")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if n < 2 || !taskset {
        return None;
    }
    let others = if n == 2 {
        "0".to_owned()
    } else {
        format!("0-{}", n - 2)
    };
    Some(((n - 1).to_string(), others))
}

/// Pins this process (and so the threads and processes it starts after)
/// to `cpus`.
fn pin_self(cpus: &str) {
    let ok = Command::new("taskset")
        .args(["-p", "-c", cpus, &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "taskset -p -c {cpus} failed");
}

/// A call: (connection, key) to whether the request was admitted; `None`
/// when the call failed.
type Call =
    Arc<dyn Fn(usize, u32) -> Pin<Box<dyn Future<Output = Option<bool>> + Send>> + Send + Sync>;

/// How the load is offered.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Load {
    /// `n` requests in flight, each sent when the one before it is
    /// answered.
    Closed(usize),
    /// Requests sent at `rate` per second (`fraction` of the capacity).
    Open { fraction: f64, rate: f64 },
}

impl Load {
    fn label(&self) -> String {
        match *self {
            Load::Closed(n) => format!("closed, {n} in flight"),
            Load::Open { fraction, .. } => format!("open, {fraction} × capacity"),
        }
    }
}

/// What one load measured.
#[derive(Debug, Clone)]
struct Measured {
    target: String,
    load: String,
    descriptors: usize,
    /// Answered requests sent within the measured window.
    requests: u64,
    admitted: u64,
    failed: u64,
    window: Duration,
    /// Open loop: the rate asked for, and the requests the generator could
    /// not send on time (over its bound on outstanding requests).
    offered: Option<f64>,
    unsent: u64,
    latencies_us: Vec<u32>,
    /// Open loop: how late the generator sent each request after its
    /// scheduled time, sorted (a generator that lags measures itself).
    lag_us: Vec<u32>,
    server_cpu: Option<Duration>,
    store_cpu: Option<Duration>,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.requests as f64 / self.window.as_secs_f64()
    }

    fn quantile(&self, p: f64) -> f64 {
        quantile(&self.latencies_us, p)
    }

    /// The p99 of the generator's lag behind schedule (open loop only).
    fn lag_p99(&self) -> f64 {
        quantile(&self.lag_us, 0.99)
    }

    fn per_request(&self, cpu: Option<Duration>) -> Option<f64> {
        cpu.map(|c| c.as_secs_f64() * 1e6 / self.requests.max(1) as f64)
    }

    fn admitted_share(&self) -> f64 {
        100.0 * self.admitted as f64 / self.requests.max(1) as f64
    }
}

/// The `p` quantile of sorted `v`; NaN when empty.
fn quantile(v: &[u32], p: f64) -> f64 {
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    let i = ((n as f64 * p).ceil() as usize).clamp(1, n) - 1;
    f64::from(v[i])
}

/// The processes whose CPU time a load is charged with.
#[derive(Debug, Clone, Default)]
struct Pids {
    server: Option<u32>,
    store: Vec<u32>,
}

/// The CPU time (user + system) of a process, from `/proc/<pid>/stat`.
fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on Linux.
    Some(Duration::from_millis(ticks * 10))
}

fn cpu_of(pids: &[u32]) -> Option<Duration> {
    if pids.is_empty() {
        return None;
    }
    pids.iter().map(|&p| cpu_time(p)).sum()
}

/// Samples the processes' CPU times.
#[derive(Debug, Clone)]
struct CpuMark {
    server: Option<Duration>,
    store: Option<Duration>,
}

impl CpuMark {
    fn take(p: &Pids) -> Self {
        Self {
            server: p.server.and_then(cpu_time),
            store: cpu_of(&p.store),
        }
    }

    fn since(&self, before: &Self) -> (Option<Duration>, Option<Duration>) {
        let d =
            |a: Option<Duration>, b: Option<Duration>| a.zip(b).map(|(a, b)| a.saturating_sub(b));
        (d(self.server, before.server), d(self.store, before.store))
    }
}

/// Runs `load` against `call` for a one-second warm-up and then
/// `o.duration`, charging the measured window's CPU time to `pids`.
async fn drive(o: &Opts, keys: u32, load: Load, call: Call, pids: &Pids) -> Measured {
    let warm_until = Instant::now() + Duration::from_secs(1);
    let stop_at = warm_until + o.duration;
    let admitted = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let latencies: Arc<Mutex<Vec<u32>>> = Arc::new(Mutex::new(Vec::with_capacity(1 << 20)));
    let unsent = Arc::new(AtomicU64::new(0));
    let lags: Arc<Mutex<Vec<u32>>> = Arc::new(Mutex::new(Vec::new()));
    // LOADGEN_TRACE: each connection's answers, to print the open loop's
    // slow spells by connection.
    let traced: Arc<Mutex<Vec<(usize, Answers)>>> = Arc::default();
    let record = {
        let admitted = admitted.clone();
        let failed = failed.clone();
        move |lat: &mut Vec<u32>, sent: Instant, done: Instant, ok: Option<bool>| {
            if sent < warm_until || done > stop_at {
                return;
            }
            match ok {
                Some(a) => {
                    lat.push(
                        u32::try_from(done.duration_since(sent).as_micros()).unwrap_or(u32::MAX),
                    );
                    if a {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
                None => {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    };
    let mut tasks = Vec::new();
    match load {
        Load::Closed(n) => {
            for w in 0..n {
                let call = call.clone();
                let latencies = latencies.clone();
                let record = record.clone();
                let conn = w % o.connections;
                tasks.push(tokio::spawn(async move {
                    let mut lat = Vec::with_capacity(1 << 14);
                    loop {
                        let key = rand::rng().random_range(0..keys);
                        let sent = Instant::now();
                        let ok = call(conn, key).await;
                        let done = Instant::now();
                        record(&mut lat, sent, done, ok);
                        if done >= stop_at {
                            break;
                        }
                    }
                    latencies.lock().expect("latencies").extend(lat);
                }));
            }
        }
        Load::Open { rate, .. } => {
            // One dispatcher per connection, each sending its share of the
            // rate at scheduled times and polling its outstanding requests
            // itself (no task per request); a request's latency runs from
            // its scheduled time.
            let conns = o.connections;
            let per = rate / conns as f64;
            let trace = tracing().then(|| traced.clone());
            let start = Instant::now();
            if trace.is_some() {
                let unix = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                eprintln!("open loop starts at {:.6} (UNIX time)", unix.as_secs_f64());
            }
            for conn in 0..conns {
                let call = call.clone();
                let latencies = latencies.clone();
                let record = record.clone();
                let unsent = unsent.clone();
                let lags = lags.clone();
                let trace = trace.clone();
                tasks.push(tokio::spawn(async move {
                    let mut lag = Vec::with_capacity(1 << 16);
                    let gap = Duration::from_secs_f64(1.0 / per);
                    // The dispatchers are staggered over one gap.
                    let mut next = start + gap.mul_f64(conn as f64 / conns as f64);
                    let mut pending = FuturesUnordered::new();
                    let mut lat = Vec::with_capacity(1 << 16);
                    let mut slow: Answers = Vec::new();
                    let bound = 20_000usize;
                    loop {
                        // Send every request whose time has come.
                        let now = Instant::now();
                        while next <= now && next < stop_at {
                            let sent = next;
                            next += gap;
                            if pending.len() >= bound {
                                if sent >= warm_until {
                                    unsent.fetch_add(1, Ordering::Relaxed);
                                }
                                continue;
                            }
                            let key = rand::rng().random_range(0..keys);
                            let fut = call(conn, key);
                            if sent >= warm_until {
                                lag.push(
                                    u32::try_from(now.duration_since(sent).as_micros())
                                        .unwrap_or(u32::MAX),
                                );
                            }
                            pending.push(async move { (sent, now, fut.await, Instant::now()) });
                        }
                        if next >= stop_at && pending.is_empty() {
                            break;
                        }
                        let wake = if next < stop_at {
                            next
                        } else {
                            stop_at + Duration::from_secs(2)
                        };
                        tokio::select! {
                            biased;
                            Some((sent, went, ok, done)) = pending.next(), if !pending.is_empty() => {
                                if trace.is_some() {
                                    slow.push((
                                        sent.duration_since(start),
                                        went.duration_since(sent),
                                        done.duration_since(sent),
                                    ));
                                }
                                record(&mut lat, sent, done, ok);
                            }
                            () = tokio::time::sleep_until(wake.into()) => {
                                if next >= stop_at {
                                    // Answers later than two seconds after
                                    // the window are left.
                                    break;
                                }
                            }
                        }
                    }
                    lags.lock().expect("lags").extend(lag);
                    latencies.lock().expect("latencies").extend(lat);
                    if let Some(trace) = trace {
                        trace.lock().expect("trace").push((conn, slow));
                    }
                }));
            }
        }
    }
    tokio::time::sleep_until(warm_until.into()).await;
    let before = CpuMark::take(pids);
    tokio::time::sleep_until(stop_at.into()).await;
    let after = CpuMark::take(pids);
    for t in tasks {
        t.await.expect("load task");
    }
    let (server_cpu, store_cpu) = after.since(&before);
    print_slow_spells(&traced.lock().expect("trace"));
    let mut latencies_us = std::mem::take(&mut *latencies.lock().expect("latencies"));
    latencies_us.sort_unstable();
    Measured {
        target: String::new(),
        load: load.label(),
        descriptors: 1,
        requests: latencies_us.len() as u64,
        admitted: admitted.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        window: o.duration,
        offered: match load {
            Load::Open { rate, .. } => Some(rate),
            Load::Closed(_) => None,
        },
        unsent: unsent.load(Ordering::Relaxed),
        latencies_us,
        lag_us: {
            let mut l = std::mem::take(&mut *lags.lock().expect("lags"));
            l.sort_unstable();
            l
        },
        server_cpu,
        store_cpu,
    }
}

/// The internal option that makes this program a stall probe
/// (`--spin SECONDS`): see [`machine_stalls`].
const SPIN: &str = "--spin";
/// How long the stall probe spins.
const STALL_PROBE: Duration = Duration::from_secs(5);
/// A gap in a spinning thread's run longer than this is a stall.
const STALL: Duration = Duration::from_micros(500);

/// What a spinning thread lost on one CPU.
struct Stalls {
    cpu: String,
    /// The share of the time lost in stalls, in percent.
    lost_pct: f64,
    /// Stalls over 2 ms.
    over_2ms: u64,
    longest: Duration,
}

impl std::fmt::Display for Stalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CPU {}: {:.2} % of the time lost in stalls, {} over 2 ms, the longest {:.1} ms",
            self.cpu,
            self.lost_pct,
            self.over_2ms,
            self.longest.as_secs_f64() * 1e3
        )
    }
}

/// The probe itself: spins for `d`, reading the clock, and prints the
/// stalls seen (`lost_ns over_2ms longest_ns`); then exits.
fn spin(d: Duration) -> ! {
    let start = Instant::now();
    let (mut last, mut lost, mut over_2ms, mut longest) =
        (start, Duration::ZERO, 0u64, Duration::ZERO);
    loop {
        let now = Instant::now();
        let gap = now - last;
        last = now;
        if gap > STALL {
            lost += gap;
            longest = longest.max(gap);
            over_2ms += u64::from(gap > Duration::from_millis(2));
        }
        if now - start >= d {
            break;
        }
    }
    println!("{} {over_2ms} {}", lost.as_nanos(), longest.as_nanos());
    std::process::exit(0)
}

/// Spins one probe process on each of `cpus` at once (`taskset`), for
/// `d`: the time each lost in stalls. A run's tail latency cannot be
/// shorter than the stalls of the CPUs it runs on.
fn machine_stalls(cpus: &[String], d: Duration) -> Vec<Stalls> {
    let exe = std::env::current_exe().expect("this program's path");
    let probes: Vec<(String, Child)> = cpus
        .iter()
        .map(|cpu| {
            let child = Command::new("taskset")
                .args(["-c", cpu])
                .arg(&exe)
                .args([SPIN, &d.as_secs_f64().to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("start the stall probe on CPU {cpu}: {e}"));
            (cpu.clone(), child)
        })
        .collect();
    probes
        .into_iter()
        .map(|(cpu, child)| {
            let out = child.wait_with_output().expect("stall probe");
            let text = String::from_utf8_lossy(&out.stdout);
            let v: Vec<u128> = text
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            assert!(
                out.status.success() && v.len() == 3,
                "stall probe on CPU {cpu}: {text:?}"
            );
            Stalls {
                cpu,
                lost_pct: 100.0 * v[0] as f64 / d.as_nanos() as f64,
                over_2ms: u64::try_from(v[1]).unwrap_or(u64::MAX),
                longest: Duration::from_nanos(u64::try_from(v[2]).unwrap_or(u64::MAX)),
            }
        })
        .collect()
}

/// Whether `LOADGEN_TRACE` is set (see the module docs).
fn tracing() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("LOADGEN_TRACE").is_some())
}

/// One connection's answers under `LOADGEN_TRACE`: each one's scheduled
/// time since the load's start, how late it was sent, and its latency.
type Answers = Vec<(Duration, Duration, Duration)>;

/// LOADGEN_TRACE: every 50 ms (by scheduled time) in which some answer
/// took over 5 ms, with the slowest answer, the latest send and the count
/// per connection.
fn print_slow_spells(traced: &[(usize, Answers)]) {
    #[derive(Default, Clone, Copy)]
    struct Spell {
        took_us: u128,
        lag_us: u128,
        answers: u32,
    }
    if traced.is_empty() {
        return;
    }
    let mut spells: std::collections::BTreeMap<u128, Vec<Spell>> =
        std::collections::BTreeMap::new();
    for (conn, answers) in traced {
        for (at, lag, took) in answers {
            let spell = spells
                .entry(at.as_millis() / 50)
                .or_insert_with(|| vec![Spell::default(); traced.len()]);
            let s = &mut spell[*conn % traced.len()];
            s.took_us = s.took_us.max(took.as_micros());
            s.lag_us = s.lag_us.max(lag.as_micros());
            s.answers += 1;
        }
    }
    for (bucket, conns) in spells {
        if conns.iter().any(|s| s.took_us > 5_000) {
            let by_conn: Vec<String> = conns
                .iter()
                .enumerate()
                .map(|(c, s)| {
                    format!(
                        "conn {c}: max {} µs (sent up to {} µs late) of {}",
                        s.took_us, s.lag_us, s.answers
                    )
                })
                .collect();
            eprintln!("slow spell at +{} ms: {}", bucket * 50, by_conn.join(", "));
        }
    }
}

/// An Envoy `RateLimitRequest` of `n` descriptors (`a`, `b`, `c`), each of
/// one entry whose value is the key.
fn rls_request(n: usize, key: u32) -> RateLimitRequest {
    let value = format!("k{key}");
    RateLimitRequest {
        domain: if n == 1 { "one" } else { "three" }.into(),
        descriptors: ["a", "b", "c"][..n]
            .iter()
            .map(|k| RateLimitDescriptor {
                entries: vec![Entry {
                    key: (*k).into(),
                    value: value.clone(),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// One gRPC unary method over `n` HTTP/2 connections, framed by hand: the
/// request's message is encoded and prefixed as gRPC frames it, sent on a
/// stream of its own, and the reply's message decoded once its trailers
/// say `grpc-status: 0`. No tonic client: its channel sends every call
/// through a buffer task and a streaming body encoder, and the generator
/// shares its core with Redis, so the client's cost sets how fast it can
/// keep an open loop's schedule.
#[derive(Clone)]
struct RawGrpc {
    conns: Arc<Vec<h2::client::SendRequest<Bytes>>>,
    uri: http::Uri,
}

impl RawGrpc {
    async fn connect(addr: SocketAddr, n: usize, path: &str) -> Self {
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n {
            let tcp = tokio::net::TcpStream::connect(addr)
                .await
                .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
            tcp.set_nodelay(true).expect("nodelay");
            let (send, conn) = h2::client::Builder::new()
                .initial_window_size(1 << 20)
                .initial_connection_window_size(1 << 24)
                .handshake::<_, Bytes>(tcp)
                .await
                .unwrap_or_else(|e| panic!("HTTP/2 handshake with {addr}: {e}"));
            tokio::spawn(async move {
                let _ = conn.await;
            });
            conns.push(send);
        }
        Self {
            conns: Arc::new(conns),
            uri: format!("http://{addr}{path}").parse().expect("uri"),
        }
    }

    /// Calls the method with `message` on connection `conn` (modulo the
    /// count); `None` (and the run's first error noted) when the call
    /// failed.
    fn unary<M: prost::Message, R: prost::Message + Default>(
        &self,
        conn: usize,
        message: &M,
    ) -> impl Future<Output = Option<R>> + Send + 'static {
        let len = message.encoded_len();
        let mut frame = BytesMut::with_capacity(5 + len);
        frame.put_u8(0);
        frame.put_u32(u32::try_from(len).expect("message length"));
        message.encode(&mut frame).expect("encode");
        let frame = frame.freeze();
        let send = self.conns[conn % self.conns.len()].clone();
        let uri = self.uri.clone();
        async move {
            match Self::exchange(send, uri, frame).await {
                Ok(body) => match R::decode(&body[..]) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        note_error(format!("undecodable reply: {e}"));
                        None
                    }
                },
                Err(e) => {
                    note_error(e);
                    None
                }
            }
        }
    }

    /// One call's exchange: the reply's message bytes (without the gRPC
    /// frame's prefix).
    async fn exchange(
        send: h2::client::SendRequest<Bytes>,
        uri: http::Uri,
        frame: Bytes,
    ) -> Result<Bytes, String> {
        let mut send = send.ready().await.map_err(|e| e.to_string())?;
        let request = http::Request::post(uri)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .header("grpc-timeout", GRPC_TIMEOUT)
            .body(())
            .map_err(|e| e.to_string())?;
        let (response, mut stream) = send
            .send_request(request, false)
            .map_err(|e| e.to_string())?;
        stream.send_data(frame, true).map_err(|e| e.to_string())?;
        let response = response.await.map_err(|e| e.to_string())?;
        let grpc_status = |h: &http::HeaderMap| {
            h.get("grpc-status")
                .map(|s| (s == "0", h.get("grpc-message").cloned()))
        };
        if response.status() != http::StatusCode::OK {
            return Err(format!("HTTP status {}", response.status()));
        }
        // A trailers-only reply (an error) carries its status in the
        // headers.
        if let Some((false, message)) = grpc_status(response.headers()) {
            return Err(format!(
                "grpc-status {:?}: {message:?}",
                response.headers().get("grpc-status")
            ));
        }
        let mut body = response.into_body();
        let mut bytes = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| e.to_string())?;
            let _ = body.flow_control().release_capacity(chunk.len());
            bytes.extend_from_slice(&chunk);
        }
        let trailers = body.trailers().await.map_err(|e| e.to_string())?;
        match trailers.as_ref().and_then(grpc_status) {
            Some((true, _)) => {}
            Some((false, message)) => {
                return Err(format!(
                    "grpc-status {:?}: {message:?}",
                    trailers.as_ref().and_then(|t| t.get("grpc-status"))
                ));
            }
            None => return Err("no grpc-status in the trailers".to_owned()),
        }
        if bytes.len() < 5 || bytes[0] != 0 {
            return Err(format!(
                "a reply of {} bytes is not one uncompressed gRPC message",
                bytes.len()
            ));
        }
        Ok(bytes.freeze().split_off(5))
    }
}

/// The `grpc-timeout` of every call: Envoy's rate limit filter sends its
/// timeout with each call, and a server honours it (here the 1 s the
/// Redis targets run with, so that it cancels nothing).
const GRPC_TIMEOUT: &str = "1S";

/// The first call error of the run, for the report.
static FIRST_ERROR: OnceLock<String> = OnceLock::new();

fn note_error(e: String) {
    let _ = FIRST_ERROR.set(e);
}

/// The Envoy RLS call (ours and Limitador's) with `n` descriptors.
async fn rls_call(addr: SocketAddr, o: &Opts, n: usize) -> Call {
    let grpc = RawGrpc::connect(
        addr,
        o.connections,
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    )
    .await;
    Arc::new(move |conn, key| {
        let reply = grpc.unary::<_, RateLimitResponse>(conn, &rls_request(n, key));
        Box::pin(async move { Some(reply.await?.overall_code == 1) })
    })
}

/// throttlecrab's own `Throttle` call.
async fn throttlecrab_call(addr: SocketAddr, o: &Opts) -> Call {
    let grpc = RawGrpc::connect(addr, o.connections, "/throttlecrab.RateLimiter/Throttle").await;
    Arc::new(move |conn, key| {
        let request = ThrottleRequest {
            key: format!("k{key}"),
            max_burst: 100,
            count_per_period: 100,
            period: 60,
            quantity: 1,
        };
        let reply = grpc.unary::<_, ThrottleResponse>(conn, &request);
        Box::pin(async move { Some(reply.await?.allowed) })
    })
}

/// A server process, killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn local_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

fn wait_port(addr: SocketAddr, what: &str, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening on {addr}: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "{what}: nothing listens on {addr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How a target is called.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Protocol {
    /// Envoy's `ShouldRateLimit`.
    Rls,
    /// throttlecrab's `Throttle`.
    Throttlecrab,
}

/// A server under test.
struct Target {
    name: String,
    protocol: Protocol,
    addr: SocketAddr,
    pids: Pids,
    _proc: Proc,
}

impl Target {
    /// An Envoy RLS server listening on `grpc`, charged with `store`'s CPU.
    fn rls(name: &str, proc: Proc, grpc: SocketAddr, store: Vec<u32>) -> Self {
        Self {
            name: name.to_owned(),
            protocol: Protocol::Rls,
            addr: grpc,
            pids: Pids {
                server: Some(proc.0.id()),
                store,
            },
            _proc: proc,
        }
    }
}

/// The servers' CPUs, when pinned (set once in `main`).
static SERVER_CPUS: OnceLock<Option<String>> = OnceLock::new();

fn spawn(what: &str, cmd: Command, addr: SocketAddr) -> Proc {
    let mut cmd = match SERVER_CPUS.get().cloned().flatten() {
        Some(cpus) => {
            let mut t = Command::new("taskset");
            t.args(["-c", &cpus])
                .arg(cmd.get_program())
                .args(cmd.get_args());
            for (k, v) in cmd.get_envs() {
                if let Some(v) = v {
                    t.env(k, v);
                }
            }
            t
        }
        None => cmd,
    };
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    wait_port(addr, what, &mut child);
    Proc(child)
}

fn ours(name: &str, configs: &[PathBuf], extra: &[String], store: Vec<u32>) -> Target {
    ours_from(
        Path::new(env!("CARGO_BIN_EXE_ratelimit-server")),
        name,
        configs,
        extra,
        store,
    )
}

/// [`ours`], from the binary `bin` (`--baseline`).
fn ours_from(
    bin: &Path,
    name: &str,
    configs: &[PathBuf],
    extra: &[String],
    store: Vec<u32>,
) -> Target {
    let grpc = local_addr();
    let mut cmd = Command::new(bin);
    for c in configs {
        cmd.arg("--config").arg(c);
    }
    cmd.args(["--grpc-addr", &grpc.to_string()])
        .args(["--http-addr", &local_addr().to_string()])
        .arg("--no-watch")
        .args(extra)
        .env("RUST_LOG", "warn");
    Target::rls(name, spawn("ratelimit-server", cmd, grpc), grpc, store)
}

fn limitador(bin: &Path, name: &str, limits: &Path, storage: &[String], store: Vec<u32>) -> Target {
    let grpc = local_addr();
    let http = local_addr();
    let mut cmd = Command::new(bin);
    cmd.args([
        "--rls-ip",
        "127.0.0.1",
        "--rls-port",
        &grpc.port().to_string(),
    ])
    .args([
        "--http-ip",
        "127.0.0.1",
        "--http-port",
        &http.port().to_string(),
    ])
    .arg(limits)
    .args(storage)
    .env("RUST_LOG", "warn");
    Target::rls(name, spawn("limitador-server", cmd, grpc), grpc, store)
}

fn throttlecrab(bin: &Path) -> Target {
    let grpc = local_addr();
    let mut cmd = Command::new(bin);
    cmd.args(["--grpc", "--grpc-host", "127.0.0.1"])
        .args(["--grpc-port", &grpc.port().to_string()])
        .args(["--log-level", "warn"]);
    let proc = spawn("throttlecrab-server", cmd, grpc);
    Target {
        name: "throttlecrab-server (in process)".to_owned(),
        protocol: Protocol::Throttlecrab,
        addr: grpc,
        pids: Pids {
            server: Some(proc.0.id()),
            store: Vec::new(),
        },
        _proc: proc,
    }
}

/// A Redis server's pid, from `INFO server`.
fn redis_pid(mut conn: redis::Connection) -> u32 {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut conn)
        .expect("INFO server");
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("process_id in INFO server")
}

fn flushall(mut conn: redis::Connection) {
    let _: () = redis::cmd("FLUSHALL").query(&mut conn).expect("FLUSHALL");
}

/// The rows' key: target, load, descriptors.
type Key = (String, String, usize);

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "-".to_owned();
    }
    let s = format!("{:.0}", v);
    let (sign, digits) = s.strip_prefix('-').map_or(("", s.as_str()), |d| ("-", d));
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    format!("{sign}{out}")
}

fn fmt_cpu(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite())
        .map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"))
}

const HEADER: &str = "| target | load | descriptors | requests/s | p50 µs | p99 µs | p99.9 µs | server CPU µs/request | Redis CPU µs/request | admitted | failed | generator lag p99 µs |";
const ALIGN: &str = "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|";

fn row(m: &Measured) -> String {
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} % | {} | {} |",
        m.target,
        m.load,
        m.descriptors,
        fmt_num(m.rate()),
        fmt_num(m.quantile(0.50)),
        fmt_num(m.quantile(0.99)),
        fmt_num(m.quantile(0.999)),
        fmt_cpu(m.per_request(m.server_cpu)),
        fmt_cpu(m.per_request(m.store_cpu)),
        m.admitted_share(),
        m.failed + m.unsent,
        fmt_num(m.lag_p99()),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|a| a == SPIN) {
        let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1.0);
        spin(Duration::from_secs_f64(secs));
    }
    let o = opts();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    // Before anything runs: how much time this machine takes from a busy
    // CPU, with every CPU busy and with the servers' alone.
    let stalls = o.pin.as_ref().map(|(servers, _)| {
        let all: Vec<String> = (0..cores).map(|c| c.to_string()).collect();
        (
            machine_stalls(&all, STALL_PROBE),
            machine_stalls(std::slice::from_ref(servers), STALL_PROBE),
        )
    });
    if let Some((servers, generator)) = &o.pin {
        pin_self(generator);
        eprintln!("loadgen: servers on CPU {servers}, the generator and Redis on CPU {generator}");
    }
    SERVER_CPUS
        .set(o.pin.as_ref().map(|p| p.0.clone()))
        .expect("set once");
    // One worker per CPU the generator has (pinned: all but the servers').
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = std::env::temp_dir().join(format!("ratelimit-loadgen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let configs = vec![dir.join("one.yaml"), dir.join("three.yaml")];
    std::fs::write(&configs[0], OURS_ONE).expect("config");
    std::fs::write(&configs[1], OURS_THREE).expect("config");
    let limits = dir.join("limits.yaml");
    std::fs::write(&limits, LIMITADOR_LIMITS).expect("limits");

    let mut floor = Vec::new();
    let max_in_flight = *o.in_flight.iter().max().expect("in flight");
    rt.block_on(async {
        // The floor: the library call, and the service in process.
        let quota = Quota::fixed_window(Rate::per_minute(100)).expect("quota");
        let limiter = Arc::new(
            Limiter::builder(LocalStore::new())
                .quota(quota)
                .build()
                .expect("limiter"),
        );
        let call: Call = Arc::new(move |_, key| {
            let l = limiter.clone();
            Box::pin(async move { Some(l.check(format!("k{key}")).await.allowed) })
        });
        let mut m = drive(
            &o,
            o.keys * 100,
            Load::Closed(max_in_flight),
            call,
            &Pids::default(),
        )
        .await;
        m.target = "library: `Limiter::check`, local store".to_owned();
        floor.push(m);
        let svc = Arc::new(
            RateLimitService::new(
                Arc::new(LocalStore::new()),
                Config::from_yaml_str("one.yaml", OURS_ONE).expect("config"),
                Settings::default(),
                "local",
            )
            .expect("service settings"),
        );
        let call: Call = Arc::new(move |_, key| {
            let svc = svc.clone();
            Box::pin(async move {
                let r = svc.should_rate_limit(&rls_request(1, key)).await.ok()?;
                Some(r.overall_code == 1)
            })
        });
        let mut m = drive(
            &o,
            o.keys * 100,
            Load::Closed(max_in_flight),
            call,
            &Pids::default(),
        )
        .await;
        m.target = "service in process: `should_rate_limit`, local store".to_owned();
        floor.push(m);
    });

    // The stores and the servers.
    let redis = o.redis.then(RedisServer::start_local);
    let cluster = o.cluster.then(RedisCluster::start_local);
    let mut targets: Vec<Target> = Vec::new();
    targets.push(ours(
        "ratelimit-server, local store",
        &configs,
        &[],
        Vec::new(),
    ));
    if let Some(bin) = &o.baseline {
        targets.push(ours_from(
            bin,
            "ratelimit-server (baseline build), local store",
            &configs,
            &[],
            Vec::new(),
        ));
    }
    if let Some(bin) = &o.throttlecrab {
        targets.push(throttlecrab(bin));
    }
    if let Some(bin) = &o.limitador {
        targets.push(limitador(
            bin,
            "Limitador, memory",
            &limits,
            &[
                "memory".to_owned(),
                "--cache".to_owned(),
                (o.keys * 4).to_string(),
            ],
            Vec::new(),
        ));
    }
    if let Some(r) = &redis {
        let pid = redis_pid(r.connection());
        targets.push(ours(
            "ratelimit-server, Redis",
            &configs,
            &[
                "--backend".into(),
                "redis".into(),
                "--redis-url".into(),
                r.url(),
                "--instances".into(),
                "1".into(),
                // Every decision by Redis: the CPU per request of the
                // store's path, not of answers from leases after a
                // timeout when the generator's core lags.
                "--timeout".into(),
                "1s".into(),
            ],
            vec![pid],
        ));
        if let Some(bin) = &o.limitador {
            targets.push(limitador(
                bin,
                "Limitador, Redis",
                &limits,
                &["redis".to_owned(), r.url()],
                vec![pid],
            ));
        }
    }
    if let Some(c) = &cluster {
        let masters: Vec<u32> = c
            .masters()
            .iter()
            .map(|m| redis_pid(c.connection(m.port)))
            .collect();
        let mut extra = vec!["--backend".to_owned(), "cluster".to_owned()];
        for url in c.urls() {
            extra.push("--cluster-url".to_owned());
            extra.push(url);
        }
        extra.extend(["--instances", "1", "--timeout", "1s"].map(str::to_owned));
        targets.push(ours(
            "ratelimit-server, Redis Cluster (3 masters)",
            &configs,
            &extra,
            masters,
        ));
    }
    let missing: Vec<&str> = [
        (
            o.throttlecrab.is_none(),
            "THROTTLECRAB_SERVER (throttlecrab-server)",
        ),
        (o.limitador.is_none(), "LIMITADOR_SERVER (limitador-server)"),
    ]
    .iter()
    .filter(|(m, _)| *m)
    .map(|(_, s)| *s)
    .collect();
    if !missing.is_empty() {
        eprintln!(
            "loadgen: peers not run, their binaries not named: {} (see the program's doc comment)",
            missing.join(", ")
        );
    }

    let mut rounds: Vec<Vec<Measured>> = Vec::new();
    for round in 0..o.rounds {
        let mut rows = Vec::new();
        // Alternate the order of the targets from round to round.
        let order: Vec<usize> = (0..targets.len())
            .map(|i| (i + round) % targets.len())
            .collect();
        for &ti in &order {
            let t = &targets[ti];
            if let Some(r) = &redis {
                flushall(r.connection());
            }
            let mut loads: Vec<(Load, usize)> =
                o.in_flight.iter().map(|&n| (Load::Closed(n), 1)).collect();
            if t.protocol == Protocol::Rls {
                loads.push((Load::Closed(o.in_flight[0]), 3));
            }
            let mut capacity = 0.0f64;
            rt.block_on(async {
                let call1 = match t.protocol {
                    Protocol::Rls => rls_call(t.addr, &o, 1).await,
                    Protocol::Throttlecrab => throttlecrab_call(t.addr, &o).await,
                };
                let call3 = match t.protocol {
                    Protocol::Rls => Some(rls_call(t.addr, &o, 3).await),
                    Protocol::Throttlecrab => None,
                };
                for (load, n) in loads {
                    let call = if n == 1 {
                        call1.clone()
                    } else {
                        call3.clone().expect("rls")
                    };
                    let mut m = drive(&o, o.keys, load, call, &t.pids).await;
                    m.target = t.name.clone();
                    m.descriptors = n;
                    if n == 1 && load == Load::Closed(max_in_flight) {
                        capacity = m.rate();
                    }
                    rows.push(m);
                }
                for &fraction in &o.open {
                    let load = Load::Open {
                        fraction,
                        rate: capacity * fraction,
                    };
                    if tracing() {
                        eprintln!("{}, open at {fraction} x capacity:", t.name);
                    }
                    let mut m = drive(&o, o.keys, load, call1.clone(), &t.pids).await;
                    m.target = t.name.clone();
                    rows.push(m);
                }
            });
        }
        rounds.push(rows);
    }

    // Medians over the rounds, in the targets' order.
    let mut keys: Vec<Key> = Vec::new();
    let mut by: BTreeMap<Key, Vec<&Measured>> = BTreeMap::new();
    for m in rounds.iter().flatten() {
        let k = (m.target.clone(), m.load.clone(), m.descriptors);
        if !by.contains_key(&k) {
            keys.push(k.clone());
        }
        by.entry(k).or_default().push(m);
    }
    keys.sort_by_key(|k| {
        (
            targets
                .iter()
                .position(|t| t.name == k.0)
                .unwrap_or(usize::MAX),
            keys_order(&k.1),
            k.2,
        )
    });
    let med = |k: &Key, f: &dyn Fn(&Measured) -> f64| median(by[k].iter().map(|m| f(m)).collect());

    println!(
        "\n{} round(s); each load {} s after a 1 s warm-up; {} HTTP/2 connections; {} keys at random; \
         100 per minute per key (fixed window; throttlecrab-server: GCRA, burst 100); {} cores\n",
        o.rounds,
        o.duration.as_secs_f64(),
        o.connections,
        o.keys,
        cores
    );
    if let Some((all, alone)) = &stalls {
        println!(
            "The machine's stalls: a thread spinning on each CPU for {} s, every CPU at once, \
             then the servers' CPU alone; a stall is a gap over {} µs in which the thread did \
             not run (the hypervisor or the kernel ran something else):\n",
            STALL_PROBE.as_secs(),
            STALL.as_micros()
        );
        for (when, list) in [("every CPU busy", all), ("the servers' CPU alone", alone)] {
            for s in list {
                println!("- {when}: {s}");
            }
        }
        println!();
    }
    println!("Medians over the rounds:\n");
    println!("{HEADER}");
    println!("{ALIGN}");
    for m in &floor {
        println!("{}", row(m));
    }
    for k in &keys {
        let ms = &by[k];
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} % | {} | {} |",
            k.0,
            k.1,
            k.2,
            fmt_num(med(k, &|m| m.rate())),
            fmt_num(med(k, &|m| m.quantile(0.50))),
            fmt_num(med(k, &|m| m.quantile(0.99))),
            fmt_num(med(k, &|m| m.quantile(0.999))),
            fmt_cpu(Some(med(k, &|m| m
                .per_request(m.server_cpu)
                .unwrap_or(f64::NAN)))),
            fmt_cpu(Some(med(k, &|m| m
                .per_request(m.store_cpu)
                .unwrap_or(f64::NAN)))),
            med(k, &|m| m.admitted_share()),
            ms.iter().map(|m| m.failed + m.unsent).sum::<u64>(),
            fmt_num(med(k, &|m| m.lag_p99())),
        );
    }

    // The ratios the service is held to.
    let cpu = |target: &str, load: &str, n: usize| {
        let k = (target.to_owned(), load.to_owned(), n);
        by.contains_key(&k)
            .then(|| med(&k, &|m| m.per_request(m.server_cpu).unwrap_or(f64::NAN)))
    };
    println!("\nServer CPU per request, ours over the peer's (below 1: ours costs less):\n");
    for &n in &o.in_flight {
        let load = Load::Closed(n).label();
        for (ours_name, peer) in [
            (
                "ratelimit-server, local store",
                "throttlecrab-server (in process)",
            ),
            ("ratelimit-server, local store", "Limitador, memory"),
            ("ratelimit-server, Redis", "Limitador, Redis"),
        ] {
            if let (Some(a), Some(b)) = (cpu(ours_name, &load, 1), cpu(peer, &load, 1)) {
                println!(
                    "- {load}: {ours_name} {a:.1} µs / {peer} {b:.1} µs = {:.2}",
                    a / b
                );
            }
        }
    }
    let first = Load::Closed(o.in_flight[0]).label();
    println!("\nThree descriptors per request over one, server CPU per request ({first}):\n");
    for t in &targets {
        if let (Some(a), Some(b)) = (cpu(&t.name, &first, 3), cpu(&t.name, &first, 1)) {
            println!("- {}: {a:.1} µs / {b:.1} µs = {:.2}", t.name, a / b);
        }
    }

    println!("\nEvery round:\n");
    println!("{HEADER}");
    println!("{ALIGN}");
    for (i, rows) in rounds.iter().enumerate() {
        for m in rows {
            let mut m = m.clone();
            m.target = format!("{} (round {})", m.target, i + 1);
            println!("{}", row(&m));
        }
    }
    for rows in &rounds {
        for m in rows {
            if let Some(rate) = m.offered
                && m.unsent > 0
            {
                eprintln!(
                    "loadgen: {} at {rate:.0}/s: {} requests not sent (over the generator's bound on outstanding requests)",
                    m.target, m.unsent
                );
            }
        }
    }
    if let Some(e) = FIRST_ERROR.get() {
        eprintln!("loadgen: calls failed; the first error: {e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Closed loops first (by in-flight count), then open loops.
fn keys_order(load: &str) -> (u8, u64) {
    let n: u64 = load
        .split(|c: char| !c.is_ascii_digit() && c != '.')
        .find_map(|s| s.parse::<f64>().ok())
        .map_or(0, |v| (v * 1000.0) as u64);
    (u8::from(load.starts_with("open")), n)
}
