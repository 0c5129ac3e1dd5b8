//! A paused Redis (SIGSTOP, 2 s) under load: no call the limiter answered
//! by its failure policy is counted once Redis resumes, with either client
//! and either policy (see `ratelimit_testkit::stall`).

use ratelimit_core::StoreExt;
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

/// Beyond the bound on calls sent and not answered, calls fail at once
/// instead of queueing on the paused connection; a probe per timeout finds
/// the server back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_connection_queues_a_bounded_number_of_calls() {
    use ratelimit_core::{Quota, Rate};
    let server = RedisServer::start_local();
    let store = RedisStore::builder(server.url())
        .prefix(server.prefix())
        .max_in_flight(20)
        .timeout(Duration::from_millis(30))
        .build()
        .await
        .expect("connect");
    let q = Quota::fixed_window(Rate::per_hour(1_000_000)).unwrap();
    store.decide_one(b"warm", &q, 1).await.expect("warm-up");
    let calls_before = evalsha_calls(&server);
    server.pause();
    let (mut timed_out, mut refused) = (0, 0);
    for i in 0..200 {
        match store.decide_one(format!("c{i}").as_bytes(), &q, 1).await {
            Err(e) if e.to_string().contains("failing fast") => refused += 1,
            // Sent, and timed out (the store's bound or the client's).
            Err(e) if e.is_transient() => timed_out += 1,
            other => panic!("unexpected answer from a paused server: {other:?}"),
        }
    }
    assert!(
        store.engine().in_flight() <= 20 + 2,
        "{}",
        store.engine().in_flight()
    );
    server.resume();
    // The probe finds the server back within a bounded number of calls.
    let mut back = false;
    for _ in 0..500 {
        if store.decide_one(b"after", &q, 1).await.is_ok() {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(back, "the store never answered after the pause");
    let sent = evalsha_calls(&server) - calls_before;
    println!("timed out {timed_out}, refused at once {refused}, scripts run {sent}");
    assert!(refused >= 150, "only {refused} of 200 calls failed fast");
    // What reached the server: the bounded backlog and the probes.
    assert!(sent <= 20 + timed_out + 10, "{sent} scripts ran");
    assert!(
        timed_out <= 20 + 10,
        "{timed_out} calls were sent to a paused server"
    );
}

/// `EVALSHA` calls the server has run so far (`INFO commandstats`).
fn evalsha_calls(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
