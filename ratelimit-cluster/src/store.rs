//! [`ClusterStore`]: the [`Store`] over a Redis Cluster.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ratelimit_core::store::{Answer, Capabilities, Request};
use ratelimit_core::{Store, StoreError};
use ratelimit_redis::engine::{Engine, Straddles, Transport};
use ratelimit_redis::keys;
use ratelimit_redis::scripts::Call;
use std::time::Instant;

use crate::connection::Backend;
#[cfg(feature = "fred")]
use crate::fred::FredNodes;
use crate::retry::{self, Addr, MAX_ATTEMPTS, MAX_RETRIES, Next, Route};
use crate::slots::SlotMap;
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
/// whatever bytes the caller holds; a request with several charges is one
/// run of [`ratelimit_redis::scripts::BATCH`] on their keys there (the
/// same keys single-quota requests use), all or nothing, whatever the
/// number of quotas. `MOVED`, `ASK`, `NOSCRIPT`, `TRYAGAIN`
/// and the other errors that prove the script did not run are handled
/// inside the call; an error after which the script may have run is
/// returned rather than retried, so no request is counted twice by the
/// store (see [`crate::retry`]). Every call is bounded by
/// [`ClusterStore::timeout`] and by the request's deadline.
///
/// The calls themselves (keys, arguments, deadlines in server time, the
/// bound on calls in flight, decoding) are the single-node store's
/// [`ratelimit_redis::engine::Engine`]; this crate only routes them. Each
/// call carries its deadline in the clock of the node serving its slot (one
/// offset per slot, learnt from the replies: [`ratelimit_redis::deadline`]),
/// so a call the limiter has already answered by its failure policy is
/// never counted later, whichever node runs it.
#[derive(Clone)]
pub struct ClusterStore {
    pub(crate) router: Arc<Router>,
    pub(crate) engine: Engine,
}

/// Sends one call to the master of its slot, following redirections.
#[derive(Clone)]
pub(crate) struct Router {
    pub(crate) backend: Backend,
    pub(crate) counters: Arc<Counters>,
    /// Which master serves each slot: the calls' failure domains.
    pub(crate) slots: Arc<SlotMap>,
}

impl Router {
    /// Reads the slot map from the cluster now.
    pub(crate) async fn refresh_slots(&self) {
        if let Some(ranges) = self.backend.slot_ranges(&self.slots).await {
            self.slots.set_ranges(&ranges);
        }
    }
}

impl fmt::Debug for ClusterStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterStore")
            .field("client", &self.router.backend.name())
            .field("engine", &self.engine)
            .finish()
    }
}

impl ClusterStore {
    pub(crate) fn from_backend(backend: Backend) -> Self {
        Self::with_engine(backend, Engine::new(DEFAULT_CALL_TIMEOUT, keys::SLOTS))
    }

    pub(crate) fn with_engine(backend: Backend, engine: Engine) -> Self {
        Self {
            router: Arc::new(Router {
                backend,
                counters: Arc::default(),
                slots: Arc::default(),
            }),
            engine,
        }
    }

    /// A store over a redis-rs cluster connection you already hold (build
    /// its client with `retries(0)`: see [`crate::retry`]), with prefix `rl`,
    /// the server's clock and a per-call bound of [`DEFAULT_CALL_TIMEOUT`].
    ///
    /// The calls go through that connection and its routing. Prefer
    /// [`ClusterStore::builder`], whose store holds one connection per node:
    /// redis-rs' cluster connection drives no request for any node while it
    /// recovers from one node's failure, so with it a dead master also
    /// stalls the callers of the healthy ones (see the crate docs, "One
    /// breaker per master").
    pub fn from_cluster_connection(connection: redis::cluster_async::ClusterConnection) -> Self {
        Self::from_backend(Backend::Redis(connection))
    }

    /// A store over a clustered fred client you already hold (initialised
    /// with `init()`), with prefix `rl`, the server's clock and a bound of
    /// [`DEFAULT_CALL_TIMEOUT`] for requests without a deadline.
    ///
    /// The store reads the slot map through your client and sends each
    /// call itself, to the master of its slot, over a centralized fred
    /// client per node made with your client's settings (see the module
    /// docs: one dead master fails only its own callers). Any
    /// `ConnectionConfig::max_command_attempts` is fine: every script goes
    /// with fred's per-command `max_attempts = 1`, so a script whose reply
    /// was lost is never sent again. Its `default_command_timeout` does
    /// not bound the scripts: each waits until its caller's deadline.
    #[cfg(feature = "fred")]
    pub fn from_fred(client: ::fred::clients::Client) -> Self {
        // The slot map is read in the background on the first call (a call
        // before it is known goes through your client's own routing).
        Self::from_backend(Backend::Fred(Arc::new(FredNodes::new(client))))
    }

    ratelimit_redis::engine_settings!();

    /// What the store has done so far: decisions, redirects, retries.
    pub fn stats(&self) -> ClusterStats {
        self.router.counters.snapshot()
    }

    /// Loads every script on every master (`SCRIPT LOAD`), so the first
    /// decisions need no `NOSCRIPT` round. The builder does it by default;
    /// a store built from a client calls it when it likes (a `NOSCRIPT` is
    /// handled either way).
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        self.router.backend.load_scripts(&self.router.slots).await
    }
}

#[async_trait]
impl Transport for Router {
    /// The master of the call's slot, as the store's slot map says;
    /// refreshes the map in the background when due.
    fn domain(&self, slot: u16) -> Arc<str> {
        if self.slots.claim_refresh() {
            let router = self.clone();
            tokio::spawn(async move {
                router.refresh_slots().await;
                router.slots.refresh_done();
            });
        }
        self.slots.owner(slot)
    }

    /// A cluster call holds one hash slot.
    fn any_slot(&self) -> bool {
        false
    }

    async fn eval(
        self: Arc<Self>,
        call: Arc<Call>,
        deadline: Instant,
    ) -> Result<Vec<i64>, StoreError> {
        let c = &*self.counters;
        let mut route = Route::Key;
        // A quota's own script goes with its source until a call with it
        // has succeeded (see `Script::send_source_first`).
        let mut source = call.script.send_source_first();
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
            let failure = match self.backend.eval(&call, &route, source, &self.slots).await {
                Ok(reply) => {
                    bump(&c.decisions);
                    call.script.mark_loaded();
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
                    // the slot map, refreshed meanwhile.
                    bump(&c.moved);
                    self.slots.suspect();
                    retries += 1;
                }
                Next::Moved(addr) => {
                    bump(&c.moved);
                    self.slots.moved(call.slot(), &addr.name());
                    self.slots.suspect();
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
                // A batch whose requests straddle a slot migration: the
                // engine sends it again request by request (it did not run).
                Next::TryAgain if call.requests > 1 => {
                    bump(&c.retries);
                    return Err(Straddles::error(&failure.error));
                }
                Next::Backoff | Next::TryAgain => {
                    bump(&c.retries);
                    retries += 1;
                }
                Next::Unreachable => {
                    bump(&c.retries);
                    self.slots.suspect();
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
                return Err(gave_up(attempt, retries, failure.error));
            }
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// The error of a call that gave up after `attempt` attempts: the last
/// error's message after what was tried, and the last error's source, so
/// that the node is judged by what it last did
/// ([`ratelimit_redis::error::reached_server`]): a refusal such as
/// `CLUSTERDOWN` is a reply from a live node, an unreachable node is
/// evidence against it.
fn gave_up(attempt: u32, retries: u32, last: StoreError) -> StoreError {
    let what = format!(
        "redis cluster: no decision after {attempt} attempts ({retries} retries) before the deadline"
    );
    match last {
        StoreError::Backend {
            message, source, ..
        } => StoreError::Backend {
            message: format!("{what}: {message}"),
            transient: true,
            source,
        },
        other => StoreError::backend(what, true, other),
    }
}

/// One script call per request on the master of the caller's slot,
/// through a future; atomic across a request's charges; the servers'
/// clocks unless one was injected.
impl Store for ClusterStore {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        Answer::pending(async move {
            let router: Arc<dyn Transport> = self.router.clone();
            self.counted(self.engine.decide(&router, request).await)
        })
    }

    /// Atomic; the servers' clocks unless one was injected; failure
    /// domains judged by the store itself (one breaker per master).
    fn capabilities(&self) -> Capabilities {
        self.engine.capabilities()
    }
}

impl ClusterStore {
    fn counted<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if result.is_err() {
            bump(&self.router.counters.errors);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::gave_up;
    use ratelimit_redis::error;

    #[test]
    fn a_call_that_gave_up_is_judged_by_its_last_error() {
        // Refused by a live node: not held against it.
        let down = error::from_redis(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown),
            "The cluster is down",
        )));
        assert!(error::reached_server(&down), "{down}");
        let e = gave_up(3, 3, down);
        assert!(error::reached_server(&e), "{e}");
        assert!(e.is_transient());
        assert!(
            e.to_string()
                .starts_with("redis cluster: no decision after 3 attempts")
        );
        // Refused connections: evidence against the node.
        let refused = error::from_redis(redis::RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        let e = gave_up(3, 3, refused);
        assert!(!error::reached_server(&e), "{e}");
        assert!(!error::is_timeout(&e), "{e}");
    }
}
