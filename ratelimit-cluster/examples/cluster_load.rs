//! Load generator: decisions per second and latency of a store on a real
//! 6-node Redis Cluster, or on a single node with the same generator for
//! comparison.
//!
//! ```text
//! cargo run --release -p ratelimit-cluster --all-features --example cluster_load -- \
//!     [--target cluster|single] [--lib redis-rs|fred] [--tasks 64] [--secs 5] [--callers 10000]
//! ```
//!
//! Starts the servers itself (or uses `RATELIMIT_REDIS_CLUSTER_URLS` /
//! `RATELIMIT_REDIS_URL`), runs `--tasks` concurrent tasks for `--secs`
//! seconds, each deciding for a random caller out of `--callers` with a
//! token bucket of 100/s, burst 20, and prints one line of figures. Every
//! task stops by itself at the deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimit_cluster::ClusterStore;
use ratelimit_core::{Quota, Rate, Store, StoreExt};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_cluster::RedisCluster;
use ratelimit_testkit::redis_server::RedisServer;

struct Args {
    target: String,
    lib: String,
    tasks: usize,
    secs: u64,
    callers: u64,
}

fn args() -> Args {
    let mut a = Args {
        target: "cluster".into(),
        lib: "redis-rs".into(),
        tasks: 64,
        secs: 5,
        callers: 10_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--target" => a.target = value,
            "--lib" => a.lib = value,
            "--tasks" => a.tasks = value.parse().expect("--tasks N"),
            "--secs" => a.secs = value.parse().expect("--secs N"),
            "--callers" => a.callers = value.parse().expect("--callers N"),
            _ => panic!("unknown flag {flag}"),
        }
    }
    a
}

const TIMEOUT: Duration = Duration::from_secs(1);

#[cfg(feature = "fred")]
async fn fred_cluster(cluster: &RedisCluster) -> ClusterStore {
    use ratelimit_cluster::fred_client::prelude::*;
    let config = Config {
        server: ServerConfig::new_clustered(cluster.addrs()),
        ..Config::default()
    };
    let client = Builder::from_config(config)
        .with_performance_config(|p| p.default_command_timeout = TIMEOUT)
        .with_connection_config(|c| c.max_command_attempts = 1)
        .build()
        .expect("fred client");
    client.init().await.expect("fred connects");
    let store = ClusterStore::from_fred(client).with_timeout(2 * TIMEOUT);
    store.load_scripts().await.expect("SCRIPT LOAD");
    store
}

#[cfg(feature = "fred")]
async fn fred_single(server: &RedisServer) -> RedisStore {
    use ratelimit_redis::fred_client::prelude::*;
    let client = Builder::from_config(Config::from_url(&server.url()).expect("URL"))
        .with_performance_config(|p| p.default_command_timeout = TIMEOUT)
        .build()
        .expect("fred client");
    client.init().await.expect("fred connects");
    RedisStore::from_fred(client).with_timeout(2 * TIMEOUT)
}

#[tokio::main]
async fn main() {
    let a = args();
    let mut _cluster = None;
    let mut _server = None;
    let store: Arc<dyn Store> = match (a.target.as_str(), a.lib.as_str()) {
        ("cluster", "redis-rs") => {
            let c = RedisCluster::start();
            let s = ClusterStore::builder(c.urls())
                .prefix(c.prefix())
                .response_timeout(TIMEOUT)
                .connection_timeout(TIMEOUT)
                .timeout(2 * TIMEOUT)
                .build()
                .await
                .expect("connect to the cluster");
            _cluster = Some(c);
            Arc::new(s)
        }
        #[cfg(feature = "fred")]
        ("cluster", "fred") => {
            let c = RedisCluster::start();
            let s = fred_cluster(&c).await.with_prefix(c.prefix()).unwrap();
            _cluster = Some(c);
            Arc::new(s)
        }
        ("single", "redis-rs") => {
            let srv = RedisServer::start();
            let s = RedisStore::builder(srv.url())
                .prefix(srv.prefix())
                .response_timeout(TIMEOUT)
                .connection_timeout(TIMEOUT)
                .timeout(2 * TIMEOUT)
                .build()
                .await
                .expect("connect to the server");
            _server = Some(srv);
            Arc::new(s)
        }
        #[cfg(feature = "fred")]
        ("single", "fred") => {
            let srv = RedisServer::start();
            let s = fred_single(&srv).await.with_prefix(srv.prefix()).unwrap();
            _server = Some(srv);
            Arc::new(s)
        }
        (t, l) => panic!("unsupported --target {t} --lib {l} (fred needs --features fred)"),
    };
    let quota = Quota::token_bucket(Rate::per_second(100), 20).unwrap();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(a.secs);
    let mut tasks = Vec::new();
    for t in 0..a.tasks {
        let (store, quota, callers) = (store.clone(), quota.clone(), a.callers);
        tasks.push(tokio::spawn(async move {
            let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64).wrapping_mul(0xA24B_AED4_963E_E407);
            let mut lat = Vec::new();
            let (mut allowed, mut errors) = (0u64, 0u64);
            while Instant::now() < deadline {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let caller = format!("caller-{}", rng % callers);
                let t0 = Instant::now();
                match store.decide_one(caller.as_bytes(), &quota, 1).await {
                    Ok(d) => allowed += u64::from(d.allowed),
                    Err(_) => errors += 1,
                }
                lat.push(u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX));
            }
            (lat, allowed, errors)
        }));
    }
    let mut lat = Vec::new();
    let (mut allowed, mut errors) = (0, 0);
    for t in tasks {
        let (l, al, e) = t.await.unwrap();
        lat.extend(l);
        allowed += al;
        errors += e;
    }
    let elapsed = start.elapsed().as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() as f64 - 1.0) * p) as usize];
    println!(
        "target={} lib={} tasks={} callers={} secs={:.1}: {} decisions, {:.0}/s, \
         allowed {allowed}, errors {errors}, latency p50 {} µs p99 {} µs max {} µs",
        a.target,
        a.lib,
        a.tasks,
        a.callers,
        elapsed,
        lat.len(),
        lat.len() as f64 / elapsed,
        pct(0.5),
        pct(0.99),
        lat.last().copied().unwrap_or(0),
    );
}
