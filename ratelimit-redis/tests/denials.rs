//! A denial writes nothing: counted on a real server through its dirty
//! counter (`rdb_changes_since_last_save`, every write command adds to it)
//! and the write commands in `INFO commandstats`, for every algorithm, with
//! the server's clock and with an injected clock that moves the state into
//! a later window, refills part of a bucket, or leaves expired log entries
//! behind before the denials.

mod common;

use ratelimit_core::StoreExt;
use std::time::Duration;

use ratelimit_core::{ManualClock, Quota, Rate};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_server::RedisServer;

const T0: u64 = 1_800_000_000_000_000;

fn info(server: &RedisServer, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query(&mut server.connection())
        .expect("INFO")
}

/// Writes so far: the dirty counter, and the calls of every write command
/// the scripts use.
fn writes(server: &RedisServer) -> (u64, u64) {
    let dirty = info(server, "persistence")
        .lines()
        .find_map(|l| l.strip_prefix("rdb_changes_since_last_save:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("rdb_changes_since_last_save");
    let stats = info(server, "commandstats");
    let calls = stats
        .lines()
        .filter(|l| {
            [
                "set",
                "psetex",
                "zadd",
                "zrem",
                "zremrangebyscore",
                "zremrangebyrank",
                "pexpire",
                "hset",
                "del",
                "incrby",
            ]
            .iter()
            .any(|c| l.starts_with(&format!("cmdstat_{c}:")))
        })
        .filter_map(|l| {
            l.split(',')
                .find_map(|f| f.split("calls=").nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum();
    (dirty, calls)
}

async fn deny_many(
    server: &RedisServer,
    store: &RedisStore,
    caller: &[u8],
    quota: &Quota,
    cost: u64,
) {
    let before = writes(server);
    for _ in 0..25 {
        let d = store.decide_one(caller, quota, cost).await.unwrap();
        assert!(!d.allowed, "{quota:?}: expected a denial");
    }
    assert_eq!(
        writes(server),
        before,
        "{quota:?}: denials wrote to the server (dirty counter, write commands)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn denials_write_nothing() {
    // A server of our own: nobody else's writes in the counters.
    let server = RedisServer::start_local();
    let url = server.url();
    let hour = Duration::from_secs(3600);
    let quotas = [
        Quota::fixed_window(Rate::new(3, hour)).unwrap(),
        Quota::sliding_window(Rate::new(3, hour)).unwrap(),
        Quota::sliding_log(Rate::new(3, hour)).unwrap(),
        Quota::token_bucket(Rate::new(1, hour), 3).unwrap(),
        Quota::token_bucket(Rate::new(7, hour), 3)
            .unwrap()
            .named("seven")
            .unwrap(),
    ];

    // The server's clock: spend the limit, then deny.
    let store = common::redis_rs_store(&url, "server-clock").await;
    for q in &quotas {
        let before = writes(&server);
        assert!(store.decide_one(b"c", q, 3).await.unwrap().allowed);
        let after = writes(&server);
        assert!(
            after.0 > before.0 && after.1 > before.1,
            "the counters see an admission's writes"
        );
        deny_many(&server, &store, b"c", q, 1).await;
    }

    // An injected clock, moving the state on before the denials.
    let clock = ManualClock::new(T0);
    let store = common::redis_rs_store(&url, "injected")
        .await
        .with_clock(clock.clone());
    let w = 3_600_000_000u64;

    // Fixed window: denied in the window it spent.
    clock.set(T0 + 10);
    assert!(
        store
            .decide_one(b"fw", &quotas[0], 3)
            .await
            .unwrap()
            .allowed
    );
    clock.set(T0 + w - 1);
    deny_many(&server, &store, b"fw", &quotas[0], 1).await;

    // Sliding window: spent late in one window, denied early in the next
    // (the state rolls on read, and is not written back).
    clock.set(T0 + w - 10);
    assert!(
        store
            .decide_one(b"sw", &quotas[1], 3)
            .await
            .unwrap()
            .allowed
    );
    clock.set(T0 + w + w / 10);
    deny_many(&server, &store, b"sw", &quotas[1], 1).await;

    // Sliding log: one entry has left the window, the others still deny.
    clock.set(T0);
    assert!(
        store
            .decide_one(b"sl", &quotas[2], 1)
            .await
            .unwrap()
            .allowed
    );
    clock.set(T0 + 1000);
    assert!(
        store
            .decide_one(b"sl", &quotas[2], 2)
            .await
            .unwrap()
            .allowed
    );
    clock.set(T0 + w + 10);
    deny_many(&server, &store, b"sl", &quotas[2], 2).await;

    // Token buckets: part of a token refilled, not enough for a call.
    for (q, name) in [(&quotas[3], &b"tb1"[..]), (&quotas[4], b"tb7")] {
        clock.set(T0);
        assert!(store.decide_one(name, q, 3).await.unwrap().allowed);
        clock.set(T0 + w / 14);
        deny_many(&server, &store, name, q, 1).await;
    }
}
