//! [`ClusterStoreBuilder`]: a [`ClusterStore`] over redis-rs, one connection
//! per node.

use std::fmt;
use std::time::Duration;

use ratelimit_core::StoreError;
use ratelimit_redis::options::Options;
use ratelimit_redis::{error, keys};
use std::sync::Arc;

use crate::connection::Backend;
use crate::nodes::Nodes;
use crate::store::ClusterStore;

/// Default time a topology or set-up command (`CLUSTER SLOTS`, `TIME`,
/// `SCRIPT LOAD`) waits for a node's reply: 30 ms (as the single-node
/// store). Script calls wait until their callers' deadlines.
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
#[derive(Debug)]
pub struct ClusterStoreBuilder {
    seeds: Seeds,
    options: Options,
    load_scripts: bool,
}

/// The seed nodes' URLs, counted but not shown by `Debug`: they may hold a
/// password.
struct Seeds(Vec<String>);

impl fmt::Debug for Seeds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} seed node URLs", self.0.len())
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
            seeds: Seeds(urls.into_iter().map(Into::into).collect()),
            options: Options::default(),
            load_scripts: true,
        }
    }
}

impl ClusterStoreBuilder {
    ratelimit_redis::options_setters!(
        timeout_default = "the larger of [`crate::DEFAULT_CALL_TIMEOUT`] and one connection \
                           timeout plus four response timeouts; redirects and retries \
                           included"
    );

    /// Whether [`ClusterStoreBuilder::build`] loads the scripts on every
    /// master (default true; see [`ClusterStore::load_scripts`]).
    pub fn load_scripts(mut self, load: bool) -> Self {
        self.load_scripts = load;
        self
    }

    /// Connects and builds the store.
    ///
    /// The store reads the slot map (`CLUSTER SLOTS`) from a seed node and
    /// holds one redis-rs multiplexed connection per node, opened on
    /// demand within the connection timeout, every node
    /// reached with the first seed URL's settings (credentials, TLS); it
    /// routes each call itself (see [`crate::retry`] for what it re-sends:
    /// only what cannot count a request twice). Fails on an invalid prefix
    /// or URL, or when no seed node can be reached now; once built, the
    /// store reconnects and follows topology changes by itself.
    pub async fn build(self) -> Result<ClusterStore, StoreError> {
        let options = &self.options;
        let engine = options.engine(
            (options.connection_timeout + 4 * options.response_timeout)
                .max(crate::DEFAULT_CALL_TIMEOUT),
            keys::SLOTS,
        )?;
        if self.seeds.0.is_empty() {
            return Err(StoreError::message(
                "a cluster store needs at least one seed node URL",
                false,
            ));
        }
        for url in &self.seeds.0 {
            redis::IntoConnectionInfo::into_connection_info(url.as_str()).map_err(|e| {
                naming(
                    format!("invalid Redis Cluster seed node URL {}", redacted(url)),
                    e,
                )
            })?;
        }
        let seeds = || {
            let urls: Vec<String> = self.seeds.0.iter().map(|u| redacted(u)).collect();
            urls.join(", ")
        };
        let nodes = Nodes::new(
            &self.seeds.0,
            options.response_timeout,
            options.connection_timeout,
        )
        .map_err(|e| {
            naming(
                format!("cannot set up a Redis Cluster client for {}", seeds()),
                e,
            )
        })?;
        let nodes = Arc::new(nodes);
        let store = ClusterStore::with_engine(Backend::Nodes(Arc::clone(&nodes)), engine);
        // The slot map: which master serves each slot (the routes and the
        // failure domains).
        let ranges = nodes.slot_ranges(&store.router.slots).await.map_err(|e| {
            StoreError::backend(
                format!(
                    "cannot reach the Redis Cluster through its seed nodes {}: {e}",
                    seeds()
                ),
                e.is_transient(),
                e,
            )
        })?;
        store.router.slots.set_ranges(&ranges);
        // Every master's clock, learnt now: the first call on each slot
        // carries a deadline too (see `ratelimit_redis::deadline`).
        nodes
            .learn_clocks(&store.router.slots, store.engine.server_clock())
            .await;
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
