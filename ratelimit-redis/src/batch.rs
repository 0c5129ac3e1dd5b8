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

use std::sync::Arc;
use std::time::Instant;

use ratelimit_core::StoreError;
use ratelimit_core::store::Decisions;
use tokio::sync::oneshot;

use crate::decode;
use crate::domains::{Domain, Item};
use crate::engine::{Engine, Straddles, Transport, follow};
use crate::scripts::{Call, Request};

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
        let items = domain
            .queue()
            .take(engine.max_batch(), engine.pipeline(), &domain);
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
