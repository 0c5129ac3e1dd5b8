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
//!
//! Each node also holds its group-commit queue: the requests waiting for
//! its next call, and which of them that call takes (the oldest first, the
//! newest first under overload). The batch module sends them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::Instant;

use std::time::Duration;

use ratelimit_core::health::Health;
use ratelimit_core::store::Decisions;
use ratelimit_core::{BreakerState, CircuitBreaker, Micros, StoreError};
use tokio::sync::oneshot;

use crate::scripts::Request;

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
    queue: Queue,
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
            queue: Queue::default(),
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
    pub(crate) fn queue(&self) -> &Queue {
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

/// The fewest waiting requests that go as a second call beside the one in
/// flight: 16, or half as many as the latest batch call carried if that is
/// more (never more than the store's batch bound). Fewer wait for the call
/// in flight, so that a batch call's fixed cost (about 77,000 server
/// instructions, as much as two requests) is shared.
pub const PIPELINE_MIN_BATCH: usize = 16;

// The node's queue for group commit: requests waiting for its next call,
// and which of them the next call takes (the batch module sends them).

/// One request waiting for its node's next call.
pub(crate) struct Item {
    pub(crate) request: Request,
    /// When it was queued.
    pub(crate) queued: Instant,
    pub(crate) deadline: Instant,
    pub(crate) reply: oneshot::Sender<Result<Decisions, StoreError>>,
    pub(crate) in_flight: InFlight,
}

#[derive(Default)]
struct State {
    /// Calls in flight (or being built and sent) on the node: while there
    /// is one, new requests queue.
    calls: usize,
    /// How many requests the latest batch call carried.
    last: usize,
    items: VecDeque<Item>,
    /// Requests taken by calls so far, and two earlier readings of that
    /// count (when, how many), at least [`RATE_STEP`] apart: the node's
    /// recent rate (see [`State::rate`]).
    taken: u64,
    mark: Option<(Instant, u64)>,
    recent: Option<(Instant, u64)>,
    /// Since when every take has left requests waiting (the node is
    /// backlogged), and how many had been taken then: the node's capacity
    /// is measured over such spans ([`crate::admission`]).
    backlog: Option<(Instant, u64)>,
    /// Whether the node was saturated at some take of the current backlog
    /// span: all its calls in flight, or a full batch left waiting.
    saturated: bool,
}

/// How far apart the readings of the node's rate are taken.
const RATE_STEP: std::time::Duration = std::time::Duration::from_millis(10);

/// The oldest reading a rate is taken over: a queue that sat idle longer
/// is judged as when no rate is known yet.
const RATE_STALE: std::time::Duration = std::time::Duration::from_millis(40);

impl State {
    /// Counts `n` requests taken at `now`.
    fn count_taken(&mut self, n: usize, now: Instant) {
        self.taken += n as u64;
        match self.recent {
            Some((at, _)) if now.saturating_duration_since(at) < RATE_STEP => {}
            _ => {
                self.mark = self.recent;
                self.recent = Some((now, self.taken));
            }
        }
    }

    /// After a take at `now` of at most `max` requests, with at most
    /// `pipeline` calls in flight: while requests are
    /// still waiting after every take, the node is backlogged, and what its
    /// calls took over each [`RATE_STEP`] of that is a measurement of its
    /// capacity, a whole one when the node was saturated meanwhile (every
    /// call it may have in flight was, or a full batch was left waiting).
    /// Otherwise the waiting requests were only held for a larger call
    /// (see [`beside`]): the node took what came, and the rate is a floor
    /// under its capacity, not the capacity.
    fn measure_backlog(
        &mut self,
        now: Instant,
        max: usize,
        pipeline: usize,
        admission: &crate::admission::Admission,
    ) {
        let waiting = !self.items.is_empty();
        admission.set_idle_queue(!waiting);
        if !waiting {
            self.backlog = None;
            self.saturated = false;
            return;
        }
        self.saturated |= self.items.len() >= max || self.calls >= pipeline.max(1);
        match self.backlog {
            None => self.backlog = Some((now, self.taken)),
            Some((since, at)) if now.saturating_duration_since(since) >= RATE_STEP => {
                let over = now.saturating_duration_since(since);
                if self.saturated {
                    admission.measured(self.taken - at, over, now);
                } else {
                    admission.at_least(self.taken - at, over, now);
                }
                self.backlog = Some((now, self.taken));
                self.saturated = false;
            }
            Some(_) => {}
        }
    }

    /// Requests per second the node's calls have taken over the last
    /// 10-20 ms; `None` before the first reading that old, and when the
    /// older reading is more than [`RATE_STALE`] old (the node sat idle
    /// between: its rate over that time says nothing of what it can take).
    fn rate(&self, now: Instant) -> Option<f64> {
        let (at, count) = self.mark?;
        let since = now.saturating_duration_since(at);
        if since.is_zero() || since > RATE_STALE {
            return None;
        }
        Some((self.taken - count) as f64 / since.as_secs_f64())
    }

    /// Whether the queue is congested at `now` with `max` requests per
    /// call: more wait than one call carries, and, at the node's recent
    /// rate, the queue would not drain before the newest request's
    /// deadline (first in, first out, every request would then wait
    /// longer than it was given). Before the rate is known: the oldest
    /// request has waited more than half of the time it was given.
    fn congested(&self, max: usize, now: Instant) -> bool {
        if self.items.len() <= max {
            return false;
        }
        match (self.rate(now), self.items.back()) {
            (Some(rate), Some(newest)) => {
                let left = newest.deadline.saturating_duration_since(now).as_secs_f64();
                self.items.len() as f64 > rate * left
            }
            _ => self.items.front().is_some_and(|f| waited_half(f, now)),
        }
    }
}

/// A node's queue of requests waiting for its next call.
#[derive(Default)]
pub(crate) struct Queue {
    state: Mutex<State>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Queue")
            .field("calls", &s.calls)
            .field("waiting", &s.items.len())
            .finish()
    }
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the caller may send its request alone now (nothing in
    /// flight, nothing waiting); it then holds the node until its
    /// lead drops (the batch module's `Lead`).
    pub(crate) fn try_lead(&self) -> bool {
        let mut s = self.lock();
        if s.calls > 0 || !s.items.is_empty() {
            return false;
        }
        s.calls = 1;
        true
    }

    /// Queues `item`; `true`: a drain must start (nothing was in flight,
    /// or enough now wait for a call beside those in flight, see
    /// [`beside`], and fewer than `pipeline` calls are in flight).
    pub(crate) fn push(&self, item: Item, max: usize, pipeline: usize) -> bool {
        let mut s = self.lock();
        s.items.push_back(item);
        if s.calls < pipeline && s.items.len() >= beside(max, s.last, s.calls) {
            s.calls += 1;
            true
        } else {
            false
        }
    }

    /// The lone call in flight is done; `true`: requests wait, so a drain
    /// must start (the node stays busy).
    pub(crate) fn release(&self) -> bool {
        let mut s = self.lock();
        if s.items.is_empty() {
            s.calls -= 1;
            false
        } else {
            true
        }
    }

    /// Takes up to `max` waiting requests that can still be decided; none:
    /// this call's place is given up. Requests whose caller has given up or
    /// whose deadline has passed are not sent and take no place in the
    /// call (the latter answered "expired", counting nothing). When more
    /// than `max` wait and the queue is [`State::congested`], the newest are taken
    /// (see the module docs), in arrival order. While other calls are in
    /// flight, fewer waiting requests than [`beside`] asks are left to
    /// them. `pipeline`: the most calls the node may have in flight (its
    /// capacity is measured only while they are all out, or a full batch
    /// waits).
    pub(crate) fn take(&self, max: usize, pipeline: usize, domain: &Domain) -> Vec<Item> {
        let now = Instant::now();
        let admission = domain.admission();
        let mut stale = Vec::new();
        let mut s = self.lock();
        if s.calls > 1 && s.items.len() < beside(max, s.last, s.calls - 1) {
            s.calls -= 1;
            return Vec::new();
        }
        // The oldest first: those whose caller has gone (or whose deadline
        // has passed) leave the queue, so that under overload, when calls
        // take from the back, the front does not fill with the dead.
        let hopeless = |i: &Item| i.reply.is_closed() || !admission.can_make(now, i.deadline);
        while let Some(front) = s.items.front() {
            if !hopeless(front) {
                break;
            }
            if let Some(item) = s.items.pop_front() {
                stale.push(item);
            }
        }
        let mut live = Vec::with_capacity(s.items.len().min(max));
        let newest = s.congested(max, now);
        while live.len() < max {
            let item = if newest {
                s.items.pop_back()
            } else {
                s.items.pop_front()
            };
            let Some(item) = item else {
                break;
            };
            if hopeless(&item) {
                stale.push(item);
            } else {
                live.push(item);
            }
        }
        if newest {
            live.reverse();
        }
        let waited = live
            .first()
            .map(|oldest| now.saturating_duration_since(oldest.queued));
        s.last = live.len();
        s.count_taken(live.len(), now);
        s.measure_backlog(now, max, pipeline, admission);
        if live.is_empty() {
            s.calls -= 1;
        }
        let waiting = s.items.len() as u64;
        drop(s);
        if let Some(waited) = waited {
            crate::telemetry::queue_delay(domain.name_arc(), waited);
        }
        for item in stale {
            if item.reply.is_closed() {
                continue;
            }
            // Not sent: too little time left for a call (or none at all).
            // Counted nothing either way.
            let error = if item.deadline <= now {
                StoreError::Expired
            } else {
                admission.shed_queued();
                crate::admission::overloaded(domain.name_arc(), waiting + live.len() as u64, None)
            };
            let _ = item.reply.send(Err(error));
        }
        live
    }
}

/// The fewest waiting requests that go as a second call beside the one in
/// flight: half as many as the latest call carried, at least
/// [`PIPELINE_MIN_BATCH`], at most a full batch of `max`.
fn second(max: usize, last: usize) -> usize {
    (last / 2).max(PIPELINE_MIN_BATCH).min(max)
}

/// The fewest waiting requests that go as a call beside `others` calls in
/// flight: any with none, [`second`] beside one, a full batch of `max`
/// beside two or more. Further calls keep the server busy when the client
/// is slow to come back to it (thousands of callers), without cutting the
/// batches of a load that two calls carry into smaller ones (each call has
/// a fixed cost on the server).
fn beside(max: usize, last: usize, others: usize) -> usize {
    match others {
        0 => 1,
        1 => second(max, last),
        _ => max,
    }
}

/// Whether `oldest` has waited more than half of the time it was given.
fn waited_half(oldest: &Item, now: Instant) -> bool {
    now.saturating_duration_since(oldest.queued) * 2
        > oldest.deadline.saturating_duration_since(oldest.queued)
}

#[cfg(test)]
mod tests {
    use ratelimit_core::{Charge, Quota, Rate};

    use super::*;

    /// A queue holding `callers` in order, each queued `waited` ago with
    /// `left` still to go.
    fn queue(callers: &[&str], waited: Duration, left: Duration) -> (Queue, Vec<Receiver>) {
        let domain = node();
        let q = Quota::fixed_window(Rate::per_hour(10)).unwrap();
        let queue = Queue::default();
        let now = Instant::now();
        let mut receivers = Vec::new();
        for caller in callers {
            let (tx, rx) = oneshot::channel();
            receivers.push(rx);
            queue.push(
                Item {
                    request: Request::new("rl", caller.as_bytes(), &[Charge::new(&q, 1)], None),
                    queued: now - waited,
                    deadline: now + left,
                    reply: tx,
                    in_flight: domain.enter(1),
                },
                4,
                1,
            );
        }
        (queue, receivers)
    }

    fn callers(items: &[Item]) -> Vec<String> {
        items
            .iter()
            .map(|i| {
                let k = &i.request.keys[0];
                k[k.find('{').unwrap() + 1..k.find('}').unwrap()].to_owned()
            })
            .collect()
    }

    type Receiver = oneshot::Receiver<Result<Decisions, StoreError>>;

    /// A node to take for.
    fn node() -> Arc<Domain> {
        Domains::new(CircuitBreaker::DEFAULT).get("node")
    }

    const SIX: [&str; 6] = ["q1", "q2", "q3", "q4", "q5", "q6"];

    #[test]
    fn a_second_call_needs_half_the_latest_call_at_least_sixteen_at_most_a_batch() {
        assert_eq!(second(128, 0), 16);
        assert_eq!(second(128, 20), 16);
        assert_eq!(second(128, 100), 50);
        assert_eq!(second(128, 128), 64);
        assert_eq!(second(4, 100), 4);
        assert_eq!(second(1, 0), 1);
    }

    #[test]
    fn a_third_call_and_further_need_a_full_batch() {
        assert_eq!(beside(128, 100, 0), 1);
        assert_eq!(beside(128, 100, 1), 50);
        assert_eq!(beside(128, 100, 2), 128);
        assert_eq!(beside(128, 20, 5), 128);
        assert_eq!(beside(4, 0, 1), 4);
    }

    #[test]
    fn a_congested_queue_gives_its_newest_in_arrival_order() {
        // The oldest waited 900 ms of its 1 s.
        let (queue, _rx) = queue(&SIX, Duration::from_millis(900), Duration::from_millis(100));
        assert_eq!(
            callers(&queue.take(4, 6, &node())),
            ["q3", "q4", "q5", "q6"]
        );
        assert_eq!(callers(&queue.take(4, 6, &node())), ["q1", "q2"]);
    }

    /// The node took `per_second` requests a second over the last 20 ms.
    fn measured(queue: &Queue, per_second: u64) {
        let mut s = queue.lock();
        let now = Instant::now();
        s.mark = Some((now - Duration::from_millis(20), 0));
        s.recent = Some((now - Duration::from_millis(5), 0));
        s.taken = per_second / 50;
    }

    #[test]
    fn a_queue_the_node_drains_in_time_goes_first_in_first_out_however_long_its_oldest_waited() {
        // The oldest waited 900 ms of its 1 s, but at 100,000 a second the
        // six drain in well under the 100 ms left.
        let (queue, _rx) = queue(&SIX, Duration::from_millis(900), Duration::from_millis(100));
        measured(&queue, 100_000);
        assert_eq!(
            callers(&queue.take(4, 6, &node())),
            ["q1", "q2", "q3", "q4"]
        );
    }

    #[test]
    fn a_queue_the_node_cannot_drain_in_time_goes_newest_first_however_fresh() {
        // Queued just now with 100 ms to go, but at 10 a second one request
        // of the six would be decided in time.
        let (queue, _rx) = queue(&SIX, Duration::from_millis(1), Duration::from_millis(100));
        measured(&queue, 10);
        assert_eq!(
            callers(&queue.take(4, 6, &node())),
            ["q3", "q4", "q5", "q6"]
        );
    }

    #[test]
    fn only_a_saturated_backlog_measures_the_capacity_and_a_held_one_is_a_floor() {
        use crate::admission::Admission;
        let t0 = Instant::now();
        let step = RATE_STEP;
        // Requests left waiting after each take, fewer than a batch, with
        // one call of a pipeline of six in flight: held for a larger call,
        // not refused by a full node. 50 taken in each 10 ms: 5,000 a
        // second is a floor, and sets no estimate.
        let a = Admission::default();
        let mut s = State {
            calls: 1,
            ..State::default()
        };
        s.items.push_back(waiting_item());
        for i in 0..=3 {
            s.count_taken(50, t0 + step * i);
            s.measure_backlog(t0 + step * i, 512, 6, &a);
        }
        assert_eq!(a.capacity(t0 + step * 3), None);
        // Every call of the pipeline in flight: the node is saturated, and
        // what it took is its capacity.
        s.calls = 6;
        for i in 4..=5 {
            s.count_taken(50, t0 + step * i);
            s.measure_backlog(t0 + step * i, 512, 6, &a);
        }
        let c = a.capacity(t0 + step * 5).unwrap();
        assert!((c - 5_000.0).abs() < 1.0, "{c}");
        // Held again, taking faster: the floor raises the estimate.
        s.calls = 1;
        for i in 6..=7 {
            s.count_taken(200, t0 + step * i);
            s.measure_backlog(t0 + step * i, 512, 6, &a);
        }
        let raised = a.capacity(t0 + step * 7).unwrap();
        assert!(raised > 5_000.0, "{raised}");
        // Held and slower: a floor never lowers it.
        for i in 8..=9 {
            s.count_taken(1, t0 + step * i);
            s.measure_backlog(t0 + step * i, 512, 6, &a);
        }
        assert_eq!(a.capacity(t0 + step * 9), Some(raised));
    }

    /// A request waiting in a queue (its caller listening).
    fn waiting_item() -> Item {
        let q = Quota::fixed_window(Rate::per_hour(10)).unwrap();
        let (tx, rx) = oneshot::channel();
        std::mem::forget(rx);
        let now = Instant::now();
        Item {
            request: Request::new("rl", b"w", &[Charge::new(&q, 1)], None),
            queued: now,
            deadline: now + Duration::from_secs(1),
            reply: tx,
            in_flight: node().enter(1),
        }
    }

    #[test]
    fn the_rate_is_what_calls_took_over_the_last_readings() {
        let mut s = State::default();
        let t0 = Instant::now();
        assert_eq!(s.rate(t0), None);
        s.count_taken(100, t0);
        // Within one step of the first reading: still no rate.
        s.count_taken(100, t0 + Duration::from_millis(5));
        assert_eq!(s.rate(t0 + Duration::from_millis(5)), None);
        // A step later: 200 taken since the first reading, 20 ms before.
        s.count_taken(100, t0 + Duration::from_millis(10));
        let rate = s.rate(t0 + Duration::from_millis(20)).unwrap();
        assert!((rate - 10_000.0).abs() < 1.0, "{rate}");
        // After an idle second, the readings say nothing of the node.
        assert_eq!(s.rate(t0 + Duration::from_secs(1)), None);
    }

    #[test]
    fn a_burst_after_an_idle_spell_is_not_judged_by_the_idle_rate() {
        // The node took 10 requests a second ago, then nothing: a burst of
        // six with 100 ms to go, fresh, goes first in, first out.
        let (queue, _rx) = queue(&SIX, Duration::from_millis(1), Duration::from_millis(100));
        {
            let mut s = queue.lock();
            let now = Instant::now();
            s.mark = Some((now - Duration::from_secs(1), 0));
            s.recent = Some((now - Duration::from_millis(990), 10));
            s.taken = 10;
        }
        assert_eq!(
            callers(&queue.take(4, 6, &node())),
            ["q1", "q2", "q3", "q4"]
        );
    }

    #[test]
    fn a_queue_that_keeps_up_goes_first_in_first_out() {
        // Long, but the oldest waited 100 ms of its 10 s.
        let (queue, _rx) = queue(
            &SIX,
            Duration::from_millis(100),
            Duration::from_millis(9_900),
        );
        assert_eq!(
            callers(&queue.take(4, 6, &node())),
            ["q1", "q2", "q3", "q4"]
        );
        assert_eq!(callers(&queue.take(4, 6, &node())), ["q5", "q6"]);
    }

    #[test]
    fn requests_whose_caller_has_gone_leave_from_the_front() {
        let (queue, mut rx) = queue(&SIX, Duration::from_millis(900), Duration::from_millis(100));
        // The three oldest callers stop waiting.
        for r in rx.iter_mut().take(3) {
            r.close();
        }
        // Three live requests wait: fewer than a call carries, so they go
        // first in, first out, and the gone ones are gone.
        assert_eq!(callers(&queue.take(4, 6, &node())), ["q4", "q5", "q6"]);
        assert!(queue.lock().items.is_empty());
    }
}
