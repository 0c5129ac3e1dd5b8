//! A burst is not a failure: two service instances on one real Redis, with
//! the default timeout, on a host kept busy by other processes (one
//! spinning process per CPU), take ten rounds of 2,000-call bursts (64 in
//! flight, alternating between the instances) on one descriptor limited to
//! 20 a minute, each round a caller of its own.
//!
//! What the store could not answer in time is decided from the caller's
//! lease (the store's last answer, its remaining divided between the two
//! instances), else by the failure policy (closed): a degraded answer
//! never hands out budget the store did not state, and what it spent stays
//! spent. So no round admits more than the stated bound, `L + N × ⌊(L - 1)
//! / N⌋` = 38 for L = 20 and N = 2 (`ratelimit_core`'s limiter docs,
//! "Degraded answers"), where an instance's L ÷ N fallback added to the
//! store's used to reach 40, and leases renewed between failures without
//! keeping what they spent reached 49. How often a round is exactly 20 on
//! a release build is measured in BENCHMARKS.md (`cargo bench -p ratelimit-server --bench
//! bursts`);
//! this debug build on a busy host degrades far more often.
//!
//! The instances log at most one store-failure warning a second each.
//!
//! The limit is a sliding log (exact in every trailing minute), so a round
//! that crosses a calendar minute admits like any other. The test needs
//! `redis-server` (`apt-get install redis-server`; the fixture fails with
//! that message when it is missing).

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_testkit::redis_server::RedisServer;

use common::{Server, descriptor, request, temp_dir};

const CONFIG: &str = "domain: burst
descriptors:
  - key: client
    rate_limit:
      unit: minute
      requests_per_unit: 20
      algorithm: sliding_log
";

/// Processes that spin on every CPU while they live (a busy host).
struct Busy(Vec<Child>);

impl Busy {
    fn start() -> Self {
        let cpus = std::thread::available_parallelism().map_or(2, usize::from);
        Self(
            (0..cpus)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("start a busy process (sh)")
                })
                .collect(),
        )
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn two_instances_under_bursts_on_a_busy_host_stay_within_the_stated_bound() {
    let redis = RedisServer::start_local();
    let dir = temp_dir("bursts");
    let path = dir.join("burst.yaml");
    std::fs::write(&path, CONFIG).expect("config");
    let (config, url) = (path.display().to_string(), redis.url());
    let args = [
        "--config",
        &config,
        "--backend",
        "redis",
        "--redis-url",
        &url,
        "--redis-prefix",
        redis.prefix(),
        "--instances",
        "2",
    ];
    let servers = [Server::start(&args), Server::start(&args)];
    let started = std::time::Instant::now();
    let _busy = Busy::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut rounds = Vec::new();
    rt.block_on(async {
        let mut clients = Vec::new();
        for s in &servers {
            clients.push(
                RateLimitServiceClient::connect(s.grpc_url())
                    .await
                    .expect("connect"),
            );
        }
        let run = std::process::id();
        for round in 0..10 {
            let caller = format!("round-{run}-{round}");
            let (next, admitted, other) = (
                Arc::new(AtomicU64::new(0)),
                Arc::new(AtomicU64::new(0)),
                Arc::new(AtomicU64::new(0)),
            );
            let mut tasks = Vec::new();
            for t in 0..64 {
                let mut client = clients[t % 2].clone();
                let (next, admitted, other, caller) = (
                    next.clone(),
                    admitted.clone(),
                    other.clone(),
                    caller.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    while next.fetch_add(1, Ordering::Relaxed) < 2_000 {
                        let req = request("burst", vec![descriptor(&[("client", &caller)])]);
                        let answer = client.should_rate_limit(req).await.expect("rpc");
                        match Code::try_from(answer.into_inner().overall_code) {
                            Ok(Code::Ok) => admitted.fetch_add(1, Ordering::Relaxed),
                            Ok(Code::OverLimit) => 0,
                            _ => other.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                }));
            }
            for t in tasks {
                t.await.expect("caller task");
            }
            rounds.push((
                admitted.load(Ordering::Relaxed),
                other.load(Ordering::Relaxed),
            ));
        }
    });
    drop(_busy);
    println!("admitted per round: {rounds:?}");
    let seconds = started.elapsed().as_secs() as usize;
    for (i, s) in servers.iter().enumerate() {
        let metrics = common::http(s.http, "GET", "/metrics", "");
        for line in metrics.body.lines().filter(|l| {
            (l.contains("source=") || l.contains("failures") || l.contains("shed"))
                && !l.starts_with('#')
        }) {
            println!("instance {i}: {line}");
        }
        if std::env::var_os("BURSTS_LOG").is_some() {
            println!("instance {i} log:\n{}", s.log());
        }
    }

    // L + N × ⌊(L - 1) / N⌋ for L = 20, N = 2.
    let bound = 20 + 2 * (19 / 2);
    for (round, &(admitted, other)) in rounds.iter().enumerate() {
        assert_eq!(other, 0, "round {round}: answers neither OK nor OVER_LIMIT");
        assert!(
            admitted <= bound,
            "round {round}: {admitted} admitted for a limit of 20, past the bound of {bound} \
             (every round: {rounds:?})"
        );
    }
    for (i, s) in servers.iter().enumerate() {
        let log = s.log();
        let warnings = log
            .lines()
            .filter(|l| l.contains("rate-limit store failed"))
            .count();
        println!("instance {i}: {warnings} store-failure warnings in {seconds} s");
        assert!(
            warnings <= seconds + 1,
            "instance {i} logged {warnings} store-failure warnings in {seconds} s: more than \
             one a second"
        );
    }
}
