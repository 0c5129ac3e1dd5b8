//! Several quotas in one call: one script call per decision, whatever the
//! number of quotas, counted on a real server through `INFO commandstats`
//! (`EVALSHA` and `EVAL` calls), through a `Limiter`, with both clients.

mod common;

use std::time::Duration;

use ratelimit_core::{Limiter, Quota, Rate, Store};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_server::RedisServer;

/// Script calls so far: `EVALSHA` and `EVAL`.
fn script_calls(server: &RedisServer) -> u64 {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())
        .expect("INFO commandstats");
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split(',')
                .find_map(|f| f.split("calls=").nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

fn quotas() -> [Quota; 3] {
    let hour = Duration::from_secs(3600);
    [
        Quota::fixed_window(Rate::new(100, hour))
            .unwrap()
            .named("a")
            .unwrap(),
        Quota::sliding_log(Rate::new(3, hour))
            .unwrap()
            .named("b")
            .unwrap(),
        Quota::token_bucket(Rate::new(100, hour), 100)
            .unwrap()
            .named("c")
            .unwrap(),
    ]
}

async fn one_script_call_per_decision(server: &RedisServer, store: RedisStore) {
    assert!(store.atomic_all());
    let [a, b, c] = quotas();
    let limiters = [
        Limiter::builder(store.clone())
            .quota(a.clone())
            .build()
            .unwrap(),
        Limiter::builder(store.clone())
            .quota(a.clone())
            .quota(b.clone())
            .build()
            .unwrap(),
        Limiter::builder(store.clone())
            .quota(a)
            .quota(b)
            .quota(c)
            .build()
            .unwrap(),
    ];
    for (i, limiter) in limiters.iter().enumerate() {
        let n = i + 1;
        let caller = format!("caller-{n}");
        // The first call may load the script (NOSCRIPT, then the source).
        limiter.check_all("warm-up", 1).await.unwrap();
        for call in 0..5 {
            let before = script_calls(server);
            let verdict = limiter.check_all(&caller, 1).await.unwrap();
            assert_eq!(
                script_calls(server) - before,
                1,
                "{n} quotas, call {call}: one script call per decision"
            );
            assert_eq!(verdict.quotas.len(), n);
            // The sliding log "b" admits 3 per hour: the 4th call is denied
            // with 2 or 3 quotas, and counted in none of them.
            let admitted = n == 1 || call < 3;
            assert_eq!(verdict.allowed(), admitted, "{n} quotas, call {call}");
            let counted = if n == 1 { call + 1 } else { call.min(2) + 1 };
            assert_eq!(
                verdict.quotas[0].remaining,
                100 - counted as u64,
                "{n} quotas, call {call}: a denied call is counted in no quota"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_makes_one_script_call_per_decision() {
    // A server of our own: nobody else's calls in the counters.
    let server = RedisServer::start_local();
    let store = common::redis_rs_store(&server.url(), "multi").await;
    one_script_call_per_decision(&server, store).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_makes_one_script_call_per_decision() {
    let server = RedisServer::start_local();
    let store = common::fred_store(&server.url(), "multi").await;
    one_script_call_per_decision(&server, store).await;
}
