//! [`ClusterStore`]: the [`Store`] over a Redis Cluster.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ratelimit_core::model::Charge;
use ratelimit_core::{Clock, Decision, Micros, Quota, Store, StoreError};
use ratelimit_redis::scripts::Script;
use ratelimit_redis::{decode, keys, scripts};
use tokio::time::Instant;

use crate::connection::Backend;
use crate::retry::{self, Addr, MAX_ATTEMPTS, MAX_RETRIES, Next, Route};
use crate::stats::{ClusterStats, Counters, bump};

/// Default bound on one whole decision, redirects and retries included: 200 ms.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(200);

/// A rate-limit [`Store`] in a Redis Cluster: the single-node crate's
/// scripts, key layout and decoding, with cluster routing, redirects and
/// failover handled.
///
/// Cheap to clone (clones share the connections and the counters). Build
/// it with [`ClusterStore::connect`] or [`ClusterStore::builder`], or from a
/// client you already hold: [`ClusterStore::from_cluster_connection`] or
/// (feature `fred`) `ClusterStore::from_fred`.
///
/// # Contract
///
/// As [`Store`]: each decision is one run of the algorithm's script (see
/// [`ratelimit_redis::scripts`]) on the master of the caller's slot, atomic
/// there. Every key of one caller carries the hash tag `{<tag>}` (the
/// escaped caller, hashed when long: [`ratelimit_redis::keys`]), so all of a caller's keys live in one slot
/// whatever bytes the caller holds; a decision over several quotas
/// ([`Store::decide_all`]) is one run of [`scripts::MULTI`] on their keys
/// there, all or nothing, whatever the number of quotas. `MOVED`, `ASK`, `NOSCRIPT`, `TRYAGAIN`
/// and the other errors that prove the script did not run are handled
/// inside the call; an error after which the script may have run is
/// returned rather than retried, so no request is counted twice by the
/// store (see [`crate::retry`]). Every call is bounded by
/// [`ClusterStore::timeout`].
#[derive(Clone)]
pub struct ClusterStore {
    pub(crate) backend: Backend,
    pub(crate) prefix: Arc<str>,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) timeout: Duration,
    pub(crate) counters: Arc<Counters>,
}

impl fmt::Debug for ClusterStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterStore")
            .field("client", &self.backend.name())
            .field("prefix", &self.prefix)
            .field("clock", &self.clock)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl ClusterStore {
    pub(crate) fn from_backend(backend: Backend) -> Self {
        Self {
            backend,
            prefix: Arc::from(keys::DEFAULT_PREFIX),
            clock: None,
            timeout: DEFAULT_CALL_TIMEOUT,
            counters: Arc::default(),
        }
    }

    /// A store over a redis-rs cluster connection you already hold, with
    /// prefix `rl`, the server's clock and a per-call bound of
    /// [`DEFAULT_CALL_TIMEOUT`].
    ///
    /// The connection's own settings apply: build its client with
    /// `ClusterClientBuilder::retries(0)` (the store does the retries that
    /// cannot count twice; redis-rs' would re-send a script after a timeout)
    /// and explicit response and connection timeouts (redis-rs' default is
    /// to wait forever).
    pub fn from_cluster_connection(connection: redis::cluster_async::ClusterConnection) -> Self {
        Self::from_backend(Backend::Redis(connection))
    }

    /// Uses another key prefix (see [`keys::check_prefix`]).
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, StoreError> {
        keys::check_prefix(prefix).map_err(|m| StoreError::message(m, false))?;
        self.prefix = Arc::from(prefix);
        Ok(self)
    }

    /// Takes "now" from `clock` instead of the server's `TIME`: for tests and
    /// replays only (the clock must be shared by every instance).
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Bounds every decision, redirects and retries included, by `timeout`
    /// (returning [`StoreError::Timeout`] after it).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The bound on one decision.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether the store uses an injected clock rather than the server's.
    pub fn has_injected_clock(&self) -> bool {
        self.clock.is_some()
    }

    /// The Redis key that holds `caller`'s state under `quota`:
    /// `<prefix>:{<tag>}:<policy>:<algorithm>` (see [`keys::key`]).
    pub fn key(&self, caller: &[u8], quota: &Quota) -> String {
        keys::key(&self.prefix, caller, quota)
    }

    /// What the store (and its clones) did so far: redirects, reloads,
    /// retries, errors.
    pub fn stats(&self) -> ClusterStats {
        self.counters.snapshot()
    }

    /// Loads the scripts (the four single-quota ones and the multi-quota
    /// one) into the script cache of every master
    /// (`SCRIPT LOAD`), so the first decisions need no `NOSCRIPT` round
    /// trip. Optional: a master without them (a replica promoted since, a
    /// restarted node) gets the source on its first `NOSCRIPT`.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        self.backend.load_scripts().await
    }

    /// "Now" to send: the injected clock's reading, or `None` for `TIME`.
    fn now(&self) -> Result<Option<Micros>, StoreError> {
        scripts::injected_now(self.clock.as_ref())
    }

    async fn run(&self, key: &[u8], quota: &Quota, cost: u64) -> Result<Decision, StoreError> {
        let call = scripts::Call::one(&self.prefix, key, quota, cost, self.now()?);
        let reply = self.call(call.script, &call.keys, &call.args).await?;
        decode::decision(&reply, quota.limit())
    }

    async fn run_multi(
        &self,
        key: &[u8],
        charges: &[Charge<'_>],
    ) -> Result<Vec<Decision>, StoreError> {
        let call = scripts::Call::all(&self.prefix, key, charges, self.now()?);
        let reply = self.call(call.script, &call.keys, &call.args).await?;
        decode::decisions(&reply, charges)
    }

    /// Runs `script` on `redis_keys` (all in one slot) with `args` on the
    /// slot's master: redirects, `NOSCRIPT` and the retries that cannot
    /// count twice handled; returns the integer reply.
    async fn call(
        &self,
        script: &Script,
        redis_keys: &[String],
        args: &[String],
    ) -> Result<Vec<i64>, StoreError> {
        let deadline = Instant::now() + self.timeout;
        let c = &*self.counters;
        let mut route = Route::Key;
        let mut source = false;
        let mut attempt = 0;
        // Attempts that wait first (every one after the first redirect),
        // and retries after "cannot serve now" errors: see `retry`.
        let mut paced = 0;
        let mut retries = 0;
        let mut redirected = false;
        // The redirect target that refused this call's connection.
        let mut refused: Option<Addr> = None;
        loop {
            attempt += 1;
            let failure = match self
                .backend
                .eval(script, redis_keys, args, &route, source)
                .await
            {
                Ok(reply) => {
                    bump(&c.decisions);
                    return Ok(reply);
                }
                Err(failure) => failure,
            };
            let sent_to = std::mem::replace(&mut route, Route::Key);
            let mut pace = true;
            match failure.next {
                Next::Fail => return Err(failure.error),
                Next::Moved(addr) if refused.as_ref() == Some(&addr) => {
                    // Back to a node that just refused: its master is dead
                    // and the slot map stale. Do not bounce: retry through
                    // the slot map, which the client refreshes on `MOVED`.
                    bump(&c.moved);
                    retries += 1;
                }
                Next::Moved(addr) => {
                    bump(&c.moved);
                    pace = redirected;
                    redirected = true;
                    route = Route::Moved(addr);
                }
                Next::Ask(addr) => {
                    bump(&c.ask);
                    pace = redirected;
                    redirected = true;
                    route = Route::Ask(addr);
                }
                // Same route: an ASK target needs ASKING again.
                Next::NoScript if !source => {
                    bump(&c.noscript);
                    source = true;
                    route = sent_to;
                    pace = false;
                }
                // EVAL with the source cannot answer NOSCRIPT: a server
                // that does is not one this store can use.
                Next::NoScript => return Err(failure.error),
                Next::Backoff => {
                    bump(&c.retries);
                    retries += 1;
                }
                Next::Unreachable => {
                    bump(&c.retries);
                    retries += 1;
                    if let Route::Moved(addr) | Route::Ask(addr) = sent_to {
                        refused = Some(addr);
                    }
                }
            }
            let wait = if pace {
                paced += 1;
                retry::backoff(paced)
            } else {
                Duration::ZERO
            };
            if attempt >= MAX_ATTEMPTS || retries > MAX_RETRIES || Instant::now() + wait >= deadline
            {
                tracing::debug!(attempt, retries, error = %failure.error, "cluster store gives up");
                return Err(StoreError::backend(
                    format!(
                        "redis cluster: no decision after {attempt} attempts ({retries} retries) within {:?}",
                        self.timeout
                    ),
                    true,
                    failure.error,
                ));
            }
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[async_trait]
impl Store for ClusterStore {
    async fn decide(&self, key: &[u8], quota: &Quota, cost: u64) -> Result<Decision, StoreError> {
        quota.check_cost(cost)?;
        let result = match tokio::time::timeout(self.timeout, self.run(key, quota, cost)).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        };
        if result.is_err() {
            bump(&self.counters.errors);
        }
        result
    }

    /// One run of [`scripts::MULTI`] over every charge's key (one slot:
    /// the caller's hash tag), with the redirects and retries of a single
    /// decision: all or nothing, whatever the number of quotas.
    async fn decide_all(
        &self,
        key: &[u8],
        charges: &[Charge<'_>],
    ) -> Result<Vec<Decision>, StoreError> {
        for c in charges {
            c.quota.check_cost(c.cost)?;
        }
        if charges.is_empty() {
            return Ok(Vec::new());
        }
        let result = match tokio::time::timeout(self.timeout, self.run_multi(key, charges)).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        };
        if result.is_err() {
            bump(&self.counters.errors);
        }
        result
    }

    fn atomic_all(&self) -> bool {
        true
    }

    fn clock(&self) -> Option<Arc<dyn Clock>> {
        self.clock.clone()
    }
}
