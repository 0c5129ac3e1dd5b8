//! Group commit's two rules under load, checked on the engine with a
//! transport that holds every call until the test lets it answer (no
//! server: the order and the number of calls in flight are the subject):
//!
//! - a second call goes beside the one in flight only for a batch worth it
//!   (at least [`engine::PIPELINE_MIN_BATCH`] requests, or half the latest
//!   call, at most a full batch); fewer wait for the call in flight; a
//!   third and further calls, up to [`engine::DEFAULT_PIPELINE`], only for
//!   a full batch;
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
        self.calls.lock().unwrap().push(call.keys.to_vec());
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

/// A node with one caller's call in flight (held), batches of at most
/// `max_batch` and `pipeline` calls in flight at most.
struct Scene {
    held: Arc<Held>,
    transport: Arc<dyn Transport>,
    engine: Engine,
    callers: Vec<tokio::task::JoinHandle<bool>>,
}

impl Scene {
    async fn new(pipeline: usize) -> Self {
        Self::with_batches_of(4, pipeline).await
    }

    async fn with_batches_of(max_batch: usize, pipeline: usize) -> Self {
        let held = Arc::new(Held::default());
        let mut scene = Self {
            transport: held.clone(),
            held,
            engine: engine(max_batch, pipeline),
            callers: Vec::new(),
        };
        scene.start(&["first"]).await;
        until("the lone call is sent", || scene.held.in_flight() == 1).await;
        scene
    }

    /// Starts a caller for each key, in order, each queued before the next.
    async fn start(&mut self, keys: &[&str]) {
        for key in keys {
            start(&self.engine, &self.transport, key, &mut self.callers).await;
        }
    }

    /// Lets the next `calls` calls answer and waits until `sent` calls in
    /// all have been sent.
    async fn answer(&self, calls: usize, sent: usize) {
        self.held.gate.add_permits(calls);
        until("the next call is sent", || self.held.sent().len() == sent).await;
    }

    /// The callers of call number `i` (0: the first).
    fn call(&self, i: usize) -> Vec<String> {
        callers_of(&self.held.sent()[i])
    }

    /// Answers every call; every caller must be admitted.
    async fn finish(self) -> Vec<Vec<String>> {
        self.held.gate.add_permits(1_000);
        for c in self.callers {
            assert!(c.await.unwrap());
        }
        self.held.sent()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_second_call_waits_for_enough_requests() {
    let depth = engine::DEFAULT_PIPELINE;
    const {
        assert!(
            engine::DEFAULT_PIPELINE >= 2,
            "the default pipelines no call"
        )
    };
    let mut scene = Scene::new(depth).await;
    // Three more: a partial batch waits for the call in flight.
    scene.start(&["b", "c", "d"]).await;
    settle().await;
    assert_eq!(scene.held.in_flight(), 1, "a partial batch did not wait");
    // The fourth fills the batch: it goes at once, beside the first call.
    scene.start(&["e"]).await;
    until("the full batch is sent", || scene.held.in_flight() == 2).await;
    assert_eq!(scene.call(1), ["b", "c", "d", "e"]);
    // Each further full batch goes beside them, up to the default depth.
    let mut decided = 5;
    for call in 2..depth {
        let keys: Vec<String> = (0..4).map(|i| format!("p{call}-{i}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        scene.start(&keys).await;
        until("the next full batch is sent", || {
            scene.held.in_flight() == call + 1
        })
        .await;
        assert_eq!(scene.call(call), keys);
        decided += 4;
    }
    // Never one more, however many wait.
    scene.start(&["f", "g", "h", "i", "j"]).await;
    settle().await;
    assert_eq!(
        scene.held.in_flight(),
        depth,
        "more than {depth} calls in flight"
    );
    let sent = scene.finish().await;
    let total: usize = sent.iter().map(Vec::len).sum();
    assert_eq!(total, decided + 5, "calls: {sent:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn with_one_call_in_flight_a_full_batch_waits() {
    let mut scene = Scene::new(1).await;
    scene.start(&["b", "c", "d", "e", "f"]).await;
    settle().await;
    assert_eq!(
        scene.held.in_flight(),
        1,
        "a second call went with pipeline 1"
    );
    scene.finish().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_long_queue_that_keeps_up_goes_first_in_first_out() {
    let mut scene = Scene::new(1).await;
    // Six wait behind it, more than one call carries, with most of their
    // 30 s still to go: the oldest four go next, then the other two.
    scene.start(&["q1", "q2", "q3", "q4", "q5", "q6"]).await;
    settle().await;
    scene.answer(1, 2).await;
    assert_eq!(scene.call(1), ["q1", "q2", "q3", "q4"]);
    scene.answer(1, 3).await;
    assert_eq!(scene.call(2), ["q5", "q6"]);
    scene.finish().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_short_queue_goes_first_in_first_out() {
    let mut scene = Scene::new(1).await;
    scene.start(&["q1", "q2", "q3"]).await;
    scene.answer(1, 2).await;
    assert_eq!(scene.call(1), ["q1", "q2", "q3"]);
    scene.finish().await;
}

#[tokio::test(flavor = "current_thread")]
async fn with_large_batches_a_second_call_goes_from_sixteen_waiting() {
    assert_eq!(engine::PIPELINE_MIN_BATCH, 16);
    let mut scene = Scene::with_batches_of(128, engine::DEFAULT_PIPELINE).await;
    let keys: Vec<String> = (1..=16).map(|i| format!("w{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    // Fifteen wait for the call in flight.
    scene.start(&keys[..15]).await;
    settle().await;
    assert_eq!(scene.held.in_flight(), 1, "fewer than 16 did not wait");
    // The sixteenth: they go at once, beside the first call.
    scene.start(&keys[15..]).await;
    until("the second call is sent", || scene.held.in_flight() == 2).await;
    assert_eq!(scene.call(1), keys);
    scene.finish().await;
}

#[tokio::test(flavor = "current_thread")]
async fn beside_two_calls_a_third_waits_for_a_full_batch() {
    const { assert!(engine::DEFAULT_PIPELINE >= 3) };
    let mut scene = Scene::with_batches_of(128, engine::DEFAULT_PIPELINE).await;
    let keys: Vec<String> = (1..=16 + 128).map(|i| format!("w{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    // Sixteen go beside the first call.
    scene.start(&keys[..16]).await;
    until("the second call is sent", || scene.held.in_flight() == 2).await;
    // 127 more wait: enough for a second call, not for a third.
    scene.start(&keys[16..16 + 127]).await;
    settle().await;
    assert_eq!(
        scene.held.in_flight(),
        2,
        "a third call went for a partial batch"
    );
    // The 128th fills a batch: it goes at once, beside the other two.
    scene.start(&keys[16 + 127..]).await;
    until("the third call is sent", || scene.held.in_flight() == 3).await;
    assert_eq!(scene.call(2), &keys[16..]);
    let sent = scene.finish().await;
    let decided: usize = sent.iter().map(Vec::len).sum();
    assert_eq!(decided, 1 + 16 + 128, "calls: {sent:?}");
}

/// The caller's deadline is the only patience: a request that waited
/// behind calls in flight (here `2 x HOLD`, each call held for `HOLD`) is
/// still decided however long the calls ahead took, and a request whose
/// caller gives it a deadline is answered with a timeout at that deadline,
/// not before, whatever the node does meanwhile. Real time: the engine's
/// timers are the subject.
#[tokio::test(flavor = "current_thread")]
async fn a_call_waits_for_its_reply_until_its_callers_deadline() {
    const HOLD: Duration = Duration::from_millis(300);
    let held = Arc::new(Held::default());
    let transport: Arc<dyn Transport> = held.clone();
    let engine = engine(4, engine::DEFAULT_PIPELINE);
    let mut callers = Vec::new();
    start(&engine, &transport, "first", &mut callers).await;
    until("the lone call is sent", || held.in_flight() == 1).await;
    start(&engine, &transport, "second", &mut callers).await;
    tokio::time::sleep(HOLD).await;
    held.gate.add_permits(1);
    until("the second call is sent", || held.sent().len() == 2).await;
    tokio::time::sleep(HOLD).await;
    held.gate.add_permits(1);
    for c in callers {
        assert!(c.await.expect("decided, however long the calls ahead took"));
    }

    // A request with a deadline, behind a call held past it: a timeout at
    // its deadline.
    let mut callers = Vec::new();
    start(&engine, &transport, "third", &mut callers).await;
    until("the lone call is sent", || held.in_flight() == 1).await;
    let due = Duration::from_millis(200);
    let late = {
        let (sender, transport) = (engine.clone(), Arc::clone(&transport));
        tokio::spawn(async move {
            let q = Quota::fixed_window(Rate::per_hour(1_000)).unwrap();
            let charges = [Charge::new(&q, 1)];
            let asked = Instant::now();
            let outcome = sender
                .decide(
                    &transport,
                    Request::new(b"fourth", &charges)
                        .with_deadline(ratelimit_core::store::Deadline::within(due)),
                )
                .await;
            (outcome, asked.elapsed())
        })
    };
    let (outcome, waited) = tokio::time::timeout(Duration::from_secs(20), late)
        .await
        .expect("the request outlived its deadline")
        .expect("no panic");
    assert!(
        matches!(outcome, Err(StoreError::Timeout(_))),
        "{outcome:?}"
    );
    assert!(
        waited >= due,
        "given up after {waited:?}, before its deadline"
    );
    held.gate.add_permits(2);
    for c in callers {
        assert!(c.await.unwrap());
    }
}
