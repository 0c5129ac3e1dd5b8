//! The node's breaker judges the node by its replies: never opened by a
//! busy node whose replies still flow, nor by this process being late;
//! opened by a stalled (SIGSTOPped) node after a stated number of failed
//! calls, and closed again by the first probe the node answers.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratelimit_core::{BreakerState, Quota, Rate, StoreError, StoreExt};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_server::RedisServer;

fn quota() -> Quota {
    Quota::fixed_window(Rate::per_hour(1_000_000_000)).unwrap()
}

fn node_state(store: &RedisStore) -> BreakerState {
    let states = store.engine().domains().states();
    assert_eq!(states.len(), 1, "one node: {states:?}");
    states[0].1
}

/// 2,000 callers at once on one healthy node with a 5 ms bound per call:
/// many calls time out waiting behind the others, but replies never stop
/// flowing, so none counts against the node and its breaker stays closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_node_whose_replies_flow_is_not_judged_failing() {
    let server = RedisServer::start_local();
    let store = Arc::new(
        RedisStore::builder(server.url())
            .prefix(server.prefix())
            .timeout(Duration::from_millis(5))
            .build()
            .await
            .expect("connect"),
    );
    let (answered, timed_out) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for c in 0..2_000u32 {
        let (store, answered, timed_out) = (store.clone(), answered.clone(), timed_out.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..5u32 {
                match store
                    .decide_one(format!("c{c}-{i}").as_bytes(), &quota(), 1)
                    .await
                {
                    Ok(_) => answered.fetch_add(1, Ordering::Relaxed),
                    // Waited behind the queue: gave up, ran after its
                    // deadline and counted nothing, or was refused unsent
                    // (the node could not answer it in time).
                    Err(
                        StoreError::Timeout(_)
                        | StoreError::Expired
                        | StoreError::Overloaded { .. },
                    ) => timed_out.fetch_add(1, Ordering::Relaxed),
                    Err(e) => panic!("a healthy node answered {e}"),
                };
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (answered, timed_out) = (
        answered.load(Ordering::Relaxed),
        timed_out.load(Ordering::Relaxed),
    );
    println!("answered {answered}, timed out behind the queue {timed_out}");
    assert!(
        timed_out >= 100,
        "only {timed_out} calls timed out: the node was not busy, the test proves nothing"
    );
    assert_eq!(node_state(&store), BreakerState::Closed);
}

/// A SIGSTOPped node: calls time out with no reply at all. Once the node
/// has been silent for 200 ms a timed-out call is a suspected stall, and
/// 200 ms later a confirmed one: the node's breaker opens. From then on
/// calls fail at once, naming the node, without being sent. Once the node
/// resumes, the next probe (every 100 ms) closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_node_opens_its_breaker_after_its_stated_silence() {
    let server = RedisServer::start_local();
    let store = RedisStore::builder(server.url())
        .prefix(server.prefix())
        .timeout(Duration::from_millis(30))
        .build()
        .await
        .expect("connect");
    let q = quota();
    store.decide_one(b"warm", &q, 1).await.expect("warm-up");
    let before = evalsha_calls(&server);
    server.pause();
    let paused_at = Instant::now();
    let mut timed_out = 0;
    let mut opened_after = None;
    for i in 0..200 {
        match store.decide_one(format!("c{i}").as_bytes(), &q, 1).await {
            Err(StoreError::Timeout(_) | StoreError::Expired) => timed_out += 1,
            Err(StoreError::Unavailable { domain, reason }) => {
                assert_eq!(domain, store.node());
                assert!(reason.contains("breaker open for node"), "{reason}");
                opened_after.get_or_insert((i, paused_at.elapsed()));
            }
            other => panic!("unexpected answer from a paused server: {other:?}"),
        }
    }
    let (calls, took) = opened_after.expect("the breaker never opened");
    println!("opened after {calls} calls, {took:?} after the pause; {timed_out} timed out");
    // A call is suspected of a stall once the node has been silent for
    // STALL_AFTER (200 ms); the suspicion is confirmed STALL_AFTER later,
    // and the breaker opens: with one 30 ms call at a time, after about 14
    // calls, 400 ms and some of silence.
    assert!(
        (8..=20).contains(&calls),
        "the breaker opened after {calls} calls"
    );
    // Probes: at most one per 100 ms went out while it was open.
    assert!(
        timed_out <= 20 + 1 + (took.as_millis() as usize / 100),
        "{timed_out}"
    );
    server.resume();
    let resumed = Instant::now();
    let mut back = false;
    for _ in 0..1_000 {
        if store.decide_one(b"after", &q, 1).await.is_ok() {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(back, "the store never answered after the pause");
    println!("answered again {:?} after the resume", resumed.elapsed());
    assert_eq!(node_state(&store), BreakerState::Closed);
    // What reached the server: the stalled calls and the probes, not 200.
    let sent = evalsha_calls(&server) - before;
    assert!(sent < 80, "{sent} scripts ran");
}

/// A starved runtime (a task blocking the only worker 60 ms at a time):
/// calls time out because this process is late, not because the node is;
/// the breaker stays closed. The store runs on that runtime
/// (`io_thread(false)`: with its own I/O thread, the default, it reads its
/// replies while the runtime is blocked, and few calls time out at all).
#[test]
fn a_starved_runtime_does_not_open_the_breaker() {
    let server = RedisServer::start_local();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Arc::new(
            RedisStore::builder(server.url())
                .prefix(server.prefix())
                .timeout(Duration::from_millis(20))
                .io_thread(false)
                .build()
                .await
                .expect("connect"),
        );
        let on = Arc::new(AtomicBool::new(true));
        let hog = {
            let on = on.clone();
            tokio::spawn(async move {
                while on.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(60));
                    tokio::task::yield_now().await;
                }
            })
        };
        let timeouts = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for c in 0..50u32 {
            let (store, timeouts) = (store.clone(), timeouts.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..10u32 {
                    match store
                        .decide_one(format!("s{c}-{i}").as_bytes(), &quota(), 1)
                        .await
                    {
                        Ok(_) => {}
                        Err(
                            StoreError::Timeout(_)
                            | StoreError::Expired
                            | StoreError::Overloaded { .. },
                        ) => {
                            timeouts.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        on.store(false, Ordering::Relaxed);
        hog.await.unwrap();
        let timeouts = timeouts.load(Ordering::Relaxed);
        println!("{timeouts} calls timed out while the runtime was starved");
        assert!(
            timeouts >= 20,
            "only {timeouts} timeouts: the test proves nothing"
        );
        assert_eq!(node_state(&store), BreakerState::Closed);
    });
}

/// `EVALSHA` calls the server has run so far (`INFO commandstats`).
fn evalsha_calls(server: &RedisServer) -> u64 {
    common::info_count(server, "commandstats", "cmdstat_evalsha:calls=")
}
