//! A server clock that stepped forward since the store learnt it: the
//! server refuses the next call as expired (the deadline it carried, in
//! server time, was already past there) although its caller still waits.
//! The store sends it once more by the offset the refusal taught, and
//! counts it once.

mod common;

use std::time::{Duration, Instant};

use ratelimit_core::model::Charge;
use ratelimit_core::store::{Deadline, Request};
use ratelimit_core::{Quota, Rate, Store, StoreExt};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_server::RedisServer;

/// How far the server's clock seems to step forward: past the suite's
/// deadlines and the store's own bound.
const STEP: i64 = 120_000_000;

/// Makes `store` believe the server's clock is `STEP` µs behind what it
/// learnt: the deadlines it sends are then `STEP` early, as after the
/// server's clock stepped forward by that much.
fn stale(store: &RedisStore) {
    let clock = store.engine().server_clock();
    let offset = clock
        .offset(0)
        .expect("the store has learnt the server's clock");
    clock.set_offset(0, offset - STEP);
    assert_eq!(clock.offset(0), Some(offset - STEP));
}

fn per_hour(n: u64) -> Quota {
    Quota::fixed_window(Rate::per_hour(n)).unwrap()
}

async fn steps_forward(store: RedisStore) {
    let q = per_hour(3);
    // Warm: a store made from a client learns the offset from a reply.
    let first = store.decide_one(b"caller", &q, 1).await.expect("decided");
    assert_eq!(first.remaining, 2);
    let learnt = store.engine().server_clock().offset(0).unwrap();

    // One quota: the single-quota script, sent alone.
    stale(&store);
    let d = store
        .decide_one(b"caller", &q, 1)
        .await
        .expect("refused as expired by a stale offset, then sent again and decided");
    assert_eq!(d.remaining, 1, "counted once: {d:?}");
    let relearnt = store.engine().server_clock().offset(0).unwrap();
    assert!(
        (relearnt - learnt).abs() < STEP / 2,
        "the refusal taught the offset again: learnt {learnt}, then {relearnt}"
    );

    // Two quotas: the batch script, one request.
    stale(&store);
    let other = per_hour(10).named("other").unwrap();
    let charges = [Charge::new(&q, 1), Charge::new(&other, 1)];
    let ds = store
        .decide(
            Request::new(b"caller", &charges)
                .with_deadline(Deadline::within(Duration::from_secs(30))),
        )
        .await
        .expect("sent again and decided");
    let ds: Vec<_> = ds.iter().map(|d| (d.allowed, d.remaining)).collect();
    assert_eq!(ds, [(true, 0), (true, 9)], "counted once each");

    // A request whose own deadline has passed is not sent again: nothing
    // counted, the caller told so.
    let denied = store.decide_one(b"caller", &q, 1).await.unwrap();
    assert!(!denied.allowed, "the limit of 3 is used: {denied:?}");
    let late = store
        .decide(Request::new(b"late", &charges).with_deadline(Deadline::at(Instant::now())))
        .await;
    assert!(
        matches!(late, Err(ratelimit_core::StoreError::Expired)),
        "{late:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_a_call_refused_by_a_stale_clock_offset_is_sent_again_and_counted_once() {
    let server = RedisServer::start_local();
    let store = common::redis_rs_store(&server.url(), server.prefix()).await;
    steps_forward(store).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_a_call_refused_by_a_stale_clock_offset_is_sent_again_and_counted_once() {
    let server = RedisServer::start_local();
    let store = common::fred_store(&server.url(), server.prefix()).await;
    steps_forward(store).await;
}
