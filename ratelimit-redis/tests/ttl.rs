//! Contract 8 in Redis itself: after the derived TTL a caller's keys are
//! gone, measured in real time on a 200 ms window with the server's clock.

mod common;

use ratelimit_core::StoreExt;
use std::time::{Duration, Instant};

use ratelimit_core::{Quota, Rate};
use ratelimit_testkit::redis_server::RedisServer;

#[tokio::test(flavor = "multi_thread")]
async fn keys_are_gone_after_the_derived_ttl() {
    let server = RedisServer::start();
    let store = common::redis_rs_store(&server.url(), server.prefix()).await;
    let w = Duration::from_millis(200);
    let quotas = [
        Quota::fixed_window(Rate::new(3, w)).unwrap(),
        Quota::sliding_window(Rate::new(3, w)).unwrap(),
        Quota::sliding_log(Rate::new(3, w)).unwrap(),
        Quota::token_bucket(Rate::new(3, w), 3).unwrap(),
    ];
    let mut conn = server.connection();
    for q in &quotas {
        let key = store.key(b"ttl-caller", q);
        let mut last = None;
        for _ in 0..4 {
            last = Some(store.decide_one(b"ttl-caller", q, 1).await.unwrap());
        }
        let last = last.unwrap();
        let written = Instant::now();
        // The expiry is the derived TTL rounded up to ms, plus one ms; never
        // more than the longest state of this quota (two windows, or a
        // bucket's full refill).
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
        assert!(pttl > 0, "{}: {key} has no expiry (PTTL {pttl})", q.kind());
        let max_ms = i64::try_from(2 * w.as_millis()).unwrap() + 1;
        assert!(pttl <= max_ms, "{}: PTTL {pttl} ms > {max_ms} ms", q.kind());
        // Gone once the state is a fresh key's, polled with a bound.
        let bound = last.reset_after + Duration::from_secs(2);
        loop {
            let exists: u32 = redis::cmd("EXISTS").arg(&key).query(&mut conn).unwrap();
            if exists == 0 {
                break;
            }
            assert!(
                written.elapsed() < bound,
                "{}: {key} still there {:?} after its last write (reset_after {:?})",
                q.kind(),
                written.elapsed(),
                last.reset_after
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // And the next call is a fresh caller's.
        let d = store.decide_one(b"ttl-caller", q, 1).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, q.limit() - 1, "{}", q.kind());
    }
    // Nothing of this fixture's prefix is left once every TTL has passed.
    let bound = Instant::now() + Duration::from_secs(3);
    loop {
        let left: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", server.prefix()))
            .query(&mut conn)
            .unwrap();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < bound, "keys left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
