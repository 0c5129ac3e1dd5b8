//! Exactly once under a lost reply: the server runs the script, the reply
//! never reaches the client (a loopback proxy drops it), the store returns
//! an error, and the stored state shows the call counted **once**, never
//! twice by a client that re-sent the script.
//!
//! Checked for both clients, with the reply lost to a closed connection and
//! to a silent one, and with fred at its default configuration (three
//! command attempts), which the store must not let re-send a script. Real
//! time, bounded waits, no sleeps.

mod common;

use ratelimit_core::StoreExt;
use std::time::Duration;

use ratelimit_core::{Quota, Rate};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::proxy::{LostReply, Proxy};
use ratelimit_testkit::redis_server::{RedisServer, fresh_prefix};

const LIMIT: u64 = 10;
/// How long the test waits for the proxy to see the server's reply.
const WAIT: Duration = Duration::from_secs(5);

fn quota() -> Quota {
    Quota::fixed_window(Rate::per_hour(LIMIT)).unwrap()
}

/// A redis-rs store through `url`, with the builder's settings.
async fn redis_rs(url: &str, prefix: &str) -> RedisStore {
    RedisStore::builder(url)
        .prefix(prefix)
        .response_timeout(Duration::from_millis(300))
        .connection_timeout(Duration::from_millis(300))
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("connect through the proxy")
}

/// A fred store through `url`, with fred's defaults left as they are
/// (`max_command_attempts` 3) except for timeouts and a reconnect policy.
#[cfg(feature = "fred")]
async fn fred(url: &str, prefix: &str) -> RedisStore {
    use ratelimit_redis::fred_client::prelude::*;
    let config = Config::from_url(url).expect("valid URL");
    let client = Builder::from_config(config)
        .with_performance_config(|p| p.default_command_timeout = Duration::from_millis(300))
        .with_connection_config(|c| {
            c.connection_timeout = Duration::from_millis(300);
            assert_eq!(c.max_command_attempts, 3, "fred's default");
        })
        .set_policy(ReconnectPolicy::new_constant(0, 20))
        .build()
        .expect("fred client");
    client
        .init()
        .await
        .expect("fred connects through the proxy");
    RedisStore::from_fred(client)
        .with_prefix(prefix)
        .expect("valid prefix")
        .with_timeout(Duration::from_secs(2))
}

#[derive(Debug, Clone, Copy)]
enum Lib {
    RedisRs,
    #[cfg(feature = "fred")]
    Fred,
}

async fn store(lib: Lib, url: &str, prefix: &str) -> RedisStore {
    match lib {
        Lib::RedisRs => redis_rs(url, prefix).await,
        #[cfg(feature = "fred")]
        Lib::Fred => fred(url, prefix).await,
    }
}

/// How many calls the server has counted for `caller`: one more decision
/// through a clean store straight to the server, minus that one.
async fn counted(server: &RedisServer, prefix: &str, caller: &[u8]) -> u64 {
    let clean = redis_rs(&server.url(), prefix).await;
    let d = clean
        .decide_one(caller, &quota(), 1)
        .await
        .expect("clean decision");
    assert!(d.allowed);
    LIMIT - d.remaining - 1
}

async fn lost_reply_counts_once(lib: Lib, how: LostReply) {
    let server = RedisServer::start_local();
    let proxy = Proxy::start(server.addr());
    let prefix = fresh_prefix();
    let s = store(lib, &proxy.url(), &prefix).await;
    let caller = b"lost-reply";
    let q = quota();

    // Connected, scripts cached: one ordinary call first.
    let d = s.decide_one(caller, &q, 1).await.expect("first call");
    assert_eq!(d.remaining, LIMIT - 1);

    proxy.set_lost_reply(how);
    proxy.drop_replies_to(b"EVALSHA", 1);
    let lost = s.decide_one(caller, &q, 1).await;
    assert!(
        proxy.wait_replies_lost(1, WAIT),
        "{lib:?}/{how:?}: the proxy lost no reply"
    );
    assert!(
        lost.is_err(),
        "{lib:?}/{how:?}: the store answered {lost:?} to a call whose reply was lost: \
         the client sent the script again"
    );
    // The held connection is closed now; the store reconnects, and nothing
    // it had in flight may be replayed on the new connection.
    proxy.cut_all();
    let mut after = None;
    for _ in 0..50 {
        if let Ok(d) = s.decide_one(b"other-caller", &q, 1).await {
            after = Some(d);
            break;
        }
    }
    assert!(
        after.is_some(),
        "{lib:?}/{how:?}: the store did not recover"
    );

    assert_eq!(
        counted(&server, &prefix, caller).await,
        2,
        "{lib:?}/{how:?}: the first call plus the lost one, each counted once"
    );
    assert_eq!(proxy.stats().replies_lost, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_lost_reply_on_a_closed_connection_is_counted_once() {
    lost_reply_counts_once(Lib::RedisRs, LostReply::Close).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_lost_reply_on_a_silent_connection_is_counted_once() {
    lost_reply_counts_once(Lib::RedisRs, LostReply::Hold).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_lost_reply_on_a_closed_connection_is_counted_once() {
    lost_reply_counts_once(Lib::Fred, LostReply::Close).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_lost_reply_on_a_silent_connection_is_counted_once() {
    lost_reply_counts_once(Lib::Fred, LostReply::Hold).await;
}
