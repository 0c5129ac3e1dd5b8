//! A paused Redis (SIGSTOP, 2 s) under load: no call the limiter answered
//! by its failure policy is counted once Redis resumes, with either client
//! and either policy (see `ratelimit_testkit::stall`).

use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::ManualClock;
use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_server::RedisServer;
use ratelimit_testkit::stall::answered_by_policy_counts_nothing;

/// A fixed instant for the injected clock: each caller's count is exact.
const T0: u64 = 1_800_000_000_000_000;

const PAUSE: Duration = Duration::from_secs(2);

async fn check(server: &RedisServer, store: RedisStore) {
    let store = store.with_clock(ManualClock::new(T0));
    let report = answered_by_policy_counts_nothing(
        Arc::new(store),
        PAUSE,
        || server.pause(),
        || server.resume(),
    )
    .await;
    println!("{report:?}");
    report.open.check("fail open").unwrap();
    report.closed.check("fail closed").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_rs_calls_answered_by_policy_during_a_pause_are_never_counted() {
    let server = RedisServer::start_local();
    // The defaults: 30 ms per reply, 50 ms per connection, 140 ms per call.
    let store = RedisStore::builder(server.url())
        .prefix(server.prefix())
        .build()
        .await
        .expect("connect");
    check(&server, store).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fred_calls_answered_by_policy_during_a_pause_are_never_counted() {
    use ratelimit_redis::fred_client::prelude::*;
    let server = RedisServer::start_local();
    let config = Config::from_url(&server.url()).unwrap();
    let client = Builder::from_config(config)
        .with_performance_config(|p| p.default_command_timeout = Duration::from_millis(50))
        .with_connection_config(|c| c.connection_timeout = Duration::from_millis(50))
        .set_policy(ReconnectPolicy::new_constant(0, 50))
        .build()
        .unwrap();
    client.init().await.unwrap();
    let store = RedisStore::from_fred(client)
        .with_prefix(server.prefix())
        .unwrap();
    check(&server, store).await;
}
