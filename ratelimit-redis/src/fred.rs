//! The `fred` client as a backend (feature `fred`).
//!
//! Same scripts, key layout and decoding as the redis-rs backend; only the
//! call differs. Timeouts and reconnection are the fred client's own
//! (configure `PerformanceConfig::default_command_timeout` and a
//! `ReconnectPolicy`); the store bounds each decision by
//! [`RedisStore::timeout`] on top.

use fred::clients::Client;
use fred::interfaces::LuaInterface;
use ratelimit_core::StoreError;

use crate::error;
use crate::scripts::Script;
use crate::store::{Backend, RedisStore};

impl RedisStore {
    /// A store over a fred client you already hold (initialised with
    /// `init()`), with prefix `rl`, the server's clock and a per-call bound
    /// of [`crate::DEFAULT_CALL_TIMEOUT`].
    pub fn from_fred(client: Client) -> Self {
        Self::from_backend(Backend::Fred(client))
    }
}

/// `EVALSHA`; on `NOSCRIPT`, `EVAL` with the source (which also caches it).
pub(crate) async fn eval(
    client: &Client,
    script: &Script,
    key: &str,
    args: &[String],
) -> Result<Vec<i64>, StoreError> {
    let first: Result<Vec<i64>, fred::error::Error> =
        client.evalsha(script.sha1(), key, args.to_vec()).await;
    match first {
        Ok(reply) => Ok(reply),
        Err(e) if e.details().starts_with("NOSCRIPT") => {
            tracing::debug!(
                script = script.name(),
                "NOSCRIPT: sending the script source"
            );
            client
                .eval(script.lua(), key, args.to_vec())
                .await
                .map_err(error::from_fred)
        }
        Err(e) => Err(error::from_fred(e)),
    }
}
