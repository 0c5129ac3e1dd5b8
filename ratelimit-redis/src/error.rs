//! Classifying client errors into [`StoreError`]s, transient or not.
//!
//! Transient (a later call may succeed; the limiter's failure policy
//! decides meanwhile): I/O errors, refused, reset or dropped connections,
//! timeouts, and the server replies `TRYAGAIN`, `LOADING`, `CLUSTERDOWN`,
//! `MASTERDOWN`, `BUSY`, `READONLY`, `MOVED` and `ASK` (a failover or
//! resharding in progress). Everything else is not: script errors,
//! `WRONGTYPE` (the key holds something this crate did not write), `NOPERM`,
//! authentication and configuration errors.

use ratelimit_core::StoreError;

/// Server error codes after which a retry may succeed.
pub const TRANSIENT_CODES: &[&str] = &[
    "TRYAGAIN",
    "LOADING",
    "CLUSTERDOWN",
    "MASTERDOWN",
    "BUSY",
    "READONLY",
    "MOVED",
    "ASK",
];

/// Whether a server error message (starting with its code, as `LOADING
/// Redis is loading the dataset in memory`) is transient.
pub fn is_transient_reply(message: &str) -> bool {
    let code = message.split_ascii_whitespace().next().unwrap_or("");
    TRANSIENT_CODES.contains(&code)
}

/// Whether `message` looks like a server error reply: it starts with an
/// upper-case error code (`ERR`, `WRONGTYPE`, `LOADING`) and a space.
pub fn is_server_reply(message: &str) -> bool {
    let code = message.split(' ').next().unwrap_or("");
    message.len() > code.len()
        && !code.is_empty()
        && code.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
}

/// Whether an error came from the server (an error reply: the node is
/// alive and answered) rather than from failing to reach it (refused,
/// reset or dropped connections, I/O errors, client timeouts): what a
/// node's breaker counts as evidence ([`crate::domains`]).
pub fn reached_server(err: &StoreError) -> bool {
    let StoreError::Backend {
        source: Some(source),
        ..
    } = err
    else {
        // Our own errors (a cost, a bad reply, an expired call) say nothing
        // against the node.
        return true;
    };
    if let Some(e) = source.downcast_ref::<redis::RedisError>() {
        return !(e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || matches!(e.kind(), redis::ErrorKind::ClusterConnectionNotFound));
    }
    #[cfg(feature = "fred")]
    if let Some(e) = source.downcast_ref::<fred::error::Error>() {
        use fred::error::ErrorKind;
        return match e.kind() {
            ErrorKind::IO | ErrorKind::Timeout | ErrorKind::Canceled | ErrorKind::Backpressure => {
                false
            }
            ErrorKind::Unknown => is_server_reply(e.details()),
            _ => true,
        };
    }
    // A wrapped error of ours ("cannot reach <node>: ..."), or another
    // client's: judge by the message.
    !err.is_transient()
}

/// Whether an error is a client-side timeout (no reply in time): judged by
/// the node's progress, not as an unreachable node.
pub fn is_timeout(err: &StoreError) -> bool {
    let StoreError::Backend {
        source: Some(source),
        ..
    } = err
    else {
        return matches!(err, StoreError::Timeout(_));
    };
    if let Some(e) = source.downcast_ref::<redis::RedisError>() {
        return e.is_timeout();
    }
    #[cfg(feature = "fred")]
    if let Some(e) = source.downcast_ref::<fred::error::Error>() {
        return matches!(e.kind(), fred::error::ErrorKind::Timeout);
    }
    source.downcast_ref::<StoreError>().is_some_and(is_timeout)
}

/// Classifies a redis-rs error.
pub fn from_redis(err: redis::RedisError) -> StoreError {
    let transient = err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err
            .code()
            .is_some_and(|code| TRANSIENT_CODES.contains(&code))
        || matches!(err.kind(), redis::ErrorKind::ClusterConnectionNotFound);
    StoreError::backend(format!("redis: {err}"), transient, err)
}

/// Classifies a fred error (feature `fred`).
#[cfg(feature = "fred")]
pub fn from_fred(err: fred::error::Error) -> StoreError {
    use fred::error::ErrorKind;
    let transient = match err.kind() {
        ErrorKind::IO
        | ErrorKind::Timeout
        | ErrorKind::Canceled
        | ErrorKind::Cluster
        | ErrorKind::Routing
        | ErrorKind::Backpressure => true,
        // fred reports server replies (`ERR ...`, `LOADING ...`) and some of
        // its own connection states ("Failed to route command.") as
        // `Unknown`: a reply is classified by its code, anything else is a
        // connection problem, and transient.
        ErrorKind::Unknown => {
            if is_server_reply(err.details()) {
                is_transient_reply(err.details())
            } else {
                true
            }
        }
        _ => false,
    };
    StoreError::backend(format!("redis (fred): {err}"), transient, err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        assert!(is_transient_reply(
            "LOADING Redis is loading the dataset in memory"
        ));
        assert!(is_transient_reply("BUSY Redis is busy running a script"));
        assert!(!is_transient_reply("WRONGTYPE Operation against a key"));
        assert!(!is_transient_reply("ERR Error running script"));
        assert!(!is_transient_reply(""));
        assert!(is_server_reply("ERR Error running script"));
        assert!(is_server_reply("LOADING Redis is loading"));
        assert!(!is_server_reply("Failed to route command."));
        assert!(!is_server_reply("ERR"));
    }
}
