//! The `fred` client as a backend (feature `fred`).
//!
//! Same scripts, key layout and decoding as the redis-rs backend; only the
//! call differs. Reconnection is the fred client's own (configure a
//! `ReconnectPolicy`); each script waits for its reply until its caller's
//! deadline (a request without one: [`crate::RedisStore::timeout`]), timed by the
//! store, as with redis-rs.
//!
//! **One attempt per script, whatever the client's configuration.** fred
//! re-sends a command whose connection closed while it was in flight, up to
//! `ConnectionConfig::max_command_attempts` (default 3). For a script whose
//! request reached the server and whose reply was lost, that runs the script
//! a second time: one request counted twice. So every script command this
//! store sends carries fred's per-command option `max_attempts = 1`
//! (sent with `ClientLike::with_options`, through fred's `custom` command:
//! its `LuaInterface` ignores per-command options), which takes precedence
//! over the client's setting:
//! a lost reply is returned as an error and the limiter's failure policy
//! decides that one call; the request is counted once (if the server ran
//! it) or not at all, never twice. The rest of the client (other commands
//! you send through it) keeps its own configuration.

use std::time::Duration;

use fred::bytes::Bytes;
use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, Value};
use ratelimit_core::StoreError;

use crate::error;
use crate::scripts::{Arg, Script};

/// The per-command options of every script command: one attempt, so fred
/// never re-sends a script whose reply was lost (see the module docs); and
/// no timer of fred's own (a zero `timeout`): the store races every call
/// against the request's deadline with one timer (see
/// [`crate::RedisStore::from_fred`]).
fn script_options() -> Options {
    Options {
        max_attempts: Some(1),
        timeout: Some(Duration::ZERO),
        ..Options::default()
    }
}

/// The command `EVALSHA <sha1> <numkeys> <keys...> <args...>` (or `EVAL
/// <source> ...` when `source`) and its arguments, for fred's `custom`
/// command (which, unlike its `LuaInterface`, honours per-command options),
/// routed by the first key's slot on a cluster (every key of one call
/// shares it). The cluster store sends it too.
pub fn script_command(
    script: &'static Script,
    keys: &[String],
    args: &[Arg],
    source: bool,
) -> (CustomCommand, Vec<Value>) {
    let slot = fred::util::redis_keyslot(keys.first().map_or(&b""[..], |k| k.as_bytes()));
    let (name, body) = if source {
        ("EVAL", script.lua())
    } else {
        ("EVALSHA", script.sha1())
    };
    let command = CustomCommand::new_static(name, ClusterHash::Custom(slot), false);
    let mut values: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
    // The script's SHA or source lives as long as the process: sent
    // without a copy.
    values.push(Value::Bytes(Bytes::from_static(body.as_bytes())));
    values.push(i64::try_from(keys.len()).unwrap_or(i64::MAX).into());
    // A copy of each `String` becomes fred's string without another copy
    // (`Value::from(&str)` would grow a buffer to copy it into); integers
    // go as fred's integers, written into the frame as they are framed.
    values.extend(keys.iter().map(|k| Value::from(k.clone())));
    values.extend(args.iter().map(Value::from));
    (command, values)
}

/// Sends [`script_command`] once at most.
async fn send_script(
    client: &Client,
    script: &'static Script,
    keys: &[String],
    args: &[Arg],
    source: bool,
) -> Result<Vec<i64>, fred::error::Error> {
    let (command, values) = script_command(script, keys, args, source);
    client
        .with_options(&script_options())
        .custom(command, values)
        .await
}

/// `EVALSHA`; on `NOSCRIPT`, `EVAL` with the source (which also caches it).
/// Each is sent once at most. A quota's own script goes with its source
/// first until a call with it succeeds (see
/// [`Script::send_source_first`]).
pub(crate) async fn eval(
    client: &Client,
    script: &'static Script,
    keys: &[String],
    args: &[Arg],
) -> Result<Vec<i64>, StoreError> {
    if script.send_source_first() {
        return send_script(client, script, keys, args, true)
            .await
            .map_err(error::from_fred);
    }
    match send_script(client, script, keys, args, false).await {
        Ok(reply) => Ok(reply),
        Err(e) if e.details().starts_with("NOSCRIPT") => {
            tracing::debug!(
                script = script.name(),
                "NOSCRIPT: sending the script source"
            );
            send_script(client, script, keys, args, true)
                .await
                .map_err(error::from_fred)
        }
        Err(e) => Err(error::from_fred(e)),
    }
}
