//! The fred backend (feature `fred`): a clustered `fred` client.
//!
//! fred follows `MOVED` and `ASK` itself (up to its `max_redirections`) and
//! keeps its own slot map; the store adds the `NOSCRIPT` fallback and the
//! retries of [`crate::retry`]. Every script command is sent with fred's
//! per-command option `max_attempts = 1` (through `ClientLike::with_options`
//! and fred's `custom` command, since its `LuaInterface` ignores per-command
//! options), whatever the client's `ConnectionConfig::max_command_attempts`:
//! fred never re-sends a script whose connection closed with it in flight,
//! which would count the request twice.

use fred::clients::Client;
use fred::interfaces::{ClientLike, LuaInterface};
use fred::types::config::Options;
use ratelimit_core::StoreError;
use ratelimit_redis::error;
use ratelimit_redis::scripts::Call;

use crate::retry::{self, Failure, Next, Route};

/// fred's own messages for a command it never sent because no connection
/// could take it.
const UNREACHABLE: &[&str] = &[
    "Failed to route command",
    "Failed connecting to any cluster node",
];

/// fred's own messages for a command it never sent for other reasons.
const NOT_SENT: &[&str] = &["Too many redirections", "Missing cluster routing state"];

fn failure(err: fred::error::Error) -> Failure {
    let next = retry::classify_reply(err.details()).unwrap_or_else(|| {
        if UNREACHABLE.iter().any(|m| err.details().starts_with(m)) {
            Next::Unreachable
        } else if NOT_SENT.iter().any(|m| err.details().starts_with(m)) {
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
    call: &Call,
    _route: &Route,
    source: bool,
) -> Result<Vec<i64>, Failure> {
    // Routed by the first key's slot: every key of one call carries the
    // caller's hash tag.
    let (command, values) =
        ratelimit_redis::fred::script_command(call.script, &call.keys, &call.args, source);
    // One write, and no redirection followed inside fred: after a MOVED or
    // ASK fred would write the script again, which one attempt forbids, and
    // it would answer "Too many failed write attempts", the same words as
    // for a connection closed with the script in flight (which may have
    // run). With no redirection allowed it answers "Too many redirections"
    // (after refreshing its slot map on MOVED): the script did not run, and
    // the store retries it (see `crate::retry`).
    let once = Options {
        max_attempts: Some(1),
        max_redirections: Some(0),
        ..Options::default()
    };
    client
        .with_options(&once)
        .custom(command, values)
        .await
        .map_err(failure)
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
    /// Any `ConnectionConfig::max_command_attempts` is fine: the store sends
    /// every script with fred's per-command `max_attempts = 1`, so a script
    /// whose reply was lost is never sent again (fred would otherwise re-send
    /// a command whose connection closed while it was in flight, counting a
    /// request twice). Give the client a
    /// `PerformanceConfig::default_command_timeout` (fred's default is none).
    pub fn from_fred(client: Client) -> Self {
        Self::from_backend(crate::connection::Backend::Fred(client))
    }
}
