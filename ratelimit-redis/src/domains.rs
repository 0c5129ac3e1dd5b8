//! Failure domains: one per Redis node (the single node, or each cluster
//! master), each with its own breaker and its own evidence.
//!
//! A node is judged on what it does, never on how many calls wait for it:
//!
//! - **Progress.** Every reply from a node (a decision, an "expired", even
//!   an error reply: the node answered) is progress, and so is a call sent
//!   to it while it was idle (its clock starts then). A call that times out
//!   while the node has made progress within the last [`STALL_AFTER`] (or
//!   the call's own wait, if longer) waited behind a busy node: it is slow,
//!   not failed, and counts nothing against the node. A call that times out
//!   when the node has made **no progress at all** for that long is a
//!   suspected stall, confirmed only if the node still has not replied
//!   [`STALL_AFTER`] later: a process too busy to read its replies
//!   (thousands of tasks on two cores) reads one in the meantime, which
//!   clears the suspicion. A confirmed stall (calls outstanding, no reply
//!   at all for twice [`STALL_AFTER`], 400 ms) opens the node's breaker at
//!   once: that is the stated time.
//! - **Our own lateness.** A timeout whose timer fired well after its
//!   deadline ([`ratelimit_core::health::late_after`]) happened because
//!   this process was starved (the reply may well have been waiting in the
//!   socket): it counts nothing against the node.
//! - **Failures** are the errors that prove the node could not be reached
//!   (connection refused, reset, dropped). A node also opens its breaker
//!   when the failure rate over a sliding window passes its threshold ([`ratelimit_core::CircuitBreaker`]: by default 50 % of
//!   at least 20 calls in a second); while open, its calls fail at once
//!   with [`ratelimit_core::StoreError::Unavailable`] naming the node, one probe per
//!   `probe_every` (100 ms by default) goes through, and the first probe
//!   answered closes it. Other nodes' callers are not affected.
//! - **A memory safeguard**, not a stall detector: at most
//!   [`crate::engine::DEFAULT_MAX_IN_FLIGHT`] (100,000) calls may wait on
//!   one node at once; beyond it a call fails at once. Real concurrency
//!   stays far below it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

use std::time::Duration;

use ratelimit_core::health::Health;
use ratelimit_core::{BreakerState, CircuitBreaker, Micros};

/// A node that has neither replied nor been sent a call while idle for
/// this long (or for a timed-out call's own wait, if longer) is suspected
/// of a stall, and a suspicion still unanswered this long after is a
/// stall: 200 ms. Long enough that a process too busy to read its replies
/// for a while (a CPU-saturated host) reads one before it passes.
pub const STALL_AFTER: Duration = Duration::from_millis(200);

/// One node's live state.
#[derive(Debug)]
pub struct Domain {
    name: Arc<str>,
    health: Health,
    /// When the node last replied, in µs since the engine's base.
    last_reply: AtomicU64,
    /// Calls sent to it and not yet answered (or given up).
    in_flight: AtomicU64,
    /// Calls that timed out with no recent progress, not judged yet.
    suspects: AtomicU64,
    /// When the oldest of them timed out (µs; 0: none).
    suspect_since: AtomicU64,
    /// When a call to it last timed out (µs; 0: never).
    last_timeout: AtomicU64,
    /// Requests waiting for its next call (group commit).
    queue: crate::batch::Queue,
    /// What it completes in time ([`crate::admission`]).
    admission: crate::admission::Admission,
}

impl Domain {
    fn new(name: Arc<str>, breaker: CircuitBreaker) -> Self {
        let admission = crate::admission::Admission::new(Arc::clone(&name));
        Self {
            name,
            health: Health::new(breaker),
            last_reply: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            suspects: AtomicU64::new(0),
            suspect_since: AtomicU64::new(0),
            last_timeout: AtomicU64::new(0),
            queue: crate::batch::Queue::default(),
            admission,
        }
    }

    /// The node's name, shared.
    pub(crate) fn name_arc(&self) -> &Arc<str> {
        &self.name
    }

    /// Its admission: the limit in flight it completes in time.
    pub fn admission(&self) -> &crate::admission::Admission {
        &self.admission
    }

    /// The node: `host:port`, or `cluster` before a cluster's slot map is
    /// known.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its breaker.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// When it last replied (µs since the engine's base; 0: never).
    pub fn last_reply(&self) -> Micros {
        self.last_reply.load(Ordering::Acquire)
    }

    /// Requests waiting for its next call.
    pub(crate) fn queue(&self) -> &crate::batch::Queue {
        &self.queue
    }

    /// Calls waiting on it now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// A reply arrived at `now`: progress (and every suspected stall
    /// before it was only this process reading late).
    pub(crate) fn replied(&self, now: Micros) {
        self.last_reply.fetch_max(now, Ordering::AcqRel);
        if self.suspects.load(Ordering::Acquire) != 0 {
            self.suspects.store(0, Ordering::Release);
            self.suspect_since.store(0, Ordering::Release);
        }
    }

    /// A call timed out at `now` with no recent progress from the node: a
    /// suspected stall, judged later ([`Domain::confirm_stall`]).
    pub(crate) fn suspect(&self, now: Micros) {
        let _ =
            self.suspect_since
                .compare_exchange(0, now.max(1), Ordering::AcqRel, Ordering::Relaxed);
        self.suspects.fetch_add(1, Ordering::AcqRel);
    }

    /// At `now`: if suspected stalls are at least [`STALL_AFTER`] old and
    /// the node has not replied since the first of them, the node is
    /// stalled (calls outstanding, no reply at all for twice
    /// [`STALL_AFTER`]): its breaker opens at once. Returns how many calls
    /// were suspected, when this opened the breaker. A process that was
    /// merely late reading replies has read one since, which cleared them.
    pub(crate) fn confirm_stall(&self, now: Micros) -> Option<u64> {
        let since = self.suspect_since.load(Ordering::Acquire);
        let after = u64::try_from(STALL_AFTER.as_micros()).unwrap_or(u64::MAX);
        if since == 0 || now.saturating_sub(since) < after || self.last_reply() > since {
            return None;
        }
        if self
            .suspect_since
            .compare_exchange(since, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        let stalls = self.suspects.swap(0, Ordering::AcqRel);
        self.health.trip(now).then_some(stalls)
    }

    /// Counts one call in flight, sent at `now`, until the guard drops. A
    /// call sent to an idle node starts the node's progress clock: the
    /// node is then judged by replies from `now` on.
    pub(crate) fn enter(self: &Arc<Self>, now: Micros) -> InFlight {
        // Idle after a reply, that is: a node whose last call timed out is
        // not idle, it owes an answer.
        if self.in_flight.fetch_add(1, Ordering::AcqRel) == 0
            && self.last_timeout.load(Ordering::Acquire) <= self.last_reply()
        {
            self.last_reply.fetch_max(now, Ordering::AcqRel);
        }
        InFlight(Arc::clone(self))
    }

    /// A call to it timed out at `now`.
    pub(crate) fn timed_out(&self, now: Micros) {
        self.last_timeout.fetch_max(now, Ordering::AcqRel);
    }

    /// Whether the node has made no progress for `stalled_for` at `now`:
    /// no reply, and no call sent to it while it was idle, in that time.
    pub fn stalled(&self, now: Micros, stalled_for: Micros) -> bool {
        now.saturating_sub(self.last_reply()) >= stalled_for
    }
}

/// One call in flight on a domain.
#[derive(Debug)]
pub struct InFlight(Arc<Domain>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The failure domains of one store (shared by its clones), by name.
#[derive(Debug)]
pub struct Domains {
    base: Instant,
    breaker: CircuitBreaker,
    map: RwLock<HashMap<Arc<str>, Arc<Domain>>>,
    /// The first domain named: a single node's only one, found without the
    /// map's lock and hash.
    first: OnceLock<Arc<Domain>>,
}

impl Domains {
    /// No domain yet; each is created, closed, when first named.
    pub fn new(breaker: CircuitBreaker) -> Self {
        Self {
            base: Instant::now(),
            breaker,
            map: RwLock::default(),
            first: OnceLock::new(),
        }
    }

    /// The instant the domains' µs count from.
    pub fn clone_base(&self) -> Instant {
        self.base
    }

    /// The breaker settings every domain gets.
    pub fn breaker(&self) -> CircuitBreaker {
        self.breaker
    }

    /// µs since the base, for `at`.
    pub fn micros(&self, at: Instant) -> Micros {
        u64::try_from(at.saturating_duration_since(self.base).as_micros())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The domain named `name`, created on first use.
    pub fn get(&self, name: &str) -> Arc<Domain> {
        if let Some(d) = self.first.get()
            && *d.name == *name
        {
            return Arc::clone(d);
        }
        if let Some(d) = self.map.read().unwrap_or_else(|p| p.into_inner()).get(name) {
            return Arc::clone(d);
        }
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        let d = Arc::clone(
            map.entry(Arc::from(name))
                .or_insert_with(|| Arc::new(Domain::new(Arc::from(name), self.breaker))),
        );
        let _ = self.first.set(Arc::clone(&d));
        d
    }

    /// Every domain's name and breaker state now.
    pub fn states(&self) -> Vec<(String, BreakerState)> {
        let now = self.micros(Instant::now());
        let mut v: Vec<_> = self
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|d| (d.name.to_string(), d.health.state(now)))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}
