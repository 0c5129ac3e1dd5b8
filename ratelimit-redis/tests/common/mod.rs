//! Shared by the integration tests: store factories over a real server.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::{ManualClock, Store};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::StoreFactory;
use ratelimit_testkit::redis_server::{RedisServer, fresh_prefix};
use tokio::sync::Mutex;

/// Generous bounds for the conformance runs: the machine may be loaded, and
/// a timeout there would be a test failure, not a fault being tested.
pub const SLOW: Duration = Duration::from_secs(5);

/// A store over redis-rs built with the builder, with generous timeouts.
pub async fn redis_rs_store(url: &str, prefix: &str) -> RedisStore {
    RedisStore::builder(url)
        .prefix(prefix)
        .response_timeout(SLOW)
        .connection_timeout(SLOW)
        .timeout(2 * SLOW)
        .build()
        .await
        .expect("connect to the test server")
}

/// A store over a fred client, with generous timeouts.
#[cfg(feature = "fred")]
pub async fn fred_store(url: &str, prefix: &str) -> RedisStore {
    use ratelimit_redis::fred_client::prelude::*;
    let config = Config::from_url(url).expect("valid URL");
    let client = Builder::from_config(config)
        .with_performance_config(|p| p.default_command_timeout = SLOW)
        .with_connection_config(|c| c.connection_timeout = SLOW)
        .set_policy(ReconnectPolicy::new_constant(0, 50))
        .build()
        .expect("fred client");
    client.init().await.expect("fred connects");
    RedisStore::from_fred(client)
        .with_prefix(prefix)
        .expect("valid prefix")
        .with_timeout(2 * SLOW)
}

/// Which client library a factory uses.
#[derive(Debug, Clone, Copy)]
pub enum Lib {
    /// redis-rs `ConnectionManager`.
    RedisRs,
    /// fred.
    #[cfg(feature = "fred")]
    Fred,
}

/// Hands out stores on separate connections, one connection per instance,
/// kept across calls (so hundreds of proptest cases do not open thousands of
/// connections); every call gets a fresh random key prefix.
pub struct Factory {
    pub server: RedisServer,
    lib: Lib,
    base: Mutex<Vec<RedisStore>>,
    batch_only: bool,
}

impl Factory {
    pub fn new(lib: Lib) -> Self {
        Self {
            server: RedisServer::start(),
            lib,
            base: Mutex::new(Vec::new()),
            batch_only: false,
        }
    }

    /// Stores that send every decision through the batch script.
    pub fn batch_only(mut self) -> Self {
        self.batch_only = true;
        self
    }
}

#[async_trait::async_trait]
impl StoreFactory for Factory {
    async fn stores(&self, n: usize, clock: Option<ManualClock>) -> Vec<Arc<dyn Store>> {
        let mut base = self.base.lock().await;
        let url = self.server.url();
        while base.len() < n {
            let store = match self.lib {
                Lib::RedisRs => redis_rs_store(&url, "rl").await,
                #[cfg(feature = "fred")]
                Lib::Fred => fred_store(&url, "rl").await,
            };
            base.push(store);
        }
        let prefix = fresh_prefix();
        base[..n]
            .iter()
            .map(|s| {
                let mut s = s.clone().with_prefix(&prefix).expect("valid prefix");
                if self.batch_only {
                    s = s.with_batch_script_only();
                }
                let s = match &clock {
                    Some(c) => s.with_clock(c.clone()),
                    None => s,
                };
                Arc::new(s) as Arc<dyn Store>
            })
            .collect()
    }
}

/// Runs `call`'s script on `server` directly (by SHA, loaded on
/// `NOSCRIPT`) and returns its integer reply.
pub fn run_call(server: &RedisServer, call: &ratelimit_redis::scripts::Call) -> Vec<i64> {
    let mut invocation = call.script.redis().prepare_invoke();
    for k in &call.keys {
        invocation.key(k);
    }
    for a in &call.args {
        invocation.arg(a);
    }
    invocation
        .invoke::<ratelimit_redis::decode::Integers>(&mut server.connection())
        .expect("the script runs")
        .0
}

/// The number after `field` (up to a comma) in `INFO section`, 0 when the
/// line is absent: `info_count(s, "commandstats", "cmdstat_evalsha:calls=")`.
pub fn info_count(server: &RedisServer, section: &str, field: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query(&mut server.connection())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}
