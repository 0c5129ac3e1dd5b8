//! A primary, a replica and a Redis Sentinel for tests (feature `redis`).
//!
//! [`RedisSentinel::start`] spawns a primary and a replica
//! (`--replicaof`) on free loopback ports, waits until the replica's link
//! is up, then starts one sentinel (`redis-server <conf> --sentinel`, as
//! Debian's redis-sentinel package does) that monitors the primary under
//! [`MASTER_NAME`] with a quorum of 1 and
//! `down-after-milliseconds` [`DOWN_AFTER`], and waits until it knows the
//! replica. Everything is killed on drop.
//!
//! For failover tests: [`RedisSentinel::kill_primary`] (`SIGKILL`), and
//! [`RedisSentinel::wait_for_promotion`], which polls the replica's
//! `ROLE` every millisecond (bounded) and returns the instant it first
//! answered `master`: the promotion.
//!
//! When `redis-server` is not installed it **panics** with a message
//! saying how to get it.

use std::io::ErrorKind;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::redis_server::fresh_prefix;
use crate::server_process::{HOW_TO_GET_REDIS, ServerOptions, ServerProcess, free_port};

/// The master name the sentinel monitors.
pub const MASTER_NAME: &str = "rltest-primary";

/// The sentinel's `down-after-milliseconds`: how long the primary may be
/// silent before the sentinel fails it over.
pub const DOWN_AFTER: Duration = Duration::from_millis(400);

/// How long start-up steps wait at most.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A primary, its replica and a sentinel. See the module docs.
#[derive(Debug)]
pub struct RedisSentinel {
    dir: PathBuf,
    primary: Mutex<ServerProcess>,
    replica: ServerProcess,
    sentinel: Mutex<Option<Child>>,
    sentinel_port: u16,
    prefix: String,
}

impl RedisSentinel {
    /// Starts the primary, the replica and the sentinel (see the module
    /// docs).
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed (the message says how to get
    /// it), or a step does not complete within [`READY_TIMEOUT`].
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("rl-sentinel-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let options = ServerOptions::new().dir(&dir);
        let primary = ServerProcess::start(&options);
        let replica = ServerProcess::start(&options.clone().args([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            primary.port().to_string(),
        ]));
        wait(READY_TIMEOUT, "the replica's link to the primary", || {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut replica.connection(Duration::from_secs(2)).ok()?)
                .ok()?;
            info.contains("master_link_status:up").then_some(())
        });
        let sentinel_port = free_port();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {sentinel_port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {} 1\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {}\n\
                 sentinel failover-timeout {MASTER_NAME} 10000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir.display(),
                primary.port(),
                DOWN_AFTER.as_millis()
            ),
        )
        .unwrap_or_else(|e| panic!("writing {}: {e}", conf.display()));
        let log = std::fs::File::create(dir.join("sentinel.log"))
            .unwrap_or_else(|e| panic!("creating the sentinel's log: {e}"));
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                if e.kind() == ErrorKind::NotFound {
                    panic!("redis-server not found on PATH: {HOW_TO_GET_REDIS}");
                }
                panic!("starting redis-server --sentinel: {e}")
            });
        let fixture = Self {
            dir,
            primary: Mutex::new(primary),
            replica,
            sentinel: Mutex::new(Some(child)),
            sentinel_port,
            prefix: fresh_prefix(),
        };
        let url = fixture.sentinel_url();
        wait(READY_TIMEOUT, "the sentinel to know the replica", || {
            let client = redis::Client::open(url.as_str()).ok()?;
            let mut conn = client
                .get_connection_with_timeout(Duration::from_secs(1))
                .ok()?;
            let replicas: Vec<Vec<String>> = redis::cmd("SENTINEL")
                .arg("replicas")
                .arg(MASTER_NAME)
                .query(&mut conn)
                .ok()?;
            (!replicas.is_empty()).then_some(())
        });
        fixture
    }

    /// The sentinel's URL, `redis://127.0.0.1:<port>/`.
    pub fn sentinel_url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.sentinel_port)
    }

    /// The master name the sentinel monitors ([`MASTER_NAME`]).
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// The port of the first primary.
    pub fn primary_port(&self) -> u16 {
        self.primary
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .port()
    }

    /// The port of the replica (the primary after a failover).
    pub fn replica_port(&self) -> u16 {
        self.replica.port()
    }

    /// This fixture's random key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A synchronous connection to the replica (the primary after a
    /// failover), 5 s timeouts.
    ///
    /// # Panics
    ///
    /// When it cannot connect.
    pub fn replica_connection(&self) -> redis::Connection {
        self.replica
            .connection(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connecting to the replica: {e}"))
    }

    /// A synchronous connection to the first primary, 5 s timeouts.
    ///
    /// # Panics
    ///
    /// When it cannot connect (killed?).
    pub fn primary_connection(&self) -> redis::Connection {
        self.primary
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .connection(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connecting to the primary: {e}"))
    }

    /// Kills the primary (`SIGKILL`): the sentinel fails it over to the
    /// replica after [`DOWN_AFTER`] and its election.
    pub fn kill_primary(&self) {
        self.primary
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .kill();
    }

    /// Polls the replica's `ROLE` every millisecond until it answers
    /// `master` and returns that instant, or `None` after `timeout`. (The
    /// sentinel closes the promoted replica's client connections, this
    /// one's too: it connects again.)
    pub fn wait_for_promotion(&self, timeout: Duration) -> Option<Instant> {
        let deadline = Instant::now() + timeout;
        let mut conn = None;
        while Instant::now() < deadline {
            if conn.is_none() {
                conn = self.replica.connection(Duration::from_secs(1)).ok();
            }
            if let Some(c) = conn.as_mut() {
                match redis::cmd("ROLE").query::<Vec<redis::Value>>(c) {
                    Ok(role) if matches!(role.first(), Some(redis::Value::BulkString(b)) if b == b"master") =>
                    {
                        return Some(Instant::now());
                    }
                    Ok(_) => {}
                    Err(_) => conn = None,
                }
            }
            sleep(Duration::from_millis(1));
        }
        None
    }

    /// The sentinel's log so far (for failure messages).
    pub fn sentinel_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sentinel.log")).unwrap_or_default()
    }

    /// What the sentinel names as the primary now (`host`, `port`).
    pub fn sentinel_primary(&self) -> Option<(String, u16)> {
        let client = redis::Client::open(self.sentinel_url()).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER_NAME)
            .query(&mut conn)
            .ok()
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self
            .sentinel
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Polls `check` every 20 ms until it returns `Some`, at most `timeout`.
fn wait<T>(timeout: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "waited {timeout:?} for {what} in the Sentinel fixture"
        );
        sleep(Duration::from_millis(20));
    }
}
