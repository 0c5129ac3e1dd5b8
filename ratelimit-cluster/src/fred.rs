//! The fred backend (feature `fred`): one fred client per master, routed by
//! the store's own slot map.
//!
//! The application hands the store a clustered fred client; the store
//! keeps it for reading the slot map (`CLUSTER SLOTS`, through fred's own
//! cluster state) and opens, per node it sends to, a **centralized** fred
//! client with the same settings (credentials, TLS, connection and
//! reconnect settings), on demand. Every call goes to the master of its
//! slot as the store's slot map says ([`crate::slots`], corrected on
//! `MOVED`), so that, as with the redis-rs backend, one dead master fails
//! its own callers' calls and no other's: fred's clustered client drives
//! every node from one routing task, which stops sending to all of them
//! while it recovers from one (with it, a killed master opened every
//! master's breaker).
//!
//! Every script is sent with fred's per-command options `max_attempts = 1`
//! (fred never re-sends a script whose connection closed with it in
//! flight, which would count a request twice) and no timer of fred's own:
//! it waits for its reply until its caller's deadline, timed by the store,
//! as with redis-rs. The store follows `MOVED` and `ASK` itself (see
//! [`crate::retry`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use fred::clients::Client;
use fred::interfaces::{ClientLike, ClusterInterface, LuaInterface};
use fred::types::config::{Config, ConnectionConfig, Options, PerformanceConfig, ServerConfig};
use fred::types::{CustomCommand, Value};
use ratelimit_core::StoreError;
use ratelimit_redis::error;
use ratelimit_redis::scripts::Call;

use crate::retry::{self, Failure, Next, RECONNECT_AFTER, Route};
use crate::slots::SlotMap;

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

/// Every script command: one attempt (never re-sent), no redirection
/// followed inside fred (the store follows them), and no timer of fred's
/// own (the store's deadline bounds the call).
fn once() -> Options {
    Options {
        max_attempts: Some(1),
        max_redirections: Some(0),
        timeout: Some(Duration::ZERO),
        ..Options::default()
    }
}

/// The store's fred clients: the application's clustered one (the slot
/// map) and one centralized client per node, opened on demand.
pub(crate) struct FredNodes {
    seed: Client,
    config: Config,
    performance: PerformanceConfig,
    connection: ConnectionConfig,
    policy: Option<fred::types::config::ReconnectPolicy>,
    nodes: RwLock<HashMap<Arc<str>, Arc<FredNode>>>,
    /// The store's own I/O thread, when it has one
    /// (`ratelimit_redis::io`): every node's client runs there.
    io: Option<Arc<ratelimit_redis::io::IoThread>>,
}

impl std::fmt::Debug for FredNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FredNodes")
            .field(
                "nodes",
                &self
                    .nodes
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .keys()
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// One node's centralized client (once connected), and its last failed
/// connection attempt.
struct FredNode {
    name: Arc<str>,
    host: String,
    port: u16,
    client: tokio::sync::OnceCell<Client>,
    failed: Mutex<Option<(Instant, String)>>,
}

impl FredNodes {
    /// The clients for the cluster `seed` (a clustered client, initialised)
    /// reaches: every node with its settings.
    pub(crate) fn new(seed: Client) -> Self {
        let config = seed.client_config();
        let performance = seed.perf_config();
        let connection = seed.connection_config().clone();
        let policy = seed.client_reconnect_policy();
        Self {
            seed,
            config,
            performance,
            connection,
            policy,
            nodes: RwLock::default(),
            io: None,
        }
    }

    /// Opens and runs every node's client on `io`, the store's own I/O
    /// thread (`ratelimit_redis::io`).
    pub(crate) fn with_io(mut self, io: Option<Arc<ratelimit_redis::io::IoThread>>) -> Self {
        self.io = io;
        self
    }

    /// The node named `name` (`host:port`), created on first use.
    fn node(&self, name: &str) -> Option<Arc<FredNode>> {
        if let Some(n) = self
            .nodes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            return Some(Arc::clone(n));
        }
        let (host, port) = crate::nodes::split_name(name)?;
        let host = host.to_owned();
        let mut nodes = self.nodes.write().unwrap_or_else(|p| p.into_inner());
        let node = nodes.entry(Arc::from(name)).or_insert_with(|| {
            Arc::new(FredNode {
                name: Arc::from(name),
                host,
                port,
                client: tokio::sync::OnceCell::new(),
                failed: Mutex::new(None),
            })
        });
        Some(Arc::clone(node))
    }

    /// The node's client, connected now if it is not (a failed attempt is
    /// remembered for [`RECONNECT_AFTER`]: calls meanwhile fail at once,
    /// unsent).
    async fn client(&self, node: &FredNode) -> Result<Client, Failure> {
        if let Some(c) = node.client.get() {
            return Ok(c.clone());
        }
        if let Some((at, why)) = &*node.failed.lock().unwrap_or_else(|p| p.into_inner())
            && at.elapsed() < RECONNECT_AFTER
        {
            return Err(unreachable(node, why, true));
        }
        let connect = async {
            let mut config = self.config.clone();
            config.server = ServerConfig::new_centralized(node.host.clone(), node.port);
            let mut builder = fred::types::Builder::from_config(config);
            builder.set_performance_config(self.performance.clone());
            builder.set_connection_config(self.connection.clone());
            if let Some(policy) = &self.policy {
                builder.set_policy(policy.clone());
            }
            let client = builder.build().map_err(|e| e.to_string())?;
            match &self.io {
                // On the store's I/O thread, the client's connection task
                // runs there.
                Some(io) => {
                    let c = client.clone();
                    io.spawn(async move { c.init().await.map(drop).map_err(|e| e.to_string()) })
                        .await
                        .map_err(|e| {
                            format!("the store's I/O thread stopped while connecting: {e}")
                        })??
                }
                None => client.init().await.map(drop).map_err(|e| e.to_string())?,
            }
            Ok::<Client, String>(client)
        };
        match node.client.get_or_try_init(|| connect).await {
            Ok(c) => {
                *node.failed.lock().unwrap_or_else(|p| p.into_inner()) = None;
                Ok(c.clone())
            }
            Err(why) => {
                tracing::debug!(node = &*node.name, error = %why, "rate-limit store cannot connect to node");
                let failure = unreachable(node, &why, false);
                *node.failed.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((Instant::now(), why));
                Err(failure)
            }
        }
    }

    /// One attempt of `call`, where `route` says (the master of its slot as
    /// `slots` says, or a redirect's target).
    pub(crate) async fn eval(
        &self,
        call: &Call,
        route: &Route,
        source: bool,
        slots: &SlotMap,
    ) -> Result<Vec<i64>, Failure> {
        let name: Arc<str> = match route {
            Route::Key => slots.owner(call.slot()),
            Route::Moved(addr) | Route::Ask(addr) => Arc::from(addr.name()),
        };
        let Some(node) = self.node(&name) else {
            // The slot map does not know the slot yet: the seed client routes
            // this one (a redirect comes back if it is wrong).
            return self.eval_through_seed(call, source).await;
        };
        let client = self.client(&node).await?;
        let (command, values) =
            ratelimit_redis::fred::script_command(call.script, &call.keys, &call.args, source);
        if !matches!(route, Route::Ask(_)) {
            return client
                .with_options(&once())
                .custom(command, values)
                .await
                .map_err(failure);
        }
        // ASKING applies to the next command on the same connection: the
        // two go as one pipeline.
        let pipeline = client.with_options(&once()).pipeline();
        let asking = CustomCommand::new_static("ASKING", fred::types::ClusterHash::FirstKey, false);
        let _: () = pipeline
            .custom(asking, Vec::<Value>::new())
            .await
            .map_err(failure)?;
        let _: () = pipeline.custom(command, values).await.map_err(failure)?;
        let mut replies: Vec<Value> = pipeline.all().await.map_err(failure)?;
        let reply = replies.pop().ok_or_else(|| Failure {
            error: StoreError::message("empty reply to ASKING + script", true),
            next: Next::Fail,
        })?;
        if let Value::Array(items) = &reply
            && items.is_empty()
        {
            return Ok(Vec::new());
        }
        reply.convert::<Vec<i64>>().map_err(failure)
    }

    /// A call for a slot the store's map does not know yet, routed by the
    /// seed client's own map.
    async fn eval_through_seed(&self, call: &Call, source: bool) -> Result<Vec<i64>, Failure> {
        let (command, values) =
            ratelimit_redis::fred::script_command(call.script, &call.keys, &call.args, source);
        self.seed
            .with_options(&once())
            .custom(command, values)
            .await
            .map_err(failure)
    }

    /// `SCRIPT LOAD` of every script on every master of the slot map.
    pub(crate) async fn load_scripts(&self, slots: &SlotMap) -> Result<(), StoreError> {
        let masters = slots.masters();
        if masters.is_empty() {
            for script in ratelimit_redis::scripts::all() {
                let _: String = self
                    .seed
                    .script_load_cluster(script.lua())
                    .await
                    .map_err(error::from_fred)?;
            }
            return Ok(());
        }
        for master in masters {
            let Some(node) = self.node(&master) else {
                continue;
            };
            let client = self.client(&node).await.map_err(|f| f.error)?;
            for script in ratelimit_redis::scripts::all() {
                let _: String = client
                    .script_load(script.lua())
                    .await
                    .map_err(error::from_fred)?;
            }
        }
        Ok(())
    }

    /// Each slot range and its master, as the cluster says now (read through
    /// the seed client's cluster state, refreshed first).
    pub(crate) async fn slot_ranges(&self) -> Option<Vec<(u16, u16, String)>> {
        let _ = self.seed.sync_cluster().await;
        let state = self.seed.cached_cluster_state()?;
        Some(
            state
                .slots()
                .iter()
                .map(|r| {
                    (
                        r.start,
                        r.end,
                        crate::retry::node_name(&r.primary.host, r.primary.port),
                    )
                })
                .collect(),
        )
    }
}

/// A node that could not be connected to: nothing was sent to it.
fn unreachable(node: &FredNode, why: &str, remembered: bool) -> Failure {
    let mut message = format!("redis cluster: cannot connect to {}: {why}", node.name);
    if remembered {
        message.push_str(&format!(
            " (the last attempt, under {RECONNECT_AFTER:?} ago; nothing sent)"
        ));
    }
    Failure {
        error: StoreError::backend(message, true, NotConnected),
        next: Next::Unreachable,
    }
}

/// The source of [`unreachable`]'s error: neither a server reply nor a
/// timeout, so the node's breaker counts it as an unreachable node
/// ([`ratelimit_redis::error::reached_server`]).
#[derive(Debug)]
struct NotConnected;

impl std::fmt::Display for NotConnected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not connected")
    }
}

impl std::error::Error for NotConnected {}
