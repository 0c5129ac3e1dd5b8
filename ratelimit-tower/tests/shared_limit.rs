//! Two app servers, one limit? On Redis, yes; on the local store, no: the
//! per-process warning of `ratelimit-local`, demonstrated over HTTP.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get as route_get;
use common::*;
use http::{HeaderName, StatusCode};
use ratelimit_core::{ManualClock, Store};
use ratelimit_local::LocalStore;
use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_server::RedisServer;
use ratelimit_tower::{FailurePolicy, KeyExtractor, Limiter, Quota, Rate, RateLimitLayer};

const BURST: u64 = 20;

/// One app server ("instance") over its own store handle.
async fn instance(store: impl Store + 'static, clock: &ManualClock) -> SocketAddr {
    let plan = Quota::token_bucket(Rate::per_minute(100), BURST)
        .unwrap()
        .named("api")
        .unwrap();
    let limiter = Limiter::builder(store)
        .quota(plan)
        .namespace("shared-test")
        .unwrap()
        // Fail closed with a generous timeout: a slow CI machine must not
        // turn a store decision into a policy decision and blur the count.
        .failure_policy(FailurePolicy::FailClosed)
        .timeout(Duration::from_secs(5))
        .clock(clock.clone())
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(limiter)
        .key(KeyExtractor::header(HeaderName::from_static("x-api-key")));
    serve(
        Router::new()
            .route("/", route_get(|| async { "ok" }))
            .layer(layer),
    )
    .await
}

/// Sends `2 * BURST` requests alternating between the two servers at one
/// instant; returns how many each admitted.
async fn burst_across(a: SocketAddr, b: SocketAddr) -> (u64, u64) {
    let mut admitted = (0, 0);
    for i in 0..2 * BURST {
        let target = if i % 2 == 0 { a } else { b };
        let r = get(target, "/", &[("x-api-key", "shared-customer")]).await;
        match r.status {
            StatusCode::OK => {
                if i % 2 == 0 {
                    admitted.0 += 1
                } else {
                    admitted.1 += 1
                }
            }
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(r.int("x-ratelimit-remaining"), Some(0));
            }
            other => panic!("unexpected status {other}: {}", r.text()),
        }
    }
    admitted
}

#[tokio::test]
async fn two_servers_on_the_local_store_each_enforce_their_own_limit() {
    let clock = ManualClock::new(T0);
    let a = instance(LocalStore::with_clock(clock.clone()), &clock).await;
    let b = instance(LocalStore::with_clock(clock.clone()), &clock).await;
    let (on_a, on_b) = burst_across(a, b).await;
    // Per-process protection only: with 2 instances a burst of 20 becomes 40.
    assert_eq!((on_a, on_b), (BURST, BURST));
}

#[tokio::test]
async fn two_servers_sharing_one_redis_enforce_one_limit() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = || async {
        RedisStore::builder(redis.url())
            .prefix(redis.prefix())
            .clock(clock.clone())
            .build()
            .await
            .expect("connect to the test redis-server")
    };
    // Two stores: two separate connections, as two app servers would have.
    let a = instance(store().await, &clock).await;
    let b = instance(store().await, &clock).await;
    let (on_a, on_b) = burst_across(a, b).await;
    assert_eq!(on_a + on_b, BURST, "admitted {on_a} on A and {on_b} on B");
    assert_eq!((on_a, on_b), (BURST / 2, BURST / 2));

    // The refill is shared too: 0.6 s later exactly one more, on either.
    clock.advance(Duration::from_millis(600));
    assert_eq!(
        get(b, "/", &[("x-api-key", "shared-customer")])
            .await
            .status,
        StatusCode::OK
    );
    let r = get(a, "/", &[("x-api-key", "shared-customer")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.int("retry-after"), Some(1));
}
