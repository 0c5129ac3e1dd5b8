//! Group commit's two rules under load, checked on the engine with a
//! transport that holds every call until the test lets it answer (no
//! server: the order and the number of calls in flight are the subject):
//!
//! - a second call goes beside the one in flight only for a full batch; a
//!   partial batch waits for the call in flight ([`engine::DEFAULT_PIPELINE`]);
//! - while the queue keeps up, a call takes the oldest waiting requests
//!   first (under congestion the newest: unit tests in `src/batch.rs`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ratelimit_core::store::Request;
use ratelimit_core::{Charge, Quota, Rate, StoreError};
use ratelimit_redis::engine::{self, Engine, Transport};
use ratelimit_redis::scripts::Call;
use tokio::sync::Semaphore;

/// Holds each call until a permit is added; records every call's keys.
struct Held {
    gate: Semaphore,
    calls: Mutex<Vec<Vec<String>>>,
    answered: Mutex<usize>,
}

impl Default for Held {
    fn default() -> Self {
        Self {
            gate: Semaphore::new(0),
            calls: Mutex::default(),
            answered: Mutex::default(),
        }
    }
}

impl Held {
    fn sent(&self) -> Vec<Vec<String>> {
        self.calls.lock().unwrap().clone()
    }

    /// Calls sent and not yet answered.
    fn in_flight(&self) -> usize {
        self.calls.lock().unwrap().len() - *self.answered.lock().unwrap()
    }
}

#[async_trait]
impl Transport for Held {
    async fn eval(
        self: Arc<Self>,
        call: Arc<Call>,
        _deadline: Instant,
    ) -> Result<Vec<i64>, StoreError> {
        self.calls.lock().unwrap().push(call.keys.clone());
        let permit = self.gate.acquire().await.expect("gate open");
        permit.forget();
        *self.answered.lock().unwrap() += 1;
        // Every request admitted: 4 integers each; a batch ends with the
        // server's TIME.
        let mut reply: Vec<i64> = (0..call.requests).flat_map(|_| [1, 0, 0, -1]).collect();
        if call.requests > 1 || call.script.name() == "batch" {
            reply.push(1);
        }
        Ok(reply)
    }

    fn domain(&self, _slot: u16) -> Arc<str> {
        Arc::from("held")
    }
}

/// Runs the runtime's other tasks until `done` holds (bounded: a test that
/// never gets there fails instead of hanging).
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never happened: {what}");
}

/// Lets the runtime run everything that is ready, a bounded number of times.
async fn settle() {
    for _ in 0..1_000 {
        tokio::task::yield_now().await;
    }
}

fn engine(max_batch: usize, pipeline: usize) -> Engine {
    let mut engine = Engine::new(Duration::from_secs(30), 1);
    engine.set_max_batch(max_batch);
    engine.set_pipeline(pipeline);
    engine
}

/// Starts a caller deciding for `key` and waits until its request is in
/// flight or queued.
async fn start(
    engine: &Engine,
    transport: &Arc<dyn Transport>,
    key: &str,
    callers: &mut Vec<tokio::task::JoinHandle<bool>>,
) {
    let before = engine.in_flight();
    let (engine, transport, key) = (engine.clone(), Arc::clone(transport), key.to_owned());
    let engine_seen = engine.clone();
    callers.push(tokio::spawn(async move {
        let q = Quota::fixed_window(Rate::per_hour(1_000)).unwrap();
        let charges = [Charge::new(&q, 1)];
        engine
            .decide(&transport, Request::new(key.as_bytes(), &charges))
            .await
            .expect("decided")[0]
            .allowed
    }));
    until("the request queued", || engine_seen.in_flight() > before).await;
}

fn callers_of(call: &[String]) -> Vec<String> {
    call.iter()
        .map(|k| {
            let tag = k.split('{').nth(1).unwrap_or(k);
            tag.split('}').next().unwrap_or(tag).to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn a_second_call_goes_only_for_a_full_batch() {
    let held = Arc::new(Held::default());
    let transport: Arc<dyn Transport> = held.clone();
    let engine = engine(4, engine::DEFAULT_PIPELINE);
    assert_eq!(engine::DEFAULT_PIPELINE, 2);
    let mut callers = Vec::new();

    // Alone on an idle node: one call in flight.
    start(&engine, &transport, "a", &mut callers).await;
    until("the lone call is sent", || held.in_flight() == 1).await;

    // Three more: a partial batch waits for the call in flight.
    for key in ["b", "c", "d"] {
        start(&engine, &transport, key, &mut callers).await;
    }
    settle().await;
    assert_eq!(held.in_flight(), 1, "a partial batch did not wait");

    // The fourth fills the batch: it goes at once, beside the first call.
    start(&engine, &transport, "e", &mut callers).await;
    until("the full batch is sent", || held.in_flight() == 2).await;
    assert_eq!(callers_of(&held.sent()[1]), ["b", "c", "d", "e"]);

    // Never a third call, however many wait.
    for key in ["f", "g", "h", "i", "j"] {
        start(&engine, &transport, key, &mut callers).await;
    }
    settle().await;
    assert_eq!(held.in_flight(), 2, "more than two calls in flight");

    // Answer everything; every caller is decided.
    held.gate.add_permits(1_000);
    for c in callers {
        assert!(c.await.unwrap());
    }
    let sent = held.sent();
    let decided: usize = sent.iter().map(Vec::len).sum();
    assert_eq!(decided, 10, "calls: {sent:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn with_one_call_in_flight_a_full_batch_waits() {
    let held = Arc::new(Held::default());
    let transport: Arc<dyn Transport> = held.clone();
    let engine = engine(4, 1);
    let mut callers = Vec::new();
    start(&engine, &transport, "a", &mut callers).await;
    until("the lone call is sent", || held.in_flight() == 1).await;
    for key in ["b", "c", "d", "e", "f"] {
        start(&engine, &transport, key, &mut callers).await;
    }
    settle().await;
    assert_eq!(held.in_flight(), 1, "a second call went with pipeline 1");
    held.gate.add_permits(1_000);
    for c in callers {
        assert!(c.await.unwrap());
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_long_queue_that_keeps_up_goes_first_in_first_out() {
    let held = Arc::new(Held::default());
    let transport: Arc<dyn Transport> = held.clone();
    let engine = engine(4, 1);
    let mut callers = Vec::new();
    start(&engine, &transport, "first", &mut callers).await;
    until("the lone call is sent", || held.in_flight() == 1).await;
    // Six wait behind it, more than one call carries, with most of their
    // 30 s still to go: the oldest four go next, then the other two.
    for key in ["q1", "q2", "q3", "q4", "q5", "q6"] {
        start(&engine, &transport, key, &mut callers).await;
    }
    settle().await;
    held.gate.add_permits(1);
    until("the next call is sent", || held.sent().len() == 2).await;
    assert_eq!(callers_of(&held.sent()[1]), ["q1", "q2", "q3", "q4"]);
    held.gate.add_permits(1);
    until("the last call is sent", || held.sent().len() == 3).await;
    assert_eq!(callers_of(&held.sent()[2]), ["q5", "q6"]);
    held.gate.add_permits(1_000);
    for c in callers {
        assert!(c.await.unwrap());
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_short_queue_goes_first_in_first_out() {
    let held = Arc::new(Held::default());
    let transport: Arc<dyn Transport> = held.clone();
    let engine = engine(4, 1);
    let mut callers = Vec::new();
    start(&engine, &transport, "first", &mut callers).await;
    until("the lone call is sent", || held.in_flight() == 1).await;
    for key in ["q1", "q2", "q3"] {
        start(&engine, &transport, key, &mut callers).await;
    }
    held.gate.add_permits(1);
    until("the next call is sent", || held.sent().len() == 2).await;
    assert_eq!(callers_of(&held.sent()[1]), ["q1", "q2", "q3"]);
    held.gate.add_permits(1_000);
    for c in callers {
        assert!(c.await.unwrap());
    }
}
