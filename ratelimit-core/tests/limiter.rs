//! The limiter turns every store failure into a decision under its policy.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratelimit_core::store::{Answer, Capabilities, Decisions, Request};
use ratelimit_core::{
    Clock, Decision, FailurePolicy, Limiter, ManualClock, Quota, Rate, Result, Source, Store,
    StoreError, model,
};

#[derive(Debug)]
enum Behaviour {
    Fail,
    Hang,
    Panic,
}

#[derive(Debug)]
struct Broken(Behaviour);

impl Store for Broken {
    fn decide<'a>(&'a self, _: Request<'a>) -> Answer<'a> {
        Answer::pending(async move {
            match self.0 {
                Behaviour::Fail => Err(StoreError::message("connection refused", true)),
                Behaviour::Hang => std::future::pending().await,
                Behaviour::Panic => panic!("store bug"),
            }
        })
    }
}

/// A model-backed store that records the keys it is asked about.
#[derive(Debug, Default)]
struct Recording {
    keys: std::sync::Mutex<Vec<Vec<u8>>>,
    state: std::sync::Mutex<std::collections::HashMap<(Vec<u8>, String), model::State>>,
    clock: ManualClock,
    calls: AtomicU64,
}

impl Recording {
    fn answer(&self, request: Request<'_>) -> Result<Decisions> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.keys.lock().unwrap().push(request.key.to_vec());
        let mut map = self.state.lock().unwrap();
        let mut out = Decisions::default();
        for c in request.charges {
            let k = (request.key.to_vec(), c.quota.name().to_owned());
            let step = model::decide(c.quota, map.remove(&k), self.clock.now(), c.cost)?;
            map.insert(k, step.state);
            out.push(step.decision);
        }
        Ok(out)
    }
}

impl Store for Recording {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        Answer::pending(async move { self.answer(request) })
    }
}

fn quota() -> Quota {
    Quota::sliding_window(Rate::per_minute(10)).unwrap()
}

/// The limiter's timeouts on tokio's timer, given explicitly: these tests
/// run without the `tokio` feature (whose default timer is the same).
#[derive(Debug)]
struct Sleeper;

impl ratelimit_core::Timer for Sleeper {
    fn sleep(&self, duration: Duration) -> ratelimit_core::Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}

fn limiter(store: impl Store + 'static, policy: FailurePolicy) -> Limiter {
    Limiter::builder(store)
        .timer(Sleeper)
        .quota(quota())
        .failure_policy(policy)
        .timeout(Duration::from_millis(20))
        .build()
        .unwrap()
}

#[tokio::test]
async fn store_errors_follow_the_policy() {
    let open = limiter(Broken(Behaviour::Fail), FailurePolicy::FailOpen);
    let d = open.check("a").await;
    assert!(d.allowed);
    assert_eq!(d.source, Source::FailOpen);
    assert_eq!(d.limit, 10);
    assert_eq!(open.stats().errors, 1);
    assert_eq!(open.stats().fail_open, 1);
    // Nothing is invented in the headers.
    let h = open.headers(&d);
    assert_eq!(h.get("X-RateLimit-Remaining"), None);
    assert_eq!(h.get("RateLimit"), None);
    assert_eq!(h.get("Retry-After"), None);
    assert_eq!(h.get("X-RateLimit-Limit"), Some("10"));

    let closed = limiter(Broken(Behaviour::Fail), FailurePolicy::FailClosed);
    let d = closed.check("a").await;
    assert!(!d.allowed);
    assert_eq!(d.source, Source::FailClosed);
    assert_eq!(d.retry_after, None);
    assert_eq!(closed.stats().fail_closed, 1);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_store_times_out() {
    let l = limiter(Broken(Behaviour::Hang), FailurePolicy::FailClosed);
    let start = tokio::time::Instant::now();
    let d = l.check("a").await;
    assert_eq!(start.elapsed(), Duration::from_millis(20));
    assert_eq!(d.source, Source::FailClosed);
    assert_eq!(l.stats().timeouts, 1);
    assert_eq!(l.stats().errors, 0);
}

#[tokio::test]
async fn a_panicking_store_does_not_panic_the_request() {
    let l = limiter(Broken(Behaviour::Panic), FailurePolicy::FailOpen);
    let d = l.check("a").await;
    assert_eq!(d.source, Source::FailOpen);
    assert_eq!(l.stats().errors, 1);
}

#[tokio::test]
async fn costs_that_can_never_pass_are_errors_before_the_store() {
    let store = Arc::new(Recording::default());
    let l = Limiter::builder_arc(store.clone())
        .timer(Sleeper)
        .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
        .quota(quota())
        .build()
        .unwrap();
    assert!(l.check_n("a", 11).await.is_err());
    assert!(l.check_n("a", 0).await.is_err());
    assert_eq!(store.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn namespaces_prefix_keys_and_are_validated() {
    let store = Arc::new(Recording::default());
    let l = Limiter::builder_arc(store.clone())
        .timer(Sleeper)
        .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
        .quota(quota())
        .namespace("api")
        .unwrap()
        .build()
        .unwrap();
    l.check(b"\xffcaller").await;
    assert_eq!(store.keys.lock().unwrap()[0], b"api~\xffcaller");
    assert!(
        Limiter::builder_arc(store.clone())
            .timer(Sleeper)
            .namespace("a:b")
            .is_err()
    );
    assert!(Limiter::builder_arc(store.clone()).namespace("").is_err());
    assert!(
        Limiter::builder_arc(store)
            .timer(Sleeper)
            .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
            .build()
            .is_err(),
        "no quota"
    );
}

#[tokio::test]
async fn several_quotas_return_the_first_denial_or_the_tightest() {
    let store = Arc::new(Recording::default());
    let burst = Quota::fixed_window(Rate::per_second(2))
        .unwrap()
        .named("burst")
        .unwrap();
    let hourly = Quota::sliding_log(Rate::per_hour(5))
        .unwrap()
        .named("hourly")
        .unwrap();
    let l = Limiter::builder_arc(store)
        .timer(Sleeper)
        .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
        .quota(burst)
        .quota(hourly)
        .build()
        .unwrap();
    let a = l.check("c").await;
    assert!(a.allowed);
    assert_eq!(a.remaining, 1, "the per-second quota is the tighter one");
    l.check("c").await;
    let denied = l.check("c").await;
    assert!(!denied.allowed);
    assert_eq!(denied.limit, 2);
    assert_eq!(l.stats().denied, 1);
}

#[tokio::test]
async fn long_callers_are_namespaced_too() {
    let store = Arc::new(Recording::default());
    let l = Limiter::builder_arc(store.clone())
        .timer(Sleeper)
        .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
        .quota(quota())
        .namespace("ns")
        .unwrap()
        .build()
        .unwrap();
    for n in [0usize, 124, 125, 126, 1000] {
        let caller = vec![b'x'; n];
        l.check(&caller).await;
        let mut want = b"ns~".to_vec();
        want.extend_from_slice(&caller);
        assert_eq!(
            store.keys.lock().unwrap().last().unwrap(),
            &want,
            "caller of {n} bytes"
        );
    }
}

/// [`Recording`], answering in place: a plain limiter decides with it
/// without a future.
#[derive(Debug, Default)]
struct InPlaceRecording(Recording);

impl Store for InPlaceRecording {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        match self.0.answer(request).map(Decisions::into_single) {
            Ok(Ok(d)) => Answer::decided(d),
            Ok(Err(ds)) => Answer::ready(Ok(ds)),
            Err(e) => Answer::ready(Err(e)),
        }
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().in_process(true)
    }
}

/// The key a check decided in place builds (in a short buffer, word by
/// word) is exactly `namespace ~ caller`, for namespaces and callers of
/// every length around the buffer's bounds, and every decision is counted.
#[tokio::test]
async fn keys_built_in_place_are_the_namespace_and_the_caller() {
    let lengths = [
        0usize, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 80, 81, 95,
        96, 97, 200,
    ];
    for ns_len in [1usize, 2, 14, 15, 16, 17, 63, 64] {
        let namespace: String = (0..ns_len)
            .map(|i| (b'a' + (i % 26) as u8) as char)
            .collect();
        let store = Arc::new(InPlaceRecording::default());
        let l = Limiter::builder_arc(store.clone())
            .timer(Sleeper)
            .quota(quota())
            .namespace(&namespace)
            .unwrap()
            .build()
            .unwrap();
        for &n in &lengths {
            let caller: Vec<u8> = (0..n).map(|i| b'A' + (i % 26) as u8).collect();
            let mut want = namespace.as_bytes().to_vec();
            want.push(b'~');
            want.extend_from_slice(&caller);
            // Keys of up to 96 bytes are built without an allocation and
            // decided in place; longer ones are owned by a future.
            let d = match l.check(&caller).into_ready() {
                Ok(d) => d,
                Err(pending) => {
                    assert!(want.len() > 96, "{} bytes decided later", want.len());
                    pending.await
                }
            };
            assert!(d.allowed && d.is_from_store());
            assert_eq!(
                store.0.keys.lock().unwrap().last().unwrap(),
                &want,
                "namespace of {ns_len} bytes, caller of {n}"
            );
        }
        assert_eq!(l.stats().allowed, lengths.len() as u64);
    }
}

/// A store that answers in place: its answer is taken without polling.
#[derive(Debug)]
struct SyncOnly;

impl Store for SyncOnly {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        let quota = request.charges[0].quota;
        Answer::ready(Ok(Decisions::one(Decision::from_store(
            true,
            quota.limit(),
            1,
            0,
            None,
        ))))
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().in_process(true)
    }
}

#[tokio::test]
async fn a_store_answering_in_place_is_decided_when_check_is_called() {
    let limiter = limiter(SyncOnly, FailurePolicy::FailClosed);
    let d = limiter
        .check("k")
        .into_ready()
        .expect("decided in place: no future to poll");
    assert!(d.allowed && d.is_from_store());
    assert_eq!(limiter.stats().allowed, 1);
}

/// Fails or panics in place, as a buggy in-process store would; `Hang`
/// answers pending although it says it answers in process.
#[derive(Debug)]
struct SyncBroken(Behaviour);

impl Store for SyncBroken {
    fn decide<'a>(&'a self, _: Request<'a>) -> Answer<'a> {
        match self.0 {
            Behaviour::Fail => Answer::ready(Err(StoreError::message("connection refused", true))),
            Behaviour::Hang => Answer::pending(std::future::pending()),
            Behaviour::Panic => panic!("store bug"),
        }
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().in_process(true)
    }
}

#[tokio::test]
async fn synchronous_store_failures_follow_the_policy_too() {
    for policy in [FailurePolicy::FailOpen, FailurePolicy::FailClosed] {
        let want = match policy {
            FailurePolicy::FailOpen => Source::FailOpen,
            FailurePolicy::FailClosed => Source::FailClosed,
        };
        let l = limiter(SyncBroken(Behaviour::Fail), policy);
        assert_eq!(l.check("a").await.source, want);
        assert_eq!(l.check_n("a", 2).await.unwrap().source, want);
        let s = l.stats();
        assert_eq!((s.errors, s.fail_open + s.fail_closed), (2, 2));
        let l = limiter(SyncBroken(Behaviour::Panic), policy);
        assert_eq!(l.check("a").await.source, want);
        assert_eq!(l.stats().errors, 1);
    }
}
