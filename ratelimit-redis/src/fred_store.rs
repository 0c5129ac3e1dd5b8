//! A [`RedisStore`] over fred (feature `fred`): over a client the
//! application holds ([`RedisStore::from_fred`]), or built from the
//! builder's settings ([`RedisStoreBuilder::build_fred`], over Sentinel
//! too).

use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::Value;
use ratelimit_core::StoreError;
use redis::IntoConnectionInfo;

use crate::fred_build::{Topology, command, config, probe};
use crate::fred_sentinel::FredPrimary;
use crate::store::{Backend, RedisStore, RedisStoreBuilder};
use crate::tls::redacted;

impl RedisStore {
    /// A store over a fred client you already hold (initialised with
    /// `init()`), with prefix `rl`, the server's clock and a per-call bound
    /// of [`crate::DEFAULT_CALL_TIMEOUT`].
    ///
    /// Any `ConnectionConfig::max_command_attempts` is fine: the store sends
    /// every script with fred's per-command `max_attempts = 1`, so a script
    /// whose reply was lost is never sent again (which would count the
    /// request twice). Give the client a `ReconnectPolicy`. Its
    /// `PerformanceConfig::default_command_timeout` applies to the other
    /// commands you send through it, not to the store's scripts: each
    /// script waits for its reply until its caller's deadline, timed by the
    /// store's one timer per call (the scripts go with a zero per-command
    /// timeout, so fred arms none), as with redis-rs: a busy node is not a
    /// failed one.
    pub fn from_fred(client: Client) -> Self {
        let node = client
            .client_config()
            .server
            .hosts()
            .first()
            .map_or_else(|| "redis".to_owned(), |s| format!("{}:{}", s.host, s.port));
        Self::from_backend(Backend::Fred(client), &node)
    }
}

impl RedisStoreBuilder {
    /// Connects with a fred client instead of redis-rs (feature `fred`)
    /// and builds the store: the same URL (or sentinels), credentials, TLS
    /// files, prefix, timeouts and checks at start as [`Self::build`]. A
    /// store over Sentinel finds and follows the primary itself, as the
    /// redis-rs store does (its watcher asks the sentinels and the
    /// replicas), and sends its calls over
    /// one centralized fred client to it.
    pub async fn build_fred(self) -> Result<RedisStore, StoreError> {
        let options = &self.options;
        // Each call is bounded by its caller's deadline and the store's
        // bound on a decision; the response timeout bounds the set-up
        // commands below.
        let mut engine =
            options.engine(options.connection_timeout + 3 * options.response_timeout, 1)?;
        if let Some(sentinel) = &self.sentinel {
            return self.build_fred_sentinel(sentinel.clone(), engine).await;
        }
        let (urls, topology, master, node) = match &self.sentinel {
            Some(s) => (
                s.sentinels.clone(),
                Topology::Sentinel,
                s.master.clone(),
                format!("{} (Sentinel)", s.master),
            ),
            None => {
                let node = match self.url.as_str().into_connection_info() {
                    Ok(info) => info.addr().to_string(),
                    Err(_) => redacted(&self.url),
                };
                (
                    vec![self.url.clone()],
                    Topology::Centralized,
                    String::new(),
                    node,
                )
            }
        };
        let (client, tls, user) = config(
            &urls,
            topology,
            &master,
            &options.security,
            options.connection_timeout,
            options.response_timeout,
        )?;
        let checked = |e: StoreError| {
            let e = crate::tls::explained(e, &node, tls);
            let text = e.to_string();
            if crate::acl::is_denied(&text) {
                crate::acl::denied(&text, &user, &options.prefix, false)
            } else {
                e
            }
        };
        let wait = options.response_timeout.max(Duration::from_millis(500));
        // With an I/O thread, fred's connection task runs there.
        let io = if options.io_thread {
            let io = crate::io::IoThread::start("ratelimit-redis-io")?;
            engine.set_io_thread(Some(Arc::clone(&io)));
            Some(io)
        } else {
            None
        };
        let connect = async {
            let init = match &io {
                Some(io) => {
                    let c = client.clone();
                    io.spawn(async move { c.init().await.map(drop) })
                        .await
                        .unwrap_or_else(|e| {
                            Err(fred::error::Error::new(
                                fred::error::ErrorKind::Unknown,
                                format!("the store's I/O thread failed while connecting: {e}"),
                            ))
                        })
                }
                None => client.init().await.map(drop),
            };
            init.map_err(|e| {
                checked(StoreError::backend(
                    format!("cannot reach {node}: {e}"),
                    true,
                    e,
                ))
            })
        };
        match tokio::time::timeout(wait + options.connection_timeout * 4, connect).await {
            Ok(r) => {
                r?;
            }
            Err(_) => {
                let _ = client.quit().await;
                return Err(checked(StoreError::message(
                    format!("cannot reach {node}: no connection within the timeout"),
                    true,
                )));
            }
        }
        let r = setup(&client, &node, wait, &options.prefix).await;
        if let Err(e) = r {
            let _ = client.quit().await;
            return Err(checked(e));
        }
        if let Ok(Value::Array(t)) = command(&client, &node, wait, "TIME", vec![]).await {
            let part = |i: usize| -> i64 {
                t.get(i)
                    .and_then(|v| v.as_string())
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0)
            };
            engine.server_clock().observe(
                0,
                part(0).saturating_mul(1_000_000).saturating_add(part(1)),
                Instant::now(),
            );
        }
        Ok(RedisStore::assemble(Backend::Fred(client), &node, engine))
    }
}

impl RedisStoreBuilder {
    /// [`Self::build_fred`] over Sentinel: the store's own watcher finds
    /// the primary (see [`FredPrimary`]).
    async fn build_fred_sentinel(
        &self,
        sentinel: crate::sentinel::SentinelConfig,
        engine: crate::engine::Engine,
    ) -> Result<RedisStore, StoreError> {
        let options = &self.options;
        let watch = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(options.connection_timeout))
            .set_min_delay(Duration::from_millis(25))
            .set_max_delay(Duration::from_millis(100))
            .set_number_of_retries(4);
        let primary = crate::sentinel::Primary::connect(
            &sentinel,
            options.security.clone(),
            options.connection_timeout,
            options.response_timeout,
            watch,
        )
        .await?;
        let tls = primary.tls();
        let fred = Arc::new(FredPrimary::new(
            primary,
            options.security.clone(),
            options.connection_timeout,
            options.response_timeout,
        ));
        let node = format!("{} (Sentinel)", sentinel.master);
        let user = options
            .security
            .username
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let checked = |e: StoreError| {
            let e = crate::tls::explained(e, &node, tls);
            let text = e.to_string();
            if crate::acl::is_denied(&text) {
                crate::acl::denied(&text, &user, &options.prefix, false)
            } else {
                e
            }
        };
        let client = fred.client().await.map_err(checked)?;
        let wait = options.response_timeout.max(Duration::from_millis(500));
        setup(&client, &node, wait, &options.prefix)
            .await
            .map_err(checked)?;
        if let Ok(Value::Array(t)) = command(&client, &node, wait, "TIME", vec![]).await {
            let part = |i: usize| -> i64 {
                t.get(i)
                    .and_then(|v| v.as_string())
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0)
            };
            engine.server_clock().observe(
                0,
                part(0).saturating_mul(1_000_000).saturating_add(part(1)),
                Instant::now(),
            );
        }
        Ok(RedisStore::assemble(
            Backend::FredSentinel(fred),
            &node,
            engine,
        ))
    }
}

/// The scripts loaded and every permission checked (see [`crate::acl`]).
async fn setup(
    client: &Client,
    node: &str,
    wait: Duration,
    prefix: &str,
) -> Result<(), StoreError> {
    command(client, node, wait, "TIME", vec![]).await?;
    for script in crate::scripts::all() {
        command(
            client,
            node,
            wait,
            "SCRIPT",
            vec!["LOAD".into(), script.lua().into()],
        )
        .await?;
    }
    probe(client, node, wait, prefix).await
}
