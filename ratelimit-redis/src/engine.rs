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
use ratelimit_core::health::{Permit, late_after};
use ratelimit_core::store::{Decisions, Request};
use ratelimit_core::{CircuitBreaker, Clock, Micros, StoreError};

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

    /// The failure domain `call` goes to: the node (`host:port`) serving
    /// its slot.
    fn domain(&self, call: &Call) -> Arc<str>;
}

/// The state shared by an engine's clones.
#[derive(Debug)]
struct Shared {
    server_clock: ServerClock,
    domains: Arc<Domains>,
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
    prefix: Arc<str>,
    clock: Option<Arc<dyn Clock>>,
    timeout: Duration,
    max_in_flight: usize,
    shared: Arc<Shared>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("prefix", &self.prefix)
            .field("clock", &self.clock)
            .field("timeout", &self.timeout)
            .field("max_in_flight", &self.max_in_flight)
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
    fn now(&self) -> Result<Option<Micros>, StoreError> {
        scripts::injected_now(self.clock.as_ref())
    }

    /// Answers one request: one script call whatever the number of
    /// charges (the single-quota script for one, the several-quota script
    /// for more), bounded by the request's deadline and the engine's
    /// timeout.
    pub async fn decide(
        &self,
        transport: &Arc<dyn Transport>,
        request: Request<'_>,
    ) -> Result<Decisions, StoreError> {
        request.check()?;
        let deadline = request.deadline.instant();
        if request.deadline.has_passed() {
            return Err(StoreError::Expired);
        }
        match request.charges {
            [c] => {
                let call = Call::one(&self.prefix, request.key, c.quota, c.cost, self.now()?);
                let decisions = self.send(transport, call, deadline).await?;
                decode::decision(&decisions, c.quota.limit()).map(Decisions::one)
            }
            charges => {
                let call = Call::all(&self.prefix, request.key, charges, self.now()?);
                let decisions = self.send(transport, call, deadline).await?;
                decode::decisions(&decisions, charges).map(Decisions::from)
            }
        }
    }

    fn expired(&self) -> StoreError {
        tracing::debug!("rate-limit script expired at the server: nothing counted");
        StoreError::Expired
    }

    /// Sends `call` with its deadline in server time, through its node's
    /// breaker and within the deadline; judges the outcome for the node
    /// (see the type's docs); learns the server's clock from the reply and
    /// returns its decision integers (4 per quota), or
    /// [`StoreError::Expired`] when the script found the deadline passed.
    async fn send(
        &self,
        transport: &Arc<dyn Transport>,
        mut call: Call,
        deadline: Option<Instant>,
    ) -> Result<Vec<i64>, StoreError> {
        let start = Instant::now();
        let own = start + self.timeout;
        let deadline = deadline.map_or(own, |d| d.min(own));
        let shared = &*self.shared;
        let index = if shared.server_clock.clocks() == 1 {
            0
        } else {
            usize::from(call.slot())
        };
        let Some(server_deadline) = shared.server_clock.server_deadline(index, deadline) else {
            // Past already: nothing was sent.
            return Err(StoreError::Expired);
        };
        call.set_deadline(server_deadline);
        let domain = shared.domains.get(&transport.domain(&call));
        let sent_at = shared.domains.micros(start);
        if let Some(stalls) = domain.confirm_stall(sent_at) {
            opened(
                &domain,
                &format!("{stalls} calls timed out and the node has not replied since"),
            );
        }
        let permit = domain.health().permit(sent_at);
        if let Permit::Open = permit {
            return Err(unavailable(&domain, sent_at));
        }
        if domain.in_flight() >= u64::try_from(self.max_in_flight).unwrap_or(u64::MAX) {
            return Err(StoreError::message(
                format!(
                    "{} rate-limit calls already wait on {}: refused at once (the memory \
                     safeguard; see ratelimit_redis::engine::DEFAULT_MAX_IN_FLIGHT)",
                    domain.in_flight(),
                    domain.name()
                ),
                true,
            ));
        }
        let in_flight = domain.enter(sent_at);
        let call = Arc::new(call);
        let mut eval = Arc::clone(transport).eval(Arc::clone(&call), deadline);
        let outcome = tokio::time::timeout_at(deadline.into(), &mut eval).await;
        let received = Instant::now();
        if outcome.is_err() {
            // The caller gives up; the request may still be answered. Follow
            // it to its reply in the background: that reply is the node's
            // progress (a busy node's replies keep flowing, a stalled one's
            // do not). The call stays in flight until then.
            follow(
                eval,
                Arc::clone(&domain),
                shared.domains.clone_base(),
                in_flight,
            );
        } else {
            drop(in_flight);
        }
        let now = shared.domains.micros(received);
        let probe = permit.is_probe();
        let raw = match outcome {
            Ok(Ok(raw)) => raw,
            Ok(Err(e)) if !error::is_timeout(&e) => {
                if error::reached_server(&e) {
                    // The node answered (an error reply): alive.
                    domain.replied(now);
                    domain.health().success(now);
                    return Err(e);
                }
                // Could not reach the node: evidence against it.
                if domain.health().failure(now, probe) {
                    opened(&domain, &e.to_string());
                }
                return Err(StoreError::backend(
                    format!("cannot reach {}: {e}", domain.name()),
                    true,
                    e,
                ));
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
                    opened(&domain, "the probe got no reply");
                } else {
                    // Suspected: judged once the stall time has passed
                    // without any reply from the node (see `crate::domains`).
                    domain.suspect(now);
                }
                return Err(StoreError::Timeout(waited));
            }
        };
        domain.replied(now);
        if domain.health().success(now) {
            tracing::info!(
                node = domain.name(),
                "rate-limit node answers again: its breaker closed"
            );
        }
        drop(permit);
        let (decided, server_now) = match decode::split(&raw)? {
            Reply::Decided {
                decisions,
                server_now,
            } => (Some(decisions.len()), server_now),
            Reply::Expired { server_now } => (None, Some(server_now)),
        };
        if let Some(t) = server_now {
            shared.server_clock.observe(index, t, received);
        }
        match decided {
            Some(n) => {
                // Drop the server's TIME after the decisions, if any.
                let mut decisions = raw;
                decisions.truncate(n);
                Ok(decisions)
            }
            None => Err(self.expired()),
        }
    }
}

/// The longest a call the caller gave up on is followed to its reply.
const FOLLOW_AT_MOST: Duration = Duration::from_secs(30);

/// Follows a call its caller gave up on to its reply (for at most
/// [`FOLLOW_AT_MOST`]), recording the reply as the node's progress.
fn follow(
    eval: std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<i64>, StoreError>> + Send>>,
    domain: Arc<Domain>,
    base: Instant,
    in_flight: crate::domains::InFlight,
) {
    tokio::spawn(async move {
        if let Ok(reply) = tokio::time::timeout(FOLLOW_AT_MOST, eval).await {
            if reply.as_ref().map_or_else(error::reached_server, |_| true) {
                let now = u64::try_from(base.elapsed().as_micros()).unwrap_or(u64::MAX);
                domain.replied(now.max(1));
            }
        }
        drop(in_flight);
    });
}

/// The error of a call to a node whose breaker is open.
#[cold]
fn unavailable(domain: &Domain, now: Micros) -> StoreError {
    let (calls, failures) = domain.health().window_counts(now);
    StoreError::Unavailable {
        domain: domain.name().to_owned(),
        reason: format!(
            "breaker open for node {} ({failures} of the last {calls} calls failed); probing \
             every {:?}",
            domain.name(),
            domain.health().config().probe_every()
        ),
    }
}

/// A node's breaker opened: said once, with why.
#[cold]
fn opened(domain: &Domain, why: &str) {
    tracing::warn!(
        node = domain.name(),
        why,
        "rate-limit node failing: its breaker opened; its callers are decided by the limiter's \
         degraded mode until a probe is answered"
    );
}
