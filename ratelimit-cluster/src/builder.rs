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
        let mut engine = options.engine(
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
        let security = &options.security;
        let mut nodes = Nodes::new(
            &self.seeds.0,
            options.response_timeout,
            options.connection_timeout,
            security,
        )
        .map_err(|e| {
            StoreError::message(
                format!("cannot set up a Redis Cluster client for {}: {e}", seeds()),
                false,
            )
        })?;
        if options.io_thread {
            // Every node's connection and batch calls on the store's own
            // thread (`ratelimit_redis::io`).
            let io = ratelimit_redis::io::IoThread::start("ratelimit-cluster-io")?;
            engine.set_io_thread(Some(Arc::clone(&io)));
            nodes.set_io(io);
        }
        let first = self.seeds.0.first().map(String::as_str).unwrap_or("");
        let tls = first.starts_with("rediss://");
        let user = security
            .username
            .clone()
            .or_else(|| {
                redis::IntoConnectionInfo::into_connection_info(first)
                    .ok()
                    .and_then(|i| i.redis_settings().username().map(str::to_owned))
            })
            .unwrap_or_else(|| "default".to_owned());
        let checked = |e: StoreError| {
            let e = ratelimit_redis::tls::explained(e, "the cluster's nodes", tls);
            let text = e.to_string();
            if ratelimit_redis::acl::is_denied(&text) {
                ratelimit_redis::acl::denied(&text, &user, &options.prefix, true)
            } else {
                e
            }
        };
        // One direct attempt on the seeds first, given at least a second
        // each, until one connects: its error names the cause (a
        // certificate, a password), where attempts within the connection
        // timeout could end on a bare timeout (a TLS handshake on a busy
        // machine).
        let patient = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connection_timeout.max(Duration::from_secs(1))))
            .set_response_timeout(Some(options.response_timeout.max(Duration::from_secs(1))));
        let mut first_error = None;
        for url in &self.seeds.0 {
            let client = security.redis_client(url)?;
            match client
                .get_multiplexed_async_connection_with_config(&patient)
                .await
            {
                Ok(_) => {
                    first_error = None;
                    break;
                }
                Err(e) => {
                    if first_error.is_none() {
                        first_error = Some(checked(StoreError::backend(
                            format!(
                                "cannot reach the Redis Cluster through its seed nodes {}: {}: {e}",
                                seeds(),
                                redacted(url)
                            ),
                            true,
                            e,
                        )));
                    }
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        let nodes = Arc::new(nodes);
        let store = ClusterStore::with_engine(Backend::Nodes(Arc::clone(&nodes)), engine);
        // The slot map: which master serves each slot (the routes and the
        // failure domains).
        let ranges = nodes.slot_ranges(&store.router.slots).await.map_err(|e| {
            checked(StoreError::backend(
                format!(
                    "cannot reach the Redis Cluster through its seed nodes {}: {e}",
                    seeds()
                ),
                e.is_transient(),
                e,
            ))
        })?;
        store.router.slots.set_ranges(&ranges);
        // Every master's clock, learnt now: the first call on each slot
        // carries a deadline too (see `ratelimit_redis::deadline`).
        nodes
            .learn_clocks(&store.router.slots, store.engine.server_clock())
            .await;
        if self.load_scripts {
            store.load_scripts().await.map_err(checked)?;
        }
        // Every permission the store needs, on every master
        // (`ratelimit_redis::acl`).
        nodes
            .check_permissions(&store.router.slots, &options.prefix)
            .await
            .map_err(checked)?;
        Ok(store)
    }
}

#[cfg(feature = "fred")]
impl ClusterStoreBuilder {
    /// Connects with a clustered fred client instead of redis-rs (feature
    /// `fred`) and builds the store: the same seeds, credentials, TLS
    /// files, prefix, timeouts, and checks at start (scripts loaded on
    /// every primary, every permission checked on each) as
    /// [`Self::build`].
    pub async fn build_fred(self) -> Result<ClusterStore, StoreError> {
        use fred::interfaces::{ClientLike, ClusterInterface, LuaInterface};
        use ratelimit_redis::fred_build::{Topology, config};
        let options = &self.options;
        let (client, tls, user) = config(
            &self.seeds.0,
            Topology::Clustered,
            "",
            &options.security,
            options.connection_timeout,
            options.response_timeout,
        )?;
        let checked = |e: StoreError| {
            let e = ratelimit_redis::tls::explained(e, "the cluster's nodes", tls);
            let text = e.to_string();
            if ratelimit_redis::acl::is_denied(&text) {
                ratelimit_redis::acl::denied(&text, &user, &options.prefix, true)
            } else {
                e
            }
        };
        let seeds: Vec<String> = self.seeds.0.iter().map(|u| redacted(u)).collect();
        let wait = options.response_timeout.max(Duration::from_millis(500));
        let init = tokio::time::timeout(wait + 4 * options.connection_timeout, client.init()).await;
        let failed = match init {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(StoreError::backend(
                format!(
                    "cannot reach the Redis Cluster through its seed nodes {}: {e}",
                    seeds.join(", ")
                ),
                true,
                e,
            )),
            Err(_) => Some(StoreError::message(
                format!(
                    "cannot reach the Redis Cluster through its seed nodes {}: no connection within the timeout",
                    seeds.join(", ")
                ),
                true,
            )),
        };
        if let Some(e) = failed {
            let _ = client.quit().await;
            return Err(checked(e));
        }
        let setup = async {
            if self.load_scripts {
                for script in ratelimit_redis::scripts::all() {
                    let _: String = client
                        .script_load_cluster(script.lua())
                        .await
                        .map_err(error::from_fred)?;
                }
            }
            let ranges: Vec<(u16, u16)> = client
                .cached_cluster_state()
                .map(|s| s.slots().iter().map(|r| (r.start, r.end)).collect())
                .unwrap_or_default();
            for range in ranges {
                let Some(key) = crate::nodes::probe_key(&options.prefix, &[range]) else {
                    continue;
                };
                probe_fred(&client, &key, wait).await?;
            }
            Ok::<_, StoreError>(())
        };
        if let Err(e) = setup.await {
            let _ = client.quit().await;
            return Err(checked(e));
        }
        // With an I/O thread, every master's client and the batch calls run
        // on it (`ratelimit_redis::io`).
        let io = if options.io_thread {
            Some(ratelimit_redis::io::IoThread::start(
                "ratelimit-cluster-io",
            )?)
        } else {
            None
        };
        let mut engine =
            ratelimit_redis::engine::Engine::new(crate::DEFAULT_CALL_TIMEOUT, keys::SLOTS);
        engine.set_io_thread(io.clone());
        let nodes = crate::fred::FredNodes::new(client).with_io(io);
        let mut store =
            ClusterStore::with_engine(crate::connection::Backend::Fred(Arc::new(nodes)), engine)
                .with_prefix(&options.prefix)?;
        if let Some(timeout) = options.timeout {
            store = store.with_timeout(timeout);
        }
        store = store.with_max_in_flight(options.max_in_flight);
        if let Some(clock) = &options.clock {
            store = store.with_clock(SharedClock(Arc::clone(clock)));
        }
        Ok(store)
    }
}

/// An injected clock shared with the builder's options.
#[cfg(feature = "fred")]
#[derive(Debug)]
struct SharedClock(Arc<dyn ratelimit_core::Clock>);

#[cfg(feature = "fred")]
impl ratelimit_core::Clock for SharedClock {
    fn now(&self) -> ratelimit_core::Micros {
        self.0.now()
    }
}

/// The permission check on the master of `key`'s slot, through fred.
#[cfg(feature = "fred")]
async fn probe_fred(
    client: &fred::clients::Client,
    key: &str,
    wait: Duration,
) -> Result<(), StoreError> {
    use fred::interfaces::ClientLike;
    use fred::types::{ClusterHash, CustomCommand, Value};
    let slot = fred::util::redis_keyslot(key.as_bytes());
    let eval = || CustomCommand::new_static("EVAL", ClusterHash::Custom(slot), false);
    let send = |args: Vec<Value>| async move {
        match tokio::time::timeout(wait, client.custom::<Value, _>(eval(), args)).await {
            Ok(r) => r.map_err(error::from_fred),
            Err(_) => Err(StoreError::message(
                format!("no reply within {wait:?} to the permission check"),
                true,
            )),
        }
    };
    // EVAL needs a key of the slot to be routed there.
    send(vec!["return 1".into(), 1_i64.into(), key.into()]).await?;
    let reply = send(vec![
        ratelimit_redis::acl::PROBE.into(),
        1_i64.into(),
        key.into(),
    ])
    .await?;
    if let Value::Array(denied) = reply
        && let Some(first) = denied.first().and_then(|v| v.as_string())
    {
        return Err(StoreError::message(first, false));
    }
    Ok(())
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
    ratelimit_redis::tls::redacted(url)
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
