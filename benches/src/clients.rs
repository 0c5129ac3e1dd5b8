//! The Redis client libraries the load generators drive the store over, and
//! a store over each, configured as the READMEs configure them.

use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_server::RedisServer;

/// A Redis client library: redis-rs, and fred with the `fred` feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lib {
    /// redis-rs (`redis`), the default.
    RedisRs,
    /// fred (feature `fred`).
    #[cfg(feature = "fred")]
    Fred,
}

impl Lib {
    /// Every library this build has.
    pub fn all() -> Vec<Lib> {
        vec![
            Lib::RedisRs,
            #[cfg(feature = "fred")]
            Lib::Fred,
        ]
    }

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Lib::RedisRs => "redis-rs",
            #[cfg(feature = "fred")]
            Lib::Fred => "fred",
        }
    }
}

/// A store on `server` over `lib`, with the library's defaults but the key
/// prefix; fred as `ratelimit-redis/README.md` configures it (a per-command
/// timeout, a short connection timeout and a quick reconnect).
pub async fn redis_store(lib: Lib, server: &RedisServer) -> RedisStore {
    match lib {
        Lib::RedisRs => RedisStore::builder(server.url())
            .prefix(server.prefix())
            .build()
            .await
            .expect("connect to the fixture's redis-server"),
        #[cfg(feature = "fred")]
        Lib::Fred => {
            use ratelimit_redis::fred_client::prelude::*;
            use std::time::Duration;
            let client = Builder::from_config(Config::from_url(&server.url()).expect("valid URL"))
                .with_performance_config(|p| {
                    p.default_command_timeout = Duration::from_millis(30);
                })
                .with_connection_config(|c| c.connection_timeout = Duration::from_millis(50))
                .set_policy(ReconnectPolicy::new_constant(0, 20))
                .build()
                .expect("fred client");
            client.init().await.expect("fred connects");
            RedisStore::from_fred(client)
                .with_prefix(server.prefix())
                .expect("prefix")
        }
    }
}

/// A store on `server` built by the library's builder (fred through
/// `build_fred`) with its defaults but the key prefix, and its own I/O
/// thread or not (`RedisStoreBuilder::io_thread`: `false` runs the store's
/// calls on the application's runtime).
pub async fn redis_store_io(lib: Lib, server: &RedisServer, io_thread: bool) -> RedisStore {
    let builder = RedisStore::builder(server.url())
        .prefix(server.prefix())
        .io_thread(io_thread);
    match lib {
        Lib::RedisRs => builder.build().await,
        #[cfg(feature = "fred")]
        Lib::Fred => builder.build_fred().await,
    }
    .expect("connect to the fixture's redis-server")
}

/// A fred client for `url`, connected, whose commands and connection
/// attempts each wait up to `wait` (the throughput benchmarks give it
/// generous bounds; their subject is not the timeouts).
#[cfg(feature = "fred")]
pub async fn fred_client(
    url: &str,
    wait: std::time::Duration,
) -> ratelimit_redis::fred_client::clients::Client {
    use ratelimit_redis::fred_client::prelude::*;
    let client = Builder::from_config(Config::from_url(url).expect("valid URL"))
        .with_performance_config(|p| p.default_command_timeout = wait)
        .with_connection_config(|c| c.connection_timeout = wait)
        .build()
        .expect("fred client");
    client.init().await.expect("fred connects");
    client
}
