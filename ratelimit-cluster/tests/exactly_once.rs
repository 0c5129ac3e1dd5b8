//! Exactly once under a lost reply, on a cluster: the master owning the
//! caller's slot runs the script, the reply never reaches the client (the
//! proxy in front of that master drops it), the store returns an error, and
//! the stored state shows the call counted **once**: neither the client
//! library nor the store's own retries ran the script again.
//!
//! Every client (redis-rs with one connection per node, redis-rs'
//! `ClusterConnection`, fred), the reply lost to a closed connection and to a silent
//! one; fred at its default configuration (three command attempts), which
//! the store must not let re-send a script. Real time, bounded waits.

mod common;

use ratelimit_core::StoreExt;
use std::time::Duration;

use common::Lib;
use ratelimit_cluster::ClusterStore;
use ratelimit_core::{Quota, Rate};
use ratelimit_testkit::proxy::LostReply;
use ratelimit_testkit::redis_cluster::RedisCluster;
use ratelimit_testkit::redis_server::fresh_prefix;

const LIMIT: u64 = 10;
/// How long the test waits for the proxy to see the server's reply.
const WAIT: Duration = Duration::from_secs(5);
const RESPONSE: Duration = Duration::from_millis(300);
const CALL: Duration = Duration::from_secs(2);

fn quota() -> Quota {
    Quota::fixed_window(Rate::per_hour(LIMIT)).unwrap()
}

/// A fred store with fred's default `max_command_attempts` (3).
#[cfg(feature = "fred")]
async fn fred_default_attempts(cluster: &RedisCluster, prefix: &str) -> ClusterStore {
    use ratelimit_cluster::fred_client::prelude::*;
    let config = Config {
        server: ServerConfig::new_clustered(cluster.addrs()),
        ..Config::default()
    };
    let client = Builder::from_config(config)
        .with_performance_config(|p| p.default_command_timeout = RESPONSE)
        .with_connection_config(|c| {
            c.connection_timeout = RESPONSE;
            c.internal_command_timeout = Duration::from_secs(1);
            assert_eq!(c.max_command_attempts, 3, "fred's default");
        })
        .set_policy(ReconnectPolicy::new_constant(0, 20))
        .build()
        .expect("fred client");
    client.init().await.expect("fred connects to the cluster");
    ClusterStore::from_fred(client)
        .with_prefix(prefix)
        .expect("valid prefix")
        .with_timeout(CALL)
}

async fn store(lib: Lib, cluster: &RedisCluster, prefix: &str) -> ClusterStore {
    match lib {
        Lib::RedisRs => common::redis_rs_store(cluster, prefix, RESPONSE, CALL).await,
        Lib::ClusterConnection => {
            common::cluster_connection_store(cluster, prefix, RESPONSE, CALL).await
        }
        #[cfg(feature = "fred")]
        Lib::Fred => fred_default_attempts(cluster, prefix).await,
    }
}

/// How many calls the cluster has counted for `caller`: one more decision
/// through a fresh store, minus that one.
async fn counted(cluster: &RedisCluster, prefix: &str, caller: &[u8]) -> u64 {
    let clean = common::redis_rs_store(cluster, prefix, common::SLOW, 2 * common::SLOW).await;
    let d = clean
        .decide_one(caller, &quota(), 1)
        .await
        .expect("clean decision");
    assert!(d.allowed);
    LIMIT - d.remaining - 1
}

async fn lost_reply_counts_once(cluster: &RedisCluster, lib: Lib, how: LostReply) {
    let prefix = fresh_prefix();
    let s = store(lib, cluster, &prefix).await;
    let caller = b"lost-reply";
    let q = quota();
    let d = s.decide_one(caller, &q, 1).await.expect("first call");
    assert_eq!(d.remaining, LIMIT - 1);

    let slot = cluster.key_slot(s.key(caller, &q).as_bytes());
    let master = cluster.master_for_slot(slot);
    let proxy = cluster.proxy(master.port);
    let lost_before = proxy.stats().replies_lost;
    proxy.set_lost_reply(how);
    proxy.drop_replies_to(b"EVALSHA", 1);
    let lost = s.decide_one(caller, &q, 1).await;
    assert!(
        proxy.wait_replies_lost(lost_before + 1, WAIT),
        "{lib:?}/{how:?}: the proxy lost no reply"
    );
    assert!(
        lost.is_err(),
        "{lib:?}/{how:?}: the store answered {lost:?} to a call whose reply was lost: \
         the script was sent again"
    );
    // Close what the loss left open; nothing in flight may be replayed on
    // the new connections.
    proxy.cut_all();
    // Another caller on the same master, so the client reconnects there.
    let neighbour = (0..)
        .map(|i| format!("neighbour-{i}"))
        .find(|c| {
            let k = s.key(c.as_bytes(), &q);
            master.serves(cluster.key_slot(k.as_bytes()))
        })
        .expect("a caller on the same master");
    let mut recovered = false;
    for _ in 0..50 {
        if s.decide_one(neighbour.as_bytes(), &q, 1).await.is_ok() {
            recovered = true;
            break;
        }
    }
    assert!(recovered, "{lib:?}/{how:?}: the store did not recover");
    assert_eq!(
        counted(cluster, &prefix, caller).await,
        2,
        "{lib:?}/{how:?}: the first call plus the lost one, each counted once"
    );
    assert_eq!(proxy.stats().replies_lost, lost_before + 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_reply_is_counted_once_on_a_cluster() {
    let cluster = RedisCluster::start_local_proxied();
    for how in [LostReply::Close, LostReply::Hold] {
        lost_reply_counts_once(&cluster, Lib::RedisRs, how).await;
        lost_reply_counts_once(&cluster, Lib::ClusterConnection, how).await;
        #[cfg(feature = "fred")]
        lost_reply_counts_once(&cluster, Lib::Fred, how).await;
    }
}
