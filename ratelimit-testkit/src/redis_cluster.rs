//! A real Redis Cluster for tests (feature `redis-cluster`): 3 masters and 3
//! replicas.
//!
//! [`RedisCluster::start`] spawns six `redis-server --cluster-enabled yes`
//! processes on free loopback ports, in a temporary directory of their own,
//! with a short `cluster-node-timeout` ([`NODE_TIMEOUT`]) so failovers happen
//! within seconds; creates the cluster with `redis-cli --cluster create
//! --cluster-replicas 1 --cluster-yes`; waits (bounded) until every node says
//! `cluster_state:ok`, knows all six nodes and every replica's link to its
//! master is up; and kills everything on drop.
//!
//! For fault tests it can kill ([`RedisCluster::kill`]), pause
//! ([`RedisCluster::pause`], `SIGSTOP`) and resume nodes, run `CLUSTER
//! FAILOVER` on a replica ([`RedisCluster::failover`]), and move one slot
//! from one master to another the way `redis-cli --cluster reshard` does
//! ([`RedisCluster::migrate_slot`]: `SETSLOT IMPORTING`/`MIGRATING`, `MIGRATE`
//! in batches, `SETSLOT NODE` everywhere).
//!
//! Nodes are named by their port. Every node is a [`ServerProcess`], as the
//! single-server fixture is.
//!
//! For lost-reply and stall tests, [`RedisCluster::start_local_proxied`]
//! puts a [`Proxy`] in front of every node and has the node announce the
//! proxy's port, so that clients (which follow announced addresses) reach
//! every node through it.
//!
//! With the environment variable `RATELIMIT_REDIS_CLUSTER_URLS` set to a
//! comma-separated list of node URLs (`redis://127.0.0.1:7000/,...`), the
//! fixture uses that cluster instead: inspection, `CLUSTER FAILOVER` and slot
//! migration still work, but killing or pausing a node panics (those tests
//! need processes the fixture owns; [`RedisCluster::start_local`] always
//! spawns one).
//!
//! When no cluster can be had, the fixture **panics** with a message saying
//! how to get one; a cluster test never passes without a cluster.
//!
//! Starting a cluster takes a few seconds: [`RedisCluster::shared`] hands the
//! same cluster to every test of a binary that runs while it is alive.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::proxy::Proxy;
use crate::redis_server::fresh_prefix;
use crate::server_process::{HOW_TO_GET_REDIS, ServerOptions, ServerProcess, connect};

/// The environment variable that points the suites at an external cluster:
/// comma-separated node URLs.
pub const URLS_ENV: &str = "RATELIMIT_REDIS_CLUSTER_URLS";

/// The `cluster-node-timeout` of a local cluster: how long a master may be
/// unreachable before the others fail it over.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(1500);

/// How long [`RedisCluster::start`] and [`RedisCluster::wait_ok`] wait at most.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The number of hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

const EXTERNAL_HINT: &str = "point the suite at a running cluster with \
     RATELIMIT_REDIS_CLUSTER_URLS=redis://host:port/,redis://host:port/,...";

/// A node's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Serves slots.
    Master,
    /// Replicates a master.
    Replica,
}

/// One node as `CLUSTER NODES` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The 40-character node id.
    pub id: String,
    /// The host the node announces (`127.0.0.1` for a local cluster).
    pub host: String,
    /// The node's own client port: the fixture's name for it (in a proxied
    /// cluster the node announces its proxy's port, and is still named by
    /// its own).
    pub port: u16,
    /// Master or replica.
    pub role: Role,
    /// For a replica, the id of its master.
    pub master_id: Option<String>,
    /// The slot ranges served (inclusive), masters only.
    pub slots: Vec<(u16, u16)>,
    /// Whether the cluster considers it failed (`fail` or `fail?`).
    pub failed: bool,
}

impl Node {
    /// `redis://host:port/`.
    pub fn url(&self) -> String {
        format!("redis://{}:{}/", self.host, self.port)
    }

    /// Whether this node serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

#[derive(Debug)]
enum Mode {
    Local {
        dir: PathBuf,
        nodes: Mutex<Vec<ServerProcess>>,
        /// For a proxied cluster: each node's proxy, by the node's port.
        proxies: HashMap<u16, Proxy>,
        /// Whether the nodes serve TLS only.
        tls: bool,
    },
    External {
        urls: Vec<String>,
    },
}

/// A Redis Cluster for one test binary. See the module docs.
#[derive(Debug)]
pub struct RedisCluster {
    mode: Mode,
    prefix: String,
}

static SHARED: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());

impl RedisCluster {
    /// The cluster in `RATELIMIT_REDIS_CLUSTER_URLS` if set, else a new local
    /// 6-node cluster.
    ///
    /// # Panics
    ///
    /// When neither is available (the message says how to get Redis), or the
    /// cluster does not become healthy within [`READY_TIMEOUT`].
    pub fn start() -> Self {
        match std::env::var(URLS_ENV) {
            Ok(urls) if !urls.trim().is_empty() => {
                let urls: Vec<String> = urls
                    .split(',')
                    .map(|u| u.trim().to_owned())
                    .filter(|u| !u.is_empty())
                    .collect();
                let cluster = Self {
                    mode: Mode::External { urls },
                    prefix: fresh_prefix(),
                };
                if let Err(e) = cluster.try_wait_ok(Duration::from_secs(5)) {
                    panic!("{URLS_ENV} does not name a healthy cluster: {e}");
                }
                cluster
            }
            _ => Self::start_local(),
        }
    }

    /// One cluster shared by every caller while any of them holds it: the
    /// first call starts it (as [`RedisCluster::start`]), the last `Arc`
    /// dropped stops it. Tests that kill or fail over nodes should use their
    /// own cluster instead.
    pub fn shared() -> Arc<Self> {
        let mut guard = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cluster) = guard.upgrade() {
            return cluster;
        }
        let cluster = Arc::new(Self::start());
        *guard = Arc::downgrade(&cluster);
        cluster
    }

    /// A new local cluster, whatever `RATELIMIT_REDIS_CLUSTER_URLS` says.
    ///
    /// # Panics
    ///
    /// When `redis-server` or `redis-cli` is not installed (the message says
    /// how to get them), or the cluster does not become healthy within
    /// [`READY_TIMEOUT`].
    pub fn start_local() -> Self {
        Self::start_local_with(false, false)
    }

    /// A new local cluster whose nodes serve **TLS only**, require a
    /// client certificate of the test CA, and talk to each other (the
    /// cluster bus, replication) over TLS
    /// ([`crate::server_process::ServerOptions::tls`],
    /// `--tls-cluster yes`): [`RedisCluster::urls`] are `rediss://` URLs;
    /// the fixture's own connections and `redis-cli --cluster create` use
    /// the test CA and client certificate
    /// ([`crate::tls::TestCerts::shared`]).
    ///
    /// # Panics
    ///
    /// As [`RedisCluster::start_local`].
    pub fn start_local_tls() -> Self {
        Self::start_local_with(false, true)
    }

    /// Creates an ACL user with a random name and password and the rule
    /// `rule` on **every node** (a cluster keeps ACL users per node).
    ///
    /// # Panics
    ///
    /// When a node refuses it.
    pub fn acl_user(&self, rule: &str) -> crate::acl::AclUser {
        let user = crate::acl::AclUser::random();
        for port in self.live_ports() {
            user.create(&mut self.connection(port), rule);
        }
        user
    }

    /// A new local cluster whose every node has a [`Proxy`] in front of it
    /// and **announces the proxy's port** (`cluster-announce-ip 127.0.0.1`,
    /// `cluster-announce-port <proxy>`; the cluster bus stays direct), so
    /// that clients reach every node through its proxy: the seeds of
    /// [`RedisCluster::urls`], the addresses in `CLUSTER SLOTS` and `CLUSTER
    /// NODES`, and `MOVED`/`ASK` redirects all name proxy ports.
    /// [`RedisCluster::proxy`] gives the proxy of a node, for lost replies,
    /// stalls and cuts.
    ///
    /// Everything else of the fixture keeps naming nodes by their own port
    /// and talks to them directly ([`RedisCluster::query`],
    /// [`RedisCluster::connection`], [`Node::port`]): a test reads the state
    /// the server holds, not what the proxy lets through.
    ///
    /// Replication also follows the announced address: a replica's link to
    /// its master goes through the master's proxy. So a paused or cut proxy
    /// stalls or breaks replication too (the cluster bus, and so failure
    /// detection, does not go through it), and a loss armed for any request
    /// may hit replication traffic: target the store's command instead
    /// ([`Proxy::drop_replies_to`] with `b"EVALSHA"`).
    ///
    /// # Panics
    ///
    /// As [`RedisCluster::start_local`].
    pub fn start_local_proxied() -> Self {
        Self::start_local_with(true, false)
    }

    fn start_local_with(proxied: bool, tls: bool) -> Self {
        let dir = std::env::temp_dir().join(format!("rl-cluster-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let mut options = node_options(&dir);
        if tls {
            options = options.tls().args(["--tls-cluster", "yes"]);
        }
        let mut nodes = Vec::new();
        let mut proxies = HashMap::new();
        let mut last = String::new();
        // Ports can be taken between finding and using them: a few spare tries.
        for _ in 0..16 {
            if nodes.len() == 6 {
                break;
            }
            let port = options.free_port();
            let started = if proxied {
                let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], port)));
                let announcing = options.clone().args([
                    "--cluster-announce-ip".to_owned(),
                    "127.0.0.1".to_owned(),
                    "--cluster-announce-port".to_owned(),
                    proxy.port().to_string(),
                    "--cluster-announce-bus-port".to_owned(),
                    (port + 10_000).to_string(),
                ]);
                let started = ServerProcess::try_start_on(port, &announcing);
                if started.is_ok() {
                    proxies.insert(port, proxy);
                }
                started
            } else {
                ServerProcess::try_start_on(port, &options)
            };
            match started {
                Ok(node) => nodes.push(node),
                Err(e) => last = e,
            }
        }
        let cluster = Self {
            mode: Mode::Local {
                dir,
                nodes: Mutex::new(nodes),
                proxies,
                tls,
            },
            prefix: fresh_prefix(),
        };
        assert!(
            cluster.ports().len() == 6,
            "could not start 6 redis-server cluster nodes: {last}"
        );
        cluster.create();
        if let Err(e) = cluster.try_wait_ok(READY_TIMEOUT) {
            panic!("the new cluster did not become healthy within {READY_TIMEOUT:?}: {e}");
        }
        cluster
    }

    /// Whether every node has a [`Proxy`] in front of it
    /// ([`RedisCluster::start_local_proxied`]).
    pub fn is_proxied(&self) -> bool {
        matches!(&self.mode, Mode::Local { proxies, .. } if !proxies.is_empty())
    }

    /// The proxy in front of the node on `port`, in a cluster started with
    /// [`RedisCluster::start_local_proxied`].
    ///
    /// # Panics
    ///
    /// When the cluster is not proxied or has no node on `port`.
    pub fn proxy(&self, port: u16) -> &Proxy {
        match &self.mode {
            Mode::Local { proxies, .. } => proxies.get(&port).unwrap_or_else(|| {
                panic!("no proxy for node {port}: use RedisCluster::start_local_proxied")
            }),
            Mode::External { urls } => {
                panic!("the external cluster {urls:?} has no proxies")
            }
        }
    }

    /// The node's own port for a port a node announces (its proxy's, in a
    /// proxied cluster), else the port itself.
    fn node_port(&self, announced: u16) -> u16 {
        match &self.mode {
            Mode::Local { proxies, .. } => proxies
                .iter()
                .find(|(_, p)| p.port() == announced)
                .map_or(announced, |(&node, _)| node),
            Mode::External { .. } => announced,
        }
    }

    /// Parses `CLUSTER NODES` as the node on `port` answered it, naming every
    /// node by its own port.
    fn parse_nodes(&self, text: &str, port: u16) -> Vec<Node> {
        let mut nodes = parse_nodes(text, &self.url_of(port));
        for node in &mut nodes {
            node.port = self.node_port(node.port);
        }
        nodes
    }

    fn local_nodes(&self) -> MutexGuard<'_, Vec<ServerProcess>> {
        match &self.mode {
            Mode::Local { nodes, .. } => nodes.lock().unwrap_or_else(|e| e.into_inner()),
            Mode::External { urls } => panic!(
                "cannot control the processes of the external cluster {urls:?}: fault tests \
                 need a local cluster (use RedisCluster::start_local; {HOW_TO_GET_REDIS})"
            ),
        }
    }

    fn create(&self) {
        let addrs: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let mut tls_args: Vec<String> = Vec::new();
        if self.is_tls() {
            let certs = crate::tls::TestCerts::shared();
            let path = |p: std::path::PathBuf| p.to_string_lossy().into_owned();
            tls_args = vec![
                "--tls".to_owned(),
                "--cacert".to_owned(),
                path(certs.ca()),
                "--cert".to_owned(),
                path(certs.client_cert()),
                "--key".to_owned(),
                path(certs.client_key()),
            ];
        }
        let out = Command::new("redis-cli")
            .args(&tls_args)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                if e.kind() == ErrorKind::NotFound {
                    panic!("redis-cli not found on PATH: {HOW_TO_GET_REDIS}, or {EXTERNAL_HINT}");
                }
                panic!("running redis-cli --cluster create: {e}")
            });
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Whether the nodes serve TLS only ([`RedisCluster::start_local_tls`]).
    pub fn is_tls(&self) -> bool {
        matches!(self.mode, Mode::Local { tls: true, .. })
    }

    fn node_url(&self, port: u16) -> String {
        if self.is_tls() {
            format!("rediss://127.0.0.1:{port}/")
        } else {
            port_url(port)
        }
    }

    /// Whether this fixture spawned the nodes (as opposed to using
    /// `RATELIMIT_REDIS_CLUSTER_URLS`).
    pub fn is_local(&self) -> bool {
        matches!(self.mode, Mode::Local { .. })
    }

    /// The ports of the nodes this fixture knows (spawned or given), alive or
    /// not, in start order.
    pub fn ports(&self) -> Vec<u16> {
        match &self.mode {
            Mode::Local { nodes, .. } => nodes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(ServerProcess::port)
                .collect(),
            Mode::External { urls } => urls.iter().map(|u| url_port(u)).collect(),
        }
    }

    /// Seed URLs for a cluster client: one per node the fixture knows, alive
    /// or not (clients skip the dead ones). In a proxied cluster, the
    /// proxies' URLs.
    pub fn urls(&self) -> Vec<String> {
        match &self.mode {
            Mode::Local { proxies, .. } if !proxies.is_empty() => self
                .ports()
                .into_iter()
                .map(|port| self.proxy(port).url())
                .collect(),
            Mode::Local { .. } => self.ports().into_iter().map(|p| self.node_url(p)).collect(),
            Mode::External { urls } => urls.clone(),
        }
    }

    /// `host:port` of every node the fixture knows, for clients that take
    /// addresses rather than URLs.
    pub fn addrs(&self) -> Vec<(String, u16)> {
        self.urls().iter().map(|u| url_host_port(u)).collect()
    }

    /// This fixture's random key prefix, `rltest-<hex>`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn url_of(&self, port: u16) -> String {
        match &self.mode {
            Mode::Local { .. } => self.node_url(port),
            Mode::External { urls } => urls
                .iter()
                .find(|u| url_port(u) == port)
                .cloned()
                .unwrap_or_else(|| {
                    let host = urls
                        .first()
                        .map_or("127.0.0.1".to_owned(), |u| url_host_port(u).0);
                    format!("redis://{host}:{port}/")
                }),
        }
    }

    /// A synchronous connection to the node on `port`, with 5 s timeouts.
    pub fn connection(&self, port: u16) -> redis::Connection {
        connect(&self.url_of(port), Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connecting to cluster node {port}: {e}"))
    }

    /// Runs `cmd` on the node on `port`.
    pub fn query<T: redis::FromRedisValue>(
        &self,
        port: u16,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        query(self.url_of(port), cmd)
    }

    /// Sets `cluster-require-full-coverage no` on every node: the healthy
    /// masters keep serving their slots while one master is down (what
    /// ratelimit-cluster's README recommends for a rate limiter).
    ///
    /// # Panics
    ///
    /// When a node refuses it.
    pub fn serve_without_full_coverage(&self) {
        for port in self.ports() {
            let _: () = self
                .query(
                    port,
                    redis::cmd("CONFIG")
                        .arg("SET")
                        .arg("cluster-require-full-coverage")
                        .arg("no"),
                )
                .expect("CONFIG SET cluster-require-full-coverage no");
        }
    }

    /// The nodes as the first reachable node sees them (`CLUSTER NODES`).
    ///
    /// # Panics
    ///
    /// When no node answers.
    pub fn nodes(&self) -> Vec<Node> {
        let mut last = String::new();
        for port in self.ports() {
            match self.query::<String>(port, redis::cmd("CLUSTER").arg("NODES")) {
                Ok(text) => return self.parse_nodes(&text, port),
                Err(e) => last = e.to_string(),
            }
        }
        panic!("no cluster node answers CLUSTER NODES: {last}");
    }

    /// The masters that serve slots and are not failed.
    pub fn masters(&self) -> Vec<Node> {
        self.nodes()
            .into_iter()
            .filter(|n| n.role == Role::Master && !n.failed && !n.slots.is_empty())
            .collect()
    }

    /// The replicas of the master `master`.
    pub fn replicas_of(&self, master: &Node) -> Vec<Node> {
        self.nodes()
            .into_iter()
            .filter(|n| n.master_id.as_deref() == Some(master.id.as_str()))
            .collect()
    }

    /// The master serving `slot`, as the first reachable node sees it.
    ///
    /// # Panics
    ///
    /// When no live master serves it.
    pub fn master_for_slot(&self, slot: u16) -> Node {
        self.nodes()
            .into_iter()
            .find(|n| n.role == Role::Master && !n.failed && n.serves(slot))
            .unwrap_or_else(|| panic!("no live master serves slot {slot}"))
    }

    /// The slot of `key`, as the server computes it (`CLUSTER KEYSLOT`).
    pub fn key_slot(&self, key: &[u8]) -> u16 {
        let mut last = String::new();
        for port in self.ports() {
            match self.query::<u16>(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)) {
                Ok(slot) => return slot,
                Err(e) => last = e.to_string(),
            }
        }
        panic!("no cluster node answers CLUSTER KEYSLOT: {last}");
    }

    /// Kills the node on `port` (`SIGKILL`) and waits for it to exit. Its
    /// data is gone; the cluster fails it over after [`NODE_TIMEOUT`].
    pub fn kill(&self, port: u16) {
        self.with_node(port, ServerProcess::kill);
    }

    /// Starts the node on `port` again (killing it first if it runs), with
    /// its cluster configuration file: it rejoins under the same node id,
    /// with no data, and waits until it answers `PING` (not until the
    /// cluster is healthy: see [`RedisCluster::wait_ok`]).
    pub fn restart(&self, port: u16) {
        self.with_node(port, ServerProcess::restart);
    }

    fn with_node<T>(&self, port: u16, f: impl FnOnce(&mut ServerProcess) -> T) -> T {
        let mut nodes = self.local_nodes();
        let node = nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no local node on port {port}"));
        f(node)
    }

    /// Freezes the node on `port` with `SIGSTOP`: its connections stay open,
    /// nothing answers. Paused longer than [`NODE_TIMEOUT`], a master is
    /// failed over.
    pub fn pause(&self, port: u16) {
        self.with_node(port, |n| n.pause());
    }

    /// Resumes a paused node with `SIGCONT`.
    pub fn resume(&self, port: u16) {
        self.with_node(port, |n| n.resume());
    }

    /// Runs `CLUSTER FAILOVER` on the replica on `port` and waits (bounded by
    /// [`READY_TIMEOUT`]) until it is a master and the cluster is healthy.
    ///
    /// # Panics
    ///
    /// When the node is not a replica or the failover does not complete.
    pub fn failover(&self, replica_port: u16) {
        let node = self
            .nodes()
            .into_iter()
            .find(|n| n.port == replica_port)
            .unwrap_or_else(|| panic!("no node on port {replica_port}"));
        assert_eq!(node.role, Role::Replica, "CLUSTER FAILOVER needs a replica");
        let _: () = self
            .query(replica_port, redis::cmd("CLUSTER").arg("FAILOVER"))
            .unwrap_or_else(|e| panic!("CLUSTER FAILOVER on {replica_port}: {e}"));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let me = self.query::<String>(replica_port, redis::cmd("CLUSTER").arg("NODES"));
            if let Ok(text) = me {
                let nodes = self.parse_nodes(&text, replica_port);
                if nodes
                    .iter()
                    .any(|n| n.port == replica_port && n.role == Role::Master)
                {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "replica {replica_port} did not become master within {READY_TIMEOUT:?}"
            );
            sleep(Duration::from_millis(20));
        }
        self.wait_ok();
    }

    /// Waits until a live master other than `old_port` serves `slot` (the
    /// cluster promoted a replica) and returns it, or `None` after `timeout`.
    pub fn wait_for_new_master(&self, slot: u16, old_port: u16, timeout: Duration) -> Option<Node> {
        let deadline = Instant::now() + timeout;
        loop {
            for port in self.ports() {
                if port == old_port {
                    continue;
                }
                let Ok(text) = self.query::<String>(port, redis::cmd("CLUSTER").arg("NODES"))
                else {
                    continue;
                };
                let found = self.parse_nodes(&text, port).into_iter().find(|n| {
                    n.role == Role::Master && !n.failed && n.serves(slot) && n.port != old_port
                });
                if found.is_some() {
                    return found;
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            sleep(Duration::from_millis(20));
        }
    }

    /// Moves `slot` from the master on `from` to the master on `to`, as
    /// `redis-cli --cluster reshard` does: `SETSLOT IMPORTING` on the
    /// target, `SETSLOT MIGRATING` on the source, `MIGRATE` of its keys in
    /// batches of 100, then `SETSLOT NODE` on the target, the source and
    /// every other master.
    pub fn migrate_slot(&self, slot: u16, from: u16, to: u16) {
        self.migrate_slot_holding(slot, from, to, Duration::ZERO);
    }

    /// As [`RedisCluster::migrate_slot`], but waits `hold` after the keys
    /// have moved and before `SETSLOT NODE`, keeping the slot in the
    /// migrating state (where clients get `ASK` redirects) that long; keys
    /// created at the source meanwhile are moved too.
    pub fn migrate_slot_holding(&self, slot: u16, from: u16, to: u16, hold: Duration) {
        let nodes = self.nodes();
        let id_of = |port: u16| {
            nodes
                .iter()
                .find(|n| n.port == port)
                .map(|n| n.id.clone())
                .unwrap_or_else(|| panic!("no node on port {port}"))
        };
        let (from_id, to_id) = (id_of(from), id_of(to));
        let target = nodes.iter().find(|n| n.port == to).expect("target node");
        let setslot = |port: u16, how: &str, id: &str| {
            let r: redis::RedisResult<()> = self.query(
                port,
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg(how)
                    .arg(id),
            );
            r.unwrap_or_else(|e| panic!("CLUSTER SETSLOT {slot} {how} on {port}: {e}"));
        };
        setslot(to, "IMPORTING", &from_id);
        setslot(from, "MIGRATING", &to_id);
        let move_keys = || loop {
            let keys: Vec<Vec<u8>> = self
                .query(
                    from,
                    redis::cmd("CLUSTER")
                        .arg("GETKEYSINSLOT")
                        .arg(slot)
                        .arg(100),
                )
                .unwrap_or_else(|e| panic!("CLUSTER GETKEYSINSLOT {slot} on {from}: {e}"));
            if keys.is_empty() {
                break;
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate
                .arg(&target.host)
                .arg(target.port)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys);
            let r: redis::RedisResult<redis::Value> = self.query(from, &migrate);
            r.unwrap_or_else(|e| panic!("MIGRATE of slot {slot} from {from} to {to}: {e}"));
        };
        move_keys();
        if !hold.is_zero() {
            sleep(hold);
            move_keys();
        }
        setslot(to, "NODE", &to_id);
        setslot(from, "NODE", &to_id);
        for n in &nodes {
            if n.role == Role::Master && !n.failed && n.port != to && n.port != from {
                let _: redis::RedisResult<()> = self.query(
                    n.port,
                    redis::cmd("CLUSTER")
                        .arg("SETSLOT")
                        .arg(slot)
                        .arg("NODE")
                        .arg(&to_id),
                );
            }
        }
    }

    /// Waits (bounded by [`READY_TIMEOUT`]) until every live node says
    /// `cluster_state:ok`, all 16384 slots are served, and every live
    /// replica's link to its master is up.
    ///
    /// # Panics
    ///
    /// When that does not happen in time.
    pub fn wait_ok(&self) {
        if let Err(e) = self.try_wait_ok(READY_TIMEOUT) {
            panic!("the cluster did not become healthy within {READY_TIMEOUT:?}: {e}");
        }
    }

    fn live_ports(&self) -> Vec<u16> {
        match &self.mode {
            Mode::Local { nodes, .. } => nodes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter(|n| n.is_running())
                .map(ServerProcess::port)
                .collect(),
            Mode::External { .. } => self.ports(),
        }
    }

    fn try_wait_ok(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.health() {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => sleep(Duration::from_millis(50)),
            }
        }
    }

    fn health(&self) -> Result<(), String> {
        let live = self.live_ports();
        for &port in &live {
            let info: String = self
                .query(port, redis::cmd("CLUSTER").arg("INFO"))
                .map_err(|e| format!("node {port}: {e}"))?;
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                    .map(str::trim)
                    .unwrap_or("")
                    .to_owned()
            };
            if field("cluster_state") != "ok" {
                return Err(format!(
                    "node {port}: cluster_state:{}",
                    field("cluster_state")
                ));
            }
            if field("cluster_slots_ok") != SLOTS.to_string() {
                return Err(format!(
                    "node {port}: cluster_slots_ok:{}",
                    field("cluster_slots_ok")
                ));
            }
            let text: String = self
                .query(port, redis::cmd("CLUSTER").arg("NODES"))
                .map_err(|e| format!("node {port}: {e}"))?;
            let nodes = self.parse_nodes(&text, port);
            let me = nodes
                .iter()
                .find(|n| n.port == port)
                .ok_or_else(|| format!("node {port} does not list itself"))?;
            for &other in &live {
                if !nodes.iter().any(|n| n.port == other && !n.failed) {
                    return Err(format!("node {port} does not see node {other} as healthy"));
                }
            }
            if me.role == Role::Replica {
                let repl: String = self
                    .query(port, redis::cmd("INFO").arg("replication"))
                    .map_err(|e| format!("node {port}: {e}"))?;
                if !repl.contains("master_link_status:up") {
                    return Err(format!("replica {port}: link to its master is not up"));
                }
            }
        }
        Ok(())
    }

    /// `used_memory` of every live node, summed, in bytes.
    pub fn used_memory(&self) -> u64 {
        self.live_ports()
            .into_iter()
            .filter_map(|port| {
                let info: String = self.query(port, redis::cmd("INFO").arg("memory")).ok()?;
                info.lines()
                    .find_map(|l| l.strip_prefix("used_memory:"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
            .sum()
    }

    /// `SCRIPT FLUSH` on every live node, as a restart would leave them.
    pub fn flush_scripts(&self) {
        for port in self.live_ports() {
            let _: redis::RedisResult<()> = self.query(port, redis::cmd("SCRIPT").arg("FLUSH"));
        }
    }

    /// The number of keys each live master holds (`DBSIZE`), by port.
    pub fn dbsize_by_master(&self) -> HashMap<u16, u64> {
        self.masters()
            .into_iter()
            .filter_map(|n| {
                Some((
                    n.port,
                    self.query::<u64>(n.port, &redis::cmd("DBSIZE")).ok()?,
                ))
            })
            .collect()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        if let Mode::Local { dir, nodes, .. } = &mut self.mode {
            // Each node is killed (SIGKILL also ends a paused one) as it drops.
            nodes.get_mut().unwrap_or_else(|e| e.into_inner()).clear();
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A cluster node's options: its own config and log file in `dir`.
fn node_options(dir: &Path) -> ServerOptions {
    ServerOptions::new()
        .args(["--cluster-enabled", "yes"])
        .args(["--cluster-config-file", "nodes-{port}.conf"])
        .args([
            "--cluster-node-timeout".to_owned(),
            NODE_TIMEOUT.as_millis().to_string(),
        ])
        .args(["--logfile", "node-{port}.log"])
        .dir(dir)
        .cluster_bus_port()
        .or_else_hint(EXTERNAL_HINT)
}

fn port_url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/")
}

fn url_host_port(url: &str) -> (String, u16) {
    let rest = url
        .split_once("://")
        .map_or(url, |(_, r)| r)
        .trim_end_matches('/');
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let rest = rest.split('/').next().unwrap_or(rest);
    match rest.rsplit_once(':') {
        Some((h, p)) => (h.to_owned(), p.parse().unwrap_or(6379)),
        None => (rest.to_owned(), 6379),
    }
}

fn url_port(url: &str) -> u16 {
    url_host_port(url).1
}

fn query<T: redis::FromRedisValue>(url: String, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let mut conn = connect(&url, Duration::from_secs(5)).map_err(|e| {
        redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            e,
        ))
    })?;
    cmd.query(&mut conn)
}

/// Parses `CLUSTER NODES`; `url` is the node asked, whose host replaces an
/// empty announced host.
fn parse_nodes(text: &str, url: &str) -> Vec<Node> {
    let default_host = url_host_port(url).0;
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            // ip:port@cport[,hostname]
            let addr = f[1].split(['@', ',']).next().unwrap_or("");
            let (host, port) = addr.rsplit_once(':')?;
            let port: u16 = port.parse().ok()?;
            let host = if host.is_empty() {
                default_host.clone()
            } else {
                host.to_owned()
            };
            let flags: Vec<&str> = f[2].split(',').collect();
            let role = if flags.contains(&"master") {
                Role::Master
            } else {
                Role::Replica
            };
            let master_id = (f[3] != "-").then(|| f[3].to_owned());
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => {
                        let v = s.parse().ok()?;
                        Some((v, v))
                    }
                })
                .collect();
            Some(Node {
                id: f[0].to_owned(),
                host,
                port,
                role,
                master_id,
                slots,
                failed: flags.iter().any(|&g| g == "fail" || g == "fail?")
                    || flags.contains(&"noaddr"),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_nodes() {
        let text = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@40004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@40002 master - 0 1426238316232 2 connected 5461-10922
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 [5461->-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1]
6ec23923021cf3ffec47632106199cb7f496ce01 127.0.0.1:30005@40005 master,fail - 0 1426238316232 5 disconnected 10923 10924-16383
";
        let nodes = parse_nodes(text, "redis://127.0.0.1:30001/");
        assert_eq!(nodes.len(), 4);
        assert_eq!(nodes[0].role, Role::Replica);
        assert_eq!(
            nodes[0].master_id.as_deref(),
            Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca")
        );
        assert_eq!(nodes[1].slots, vec![(5461, 10922)]);
        assert_eq!(nodes[2].slots, vec![(0, 5460)]);
        assert!(nodes[2].serves(0) && !nodes[2].serves(5461));
        assert!(nodes[3].failed);
        assert_eq!(nodes[3].slots, vec![(10923, 10923), (10924, 16383)]);
    }

    #[test]
    fn urls_split() {
        assert_eq!(
            url_host_port("redis://127.0.0.1:7000/"),
            ("127.0.0.1".into(), 7000)
        );
        assert_eq!(url_host_port("redis://:pw@h:7001"), ("h".into(), 7001));
    }
}
