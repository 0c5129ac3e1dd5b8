//! Contract 9 with the server's clock: 4 store instances on separate
//! connections, 16 tasks each, one key, for a bounded time. Windows are long
//! and the bucket refills one token an hour, so the bound is exact: the
//! limit (twice it for a fixed window whose run straddled a boundary).

mod common;

use ratelimit_core::StoreExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::redis_rs_store;
use ratelimit_core::{Quota, Rate};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_server::RedisServer;

const INSTANCES: usize = 4;
const TASKS: usize = 16;
const LIMIT: u64 = 40;
const RUN: Duration = Duration::from_secs(2);

fn server_time_micros(server: &RedisServer) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME")
        .query(&mut server.connection())
        .expect("TIME");
    s * 1_000_000 + us
}

async fn hammer(stores: &[RedisStore], quota: &Quota) -> (u64, u64) {
    let admitted = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + RUN;
    let mut handles = Vec::new();
    for store in stores {
        for _ in 0..TASKS {
            let (store, quota) = (store.clone(), quota.clone());
            let (admitted, calls) = (admitted.clone(), calls.clone());
            handles.push(tokio::spawn(async move {
                // Stops by itself: at the deadline, or after enough calls.
                while Instant::now() < deadline && calls.fetch_add(1, Ordering::SeqCst) < 4_000 {
                    let d = store
                        .decide_one(b"one-hot-key", &quota, 1)
                        .await
                        .expect("no store error");
                    if d.allowed {
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
    }
    for h in handles {
        h.await.expect("task");
    }
    (
        admitted.load(Ordering::SeqCst),
        calls.load(Ordering::SeqCst),
    )
}

async fn check(lib_stores: impl AsyncFn(&str, &str) -> RedisStore, server: &RedisServer) {
    let day = Duration::from_secs(86_400);
    let hour = Duration::from_secs(3_600);
    let quotas = [
        Quota::fixed_window(Rate::new(LIMIT, day)).unwrap(),
        Quota::sliding_window(Rate::new(LIMIT, hour)).unwrap(),
        Quota::sliding_log(Rate::new(LIMIT, hour)).unwrap(),
        Quota::token_bucket(Rate::new(1, hour), LIMIT).unwrap(),
    ];
    let url = server.url();
    for quota in &quotas {
        let prefix = ratelimit_testkit::redis_server::fresh_prefix();
        let mut stores = Vec::new();
        for _ in 0..INSTANCES {
            stores.push(lib_stores(&url, &prefix).await);
        }
        let before = server_time_micros(server);
        let (admitted, calls) = hammer(&stores, quota).await;
        let after = server_time_micros(server);
        let bound = match quota.kind() {
            ratelimit_core::AlgorithmKind::FixedWindow
                if before / day.as_micros() as u64 != after / day.as_micros() as u64 =>
            {
                2 * LIMIT
            }
            _ => LIMIT,
        };
        println!("{}: {admitted} admitted of {calls} calls", quota.kind());
        assert!(
            admitted <= bound,
            "{}: {admitted} admitted, bound {bound}",
            quota.kind()
        );
        assert!(
            admitted >= LIMIT,
            "{}: only {admitted} admitted of {calls} calls; expected the limit {LIMIT}",
            quota.kind()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_many_instances_never_over_admit() {
    let server = RedisServer::start();
    check(redis_rs_store, &server).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_many_instances_never_over_admit() {
    let server = RedisServer::start();
    check(common::fred_store, &server).await;
}
