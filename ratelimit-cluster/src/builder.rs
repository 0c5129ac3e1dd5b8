//! [`ClusterStoreBuilder`]: a [`ClusterStore`] over redis-rs' `cluster-async`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::{Clock, StoreError};
use ratelimit_redis::engine::{DEFAULT_MAX_IN_FLIGHT, Engine};
use ratelimit_redis::{error, keys};
use redis::cluster::ClusterClientBuilder;

use crate::connection::Backend;
use crate::store::ClusterStore;

/// Default time to wait for each reply from a node: 30 ms (as the
/// single-node store).
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = ratelimit_redis::DEFAULT_RESPONSE_TIMEOUT;
/// Default time to wait for each connection attempt to a node: 50 ms.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = ratelimit_redis::DEFAULT_CONNECTION_TIMEOUT;

/// Builds a [`ClusterStore`] over redis-rs. See [`ClusterStore::builder`].
///
/// ```no_run
/// # async fn example() -> Result<(), ratelimit_core::StoreError> {
/// use std::time::Duration;
/// use ratelimit_cluster::ClusterStore;
///
/// let store = ClusterStore::builder(["redis://10.0.0.1:6379/", "redis://10.0.0.2:6379/"])
///     .prefix("myapp:rl")
///     .response_timeout(Duration::from_millis(20))
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
pub struct ClusterStoreBuilder {
    urls: Vec<String>,
    prefix: String,
    clock: Option<Arc<dyn Clock>>,
    response_timeout: Duration,
    connection_timeout: Duration,
    timeout: Option<Duration>,
    max_in_flight: usize,
    load_scripts: bool,
}

impl fmt::Debug for ClusterStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // URLs may hold a password: leave them out.
        f.debug_struct("ClusterStoreBuilder")
            .field("nodes", &self.urls.len())
            .field("prefix", &self.prefix)
            .field("clock", &self.clock)
            .field("response_timeout", &self.response_timeout)
            .field("connection_timeout", &self.connection_timeout)
            .field("timeout", &self.timeout)
            .field("max_in_flight", &self.max_in_flight)
            .field("load_scripts", &self.load_scripts)
            .finish_non_exhaustive()
    }
}

impl ClusterStore {
    /// Connects to the cluster through any of the seed `urls`
    /// (`redis://host:port/`) with the defaults: prefix `rl`, the server's
    /// clock, [`DEFAULT_RESPONSE_TIMEOUT`], [`DEFAULT_CONNECTION_TIMEOUT`].
    pub async fn connect<I, S>(urls: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::builder(urls).build().await
    }

    /// Starts building a store for the cluster reachable through any of the
    /// seed `urls`.
    pub fn builder<I, S>(urls: I) -> ClusterStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClusterStoreBuilder {
            urls: urls.into_iter().map(Into::into).collect(),
            prefix: keys::DEFAULT_PREFIX.to_owned(),
            clock: None,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
            timeout: None,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            load_scripts: true,
        }
    }
}

impl ClusterStoreBuilder {
    /// The key prefix (default `rl`): 1 to 64 characters of
    /// `A-Z a-z 0-9 _ - . :`. Checked by [`ClusterStoreBuilder::build`].
    pub fn prefix(mut self, prefix: &str) -> Self {
        prefix.clone_into(&mut self.prefix);
        self
    }

    /// Takes "now" from `clock` instead of the server's `TIME`: for tests and
    /// replays only.
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// How long to wait for each reply from a node (default
    /// [`DEFAULT_RESPONSE_TIMEOUT`]). redis-rs waits forever unless told.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long to wait for each connection attempt to a node (default
    /// [`DEFAULT_CONNECTION_TIMEOUT`]).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// The bound on one whole decision, redirects and retries included
    /// (default: the larger of [`crate::DEFAULT_CALL_TIMEOUT`] and one
    /// connection timeout plus four response timeouts).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The bound on script calls in flight at once (default
    /// [`DEFAULT_MAX_IN_FLIGHT`]); beyond it a call fails at once with a
    /// transient error instead of queueing behind a stalled node.
    pub fn max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max;
        self
    }

    /// Whether [`ClusterStoreBuilder::build`] loads the scripts on every
    /// master (default true; see [`ClusterStore::load_scripts`]).
    pub fn load_scripts(mut self, load: bool) -> Self {
        self.load_scripts = load;
        self
    }

    /// Connects and builds the store.
    ///
    /// The redis-rs client is built with its own retries off (the store
    /// retries only what cannot count a request twice: see
    /// [`crate::retry`]), and with the response and connection timeouts set.
    /// Fails on an invalid prefix or URL, or when no seed node can be
    /// reached now; once built, the store reconnects and follows topology
    /// changes by itself.
    pub async fn build(self) -> Result<ClusterStore, StoreError> {
        keys::check_prefix(&self.prefix).map_err(|m| StoreError::message(m, false))?;
        if self.urls.is_empty() {
            return Err(StoreError::message(
                "a cluster store needs at least one seed node URL",
                false,
            ));
        }
        for url in &self.urls {
            redis::IntoConnectionInfo::into_connection_info(url.as_str()).map_err(|e| {
                naming(
                    format!("invalid Redis Cluster seed node URL {}", redacted(url)),
                    e,
                )
            })?;
        }
        let seeds = || {
            let urls: Vec<String> = self.urls.iter().map(|u| redacted(u)).collect();
            urls.join(", ")
        };
        let client = ClusterClientBuilder::new(self.urls.clone())
            // TCP_NODELAY: see `ratelimit_redis::RedisStoreBuilder::build`.
            .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
            .retries(0)
            .response_timeout(self.response_timeout)
            .overall_response_timeout(Some(self.response_timeout))
            .connection_timeout(self.connection_timeout)
            .build()
            .map_err(|e| {
                naming(
                    format!("cannot set up a Redis Cluster client for {}", seeds()),
                    e,
                )
            })?;
        let connection = client.get_async_connection().await.map_err(|e| {
            naming(
                format!(
                    "cannot reach the Redis Cluster through its seed nodes {}",
                    seeds()
                ),
                e,
            )
        })?;
        let timeout = self.timeout.unwrap_or_else(|| {
            (self.connection_timeout + 4 * self.response_timeout).max(crate::DEFAULT_CALL_TIMEOUT)
        });
        let mut engine = Engine::new(timeout, keys::SLOTS);
        engine.set_prefix(&self.prefix)?;
        engine.set_clock(self.clock);
        engine.set_max_in_flight(self.max_in_flight);
        // Every master's clock, learnt now: the first call on each slot
        // carries a deadline too (see `ratelimit_redis::deadline`).
        crate::connection::learn_clocks(&connection, engine.server_clock()).await;
        let store = ClusterStore::with_engine(Backend::Redis(connection), engine);
        // The failure domains: which master serves each slot.
        store.router.refresh_slots().await;
        if self.load_scripts {
            store.load_scripts().await?;
        }
        Ok(store)
    }
}

/// A redis-rs error, classified as [`error::from_redis`] does, its message
/// preceded by `what` (which names the node).
fn naming(what: String, e: redis::RedisError) -> StoreError {
    match error::from_redis(e) {
        StoreError::Backend {
            message,
            transient,
            source,
        } => StoreError::Backend {
            message: format!("{what}: {message}"),
            transient,
            source,
        },
        other => StoreError::message(format!("{what}: {other}"), other.is_transient()),
    }
}

/// `url` with its password, if any, replaced by `***`: error messages name
/// the node, never its credentials.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{path}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn passwords_are_redacted_and_the_rest_kept() {
        assert_eq!(redacted("redis://10.0.0.1:6379/"), "redis://10.0.0.1:6379/");
        assert_eq!(
            redacted("redis://:s3cret@10.0.0.1:6379/0"),
            "redis://:***@10.0.0.1:6379/0"
        );
        assert_eq!(
            redacted("rediss://app:p@ss@10.0.0.1:6380"),
            "rediss://app:***@10.0.0.1:6380"
        );
        assert_eq!(redacted("redis://app@10.0.0.1/"), "redis://app@10.0.0.1/");
        assert_eq!(redacted("not a url"), "not a url");
    }
}
