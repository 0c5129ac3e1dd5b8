//! One failure domain per master: a stopped (SIGSTOPped) master opens only
//! its own breaker. Callers whose slots live on the other masters keep
//! getting store decisions; the stopped master's callers are decided by
//! the limiter's degraded mode (the built-in fallback), in bounded time.
//! The master is paused for less than the cluster's node timeout, so no
//! failover happens: this is a slow or stuck node, not a dead one.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::Lib;
use ratelimit_core::{BreakerState, Source};
use ratelimit_testkit::redis_cluster::RedisCluster;
use ratelimit_testkit::redis_server::fresh_prefix;

/// How long the master stays stopped (below the node timeout).
const PAUSE: Duration = Duration::from_millis(1_000);
const CALLERS: usize = 300;
const TASKS: usize = 12;

#[derive(Default)]
struct Tally {
    store: AtomicU64,
    other: AtomicU64,
}

async fn one_stopped_master_affects_only_its_callers(lib: Lib) {
    let cluster = Arc::new(RedisCluster::start_local());
    let prefix = fresh_prefix();
    let store = common::store(
        lib,
        &cluster,
        &prefix,
        Duration::from_millis(50),
        Duration::from_millis(100),
    )
    .await;
    let (quota, limiter) = common::admitting_limiter(&store, "iso", 1, Duration::from_millis(50));
    // Which master serves each caller.
    let callers: Vec<(String, u16)> = (0..CALLERS)
        .map(|i| {
            let caller = format!("caller-{i}");
            let key = store.key(format!("iso~{caller}").as_bytes(), &quota);
            let port = cluster
                .master_for_slot(cluster.key_slot(key.as_bytes()))
                .port;
            (caller, port)
        })
        .collect();
    for (caller, _) in &callers {
        assert_eq!(limiter.check(caller).await.source, Source::Store, "warm-up");
    }
    let stopped = callers[0].1;
    let tallies: Arc<HashMap<u16, Tally>> = Arc::new(
        cluster
            .masters()
            .iter()
            .map(|m| (m.port, Tally::default()))
            .collect(),
    );
    cluster.pause(stopped);
    let paused_at = Instant::now();
    let callers = Arc::new(callers);
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (limiter, callers, tallies) = (limiter.clone(), callers.clone(), tallies.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            while paused_at.elapsed() < PAUSE - Duration::from_millis(100) {
                let (caller, port) = &callers[i % callers.len()];
                let d = limiter.check(caller).await;
                let tally = &tallies[port];
                if d.source == Source::Store {
                    tally.store.fetch_add(1, Ordering::Relaxed);
                } else {
                    tally.other.fetch_add(1, Ordering::Relaxed);
                }
                i += TASKS;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let states = store.engine().domains().states();
    {
        use ratelimit_core::StoreExt;
        let probe = store
            .decide_one(format!("iso~{}", callers[0].0).as_bytes(), &quota, 1)
            .await;
        println!("ISOLATION {lib:?} a call on the stopped master: {probe:?}");
    }
    cluster.resume(stopped);
    let mut healthy = (0, 0);
    for (port, tally) in tallies.iter() {
        let (s, o) = (
            tally.store.load(Ordering::Relaxed),
            tally.other.load(Ordering::Relaxed),
        );
        println!("ISOLATION {lib:?} master {port}: {s} from the store, {o} degraded");
        if *port != stopped {
            healthy.0 += s;
            healthy.1 += o;
        }
    }
    println!("ISOLATION {lib:?} breakers: {states:?}");
    let share = healthy.0 as f64 / (healthy.0 + healthy.1).max(1) as f64;
    assert!(
        healthy.0 >= 200,
        "too few calls on the healthy masters ({healthy:?}): the test proves nothing"
    );
    assert!(
        share >= 0.99,
        "callers on the healthy masters got {:.2} % of their decisions from the store",
        share * 100.0
    );
    let stopped_name = format!("127.0.0.1:{stopped}");
    for (name, state) in &states {
        if *name == stopped_name {
            assert_ne!(*state, BreakerState::Closed, "the stopped master's breaker");
        } else {
            assert_eq!(*state, BreakerState::Closed, "{name}'s breaker");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_rs_one_stopped_master_affects_only_its_callers() {
    one_stopped_master_affects_only_its_callers(Lib::RedisRs).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fred_one_stopped_master_affects_only_its_callers() {
    one_stopped_master_affects_only_its_callers(Lib::Fred).await;
}
