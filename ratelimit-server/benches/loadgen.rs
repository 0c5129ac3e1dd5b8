//! Side-by-side load: `ratelimit-server` against `throttlecrab-server`, and
//! the service's overhead over the library call.
//!
//! ```sh
//! # throttlecrab-server, in its own target directory (its build needs protoc:
//! # apt-get install protobuf-compiler):
//! CARGO_TARGET_DIR=target/throttlecrab cargo install throttlecrab-server --root target/throttlecrab
//! THROTTLECRAB_SERVER=target/throttlecrab/bin/throttlecrab-server \
//!     cargo bench -p ratelimit-server --bench loadgen -- --duration 5
//! ```
//!
//! Each target gets the same closed loop: `--concurrency` requests in
//! flight (default 32) over `--connections` HTTP/2 connections (default
//! 4), for `--duration` seconds (default 5) after a one-second warm-up,
//! each request for one of `--keys` keys (default 10,000) drawn at random,
//! under comparable limits: a token bucket (GCRA) of 100 per minute, burst
//! 100, on both servers. The load generator runs in the same process as
//! the in-process targets and beside the servers, on the same machine.
//! It prints a Markdown table: requests per second, p50, p99 and p99.9 of
//! the response time, and the share admitted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use rand::Rng;
use ratelimit_core::{Limiter, Quota, Rate};
use ratelimit_local::LocalStore;
use ratelimit_server::{Config, RateLimitService, Settings};
use tonic::transport::{Channel, Endpoint};

const CONFIG: &str = "domain: bench
descriptors:
  - key: key
    rate_limit:
      unit: minute
      requests_per_unit: 100
      algorithm: token_bucket
      burst: 100
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
    concurrency: usize,
    connections: usize,
    keys: u32,
    throttlecrab: Option<PathBuf>,
    redis: bool,
    rounds: u32,
}

fn opts() -> Opts {
    let mut o = Opts {
        duration: Duration::from_secs(5),
        concurrency: 32,
        connections: 4,
        keys: 10_000,
        throttlecrab: std::env::var_os("THROTTLECRAB_SERVER").map(PathBuf::from),
        redis: true,
        rounds: 2,
    };
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        let next = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--duration" => o.duration = Duration::from_secs_f64(next.parse().unwrap_or(5.0)),
            "--concurrency" => o.concurrency = next.parse().unwrap_or(32),
            "--connections" => o.connections = next.parse().unwrap_or(4),
            "--keys" => o.keys = next.parse().unwrap_or(10_000),
            "--rounds" => o.rounds = next.parse().unwrap_or(2),
            "--throttlecrab" => o.throttlecrab = Some(PathBuf::from(next)),
            "--no-redis" => {
                o.redis = false;
                i += 1;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    o
}

/// What one run measured.
struct Measured {
    name: String,
    requests: u64,
    admitted: u64,
    elapsed: Duration,
    latencies_us: Vec<u32>,
    /// Every request, warm-up included.
    all: u64,
    /// The server process's CPU time over the whole run (warm-up included).
    server_cpu: Option<Duration>,
}

impl Measured {
    fn row(&mut self) -> String {
        self.latencies_us.sort_unstable();
        let q = |p: f64| {
            let n = self.latencies_us.len();
            if n == 0 {
                return 0.0;
            }
            let i = ((n as f64 * p).ceil() as usize).clamp(1, n) - 1;
            f64::from(self.latencies_us[i])
        };
        let cpu = match self.server_cpu {
            Some(c) => format!("{:.0}", c.as_secs_f64() * 1e6 / self.all.max(1) as f64),
            None => "-".to_owned(),
        };
        format!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {:.1} % |",
            self.name,
            self.requests as f64 / self.elapsed.as_secs_f64(),
            q(0.50),
            q(0.99),
            q(0.999),
            cpu,
            100.0 * self.admitted as f64 / self.requests.max(1) as f64
        )
    }
}

/// A closed loop of `concurrency` workers calling `call(worker, key)`,
/// warmed up for a second, then measured for `duration`.
async fn closed_loop<F, Fut>(name: &str, o: &Opts, keys: u32, call: F) -> Measured
where
    F: Fn(usize, u32) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let call = Arc::new(call);
    let warm_until = Instant::now() + Duration::from_secs(1);
    let stop_at = warm_until + o.duration;
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..o.concurrency {
        let call = call.clone();
        let admitted = admitted.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1 << 16);
            let mut n = 0u64;
            let mut all = 0u64;
            loop {
                let key = rand::rng().random_range(0..keys);
                let t = Instant::now();
                let ok = call(w, key).await;
                let done = Instant::now();
                all += 1;
                if done >= stop_at {
                    break;
                }
                if t >= warm_until {
                    lat.push(u32::try_from(done.duration_since(t).as_micros()).unwrap_or(u32::MAX));
                    n += 1;
                    if ok {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            (n, all, lat)
        }));
    }
    let mut latencies_us = Vec::new();
    let mut requests = 0;
    let mut all = 0;
    for t in tasks {
        let (n, a, lat) = t.await.expect("worker");
        requests += n;
        all += a;
        latencies_us.extend(lat);
    }
    Measured {
        name: name.to_owned(),
        requests,
        admitted: admitted.load(Ordering::Relaxed),
        elapsed: o.duration,
        latencies_us,
        all,
        server_cpu: None,
    }
}

fn rls_request(key: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "key".into(),
                value: format!("k{key}"),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

async fn channels(addr: SocketAddr, n: usize) -> Vec<Channel> {
    let mut out = Vec::new();
    for _ in 0..n {
        let ch = Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .tcp_nodelay(true)
            .connect()
            .await
            .expect("connect");
        out.push(ch);
    }
    out
}

/// A server process, killed (by pid) on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process's CPU time (user + system) from `/proc/<pid>/stat`.
fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on Linux.
    Some(Duration::from_millis(ticks * 10))
}

/// Runs `load` against a server process, with its CPU time measured.
fn with_cpu(pid: u32, load: impl FnOnce() -> Measured) -> Measured {
    let before = cpu_time(pid);
    let mut m = load();
    if let (Some(a), Some(b)) = (before, cpu_time(pid)) {
        m.server_cpu = Some(b.saturating_sub(a));
    }
    m
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn wait_port(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn start_ours(config: &std::path::Path, extra: &[&str]) -> (Proc, SocketAddr) {
    let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let child = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
        .args(["--config", config.to_str().expect("path")])
        .args([
            "--grpc-addr",
            &grpc.to_string(),
            "--http-addr",
            &http.to_string(),
        ])
        .args(["--no-watch"])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start ratelimit-server");
    wait_port(grpc);
    (Proc(child), grpc)
}

async fn load_ours(name: &str, o: &Opts, addr: SocketAddr) -> Measured {
    let chans = channels(addr, o.connections).await;
    let clients: Vec<RateLimitServiceClient<Channel>> =
        chans.into_iter().map(RateLimitServiceClient::new).collect();
    let clients = Arc::new(clients);
    closed_loop(name, o, o.keys, move |w, key| {
        let mut c = clients[w % clients.len()].clone();
        async move {
            let r = c.should_rate_limit(rls_request(key)).await.expect("rpc");
            r.into_inner().overall_code == 1
        }
    })
    .await
}

async fn load_throttlecrab(name: &str, o: &Opts, addr: SocketAddr) -> Measured {
    let chans = Arc::new(channels(addr, o.connections).await);
    closed_loop(name, o, o.keys, move |w, key| {
        let ch = chans[w % chans.len()].clone();
        async move {
            let mut grpc = tonic::client::Grpc::new(ch);
            grpc.ready().await.expect("ready");
            let req = ThrottleRequest {
                key: format!("k{key}"),
                max_burst: 100,
                count_per_period: 100,
                period: 60,
                quantity: 1,
            };
            let r: tonic::Response<ThrottleResponse> = grpc
                .unary(
                    tonic::Request::new(req),
                    tonic::codegen::http::uri::PathAndQuery::from_static(
                        "/throttlecrab.RateLimiter/Throttle",
                    ),
                    tonic_prost::ProstCodec::default(),
                )
                .await
                .expect("throttle");
            r.into_inner().allowed
        }
    })
    .await
}

fn main() {
    let o = opts();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = std::env::temp_dir().join(format!("ratelimit-server-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("bench.yaml");
    std::fs::write(&config, CONFIG).expect("config");
    let mut rows = Vec::new();

    rt.block_on(async {
        // 1. The library call: Limiter::check on the local store.
        let quota = Quota::token_bucket(Rate::per_minute(100), 100).expect("quota");
        let limiter = Arc::new(
            Limiter::builder(LocalStore::new())
                .quota(quota)
                .build()
                .expect("limiter"),
        );
        let l = limiter.clone();
        rows.push(
            closed_loop(
                "library: `Limiter::check`, local store",
                &o,
                o.keys * 100,
                move |_, key| {
                    let l = l.clone();
                    async move { l.check(format!("k{key}")).await.allowed }
                },
            )
            .await,
        );
        // 2. The service in process: lookup, the descriptor's state name,
        //    one store request, the response.
        let svc = Arc::new(
            RateLimitService::new(
                Arc::new(LocalStore::new()),
                Config::from_yaml_str("bench.yaml", CONFIG).expect("config"),
                Settings::default(),
                "local",
            )
            .expect("service settings"),
        );
        rows.push(
            closed_loop(
                "service in process: `should_rate_limit`, local store",
                &o,
                o.keys * 100,
                move |_, key| {
                    let svc = svc.clone();
                    async move {
                        svc.should_rate_limit(&rls_request(key))
                            .await
                            .expect("answer")
                            .overall_code
                            == 1
                    }
                },
            )
            .await,
        );
    });

    // 3-5. The servers, in alternating rounds (the machine is shared: a
    // burst of someone else's work should not land on one server only).
    let redis = o
        .redis
        .then(ratelimit_testkit::redis_server::RedisServer::start_local);
    let (ours_local, local_addr) = start_ours(&config, &[]);
    let ours_redis = redis.as_ref().map(|r| {
        let url = r.url();
        start_ours(
            &config,
            &[
                "--backend",
                "redis",
                "--redis-url",
                &url,
                "--instances",
                "1",
                "--timeout",
                "1s",
            ],
        )
    });
    let crab = o.throttlecrab.as_ref().map(|bin| {
        let port = free_port();
        let child = Command::new(bin)
            .args([
                "--grpc",
                "--grpc-host",
                "127.0.0.1",
                "--grpc-port",
                &port.to_string(),
            ])
            .args(["--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        wait_port(addr);
        (Proc(child), addr)
    });
    if crab.is_none() {
        eprintln!(
            "throttlecrab-server not run: set THROTTLECRAB_SERVER to its binary \
             (CARGO_TARGET_DIR=target/throttlecrab cargo install throttlecrab-server --root target/throttlecrab; \
             its build needs protoc: apt-get install protobuf-compiler)"
        );
    }
    for round in 1..=o.rounds {
        let tag = |s: &str| format!("{s} (round {round})");
        rows.push(with_cpu(ours_local.0.id(), || {
            rt.block_on(load_ours(
                &tag("ratelimit-server, gRPC, local store"),
                &o,
                local_addr,
            ))
        }));
        if let Some((p, addr)) = &crab {
            rows.push(with_cpu(p.0.id(), || {
                rt.block_on(load_throttlecrab(
                    &tag("throttlecrab-server, gRPC, in process"),
                    &o,
                    *addr,
                ))
            }));
        }
        if let Some((p, addr)) = &ours_redis {
            rows.push(with_cpu(p.0.id(), || {
                rt.block_on(load_ours(
                    &tag("ratelimit-server, gRPC, Redis (one node)"),
                    &o,
                    *addr,
                ))
            }));
        }
    }

    println!(
        "\n{} s per target after a 1 s warm-up, {} requests in flight over {} connections, {} keys, token bucket / GCRA 100 per minute, burst 100; {} cores\n",
        o.duration.as_secs_f64(),
        o.concurrency,
        o.connections,
        o.keys,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    println!(
        "| target | requests/s | p50 µs | p99 µs | p99.9 µs | server CPU µs/request | admitted |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|");
    for r in &mut rows {
        println!("{}", r.row());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
