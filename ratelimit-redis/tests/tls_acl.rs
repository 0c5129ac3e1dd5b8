//! A TLS-only Redis that requires client certificates, reached as an ACL
//! user confined to the store's prefix (`ratelimit_redis::acl::rule`):
//! the conformance suite with each client library; every key the suite
//! leaves is under that prefix. And the same ACL user in plain text (the
//! engine matrix's ACL cell: `plain_text`; its TLS cell: `over_tls`).

mod common;

use std::sync::Arc;

use common::SLOW;
use ratelimit_core::{ManualClock, Store};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::acl::AclUser;
use ratelimit_testkit::redis_server::RedisServer;
use ratelimit_testkit::tls::TestCerts;
use ratelimit_testkit::{StoreFactory, SuiteConfig, run_all};
use tokio::sync::Mutex;

#[derive(Debug, Clone, Copy)]
enum Lib {
    RedisRs,
    #[cfg(feature = "fred")]
    Fred,
}

/// Stores over TLS as the ACL user, every call under `<base>:<fresh>`.
struct TlsFactory {
    server: RedisServer,
    user: AclUser,
    base: String,
    lib: Lib,
    tls: bool,
    stores: Mutex<Vec<RedisStore>>,
}

impl TlsFactory {
    fn new(lib: Lib) -> Self {
        Self::with(lib, true)
    }

    fn with(lib: Lib, tls: bool) -> Self {
        let server = if tls {
            RedisServer::start_tls()
        } else {
            RedisServer::start_local()
        };
        let base = server.prefix().to_owned();
        let user = server.acl_user(&ratelimit_redis::acl::rule(&base, false));
        Self {
            server,
            user,
            base,
            lib,
            tls,
            stores: Mutex::new(Vec::new()),
        }
    }

    async fn store(&self) -> RedisStore {
        let certs = TestCerts::shared();
        let mut builder = RedisStore::builder(self.server.url())
            .username(self.user.name())
            .password(self.user.password());
        if self.tls {
            builder = builder
                .tls_ca_file(certs.ca())
                .tls_client_cert(certs.client_cert(), certs.client_key());
        }
        let builder = builder
            .prefix(&self.base)
            .response_timeout(SLOW)
            .connection_timeout(SLOW)
            .timeout(2 * SLOW);
        let built = match self.lib {
            Lib::RedisRs => builder.build().await,
            #[cfg(feature = "fred")]
            Lib::Fred => builder.build_fred().await,
        };
        built.unwrap_or_else(|e| panic!("a store over TLS as an ACL user: {e}"))
    }

    /// Every key on the server is under the base prefix.
    fn assert_keys_confined(&self) {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query(&mut self.server.connection())
            .unwrap();
        let outside: Vec<&String> = keys
            .iter()
            .filter(|k| !k.starts_with(&format!("{}:", self.base)))
            .collect();
        assert!(outside.is_empty(), "keys outside the prefix: {outside:?}");
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

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_over_tls_as_a_confined_acl_user_meets_every_contract() {
    let factory = TlsFactory::new(Lib::RedisRs);
    if let Err(v) = run_all(&factory, &SuiteConfig::default()).await {
        panic!("{v}");
    }
    factory.assert_keys_confined();
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_over_tls_as_a_confined_acl_user_meets_every_contract() {
    let factory = TlsFactory::new(Lib::Fred);
    if let Err(v) = run_all(&factory, &SuiteConfig::default()).await {
        panic!("{v}");
    }
    factory.assert_keys_confined();
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_in_plain_text_as_a_confined_acl_user_meets_every_contract() {
    let factory = TlsFactory::with(Lib::RedisRs, false);
    if let Err(v) = run_all(&factory, &SuiteConfig::default()).await {
        panic!("{v}");
    }
    factory.assert_keys_confined();
}
