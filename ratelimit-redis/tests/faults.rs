//! Faults against a real, local redis-server: paused (SIGSTOP), killed and
//! restarted, script cache flushed. Real time, bounded polling, no sleeps to
//! move time.

mod common;

use ratelimit_core::StoreExt;
use std::time::{Duration, Instant};

use ratelimit_core::{FailurePolicy, Limiter, Quota, Rate, Source, Store};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_server::RedisServer;

const LIMITER_TIMEOUT: Duration = Duration::from_millis(50);
/// Scheduling slack on a loaded CI machine.
const MARGIN: Duration = Duration::from_millis(150);

fn quota() -> Quota {
    Quota::token_bucket(Rate::per_second(1_000), 1_000).unwrap()
}

async fn store(server: &RedisServer) -> RedisStore {
    // The defaults: 30 ms per reply, 50 ms per connection attempt.
    RedisStore::builder(server.url())
        .prefix(server.prefix())
        .build()
        .await
        .expect("connect")
}

fn limiter(store: RedisStore, policy: FailurePolicy) -> Limiter {
    Limiter::builder(store)
        .quota(quota())
        .failure_policy(policy)
        .timeout(LIMITER_TIMEOUT)
        .build()
        .unwrap()
}

/// Polls `f` until it returns true, at most `bound`.
async fn eventually(bound: Duration, mut f: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_paused_server_decisions_follow_the_policy_within_the_timeout() {
    let server = RedisServer::start_local();
    let s = store(&server).await;
    paused(&server, s).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_paused_server_decisions_follow_the_policy_within_the_timeout() {
    let server = RedisServer::start_local();
    let s = fred_fast(&server).await;
    paused(&server, s).await;
}

async fn paused(server: &RedisServer, s: RedisStore) {
    // The store bounds its own calls by the request's deadline, so the
    // limiter arms no timer: the bound below is the store's.
    assert!(s.capabilities().is_bounded());
    let open = limiter(s.clone(), FailurePolicy::FailOpen);
    let closed = limiter(s.clone(), FailurePolicy::FailClosed);
    assert_eq!(open.check("warm").await.source, Source::Store);
    assert_eq!(closed.check("warm").await.source, Source::Store);

    server.pause();
    for i in 0..10 {
        for (limiter, allowed, source) in [
            (&open, true, Source::FailOpen),
            (&closed, false, Source::FailClosed),
        ] {
            let start = Instant::now();
            let d = limiter.check(format!("caller-{i}")).await;
            let took = start.elapsed();
            assert!(
                took <= LIMITER_TIMEOUT + MARGIN,
                "decision took {took:?} with a {LIMITER_TIMEOUT:?} timeout"
            );
            assert_eq!((d.allowed, d.source), (allowed, source));
        }
    }
    // Many at once: every one still bounded.
    let start = Instant::now();
    let all = futures_join(&open, 32).await;
    assert!(
        start.elapsed() <= LIMITER_TIMEOUT + MARGIN,
        "took {:?}",
        start.elapsed()
    );
    assert!(
        all.iter()
            .all(|d| d.allowed && d.source == Source::FailOpen)
    );
    // Every one of the 42 answered without the store: timed out, or (once
    // the node's breaker opened) refused at once without being sent.
    let st = open.stats();
    assert_eq!(st.timeouts + st.errors, 42, "{st:?}");
    let states = s.engine().domains().states();
    assert!(
        states
            .iter()
            .any(|(_, state)| *state != ratelimit_core::BreakerState::Closed),
        "the node's breaker never opened: {states:?}"
    );

    server.resume();
    assert!(
        eventually(Duration::from_secs(5), async || {
            open.check("after").await.source == Source::Store
                && closed.check("after").await.source == Source::Store
        })
        .await,
        "no store decision within 5 s of resuming"
    );
}

async fn futures_join(limiter: &Limiter, n: usize) -> Vec<ratelimit_core::Decision> {
    let mut handles = Vec::new();
    for i in 0..n {
        let l = limiter.clone();
        handles.push(tokio::spawn(
            async move { l.check(format!("many-{i}")).await },
        ));
    }
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

async fn survives_restart(server: &mut RedisServer, store: &dyn Store) {
    let q = quota();
    let d = store
        .decide_one(b"caller", &q, 1)
        .await
        .expect("first call");
    assert!(d.allowed);

    server.kill();
    let start = Instant::now();
    let e = store
        .decide_one(b"caller", &q, 1)
        .await
        .expect_err("no server, no decision");
    assert!(e.is_transient(), "a lost server is transient: {e}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "error took {:?}",
        start.elapsed()
    );

    // Same port, empty server: no data, no scripts. No new store is built.
    server.restart();
    assert!(
        eventually(Duration::from_secs(10), async || store
            .decide_one(b"caller", &q, 1)
            .await
            .is_ok())
        .await,
        "the store did not reconnect within 10 s"
    );
    let loaded: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        // The script the store sends a lone request of `q` with: the
        // quota's own.
        .arg(ratelimit_redis::scripts::single(&q).sha1())
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(
        loaded,
        [true],
        "the script was reloaded into the new server"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_store_reconnects_and_reloads_after_a_restart() {
    let mut server = RedisServer::start_local();
    let s = store(&server).await;
    survives_restart(&mut server, &s).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_store_reconnects_and_reloads_after_a_restart() {
    let mut server = RedisServer::start_local();
    let s = fred_fast(&server).await;
    survives_restart(&mut server, &s).await;
}

/// A fred store with short timeouts, as a service would configure it.
#[cfg(feature = "fred")]
async fn fred_fast(server: &RedisServer) -> RedisStore {
    use ratelimit_redis::fred_client::prelude::*;
    let config = Config::from_url(&server.url()).unwrap();
    let client = Builder::from_config(config)
        .with_performance_config(|p| p.default_command_timeout = Duration::from_millis(50))
        .with_connection_config(|c| {
            c.connection_timeout = Duration::from_millis(50);
            c.max_command_attempts = 1;
        })
        .set_policy(ReconnectPolicy::new_constant(0, 50))
        .build()
        .unwrap();
    client.init().await.unwrap();
    RedisStore::from_fred(client)
        .with_prefix(server.prefix())
        .unwrap()
        .with_timeout(Duration::from_millis(200))
}

async fn flush_mid_run(server: &RedisServer, store: &dyn Store) {
    let quotas = [
        Quota::fixed_window(Rate::per_second(1_000)).unwrap(),
        Quota::sliding_window(Rate::per_second(1_000)).unwrap(),
        Quota::sliding_log(Rate::per_second(1_000)).unwrap(),
        quota(),
    ];
    for i in 0..200 {
        if i % 10 == 0 {
            server.flush_scripts();
        }
        let q = &quotas[i % quotas.len()];
        if let Err(e) = store.decide_one(format!("c{i}").as_bytes(), q, 1).await {
            panic!("call {i} after SCRIPT FLUSH failed: {e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_script_flush_never_reaches_the_caller() {
    let server = RedisServer::start();
    let s = common::redis_rs_store(&server.url(), server.prefix()).await;
    flush_mid_run(&server, &s).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_script_flush_never_reaches_the_caller() {
    let server = RedisServer::start();
    let s = common::fred_store(&server.url(), server.prefix()).await;
    flush_mid_run(&server, &s).await;
}

async fn wrong_type_is_not_transient(server: &RedisServer, store: &RedisStore) {
    let q = Quota::sliding_log(Rate::per_second(10)).unwrap();
    let fw = Quota::fixed_window(Rate::per_second(10)).unwrap();
    let mut conn = server.connection();
    // Someone else wrote these keys with other types.
    let _: () = redis::cmd("SET")
        .arg(store.key(b"squatted", &q))
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(store.key(b"squatted", &fw))
        .arg("f")
        .arg("v")
        .query(&mut conn)
        .unwrap();
    for quota in [&q, &fw] {
        let e = store
            .decide_one(b"squatted", quota, 1)
            .await
            .expect_err("WRONGTYPE");
        assert!(!e.is_transient(), "WRONGTYPE is not transient: {e}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_wrong_type_is_not_transient() {
    let server = RedisServer::start();
    let s = common::redis_rs_store(&server.url(), server.prefix()).await;
    wrong_type_is_not_transient(&server, &s).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_wrong_type_is_not_transient() {
    let server = RedisServer::start();
    let s = common::fred_store(&server.url(), server.prefix()).await;
    wrong_type_is_not_transient(&server, &s).await;
}

/// The bound the test stores give a request without a deadline.
const REPLY: Duration = Duration::from_millis(100);

/// A request without a deadline (the `StoreExt` shorthands) is bounded by
/// the store's own timeout, whatever the client's command or response
/// timeouts: the store's one timer per call keeps it, the client arms
/// none.
async fn reply_bound_holds(server: &RedisServer, store: RedisStore) {
    assert!(store.decide_one(b"warm", &quota(), 1).await.is_ok());
    server.pause();
    let outcome = tokio::time::timeout(
        Duration::from_secs(20),
        store.decide_one(b"late", &quota(), 1),
    )
    .await;
    server.resume();
    let e = outcome
        .expect("the call waited past the store's bound for a paused server")
        .expect_err("a paused server cannot answer");
    assert!(
        matches!(e, ratelimit_core::StoreError::Timeout(_)),
        "a timeout, not {e}"
    );
    assert!(e.is_transient());
    assert!(
        eventually(Duration::from_secs(5), async || store
            .decide_one(b"after", &quota(), 1)
            .await
            .is_ok())
        .await,
        "no decision within 5 s of resuming"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_store_timeout_bounds_a_call_without_a_deadline() {
    let server = RedisServer::start_local();
    let store = RedisStore::builder(server.url())
        .prefix(server.prefix())
        .timeout(REPLY)
        .build()
        .await
        .expect("connect");
    reply_bound_holds(&server, store).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_store_timeout_bounds_a_call_without_a_deadline() {
    use ratelimit_redis::fred_client::prelude::*;
    let server = RedisServer::start_local();
    // The client's command timeout (10 minutes) is not the scripts' bound.
    let client = Builder::from_config(Config::from_url(&server.url()).unwrap())
        .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(600))
        .build()
        .unwrap();
    client.init().await.unwrap();
    let store = RedisStore::from_fred(client)
        .with_prefix(server.prefix())
        .unwrap()
        .with_timeout(REPLY);
    reply_bound_holds(&server, store).await;
}
