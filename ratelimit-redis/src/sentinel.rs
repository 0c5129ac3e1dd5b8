//! A primary found through Redis Sentinel, followed across promotions
//! (redis-rs; fred's own Sentinel client is used by
//! `RedisStoreBuilder::build_fred`).
//!
//! The store asks the sentinels (`SENTINEL get-master-addr-by-name`) for
//! the primary of its master name, checks with `ROLE` that the node named
//! is a primary, and holds one reconnecting connection to it. It looks
//! again:
//!
//! - **when a call fails for a reason a failover explains**: the node
//!   unreachable (refused, reset, closed), or its answer `READONLY` (it was
//!   demoted) or `MASTERDOWN`. The failed call is not sent again (it may
//!   have run: a call is never counted twice); the store looks for the
//!   primary every [`RESOLVE_EVERY`] until it finds one, for at most
//!   [`RESOLVE_FOR`];
//! - **when the primary does not answer a `PING`** on its connection,
//!   sent every [`CHECK_EVERY`] in the background (a call the store gave
//!   up on by its own timeout says nothing to the connection);
//! - **every [`WATCH_EVERY`]**, in the background, to follow a switch the
//!   calls do not see (a manual `SENTINEL FAILOVER` whose old primary
//!   still answers for a moment).
//!
//! The sentinels learn of a promotion only when they next read the
//! promoted replica's `INFO` (up to a second later), so while looking the
//! store also asks the replicas the sentinels know (`SENTINEL replicas`)
//! for their `ROLE`: a replica that already answers `master` is the new
//! primary. A node the sentinels name that still answers `master` is
//! preferred to it. Before the new primary takes calls the store loads
//! its scripts there (a replica's script cache is its own).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use ratelimit_core::StoreError;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, ConnectionAddr, IntoConnectionInfo};

use crate::error;
use crate::tls::{Security, redacted};

/// How often the store looks for the primary while it has none that
/// answers.
pub const RESOLVE_EVERY: Duration = Duration::from_millis(10);
/// How long one search for the primary lasts at most (a later failure
/// starts another).
pub const RESOLVE_FOR: Duration = Duration::from_secs(60);
/// How often the store checks in the background that the primary answers
/// (`PING` on its connection).
pub const CHECK_EVERY: Duration = Duration::from_millis(20);
/// How often the store asks the sentinels in the background whether the
/// primary moved.
pub const WATCH_EVERY: Duration = Duration::from_millis(500);

/// Where the sentinels are and what they call the primary.
#[derive(Clone)]
pub struct SentinelConfig {
    /// The sentinels' URLs (`redis://host:26379/`, `rediss://` for TLS;
    /// a sentinel's own password in its URL).
    pub sentinels: Vec<String>,
    /// The master name the sentinels monitor (`sentinel monitor <name>`).
    pub master: String,
}

impl std::fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self.sentinels.iter().map(|u| redacted(u)).collect();
        f.debug_struct("SentinelConfig")
            .field("sentinels", &urls)
            .field("master", &self.master)
            .finish()
    }
}

/// The current primary of a master name and the connection to it.
pub(crate) struct Primary {
    master: String,
    sentinels: Vec<(String, redis::Client)>,
    /// Nodes are reached over TLS when the sentinels are.
    tls: bool,
    security: Security,
    connection_timeout: Duration,
    response_timeout: Duration,
    config: ConnectionManagerConfig,
    current: Mutex<(Arc<str>, ConnectionManager)>,
    searching: Mutex<bool>,
}

impl std::fmt::Debug for Primary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Primary")
            .field("master", &self.master)
            .field("node", &self.node())
            .finish_non_exhaustive()
    }
}

fn addr_name(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(h, p)
        | ConnectionAddr::TcpTls {
            host: h, port: p, ..
        } => {
            if h.contains(':') {
                format!("[{h}]:{p}")
            } else {
                format!("{h}:{p}")
            }
        }
        other => format!("{other}"),
    }
}

impl Primary {
    /// Finds the primary now and connects to it (with `config` for the
    /// connection manager); fails when no sentinel names one that answers.
    pub(crate) async fn connect(
        sentinel: &SentinelConfig,
        security: Security,
        connection_timeout: Duration,
        response_timeout: Duration,
        config: ConnectionManagerConfig,
    ) -> Result<Arc<Self>, StoreError> {
        if sentinel.sentinels.is_empty() {
            return Err(StoreError::message(
                "a Sentinel store needs at least one sentinel URL (redis://host:26379/)",
                false,
            ));
        }
        let mut sentinels = Vec::new();
        let mut tls = false;
        for url in &sentinel.sentinels {
            let info = url.as_str().into_connection_info().map_err(|e| {
                StoreError::message(
                    format!("invalid sentinel URL {}: {e}", redacted(url)),
                    false,
                )
            })?;
            tls |= matches!(info.addr(), ConnectionAddr::TcpTls { .. });
            // The sentinels' own credentials are their URLs'; TLS files
            // are shared with the nodes.
            let own = Security {
                username: None,
                password: None,
                ..security.clone()
            };
            let client = own.redis_client_for(info, &redacted(url))?;
            sentinels.push((redacted(url), client));
        }
        let probe = Probe {
            master: &sentinel.master,
            sentinels: &sentinels,
            tls,
            security: &security,
            connection_timeout,
            response_timeout,
        };
        let (node, client) = probe.find().await.map_err(|why| {
            StoreError::message(
                format!(
                    "no primary for master name {:?} through the sentinels {}: {why}",
                    sentinel.master,
                    sentinels
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                true,
            )
        })?;
        let manager = ConnectionManager::new_with_config(client, config.clone())
            .await
            .map_err(|e| {
                crate::tls::explained(
                    StoreError::backend(format!("cannot reach {node}: {e}"), true, e),
                    &node,
                    tls,
                )
            })?;
        let node: Arc<str> = Arc::from(node.as_str());
        let primary = Arc::new(Self {
            master: sentinel.master.clone(),
            sentinels,
            tls,
            security,
            connection_timeout,
            response_timeout,
            config,
            current: Mutex::new((node, manager)),
            searching: Mutex::new(false),
        });
        tokio::spawn(watch(Arc::downgrade(&primary)));
        Ok(primary)
    }

    /// The connection to the primary.
    pub(crate) fn manager(&self) -> ConnectionManager {
        self.lock().1.clone()
    }

    /// The primary's name, `host:port`.
    pub(crate) fn node(&self) -> Arc<str> {
        Arc::clone(&self.lock().0)
    }

    /// Whether the nodes are reached over TLS.
    pub(crate) fn tls(&self) -> bool {
        self.tls
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Arc<str>, ConnectionManager)> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A call failed with `err`: when a failover explains it, look for the
    /// primary (in the background, one search at a time).
    pub(crate) fn failed(self: &Arc<Self>, err: &StoreError) {
        let text = err.to_string();
        let moved = text.contains("READONLY")
            || text.contains("MASTERDOWN")
            || !error::reached_server(err) && !error::is_timeout(err);
        if moved {
            self.search();
        }
    }

    /// Looks for the primary every [`RESOLVE_EVERY`] until one answers
    /// (at most [`RESOLVE_FOR`]), in the background; one search at a time.
    fn search(self: &Arc<Self>) {
        {
            let mut searching = self.searching.lock().unwrap_or_else(|p| p.into_inner());
            if *searching {
                return;
            }
            *searching = true;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let until = Instant::now() + RESOLVE_FOR;
            loop {
                if me.follow().await.is_ok() || Instant::now() >= until {
                    break;
                }
                tokio::time::sleep(RESOLVE_EVERY).await;
            }
            *me.searching.lock().unwrap_or_else(|p| p.into_inner()) = false;
        });
    }

    /// Finds the primary and, when it is not the current one, connects to
    /// it, loads the scripts there and makes it current.
    async fn follow(&self) -> Result<(), String> {
        let probe = Probe {
            master: &self.master,
            sentinels: &self.sentinels,
            tls: self.tls,
            security: &self.security,
            connection_timeout: self.connection_timeout,
            response_timeout: self.response_timeout,
        };
        let (node, client) = probe.find().await?;
        if *self.node() == *node {
            return Ok(());
        }
        let manager = ConnectionManager::new_with_config(client, self.config.clone())
            .await
            .map_err(|e| format!("cannot reach the new primary {node}: {e}"))?;
        let mut m = manager.clone();
        for script in crate::scripts::all() {
            let load = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(script.lua())
                .to_owned();
            let wait = self.response_timeout * 4;
            match tokio::time::timeout(wait, load.query_async::<String>(&mut m)).await {
                Ok(Ok(_)) => {}
                // The calls send the source on NOSCRIPT anyway.
                _ => break,
            }
        }
        let node: Arc<str> = Arc::from(node.as_str());
        tracing::warn!(
            master = %self.master,
            node = &*node,
            "rate-limit store: the primary moved (Sentinel); calls go to the new one"
        );
        *self.lock() = (node, manager);
        Ok(())
    }
}

/// While the store lives: `PING`s the primary every [`CHECK_EVERY`]
/// (a call the store gave up on never reaches [`Primary::failed`]) and
/// searches when it does not answer; asks the sentinels every
/// [`WATCH_EVERY`].
async fn watch(primary: Weak<Primary>) {
    let mut asked = Instant::now();
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let Some(primary) = primary.upgrade() else {
            return;
        };
        let mut manager = primary.manager();
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<String>(&mut manager);
        let alive = matches!(
            tokio::time::timeout(primary.response_timeout, ping).await,
            Ok(Ok(_))
        );
        if !alive {
            primary.search();
        } else if asked.elapsed() >= WATCH_EVERY {
            asked = Instant::now();
            let _ = primary.follow().await;
        }
    }
}

/// One search for the primary.
struct Probe<'a> {
    master: &'a str,
    sentinels: &'a [(String, redis::Client)],
    tls: bool,
    security: &'a Security,
    connection_timeout: Duration,
    response_timeout: Duration,
}

impl Probe<'_> {
    fn config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connection_timeout))
            .set_response_timeout(Some(self.response_timeout * 4))
    }

    async fn connect(&self, client: &redis::Client) -> redis::RedisResult<MultiplexedConnection> {
        client
            .get_multiplexed_async_connection_with_config(&self.config())
            .await
    }

    /// A client for the node `host:port` with the nodes' settings.
    fn client(&self, host: &str, port: u16) -> Result<redis::Client, String> {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        self.security
            .redis_client(&format!("{scheme}://{host}:{port}/"))
            .map_err(|e| e.to_string())
    }

    /// Whether the node answers `ROLE` as a primary.
    async fn is_primary(&self, client: &redis::Client) -> Result<bool, String> {
        let mut conn = self.connect(client).await.map_err(|e| e.to_string())?;
        let role: redis::Value = redis::cmd("ROLE")
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        Ok(match role {
            redis::Value::Array(items) => {
                matches!(
                    items.first(),
                    Some(redis::Value::BulkString(b)) if b == b"master"
                ) || matches!(
                    items.first(),
                    Some(redis::Value::SimpleString(s)) if s == "master"
                )
            }
            _ => false,
        })
    }

    /// What the sentinels say: the primary's address and the replicas'.
    async fn ask(&self) -> Result<(Option<(String, u16)>, Vec<(String, u16)>), String> {
        let mut last = String::from("no sentinel answered");
        for (name, client) in self.sentinels {
            let mut conn = match self.connect(client).await {
                Ok(c) => c,
                Err(e) => {
                    last = format!("sentinel {name}: {e}");
                    continue;
                }
            };
            let master: Result<Option<(String, u16)>, _> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(self.master)
                .query_async(&mut conn)
                .await;
            let master = match master {
                Ok(m) => m,
                Err(e) => {
                    last = format!("sentinel {name}: {e}");
                    continue;
                }
            };
            let replicas: Vec<Vec<String>> = redis::cmd("SENTINEL")
                .arg("replicas")
                .arg(self.master)
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            let replicas = replicas
                .iter()
                .filter_map(|fields| {
                    let get = |k: &str| {
                        fields
                            .chunks(2)
                            .find(|kv| kv[0] == k)
                            .and_then(|kv| kv.get(1).cloned())
                    };
                    // Every replica is asked, whatever its flags: the
                    // sentinel's own link to a replica it just promoted
                    // may be down (the promotion closes its clients).
                    Some((get("ip")?, get("port")?.parse().ok()?))
                })
                .collect();
            if master.is_none() {
                last = format!(
                    "sentinel {name} does not know the master name {:?} (its `sentinel monitor`)",
                    self.master
                );
                continue;
            }
            return Ok((master, replicas));
        }
        Err(last)
    }

    /// The primary: the node the sentinels name if it answers as one, else
    /// a replica that already does.
    async fn find(&self) -> Result<(String, redis::Client), String> {
        let (master, replicas) = self.ask().await?;
        let mut why = String::new();
        if let Some((host, port)) = &master {
            let client = self.client(host, *port)?;
            match self.is_primary(&client).await {
                Ok(true) => return Ok((addr_name(client.get_connection_info().addr()), client)),
                Ok(false) => why = format!("{host}:{port}, named by the sentinels, is no primary"),
                Err(e) => {
                    let node = format!("{host}:{port}");
                    why = crate::tls::explain(&e, &node, self.tls)
                        .unwrap_or_else(|| format!("{node}, named by the sentinels: {e}"));
                }
            }
        }
        for (host, port) in &replicas {
            let client = self.client(host, *port)?;
            if let Ok(true) = self.is_primary(&client).await {
                return Ok((addr_name(client.get_connection_info().addr()), client));
            }
        }
        Err(why)
    }
}
