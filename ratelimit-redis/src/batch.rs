//! Group commit: decisions waiting for the same node go to Redis together,
//! as one call of the batch script ([`crate::scripts::BATCH`]).
//!
//! No timer and no added delay: a request that finds its node with nothing
//! in flight goes at once, alone (the lean single-quota script). Requests
//! that arrive while a call is in flight wait in the node's queue; when it
//! is answered, everything queued goes out as the next call, in arrival
//! order (at most [`crate::engine::DEFAULT_MAX_BATCH`] requests per call;
//! on a cluster one call per hash slot, sent side by side). The script
//! decides each request exactly as it would have been decided alone, in
//! that order, each with its own deadline: one past its deadline when the
//! script reaches it writes nothing ("expired"). A request whose caller has
//! already given up, or whose deadline has passed before the call is sent,
//! is not sent at all.
//!
//! # A second call in flight, for a batch worth it
//!
//! While one call is in flight, the client has nothing to do for the node
//! and, once the reply is back, the server has nothing to do until the next
//! call is built and written. When enough requests already wait — half as
//! many as the latest batch call carried, at least
//! [`crate::engine::PIPELINE_MIN_BATCH`], at most a full batch — they go
//! at once as a second call on the same connection (pipelined: the server
//! runs the calls in the order they were written); at most
//! [`crate::engine::DEFAULT_PIPELINE`] calls are in flight per node. Fewer
//! never take the second place: they wait for the call in flight, as
//! above, so that a batch call's fixed cost is shared. A third call and
//! further ones go only for a full batch: a load that two calls carry
//! keeps its large batches, and a queue of thousands keeps the server busy
//! while the client is slow to come back to it.
//!
//! # Under overload: the newest first
//!
//! While the queue keeps up, calls take the oldest waiting requests first.
//! When it does not — more requests wait than one call carries, and at the
//! rate the node's calls have taken requests over the last 10-20 ms the
//! queue would not drain before the newest request's deadline (until that
//! rate is known: the oldest has already waited more than half of the time
//! it was given) — a call takes the newest of them instead (still in
//! arrival order within the call). The oldest have the least time left: sent first, they would
//! expire in flight while the fresh ones behind them aged in turn, and the
//! node would decide almost nothing (first-in-first-out under overload:
//! with 4,096 callers and a 20 ms timeout, about 1 % of decisions came from
//! the store). The ones left behind are sent when the queue catches up or
//! are answered by their caller's timeout (the limiter's degraded mode);
//! requests whose caller has gone leave the queue from its front at every
//! call. Requests waiting for the same node at once are concurrent: no
//! order between them is promised, only that each is decided exactly once.
//!
//! What the node cannot answer in time is not queued at all: the node's
//! admission ([`crate::admission`]) answers it at once, and a request
//! whose time left is shorter than one call is taken out of the queue
//! unsent ([`ratelimit_core::StoreError::Overloaded`]).
//!
//! The queue is drained by a task of its own, so a caller that stops
//! waiting never strands the requests queued behind it. A lost reply is
//! ambiguous for every request in its call, as for one alone: none is sent
//! again.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use ratelimit_core::StoreError;
use ratelimit_core::store::Decisions;
use tokio::sync::oneshot;

use crate::decode;
use crate::domains::{Domain, InFlight};
use crate::engine::{Engine, PIPELINE_MIN_BATCH, Straddles, Transport, follow};
use crate::scripts::{Call, Request};

/// One request waiting for its node's next call.
struct Item {
    request: Request,
    /// When it was queued.
    queued: Instant,
    deadline: Instant,
    reply: oneshot::Sender<Result<Decisions, StoreError>>,
    in_flight: InFlight,
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

    /// After a take at `now`: while requests are still waiting after every
    /// take, the node is backlogged, and what its calls took over each
    /// [`RATE_STEP`] of that is a measurement of its capacity.
    fn measure_backlog(&mut self, now: Instant, admission: &crate::admission::Admission) {
        let waiting = !self.items.is_empty();
        admission.set_idle_queue(!waiting);
        if !waiting {
            self.backlog = None;
            return;
        }
        match self.backlog {
            None => self.backlog = Some((now, self.taken)),
            Some((since, at)) if now.saturating_duration_since(since) >= RATE_STEP => {
                admission.measured(self.taken - at, now.saturating_duration_since(since), now);
                self.backlog = Some((now, self.taken));
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
    /// [`Lead`] drops.
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
    fn push(&self, item: Item, max: usize, pipeline: usize) -> bool {
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
    fn release(&self) -> bool {
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
    /// them.
    fn take(&self, max: usize, domain: &Domain) -> Vec<Item> {
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
        s.measure_backlog(now, admission);
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

/// The caller sending alone holds its node; when it is done (or stops
/// waiting), the requests that queued meanwhile go out. Borrows what it
/// needs: a lone call clones nothing for it.
pub(crate) struct Lead<'a> {
    engine: &'a Engine,
    transport: &'a Arc<dyn Transport>,
    domain: &'a Arc<Domain>,
}

impl<'a> Lead<'a> {
    pub(crate) fn new(
        engine: &'a Engine,
        transport: &'a Arc<dyn Transport>,
        domain: &'a Arc<Domain>,
    ) -> Self {
        Self {
            engine,
            transport,
            domain,
        }
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        if self.domain.queue().release() {
            self.engine.spawn(drain(
                self.engine.clone(),
                Arc::clone(self.transport),
                Arc::clone(self.domain),
            ));
        }
    }
}

/// Queues `request` (received at `start`) for its node's next call, now,
/// and returns the wait for its decisions until `deadline`: a future that
/// holds only the reply's receiver and its timer (the request went into
/// the queue before it), so the caller's own future stays small.
pub(crate) fn enqueue<'a>(
    engine: &Engine,
    transport: &Arc<dyn Transport>,
    domain: &'a Arc<Domain>,
    request: Request,
    start: Instant,
    deadline: Instant,
) -> impl std::future::Future<Output = Result<Decisions, StoreError>> + Send + 'a {
    let (tx, rx) = oneshot::channel();
    let now = engine.domains_base();
    let item = Item {
        request,
        queued: start,
        deadline,
        reply: tx,
        in_flight: domain.enter(
            u64::try_from(start.saturating_duration_since(now).as_micros()).unwrap_or(u64::MAX),
        ),
    };
    if domain
        .queue()
        .push(item, engine.max_batch(), engine.pipeline())
    {
        engine.spawn(drain(
            engine.clone(),
            Arc::clone(transport),
            Arc::clone(domain),
        ));
    }
    async move {
        match tokio::time::timeout_at(deadline.into(), rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(StoreError::message(
                format!("the batch for {} was dropped", domain.name()),
                true,
            )),
            Err(_) => {
                domain.admission().overtaken();
                Err(StoreError::Timeout(
                    deadline.saturating_duration_since(start),
                ))
            }
        }
    }
}

/// Sends the node's waiting requests, call after call, until none waits.
async fn drain(engine: Engine, transport: Arc<dyn Transport>, domain: Arc<Domain>) {
    loop {
        let items = domain.queue().take(engine.max_batch(), &domain);
        if items.is_empty() {
            return;
        }
        if transport.any_slot() {
            send(&engine, &transport, &domain, items).await;
            continue;
        }
        // A cluster: one call per hash slot, side by side.
        let mut groups: Vec<(u16, Vec<Item>)> = Vec::new();
        for item in items {
            let slot = item.request.slot();
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, g)) => g.push(item),
                None => groups.push((slot, vec![item])),
            }
        }
        if groups.len() == 1 {
            if let Some((_, g)) = groups.pop() {
                send(&engine, &transport, &domain, g).await;
            }
            continue;
        }
        let sends: Vec<_> = groups
            .into_iter()
            .map(|(_, g)| {
                let (engine, transport, domain) =
                    (engine.clone(), Arc::clone(&transport), Arc::clone(&domain));
                tokio::spawn(async move { send(&engine, &transport, &domain, g).await })
            })
            .collect();
        for s in sends {
            let _ = s.await;
        }
    }
}

/// A copy of an error, for each request of a call that failed.
fn copy(e: &StoreError) -> StoreError {
    match e {
        StoreError::Timeout(d) => StoreError::Timeout(*d),
        StoreError::Expired => StoreError::Expired,
        StoreError::Unavailable { domain, reason } => StoreError::Unavailable {
            domain: domain.clone(),
            reason: reason.clone(),
        },
        StoreError::InvalidRequest(m) => StoreError::InvalidRequest(m.clone()),
        StoreError::Overloaded {
            domain,
            in_flight,
            limit,
        } => StoreError::Overloaded {
            domain: Arc::clone(domain),
            in_flight: *in_flight,
            limit: *limit,
        },
        other => StoreError::message(other.to_string(), other.is_transient()),
    }
}

/// Sends `items` (one hash slot on a cluster) as one call: alone for one,
/// the batch script for several; answers each. A batch refused unrun
/// because its callers straddle a slot migration ([`Straddles`]) is sent
/// again request by request, each as it would have gone alone: a caller's
/// requests one after the other, in order, callers side by side, each
/// request with its own deadline.
async fn send(
    engine: &Engine,
    transport: &Arc<dyn Transport>,
    domain: &Arc<Domain>,
    items: Vec<Item>,
) {
    let groups = send_once(engine, transport, domain, items).await;
    if groups.is_empty() {
        return;
    }
    let sends: Vec<_> = groups
        .into_iter()
        .map(|g| {
            let (engine, transport, domain) =
                (engine.clone(), Arc::clone(transport), Arc::clone(domain));
            tokio::spawn(async move {
                // One request per call, as it would have gone alone (a call
                // of one is never given back).
                for item in g {
                    send_once(&engine, &transport, &domain, vec![item]).await;
                }
            })
        })
        .collect();
    for s in sends {
        let _ = s.await;
    }
}

/// One call of `items`; answers each, or gives them back grouped by caller
/// when the call was refused as straddling a slot migration.
async fn send_once(
    engine: &Engine,
    transport: &Arc<dyn Transport>,
    domain: &Arc<Domain>,
    items: Vec<Item>,
) -> Vec<Vec<Item>> {
    let now = Instant::now();
    let mut live = Vec::with_capacity(items.len());
    for item in items {
        if item.reply.is_closed() {
            // The caller has given up: not sent at all.
            continue;
        }
        let index = engine.clock_index(item.request.slot());
        match engine
            .clocks()
            .server_deadline_at(index, item.deadline, now)
        {
            Some(d) => live.push((item, d)),
            // Past its deadline before it could be sent: nothing counted.
            _ => {
                let _ = item.reply.send(Err(StoreError::Expired));
            }
        }
    }
    if live.is_empty() {
        return Vec::new();
    }
    let deadline = live.iter().map(|(i, _)| i.deadline).max().unwrap_or(now);
    // How many keys each request gave the call, to give them back if the
    // call must be split (`Straddles`).
    let mut key_counts = Vec::new();
    let call = if let [(item, d)] = &mut live[..] {
        Call::alone_taking_keys(&mut item.request, *d)
    } else {
        key_counts.extend(live.iter().map(|(i, _)| i.request.keys.len()));
        let mut requests: Vec<(&mut Request, i64)> =
            live.iter_mut().map(|(i, d)| (&mut i.request, *d)).collect();
        Call::batch_taking_keys(&mut requests)
    };
    let call = Arc::new(call);
    let start = Instant::now();
    // Awaited until the last of its requests' deadlines (each caller stops
    // waiting at its own): a busy node is not a failed one.
    let mut eval = Arc::clone(transport).eval(Arc::clone(&call), deadline);
    let outcome = tokio::time::timeout_at(deadline.into(), &mut eval).await;
    let received = Instant::now();
    if outcome.as_ref().is_ok_and(Result::is_ok) {
        domain
            .admission()
            .call_took(received.saturating_duration_since(now));
    }
    if !key_counts.is_empty() && matches!(&outcome, Ok(Err(e)) if Straddles::is(e)) {
        // Refused unrun: the node neither failed nor counted anything.
        drop(eval);
        return by_caller(&call, key_counts, live);
    }
    let mut answered = Vec::with_capacity(live.len());
    let mut guards = Vec::with_capacity(live.len());
    for (item, _) in live {
        guards.push(item.in_flight);
        answered.push((item.request, item.reply));
    }
    if outcome.is_err() {
        follow(eval, Arc::clone(domain), engine.domains_base(), guards);
    } else {
        drop(guards);
    }
    let raw = match engine.judge(domain, outcome, start, deadline, received, false) {
        Ok(raw) => raw,
        Err(e) => {
            for (_, reply) in answered {
                let _ = reply.send(Err(copy(&e)));
            }
            return Vec::new();
        }
    };
    if let [(request, _)] = &answered[..] {
        let result = engine.decode_alone(request, raw, received);
        if let Some((_, reply)) = answered.pop() {
            let _ = reply.send(result);
        }
        return Vec::new();
    }
    let quotas: Vec<usize> = answered.iter().map(|(r, _)| r.quotas()).collect();
    match decode::batch(&raw, &quotas) {
        Ok((outcomes, server_now)) => {
            if let Some((r, _)) = answered.first() {
                engine
                    .clocks()
                    .observe(engine.clock_index(r.slot()), server_now, received);
            }
            for ((request, reply), outcome) in answered.into_iter().zip(outcomes) {
                let _ = reply.send(match outcome {
                    decode::Outcome::Decided(d) => request.decisions(d),
                    decode::Outcome::Expired => Err(StoreError::Expired),
                });
            }
        }
        Err(e) => {
            for (_, reply) in answered {
                let _ = reply.send(Err(copy(&e)));
            }
        }
    }
    Vec::new()
}

/// The requests of a call refused as straddling a slot migration, their
/// keys given back, grouped by caller (hash tag) in order.
fn by_caller(call: &Call, key_counts: Vec<usize>, live: Vec<(Item, i64)>) -> Vec<Vec<Item>> {
    let mut keys = call.keys.iter();
    let mut groups: Vec<(Vec<u8>, Vec<Item>)> = Vec::new();
    for ((mut item, _), n) in live.into_iter().zip(key_counts) {
        item.request.keys = keys.by_ref().take(n).cloned().collect();
        let tag = item
            .request
            .keys
            .first()
            .map(|k| crate::keys::hash_tag(k.as_bytes()).to_vec())
            .unwrap_or_default();
        match groups.iter_mut().find(|(t, _)| *t == tag) {
            Some((_, g)) => g.push(item),
            None => groups.push((tag, vec![item])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ratelimit_core::{Charge, CircuitBreaker, Quota, Rate};

    use super::*;
    use crate::domains::Domains;

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
        assert_eq!(callers(&queue.take(4, &node())), ["q3", "q4", "q5", "q6"]);
        assert_eq!(callers(&queue.take(4, &node())), ["q1", "q2"]);
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
        assert_eq!(callers(&queue.take(4, &node())), ["q1", "q2", "q3", "q4"]);
    }

    #[test]
    fn a_queue_the_node_cannot_drain_in_time_goes_newest_first_however_fresh() {
        // Queued just now with 100 ms to go, but at 10 a second one request
        // of the six would be decided in time.
        let (queue, _rx) = queue(&SIX, Duration::from_millis(1), Duration::from_millis(100));
        measured(&queue, 10);
        assert_eq!(callers(&queue.take(4, &node())), ["q3", "q4", "q5", "q6"]);
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
        assert_eq!(callers(&queue.take(4, &node())), ["q1", "q2", "q3", "q4"]);
    }

    #[test]
    fn a_queue_that_keeps_up_goes_first_in_first_out() {
        // Long, but the oldest waited 100 ms of its 10 s.
        let (queue, _rx) = queue(
            &SIX,
            Duration::from_millis(100),
            Duration::from_millis(9_900),
        );
        assert_eq!(callers(&queue.take(4, &node())), ["q1", "q2", "q3", "q4"]);
        assert_eq!(callers(&queue.take(4, &node())), ["q5", "q6"]);
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
        assert_eq!(callers(&queue.take(4, &node())), ["q4", "q5", "q6"]);
        assert!(queue.lock().items.is_empty());
    }
}
