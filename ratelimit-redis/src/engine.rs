//! The script-calling core shared by the single-node store and the cluster
//! store: everything but how a call reaches Redis.
//!
//! An [`Engine`] holds the key prefix, the optional injected clock, the
//! per-call bound, the server-clock offsets ([`crate::deadline`]) and the
//! failure domains ([`crate::domains`]: one breaker per node). For each
//! decision it checks the request, builds the [`Call`] (keys, arguments,
//! the deadline in server time), asks the node's breaker, hands the call to
//! a [`Transport`], judges the outcome, and decodes the reply. A
//! [`Transport`] only sends: the single-node store over one connection, the
//! cluster store routing by slot and following redirections.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ratelimit_core::health::late_after;
use ratelimit_core::store::{Capabilities, Decisions};
use ratelimit_core::{CircuitBreaker, Clock, Micros, StoreError};
use tokio::time::error::Elapsed;

use crate::deadline::ServerClock;
use crate::decode::{self, Reply};
use crate::domains::{Domain, Domains, STALL_AFTER};
use crate::error;
use crate::keys;
use crate::scripts::{self, Call};

/// The default bound on script calls waiting on one node at once: 100,000.
/// A memory safeguard far above real concurrency (each waiting call holds
/// its request and a slot in the client's queue), not a stall detector:
/// a node is judged by its replies ([`crate::domains`]).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 100_000;

/// The default most requests one batch call carries: 512.
///
/// Calls this large go only under load (a call carries what waited while
/// the calls before it were in flight). On a 2-vCPU host a full call takes
/// the server about 2 ms (1.9-2.2 ms a call under 4,096 callers, against
/// 0.66-0.72 ms with calls of at most 128), and less of its time per
/// decision (script time per admission written 4.2-6.5 µs, against
/// 7.6-8.7 µs with 128: fewer, longer calls). With 4,096 concurrent
/// callers and a 20 ms timeout, 512 took the share of decisions made by
/// the store from 62 % to 87 % (redis-rs) and from 60 % to 74 % (fred),
/// medians of six alternated pairs, higher in 11 of the 12 (BENCHMARKS.md,
/// "Larger batch calls"). Where other work shares the Redis and must not
/// wait 2 ms behind a call, set [`crate::RedisStore::with_max_batch`]
/// lower (128: under 1 ms).
pub const DEFAULT_MAX_BATCH: usize = 512;

/// The default most script calls in flight on one node at once: 6. A call
/// that finds its node idle goes alone; requests arriving meanwhile wait
/// for the next call, and only a batch worth it goes beside the calls in
/// flight rather than after them (pipelined on the same connection; see
/// the crate docs, "Group commit"): a second call for
/// [`PIPELINE_MIN_BATCH`] or half the latest call, a third and further
/// ones only for a full batch ([`DEFAULT_MAX_BATCH`]). More than one or two because the server should never
/// wait for the client: under load the task that decodes a reply and
/// builds the next call waits its turn among thousands of callers' tasks,
/// and with two calls in flight the server sat idle meanwhile. With 4,096
/// concurrent callers on one Redis (2 vCPUs, client and server on the
/// same machine) 6 calls took the store from 290,000-340,000 to
/// 354,000-402,000 decisions per second and its share of decisions made
/// within a 20 ms timeout from 96.6-99.7 % to 99.8-100 %; 4 and 8 did
/// about as well (BENCHMARKS.md, "One healthy Redis, thousands of
/// callers"). Calls go in only under load: at most 6 batches of
/// [`DEFAULT_MAX_BATCH`] wait on the server.
pub const DEFAULT_PIPELINE: usize = 6;

/// The fewest waiting requests that go as a second call beside the one in
/// flight (defined with the node's queue, which applies it).
pub use crate::domains::PIPELINE_MIN_BATCH;

/// How a store sends one script call and gets its raw integer reply.
///
/// Owned (`Arc`) so that a call whose caller gave up can be followed to its
/// reply in the background: that reply is the node's progress (see
/// [`crate::domains`]).
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// Sends `call` (`EVALSHA`, and the source on `NOSCRIPT`), never
    /// re-sending a script that may have run; retries of calls that cannot
    /// have run (a redirection, a refused connection) stop at `deadline`.
    async fn eval(
        self: Arc<Self>,
        call: Arc<Call>,
        deadline: Instant,
    ) -> Result<Vec<i64>, StoreError>;

    /// The failure domain a call on `slot` goes to: the node
    /// (`host:port`) serving it.
    fn domain(&self, slot: u16) -> Arc<str>;

    /// Whether one call may carry keys of several hash slots (a single
    /// node: yes; a cluster: no, a batch holds one slot).
    fn any_slot(&self) -> bool {
        true
    }
}

/// Why a [`Transport`] gave a call back unrun: a node refused it before
/// running it (`TRYAGAIN`) because the keys of the several requests it
/// carries straddle a slot migration (some already moved, some not). A
/// batch that meets it counted nothing, and is sent again request by
/// request, each as it would have gone alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Straddles;

impl fmt::Display for Straddles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the batch's keys straddle a slot migration (TRYAGAIN; it did not run)")
    }
}

impl std::error::Error for Straddles {}

impl Straddles {
    /// The error a [`Transport`] returns for a call of several requests
    /// ([`Call::requests`]) refused with `TRYAGAIN`: `cause` is the node's
    /// reply.
    pub fn error(cause: &StoreError) -> StoreError {
        StoreError::backend(format!("{Straddles}: {cause}"), true, Straddles)
    }

    /// Whether `error` is one [`Straddles::error`] made.
    pub fn is(error: &StoreError) -> bool {
        matches!(error, StoreError::Backend { source: Some(s), .. } if s.downcast_ref::<Straddles>().is_some())
    }
}

/// The state shared by an engine's clones.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) server_clock: ServerClock,
    pub(crate) domains: Arc<Domains>,
}

/// The script-calling core of a store (see the module docs). Cheap to clone:
/// clones share the server-clock offsets and the failure domains.
///
/// # A node is judged by its replies
///
/// Each node is a failure domain with its own breaker ([`crate::domains`]):
/// a call that times out while the node kept replying to others waited
/// behind a busy node and counts nothing against it; one that times out
/// with no reply at all from the node since it was sent is a stall; one
/// whose timer fired late was this process's lateness. Stalls and
/// unreachable nodes open the node's breaker once they pass its failure
/// rate; its calls then fail at once with [`StoreError::Unavailable`]
/// naming the node, until a probe is answered.
#[derive(Clone)]
pub struct Engine {
    pub(crate) prefix: Arc<str>,
    clock: Option<Arc<dyn Clock>>,
    pub(crate) timeout: Duration,
    pub(crate) max_in_flight: usize,
    pub(crate) max_batch: usize,
    pipeline: usize,
    pub(crate) batch_only: bool,
    /// The store's own I/O thread, when it has one ([`crate::io`]): the
    /// node's batch calls are sent and read there.
    io: Option<Arc<crate::io::IoThread>>,
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("prefix", &self.prefix)
            .field("clock", &self.clock)
            .field("timeout", &self.timeout)
            .field("max_in_flight", &self.max_in_flight)
            .field("max_batch", &self.max_batch)
            .field("pipeline", &self.pipeline)
            .field("domains", &self.shared.domains.states())
            .finish()
    }
}

impl Engine {
    /// An engine with prefix `rl`, the server's clock, the per-call bound
    /// `timeout`, [`DEFAULT_MAX_IN_FLIGHT`], and `server_clocks` offsets to
    /// learn (1 for a single node, [`keys::SLOTS`] for a cluster).
    pub fn new(timeout: Duration, server_clocks: usize) -> Self {
        Self {
            prefix: Arc::from(keys::DEFAULT_PREFIX),
            clock: None,
            timeout,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_batch: DEFAULT_MAX_BATCH,
            pipeline: DEFAULT_PIPELINE,
            batch_only: false,
            io: None,
            shared: Arc::new(Shared {
                server_clock: ServerClock::new(server_clocks),
                domains: Arc::new(Domains::new(CircuitBreaker::DEFAULT)),
            }),
        }
    }

    /// Sets the key prefix (see [`keys::check_prefix`]).
    pub fn set_prefix(&mut self, prefix: &str) -> Result<(), StoreError> {
        keys::check_prefix(prefix).map_err(|m| StoreError::message(m, false))?;
        self.prefix = Arc::from(prefix);
        Ok(())
    }

    /// Takes "now" from `clock` instead of the server's `TIME` (tests and
    /// replays).
    pub fn set_clock(&mut self, clock: Option<Arc<dyn Clock>>) {
        self.clock = clock;
    }

    /// Bounds every decision by `timeout`.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Sends and reads the node's batch calls on `io`, the store's own I/O
    /// thread ([`crate::io`]), rather than on the application's runtime.
    pub fn set_io_thread(&mut self, io: Option<Arc<crate::io::IoThread>>) {
        self.io = io;
    }

    /// Runs a background task of the engine's: on its I/O thread when it
    /// has one, else on the current runtime.
    pub(crate) fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        match &self.io {
            Some(io) => drop(io.spawn(task)),
            None => drop(tokio::spawn(task)),
        }
    }

    /// Bounds the script calls waiting on one node at once (at least 1): a
    /// memory safeguard (see [`DEFAULT_MAX_IN_FLIGHT`]).
    pub fn set_max_in_flight(&mut self, max: usize) {
        self.max_in_flight = max.max(1);
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The injected clock, if any.
    pub fn clock(&self) -> Option<&Arc<dyn Clock>> {
        self.clock.as_ref()
    }

    /// The bound on one decision.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The bound on script calls waiting on one node.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// What a store over this engine offers: atomic decisions, failure
    /// domains judged by the engine itself (one breaker per node), every
    /// call bounded by the request's deadline (the limiter arms no timer of
    /// its own), and Redis' clocks unless one was injected.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .atomic(true)
            .failure_domains(true)
            .bounded(true)
            .shared_clock(self.clock.clone())
    }

    /// Sets the breaker every node gets (default
    /// [`CircuitBreaker::DEFAULT`]). Takes effect for nodes not seen yet:
    /// call it before the first decision.
    pub fn set_breaker(&mut self, breaker: CircuitBreaker) {
        let clocks = self.shared.server_clock.clocks();
        let old = std::mem::replace(
            &mut self.shared,
            Arc::new(Shared {
                server_clock: ServerClock::new(clocks),
                domains: Arc::new(Domains::new(breaker)),
            }),
        );
        // Keep the server-clock offsets learnt so far.
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.server_clock = match Arc::try_unwrap(old) {
                Ok(old) => old.server_clock,
                Err(old) => old.server_clock.copy(),
            };
        }
    }

    /// Script calls waiting on every node now.
    pub fn in_flight(&self) -> u64 {
        self.shared
            .domains
            .states()
            .iter()
            .map(|(name, _)| self.shared.domains.get(name).in_flight())
            .sum()
    }

    /// The failure domains (one per node seen so far) and their breakers.
    pub fn domains(&self) -> &Domains {
        &self.shared.domains
    }

    /// The server-clock offsets learnt so far.
    pub fn server_clock(&self) -> &ServerClock {
        &self.shared.server_clock
    }

    /// "Now" to send: the injected clock's reading, or `None` for `TIME`.
    pub(crate) fn now(&self) -> Result<Option<Micros>, StoreError> {
        scripts::injected_now(self.clock.as_ref())
    }

    /// Sets the most requests one batch call carries (default
    /// [`DEFAULT_MAX_BATCH`], at least 1; 1 turns batching off).
    pub fn set_max_batch(&mut self, max: usize) {
        self.max_batch = max.max(1);
    }

    /// The most requests one batch call carries.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// Sets the most script calls in flight on one node at once (default
    /// [`DEFAULT_PIPELINE`], at least 1; 1: a batch always waits for the
    /// call in flight). Every call beyond the first carries a full batch.
    pub fn set_pipeline(&mut self, calls: usize) {
        self.pipeline = calls.max(1);
    }

    /// The most script calls in flight on one node at once.
    pub fn pipeline(&self) -> usize {
        self.pipeline
    }

    /// Sends every request through the batch script, alone ones too (a
    /// batch of one) — to check the batch script against the conformance
    /// suite; slower for one caller than the single-quota scripts.
    pub fn set_batch_only(&mut self, on: bool) {
        self.batch_only = on;
    }

    fn expired(&self) -> StoreError {
        tracing::debug!("rate-limit script expired at the server: nothing counted");
        StoreError::Expired
    }

    /// The decisions of one request sent alone ([`Call::alone`]), or
    /// [`StoreError::Expired`]; learns the server's clock from the reply.
    pub(crate) fn decode_alone(
        &self,
        req: &scripts::Request,
        raw: Vec<i64>,
        received: Instant,
    ) -> Result<Decisions, StoreError> {
        let index = self.clock_index(req.slot());
        let clocks = &self.shared.server_clock;
        if req.is_single() {
            if let [packed] = raw[..] {
                // A token bucket's one integer (see `decode::token_bucket`).
                return decode::for_limits(&req.unpack(packed)?, &req.limits);
            }
            let (decided, server_now) = match decode::split(&raw)? {
                Reply::Decided {
                    decisions,
                    server_now,
                } => (Some(decisions.len()), server_now),
                Reply::Expired { server_now } => (None, Some(server_now)),
            };
            if let Some(t) = server_now {
                clocks.observe(index, t, received);
            }
            match decided {
                // Without the server's TIME after the decisions, if any.
                Some(n) => decode::for_limits(&raw[..n], &req.limits),
                None => Err(self.expired()),
            }
        } else {
            let (outcomes, server_now) = decode::batch(&raw, &[req.quotas()])?;
            clocks.observe(index, server_now, received);
            match outcomes.first() {
                Some(decode::Outcome::Decided(d)) => req.decisions(d),
                _ => Err(self.expired()),
            }
        }
    }

    /// The server clock a call on `slot` is judged by.
    pub(crate) fn clock_index(&self, slot: u16) -> usize {
        if self.shared.server_clock.clocks() == 1 {
            0
        } else {
            usize::from(slot)
        }
    }

    /// The shared server clocks.
    pub(crate) fn clocks(&self) -> &ServerClock {
        &self.shared.server_clock
    }

    /// The failure domains' time base.
    pub(crate) fn domains_base(&self) -> Instant {
        self.shared.domains.clone_base()
    }

    /// Judges a call's outcome for its node (see the type's docs): the reply
    /// as progress, an unreachable node or a stall as evidence, lateness
    /// and a busy node as nothing. Returns the raw reply or the error.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn judge(
        &self,
        domain: &Arc<Domain>,
        outcome: Outcome,
        start: Instant,
        deadline: Instant,
        received: Instant,
        probe: bool,
    ) -> Result<Vec<i64>, StoreError> {
        let now = self.shared.domains.micros(received);
        match outcome {
            Ok(Ok(raw)) => {
                domain.replied(now);
                if domain.health().success(now) {
                    tracing::info!(
                        node = domain.name(),
                        "rate-limit node answers again: its breaker closed"
                    );
                }
                Ok(raw)
            }
            Ok(Err(e)) if !error::is_timeout(&e) => {
                if error::reached_server(&e) {
                    // The node answered (an error reply): alive.
                    domain.replied(now);
                    domain.health().success(now);
                    return Err(e);
                }
                // Could not reach the node: evidence against it.
                if domain.health().failure(now, probe) {
                    opened(domain, &e.to_string());
                }
                Err(StoreError::backend(
                    format!("cannot reach {}: {e}", domain.name()),
                    true,
                    e,
                ))
            }
            // A timeout, ours or the client's.
            _ => {
                let waited = received.saturating_duration_since(start);
                let due = deadline.min(received);
                let late = received.saturating_duration_since(due)
                    > late_after(deadline.saturating_duration_since(start));
                let stall_after =
                    u64::try_from(waited.max(STALL_AFTER).as_micros()).unwrap_or(u64::MAX);
                domain.timed_out(now);
                if late {
                    tracing::debug!(
                        node = domain.name(),
                        "rate-limit call timed out late: this process was starved; not held against the node"
                    );
                } else if !domain.stalled(now, stall_after) {
                    tracing::debug!(
                        node = domain.name(),
                        "rate-limit call timed out behind a busy node (replies still flowing): slow, not failed"
                    );
                } else if probe && domain.health().failure(now, true) {
                    // A probe that got no reply: stay open.
                    opened(domain, "the probe got no reply");
                } else {
                    // Suspected: judged once the stall time has passed
                    // without any reply from the node (see `crate::domains`).
                    domain.suspect(now);
                }
                Err(StoreError::Timeout(waited))
            }
        }
    }
}

/// The longest a call the caller gave up on is followed to its reply.
const FOLLOW_AT_MOST: Duration = Duration::from_secs(30);

/// The future of one script call.
pub(crate) type Eval = EvalOf<'static>;

/// How a call's wait ended: its reply (or error), or its timer.
pub(crate) type Outcome = Result<Result<Vec<i64>, StoreError>, Elapsed>;

/// The future [`Transport::eval`] returns (as `async_trait` writes it, so
/// that an implementation may box its future itself).
pub type EvalOf<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<i64>, StoreError>> + Send + 'a>>;

/// Follows a call its caller gave up on to its reply (for at most
/// [`FOLLOW_AT_MOST`]), recording the reply as the node's progress.
pub(crate) fn follow(
    eval: Eval,
    domain: Arc<Domain>,
    base: Instant,
    in_flight: Vec<crate::domains::InFlight>,
) {
    tokio::spawn(async move {
        if let Ok(reply) = tokio::time::timeout(FOLLOW_AT_MOST, eval).await
            && reply.as_ref().map_or_else(error::reached_server, |_| true)
        {
            let now = u64::try_from(base.elapsed().as_micros()).unwrap_or(u64::MAX);
            domain.replied(now.max(1));
        }
        drop(in_flight);
    });
}

/// The error of a call to a node whose breaker is open.
#[cold]
pub(crate) fn unavailable(domain: &Domain, now: Micros) -> StoreError {
    let (calls, failures) = domain.health().window_counts(now);
    StoreError::Unavailable {
        domain: domain.name().to_owned(),
        reason: format!(
            "breaker open for node {} ({failures} of the last {calls} calls failed, or no reply \
             at all for {:?}); probing every {:?}",
            domain.name(),
            2 * STALL_AFTER,
            domain.health().config().probe_every()
        ),
    }
}

/// A node's breaker opened: said once, with why.
#[cold]
pub(crate) fn opened(domain: &Domain, why: &str) {
    tracing::warn!(
        node = domain.name(),
        why,
        "rate-limit node failing: its breaker opened; its callers are decided by the limiter's \
         degraded mode until a probe is answered"
    );
}
