//! The script-calling core shared by the single-node store and the cluster
//! store: everything but how a call reaches Redis.
//!
//! An [`Engine`] holds the key prefix, the optional injected clock, the
//! per-call bound, the server-clock offsets ([`crate::deadline`]) and the
//! bound on calls in flight. For each decision it checks the cost, builds
//! the [`Call`] (keys, arguments, the deadline in server time), hands it to
//! a [`Transport`], and decodes the reply. A [`Transport`] only sends: the
//! single-node store over one connection, the cluster store routing by
//! slot and following redirections.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ratelimit_core::store::{Decisions, Request};
use ratelimit_core::{Clock, Micros, StoreError};

use crate::deadline::ServerClock;
use crate::decode::{self, Reply};
use crate::keys;
use crate::scripts::{self, Call};

/// The default bound on script calls sent and not yet answered, per store
/// (shared by its clones): beyond it a call fails at once instead of
/// queueing behind a stalled connection (see [`Engine`]).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// Over the bound on calls in flight, one call per this interval still goes
/// through, as a probe: its reply, once the connection serves again, clears
/// the count.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// How a store sends one script call and gets its raw integer reply.
#[async_trait]
pub trait Transport: Send + Sync {
    /// Sends `call` (`EVALSHA`, and the source on `NOSCRIPT`), never
    /// re-sending a script that may have run; retries of calls that cannot
    /// have run (a redirection, a refused connection) stop at `deadline`.
    async fn eval(&self, call: &Call, deadline: Instant) -> Result<Vec<i64>, StoreError>;
}

/// The state shared by an engine's clones.
#[derive(Debug)]
struct Shared {
    server_clock: ServerClock,
    /// Tickets: calls sent so far, numbered from 1.
    sent: AtomicU64,
    /// The highest ticket answered by the server.
    answered: AtomicU64,
    /// When the last call was let through over the bound, in µs since the
    /// server clock's base.
    last_probe: AtomicU64,
}

/// The script-calling core of a store (see the module docs). Cheap to clone:
/// clones share the server-clock offsets and the count of calls in flight.
///
/// # Bounded queueing
///
/// A request written to a stalled connection (a paused server, a congested
/// link) stays queued there even after its caller has given up; the
/// server runs the whole backlog when it resumes (each call then returns
/// "expired" without writing, thanks to its deadline, but it still costs
/// the server and the socket buffers). So the engine counts the calls sent
/// and not yet answered: each call takes a ticket, and a reply to ticket
/// `t` proves every call sent before it on the same ordered connection has
/// been answered or dropped (a reconnect drops the old socket's backlog),
/// so `sent - highest answered` counts the backlog whether or not the
/// callers still wait. Beyond [`Engine::max_in_flight`] a call fails at
/// once with a transient error, except one probe per [`PROBE_INTERVAL`], whose
/// reply (once the connection serves again) clears the count. On a cluster
/// the count is across nodes (one node's replies clear calls queued on
/// another): it bounds a stall of every connection, while a single stalled
/// node's backlog is bounded by its calls' deadlines only.
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
            .field("in_flight", &self.in_flight())
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
                sent: AtomicU64::new(0),
                answered: AtomicU64::new(0),
                last_probe: AtomicU64::new(0),
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

    /// Bounds the script calls sent and not yet answered (at least 1; see
    /// the type's docs).
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

    /// The bound on script calls sent and not yet answered.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Script calls sent and not yet known to be answered (across clones;
    /// see the type's docs).
    pub fn in_flight(&self) -> u64 {
        let sent = self.shared.sent.load(Ordering::Acquire);
        sent.saturating_sub(self.shared.answered.load(Ordering::Acquire))
    }

    /// Takes a ticket for one call, or refuses it: beyond the bound, only
    /// one probe per [`PROBE_INTERVAL`] goes through.
    fn ticket(&self, start: Instant) -> Result<u64, StoreError> {
        let shared = &*self.shared;
        let max = u64::try_from(self.max_in_flight).unwrap_or(u64::MAX);
        if self.in_flight() >= max {
            let now = u64::try_from(
                start
                    .saturating_duration_since(shared.server_clock.base())
                    .as_micros(),
            )
            .unwrap_or(u64::MAX);
            let last = shared.last_probe.load(Ordering::Acquire);
            let every = u64::try_from(PROBE_INTERVAL.as_micros()).unwrap_or(u64::MAX);
            let probe = now.saturating_sub(last) >= every
                && shared
                    .last_probe
                    .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok();
            if !probe {
                return Err(StoreError::message(
                    format!(
                        "{} rate-limit calls sent and not answered: the connection is stalled; failing fast instead of queueing",
                        self.in_flight()
                    ),
                    true,
                ));
            }
        }
        Ok(shared.sent.fetch_add(1, Ordering::AcqRel) + 1)
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
        transport: &dyn Transport,
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

    /// Sends `call` with its deadline in server time, within the in-flight
    /// bound and the deadline; learns the server's clock from the reply and
    /// returns its decision integers (4 per quota), or a timeout when the
    /// script found the deadline passed.
    async fn send(
        &self,
        transport: &dyn Transport,
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
            // Past already (or the server's clock unknown and the time
            // left too short to learn it): nothing was sent.
            return Err(StoreError::Expired);
        };
        call.set_deadline(server_deadline);
        let ticket = self.ticket(start)?;
        let raw =
            match tokio::time::timeout_at(deadline.into(), transport.eval(&call, deadline)).await {
                Ok(reply) => reply?,
                Err(_) => {
                    return Err(StoreError::Timeout(
                        deadline.saturating_duration_since(start),
                    ));
                }
            };
        let received = Instant::now();
        shared.answered.fetch_max(ticket, Ordering::AcqRel);
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
