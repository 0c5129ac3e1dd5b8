//! Building a store over fred from the builder's settings (feature
//! `fred`): [`crate::RedisStoreBuilder::build_fred`], and the fred
//! configuration the cluster store's builder shares ([`config`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::config::{Config, ReconnectPolicy, Server, ServerConfig, TlsConfig, TlsConnector};
use fred::types::{ClusterHash, CustomCommand, Value};
use ratelimit_core::StoreError;
use redis::{ConnectionAddr, IntoConnectionInfo};

use crate::RedisStoreBuilder;
use crate::store::{Backend, RedisStore};
use crate::tls::{Security, redacted};

/// Where a fred client connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One node.
    Centralized,
    /// A Redis Cluster (the URLs are seeds).
    Clustered,
    /// The primary of a master name, through the sentinels (the URLs).
    Sentinel,
}

/// A fred client for `urls` (one node, a cluster's seeds, or the
/// sentinels, as `topology` says; for Sentinel `master` is the master
/// name) with `security`'s credentials and TLS files, the timeouts given,
/// one attempt per command, and reconnection every 25 ms to 100 ms.
/// Returns the client (not yet connected: `init()` it), whether it uses
/// TLS, and the ACL user.
pub fn config(
    urls: &[String],
    topology: Topology,
    master: &str,
    security: &Security,
    connection_timeout: Duration,
    response_timeout: Duration,
) -> Result<(Client, bool, String), StoreError> {
    let mut hosts = Vec::new();
    let mut tls = false;
    let mut user = None;
    let mut password = None;
    let mut db = 0;
    for url in urls {
        let info = url.as_str().into_connection_info().map_err(|e| {
            StoreError::message(format!("invalid Redis URL {}: {e}", redacted(url)), false)
        })?;
        match info.addr() {
            ConnectionAddr::Tcp(host, port) => hosts.push(Server::new(host.clone(), *port)),
            ConnectionAddr::TcpTls { host, port, .. } => {
                tls = true;
                hosts.push(Server::new(host.clone(), *port));
            }
            _ => {
                return Err(StoreError::message(
                    format!("{}: only TCP URLs are supported", redacted(url)),
                    false,
                ));
            }
        }
        let settings = info.redis_settings();
        user = user.or(settings.username().map(str::to_owned));
        password = password.or(settings.password().map(str::to_owned));
        db = settings.db();
    }
    if hosts.is_empty() {
        return Err(StoreError::message("no Redis URL given", false));
    }
    if !tls && security.has_tls_files() {
        return Err(StoreError::message(
            "TLS files were given but the URLs are not TLS URLs: use rediss://",
            false,
        ));
    }
    let (node_user, node_password) = match topology {
        // The sentinels' credentials are their URLs'; the nodes' the
        // builder's.
        Topology::Sentinel => (
            security.username.clone(),
            security.password.as_ref().map(|p| p.expose().to_owned()),
        ),
        _ => (
            security.username.clone().or(user.clone()),
            security
                .password
                .as_ref()
                .map(|p| p.expose().to_owned())
                .or(password.clone()),
        ),
    };
    let server = match topology {
        Topology::Centralized => ServerConfig::Centralized {
            server: hosts.swap_remove(0),
        },
        Topology::Clustered => ServerConfig::Clustered {
            hosts,
            policy: Default::default(),
        },
        Topology::Sentinel => ServerConfig::Sentinel {
            hosts,
            service_name: master.to_owned(),
            username: user,
            password,
        },
    };
    let tls_config = if tls {
        let rustls = security.rustls_config()?;
        Some(TlsConfig::from(TlsConnector::from(rustls)))
    } else {
        None
    };
    let config = Config {
        server,
        username: node_user.clone(),
        password: node_password,
        database: (db != 0).then(|| u8::try_from(db).unwrap_or(0)),
        tls: tls_config,
        fail_fast: true,
        ..Config::default()
    };
    let client = fred::types::Builder::from_config(config)
        .with_connection_config(|c| {
            c.connection_timeout = connection_timeout;
            c.internal_command_timeout = connection_timeout.max(Duration::from_millis(500));
            c.max_command_attempts = 1;
        })
        .with_performance_config(|p| {
            p.default_command_timeout = response_timeout;
        })
        .set_policy(ReconnectPolicy::new_exponential(0, 25, 100, 2))
        .build()
        .map_err(|e| StoreError::message(format!("invalid fred settings: {e}"), false))?;
    Ok((
        client,
        tls,
        node_user.unwrap_or_else(|| "default".to_owned()),
    ))
}

/// One set-up command through fred, bounded by `wait`.
pub async fn command(
    client: &Client,
    node: &str,
    wait: Duration,
    name: &'static str,
    args: Vec<Value>,
) -> Result<Value, StoreError> {
    let cmd = CustomCommand::new_static(name, ClusterHash::Random, false);
    match tokio::time::timeout(wait, client.custom::<Value, _>(cmd, args)).await {
        Ok(reply) => reply.map_err(crate::error::from_fred),
        Err(_) => Err(StoreError::message(
            format!("no reply from {node} within {wait:?} (the response timeout)"),
            true,
        )),
    }
}

/// The primary of a master name, for a store over fred: found and
/// followed across promotions by the store's own Sentinel watcher
/// ([`crate::sentinel`]: it asks the sentinels and the replicas they know,
/// every 10 ms while it has none that answers), with one centralized fred
/// client to it, replaced when the watcher names another node. fred's own
/// Sentinel client learns of a promotion only from the sentinels, which
/// may take up to a second after the replica answers as a primary.
pub(crate) struct FredPrimary {
    primary: Arc<crate::sentinel::Primary>,
    security: Security,
    connection_timeout: Duration,
    response_timeout: Duration,
    current: std::sync::Mutex<Option<(Arc<str>, Client)>>,
    connecting: tokio::sync::Mutex<()>,
}

impl FredPrimary {
    /// The primary now (`host:port`): the calls' failure domain.
    pub(crate) fn node(&self) -> Arc<str> {
        self.primary.node()
    }

    /// A call failed with `err`: the watcher looks for the primary when a
    /// failover explains it.
    pub(crate) fn failed(&self, err: &StoreError) {
        self.primary.failed(err);
    }

    fn cached(&self, node: &str) -> Option<Client> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        match &*current {
            Some((n, c)) if **n == *node => Some(c.clone()),
            _ => None,
        }
    }

    /// The fred client to the primary now, connected first when the
    /// primary moved (the old client is closed in the background).
    pub(crate) async fn client(&self) -> Result<Client, StoreError> {
        let node = self.primary.node();
        if let Some(c) = self.cached(&node) {
            return Ok(c);
        }
        let _one = self.connecting.lock().await;
        let node = self.primary.node();
        if let Some(c) = self.cached(&node) {
            return Ok(c);
        }
        let scheme = if self.primary.tls() {
            "rediss"
        } else {
            "redis"
        };
        let (client, _, _) = config(
            &[format!("{scheme}://{node}/")],
            Topology::Centralized,
            "",
            &self.security,
            self.connection_timeout,
            self.response_timeout,
        )?;
        let wait = self.connection_timeout * 4 + self.response_timeout;
        match tokio::time::timeout(wait, client.init()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(StoreError::backend(
                    format!("cannot reach {node}: {e}"),
                    true,
                    e,
                ));
            }
            Err(_) => {
                let _ = client.quit().await;
                return Err(StoreError::message(
                    format!("cannot reach {node}: no connection within {wait:?}"),
                    true,
                ));
            }
        }
        let old = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace((node, client.clone()));
        if let Some((_, old)) = old {
            tokio::spawn(async move {
                let _ = old.quit().await;
            });
        }
        Ok(client)
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
            let io = crate::io::IoThread::start("ratelimit-redis-io").map_err(|e| {
                StoreError::message(format!("cannot start the store's I/O thread: {e}"), false)
            })?;
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
        let fred = Arc::new(FredPrimary {
            primary,
            security: options.security.clone(),
            connection_timeout: options.connection_timeout,
            response_timeout: options.response_timeout,
            current: std::sync::Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        });
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

/// Runs [`crate::acl::PROBE`] (and `EVAL`) and reports the first denial.
pub async fn probe(
    client: &Client,
    node: &str,
    wait: Duration,
    prefix: &str,
) -> Result<(), StoreError> {
    command(
        client,
        node,
        wait,
        "EVAL",
        vec!["return 1".into(), 0_i64.into()],
    )
    .await?;
    let key = crate::acl::probe_key(prefix);
    let slot = fred::util::redis_keyslot(key.as_bytes());
    let cmd = CustomCommand::new_static("EVAL", ClusterHash::Custom(slot), false);
    let args: Vec<Value> = vec![crate::acl::PROBE.into(), 1_i64.into(), key.into()];
    let reply = match tokio::time::timeout(wait, client.custom::<Value, _>(cmd, args)).await {
        Ok(r) => r.map_err(crate::error::from_fred)?,
        Err(_) => {
            return Err(StoreError::message(
                format!("no reply from {node} within {wait:?} (the response timeout)"),
                true,
            ));
        }
    };
    if let Value::Array(denied) = reply
        && let Some(first) = denied.first().and_then(|v| v.as_string())
    {
        return Err(StoreError::message(first, false));
    }
    Ok(())
}
