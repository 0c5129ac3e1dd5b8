//! A real `redis-server` for tests (feature `redis`).
//!
//! [`RedisServer::start`] spawns `redis-server --port <free> --bind 127.0.0.1
//! --save "" --appendonly no` on a free loopback port, waits until it answers
//! `PING`, and kills it on drop. It can pause (`SIGSTOP`), resume
//! (`SIGCONT`), kill and restart the server on the same port, for fault
//! tests.
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

use std::io::ErrorKind;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The environment variable that points the suites at an external server.
pub const URL_ENV: &str = "RATELIMIT_REDIS_URL";

const HOW_TO_GET_REDIS: &str = "install it with `apt-get install -y redis-server redis-tools` \
     (Debian/Ubuntu; the `redis-server` and `redis-cli` binaries must be on PATH), \
     or point the suite at a running server with RATELIMIT_REDIS_URL=redis://host:port/";

const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A random key prefix, `rltest-<16 hex digits>`: distinct per call.
pub fn fresh_prefix() -> String {
    format!("rltest-{:016x}", rand::random::<u64>())
}

#[derive(Debug)]
enum Mode {
    Local { child: Option<Child>, port: u16 },
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
        let mut last = String::new();
        // A free port can be taken by someone else between finding and using it: retry.
        for _ in 0..5 {
            let port = free_port();
            match spawn(port) {
                Ok(child) => {
                    return Self {
                        mode: Mode::Local {
                            child: Some(child),
                            port,
                        },
                        prefix: fresh_prefix(),
                    };
                }
                Err(e) => last = e,
            }
        }
        panic!("could not start redis-server: {last}");
    }

    /// Whether this fixture spawned the server (as opposed to using
    /// `RATELIMIT_REDIS_URL`).
    pub fn is_local(&self) -> bool {
        matches!(self.mode, Mode::Local { .. })
    }

    /// The server's URL, `redis://127.0.0.1:<port>/` for a local server.
    pub fn url(&self) -> String {
        match &self.mode {
            Mode::Local { port, .. } => format!("redis://127.0.0.1:{port}/"),
            Mode::External { url } => url.clone(),
        }
    }

    /// The server's port (for an external server, as given in its URL; 6379
    /// if none).
    pub fn port(&self) -> u16 {
        match &self.mode {
            Mode::Local { port, .. } => *port,
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

    /// This fixture's random key prefix, `rltest-<hex>`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A redis-rs client for the server (for inspecting keys in tests).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("valid redis URL")
    }

    /// A synchronous connection with 5 s timeouts, for test assertions.
    pub fn connection(&self) -> redis::Connection {
        let conn = self
            .client()
            .get_connection_with_timeout(Duration::from_secs(5))
            .expect("connect to the test redis-server");
        conn.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("set read timeout");
        conn.set_write_timeout(Some(Duration::from_secs(5)))
            .expect("set write timeout");
        conn
    }

    fn pid(&self, what: &str) -> u32 {
        match &self.mode {
            Mode::Local {
                child: Some(child), ..
            } => child.id(),
            Mode::Local { child: None, .. } => {
                panic!("cannot {what}: the server was killed (call restart first)")
            }
            Mode::External { url } => panic!(
                "cannot {what} the external server {url}: fault tests need a local redis-server \
                 (use RedisServer::start_local; {HOW_TO_GET_REDIS})"
            ),
        }
    }

    /// Freezes the server with `SIGSTOP`: connections stay open, nothing
    /// answers.
    pub fn pause(&self) {
        signal(self.pid("pause"), "STOP");
    }

    /// Resumes a paused server with `SIGCONT`.
    pub fn resume(&self) {
        signal(self.pid("resume"), "CONT");
    }

    /// Kills the server (`SIGKILL`) and waits for it to exit. Its data is
    /// gone (nothing is persisted).
    pub fn kill(&mut self) {
        self.pid("kill");
        if let Mode::Local { child, .. } = &mut self.mode {
            if let Some(mut c) = child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Kills the server if it runs, and starts a new one on the same port
    /// (empty: no data, no scripts), waiting until it answers `PING`.
    pub fn restart(&mut self) {
        if let Mode::Local { child: Some(_), .. } = &self.mode {
            self.kill();
        }
        let Mode::Local { child, port } = &mut self.mode else {
            panic!("cannot restart an external server: use RedisServer::start_local");
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match spawn(*port) {
                Ok(c) => {
                    *child = Some(c);
                    return;
                }
                // The old socket may linger briefly; retry within the bound.
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("could not restart redis-server on port {port}: {e}"),
            }
        }
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

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Mode::Local {
            child: Some(child), ..
        } = &mut self.mode
        {
            // SIGKILL also ends a SIGSTOPped process.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 to find a free port");
    listener.local_addr().expect("local address").port()
}

fn spawn(port: u16) -> Result<Child, String> {
    let mut child = Command::new("redis-server")
        .args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .args(["--dir", &std::env::temp_dir().to_string_lossy()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            if e.kind() == ErrorKind::NotFound {
                panic!(
                    "redis-server not found on PATH, and {URL_ENV} is not set: {HOW_TO_GET_REDIS}"
                );
            }
            format!("spawning redis-server: {e}")
        })?;
    let url = format!("redis://127.0.0.1:{port}/");
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "redis-server on port {port} exited at start ({status}); port taken?"
            ));
        }
        match ping(&url, Duration::from_millis(200)) {
            Ok(()) => return Ok(child),
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

fn ping(url: &str, timeout: Duration) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_connection_with_timeout(timeout)
        .map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let pong: String = redis::cmd("PING")
        .query(&mut conn)
        .map_err(|e| e.to_string())?;
    if pong == "PONG" {
        Ok(())
    } else {
        Err(format!("PING answered {pong:?}"))
    }
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap_or_else(|e| panic!("running `kill -{sig} {pid}`: {e}"));
    assert!(status.success(), "`kill -{sig} {pid}` failed: {status}");
}
