//! The settings both stores' builders share, and the methods both stores
//! share, written once.
//!
//! [`crate::RedisStoreBuilder`] and `ratelimit_cluster::ClusterStoreBuilder`
//! each hold one [`Options`] (key prefix, injected clock, client timeouts,
//! bound on one decision, bound on calls in flight) and turn it into the
//! store's [`Engine`] with [`Options::engine`]; they differ only in how
//! they connect. Their setters of these options, and the stores' own
//! setters and getters of the engine's settings, are written once here and
//! expanded into each type, so the two stores cannot drift apart in what
//! they accept or mean.

use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::{Clock, StoreError};

use crate::engine::{DEFAULT_MAX_IN_FLIGHT, Engine};
use crate::keys;

/// Default response timeout: 30 ms (see [`Options::response_timeout`]).
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(30);
/// Default time to wait for each connection attempt: 50 ms.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_millis(50);

/// What a store's builder is told before it connects (see the module docs).
///
/// The builders set it through their own methods (`prefix`, `clock`,
/// `response_timeout`, `connection_timeout`, `timeout`, `max_in_flight`);
/// the prefix is checked when the engine is built.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Options {
    /// The key prefix (default [`keys::DEFAULT_PREFIX`], `rl`).
    pub prefix: String,
    /// The injected clock, for tests and replays (default none: Redis'
    /// own `TIME`).
    pub clock: Option<Arc<dyn Clock>>,
    /// How long a set-up or topology command (`TIME`, `SCRIPT LOAD`,
    /// `CLUSTER SLOTS`) waits for its reply (default
    /// [`DEFAULT_RESPONSE_TIMEOUT`]). Not a bound on decisions: a script
    /// call waits for its reply until its caller's deadline (a request
    /// without one: [`Options::timeout`]), however slow the node, and a
    /// node that stops answering altogether is judged by its silence
    /// ([`crate::domains`]).
    pub response_timeout: Duration,
    /// How long the client waits for each connection attempt (default
    /// [`DEFAULT_CONNECTION_TIMEOUT`]).
    pub connection_timeout: Duration,
    /// The bound on one whole decision for a request that carries no
    /// deadline of its own (default none: each store derives it from the
    /// two client timeouts). A request with a deadline (every
    /// `Limiter` check) waits until that deadline, neither less nor more.
    pub timeout: Option<Duration>,
    /// The bound on script calls waiting on one node at once (default
    /// [`DEFAULT_MAX_IN_FLIGHT`]).
    pub max_in_flight: usize,
    /// Whether the store sends and reads the node's batch calls on a thread
    /// of its own ([`crate::io`]; default on).
    pub io_thread: bool,
    /// TLS files and credentials (default none: the URL's).
    pub security: crate::tls::Security,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            prefix: keys::DEFAULT_PREFIX.to_owned(),
            clock: None,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
            timeout: None,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            io_thread: true,
            security: crate::tls::Security::default(),
        }
    }
}

impl Options {
    /// The engine these options describe, with `server_clocks` server-clock
    /// offsets to learn (see [`Engine::new`]) and a per-decision bound of
    /// [`Options::timeout`], or `default_timeout` when none was set.
    ///
    /// Fails on an invalid prefix (see [`keys::check_prefix`]), before any
    /// connection is tried.
    pub fn engine(
        &self,
        default_timeout: Duration,
        server_clocks: usize,
    ) -> Result<Engine, StoreError> {
        let mut engine = Engine::new(self.timeout.unwrap_or(default_timeout), server_clocks);
        engine.set_prefix(&self.prefix)?;
        engine.set_clock(self.clock.clone());
        engine.set_max_in_flight(self.max_in_flight);
        Ok(engine)
    }
}

/// Expands into a store builder's `impl` block the setters of the
/// [`Options`] it holds in its field `options`.
///
/// `timeout_default = "..."` is the default of `timeout`, in words (each
/// store derives its own). The links in the docs expect the invoking crate
/// to export `DEFAULT_RESPONSE_TIMEOUT` and `DEFAULT_CONNECTION_TIMEOUT`
/// at its root, and the builder to have a `build` method.
/// Internal to `ratelimit-redis` and `ratelimit-cluster` (the expansion
/// names `ratelimit_core`, a dependency of both).
#[doc(hidden)]
#[macro_export]
macro_rules! options_setters {
    (timeout_default = $timeout:literal) => {
        /// The key prefix (default `rl`): 1 to 64 characters of
        /// `A-Z a-z 0-9 _ - . :`. Checked by [`Self::build`], before it
        /// connects.
        pub fn prefix(mut self, prefix: &str) -> Self {
            prefix.clone_into(&mut self.options.prefix);
            self
        }

        /// Takes "now" from `clock` instead of Redis' `TIME`: for tests and
        /// replays only (see the crate docs on clocks).
        pub fn clock(mut self, clock: impl ::ratelimit_core::Clock + 'static) -> Self {
            self.options.clock = Some(::std::sync::Arc::new(clock));
            self
        }

        /// How long a set-up or topology command (`TIME`, `SCRIPT LOAD`,
        /// `CLUSTER SLOTS`) waits for its reply (default
        /// [`DEFAULT_RESPONSE_TIMEOUT`](crate::DEFAULT_RESPONSE_TIMEOUT)).
        /// It never cuts a decision short: a script call waits for its
        /// reply until its caller's deadline (the `Limiter`'s timeout), or
        /// for a request without one until [`Self::timeout`], however slow
        /// the node (a busy node is not a failed one), and a node that stops
        /// answering altogether is judged by its silence: its breaker opens
        /// (see `ratelimit_redis::domains`).
        pub fn response_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.options.response_timeout = timeout;
            self
        }

        /// How long to wait for each connection attempt to a node (default
        /// [`DEFAULT_CONNECTION_TIMEOUT`](crate::DEFAULT_CONNECTION_TIMEOUT)).
        pub fn connection_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.options.connection_timeout = timeout;
            self
        }

        #[doc = concat!("The bound on one whole decision for a request without a deadline of its own, such as the `StoreExt` shorthands' (default: ", $timeout, "). A request with a deadline (every `Limiter` check) waits until that deadline.")]
        pub fn timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.options.timeout = Some(timeout);
            self
        }

        /// The bound on script calls waiting on one node at once (default
        /// [`DEFAULT_MAX_IN_FLIGHT`](ratelimit_redis::engine::DEFAULT_MAX_IN_FLIGHT));
        /// beyond it a call fails at once with a transient error instead of
        /// queueing behind a stalled node.
        pub fn max_in_flight(mut self, max: usize) -> Self {
            self.options.max_in_flight = max;
            self
        }

        /// Sends and reads the nodes' batch calls (and holds their
        /// connections) on a thread of the store's own (see
        /// `ratelimit_redis::io`), so that the application's runtime, however
        /// busy, never delays them (default on; `false` runs them on the
        /// application's runtime). With thousands of callers on one
        /// runtime, the store's useful output keeps up with its own thread
        /// and collapses without it (BENCHMARKS.md, "Under overload").
        pub fn io_thread(mut self, on: bool) -> Self {
            self.options.io_thread = on;
            self
        }

        /// Trusts the CA certificate(s) in the PEM file `path` for the
        /// servers' certificates, instead of the system's roots (a private
        /// CA). Needs `rediss://` URLs; the file is read by
        /// [`Self::build`].
        pub fn tls_ca_file(mut self, path: impl Into<::std::path::PathBuf>) -> Self {
            self.options.security.ca_file = Some(path.into());
            self
        }

        /// Presents the client certificate in the PEM file `cert` (its
        /// chain) with the private key in the PEM file `key`, for servers
        /// that require one (`tls-auth-clients yes`). Needs `rediss://`
        /// URLs; the files are read by [`Self::build`].
        pub fn tls_client_cert(
            mut self,
            cert: impl Into<::std::path::PathBuf>,
            key: impl Into<::std::path::PathBuf>,
        ) -> Self {
            self.options.security.cert_file = Some(cert.into());
            self.options.security.key_file = Some(key.into());
            self
        }

        /// Authenticates as the ACL user `user`, instead of the URL's.
        pub fn username(mut self, user: impl Into<String>) -> Self {
            self.options.security.username = Some(user.into());
            self
        }

        /// Authenticates with `password`, instead of the URL's. It is never
        /// shown: not by `Debug`, not in any error.
        pub fn password(mut self, password: impl Into<String>) -> Self {
            self.options.security.password = Some(ratelimit_redis::tls::Secret::new(password));
            self
        }
    };
}

/// Expands into a store's `impl` block the setters and getters of the
/// [`Engine`] it holds in its field `engine`: prefix, clock, timeout,
/// calls in flight, keys.
///
/// Internal to `ratelimit-redis` and `ratelimit-cluster` (the expansion
/// names `ratelimit_core`, a dependency of both).
#[doc(hidden)]
#[macro_export]
macro_rules! engine_settings {
    () => {
        /// Uses another key prefix (see
        /// [`check_prefix`](ratelimit_redis::keys::check_prefix)).
        pub fn with_prefix(mut self, prefix: &str) -> Result<Self, ::ratelimit_core::StoreError> {
            self.engine.set_prefix(prefix)?;
            Ok(self)
        }

        /// Takes "now" from `clock` instead of Redis' `TIME`: for tests and
        /// replays only (see the crate docs on clocks).
        pub fn with_clock(mut self, clock: impl ::ratelimit_core::Clock + 'static) -> Self {
            self.engine.set_clock(Some(::std::sync::Arc::new(clock)));
            self
        }

        /// Bounds every decision whose request carries no deadline of its
        /// own (reconnects, redirects and retries included) by `timeout`,
        /// returning
        /// [`StoreError::Timeout`](ratelimit_core::StoreError::Timeout)
        /// after it. A request with a deadline waits until that deadline.
        pub fn with_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.engine.set_timeout(timeout);
            self
        }

        /// Bounds the script calls waiting on one node at once (default
        /// [`DEFAULT_MAX_IN_FLIGHT`](ratelimit_redis::engine::DEFAULT_MAX_IN_FLIGHT),
        /// shared by clones); beyond it a call fails at once with a
        /// transient error.
        pub fn with_max_in_flight(mut self, max: usize) -> Self {
            self.engine.set_max_in_flight(max);
            self
        }

        /// The key prefix.
        pub fn prefix(&self) -> &str {
            self.engine.prefix()
        }

        /// The bound on one decision.
        pub fn timeout(&self) -> ::std::time::Duration {
            self.engine.timeout()
        }

        /// The bound on script calls in flight.
        pub fn max_in_flight(&self) -> usize {
            self.engine.max_in_flight()
        }

        /// Whether the store uses an injected clock rather than Redis'.
        pub fn has_injected_clock(&self) -> bool {
            self.engine.clock().is_some()
        }

        /// The Redis key that holds `caller`'s state under `quota`.
        pub fn key(&self, caller: &[u8], quota: &::ratelimit_core::Quota) -> String {
            $crate::keys::key(self.engine.prefix(), caller, quota)
        }

        /// The script-calling core (server-clock offsets, failure domains,
        /// calls in flight).
        pub fn engine(&self) -> &$crate::engine::Engine {
            &self.engine
        }
    };
}
