//! Failover under load: the master owning a busy caller's slot is killed
//! while traffic runs through a `Limiter`. The limiter keeps answering within
//! its timeout, by its failure policy during the gap, and returns to store
//! decisions once the replica is promoted. The gap and the number of policy
//! decisions are measured and printed (`FAILOVER ...` lines).
//!
//! Beside the limiter, tasks call the store directly (no circuit breaker in
//! front) for 600 callers spread over all masters, so the store's own
//! redirect and retry traffic during the failover is measured: reroutes
//! (`MOVED` + `ASK` + retries) per store call between the kill and the
//! promotion, printed as a `FAILOVER ... reroutes` line and bounded.

mod common;

use ratelimit_core::StoreExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::Lib;
use ratelimit_core::{CircuitBreaker, FailurePolicy, Limiter, Quota, Rate, Source};
use ratelimit_testkit::redis_cluster::RedisCluster;
use ratelimit_testkit::redis_server::fresh_prefix;

const LIMITER_TIMEOUT: Duration = Duration::from_millis(300);
/// Scheduling slack on a loaded 2-core machine, on top of the timeout.
const SLACK: Duration = Duration::from_millis(250);
const TASKS: usize = 4;
/// The limiter's circuit breaker cool-down in this test.
const BREAKER_COOL_DOWN: Duration = Duration::from_millis(250);
/// Tasks calling the store directly, and the callers they cycle through.
const RAW_TASKS: usize = 8;
const RAW_CALLERS: usize = 600;
/// The bound on reroutes per store call during the failover window. The
/// goal is 2 or fewer on average.
const MAX_REROUTES_PER_CALL: f64 = 3.0;

#[derive(Debug, Clone, Copy)]
struct Sample {
    /// When the call started, from the start of the run.
    at: Duration,
    latency: Duration,
    source: Source,
}

async fn failover_under_load(lib: Lib) {
    let cluster = Arc::new(RedisCluster::start_local());
    let prefix = fresh_prefix();
    let store = common::store(
        lib,
        &cluster,
        &prefix,
        Duration::from_millis(100),
        Duration::from_millis(250),
    )
    .await;
    let quota = Quota::token_bucket(Rate::per_second(100_000), 100_000).unwrap();
    let limiter = Limiter::builder(store.clone())
        .quota(quota.clone())
        .namespace("fo")
        .unwrap()
        .failure_policy(FailurePolicy::FailOpen)
        .timeout(LIMITER_TIMEOUT)
        // Once the breaker opens, calls cost no time until it probes again:
        // a cool-down of a quarter second keeps the gap after the promotion short.
        .circuit_breaker(CircuitBreaker::new(
            Duration::from_secs(60),
            5,
            50,
            BREAKER_COOL_DOWN,
        ))
        .build()
        .unwrap();
    let caller = b"busy-caller";
    assert_eq!(limiter.check(caller).await.source, Source::Store);
    // The caller's slot from its key name: its state (a bucket full again
    // 10 µs after one call) may already have expired (2 ms) by the time
    // `KEYS` could list it.
    let slot = cluster.key_slot(store.key(b"fo~busy-caller", &quota).as_bytes());
    let master = cluster.master_for_slot(slot);
    let replica = cluster.replicas_of(&master).pop().expect("a replica");
    assert_eq!(limiter.check(caller).await.source, Source::Store);

    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (limiter, stop) = (limiter.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            // Bounded: stops by itself after 40 s whatever happens.
            while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(40) {
                let t = Instant::now();
                let d = limiter.check(caller).await;
                samples.push(Sample {
                    at: t - start,
                    latency: t.elapsed(),
                    source: d.source,
                });
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            samples
        }));
    }

    let mut raw = Vec::new();
    for t in 0..RAW_TASKS {
        let (store, stop, quota) = (store.clone(), stop.clone(), quota.clone());
        raw.push(tokio::spawn(async move {
            let mut i = t;
            // Bounded as the limiter tasks.
            while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(40) {
                let caller = format!("fo:raw-{}", i % RAW_CALLERS);
                let _ = store.decide_one(caller.as_bytes(), &quota, 1).await;
                i += RAW_TASKS;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }

    tokio::time::sleep(Duration::from_secs(1)).await;
    let before_kill = store.stats();
    let killed_at = start.elapsed();
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.kill(master.port))
        .await
        .unwrap();
    let c = cluster.clone();
    let promoted = tokio::task::spawn_blocking(move || {
        c.wait_for_new_master(slot, master.port, Duration::from_secs(25))
    })
    .await
    .unwrap()
    .expect("the cluster promotes the replica");
    let promoted_at = start.elapsed();
    let at_promotion = store.stats();
    assert_eq!(
        promoted.port, replica.port,
        "the dead master's replica took over"
    );
    // Let traffic run on the new master for a while, then stop.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await.unwrap());
    }
    for t in raw {
        t.await.unwrap();
    }
    samples.sort_by_key(|s| s.at);

    let total = samples.len();
    let policy: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.source != Source::Store)
        .collect();
    let after_kill: Vec<&Sample> = samples.iter().filter(|s| s.at >= killed_at).collect();
    let first_store_after_kill = after_kill
        .iter()
        .find(|s| s.source == Source::Store)
        .map(|s| s.at)
        .expect("store decisions return after the failover");
    let last_policy = policy.last().map(|s| s.at + s.latency);
    let max_latency = samples.iter().map(|s| s.latency).max().unwrap();
    let stats = limiter.stats();
    println!(
        "FAILOVER lib={lib:?} kill->promotion seen by fixture {:?}; kill->first store decision {:?}; \
         last policy decision ended {:?} after kill; policy decisions {} of {total} \
         (timeouts {}, errors {}, not sent while the breaker was open {}); max latency \
         {max_latency:?}; store stats {:?}",
        promoted_at - killed_at,
        first_store_after_kill - killed_at,
        last_policy.map(|t| t.saturating_sub(killed_at)),
        policy.len(),
        stats.timeouts,
        stats.errors,
        stats.short_circuits,
        store.stats(),
    );

    let calls = |s: &ratelimit_cluster::ClusterStats| s.decisions + s.errors;
    let reroutes = |s: &ratelimit_cluster::ClusterStats| s.moved + s.ask + s.retries;
    let window_calls = calls(&at_promotion) - calls(&before_kill);
    let window_reroutes = reroutes(&at_promotion) - reroutes(&before_kill);
    let per_call = window_reroutes as f64 / window_calls.max(1) as f64;
    println!(
        "FAILOVER lib={lib:?} reroutes kill->promotion ({:?}): {window_reroutes} (moved {}, ask {}, \
         retries {}) over {window_calls} store calls ({} errors): {per_call:.2} per call",
        promoted_at - killed_at,
        at_promotion.moved - before_kill.moved,
        at_promotion.ask - before_kill.ask,
        at_promotion.retries - before_kill.retries,
        at_promotion.errors - before_kill.errors,
    );
    assert!(
        per_call <= MAX_REROUTES_PER_CALL,
        "{per_call:.2} reroutes per store call during the failover"
    );

    // Always answered within the limiter's timeout.
    assert!(
        max_latency <= LIMITER_TIMEOUT + SLACK,
        "a check took {max_latency:?}, limiter timeout {LIMITER_TIMEOUT:?}"
    );
    // There was a gap, decided by the failure policy (fail open: admitted).
    assert!(!policy.is_empty(), "killing the master left no gap?");
    assert!(policy.iter().all(|s| s.source == Source::FailOpen));
    // Back to store decisions once the replica is promoted: everything in
    // the last second came from the store.
    let end = samples.last().unwrap().at;
    let tail: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at + Duration::from_secs(1) >= end)
        .collect();
    assert!(!tail.is_empty());
    assert!(
        tail.iter().all(|s| s.source == Source::Store),
        "policy decisions after the promotion: {:?}",
        tail.iter().filter(|s| s.source != Source::Store).count()
    );
    // The policy decisions cluster around the failover, not elsewhere: from
    // the kill until the clients have seen the promotion (1 s) and the
    // breaker's last cool-down has ended.
    let gap_end = promoted_at + Duration::from_secs(1) + BREAKER_COOL_DOWN;
    let outside: Vec<String> = policy
        .iter()
        .filter(|s| s.at + s.latency < killed_at || s.at > gap_end)
        .map(|s| {
            if s.at + s.latency < killed_at {
                format!("ended {:?} before the kill", killed_at - (s.at + s.latency))
            } else {
                format!("began {:?} after the window", s.at - gap_end)
            }
        })
        .collect();
    assert!(
        outside.is_empty(),
        "{} policy decisions outside the failover window (kill to promotion + 1 s + \
         cool-down {:?}): {:?}",
        outside.len(),
        gap_end - killed_at,
        &outside[..outside.len().min(8)]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn limiter_rides_out_a_master_failover() {
    failover_under_load(Lib::RedisRs).await;
    #[cfg(feature = "fred")]
    failover_under_load(Lib::Fred).await;
}
