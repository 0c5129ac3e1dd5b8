//! The fred backend (feature `fred`): a clustered `fred` client.
//!
//! fred follows `MOVED` and `ASK` itself (up to its `max_redirections`) and
//! keeps its own slot map; the store adds the `NOSCRIPT` fallback and the
//! retries of [`crate::retry`]. Build the client with
//! `ConnectionConfig::max_command_attempts = 1`, so fred never re-sends a
//! script whose connection closed with it in flight (see the crate docs).

use fred::clients::Client;
use fred::interfaces::LuaInterface;
use ratelimit_core::StoreError;
use ratelimit_redis::error;
use ratelimit_redis::scripts::Script;

use crate::retry::{self, Failure, Next, Route};

/// fred's own messages for a command it never sent.
const NOT_SENT: &[&str] = &[
    "Failed to route command",
    "Too many redirections",
    "Missing cluster routing state",
    "Failed connecting to any cluster node",
];

fn failure(err: fred::error::Error) -> Failure {
    let next = retry::classify_reply(err.details()).unwrap_or_else(|| {
        if NOT_SENT.iter().any(|m| err.details().starts_with(m)) {
            Next::Backoff
        } else {
            Next::Fail
        }
    });
    Failure {
        error: error::from_fred(err),
        next,
    }
}

/// One attempt. fred routes by the key and follows redirects itself, so
/// `route` is not used: a redirect that reaches the store (fred gave up on
/// it) is retried through fred's refreshed slot map.
pub(crate) async fn eval(
    client: &Client,
    script: &Script,
    key: &str,
    args: &[String],
    _route: &Route,
    source: bool,
) -> Result<Vec<i64>, Failure> {
    let reply: Result<Vec<i64>, fred::error::Error> = if source {
        client.eval(script.lua(), key, args.to_vec()).await
    } else {
        client.evalsha(script.sha1(), key, args.to_vec()).await
    };
    reply.map_err(failure)
}

/// `SCRIPT LOAD` of every script on every primary.
pub(crate) async fn load_scripts(client: &Client) -> Result<(), StoreError> {
    for script in ratelimit_redis::scripts::all() {
        let _: String = client
            .script_load_cluster(script.lua())
            .await
            .map_err(error::from_fred)?;
    }
    Ok(())
}

impl crate::ClusterStore {
    /// A store over a clustered fred client you already hold (initialised
    /// with `init()`), with prefix `rl`, the server's clock and a per-call
    /// bound of [`crate::DEFAULT_CALL_TIMEOUT`].
    ///
    /// Build the client with `ConnectionConfig::max_command_attempts = 1`
    /// (fred re-sends a command whose connection closed while it was in
    /// flight, which can count a request twice) and a
    /// `PerformanceConfig::default_command_timeout` (fred's default is none).
    pub fn from_fred(client: Client) -> Self {
        Self::from_backend(crate::connection::Backend::Fred(client))
    }
}
