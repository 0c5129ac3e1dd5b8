//! Shared by the integration tests: store factories over a real cluster.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use ratelimit_cluster::ClusterStore;
use ratelimit_core::{ManualClock, Store};
use ratelimit_testkit::StoreFactory;
use ratelimit_testkit::redis_cluster::RedisCluster;
use ratelimit_testkit::redis_server::fresh_prefix;
use tokio::sync::Mutex;

/// Generous bounds for the conformance runs: the machine may be loaded, and
/// a timeout there would be a test failure, not a fault being tested.
pub const SLOW: Duration = Duration::from_secs(5);

/// A redis-rs store with the given per-reply and per-call bounds.
pub async fn redis_rs_store(
    cluster: &RedisCluster,
    prefix: &str,
    response: Duration,
    call: Duration,
) -> ClusterStore {
    ClusterStore::builder(cluster.urls())
        .prefix(prefix)
        .response_timeout(response)
        .connection_timeout(response.min(Duration::from_secs(1)))
        .timeout(call)
        .build()
        .await
        .expect("connect to the test cluster")
}

/// A store over a redis-rs `ClusterConnection` (the client's own routing,
/// built as the crate docs ask: `retries(0)`, timeouts set), with the given
/// per-reply and per-call bounds.
pub async fn cluster_connection_store(
    cluster: &RedisCluster,
    prefix: &str,
    response: Duration,
    call: Duration,
) -> ClusterStore {
    let client = redis::cluster::ClusterClientBuilder::new(cluster.urls())
        .retries(0)
        .response_timeout(response)
        .connection_timeout(response.min(Duration::from_secs(1)))
        .build()
        .expect("cluster client");
    let connection = client
        .get_async_connection()
        .await
        .expect("connect to the test cluster");
    ready(
        ClusterStore::from_cluster_connection(connection),
        prefix,
        call,
    )
    .await
}

/// `store` with `prefix` and the per-call bound `call`, its scripts loaded
/// on every master.
async fn ready(store: ClusterStore, prefix: &str, call: Duration) -> ClusterStore {
    let store = store
        .with_prefix(prefix)
        .expect("valid prefix")
        .with_timeout(call);
    store
        .load_scripts()
        .await
        .expect("SCRIPT LOAD on every master");
    store
}

/// A fred store with the given per-command and per-call bounds; fred never
/// re-sends a command in flight (`max_command_attempts = 1`).
#[cfg(feature = "fred")]
pub async fn fred_store(
    cluster: &RedisCluster,
    prefix: &str,
    response: Duration,
    call: Duration,
) -> ClusterStore {
    use ratelimit_cluster::fred_client::prelude::*;
    let config = Config {
        server: ServerConfig::new_clustered(cluster.addrs()),
        ..Config::default()
    };
    let client = Builder::from_config(config)
        .with_performance_config(|p| p.default_command_timeout = response)
        .with_connection_config(|c| {
            c.connection_timeout = response.min(Duration::from_secs(1));
            c.internal_command_timeout = Duration::from_secs(1);
            c.max_command_attempts = 1;
        })
        .set_policy(ReconnectPolicy::new_constant(0, 50))
        .build()
        .expect("fred client");
    client.init().await.expect("fred connects to the cluster");
    ready(ClusterStore::from_fred(client), prefix, call).await
}

/// Which client library a factory uses.
#[derive(Debug, Clone, Copy)]
pub enum Lib {
    /// redis-rs, one connection per node (the builder's store).
    RedisRs,
    /// redis-rs' `ClusterConnection`, brought by the application.
    ClusterConnection,
    /// fred.
    #[cfg(feature = "fred")]
    Fred,
}

/// Builds a store with `lib`.
pub async fn store(
    lib: Lib,
    cluster: &RedisCluster,
    prefix: &str,
    response: Duration,
    call: Duration,
) -> ClusterStore {
    match lib {
        Lib::RedisRs => redis_rs_store(cluster, prefix, response, call).await,
        Lib::ClusterConnection => cluster_connection_store(cluster, prefix, response, call).await,
        #[cfg(feature = "fred")]
        Lib::Fred => fred_store(cluster, prefix, response, call).await,
    }
}

/// A quota no caller reaches (a token bucket of 1,000,000 a second) and a
/// limiter over `store` checking it, its degraded mode the fallback at
/// L / `instances`.
pub fn admitting_limiter(
    store: &ClusterStore,
    namespace: &str,
    instances: u32,
    timeout: Duration,
) -> (ratelimit_core::Quota, ratelimit_core::Limiter) {
    let quota =
        ratelimit_core::Quota::token_bucket(ratelimit_core::Rate::per_second(1_000_000), 1_000_000)
            .expect("a valid quota");
    let limiter = ratelimit_core::Limiter::builder(store.clone())
        .quota(quota.clone())
        .namespace(namespace)
        .expect("a valid namespace")
        .instances(instances)
        .timeout(timeout)
        .build()
        .expect("a valid limiter");
    (quota, limiter)
}

/// Hands out stores on separate cluster connections, one client per
/// instance kept across calls (so hundreds of proptest cases do not open
/// thousands of connections); every call gets a fresh random key prefix.
pub struct Factory {
    pub cluster: Arc<RedisCluster>,
    lib: Lib,
    base: Mutex<Vec<ClusterStore>>,
}

impl Factory {
    pub fn new(lib: Lib, cluster: Arc<RedisCluster>) -> Self {
        Self {
            cluster,
            lib,
            base: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait::async_trait]
impl StoreFactory for Factory {
    async fn stores(&self, n: usize, clock: Option<ManualClock>) -> Vec<Arc<dyn Store>> {
        let mut base = self.base.lock().await;
        while base.len() < n {
            base.push(store(self.lib, &self.cluster, "rl", SLOW, 2 * SLOW).await);
        }
        let prefix = fresh_prefix();
        base[..n]
            .iter()
            .map(|s| {
                let s = s.clone().with_prefix(&prefix).expect("valid prefix");
                let s = match &clock {
                    Some(c) => s.with_clock(c.clone()),
                    None => s,
                };
                Arc::new(s) as Arc<dyn Store>
            })
            .collect()
    }
}

/// The keys under `prefix` on every live master (`KEYS <prefix>:*`): what a
/// limiter really wrote, whatever way it composes its keys.
pub fn keys_under(cluster: &RedisCluster, prefix: &str) -> Vec<String> {
    let mut keys = Vec::new();
    for m in cluster.masters() {
        let found: Vec<String> = cluster
            .query(m.port, redis::cmd("KEYS").arg(format!("{prefix}:*")))
            .expect("KEYS");
        keys.extend(found);
    }
    keys.sort();
    keys
}

/// The one slot all of `keys` live in.
pub fn slot_of_keys(cluster: &RedisCluster, keys: &[String]) -> u16 {
    let slots: std::collections::HashSet<u16> = keys
        .iter()
        .map(|k| cluster.key_slot(k.as_bytes()))
        .collect();
    assert_eq!(slots.len(), 1, "one caller, one slot: {keys:?}");
    *slots.iter().next().unwrap()
}
