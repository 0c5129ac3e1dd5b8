//! Bursts on a busy host: two service instances (release builds of the
//! `ratelimit-server` binary) on one `redis-server`, with the service's
//! defaults (`--instances 2`, the 20 ms `--timeout`), beside processes
//! that keep every CPU busy, take rounds of gRPC bursts on one descriptor
//! limited to 20 a minute, each round a caller of its own. Reports, per
//! round, what was admitted against the limit, and how the instances
//! decided (by the store, from leases, by the failure policy).
//!
//! ```sh
//! cargo bench -p ratelimit-server --bench bursts
//! cargo bench -p ratelimit-server --bench bursts -- --busy 0 --rounds 20
//! ```
//!
//! Options: `--rounds R` (10), `--calls C` per round (2,000), `--in-flight
//! F` (64, alternating between the instances), `--busy N` (spinning
//! processes; default one per CPU), `--timeout D` (the service's
//! `--timeout`, default its own), `--algorithm A` (`sliding_log`, exact in
//! every trailing minute so that a round crossing a calendar minute admits
//! like any other; `fixed_window` is envoyproxy/ratelimit's). Needs
//! `redis-server`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_testkit::redis_server::RedisServer;

const USAGE: &str = "usage: bursts [--rounds R] [--calls C] [--in-flight F] [--busy N] \
[--timeout D] [--algorithm A]";

struct Opts {
    rounds: usize,
    calls: u64,
    in_flight: usize,
    busy: usize,
    timeout: Option<String>,
    algorithm: String,
}

fn opts() -> Opts {
    let mut o = Opts {
        rounds: 10,
        calls: 2_000,
        in_flight: 64,
        busy: std::thread::available_parallelism().map_or(2, usize::from),
        timeout: None,
        algorithm: "sliding_log".into(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next().unwrap_or_else(|| {
                eprintln!("{a} needs a value\n{USAGE}");
                std::process::exit(2)
            })
        };
        let number = |v: String| -> u64 {
            v.parse().unwrap_or_else(|_| {
                eprintln!("not a number: {v:?}\n{USAGE}");
                std::process::exit(2)
            })
        };
        match a.as_str() {
            "--rounds" => o.rounds = number(value()) as usize,
            "--calls" => o.calls = number(value()),
            "--in-flight" => o.in_flight = (number(value()) as usize).max(1),
            "--busy" => o.busy = number(value()) as usize,
            "--timeout" => o.timeout = Some(value()),
            "--algorithm" => o.algorithm = value(),
            // `cargo bench` passes `--bench`.
            "--bench" => {}
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0)
            }
            other => {
                eprintln!("unknown option {other:?}\n{USAGE}");
                std::process::exit(2)
            }
        }
    }
    o
}

/// Child processes, killed when dropped.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One service instance: its process and its gRPC and HTTP addresses.
fn start_service(args: &[String]) -> (Child, SocketAddr, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ratelimit-server");
    let stdout = child.stdout.take().expect("stdout");
    let (mut grpc, mut http) = (None, None);
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        if let Some(a) = line.strip_prefix("ratelimit-server: gRPC on ") {
            grpc = a.trim().parse().ok();
        }
        if let Some(a) = line.strip_prefix("ratelimit-server: HTTP on ") {
            http = a.trim().parse().ok();
        }
        if grpc.is_some() && http.is_some() {
            break;
        }
    }
    match (grpc, http) {
        (Some(g), Some(h)) => (child, g, h),
        _ => panic!("ratelimit-server did not print its addresses"),
    }
}

/// The service's decisions by source, from its `/metrics`.
fn sources(http: SocketAddr) -> Vec<(String, u64)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(http).expect("metrics");
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("ratelimit_server_decisions_total{source=\"")?;
            let (source, n) = rest.split_once("\"} ")?;
            Some((source.to_owned(), n.trim().parse().ok()?))
        })
        .collect()
}

fn main() {
    let o = opts();
    let redis = RedisServer::start_local();
    let dir = std::env::temp_dir().join(format!("ratelimit-bursts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("burst.yaml");
    std::fs::write(
        &path,
        format!(
            "domain: burst\ndescriptors:\n  - key: client\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n      algorithm: {}\n",
            o.algorithm
        ),
    )
    .expect("config");
    let mut args: Vec<String> = [
        "--config",
        &path.display().to_string(),
        "--backend",
        "redis",
        "--redis-url",
        &redis.url(),
        "--redis-prefix",
        redis.prefix(),
        "--instances",
        "2",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if let Some(t) = &o.timeout {
        args.extend(["--timeout".to_owned(), t.clone()]);
    }
    let (a, grpc_a, http_a) = start_service(&args);
    let (b, grpc_b, http_b) = start_service(&args);
    let _services = Children(vec![a, b]);
    let _busy = Children(
        (0..o.busy)
            .map(|_| {
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("start a busy process (sh)")
            })
            .collect(),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "### Bursts on a busy host: two instances, {} calls a round, {} in flight, 20 a minute ({}), {} busy processes, timeout {}\n",
        o.calls,
        o.in_flight,
        o.algorithm,
        o.busy,
        o.timeout.as_deref().unwrap_or("the default (20ms)")
    );
    println!(
        "Machine: {} CPUs, {}\n",
        std::thread::available_parallelism().map_or(0, usize::from),
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| s.lines().find_map(|l| l
                .strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())))
            .unwrap_or_default()
    );
    println!("| round | admitted | by the store | from leases | by the failure policy | took |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut exact = 0;
    let mut worst = 0;
    rt.block_on(async {
        let clients = [
            RateLimitServiceClient::connect(format!("http://{grpc_a}"))
                .await
                .expect("connect"),
            RateLimitServiceClient::connect(format!("http://{grpc_b}"))
                .await
                .expect("connect"),
        ];
        for round in 0..o.rounds {
            let before: Vec<Vec<(String, u64)>> = vec![sources(http_a), sources(http_b)];
            let caller = format!("round-{}-{round}", std::process::id());
            let (next, admitted) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
            let started = Instant::now();
            let mut tasks = Vec::new();
            for t in 0..o.in_flight {
                let mut client = clients[t % 2].clone();
                let (next, admitted, caller, calls) =
                    (next.clone(), admitted.clone(), caller.clone(), o.calls);
                tasks.push(tokio::spawn(async move {
                    while next.fetch_add(1, Ordering::Relaxed) < calls {
                        let req = RateLimitRequest {
                            domain: "burst".into(),
                            descriptors: vec![RateLimitDescriptor {
                                entries: vec![Entry {
                                    key: "client".into(),
                                    value: caller.clone(),
                                }],
                                ..Default::default()
                            }],
                            hits_addend: 0,
                        };
                        let answer = client.should_rate_limit(req).await.expect("rpc");
                        if answer.into_inner().overall_code == Code::Ok as i32 {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }));
            }
            for t in tasks {
                t.await.expect("caller task");
            }
            let took = started.elapsed();
            let after = [sources(http_a), sources(http_b)];
            let delta = |source: &str| -> u64 {
                after
                    .iter()
                    .zip(&before)
                    .map(|(a, b)| {
                        let get = |v: &[(String, u64)]| {
                            v.iter().find(|(s, _)| s == source).map_or(0, |(_, n)| *n)
                        };
                        get(a) - get(b)
                    })
                    .sum()
            };
            let n = admitted.load(Ordering::Relaxed);
            if n == 20 {
                exact += 1;
            }
            worst = worst.max(n);
            println!(
                "| {} | {n} | {} | {} | {} | {:.0} ms |",
                round + 1,
                delta("store"),
                delta("lease"),
                delta("fail_closed") + delta("fail_open"),
                took.as_secs_f64() * 1e3
            );
        }
    });
    println!(
        "\nExactly 20 admitted in {exact} of {} rounds; the most admitted in a round: {worst}.",
        o.rounds
    );
    let _ = std::fs::remove_dir_all(&dir);
}
