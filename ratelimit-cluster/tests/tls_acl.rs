//! A Redis Cluster whose nodes serve TLS only, require client
//! certificates and talk to each other over TLS, reached as an ACL user
//! (created on every node) confined to the store's prefix
//! (`ratelimit_redis::acl::rule(prefix, true)`): the conformance suite
//! with each client library; every key left is under that prefix.

use std::sync::Arc;
use std::time::Duration;

use ratelimit_cluster::ClusterStore;
use ratelimit_core::{ManualClock, Store};
use ratelimit_testkit::acl::AclUser;
use ratelimit_testkit::redis_cluster::RedisCluster;
use ratelimit_testkit::tls::TestCerts;
use ratelimit_testkit::{StoreFactory, SuiteConfig, run_all};
use tokio::sync::Mutex;

const SLOW: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
enum Lib {
    RedisRs,
    #[cfg(feature = "fred")]
    Fred,
}

struct TlsFactory {
    cluster: Arc<RedisCluster>,
    user: AclUser,
    base: String,
    lib: Lib,
    stores: Mutex<Vec<ClusterStore>>,
}

impl TlsFactory {
    fn new(cluster: Arc<RedisCluster>, lib: Lib) -> Self {
        let base = format!("{}-{lib:?}", cluster.prefix()).to_ascii_lowercase();
        let user = cluster.acl_user(&ratelimit_redis::acl::rule(&base, true));
        Self {
            cluster,
            user,
            base,
            lib,
            stores: Mutex::new(Vec::new()),
        }
    }

    async fn store(&self) -> ClusterStore {
        let certs = TestCerts::shared();
        let builder = ClusterStore::builder(self.cluster.urls())
            .username(self.user.name())
            .password(self.user.password())
            .tls_ca_file(certs.ca())
            .tls_client_cert(certs.client_cert(), certs.client_key())
            .prefix(&self.base)
            .response_timeout(SLOW)
            .connection_timeout(SLOW)
            .timeout(2 * SLOW);
        let built = match self.lib {
            Lib::RedisRs => builder.build().await,
            #[cfg(feature = "fred")]
            Lib::Fred => builder.build_fred().await,
        };
        built.unwrap_or_else(|e| panic!("a cluster store over TLS as an ACL user: {e}"))
    }

    fn assert_keys_confined(&self) {
        for master in self.cluster.masters() {
            let keys: Vec<String> = self
                .cluster
                .query(master.port, redis::cmd("KEYS").arg("*"))
                .unwrap();
            let outside: Vec<&String> = keys
                .iter()
                .filter(|k| !k.starts_with(self.cluster.prefix()))
                .collect();
            assert!(outside.is_empty(), "keys outside the prefix: {outside:?}");
        }
    }
}

#[async_trait::async_trait]
impl StoreFactory for TlsFactory {
    async fn stores(&self, n: usize, clock: Option<ManualClock>) -> Vec<Arc<dyn Store>> {
        let mut stores = self.stores.lock().await;
        while stores.len() < n {
            let s = self.store().await;
            stores.push(s);
        }
        let prefix = format!("{}:{:08x}", self.base, rand::random::<u32>());
        stores[..n]
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

fn cluster() -> Arc<RedisCluster> {
    static SHARED: std::sync::Mutex<std::sync::Weak<RedisCluster>> =
        std::sync::Mutex::new(std::sync::Weak::new());
    let mut guard = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = guard.upgrade() {
        return c;
    }
    let c = Arc::new(RedisCluster::start_local_tls());
    *guard = Arc::downgrade(&c);
    c
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_over_tls_as_a_confined_acl_user_meets_every_contract() {
    let factory = TlsFactory::new(cluster(), Lib::RedisRs);
    if let Err(v) = run_all(&factory, &SuiteConfig::default()).await {
        panic!("{v}");
    }
    factory.assert_keys_confined();
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_over_tls_as_a_confined_acl_user_meets_every_contract() {
    let factory = TlsFactory::new(cluster(), Lib::Fred);
    if let Err(v) = run_all(&factory, &SuiteConfig::default()).await {
        panic!("{v}");
    }
    factory.assert_keys_confined();
}
