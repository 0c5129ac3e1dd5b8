//! Group commit: decisions waiting for the same connection go out as one
//! script call. Many callers at once on one store make far fewer script
//! calls than decisions, and every decision is still exact: a quota of L
//! admits exactly L of them under a frozen clock (and, on the server's
//! clock, a bucket that barely refills during the test).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratelimit_core::{ManualClock, Quota, Rate, StoreExt};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_server::RedisServer;

const T0: u64 = 1_800_000_000_000_000;

/// Script calls the server has run so far: single-quota and batch, by
/// `EVALSHA` or `EVAL` (`INFO commandstats`).
fn script_calls(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())
        .unwrap();
    ["cmdstat_evalsha:calls=", "cmdstat_eval:calls="]
        .iter()
        .filter_map(|p| info.lines().find_map(|l| l.strip_prefix(p)))
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// Starts `callers` tasks at once (all spawned before any decides), each
/// deciding `each` times on `q` for the key `key(caller, i)`; returns how
/// many of the decisions on the key `hot` admitted.
async fn hot_admissions(
    store: &Arc<RedisStore>,
    q: &Arc<Quota>,
    callers: u32,
    each: u32,
    key: fn(u32, u32) -> String,
) -> u64 {
    let admitted = Arc::new(AtomicU64::new(0));
    let gate = Arc::new(tokio::sync::Barrier::new(callers as usize));
    let mut tasks = Vec::new();
    for t in 0..callers {
        let (store, q, admitted, gate) = (store.clone(), q.clone(), admitted.clone(), gate.clone());
        tasks.push(tokio::spawn(async move {
            gate.wait().await;
            for i in 0..each {
                let key = key(t, i);
                let d = store
                    .decide_one(key.as_bytes(), &q, 1)
                    .await
                    .expect("decided");
                if key == "hot" {
                    admitted.fetch_add(u64::from(d.allowed), Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    admitted.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_share_script_calls_and_stay_exact() {
    let server = RedisServer::start_local();
    let clock = ManualClock::new(T0);
    let store = Arc::new(
        RedisStore::builder(server.url())
            .prefix(server.prefix())
            .clock(clock)
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .expect("connect"),
    );
    let limit = 1_000;
    let q = Arc::new(Quota::fixed_window(Rate::per_hour(limit)).unwrap());
    let before = script_calls(&server);
    // Half on one hot key, half on keys of their own.
    let admitted = hot_admissions(&store, &q, 200, 20, |t, i| {
        if i % 2 == 0 {
            "hot".to_owned()
        } else {
            format!("c{t}-{i}")
        }
    })
    .await;
    let calls = script_calls(&server) - before;
    let decisions = 200 * 20;
    println!(
        "{decisions} decisions in {calls} script calls ({:.1} per call)",
        decisions as f64 / calls as f64
    );
    assert!(
        calls * 2 < decisions,
        "{calls} script calls for {decisions} decisions: no batching"
    );
    // 2,000 calls on the hot key under a frozen clock, limit 1,000.
    assert_eq!(admitted, limit);
}

/// With batching off (`with_max_batch(1)`) every decision is its own call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_can_be_turned_off() {
    let server = RedisServer::start_local();
    let store = Arc::new(
        RedisStore::builder(server.url())
            .prefix(server.prefix())
            .build()
            .await
            .expect("connect")
            .with_max_batch(1),
    );
    let q = Arc::new(Quota::fixed_window(Rate::per_hour(1_000_000)).unwrap());
    let before = script_calls(&server);
    let mut tasks = Vec::new();
    for t in 0..50u32 {
        let (store, q) = (store.clone(), q.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..10u32 {
                store
                    .decide_one(format!("c{t}-{i}").as_bytes(), &q, 1)
                    .await
                    .expect("decided");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(script_calls(&server) - before, 500);
}

/// On the server's clock with one quota, batches take their compact form
/// (each request sends its deadline alone): still exact. A token bucket of
/// 1,000 refilling one an hour admits exactly 1,000 of 4,000 attempts on
/// one key from 200 callers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_on_the_server_clock_stay_exact() {
    let server = RedisServer::start_local();
    let store = Arc::new(
        RedisStore::builder(server.url())
            .prefix(server.prefix())
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .expect("connect"),
    );
    let q = Arc::new(Quota::token_bucket(Rate::per_hour(1), 1_000).unwrap());
    let before = script_calls(&server);
    let admitted = hot_admissions(&store, &q, 200, 20, |_, _| "hot".to_owned()).await;
    let calls = script_calls(&server) - before;
    assert!(calls * 2 < 4_000, "{calls} script calls: no batching");
    assert_eq!(admitted, 1_000);
}

/// Calls of hundreds of requests (the default bound,
/// [`engine::DEFAULT_MAX_BATCH`], allows 512): 2,000 callers at once, each
/// once on one hot key and once on its own, still exact. The calls carry
/// 200-330 requests each on an idle machine (12-19 calls); the test asks
/// for more than 64 a call on average, so that it checks large calls
/// without depending on how the machine schedules them (the bound itself
/// is a tuning choice, measured in BENCHMARKS.md, not checked here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_default_batches_stay_exact() {
    use ratelimit_redis::engine;
    let server = RedisServer::start_local();
    let store = Arc::new(
        RedisStore::builder(server.url())
            .prefix(server.prefix())
            .timeout(Duration::from_secs(10))
            .build()
            .await
            .expect("connect"),
    );
    let limit = 700;
    let q = Arc::new(Quota::token_bucket(Rate::per_hour(1), limit).unwrap());
    let before = script_calls(&server);
    // Each caller once on the hot key and once on its own.
    let admitted = hot_admissions(&store, &q, 2_000, 2, |t, i| {
        if (t + i) % 2 == 0 {
            "hot".to_owned()
        } else {
            format!("c{t}")
        }
    })
    .await;
    let calls = script_calls(&server) - before;
    let decisions = 2_000 * 2;
    println!(
        "{decisions} decisions in {calls} script calls ({:.1} per call, at most {})",
        decisions as f64 / calls as f64,
        engine::DEFAULT_MAX_BATCH
    );
    assert!(
        calls * 64 < decisions,
        "{calls} script calls for {decisions} decisions: batches of under 64"
    );
    // 2,000 attempts on the hot key, a bucket of 700 refilling one an hour.
    assert_eq!(admitted, limit);
}
