//! Which failures are retried, and how: the double-counting rule.
//!
//! A decision is one script run, and a script run is not idempotent: it
//! counts the request. Re-sending a script whose first run may have
//! happened (the request was written, then the reply was lost to a timeout,
//! a reset connection or a killed node) can count one request twice. So the
//! store re-sends a script **only when the error proves it did not run**:
//!
//! | error | proves it did not run because | what the store does |
//! |---|---|---|
//! | `MOVED <slot> <addr>` | the node does not serve the slot and executed nothing | sends it to `<addr>` |
//! | `ASK <slot> <addr>` | the key is being migrated away; nothing ran | sends `ASKING` + the script to `<addr>` |
//! | `NOSCRIPT` | the node does not have the script (new master, restart) | sends `EVAL` with the source (which caches it) |
//! | `TRYAGAIN` | refused before execution: the call's keys are split by a slot migration | a call of one request: waits a little and retries; a batch of several: sent again request by request, each as it would have gone alone |
//! | `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`, `BUSY` | refused before execution | waits a little and retries |
//! | `READONLY` | a demoted master refused the first write; our scripts write nothing before it | waits and retries |
//! | connection refused, no connection to the node | nothing was sent | waits and retries through the slot map |
//!
//! Everything else is returned as an error: timeouts, dropped connections
//! and I/O errors after the request was sent (transient; the limiter's
//! failure policy decides this one call), script and type errors (not
//! transient). Retries stop at the store's timeout and after
//! [`MAX_ATTEMPTS`] attempts, whichever comes first.
//!
//! # Pacing: no redirect storm during a failover
//!
//! While a master is dead and not yet replaced, the other nodes answer
//! `MOVED` to it and it refuses connections; following each `MOVED` at once
//! made every call bounce between them until its attempts ran out (about
//! 2,500 `MOVED` and 3,800 retries in 2 s of failover, 600 callers). So:
//!
//! - the first `MOVED` or `ASK` of a call is followed at once (a resharding
//!   costs one extra round trip); every later attempt of the call first
//!   waits [`backoff`]: jittered, exponential from 2 ms, at most 64 ms, and
//!   never past the store's timeout;
//! - a `MOVED` to a node that has just refused this call's connection is
//!   not followed: the slot map is refreshed soon after a `MOVED` or a
//!   refused connection (the store's own, [`crate::ClusterStore::builder`];
//!   fred re-reads `CLUSTER SLOTS` itself), so the store waits and retries
//!   through the slot map instead of bouncing;
//! - a call retries at most [`MAX_RETRIES`] times after errors that say the
//!   cluster cannot serve it now (refused or missing connections,
//!   `CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN`, `LOADING`, `BUSY`,
//!   `READONLY`); then it fails with a transient error, and the limiter's
//!   failure policy (and circuit breaker) decide until the cluster has
//!   promoted a replica. A failover takes seconds (`cluster-node-timeout`
//!   plus the election): retrying one call for longer only adds load.
//!
//! Redirects themselves (`MOVED` to a live node, `ASK`) are not limited
//! beyond [`MAX_ATTEMPTS`] and the timeout: during a resharding they lead
//! to the key.
//!
//! The client libraries' own retry loops cannot tell these cases apart
//! (redis-rs' cluster connection re-sends after a timeout or a dropped
//! connection; fred after a connection closes with the command in flight),
//! so the store does without them: the builder's store sends each attempt
//! once on its own connection to the node (redis-rs' multiplexed
//! connections never re-send), a `ClusterConnection` you bring must be
//! built with `retries(0)`, and fred gets a per-command `max_attempts = 1`
//! on every script, whatever the client's configuration (see the crate
//! docs).

use std::time::Duration;

use ratelimit_core::StoreError;

/// How long a failed connection attempt to a node is remembered: calls
/// for the node meanwhile fail at once, without a new attempt.
pub(crate) const RECONNECT_AFTER: Duration = Duration::from_millis(20);

/// The most attempts one decision makes (redirects and retries included).
pub const MAX_ATTEMPTS: u32 = 16;

/// The most retries one decision makes after errors that say the cluster
/// cannot serve it now (refused or missing connections, `CLUSTERDOWN`,
/// `TRYAGAIN`, ...): see the module docs.
pub const MAX_RETRIES: u32 = 2;

/// The first wait of [`backoff`]: 2 ms.
pub const BACKOFF_BASE: Duration = Duration::from_millis(2);

/// The longest wait of [`backoff`]: 64 ms.
pub const BACKOFF_MAX: Duration = Duration::from_millis(64);

/// A node address from a redirect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Addr {
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl Addr {
    /// The node's name: `host:port` (`[host]:port` for an IPv6 address).
    pub(crate) fn name(&self) -> String {
        node_name(&self.host, self.port)
    }
}

/// A node's name, as the slot map and the failure domains spell it:
/// `host:port`, or `[host]:port` for an IPv6 address.
pub(crate) fn node_name(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Where the next attempt goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// To the master of the key's slot, as the slot map says (the store's own,
    /// or the client's for a `ClusterConnection` or fred).
    Key,
    /// To the node a `MOVED` named.
    Moved(Addr),
    /// To the node an `ASK` named, preceded by `ASKING`.
    Ask(Addr),
}

/// What a failed attempt means for the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// The script may have run, or cannot run: return the error.
    Fail,
    /// Follow a `MOVED`.
    Moved(Addr),
    /// Follow an `ASK`.
    Ask(Addr),
    /// Send the source with `EVAL`, same route.
    NoScript,
    /// Refused before running (`CLUSTERDOWN`, `MASTERDOWN`, ...): wait,
    /// then retry through the slot map.
    Backoff,
    /// `TRYAGAIN`: refused before running because the call's keys are
    /// split by a slot migration. A call of one request waits and retries;
    /// a batch of several requests goes back to
    /// be sent request by request (`ratelimit_redis::engine::Straddles`).
    TryAgain,
    /// The node could not be reached (connection refused, no connection to
    /// it): nothing was sent; wait, then retry through the slot map.
    Unreachable,
}

/// A failed attempt: the error, and what it allows next.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) error: StoreError,
    pub(crate) next: Next,
}

/// Codes after which the command was refused before running.
const BACKOFF_CODES: &[&str] = &["CLUSTERDOWN", "MASTERDOWN", "LOADING", "BUSY", "READONLY"];

fn parse_addr(addr: &str) -> Option<Addr> {
    let (host, port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some(Addr {
        host: host.to_owned(),
        port: port.parse().ok()?,
    })
}

/// Classifies a server error reply by its text (`MOVED 3999 127.0.0.1:6381`),
/// or `None` when it is not one the store retries.
pub(crate) fn classify_reply(message: &str) -> Option<Next> {
    let mut words = message.split_ascii_whitespace();
    let code = words.next()?;
    match code {
        "MOVED" | "ASK" => {
            let _slot = words.next()?;
            let addr = parse_addr(words.next()?)?;
            Some(if code == "MOVED" {
                Next::Moved(addr)
            } else {
                Next::Ask(addr)
            })
        }
        "NOSCRIPT" => Some(Next::NoScript),
        "TRYAGAIN" => Some(Next::TryAgain),
        c if BACKOFF_CODES.contains(&c) => Some(Next::Backoff),
        _ => None,
    }
}

/// Classifies a redis-rs error.
pub(crate) fn classify_redis(err: &redis::RedisError) -> Next {
    if let (Some(code), Some(detail)) = (err.code(), err.detail())
        && let Some(next) = classify_reply(&format!("{code} {detail}"))
    {
        return next;
    }
    if let Some(next) = err.code().and_then(classify_reply) {
        return next;
    }
    if err.is_connection_refusal()
        || matches!(err.kind(), redis::ErrorKind::ClusterConnectionNotFound)
        || (matches!(err.kind(), redis::ErrorKind::Client)
            && err.to_string().contains("connection not found"))
    {
        return Next::Unreachable;
    }
    Next::Fail
}

/// How long to wait before the `n`-th paced attempt of a call (1-based):
/// [`BACKOFF_BASE`] doubling up to [`BACKOFF_MAX`], then a random
/// fraction between a half and the whole of it (jitter, so that calls
/// that failed together do not retry together).
pub fn backoff(n: u32) -> Duration {
    let ceiling = (BACKOFF_BASE * (1u32 << n.saturating_sub(1).min(10))).min(BACKOFF_MAX);
    let half = ceiling / 2;
    half + half.mul_f64(jitter())
}

/// A number in `[0, 1)`, different on every call (from the standard
/// library's randomly keyed hasher: no dependency, good enough to spread
/// retries).
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos().into()),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies() {
        let a = Addr {
            host: "127.0.0.1".into(),
            port: 6381,
        };
        assert_eq!(
            classify_reply("MOVED 3999 127.0.0.1:6381"),
            Some(Next::Moved(a.clone()))
        );
        assert_eq!(
            classify_reply("ASK 3999 127.0.0.1:6381"),
            Some(Next::Ask(a))
        );
        assert_eq!(
            classify_reply("NOSCRIPT No matching script. Please use EVAL."),
            Some(Next::NoScript)
        );
        assert_eq!(
            classify_reply("TRYAGAIN Multiple keys request during rehashing of slot"),
            Some(Next::TryAgain)
        );
        assert_eq!(
            classify_reply("CLUSTERDOWN The cluster is down"),
            Some(Next::Backoff)
        );
        assert_eq!(classify_reply("ERR Error running script"), None);
        assert_eq!(classify_reply("WRONGTYPE Operation"), None);
        assert_eq!(classify_reply("MOVED"), None);
        assert_eq!(classify_reply(""), None);
    }

    #[test]
    fn redis_errors() {
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(classify_redis(&refused), Next::Unreachable);
        let timeout = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(classify_redis(&timeout), Next::Fail);
        let reset =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(classify_redis(&reset), Next::Fail);
    }

    #[test]
    fn backoff_is_jittered_exponential_and_bounded() {
        for _ in 0..100 {
            let b1 = backoff(1);
            assert!(b1 >= Duration::from_millis(1) && b1 <= Duration::from_millis(2));
            let b3 = backoff(3);
            assert!(b3 >= Duration::from_millis(4) && b3 <= Duration::from_millis(8));
            let b = backoff(100);
            assert!(b >= BACKOFF_MAX / 2 && b <= BACKOFF_MAX);
        }
        let waits: std::collections::HashSet<Duration> = (0..20).map(|_| backoff(6)).collect();
        assert!(waits.len() > 1, "no jitter");
    }
}
