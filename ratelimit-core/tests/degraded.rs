//! Degraded never means unlimited by default, and the breaker opens on
//! evidence against the store: not on timeouts this process caused by
//! being late.
//!
//! The limiter's default timer is tokio's (feature `tokio`), and lateness
//! is read on tokio's paused clock: these tests build with that feature
//! (`cargo test -p ratelimit-core --features tokio`; the workspace's test
//! command enables every feature).

#![cfg(feature = "tokio")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::ModelStore;
use ratelimit_core::store::{Answer, Decisions, Request};
use ratelimit_core::{
    BreakerState, CircuitBreaker, ConfigError, Decision, FailurePolicy, FallbackStore, Limiter,
    ManualClock, Quota, Rate, Source, Store, StoreError, StoreExt,
};

const T0: u64 = 1_800_000_000_000_000;

fn plan() -> Quota {
    Quota::fixed_window(Rate::per_minute(100)).unwrap()
}

#[test]
fn a_store_that_can_fail_needs_a_degraded_mode() {
    let clock = ManualClock::new(T0);
    let err = Limiter::builder(ModelStore::new(clock.clone()))
        .quota(plan())
        .build()
        .unwrap_err();
    assert_eq!(err, ConfigError::NoDegradedMode);
    let text = err.to_string();
    assert!(
        text.contains(".instances(n)") && text.contains("FailOpen"),
        "{text}"
    );
    // Any explicit choice builds.
    for b in [
        Limiter::builder(ModelStore::new(clock.clone())).instances(3),
        Limiter::builder(ModelStore::new(clock.clone())).failure_policy(FailurePolicy::FailOpen),
        Limiter::builder(ModelStore::new(clock.clone()))
            .fallback(ModelStore::new(clock.clone()), 2),
    ] {
        b.quota(plan()).build().unwrap();
    }
    // A store that answers in process cannot be unavailable: nothing to choose.
    Limiter::builder(ModelStore::with_sync(clock, true))
        .quota(plan())
        .build()
        .unwrap();
}

/// With `instances(4)` and the store down, every decision comes from the
/// built-in fallback at a quarter of the limit: limited, not unlimited.
#[tokio::test]
async fn the_default_degraded_mode_is_the_fallback_at_l_over_n() {
    let clock = ManualClock::new(T0);
    let shared = Arc::new(ModelStore::new(clock.clone()));
    let l = Limiter::builder_arc(shared.clone())
        .quota(plan())
        .instances(4)
        .no_circuit_breaker()
        .build()
        .unwrap();
    shared.set_down(true);
    let mut admitted = 0;
    for _ in 0..60 {
        let d = l.check("c").await;
        assert_eq!(d.source, Source::Fallback);
        assert_eq!(d.limit, 25);
        admitted += u64::from(d.allowed);
    }
    assert_eq!(admitted, 25);
    assert_eq!(l.stats().fallback, 60);
    assert_eq!(l.stats().fail_open, 0);
    // Headers give the divided numbers.
    let d = l.check("c").await;
    assert_eq!(l.headers(&d).get("X-RateLimit-Limit"), Some("25"));
    // Several quotas too, all or nothing.
    let day = Quota::fixed_window(Rate::per_day(8))
        .unwrap()
        .named("day")
        .unwrap();
    let l = Limiter::builder_arc(shared.clone())
        .quota(plan())
        .quota(day)
        .instances(4)
        .no_circuit_breaker()
        .build()
        .unwrap();
    let admitted = {
        let mut n = 0;
        for _ in 0..10 {
            let v = l.check_all("d", 1).await.unwrap();
            assert_eq!(v.decision.source, Source::Fallback);
            n += u64::from(v.allowed());
        }
        n
    };
    assert_eq!(admitted, 2, "8 per day over 4 instances");
}

/// The built-in fallback store tracks at most its bound of callers; a new
/// caller beyond it is answered by the failure policy (deny by default),
/// and a tracked caller over its limit is never forgotten.
#[tokio::test]
async fn a_full_fallback_store_refuses_new_callers_and_forgets_no_one() {
    let clock = ManualClock::new(T0);
    let store = FallbackStore::new(Arc::new(clock.clone()), 16);
    let q = Quota::fixed_window(Rate::per_minute(1)).unwrap();
    for i in 0..64u32 {
        let _ = store.decide_one(&i.to_be_bytes(), &q, 1).await;
    }
    assert!(store.len() <= 16, "{} tracked", store.len());
    assert!(store.refused() >= 48);
    // Every tracked caller is over its limit and stays denied.
    let mut denied = 0;
    for i in 0..64u32 {
        match store.decide_one(&i.to_be_bytes(), &q, 1).await {
            Ok(d) => {
                assert!(!d.allowed, "caller {i} admitted twice in one window");
                denied += 1;
            }
            Err(StoreError::Unavailable { reason, .. }) => assert!(reason.contains("full")),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(denied, store.len());
    // Once their state expires, room is made for new callers.
    clock.advance(Duration::from_secs(120));
    assert!(store.decide_one(b"new", &q, 1).await.unwrap().allowed);
    // Through a limiter: the refused caller is denied by the default policy.
    let full = FallbackStore::new(Arc::new(clock.clone()), 16);
    // Enough callers that every shard is full (one each).
    for i in 0..1_000u32 {
        let _ = full
            .decide_one(&[b"rl~".as_slice(), &i.to_be_bytes()].concat(), &q, 1)
            .await;
    }
    let shared = Arc::new(ModelStore::new(clock.clone()));
    shared.set_down(true);
    let l = Limiter::builder_arc(shared)
        .quota(q)
        .fallback(full, 1)
        .no_circuit_breaker()
        .build()
        .unwrap();
    let d = l.check("stranger").await;
    assert_eq!(d.source, Source::FailClosed);
}

/// A store whose answer is delivered by another task (as a network
/// client's connection task reads the reply), after `delay`; or an error,
/// when down.
#[derive(Debug)]
struct Relay {
    delay: Duration,
    down: AtomicBool,
    calls: AtomicU64,
}

impl Relay {
    fn new(delay: Duration) -> Self {
        Self {
            delay,
            down: AtomicBool::new(false),
            calls: AtomicU64::new(0),
        }
    }
}

impl Store for Relay {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let limit = request.charges[0].quota.limit();
        let (delay, down) = (self.delay, self.down.load(Ordering::Relaxed));
        Answer::pending(async move {
            if down {
                return Err(StoreError::message("connection refused", true));
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = tx.send(Decision::from_store(true, limit, limit - 1, 1_000, None));
            });
            rx.await
                .map(Decisions::one)
                .map_err(|_| StoreError::message("relay dropped", true))
        })
    }
}

fn relay_limiter(store: Arc<Relay>) -> Limiter {
    Limiter::builder_arc(store)
        .quota(Quota::fixed_window(Rate::per_second(1_000_000)).unwrap())
        .failure_policy(FailurePolicy::FailClosed)
        .circuit_breaker(CircuitBreaker::new(
            Duration::from_secs(10),
            10,
            50,
            Duration::from_secs(60),
        ))
        .timeout(Duration::from_millis(20))
        .build()
        .unwrap()
}

/// A starved runtime (a task blocking the executor 60 ms at a time) makes
/// the limiter's timers fire long after they were due, before the task
/// that delivers the store's answer has run: those timeouts are this
/// process's lateness, not the store's, and the breaker stays closed.
#[test]
fn late_timeouts_of_a_starved_runtime_do_not_open_the_breaker() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Arc::new(Relay::new(Duration::from_millis(1)));
        let l = relay_limiter(store.clone());
        let hog_on = Arc::new(AtomicBool::new(true));
        let hog = {
            let on = hog_on.clone();
            tokio::spawn(async move {
                while on.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(60));
                    tokio::task::yield_now().await;
                }
            })
        };
        let mut tasks = Vec::new();
        for t in 0..20 {
            let l = l.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..10 {
                    l.check(format!("c{t}-{i}")).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        hog_on.store(false, Ordering::Relaxed);
        hog.await.unwrap();
        let s = l.stats();
        assert!(
            s.timeouts >= 10,
            "the starved runtime produced {} timeouts: the test proves nothing",
            s.timeouts
        );
        assert_eq!(
            l.breaker_state(),
            Some(BreakerState::Closed),
            "late timeouts opened the breaker: {s:?}"
        );
    });
}

/// The same limiter opens on a store that refuses every call...
#[tokio::test]
async fn the_breaker_opens_on_a_dead_store() {
    let store = Arc::new(Relay::new(Duration::from_millis(1)));
    store.down.store(true, Ordering::Relaxed);
    let l = relay_limiter(store.clone());
    for i in 0..10 {
        assert_eq!(l.check(format!("c{i}")).await.source, Source::FailClosed);
    }
    assert_eq!(l.breaker_state(), Some(BreakerState::Open));
    let calls = store.calls.load(Ordering::Relaxed);
    for i in 0..100 {
        l.check(format!("c{i}")).await;
    }
    assert_eq!(
        store.calls.load(Ordering::Relaxed),
        calls,
        "open: not called"
    );
}

/// ...and on one that never answers in time while the runtime is not late
/// (timeouts that fire on time are evidence).
#[tokio::test(start_paused = true)]
async fn the_breaker_opens_on_timeouts_that_fire_on_time() {
    let store = Arc::new(Relay::new(Duration::from_secs(3600)));
    let l = relay_limiter(store);
    for i in 0..10 {
        l.check(format!("c{i}")).await;
    }
    assert_eq!(l.stats().timeouts, 10);
    assert_eq!(l.breaker_state(), Some(BreakerState::Open));
}

/// A [`ratelimit_core::Timer`] that counts the sleeps it hands out.
#[derive(Debug, Default, Clone)]
struct CountingTimer(Arc<AtomicU64>);

impl ratelimit_core::Timer for CountingTimer {
    fn sleep(&self, duration: Duration) -> ratelimit_core::Sleep {
        self.0.fetch_add(1, Ordering::Relaxed);
        Box::pin(tokio::time::sleep(duration))
    }

    fn now(&self) -> std::time::Instant {
        tokio::time::Instant::now().into_std()
    }
}

/// A [`Relay`] that says whether it bounds its own calls by the request's
/// deadline (and does: an answer later than the deadline is a timeout).
#[derive(Debug)]
struct BoundedRelay {
    relay: Relay,
    bounded: bool,
}

impl Store for BoundedRelay {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        // What is left of the deadline, read as the request arrives (the
        // test runs on tokio's paused clock: the wait is on tokio's timer).
        let left = request
            .deadline
            .instant()
            .map(|at| at.saturating_duration_since(std::time::Instant::now()));
        let answer = self.relay.decide(request);
        if !self.bounded {
            return answer;
        }
        Answer::pending(async move {
            let Some(left) = left else {
                return answer.await;
            };
            match tokio::time::timeout(left, answer).await {
                Ok(result) => result,
                Err(_) => Err(StoreError::Timeout(left)),
            }
        })
    }

    fn capabilities(&self) -> ratelimit_core::store::Capabilities {
        ratelimit_core::store::Capabilities::default().bounded(self.bounded)
    }
}

/// A store that bounds its own calls (`Capabilities::bounded`, as the
/// Redis stores do) gets no timer from the limiter; any other store's
/// pending call is raced against one. Either way a call past the deadline
/// is decided by the degraded mode.
#[tokio::test(start_paused = true)]
async fn the_limiter_arms_no_timer_for_a_store_that_bounds_its_calls() {
    for bounded in [false, true] {
        for (delay, answered) in [
            (Duration::from_millis(1), true),
            (Duration::from_secs(1), false),
        ] {
            let timer = CountingTimer::default();
            let store = Arc::new(BoundedRelay {
                relay: Relay::new(delay),
                bounded,
            });
            let l = Limiter::builder_arc(store)
                .quota(Quota::fixed_window(Rate::per_second(1_000_000)).unwrap())
                .failure_policy(FailurePolicy::FailClosed)
                .timer(timer.clone())
                .timeout(Duration::from_millis(20))
                .build()
                .unwrap();
            for i in 0..5 {
                let d = l.check(format!("c{i}")).await;
                let want = if answered {
                    Source::Store
                } else {
                    Source::FailClosed
                };
                assert_eq!(d.source, want, "bounded {bounded}, delay {delay:?}");
            }
            let sleeps = timer.0.load(Ordering::Relaxed);
            if bounded {
                assert_eq!(sleeps, 0, "a bounded store's calls need no timer");
            } else {
                assert_eq!(sleeps, 5, "one timer per pending call");
            }
        }
    }
}
