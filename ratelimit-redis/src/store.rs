//! [`RedisStore`]: the [`Store`] over a single Redis node.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimit_core::store::{Answer, Capabilities, Request};
use ratelimit_core::{Store, StoreError};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::decode::Integers;
use crate::engine::{Engine, Eval, EvalOf, Transport};
use crate::error;
use crate::options::Options;
use crate::scripts::{Call, Script};

/// Default bound on one whole decision (a reconnect, `EVALSHA`, and on
/// `NOSCRIPT` a `SCRIPT LOAD` and a second `EVALSHA`): 140 ms, that is
/// [`crate::DEFAULT_CONNECTION_TIMEOUT`] + 3 x
/// [`crate::DEFAULT_RESPONSE_TIMEOUT`].
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(140);

/// How the store reaches Redis. Scripts, keys and decoding are shared; only
/// the call differs.
#[derive(Clone)]
pub(crate) enum Backend {
    /// redis-rs, through a reconnecting [`ConnectionManager`].
    Redis(ConnectionManager),
    /// A fred client.
    #[cfg(feature = "fred")]
    Fred(fred::clients::Client),
    /// redis-rs, to the primary the sentinels name, followed across
    /// promotions.
    Sentinel(Arc<crate::sentinel::Primary>),
    /// fred, to the primary the sentinels name (found and followed by the
    /// store itself, as for redis-rs): one centralized fred client to the
    /// current primary, replaced when it moves.
    #[cfg(feature = "fred")]
    FredSentinel(Arc<crate::fred_sentinel::FredPrimary>),
}

impl Backend {
    /// Runs `call` (`EVALSHA`, and the source again on `NOSCRIPT`) and
    /// returns the integer reply, as a future boxed per client: each box
    /// is the size of its own client's call, not of the larger of the two.
    fn eval(&self, call: Arc<Call>) -> Eval {
        match self {
            Self::Redis(cm) => Box::pin(redis_eval(cm.clone(), call)),
            Self::Sentinel(primary) => {
                let primary = Arc::clone(primary);
                Box::pin(async move {
                    let reply = redis_eval(primary.manager(), call).await;
                    if let Err(e) = &reply {
                        primary.failed(e);
                    }
                    reply
                })
            }
            #[cfg(feature = "fred")]
            Self::Fred(client) => {
                let client = client.clone();
                Box::pin(async move {
                    let reply =
                        crate::fred::eval(&client, call.script, &call.keys, &call.args).await;
                    marked(call.script, reply)
                })
            }
            #[cfg(feature = "fred")]
            Self::FredSentinel(primary) => {
                let primary = Arc::clone(primary);
                Box::pin(async move {
                    let reply = match primary.client().await {
                        Ok(client) => {
                            crate::fred::eval(&client, call.script, &call.keys, &call.args).await
                        }
                        Err(e) => Err(e),
                    };
                    if let Err(e) = &reply {
                        primary.failed(e);
                    }
                    marked(call.script, reply)
                })
            }
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Redis(_) => "redis-rs",
            Self::Sentinel(_) => "redis-rs through Sentinel",
            #[cfg(feature = "fred")]
            Self::Fred(_) => "fred",
            #[cfg(feature = "fred")]
            Self::FredSentinel(_) => "fred through Sentinel",
        }
    }
}

/// The reply of a call of `script`, the script marked as cached on the
/// server once a call of it has run.
fn marked(script: &Script, reply: Result<Vec<i64>, StoreError>) -> Result<Vec<i64>, StoreError> {
    if reply.is_ok() {
        script.mark_loaded();
    }
    reply
}

/// One script call through redis-rs: `EVALSHA`, or `EVAL` with the source
/// for a quota's own script on first use; on `NOSCRIPT` (a restarted or
/// flushed server: the script did not run) `EVAL` with the source, which
/// also caches it: one round trip more.
async fn redis_eval(mut cm: ConnectionManager, call: Arc<Call>) -> Result<Vec<i64>, StoreError> {
    let (script, keys, args) = (call.script, &call.keys, &call.args);
    let source = script.send_source_first();
    let reply = match script
        .command(keys, args, source)
        .query_async::<Integers>(&mut cm)
        .await
    {
        Err(e)
            if !source
                && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
        {
            script
                .command(keys, args, true)
                .query_async::<Integers>(&mut cm)
                .await
                .map_err(error::from_redis)
        }
        reply => reply.map_err(error::from_redis),
    };
    let reply = reply.map(|Integers(v)| v);
    marked(script, reply)
}

/// A set-up command on `node` (its clock, the scripts), given `wait` for
/// its reply: the connection arms no timer of its own.
pub(crate) async fn bounded<T>(
    node: &str,
    wait: Duration,
    reply: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(wait, reply).await {
        Ok(reply) => reply.map_err(error::from_redis),
        Err(_) => Err(StoreError::message(
            format!("no reply from {node} within {wait:?} (the response timeout)"),
            true,
        )),
    }
}

/// The one node a single-node store talks to: its connection and its name.
struct Node {
    backend: Backend,
    name: Arc<str>,
}

impl Transport for Node {
    fn eval<'a>(self: Arc<Self>, call: Arc<Call>, _deadline: Instant) -> EvalOf<'a>
    where
        Self: 'a,
    {
        self.backend.eval(call)
    }

    fn domain(&self, _slot: u16) -> Arc<str> {
        match &self.backend {
            // The failure domain is the primary: after a promotion the new
            // one starts with a closed breaker of its own.
            Backend::Sentinel(primary) => primary.node(),
            #[cfg(feature = "fred")]
            Backend::FredSentinel(primary) => primary.node(),
            _ => Arc::clone(&self.name),
        }
    }
}

/// A rate-limit [`Store`] in a single Redis node: one atomic Lua script per
/// decision, Redis' own clock, derived TTLs.
///
/// Cheap to clone (clones share the connection). Build it with
/// [`RedisStore::connect`], [`RedisStore::builder`], or from a client you
/// already hold: [`RedisStore::from_connection_manager`] or (feature `fred`)
/// `RedisStore::from_fred`.
///
/// # Contract
///
/// As [`Store`]: each decision is one `EVALSHA` of the algorithm's script
/// (see [`crate::scripts`]), atomic on the server, equal to
/// `ratelimit_core::model::decide` at the server's `TIME` (or at the
/// injected clock's time), with the caller's key laid out and escaped as
/// [`crate::keys`] describes. A request with several charges is one
/// `EVALSHA` of [`crate::scripts::BATCH`] whatever the number of quotas,
/// on the same keys as single-quota requests, all or nothing, equal to
/// `ratelimit_core::model::decide_all`. A cost that can never pass is
/// refused before any network call. Every call is bounded by
/// [`RedisStore::timeout`] and by the request's deadline; errors say
/// whether they are transient.
///
/// # A call the caller gave up on counts nothing
///
/// Every script call carries its deadline in the server's clock (learnt
/// from the replies: [`crate::deadline`]); a script that starts after it
/// (say the server was paused and resumes with the call still queued on the
/// socket) returns "expired" and writes nothing, so a call the limiter has
/// answered by its failure policy is never counted later. At most
/// [`RedisStore::max_in_flight`] calls wait on the connection at once;
/// beyond that a call fails at once (transient) instead of queueing.
#[derive(Clone)]
pub struct RedisStore {
    backend: Backend,
    /// The node, `host:port` (its failure domain).
    node: Arc<str>,
    /// The connection and the node's name, as the engine sends through.
    transport: Arc<dyn Transport>,
    engine: Engine,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("client", &self.backend.name())
            .field("node", &self.node)
            .field("engine", &self.engine)
            .finish()
    }
}

impl RedisStore {
    /// Connects to `url` (`redis://host:port/db`) with the defaults: prefix
    /// `rl`, the server's clock, [`crate::DEFAULT_RESPONSE_TIMEOUT`] and
    /// [`crate::DEFAULT_CONNECTION_TIMEOUT`].
    ///
    /// Fails if the URL is invalid or the server cannot be reached now; once
    /// built, the store reconnects by itself.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::builder(url).build().await
    }

    /// Starts building a store for `url` (`redis://[user:password@]host:port/db`,
    /// or `rediss://` for TLS).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            options: Options::default(),
            sentinel: None,
        }
    }

    /// Starts building a store over the primary that the `sentinels`
    /// (`redis://host:26379/`, `rediss://` for TLS, a sentinel's own
    /// password in its URL) name for the master name `master`, followed
    /// across promotions (see [`crate::sentinel`]). The nodes are reached
    /// over TLS when the sentinels are, with the builder's credentials and
    /// TLS files.
    pub fn sentinel_builder<I, S>(sentinels: I, master: impl Into<String>) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisStoreBuilder {
            url: String::new(),
            options: Options::default(),
            sentinel: Some(crate::sentinel::SentinelConfig {
                sentinels: sentinels.into_iter().map(Into::into).collect(),
                master: master.into(),
            }),
        }
    }

    /// For a store over Sentinel, the primary it sends to now
    /// (`host:port`); `None` for other stores.
    pub fn primary(&self) -> Option<String> {
        match &self.backend {
            Backend::Sentinel(p) => Some(p.node().to_string()),
            #[cfg(feature = "fred")]
            Backend::FredSentinel(p) => Some(p.node().to_string()),
            _ => None,
        }
    }

    /// A store over a connection manager you already hold (its own timeouts
    /// and reconnect settings apply), with prefix `rl`, the server's clock
    /// and a per-call bound of [`DEFAULT_CALL_TIMEOUT`].
    pub fn from_connection_manager(manager: ConnectionManager) -> Self {
        Self::from_backend(Backend::Redis(manager), "redis")
    }

    /// A store over `backend` with the defaults of a client you hold: the
    /// bound [`DEFAULT_CALL_TIMEOUT`] for requests without a deadline.
    pub(crate) fn from_backend(backend: Backend, node: &str) -> Self {
        Self::assemble(backend, node, Engine::new(DEFAULT_CALL_TIMEOUT, 1))
    }

    pub(crate) fn assemble(backend: Backend, node: &str, engine: Engine) -> Self {
        let node: Arc<str> = Arc::from(node);
        Self {
            transport: Arc::new(Node {
                backend: backend.clone(),
                name: Arc::clone(&node),
            }),
            backend,
            node,
            engine,
        }
    }

    /// Sends every decision through the batch script, one alone too (a
    /// batch of one): checks the batch script's arithmetic against the
    /// conformance suite. Slower for one caller than the single-quota
    /// scripts; not for production.
    pub fn with_batch_script_only(mut self) -> Self {
        self.engine.set_batch_only(true);
        self
    }

    /// The most decisions one batch call carries (default
    /// [`crate::engine::DEFAULT_MAX_BATCH`]; 1 turns batching off: every
    /// decision is its own script call).
    pub fn with_max_batch(mut self, max: usize) -> Self {
        self.engine.set_max_batch(max);
        self
    }

    /// The most script calls in flight on the connection at once (default
    /// [`crate::engine::DEFAULT_PIPELINE`]; 1: a batch always waits for the
    /// call in flight). Every call beyond the first carries a full batch.
    pub fn with_pipeline(mut self, calls: usize) -> Self {
        self.engine.set_pipeline(calls);
        self
    }

    /// Names the node in errors and metrics (`host:port`; default: the
    /// URL's for a built store, `redis` for one made from a client).
    pub fn with_node_name(self, name: &str) -> Self {
        Self::assemble(self.backend, name, self.engine)
    }

    /// Sets the node's circuit breaker (default
    /// [`ratelimit_core::CircuitBreaker::DEFAULT`]; see
    /// [`crate::domains`]).
    pub fn with_breaker(mut self, breaker: ratelimit_core::CircuitBreaker) -> Self {
        self.engine.set_breaker(breaker);
        self
    }

    /// The node's name (`host:port`).
    pub fn node(&self) -> &str {
        &self.node
    }

    crate::engine_settings!();
}

/// One script call per request, through a future; atomic across a
/// request's charges; the server's clock unless one was injected.
impl Store for RedisStore {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        Answer::pending(self.engine.decide(&self.transport, request))
    }

    /// Atomic; the server's clock unless one was injected; one failure
    /// domain (the node) judged by the store itself.
    fn capabilities(&self) -> Capabilities {
        self.engine.capabilities()
    }
}

/// Builds a [`RedisStore`] over redis-rs. See [`RedisStore::builder`].
///
/// ```no_run
/// # async fn example() -> Result<(), ratelimit_core::StoreError> {
/// use std::time::Duration;
/// use ratelimit_redis::RedisStore;
///
/// let store = RedisStore::builder("redis://127.0.0.1:6379/")
///     .prefix("myapp:rl")
///     .response_timeout(Duration::from_millis(20))
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
pub struct RedisStoreBuilder {
    pub(crate) url: String,
    pub(crate) options: Options,
    pub(crate) sentinel: Option<crate::sentinel::SentinelConfig>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL may hold a password: leave it out.
        f.debug_struct("RedisStoreBuilder")
            .field("options", &self.options)
            .field("sentinel", &self.sentinel)
            .finish_non_exhaustive()
    }
}

impl RedisStoreBuilder {
    crate::options_setters!(
        timeout_default = "the connection timeout plus three response timeouts, for a \
                           reconnect, `EVALSHA`, and on `NOSCRIPT` a `SCRIPT LOAD` and a \
                           second `EVALSHA`"
    );

    /// Connects and builds the store.
    ///
    /// Fails on an invalid prefix or URL, unreadable TLS files, a server
    /// that cannot be reached now, and credentials or permissions the
    /// store cannot run with: the error names the cause and the fix (a
    /// certificate not trusted or not naming the host, a client
    /// certificate missing or refused, plain text to a TLS port or TLS to
    /// a plain-text port, a wrong password, an ACL permission missing and
    /// the rule to add: see [`crate::acl`]), and never a password. Once
    /// built, the store reconnects by itself (backing off from 25 ms to at
    /// most 100 ms between attempts).
    pub async fn build(self) -> Result<RedisStore, StoreError> {
        let options = &self.options;
        let mut engine =
            options.engine(options.connection_timeout + 3 * options.response_timeout, 1)?;
        let io = if options.io_thread {
            let io = crate::io::IoThread::start("ratelimit-redis-io")?;
            engine.set_io_thread(Some(Arc::clone(&io)));
            Some(io)
        } else {
            None
        };
        // No response timeout on the connection: a script call waits for
        // its reply until its caller's deadline (the engine's one timer per
        // call), and a busy node is not a failed one. The response timeout
        // bounds the set-up commands below.
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(options.connection_timeout))
            .set_min_delay(Duration::from_millis(25))
            .set_max_delay(Duration::from_millis(100))
            .set_number_of_retries(4);
        let (backend, node, tls, user) = match &self.sentinel {
            Some(sentinel) => {
                let primary = crate::sentinel::Primary::connect(
                    sentinel,
                    options.security.clone(),
                    options.connection_timeout,
                    options.response_timeout,
                    config,
                )
                .await?;
                let tls = primary.tls();
                let user = options.security.username.clone();
                (
                    Backend::Sentinel(primary),
                    format!("{} (Sentinel)", sentinel.master),
                    tls,
                    user,
                )
            }
            None => {
                let client = options.security.redis_client(&self.url)?;
                let info = client.get_connection_info();
                let node = info.addr().to_string();
                let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
                let user = info.redis_settings().username().map(str::to_owned);
                // One direct attempt first, given at least a second: its
                // error names the cause (a certificate, a password), where
                // the manager's retries within the connection timeout
                // could end on a bare timeout (a TLS handshake on a busy
                // machine).
                let patient = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(
                        options.connection_timeout.max(Duration::from_secs(1)),
                    ))
                    .set_response_timeout(Some(
                        options.response_timeout.max(Duration::from_secs(1)),
                    ));
                client
                    .get_multiplexed_async_connection_with_config(&patient)
                    .await
                    .map_err(|e| {
                        crate::tls::explained(
                            StoreError::backend(format!("cannot reach {node}: {e}"), true, e),
                            &node,
                            tls,
                        )
                    })?;
                // With an I/O thread, the connection's own task runs there.
                let manager = match &io {
                    Some(io) => io
                        .spawn(ConnectionManager::new_with_config(client, config))
                        .await
                        .map_err(|e| {
                            StoreError::message(
                                format!("the store's I/O thread failed while connecting: {e}"),
                                false,
                            )
                        })?,
                    None => ConnectionManager::new_with_config(client, config).await,
                }
                .map_err(|e| {
                    crate::tls::explained(
                        StoreError::backend(format!("cannot reach {node}: {e}"), true, e),
                        &node,
                        tls,
                    )
                })?;
                (Backend::Redis(manager), node, tls, user)
            }
        };
        let mut m = match &backend {
            Backend::Redis(manager) => manager.clone(),
            Backend::Sentinel(primary) => primary.manager(),
            #[cfg(feature = "fred")]
            Backend::Fred(_) | Backend::FredSentinel(_) => {
                return Err(StoreError::message(
                    "a store built over redis-rs made a fred backend (a bug)",
                    false,
                ));
            }
        };
        let user = user.unwrap_or_else(|| "default".to_owned());
        let checked = |e: StoreError| {
            let e = crate::tls::explained(e, &node, tls);
            let text = e.to_string();
            if crate::acl::is_denied(&text) {
                crate::acl::denied(&text, &user, &options.prefix, false)
            } else {
                e
            }
        };
        // Learn the server's clock now, so the first decision carries a
        // deadline too (see `crate::deadline`).
        let wait = options.response_timeout.max(Duration::from_millis(500));
        let time: (i64, i64) = bounded(&node, wait, redis::cmd("TIME").query_async(&mut m))
            .await
            .map_err(checked)?;
        engine.server_clock().observe(
            0,
            time.0.saturating_mul(1_000_000).saturating_add(time.1),
            Instant::now(),
        );
        // Load every script now: a cold start under many callers would
        // otherwise send each of them through NOSCRIPT and SCRIPT LOAD.
        for script in crate::scripts::all() {
            let load = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(script.lua())
                .to_owned();
            let _: String = bounded(&node, wait, load.query_async(&mut m))
                .await
                .map_err(checked)?;
        }
        // Every permission the store needs, checked now (`crate::acl`).
        let _: i64 = bounded(
            &node,
            wait,
            redis::cmd("EVAL")
                .arg("return 1")
                .arg(0)
                .query_async(&mut m),
        )
        .await
        .map_err(checked)?;
        // EVAL, not EVALSHA: a probe never cached would meet NOSCRIPT.
        let probe = redis::cmd("EVAL")
            .arg(crate::acl::PROBE)
            .arg(1)
            .arg(crate::acl::probe_key(&options.prefix))
            .to_owned();
        let denied: Vec<String> = bounded(&node, wait, probe.query_async(&mut m))
            .await
            .map_err(checked)?;
        if let Some(first) = denied.first() {
            return Err(crate::acl::denied(first, &user, &options.prefix, false));
        }
        Ok(RedisStore::assemble(backend, &node, engine))
    }
}
