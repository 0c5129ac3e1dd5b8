//! The caller's deadline is the only patience: a call that waits behind the
//! node's other replies (calls on one connection are answered in order,
//! and under load a large batch ahead of it takes milliseconds) waits for
//! as long as its caller does, however slow the node; and a node that
//! stops answering holds a call to its caller's deadline, no longer, and
//! is judged by its silence (its breaker), not by one slow call. Checked on
//! the engine with transports that answer on a schedule (no server: the
//! timing is the subject), in real time with bounded waits.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ratelimit_core::store::{Deadline, Request};
use ratelimit_core::{Charge, Quota, Rate, StoreError};
use ratelimit_redis::engine::{Engine, Transport};
use ratelimit_redis::scripts::Call;

/// Answers calls in the order they came, one every `every` from the first
/// call's sending; calls from number `silent_from` on are never answered.
struct Paced {
    every: Duration,
    silent_from: u32,
    sent: AtomicU32,
    first: std::sync::OnceLock<Instant>,
}

impl Paced {
    fn new(every: Duration, silent_from: u32) -> Self {
        Self {
            every,
            silent_from,
            sent: AtomicU32::new(0),
            first: std::sync::OnceLock::new(),
        }
    }
}

#[async_trait]
impl Transport for Paced {
    async fn eval(
        self: Arc<Self>,
        call: Arc<Call>,
        _deadline: Instant,
    ) -> Result<Vec<i64>, StoreError> {
        let n = self.sent.fetch_add(1, Ordering::SeqCst);
        let first = *self.first.get_or_init(Instant::now);
        if n >= self.silent_from {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep_until((first + self.every * (n + 1)).into()).await;
        // Every request admitted: 4 integers each (a lone call, no TIME).
        Ok((0..call.requests).flat_map(|_| [1, 0, 0, -1]).collect())
    }

    fn domain(&self, _slot: u16) -> Arc<str> {
        Arc::from("paced")
    }
}

/// An engine whose requests without a deadline wait up to `timeout`,
/// every request its own call (all in flight at once on the node).
fn engine(timeout: Duration) -> Engine {
    let mut engine = Engine::new(timeout, 1);
    engine.set_max_batch(1);
    engine
}

async fn decide(
    engine: &Engine,
    transport: &Arc<dyn Transport>,
    key: &str,
    deadline: Deadline,
) -> Result<bool, StoreError> {
    let q = Quota::fixed_window(Rate::per_hour(1_000)).unwrap();
    let charges = [Charge::new(&q, 1)];
    engine
        .decide(
            transport,
            Request::new(key.as_bytes(), &charges).with_deadline(deadline),
        )
        .await
        .map(|d| d[0].allowed)
}

/// Eight calls in flight at once, answered one every 50 ms: the last ones
/// come back 350-400 ms after their sending, and are answered, because
/// their callers wait 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_behind_a_busy_nodes_replies_waits_as_long_as_its_caller() {
    let engine = engine(Duration::from_millis(100));
    let transport: Arc<dyn Transport> = Arc::new(Paced::new(Duration::from_millis(50), u32::MAX));
    let started = Instant::now();
    let mut callers = Vec::new();
    for i in 0..8 {
        let (engine, transport) = (engine.clone(), Arc::clone(&transport));
        callers.push(tokio::spawn(async move {
            let deadline = Deadline::within(Duration::from_secs(10));
            decide(&engine, &transport, &format!("c{i}"), deadline).await
        }));
    }
    for (i, c) in callers.into_iter().enumerate() {
        let r = c.await.expect("caller");
        assert!(matches!(r, Ok(true)), "call {i}: {r:?}");
    }
    // The last reply came after the store's own bound for requests without
    // a deadline: only the caller's deadline counted.
    assert!(
        started.elapsed() > Duration::from_millis(100),
        "the calls were answered within 100 ms: this test checks nothing"
    );
}

/// A node that answers one call and then nothing: the second call is held
/// to its caller's deadline (300 ms), not cut short before it, and ends as
/// a timeout; a request without a deadline is held to the store's own
/// bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_holds_a_call_to_its_callers_deadline() {
    let engine = engine(Duration::from_millis(400));
    let transport: Arc<dyn Transport> = Arc::new(Paced::new(Duration::from_millis(10), 1));
    assert!(matches!(
        decide(&engine, &transport, "a", Deadline::NONE).await,
        Ok(true)
    ));
    let due = Duration::from_millis(300);
    let started = Instant::now();
    let r = decide(&engine, &transport, "b", Deadline::within(due)).await;
    let waited = started.elapsed();
    assert!(matches!(r, Err(StoreError::Timeout(_))), "{r:?}");
    assert!(
        waited >= due,
        "given up after {waited:?}, before its deadline"
    );
    assert!(
        waited < Duration::from_secs(15),
        "a silent node held its call {waited:?}, past its deadline"
    );
    let started = Instant::now();
    let r = decide(&engine, &transport, "c", Deadline::NONE).await;
    assert!(matches!(r, Err(StoreError::Timeout(_))), "{r:?}");
    assert!(started.elapsed() >= Duration::from_millis(400));
}
