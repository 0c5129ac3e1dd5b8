//! One `redis-server` process owned by a test (feature `redis`): the piece
//! both fixtures ([`crate::redis_server`] and the cluster fixture) are built
//! on.
//!
//! [`ServerProcess::start`] spawns `redis-server --port <free> --bind
//! 127.0.0.1 --save "" --appendonly no --dir <dir>` plus the arguments of its
//! [`ServerOptions`] on a free loopback port, waits (bounded by
//! [`START_TIMEOUT`]) until it answers `PING` **as itself** (the `process_id`
//! of `INFO server` is the child's: a port found free can be taken by another
//! test's server before this one binds it, and that server's `PONG` must not
//! pass for this one's), and kills it on drop. It can pause (`SIGSTOP`),
//! resume (`SIGCONT`), kill and restart the server on the same port. While
//! killed, the port is held by a bound socket that does not listen, so that
//! connecting to it is refused and no other test's server can take it before
//! the restart (best effort: when the killed server's connections linger in
//! `TIME_WAIT`, the port cannot be held and is left free).
//!
//! When `redis-server` is not on `PATH` it **panics** with a message saying
//! how to install it: a Redis test never passes without Redis.
//!
//! ```no_run
//! use ratelimit_testkit::server_process::{ServerOptions, ServerProcess};
//!
//! let mut server = ServerProcess::start(&ServerOptions::new().arg("--maxmemory").arg("10mb"));
//! let url = server.url(); // redis://127.0.0.1:<port>/
//! server.pause(); // SIGSTOP: connections stay open, nothing answers
//! server.resume();
//! server.restart(); // empty again, same port
//! # let _ = url;
//! ```

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// How to get Redis: the core of every "no redis-server" panic message.
pub const HOW_TO_GET_REDIS: &str = "install it with `apt-get install -y redis-server redis-tools` \
     (Debian/Ubuntu; the `redis-server` and `redis-cli` binaries must be on PATH)";

/// How long a start or restart waits at most for the server to answer `PING`.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How many free ports [`ServerProcess::start`] tries (a free port can be
/// taken by someone else between finding and using it).
const PORT_ATTEMPTS: usize = 5;

/// How a [`ServerProcess`] is started, beyond the fixed arguments (`--port`,
/// `--bind 127.0.0.1`, `--save ""`, `--appendonly no`, `--dir`).
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    args: Vec<String>,
    dir: Option<PathBuf>,
    bus_port: bool,
    alternative: Option<String>,
    tls: bool,
}

impl ServerOptions {
    /// No extra arguments, the system temporary directory, any free port.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one argument to the command line. `{port}` in it is replaced
    /// by the server's port (for per-node file names such as
    /// `nodes-{port}.conf`).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends several arguments, as [`ServerOptions::arg`].
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// The server's working directory (`--dir`); default: the system
    /// temporary directory.
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// Serves TLS only, with the shared test certificates
    /// ([`crate::tls::TestCerts::shared`]): `--port 0 --tls-port <port>`,
    /// the server certificate, the test CA, and `--tls-auth-clients yes`
    /// (a client certificate of the test CA is required). Replication
    /// and the cluster bus go over TLS too (`--tls-replication yes`,
    /// `--tls-cluster yes`). The fixture's own connections use the test
    /// CA and client certificate.
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Whether the server serves TLS only ([`ServerOptions::tls`]).
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The URL of a server of these options on `port`.
    pub fn url_for(&self, port: u16) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{port}/")
    }

    /// Chooses a port whose cluster bus port (port + 10000) is free too.
    pub fn cluster_bus_port(mut self) -> Self {
        self.bus_port = true;
        self
    }

    /// What the "not installed" panic offers besides installing Redis, such
    /// as "point the suite at a running server with RATELIMIT_REDIS_URL=…".
    pub fn or_else_hint(mut self, hint: impl Into<String>) -> Self {
        self.alternative = Some(hint.into());
        self
    }

    fn command_line(&self, port: u16) -> Vec<String> {
        let dir = self
            .dir
            .clone()
            .unwrap_or_else(std::env::temp_dir)
            .to_string_lossy()
            .into_owned();
        let port = port.to_string();
        let mut line: Vec<String> = [
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &dir,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if self.tls {
            let certs = crate::tls::TestCerts::shared();
            let path = |p: std::path::PathBuf| p.to_string_lossy().into_owned();
            line.extend([
                "--port".to_owned(),
                "0".to_owned(),
                "--tls-port".to_owned(),
                port.clone(),
                "--tls-cert-file".to_owned(),
                path(certs.server_cert()),
                "--tls-key-file".to_owned(),
                path(certs.server_key()),
                "--tls-ca-cert-file".to_owned(),
                path(certs.ca()),
                "--tls-auth-clients".to_owned(),
                "yes".to_owned(),
                "--tls-replication".to_owned(),
                "yes".to_owned(),
            ]);
        }
        line.extend(self.args.iter().map(|a| a.replace("{port}", &port)));
        line
    }

    fn missing_message(&self) -> String {
        match &self.alternative {
            Some(hint) => format!("redis-server not found on PATH: {HOW_TO_GET_REDIS}, or {hint}"),
            None => format!("redis-server not found on PATH: {HOW_TO_GET_REDIS}"),
        }
    }

    pub(crate) fn free_port(&self) -> u16 {
        if !self.bus_port {
            return free_port();
        }
        for _ in 0..200 {
            let port = free_port();
            if !(1024..=55_000).contains(&port) {
                continue;
            }
            if TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
                return port;
            }
        }
        panic!("no free loopback port pair (port, port + 10000) found");
    }
}

/// A `redis-server` process on a loopback port, killed on drop. See the
/// module docs.
#[derive(Debug)]
pub struct ServerProcess {
    port: u16,
    options: ServerOptions,
    child: Option<Child>,
    /// While killed: the port, bound and not listening (see the module docs).
    held: Option<socket2::Socket>,
}

impl ServerProcess {
    /// Spawns `redis-server` on a free loopback port and waits until it
    /// answers `PING`.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed (the message says how to get
    /// it), or it does not come up on any of a few free ports.
    pub fn start(options: &ServerOptions) -> Self {
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            match Self::try_start_on(options.free_port(), options) {
                Ok(server) => return server,
                Err(e) => last = e,
            }
        }
        panic!("could not start redis-server: {last}");
    }

    /// Spawns `redis-server` on `port` and waits until it answers `PING`;
    /// an error when it exits at start (port taken?) or does not answer
    /// within [`START_TIMEOUT`].
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed (the message says how to get it).
    pub fn try_start_on(port: u16, options: &ServerOptions) -> Result<Self, String> {
        let child = spawn(port, options)?;
        Ok(Self {
            port,
            options: options.clone(),
            child: Some(child),
            held: None,
        })
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's address, `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The server's URL, `redis://127.0.0.1:<port>/` (`rediss://` for a
    /// TLS server).
    pub fn url(&self) -> String {
        self.options.url_for(self.port)
    }

    /// Whether the server serves TLS only.
    pub fn is_tls(&self) -> bool {
        self.options.tls
    }

    /// A synchronous connection with `timeout` for connecting, reading and
    /// writing (over TLS with the test CA and client certificate for a TLS
    /// server).
    pub fn connection(&self, timeout: Duration) -> Result<redis::Connection, String> {
        connect(&self.url(), timeout)
    }

    /// Whether the process runs (it was not killed; a paused one runs).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id, `None` once killed.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn running_pid(&self, what: &str) -> u32 {
        self.pid().unwrap_or_else(|| {
            panic!(
                "cannot {what} the redis-server on port {}: it was killed (call restart first)",
                self.port
            )
        })
    }

    /// Freezes the server with `SIGSTOP`: connections stay open, nothing
    /// answers.
    ///
    /// # Panics
    ///
    /// When the server was killed.
    pub fn pause(&self) {
        let pid = self.running_pid("pause");
        signal(pid, "STOP");
        wait_until_stopped(pid);
    }

    /// Resumes a paused server with `SIGCONT`.
    ///
    /// # Panics
    ///
    /// When the server was killed.
    pub fn resume(&self) {
        signal(self.running_pid("resume"), "CONT");
    }

    /// Kills the server (`SIGKILL`, which also ends a paused one) and waits
    /// for it to exit; nothing if it was killed already. Its data is gone
    /// (nothing is persisted). Until [`restart`](Self::restart) the port is
    /// held, so that connecting to it is refused (see the module docs).
    pub fn kill(&mut self) {
        self.end();
        if self.held.is_none() {
            self.held = hold(self.port);
        }
    }

    /// Kills the child and waits for it, holding nothing.
    fn end(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs, and starts a new one on the same port
    /// with the same options (empty: no data, no scripts), waiting until it
    /// answers `PING`.
    ///
    /// # Panics
    ///
    /// When it does not come up within [`START_TIMEOUT`].
    pub fn restart(&mut self) {
        self.end();
        self.held = None;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match spawn(self.port, &self.options) {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                // The old socket may linger briefly; retry within the bound.
                Err(_) if Instant::now() < deadline => sleep(Duration::from_millis(50)),
                Err(e) => panic!("could not restart redis-server on port {}: {e}", self.port),
            }
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.end();
    }
}

/// Binds `127.0.0.1:port` without listening and without `SO_REUSEADDR`:
/// connecting to it is refused, and no other socket can bind it while it is
/// held. `None` when the port cannot be bound (a killed server's connections
/// in `TIME_WAIT`, or someone else took it already).
fn hold(port: u16) -> Option<socket2::Socket> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).ok()?;
    socket
        .bind(&SockAddr::from(SocketAddr::from(([127, 0, 0, 1], port))))
        .ok()?;
    Some(socket)
}

/// A free port on 127.0.0.1 (free when asked: bind it soon).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 to find a free port");
    listener.local_addr().expect("local address").port()
}

fn spawn(port: u16, options: &ServerOptions) -> Result<Child, String> {
    let mut child = Command::new("redis-server")
        .args(options.command_line(port))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            if e.kind() == ErrorKind::NotFound {
                panic!("{}", options.missing_message());
            }
            format!("spawning redis-server: {e}")
        })?;
    let url = options.url_for(port);
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "redis-server on port {port} exited at start ({status}); port taken?"
            ));
        }
        match served_by(&url, Duration::from_millis(200)) {
            Ok(pid) if pid == child.id() => return Ok(child),
            Ok(pid) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "port {port} is answered by another redis-server (pid {pid}, not {})",
                    child.id()
                ));
            }
            Err(e) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "redis-server on port {port} did not answer PING within {START_TIMEOUT:?}: {e}"
                ));
            }
            Err(_) => sleep(Duration::from_millis(10)),
        }
    }
}

/// `PING` on `url` and the `process_id` of `INFO server`: which process
/// answers there; bounded by `timeout`.
fn served_by(url: &str, timeout: Duration) -> Result<u32, String> {
    let mut conn = connect(url, timeout)?;
    let pong: String = redis::cmd("PING")
        .query(&mut conn)
        .map_err(|e| e.to_string())?;
    if pong != "PONG" {
        return Err(format!("PING answered {pong:?}"));
    }
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut conn)
        .map_err(|e| e.to_string())?;
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
        .ok_or_else(|| format!("no process_id in INFO server on {url}"))
}

/// A synchronous connection to `url` with `timeout` for connecting, reading
/// and writing.
pub(crate) fn connect(url: &str, timeout: Duration) -> Result<redis::Connection, String> {
    let client = crate::tls::client(url);
    let conn = client
        .get_connection_with_timeout(timeout)
        .map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    conn.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    Ok(conn)
}

/// `PING` on `url`, bounded by `timeout`: `Ok` when it answers `PONG`.
pub(crate) fn ping(url: &str, timeout: Duration) -> Result<(), String> {
    let mut conn = connect(url, timeout)?;
    let pong: String = redis::cmd("PING")
        .query(&mut conn)
        .map_err(|e| e.to_string())?;
    if pong == "PONG" {
        Ok(())
    } else {
        Err(format!("PING answered {pong:?}"))
    }
}

/// Returns once the kernel reports `pid` stopped (state `T` in
/// `/proc/<pid>/stat`), so that nothing sent after [`ServerProcess::pause`]
/// returns can still run; bounded (1 s), and at once where `/proc` is not.
fn wait_until_stopped(pid: u32) {
    let path = format!("/proc/{pid}/stat");
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        let Ok(stat) = std::fs::read_to_string(&path) else {
            return;
        };
        // `pid (comm) state ...`: the state follows the last ')'.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        if matches!(state, Some('T' | 't')) {
            return;
        }
        sleep(Duration::from_millis(1));
    }
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap_or_else(|e| panic!("running `kill -{sig} {pid}`: {e}"));
    assert!(status.success(), "`kill -{sig} {pid}` failed: {status}");
}
