//! The demo's table says what the design promises.

use std::sync::Arc;

use ratelimit_core::{AlgorithmKind, ManualClock, Store};
use ratelimit_examples::demo::{self, Scenario};
use ratelimit_local::LocalStore;

#[tokio::test]
async fn boundary_burst_row_shows_the_problem_and_the_fixes() {
    let clock = ManualClock::new(demo::NOON);
    let store: Arc<dyn Store> = Arc::new(LocalStore::with_clock(clock.clone()));
    let rows = demo::run_all(store, &clock, "t").await;
    assert_eq!(rows.len(), 16);
    let row = |s: Scenario, k: AlgorithmKind| {
        let q = demo::quotas()
            .into_iter()
            .position(|q| q.kind() == k)
            .unwrap();
        let i = Scenario::ALL.iter().position(|&x| x == s).unwrap() * 4 + q;
        rows[i].clone()
    };
    let fw = row(Scenario::BoundaryBurst, AlgorithmKind::FixedWindow);
    assert_eq!(fw.admitted, 200, "{fw:?}");
    assert_eq!(fw.max_trailing_minute, 200);
    assert!(
        fw.busiest_span <= 2_000_000,
        "200 admitted within two seconds: {fw:?}"
    );
    for k in [AlgorithmKind::SlidingLog, AlgorithmKind::SlidingWindow] {
        let r = row(Scenario::BoundaryBurst, k);
        assert!(r.max_trailing_minute <= 100, "{r:?}");
    }
    // The sliding log is exact under every shape.
    for s in Scenario::ALL {
        let r = row(s, AlgorithmKind::SlidingLog);
        assert!(r.max_trailing_minute <= 100, "{r:?}");
    }
    // Token bucket: at most burst + rate × span.
    let tb = row(Scenario::BoundaryBurst, AlgorithmKind::TokenBucket);
    assert_eq!(tb.admitted, 21);
    assert_eq!(tb.first_retry.map(|(h, _)| h), Some(1));
    // A steady client at 90% of its plan is never denied by any algorithm.
    for k in AlgorithmKind::ALL {
        assert_eq!(row(Scenario::Steady90, k).denied, 0);
    }
    let table = demo::render(&rows);
    assert!(table.contains("boundary burst"), "{table}");
}

#[test]
fn trailing_window_count_is_brute_force_right() {
    let (n, span) = demo::max_in_trailing(&[0, 10, 59, 60, 61, 200], 60);
    assert_eq!((n, span), (4, 51));
}

#[tokio::test]
async fn redis_prints_the_same_table() {
    use ratelimit_testkit::redis_server::{RedisServer, fresh_prefix};
    let server = RedisServer::start();
    let local_clock = ManualClock::new(demo::NOON);
    let local: Arc<dyn Store> = Arc::new(LocalStore::with_clock(local_clock.clone()));
    let local_rows = demo::run_all(local, &local_clock, "t").await;

    let clock = ManualClock::new(demo::NOON);
    // Generous timeouts: on a loaded machine the default 30 ms reply timeout
    // can fire, and a decision by failure policy would change the table.
    let slow = std::time::Duration::from_secs(5);
    let redis: Arc<dyn Store> = Arc::new(
        ratelimit_redis::RedisStore::builder(server.url())
            .prefix(&fresh_prefix())
            .clock(clock.clone())
            .response_timeout(slow)
            .connection_timeout(slow)
            .timeout(2 * slow)
            .build()
            .await
            .expect("connect to the test server"),
    );
    let redis_rows = demo::run_all(redis, &clock, "t").await;
    assert_eq!(demo::render(&local_rows), demo::render(&redis_rows));
}
