//! One connection per cluster node: the default redis-rs backend.
//!
//! The store routes every call itself, by its own slot map
//! ([`crate::slots`]: filled from `CLUSTER SLOTS`, refreshed in the
//! background, corrected on `MOVED`), over one multiplexed connection per
//! node (`host:port`), opened on demand. Nothing is shared between the
//! nodes' connections: a dead node's connection fails its own calls and
//! no other. (redis-rs' cluster connection, which the store used before,
//! holds every node behind one state machine: after an error from any node
//! it rebuilds its slot map and reconnects, and drives no request for any
//! node meanwhile, so one dead master stalled the callers of the healthy
//! ones.)
//!
//! - A node's connection is opened by the first call that needs it (one
//!   attempt at a time per node, bounded by the connection timeout); calls
//!   that arrive meanwhile wait for that attempt.
//! - An attempt that fails is remembered for [`RECONNECT_AFTER`]: calls for
//!   the node meanwhile fail at once with that failure (nothing was sent,
//!   so the store may retry them: see [`crate::retry`]). A killed node
//!   refuses connections; its callers' calls end in microseconds, and the
//!   node's breaker opens on them.
//! - A connection that breaks (the node closed it, an I/O error) is
//!   dropped; the calls it carried fail (they may have run: never re-sent),
//!   and the next call opens a new one. A reply that is only late (a
//!   response timeout) keeps the connection: the node is judged by its
//!   replies ([`ratelimit_redis::domains`]), not by one lost call.
//! - `ASK` is answered with `ASKING` and the script written together (one
//!   pipeline on the target's connection: nothing can come between).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ratelimit_core::StoreError;
use ratelimit_redis::scripts::Call;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, Value};

use crate::redis_rs::{decode_value, failure, parse_slots, script_cmd};
use crate::retry::{Failure, Next, RECONNECT_AFTER, Route};
use crate::slots::SlotMap;

/// Slot ranges, first and last slot.
type SlotRanges = Vec<(u16, u16)>;

/// The store's connections, one per node, and how to open new ones.
pub(crate) struct Nodes {
    /// The seed URL's settings (credentials, protocol, TLS, TCP_NODELAY):
    /// every node is reached with them, at its own address.
    base: ConnectionInfo,
    config: AsyncConnectionConfig,
    /// The seed nodes, `host:port`: where the slot map is read when no
    /// master is known.
    seeds: Vec<Arc<str>>,
    nodes: RwLock<HashMap<Arc<str>, Arc<Node>>>,
    /// Rotates the node asked for the slot map, and the node a call with
    /// no known master goes to.
    turn: AtomicUsize,
    /// How long a topology or set-up command waits for its reply.
    response_timeout: Duration,
    /// The store's own I/O thread, when it has one
    /// (`ratelimit_redis::io`): every node's connection runs there.
    io: Option<Arc<ratelimit_redis::io::IoThread>>,
}

impl std::fmt::Debug for Nodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nodes")
            .field("seeds", &self.seeds)
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

/// One node: its address, its connection (if open) and its last failed
/// connection attempt.
pub(crate) struct Node {
    name: Arc<str>,
    host: String,
    client: Client,
    config: AsyncConnectionConfig,
    state: Mutex<State>,
    /// Held by the one connection attempt under way.
    connecting: tokio::sync::Mutex<()>,
    /// Where the connection is opened and runs (`Nodes::io`).
    io: Option<Arc<ratelimit_redis::io::IoThread>>,
}

#[derive(Default)]
struct State {
    /// The open connection and its generation.
    conn: Option<(MultiplexedConnection, u64)>,
    generation: u64,
    /// When the last connection attempt failed, and why.
    failed: Option<(Instant, redis::RedisError)>,
}

/// A node that could not be connected to: nothing was sent to it.
#[derive(Debug)]
struct NotConnected {
    node: Arc<str>,
    cause: redis::RedisError,
    remembered: bool,
}

impl std::fmt::Display for NotConnected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot connect to {}: {}", self.node, self.cause)?;
        if self.remembered {
            write!(
                f,
                " (the last attempt, under {RECONNECT_AFTER:?} ago; nothing sent)"
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for NotConnected {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.cause)
    }
}

fn not_connected(node: &Node, cause: redis::RedisError, remembered: bool) -> Failure {
    let e = NotConnected {
        node: Arc::clone(&node.name),
        cause,
        remembered,
    };
    // A transient error whose source is not a redis-rs error: neither a
    // server reply nor a timeout, so the node's breaker counts it as an
    // unreachable node (`ratelimit_redis::error::reached_server`).
    Failure {
        error: StoreError::backend(format!("redis cluster: {e}"), true, e),
        next: Next::Unreachable,
    }
}

impl Node {
    /// The node's connection, opened now if there is none (one attempt at
    /// a time; a failure is remembered for [`RECONNECT_AFTER`]).
    async fn connection(&self) -> Result<(MultiplexedConnection, u64), Failure> {
        if let Some(ready) = self.ready()? {
            return Ok(ready);
        }
        let _attempt = self.connecting.lock().await;
        // Another caller's attempt may have ended while this one waited.
        if let Some(ready) = self.ready()? {
            return Ok(ready);
        }
        let opened = match &self.io {
            // On the store's I/O thread, the connection's own task runs there.
            Some(io) => {
                let (client, config) = (self.client.clone(), self.config.clone());
                io.spawn(async move {
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                })
                .await
                .unwrap_or_else(|e| {
                    Err(redis::RedisError::from(std::io::Error::other(format!(
                        "the store's I/O thread stopped while connecting: {e}"
                    ))))
                })
            }
            None => {
                self.client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await
            }
        };
        match opened {
            Ok(conn) => {
                let mut state = self.lock();
                state.generation += 1;
                let generation = state.generation;
                state.conn = Some((conn.clone(), generation));
                state.failed = None;
                tracing::debug!(node = &*self.name, "rate-limit store connected to node");
                Ok((conn, generation))
            }
            Err(e) => {
                tracing::debug!(node = &*self.name, error = %e, "rate-limit store cannot connect to node");
                self.lock().failed = Some((Instant::now(), e.clone()));
                Err(not_connected(self, e, false))
            }
        }
    }

    /// The open connection, `None` when an attempt is due, or the failure
    /// of an attempt made less than [`RECONNECT_AFTER`] ago.
    fn ready(&self) -> Result<Option<(MultiplexedConnection, u64)>, Failure> {
        self.ready_at(Instant::now())
    }

    fn ready_at(&self, now: Instant) -> Result<Option<(MultiplexedConnection, u64)>, Failure> {
        let state = self.lock();
        if let Some(conn) = &state.conn {
            return Ok(Some(conn.clone()));
        }
        match &state.failed {
            Some((at, e)) if now.saturating_duration_since(*at) < RECONNECT_AFTER => {
                Err(not_connected(self, e.clone(), true))
            }
            _ => Ok(None),
        }
    }

    /// The connection of `generation` broke: drop it (the next call opens
    /// a new one). A newer connection is kept.
    fn broken(&self, generation: u64, e: &redis::RedisError) {
        let mut state = self.lock();
        if state.conn.as_ref().is_some_and(|(_, g)| *g == generation) {
            tracing::debug!(node = &*self.name, error = %e, "rate-limit store's connection to node broke");
            state.conn = None;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends one topology or set-up command, waiting `wait` for its reply.
    async fn ask(&self, cmd: &redis::Cmd, wait: Duration) -> Result<Value, Failure> {
        match tokio::time::timeout(wait, self.query(cmd)).await {
            Ok(reply) => reply,
            Err(_) => Err(Failure {
                error: StoreError::message(
                    format!(
                        "redis cluster: no reply from {} within {wait:?} (the response timeout)",
                        self.name
                    ),
                    true,
                ),
                next: Next::Backoff,
            }),
        }
    }

    /// Sends one command, and drops the connection if it broke.
    async fn query(&self, cmd: &redis::Cmd) -> Result<Value, Failure> {
        let (mut conn, generation) = self.connection().await?;
        match conn.send_packed_command(cmd).await {
            Ok(v) => Ok(v),
            Err(e) => {
                if e.is_unrecoverable_error() {
                    self.broken(generation, &e);
                }
                Err(failure(e))
            }
        }
    }
}

impl Nodes {
    /// Connection settings for every node from the first seed's URL; the
    /// seeds' addresses. The URLs are checked by the caller.
    /// `security` (credentials, TLS files) applies to every node.
    pub(crate) fn new(
        seeds: &[String],
        response_timeout: Duration,
        connection_timeout: Duration,
        security: &ratelimit_redis::tls::Security,
    ) -> Result<Self, StoreError> {
        let mut base = None;
        let mut names = Vec::new();
        for url in seeds {
            // Credentials, TLS files (parsed into the address's TLS
            // settings, which every node's address keeps: `at`) and
            // TCP_NODELAY: see `ratelimit_redis::tls::Security`.
            let info = security.redis_client(url)?.get_connection_info().clone();
            if let Some((host, port)) = host_port(info.addr()) {
                names.push(Arc::from(crate::retry::node_name(&host, port)));
            }
            base.get_or_insert(info);
        }
        let base = base.ok_or_else(|| StoreError::message("no seed URL for the cluster", false))?;
        // No response timeout on the connections: a script call waits for
        // its reply until its caller's deadline (the engine's timer), and a
        // busy node is not a failed one. The response timeout bounds the
        // topology and set-up commands (`Nodes::ask`).
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(connection_timeout));
        Ok(Self {
            base,
            config,
            response_timeout,
            seeds: names,
            nodes: RwLock::default(),
            turn: AtomicUsize::new(0),
            io: None,
        })
    }

    /// Opens and runs every node's connection on `io`, the store's own I/O
    /// thread (`ratelimit_redis::io`).
    pub(crate) fn set_io(&mut self, io: Arc<ratelimit_redis::io::IoThread>) {
        self.io = Some(io);
    }

    /// The node named `name` (`host:port`), created on first use; `None`
    /// when the name is no address.
    fn node(&self, name: &str) -> Option<Arc<Node>> {
        if let Some(node) = self
            .nodes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            return Some(Arc::clone(node));
        }
        let (host, port) = split_name(name)?;
        let info = self.base.clone().set_addr(at(self.base.addr(), host, port));
        let client = Client::open(info).ok()?;
        let mut nodes = self.nodes.write().unwrap_or_else(|p| p.into_inner());
        let node = nodes.entry(Arc::from(name)).or_insert_with(|| {
            Arc::new(Node {
                name: Arc::from(name),
                host: host.to_owned(),
                client,
                config: self.config.clone(),
                state: Mutex::default(),
                connecting: tokio::sync::Mutex::new(()),
                io: self.io.clone(),
            })
        });
        Some(Arc::clone(node))
    }

    /// The master of `slot` as the slot map says, or (unknown yet) one of
    /// the known nodes in turn, which redirects if it does not serve it.
    fn for_slot(&self, slot: u16, slots: &SlotMap) -> Result<Arc<Node>, Failure> {
        let owner = slots.owner(slot);
        if let Some(node) = self.node(&owner) {
            return Ok(node);
        }
        let known = self.candidates(slots);
        let n = self.turn.fetch_add(1, Ordering::Relaxed);
        (0..known.len())
            .find_map(|i| self.node(&known[(n + i) % known.len()]))
            .ok_or_else(|| Failure {
                error: StoreError::message(
                    format!("redis cluster: no node known for slot {slot}"),
                    true,
                ),
                next: Next::Unreachable,
            })
    }

    /// The masters of the slot map, then the seeds.
    fn candidates(&self, slots: &SlotMap) -> Vec<Arc<str>> {
        let mut names = slots.masters();
        for seed in &self.seeds {
            if !names.contains(seed) {
                names.push(Arc::clone(seed));
            }
        }
        names
    }

    /// One attempt of `call`, where `route` says.
    pub(crate) async fn eval(
        &self,
        call: &Call,
        route: &Route,
        source: bool,
        slots: &SlotMap,
    ) -> Result<Vec<i64>, Failure> {
        let node = match route {
            Route::Key => self.for_slot(call.slot(), slots)?,
            Route::Moved(addr) | Route::Ask(addr) => {
                self.node(&addr.name()).ok_or_else(|| Failure {
                    error: StoreError::message(
                        format!("redis cluster: unusable redirect address {addr:?}"),
                        true,
                    ),
                    next: Next::Fail,
                })?
            }
        };
        let cmd = script_cmd(call, source);
        if !matches!(route, Route::Ask(_)) {
            return decode_value(node.query(&cmd).await?);
        }
        // ASKING applies to the next command on the same connection: one
        // pipeline writes both at once, so nothing else can come between.
        let (mut conn, generation) = node.connection().await?;
        let mut pipe = redis::pipe();
        pipe.cmd("ASKING").add_command(cmd);
        match conn.send_packed_commands(&pipe, 1, 1).await {
            Ok(mut values) => match values.pop() {
                Some(value) => decode_value(value),
                None => Err(Failure {
                    error: StoreError::message("empty reply to ASKING + script", true),
                    next: Next::Fail,
                }),
            },
            Err(e) => {
                if e.is_unrecoverable_error() {
                    node.broken(generation, &e);
                }
                Err(failure(e))
            }
        }
    }

    /// Each slot range and its master, from `CLUSTER SLOTS` on the first
    /// node that answers (the known masters, then the seeds, starting at a
    /// different one each time); the last error when none does.
    pub(crate) async fn slot_ranges(
        &self,
        slots: &SlotMap,
    ) -> Result<Vec<(u16, u16, String)>, StoreError> {
        let names = self.candidates(slots);
        let n = self.turn.fetch_add(1, Ordering::Relaxed);
        let mut last = StoreError::message("redis cluster: no node to ask for the slot map", true);
        for i in 0..names.len() {
            let Some(node) = self.node(&names[(n + i) % names.len()]) else {
                continue;
            };
            match node
                .ask(redis::cmd("CLUSTER").arg("SLOTS"), self.response_timeout)
                .await
                .and_then(|v| v.extract_error().map_err(failure))
            {
                Ok(value) => match parse_slots(value, &node.host) {
                    Some(ranges) if !ranges.is_empty() => return Ok(ranges),
                    _ => {
                        last = StoreError::message(
                            format!("redis cluster: {} sent no usable CLUSTER SLOTS", node.name),
                            true,
                        );
                    }
                },
                Err(f) => last = f.error,
            }
        }
        Err(last)
    }

    /// The masters of the slot map, each with its slot ranges.
    fn masters(slots: &SlotMap) -> Vec<(Arc<str>, SlotRanges)> {
        let mut by_master: Vec<(Arc<str>, SlotRanges)> = Vec::new();
        for (start, end, master) in slots.ranges() {
            match by_master.iter_mut().find(|(m, _)| *m == master) {
                Some((_, ranges)) => ranges.push((start, end)),
                None => by_master.push((master, vec![(start, end)])),
            }
        }
        by_master
    }

    /// `SCRIPT LOAD` of every script on every master of the slot map.
    pub(crate) async fn load_scripts(&self, slots: &SlotMap) -> Result<(), StoreError> {
        for (master, _) in Self::masters(slots) {
            let Some(node) = self.node(&master) else {
                continue;
            };
            for script in ratelimit_redis::scripts::all() {
                node.ask(
                    redis::cmd("SCRIPT").arg("LOAD").arg(script.lua()),
                    self.response_timeout,
                )
                .await
                .and_then(|v| v.extract_error().map_err(failure))
                .map_err(|f| f.error)?;
            }
        }
        Ok(())
    }

    /// Runs the store's permission check ([`ratelimit_redis::acl::PROBE`],
    /// and `EVAL`) on every master of the slot map, each on a key of the
    /// store's prefix in a slot it serves: the first permission error, as
    /// the server wrote it.
    pub(crate) async fn check_permissions(
        &self,
        slots: &SlotMap,
        prefix: &str,
    ) -> Result<(), StoreError> {
        for (master, ranges) in Self::masters(slots) {
            let Some(node) = self.node(&master) else {
                continue;
            };
            let Some(key) = probe_key(prefix, &ranges) else {
                continue;
            };
            let node = &node;
            let run = |cmd: redis::Cmd| async move {
                node.query(&cmd)
                    .await
                    .and_then(|v| v.extract_error().map_err(failure))
                    .map_err(|f| f.error)
            };
            run(redis::cmd("EVAL").arg("return 1").arg(0).to_owned()).await?;
            let denied = run(redis::cmd("EVAL")
                .arg(ratelimit_redis::acl::PROBE)
                .arg(1)
                .arg(&key)
                .to_owned())
            .await?;
            if let Ok(denied) = redis::from_redis_value::<Vec<String>>(denied)
                && let Some(first) = denied.into_iter().next()
            {
                return Err(StoreError::message(first, false));
            }
        }
        Ok(())
    }

    /// Reads every master's `TIME` once and teaches `clock` the offset of
    /// each of its slots, so that the first call on every slot carries a
    /// deadline. Best effort: a master that does not answer is learnt
    /// from its first reply instead.
    pub(crate) async fn learn_clocks(
        &self,
        slots: &SlotMap,
        clock: &ratelimit_redis::deadline::ServerClock,
    ) {
        for (master, ranges) in Self::masters(slots) {
            let Some(node) = self.node(&master) else {
                continue;
            };
            let Ok(time) = node.ask(&redis::cmd("TIME"), self.response_timeout).await else {
                continue;
            };
            let received = Instant::now();
            let Ok((secs, micros)) = redis::from_redis_value::<(i64, i64)>(time) else {
                continue;
            };
            let server_now = secs.saturating_mul(1_000_000).saturating_add(micros);
            for (start, end) in ranges {
                for slot in start..=end {
                    clock.observe(usize::from(slot), server_now, received);
                }
            }
        }
    }
}

/// A key of `prefix` whose slot is in `ranges`, for the permission check.
pub(crate) fn probe_key(prefix: &str, ranges: &[(u16, u16)]) -> Option<String> {
    (0..200_000u32).find_map(|n| {
        let key = format!("{prefix}:{{acl-probe-{n}}}:check");
        let slot = ratelimit_redis::keys::slot(key.as_bytes());
        ranges
            .iter()
            .any(|&(a, b)| a <= slot && slot <= b)
            .then_some(key)
    })
}

/// The host and port of a TCP address.
fn host_port(addr: &ConnectionAddr) -> Option<(String, u16)> {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            Some((host.clone(), *port))
        }
        _ => None,
    }
}

/// `base` (plain TCP or TLS, with its TLS settings) at `host:port`.
/// A node's name (`host:port`, an IPv6 host in brackets) as its host
/// (without the brackets) and port; `None` when the name is no address.
pub(crate) fn split_name(name: &str) -> Option<(&str, u16)> {
    let (host, port) = name.rsplit_once(':')?;
    let port = port.parse().ok()?;
    Some((host.trim_start_matches('[').trim_end_matches(']'), port))
}

fn at(base: &ConnectionAddr, host: &str, port: u16) -> ConnectionAddr {
    match base.clone() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure,
            tls_params,
        },
        _ => ConnectionAddr::Tcp(host.to_owned(), port),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_redis::error;

    #[test]
    fn nodes_keep_the_seed_settings_at_their_own_address() {
        let nodes = Nodes::new(
            &["redis://app:pw@10.0.0.1:7000/".to_owned()],
            Duration::from_millis(30),
            Duration::from_millis(50),
            &Default::default(),
        )
        .unwrap();
        assert_eq!(&*nodes.seeds[0], "10.0.0.1:7000");
        let node = nodes.node("10.0.0.2:7001").unwrap();
        let info = node.client.get_connection_info();
        assert_eq!(host_port(info.addr()), Some(("10.0.0.2".to_owned(), 7001)));
        assert_eq!(info.redis_settings().username(), Some("app"));
        assert!(nodes.node("not an address").is_none());
        assert!(nodes.node("10.0.0.2:port").is_none());
        assert_eq!(split_name("[::1]:7002"), Some(("::1", 7002)));
        // One node per address.
        assert!(Arc::ptr_eq(&node, &nodes.node("10.0.0.2:7001").unwrap()));
    }

    #[tokio::test]
    async fn a_refused_node_fails_fast_and_is_not_retried_at_once() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let nodes = Nodes::new(
            &[format!("redis://127.0.0.1:{port}/")],
            Duration::from_millis(30),
            Duration::from_millis(50),
            &Default::default(),
        )
        .unwrap();
        let node = nodes.node(&format!("127.0.0.1:{port}")).unwrap();
        let first = node.connection().await.err().unwrap();
        assert_eq!(first.next, Next::Unreachable);
        assert!(!error::reached_server(&first.error), "{}", first.error);
        assert!(!error::is_timeout(&first.error), "{}", first.error);
        let failed_at = node.lock().failed.as_ref().unwrap().0;
        // Within RECONNECT_AFTER of the failure: refused at once, remembered.
        let again = node.ready_at(failed_at).err().unwrap();
        assert_eq!(again.next, Next::Unreachable);
        assert!(
            again.error.to_string().contains("the last attempt"),
            "{}",
            again.error
        );
        // After it: a new attempt is due.
        assert!(matches!(
            node.ready_at(failed_at + RECONNECT_AFTER),
            Ok(None)
        ));
    }
}
