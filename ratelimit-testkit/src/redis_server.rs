//! A real `redis-server` for tests (feature `redis`).
//!
//! [`RedisServer::start`] spawns `redis-server --port <free> --bind 127.0.0.1
//! --save "" --appendonly no` on a free loopback port, waits until it answers
//! `PING`, and kills it on drop. It can pause (`SIGSTOP`), resume
//! (`SIGCONT`), kill and restart the server on the same port, for fault
//! tests. The process is a [`ServerProcess`], as every node of the cluster
//! fixture is.
//!
//! With the environment variable `RATELIMIT_REDIS_URL` set (for example
//! `redis://127.0.0.1:6379/`), [`RedisServer::start`] uses that server
//! instead; [`RedisServer::start_local`] always spawns one (fault tests
//! need a process they can stop).
//!
//! When no server can be had, the fixture **panics** with a message saying
//! how to get one; a Redis test never passes without Redis.
//!
//! Every fixture has a random key prefix ([`RedisServer::prefix`], and
//! [`fresh_prefix`] for more), so suites can share one server.

use std::net::SocketAddr;
use std::time::Duration;

use crate::acl::AclUser;
use crate::server_process::{HOW_TO_GET_REDIS, ServerOptions, ServerProcess, connect, ping};

/// The environment variable that points the suites at an external server.
pub const URL_ENV: &str = "RATELIMIT_REDIS_URL";

const EXTERNAL_HINT: &str =
    "point the suite at a running server with RATELIMIT_REDIS_URL=redis://host:port/";

/// A random key prefix, `rltest-<16 hex digits>`: distinct per call.
pub fn fresh_prefix() -> String {
    format!("rltest-{:016x}", rand::random::<u64>())
}

#[derive(Debug)]
enum Mode {
    Local(ServerProcess),
    External { url: String },
}

/// A Redis server for one test or suite. See the module docs.
#[derive(Debug)]
pub struct RedisServer {
    mode: Mode,
    prefix: String,
}

impl RedisServer {
    /// The server named by `RATELIMIT_REDIS_URL` if set, else a new local
    /// `redis-server` on a free loopback port.
    ///
    /// # Panics
    ///
    /// When neither is available (the message says how to get Redis), or
    /// the external server does not answer `PING`.
    pub fn start() -> Self {
        match std::env::var(URL_ENV) {
            Ok(url) if !url.trim().is_empty() => {
                let url = url.trim().to_owned();
                if let Err(e) = ping(&url, Duration::from_secs(2)) {
                    panic!("{URL_ENV}={url} does not answer PING: {e}");
                }
                Self {
                    mode: Mode::External { url },
                    prefix: fresh_prefix(),
                }
            }
            _ => Self::start_local(),
        }
    }

    /// A new local `redis-server` on a free loopback port, whatever
    /// `RATELIMIT_REDIS_URL` says.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed (the message says how to get
    /// it) or does not come up.
    pub fn start_local() -> Self {
        Self {
            mode: Mode::Local(ServerProcess::start(&local_options())),
            prefix: fresh_prefix(),
        }
    }

    /// A new local `redis-server` that serves **TLS only** and requires
    /// a client certificate ([`ServerOptions::tls`]): its URL is
    /// `rediss://127.0.0.1:<port>/`; the test CA and client certificate
    /// are [`crate::tls::TestCerts::shared`].
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start_local`], and when this `redis-server` is
    /// built without TLS.
    pub fn start_tls() -> Self {
        Self {
            mode: Mode::Local(ServerProcess::start(&local_options().tls())),
            prefix: fresh_prefix(),
        }
    }

    /// A new local `redis-server` started with `options` (plus the
    /// fixture's fixed arguments).
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start_local`].
    pub fn start_with(options: &ServerOptions) -> Self {
        Self {
            mode: Mode::Local(ServerProcess::start(
                &options.clone().or_else_hint(EXTERNAL_HINT),
            )),
            prefix: fresh_prefix(),
        }
    }

    /// Creates an ACL user with a random name and password and the rule
    /// `rule` (see [`AclUser::create`]) on this server.
    ///
    /// # Panics
    ///
    /// When the server refuses it.
    pub fn acl_user(&self, rule: &str) -> AclUser {
        let user = AclUser::random();
        user.create(&mut self.connection(), rule);
        user
    }

    /// Whether this fixture spawned the server (as opposed to using
    /// `RATELIMIT_REDIS_URL`).
    pub fn is_local(&self) -> bool {
        matches!(self.mode, Mode::Local { .. })
    }

    /// The server's URL, `redis://127.0.0.1:<port>/` for a local server.
    pub fn url(&self) -> String {
        match &self.mode {
            Mode::Local(server) => server.url(),
            Mode::External { url } => url.clone(),
        }
    }

    /// The server's port (for an external server, as given in its URL; 6379
    /// if none).
    pub fn port(&self) -> u16 {
        match &self.mode {
            Mode::Local(server) => server.port(),
            Mode::External { url } => redis::Client::open(url.as_str())
                .ok()
                .and_then(|c| match c.get_connection_info().addr() {
                    redis::ConnectionAddr::Tcp(_, port)
                    | redis::ConnectionAddr::TcpTls { port, .. } => Some(*port),
                    _ => None,
                })
                .unwrap_or(6379),
        }
    }

    /// The server's socket address (`127.0.0.1:<port>` for a local server;
    /// an external server's host is resolved): what a proxy in front of it
    /// forwards to.
    ///
    /// # Panics
    ///
    /// When an external server's host does not resolve.
    pub fn addr(&self) -> SocketAddr {
        match &self.mode {
            Mode::Local(server) => server.addr(),
            Mode::External { url } => {
                let host = redis::Client::open(url.as_str())
                    .ok()
                    .and_then(|c| match c.get_connection_info().addr() {
                        redis::ConnectionAddr::Tcp(host, _)
                        | redis::ConnectionAddr::TcpTls { host, .. } => Some(host.clone()),
                        _ => None,
                    })
                    .unwrap_or_else(|| "127.0.0.1".to_owned());
                std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), self.port()))
                    .ok()
                    .and_then(|mut a| a.next())
                    .unwrap_or_else(|| panic!("{URL_ENV}={url}: host {host} does not resolve"))
            }
        }
    }

    /// This fixture's random key prefix, `rltest-<hex>`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A redis-rs client for the server (for inspecting keys in tests).
    pub fn client(&self) -> redis::Client {
        crate::tls::client(&self.url())
    }

    /// A synchronous connection with 5 s timeouts, for test assertions.
    pub fn connection(&self) -> redis::Connection {
        connect(&self.url(), Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connecting to the test redis-server: {e}"))
    }

    /// The local server's process, for fault tests.
    ///
    /// # Panics
    ///
    /// For an external server (fault tests need a process they own).
    pub fn process(&self) -> &ServerProcess {
        match &self.mode {
            Mode::Local(server) => server,
            Mode::External { url } => external_panic(url),
        }
    }

    fn process_mut(&mut self) -> &mut ServerProcess {
        match &mut self.mode {
            Mode::Local(server) => server,
            Mode::External { url } => external_panic(url),
        }
    }

    /// Freezes the server with `SIGSTOP`: connections stay open, nothing
    /// answers.
    pub fn pause(&self) {
        self.process().pause();
    }

    /// Resumes a paused server with `SIGCONT`.
    pub fn resume(&self) {
        self.process().resume();
    }

    /// Kills the server (`SIGKILL`) and waits for it to exit. Its data is
    /// gone (nothing is persisted). Until `restart`, connecting to its port
    /// is refused and no other server can take the port (see
    /// [`crate::server_process`]).
    pub fn kill(&mut self) {
        let server = self.process_mut();
        if !server.is_running() {
            panic!("cannot kill: the server was killed (call restart first)");
        }
        server.kill();
    }

    /// Kills the server if it runs, and starts a new one on the same port
    /// (empty: no data, no scripts), waiting until it answers `PING`.
    pub fn restart(&mut self) {
        self.process_mut().restart();
    }

    /// `SCRIPT FLUSH`: empties the server's script cache, as a restart or
    /// failover would.
    pub fn flush_scripts(&self) {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut self.connection())
            .expect("SCRIPT FLUSH");
    }

    /// `used_memory` from `INFO memory`, in bytes.
    pub fn info_memory_used(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query(&mut self.connection())
            .expect("INFO memory");
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("INFO memory has used_memory")
    }
}

fn local_options() -> ServerOptions {
    ServerOptions::new().or_else_hint(EXTERNAL_HINT)
}

fn external_panic(url: &str) -> ! {
    panic!(
        "cannot control the external server {url}: fault tests need a local redis-server \
         (use RedisServer::start_local; {HOW_TO_GET_REDIS}, or {EXTERNAL_HINT})"
    )
}
