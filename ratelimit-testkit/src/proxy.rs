//! A loopback TCP proxy for fault tests (feature `redis`).
//!
//! [`Proxy::start`] listens on a free `127.0.0.1` port and forwards bytes
//! both ways between each client connection and a new connection to the
//! upstream address (a Redis server). It runs on a thread and runtime of its
//! own, so it works the same under any test runtime (or none), and keeps
//! forwarding while a test blocks. Told to, it injects the faults a store
//! must survive:
//!
//! - **a lost reply** ([`Proxy::drop_next_reply`], [`Proxy::drop_next_replies`],
//!   [`Proxy::drop_replies_to`]): a request is forwarded, the server executes
//!   it and answers, and the client never sees the answer. With
//!   [`LostReply::Close`] (the default) the proxy then closes that client
//!   connection (and its server connection), as a connection reset after the
//!   request was sent would; with [`LostReply::Hold`] the connection stays
//!   open and silent (nothing more is forwarded either way), so the client
//!   runs into its own timeout.
//! - **a stalled network** ([`Proxy::pause`], [`Proxy::resume`]): nothing is
//!   forwarded in either direction; connections stay open; what was sent
//!   meanwhile is delivered on resume.
//! - **a cut** ([`Proxy::cut_all`]): every open connection is closed.
//!
//! [`Proxy::stats`] counts connections, bytes and lost replies.
//!
//! A lost reply is decided by bytes, without parsing RESP: a request is a
//! read from the client; the reply lost is the **next read from the server
//! on that connection** after the request was forwarded. One request in
//! flight on the connection (what a store call on an idle connection is)
//! makes that its reply. A client that pipelines several requests may lose
//! the replies of requests sent just before; with [`LostReply::Close`] every
//! later reply of that connection is lost too (they never are
//! counted in [`ProxyStats::replies_lost`], which counts lost-reply events).
//! Because the reply was read from the server, a lost reply always means the
//! server executed the request: [`Proxy::wait_replies_lost`] tells a test
//! when that has happened.
//!
//! Arm a loss **after** the client has connected (make one call first):
//! connection set-up (`HELLO`, `CLIENT SETINFO`, `SCRIPT LOAD`) is requests
//! too. [`Proxy::drop_replies_to`] only counts requests containing given
//! bytes (say `EVALSHA`), which also keeps replication or health-check
//! traffic out of it.
//!
//! ```no_run
//! use ratelimit_testkit::proxy::Proxy;
//! use ratelimit_testkit::redis_server::RedisServer;
//!
//! let server = RedisServer::start_local();
//! let proxy = Proxy::start(server.addr());
//! // Build the store against proxy.url(), make one call, then:
//! proxy.drop_next_reply();
//! // ... the store's call now fails (connection closed after the request);
//! // the server did run it:
//! assert!(proxy.wait_replies_lost(1, std::time::Duration::from_secs(5)));
//! // Read the outcome directly, not through the proxy:
//! let mut direct = server.connection();
//! # let _ = &mut direct;
//! ```
//!
//! A cluster client follows the addresses the nodes announce (`CLUSTER
//! SLOTS`, `MOVED`), so a proxy in front of a node only sees traffic if the
//! node announces the proxy's port: see
//! `RedisCluster::start_local_proxied` (feature `redis-cluster`).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How long the proxy tries to connect to the upstream for a client.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long [`Proxy::cut_all`] waits at most for the connections to close.
const CUT_TIMEOUT: Duration = Duration::from_secs(5);

/// How the client experiences a lost reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LostReply {
    /// The proxy closes the client connection (and the server connection)
    /// instead of delivering the reply: the client sees the connection end
    /// after its request was sent.
    #[default]
    Close,
    /// The proxy keeps the connection open and forwards nothing more on it,
    /// either way: the client waits until its own timeout, or until it
    /// closes the connection, or [`Proxy::cut_all`].
    Hold,
}

/// A snapshot of a proxy's counters, since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProxyStats {
    /// Client connections accepted.
    pub connections: u64,
    /// Client connections open now.
    pub open: u64,
    /// Client connections closed because the upstream could not be reached.
    pub upstream_failures: u64,
    /// Bytes forwarded from clients to the server.
    pub bytes_to_server: u64,
    /// Bytes forwarded from the server to clients.
    pub bytes_to_client: u64,
    /// Replies read from the server and not delivered, by
    /// [`Proxy::drop_next_reply`] and its kin (one per armed loss).
    pub replies_lost: u64,
}

/// The losses armed and not yet used.
#[derive(Debug, Default)]
struct LossRule {
    remaining: u64,
    matching: Option<Vec<u8>>,
    how: LostReply,
}

#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
    upstream_failures: AtomicU64,
    bytes_to_server: AtomicU64,
    bytes_to_client: AtomicU64,
    replies_lost: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    paused: watch::Sender<bool>,
    /// Bumped by every cut: a connection ends when it changes.
    epoch: watch::Sender<u64>,
    shutdown: watch::Sender<bool>,
    rule: Mutex<LossRule>,
    /// Open connections: id -> the epoch they started in.
    live: Mutex<HashMap<u64, u64>>,
    next_id: AtomicU64,
    counters: Counters,
}

impl Shared {
    fn rule(&self) -> MutexGuard<'_, LossRule> {
        self.rule.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn live(&self) -> MutexGuard<'_, HashMap<u64, u64>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the request in `bytes` arms a loss; if so, uses one up and
    /// says how the reply is lost.
    fn take_loss(&self, bytes: &[u8]) -> Option<LostReply> {
        let mut rule = self.rule();
        if rule.remaining == 0 {
            return None;
        }
        if let Some(pattern) = &rule.matching
            && !contains(bytes, pattern)
        {
            return None;
        }
        rule.remaining -= 1;
        Some(rule.how)
    }
}

/// A loopback TCP proxy in front of one server. See the module docs.
///
/// Dropping it closes every connection and stops its thread.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy on a free `127.0.0.1` port, forwarding to `upstream`.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound or the runtime cannot start.
    pub fn start(upstream: SocketAddr) -> Self {
        Self::start_on(0, upstream)
            .unwrap_or_else(|e| panic!("starting a proxy to {upstream}: {e}"))
    }

    /// A proxy on `127.0.0.1:<port>` (0: any free port), forwarding to
    /// `upstream`; an error when the port cannot be bound. The upstream is
    /// connected per client connection, so it need not be up yet.
    pub fn start_on(port: u16, upstream: SocketAddr) -> io::Result<Self> {
        let listener = StdListener::bind(("127.0.0.1", port))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let shared = Arc::new(Shared {
            upstream,
            paused: watch::Sender::new(false),
            epoch: watch::Sender::new(0),
            shutdown: watch::Sender::new(false),
            rule: Mutex::new(LossRule::default()),
            live: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            counters: Counters::default(),
        });
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(accept_loop(listener, for_thread));
                // Dropping the runtime drops every connection task: sockets close.
                drop(runtime);
            })?;
        Ok(Self {
            addr,
            shared,
            thread: Some(thread),
        })
    }

    /// The address clients connect to, `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `redis://127.0.0.1:<port>/`: the URL to give a client.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.addr.port())
    }

    /// The address the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Loses the reply to the next request, on whichever connection it comes
    /// (the server executes it; the client does not get the answer). Adds to
    /// losses armed before.
    pub fn drop_next_reply(&self) {
        self.drop_next_replies(1);
    }

    /// Loses the replies to the next `n` requests (one per request, on
    /// whichever connections they come). Adds to losses armed before, and
    /// makes them match any request.
    pub fn drop_next_replies(&self, n: u64) {
        let mut rule = self.shared.rule();
        rule.remaining += n;
        rule.matching = None;
    }

    /// Loses the replies to the next `n` requests whose bytes contain
    /// `request_bytes` (such as `b"EVALSHA"`); other requests pass. Replaces
    /// the losses armed before.
    pub fn drop_replies_to(&self, request_bytes: &[u8], n: u64) {
        let mut rule = self.shared.rule();
        rule.remaining = n;
        rule.matching = Some(request_bytes.to_vec());
    }

    /// How lost replies look to the client from now on (default
    /// [`LostReply::Close`]); losses already triggered keep theirs.
    pub fn set_lost_reply(&self, how: LostReply) {
        self.shared.rule().how = how;
    }

    /// The armed losses not yet triggered by a request.
    pub fn pending_drops(&self) -> u64 {
        self.shared.rule().remaining
    }

    /// Disarms the losses not yet triggered; returns how many there were.
    pub fn cancel_drops(&self) -> u64 {
        std::mem::take(&mut self.shared.rule().remaining)
    }

    /// Waits until at least `n` replies have been lost in all (so the server
    /// has executed those requests), at most `timeout`; whether they were.
    pub fn wait_replies_lost(&self, n: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.stats().replies_lost >= n {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Stops forwarding in both directions, as a stalled network: nothing
    /// reaches the server, nothing reaches the clients, connections stay
    /// open (new ones are accepted and wait). What is sent meanwhile is
    /// delivered on [`Proxy::resume`].
    pub fn pause(&self) {
        self.shared.paused.send_replace(true);
    }

    /// Forwards again after [`Proxy::pause`].
    pub fn resume(&self) {
        self.shared.paused.send_replace(false);
    }

    /// Whether the proxy is paused.
    pub fn is_paused(&self) -> bool {
        *self.shared.paused.borrow()
    }

    /// Closes every open connection (client and server side), and waits
    /// (at most 5 s) until they are closed. Clients may connect again.
    pub fn cut_all(&self) {
        let mut cut_at = 0;
        self.shared.epoch.send_modify(|e| {
            *e += 1;
            cut_at = *e;
        });
        let deadline = Instant::now() + CUT_TIMEOUT;
        while self.shared.live().values().any(|&e| e < cut_at) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        ProxyStats {
            connections: c.connections.load(Ordering::SeqCst),
            open: self.shared.live().len() as u64,
            upstream_failures: c.upstream_failures.load(Ordering::SeqCst),
            bytes_to_server: c.bytes_to_server.load(Ordering::SeqCst),
            bytes_to_client: c.bytes_to_client.load(Ordering::SeqCst),
            replies_lost: c.replies_lost.load(Ordering::SeqCst),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(listener: StdListener, shared: Arc<Shared>) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(_) => return,
    };
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.wait_for(|&s| s) => return,
        };
        let Ok((client, _)) = accepted else { continue };
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        let epoch = *shared.epoch.borrow();
        shared.live().insert(id, epoch);
        shared.counters.connections.fetch_add(1, Ordering::SeqCst);
        let guard = LiveGuard {
            shared: Arc::clone(&shared),
            id,
        };
        tokio::spawn(async move {
            let mut cut = guard.shared.epoch.subscribe();
            tokio::select! {
                () = serve(client, &guard.shared) => {}
                _ = cut.wait_for(|&e| e != epoch) => {}
            }
            drop(guard);
        });
    }
}

/// Unregisters a connection when its task ends or is dropped.
#[derive(Debug)]
struct LiveGuard {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.shared.live().remove(&self.id);
    }
}

/// One connection's lost-reply state, shared by its two directions.
#[derive(Debug, Default)]
struct Connection {
    /// Losses armed by requests forwarded on this connection, in order.
    armed: Mutex<VecDeque<LostReply>>,
    /// Set by a [`LostReply::Hold`]: nothing more is forwarded.
    held: std::sync::atomic::AtomicBool,
}

impl Connection {
    fn armed(&self) -> MutexGuard<'_, VecDeque<LostReply>> {
        self.armed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn serve(client: TcpStream, shared: &Shared) {
    let mut paused = shared.paused.subscribe();
    if paused.wait_for(|&p| !p).await.is_err() {
        return;
    }
    let server =
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(shared.upstream)).await {
            Ok(Ok(server)) => server,
            _ => {
                shared
                    .counters
                    .upstream_failures
                    .fetch_add(1, Ordering::SeqCst);
                return;
            }
        };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let conn = Connection::default();
    // Either direction ending (EOF, error, a reply lost with Close) ends both.
    tokio::select! {
        () = pump(client_read, server_write, shared, &conn, Direction::Requests) => {}
        () = pump(server_read, client_write, shared, &conn, Direction::Replies) => {}
    }
}

/// Which way a [`pump`] forwards.
#[derive(Debug, Clone, Copy)]
enum Direction {
    /// Client to server: requests pass and arm the losses.
    Requests,
    /// Server to client: replies pass, or are lost when armed.
    Replies,
}

/// Forwards one direction of a connection until EOF, an error, or a reply
/// lost with [`LostReply::Close`]; holds while the proxy is paused.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: &Shared,
    conn: &Connection,
    direction: Direction,
) {
    let mut paused = shared.paused.subscribe();
    let bytes = match direction {
        Direction::Requests => &shared.counters.bytes_to_server,
        Direction::Replies => &shared.counters.bytes_to_client,
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if paused.wait_for(|&p| !p).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Read before a pause, delivered after it.
        if paused.wait_for(|&p| !p).await.is_err() {
            return;
        }
        if conn.held.load(Ordering::SeqCst) {
            continue;
        }
        match direction {
            Direction::Requests => {
                if let Some(how) = shared.take_loss(&buf[..n]) {
                    conn.armed().push_back(how);
                }
            }
            Direction::Replies => {
                let lost = conn.armed().pop_front();
                if let Some(how) = lost {
                    shared.counters.replies_lost.fetch_add(1, Ordering::SeqCst);
                    match how {
                        LostReply::Close => return,
                        LostReply::Hold => {
                            conn.held.store(true, Ordering::SeqCst);
                            continue;
                        }
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        bytes.fetch_add(n as u64, Ordering::SeqCst);
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}
