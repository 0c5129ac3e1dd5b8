//! Several quotas in one call on a cluster: one script run per decision,
//! whatever the number of quotas, counted on the servers through
//! `INFO commandstats` (`EVALSHA` and `EVAL` calls, summed over every
//! node), through a `Limiter`, with both clients.

mod common;

use std::time::Duration;

use common::{Lib, SLOW};
use ratelimit_core::{Limiter, Quota, Rate, Store};
use ratelimit_testkit::redis_cluster::RedisCluster;
use ratelimit_testkit::redis_server::fresh_prefix;

/// Script calls so far on every node: `EVALSHA` and `EVAL`.
fn script_calls(cluster: &RedisCluster) -> u64 {
    cluster
        .ports()
        .into_iter()
        .map(|port| {
            let stats: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut cluster.connection(port))
                .expect("INFO commandstats");
            stats
                .lines()
                .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
                .filter_map(|l| {
                    l.split(',')
                        .find_map(|f| f.split("calls=").nth(1))
                        .and_then(|v| v.parse::<u64>().ok())
                })
                .sum::<u64>()
        })
        .sum()
}

async fn one_script_run_per_decision(cluster: &RedisCluster, lib: Lib) {
    let store = common::store(lib, cluster, &fresh_prefix(), SLOW, 2 * SLOW).await;
    assert!(store.capabilities().atomic);
    let hour = Duration::from_secs(3600);
    let a = Quota::fixed_window(Rate::new(100, hour))
        .unwrap()
        .named("a")
        .unwrap();
    let b = Quota::sliding_log(Rate::new(3, hour))
        .unwrap()
        .named("b")
        .unwrap();
    let c = Quota::token_bucket(Rate::new(100, hour), 100)
        .unwrap()
        .named("c")
        .unwrap();
    let limiters = [
        Limiter::builder(store.clone())
            .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
            .quota(a.clone())
            .build()
            .unwrap(),
        Limiter::builder(store.clone())
            .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
            .quota(a.clone())
            .quota(b.clone())
            .build()
            .unwrap(),
        Limiter::builder(store.clone())
            .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
            .quota(a)
            .quota(b)
            .quota(c)
            .build()
            .unwrap(),
    ];
    for (i, limiter) in limiters.iter().enumerate() {
        let n = i + 1;
        let caller = format!("caller-{n}");
        // The first call on a master may load the script (NOSCRIPT).
        limiter.check_all(&caller, 1).await.unwrap();
        for call in 1..6 {
            let before = script_calls(cluster);
            let verdict = limiter.check_all(&caller, 1).await.unwrap();
            assert_eq!(
                script_calls(cluster) - before,
                1,
                "{lib:?}, {n} quotas, call {call}: one script run per decision"
            );
            assert_eq!(verdict.quotas.len(), n);
            let admitted = n == 1 || call < 3;
            assert_eq!(
                verdict.allowed(),
                admitted,
                "{lib:?}, {n} quotas, call {call}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn one_script_run_per_decision_with_both_clients() {
    // A cluster of our own: nobody else's calls in the counters.
    let cluster = RedisCluster::start_local();
    one_script_run_per_decision(&cluster, Lib::RedisRs).await;
    #[cfg(feature = "fred")]
    one_script_run_per_decision(&cluster, Lib::Fred).await;
}
