//! The limiter's production controls: several quotas all or nothing, the
//! circuit breaker, the fallback store, shadow quotas, the deny cache and
//! `acquire`. Time is a `ManualClock` or tokio's paused clock.

#![cfg(feature = "tokio")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::ModelStore;
use ratelimit_core::{
    AcquireError, BreakerState, CircuitBreaker, Clock, FailurePolicy, Limiter, ManualClock, Micros,
    Quota, Rate, Source,
};

const T0: Micros = 1_800_000_000_000_000;

fn named(q: Quota, name: &str) -> Quota {
    q.named(name).unwrap()
}

fn per_second_and_day() -> (Quota, Quota) {
    (
        named(
            Quota::token_bucket(Rate::per_second(10), 10).unwrap(),
            "second",
        ),
        named(Quota::fixed_window(Rate::per_day(15)).unwrap(), "day"),
    )
}

#[tokio::test]
async fn a_caller_over_its_daily_quota_keeps_its_per_second_tokens() {
    let clock = ManualClock::new(T0);
    let store = Arc::new(ModelStore::new(clock.clone()));
    let (second, day) = per_second_and_day();
    let l = Limiter::builder_arc(store.clone())
        .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
        .quota(second)
        .quota(day)
        .build()
        .unwrap();
    // 10 now (the bucket is empty), 5 one second later: the day is used up.
    for _ in 0..10 {
        assert!(l.check("c").await.allowed);
    }
    clock.advance(Duration::from_secs(1));
    for _ in 0..5 {
        assert!(l.check("c").await.allowed);
    }
    clock.advance(Duration::from_secs(1));
    let v = l.check_all("c", 1).await.unwrap();
    assert!(!v.allowed());
    assert_eq!(v.binding, 1, "the daily quota binds");
    assert_eq!(l.quotas()[v.binding].name(), "day");
    // The per-second quota was not charged: it still has its full bucket.
    assert!(v.quotas[0].allowed);
    assert_eq!(v.quotas[0].remaining, 10);
    // Repeated denials never touch the per-second tokens.
    for _ in 0..20 {
        assert!(!l.check("c").await.allowed);
    }
    let v = l.check_all("c", 1).await.unwrap();
    assert_eq!(v.quotas[0].remaining, 10);
    // retry_after is the time until *every* quota admits: the next day.
    let until_tomorrow = 86_400_000_000 - (clock.now() % 86_400_000_000);
    assert_eq!(
        v.decision.retry_after,
        Some(Duration::from_micros(until_tomorrow))
    );
    // Headers: every policy listed, X-RateLimit-* and Retry-After from the binding one.
    let h = l.headers_all(&v);
    assert_eq!(
        h.get("RateLimit-Policy"),
        Some("\"second\";q=10;w=1, \"day\";q=15;w=86400")
    );
    assert!(h.get("RateLimit").unwrap().contains("\"second\";r=10"));
    assert_eq!(h.get("X-RateLimit-Limit"), Some("15"));
    assert_eq!(h.get("X-RateLimit-Remaining"), Some("0"));
    // One store call per decision, whatever the number of quotas.
    assert_eq!(store.calls(), 10 + 5 + 1 + 20 + 1);
}

#[tokio::test]
async fn per_quota_costs_and_the_tightest_quota_binds_an_admission() {
    let clock = ManualClock::new(T0);
    let store = Arc::new(ModelStore::new(clock.clone()));
    let requests = named(
        Quota::sliding_window(Rate::per_minute(100)).unwrap(),
        "requests",
    );
    let bytes = named(
        Quota::sliding_window(Rate::per_minute(10_000)).unwrap(),
        "bytes",
    );
    let l = Limiter::builder_arc(store)
        .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
        .quota(requests)
        .quota(bytes)
        .build()
        .unwrap();
    let v = l.check_costs("c", &[1, 9_000]).await.unwrap();
    assert!(v.allowed());
    assert_eq!(v.binding, 1, "1,000 bytes left is tighter than 99 requests");
    assert_eq!(v.decision.remaining, 1_000);
    let v = l.check_costs("c", &[1, 2_000]).await.unwrap();
    assert!(!v.allowed());
    assert_eq!(
        v.quotas[0].remaining, 99,
        "the denied call is not counted as a request"
    );
    assert!(
        l.check_costs("c", &[1]).await.is_err(),
        "one cost per quota"
    );
    assert!(l.check_costs("c", &[1, 10_001]).await.is_err());
}

#[tokio::test]
async fn duplicate_policies_are_refused() {
    let store = ModelStore::new(ManualClock::new(T0));
    let q = Quota::fixed_window(Rate::per_second(1)).unwrap();
    assert!(
        Limiter::builder(store)
            .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
            .quota(q.clone())
            .quota(q)
            .build()
            .is_err()
    );
}

fn breaker_limiter(store: Arc<ModelStore>, clock: &ManualClock) -> Limiter {
    Limiter::builder_arc(store)
        .quota(Quota::sliding_window(Rate::per_minute(100)).unwrap())
        .failure_policy(FailurePolicy::FailClosed)
        .circuit_breaker(CircuitBreaker::new(
            Duration::from_secs(60),
            3,
            50,
            Duration::from_secs(1),
        ))
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_breaker_stops_calling_a_dead_store_and_probes_it_back() {
    the_breaker_stops_calling_a_dead_store_and_probes_it_back_case(false).await;
}

/// An in-process store is never unavailable (its failures are bugs or bad
/// input): its limiter keeps no breaker, and every call reaches it.
#[tokio::test]
async fn an_in_process_store_has_no_breaker() {
    let clock = ManualClock::new(T0);
    let store = Arc::new(ModelStore::with_sync(clock.clone(), true));
    let l = breaker_limiter(store.clone(), &clock);
    assert_eq!(l.breaker_state(), None);
    store.set_down(true);
    for _ in 0..10 {
        assert_eq!(l.check("c").await.source, Source::FailClosed);
    }
    assert_eq!(store.calls(), 10);
}

async fn the_breaker_stops_calling_a_dead_store_and_probes_it_back_case(sync: bool) {
    let clock = ManualClock::new(T0);
    let store = Arc::new(ModelStore::with_sync(clock.clone(), sync));
    let l = breaker_limiter(store.clone(), &clock);
    store.set_down(true);
    for _ in 0..3 {
        assert_eq!(l.check("c").await.source, Source::FailClosed);
    }
    assert_eq!(store.calls(), 3);
    assert_eq!(l.breaker_state(), Some(BreakerState::Open));
    // Open: answered by the policy without calling the store.
    for _ in 0..100 {
        assert_eq!(l.check("c").await.source, Source::FailClosed);
    }
    assert_eq!(store.calls(), 3);
    assert_eq!(l.stats().short_circuits, 100);
    // After the cool-down one probe goes through; it fails: open again.
    clock.advance(Duration::from_secs(1));
    assert_eq!(l.breaker_state(), Some(BreakerState::HalfOpen));
    l.check("c").await;
    assert_eq!(store.calls(), 4);
    assert_eq!(l.breaker_state(), Some(BreakerState::Open));
    l.check("c").await;
    assert_eq!(store.calls(), 4);
    // The store is back: the next probe closes the breaker.
    store.set_down(false);
    clock.advance(Duration::from_secs(1));
    let d = l.check("c").await;
    assert_eq!(d.source, Source::Store);
    assert_eq!(l.breaker_state(), Some(BreakerState::Closed));
    l.check("c").await;
    assert_eq!(store.calls(), 6);
}

#[derive(Debug)]
struct Hanging;

impl ratelimit_core::Store for Hanging {
    fn decide<'a>(
        &'a self,
        _: ratelimit_core::store::Request<'a>,
    ) -> ratelimit_core::store::Answer<'a> {
        ratelimit_core::store::Answer::pending(std::future::pending())
    }
}

#[tokio::test(start_paused = true)]
async fn with_the_breaker_open_a_hanging_store_costs_no_time() {
    let clock = ManualClock::new(T0);
    let l = Limiter::builder(Hanging)
        .quota(Quota::fixed_window(Rate::per_second(5)).unwrap())
        .failure_policy(FailurePolicy::FailOpen)
        .circuit_breaker(CircuitBreaker::new(
            Duration::from_secs(60),
            2,
            50,
            Duration::from_secs(5),
        ))
        .timeout(Duration::from_millis(20))
        .clock(clock.clone())
        .build()
        .unwrap();
    let start = tokio::time::Instant::now();
    l.check("a").await;
    l.check("a").await;
    assert_eq!(start.elapsed(), Duration::from_millis(40));
    let open = tokio::time::Instant::now();
    for _ in 0..1000 {
        assert_eq!(l.check("a").await.source, Source::FailOpen);
    }
    assert_eq!(open.elapsed(), Duration::ZERO);
    assert_eq!(l.stats().timeouts, 2);
}

/// Fails while `hang` is off, hangs while it is on.
#[derive(Debug, Default)]
struct FailThenHang {
    hang: std::sync::atomic::AtomicBool,
    calls: std::sync::atomic::AtomicU64,
}

impl ratelimit_core::Store for FailThenHang {
    fn decide<'a>(
        &'a self,
        _: ratelimit_core::store::Request<'a>,
    ) -> ratelimit_core::store::Answer<'a> {
        ratelimit_core::store::Answer::pending(async move {
            use std::sync::atomic::Ordering::SeqCst;
            self.calls.fetch_add(1, SeqCst);
            if self.hang.load(SeqCst) {
                std::future::pending().await
            } else {
                Err(ratelimit_core::StoreError::message("refused", true))
            }
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_probe_does_not_keep_the_breaker_open() {
    use std::sync::atomic::Ordering::SeqCst;
    let clock = ManualClock::new(T0);
    let store = Arc::new(FailThenHang::default());
    let l = Limiter::builder_arc(store.clone())
        .quota(Quota::fixed_window(Rate::per_second(5)).unwrap())
        .failure_policy(FailurePolicy::FailOpen)
        .circuit_breaker(CircuitBreaker::new(
            Duration::from_secs(60),
            1,
            50,
            Duration::from_secs(1),
        ))
        .timeout(Duration::from_secs(3600))
        .clock(clock.clone())
        .build()
        .unwrap();
    l.check("a").await;
    assert_eq!(l.breaker_state(), Some(BreakerState::Open));
    store.hang.store(true, SeqCst);
    clock.advance(Duration::from_secs(1));
    // The probe hangs and its caller gives up.
    let probe = tokio::time::timeout(Duration::from_millis(1), l.check("a")).await;
    assert!(probe.is_err());
    assert_eq!(store.calls.load(SeqCst), 2);
    // The next call probes again: the cancelled probe freed its slot.
    let again = tokio::time::timeout(Duration::from_millis(1), l.check("a")).await;
    assert!(again.is_err());
    assert_eq!(store.calls.load(SeqCst), 3);
}

#[tokio::test]
async fn the_fallback_store_decides_at_a_fraction_of_each_limit() {
    // The async path, and the synchronous one an in-process store takes.
    for sync in [false, true] {
        the_fallback_store_decides_at_a_fraction_of_each_limit_case(sync).await;
    }
}

async fn the_fallback_store_decides_at_a_fraction_of_each_limit_case(sync: bool) {
    let clock = ManualClock::new(T0);
    let shared = Arc::new(ModelStore::with_sync(clock.clone(), sync));
    let local = ModelStore::with_sync(clock.clone(), sync);
    let plan = named(Quota::sliding_window(Rate::per_minute(100)).unwrap(), "api");
    let l = Limiter::builder_arc(shared.clone())
        .quota(plan)
        .fallback(local, 4)
        .failure_policy(FailurePolicy::FailClosed)
        .build()
        .unwrap();
    shared.set_down(true);
    let mut admitted = 0;
    for _ in 0..40 {
        let d = l.check("c").await;
        assert_eq!(d.source, Source::Fallback);
        assert_eq!(d.limit, 25);
        admitted += u64::from(d.allowed);
    }
    assert_eq!(admitted, 25, "100 divided among 4 instances");
    let d = l.check("c").await;
    let h = l.headers(&d);
    assert_eq!(h.get("X-RateLimit-Limit"), Some("25"));
    assert_eq!(h.get("X-RateLimit-Remaining"), Some("0"));
    assert!(h.get("Retry-After").is_some());
    assert_eq!(l.stats().fallback, 41);
}

#[tokio::test]
async fn shadow_quotas_count_but_never_deny() {
    // The async path, and the synchronous one an in-process store takes.
    for sync in [false, true] {
        shadow_quotas_count_but_never_deny_case(sync).await;
    }
}

async fn shadow_quotas_count_but_never_deny_case(sync: bool) {
    let clock = ManualClock::new(T0);
    let store = Arc::new(ModelStore::with_sync(clock.clone(), sync));
    let enforced = named(
        Quota::fixed_window(Rate::per_minute(10)).unwrap(),
        "current",
    );
    let candidate = named(Quota::fixed_window(Rate::per_minute(2)).unwrap(), "new");
    let l = Limiter::builder_arc(store.clone())
        .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
        .quota(enforced)
        .shadow_quota(candidate)
        .build()
        .unwrap();
    let mut sources = Vec::new();
    for _ in 0..10 {
        let v = l.check_all("c", 1).await.unwrap();
        assert!(v.allowed());
        sources.push(v.decision.source);
        let h = l.headers_all(&v);
        assert!(
            h.iter().all(|(_, value)| !value.contains("\"new\"")),
            "{h:?}"
        );
        assert_eq!(h.get("Retry-After"), None);
    }
    assert_eq!(&sources[..2], &[Source::Store, Source::Store]);
    assert!(sources[2..].iter().all(|s| *s == Source::Shadow));
    assert_eq!(l.stats().shadow_denials, 8);
    // The enforced quota is exhausted: denied, shadow or not.
    assert!(!l.check("c").await.allowed);

    // A limiter whose only quota is in shadow mode admits everything and
    // sends no headers.
    let only = Limiter::builder_arc(store)
        .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
        .shadow_quota(named(
            Quota::fixed_window(Rate::per_minute(1)).unwrap(),
            "trial",
        ))
        .namespace("other")
        .unwrap()
        .build()
        .unwrap();
    only.check("c").await;
    let d = only.check("c").await;
    assert!(d.allowed);
    assert_eq!(d.source, Source::Shadow);
    assert_eq!(d.retry_after, None);
    assert_eq!(only.headers(&d).iter().count(), 0);
}

/// A tiny deterministic generator for replayed traffic.
#[cfg(feature = "deny-cache")]
struct Rng(u64);

#[cfg(feature = "deny-cache")]
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[cfg(feature = "deny-cache")]
fn all_algorithms(limit: u64, burst: u64) -> Vec<Quota> {
    let rate = Rate::new(limit, Duration::from_secs(10));
    vec![
        named(Quota::fixed_window(rate).unwrap(), "fw"),
        named(Quota::sliding_window(rate).unwrap(), "sw"),
        named(Quota::sliding_log(rate).unwrap(), "sl"),
        named(Quota::token_bucket(rate, burst).unwrap(), "tb"),
    ]
}

/// Replays the same traffic through a limiter with the deny cache and one
/// without, each over its own store on the same clock: the admitted calls
/// must be identical, call for call.
#[cfg(feature = "deny-cache")]
async fn replay(quotas: Vec<Quota>, seed: u64) -> (u64, u64, u64) {
    use ratelimit_core::DenyCache;
    let clock = ManualClock::new(T0);
    // The limiter without the cache takes the async path; the one with it,
    // on odd seeds, the synchronous one.
    let plain_store = Arc::new(ModelStore::new(clock.clone()));
    let cached_store = Arc::new(ModelStore::with_sync(clock.clone(), seed % 2 == 1));
    let build = |store: Arc<ModelStore>, cache: bool| {
        let mut b = Limiter::builder_arc(store).failure_policy(FailurePolicy::FailClosed);
        for q in &quotas {
            b = b.quota(q.clone());
        }
        if cache {
            b = b.deny_cache(DenyCache::new(1_000));
        }
        b.build().unwrap()
    };
    let plain = build(plain_store.clone(), false);
    let cached = build(cached_store.clone(), true);
    let mut rng = Rng(seed | 1);
    let max_cost = quotas.iter().map(Quota::limit).min().unwrap();
    let mut admitted = 0;
    for i in 0..600 {
        clock.advance(Duration::from_micros(match rng.below(10) {
            0..=5 => 0,
            6..=8 => rng.below(200_000),
            _ => rng.below(5_000_000),
        }));
        let caller = format!("c{}", rng.below(3));
        let costs: Vec<u64> = quotas
            .iter()
            .map(|_| {
                if rng.below(3) == 0 {
                    1 + rng.below(max_cost)
                } else {
                    1
                }
            })
            .collect();
        let a = plain.check_costs(&caller, &costs).await.unwrap();
        let b = cached.check_costs(&caller, &costs).await.unwrap();
        assert_eq!(
            a.allowed(),
            b.allowed(),
            "call #{i} ({caller}, costs {costs:?}, seed {seed}): without the cache {:?}, with it {:?}",
            a.decision,
            b.decision
        );
        if b.decision.source == Source::Cache {
            // Never longer than the exact wait (here: equal, one clock).
            assert!(b.decision.retry_after <= a.decision.retry_after);
        }
        admitted += u64::from(a.allowed());
    }
    (
        admitted,
        plain_store.calls() - cached_store.calls(),
        cached.stats().cache_hits,
    )
}

#[cfg(feature = "deny-cache")]
#[tokio::test]
async fn the_deny_cache_never_changes_what_is_admitted() {
    let mut saved = 0;
    for seed in 1..=20u64 {
        for q in all_algorithms(5 + seed % 7, 3 + seed % 5) {
            let (admitted, calls_saved, hits) = replay(vec![q], seed).await;
            assert!(admitted > 0);
            assert_eq!(calls_saved, hits);
            saved += calls_saved;
        }
        // Several quotas, mixed algorithms, costs per quota.
        let qs = all_algorithms(8, 4);
        let pair = vec![
            qs[(seed % 4) as usize].clone(),
            qs[((seed + 1) % 4) as usize].clone(),
        ];
        replay(pair, seed).await;
        replay(qs, seed).await;
    }
    assert!(saved > 1_000, "the cache answered {saved} calls");
}

#[cfg(feature = "deny-cache")]
#[tokio::test]
async fn the_deny_cache_sends_smaller_costs_to_the_store() {
    // The async path, and the synchronous one an in-process store takes.
    for sync in [false, true] {
        the_deny_cache_sends_smaller_costs_to_the_store_case(sync).await;
    }
}

#[cfg(feature = "deny-cache")]
async fn the_deny_cache_sends_smaller_costs_to_the_store_case(sync: bool) {
    use ratelimit_core::DenyCache;
    let clock = ManualClock::new(T0);
    let store = Arc::new(ModelStore::with_sync(clock.clone(), sync));
    let l = Limiter::builder_arc(store.clone())
        .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
        .quota(Quota::token_bucket(Rate::per_second(1), 10).unwrap())
        .deny_cache(DenyCache::new(100))
        .build()
        .unwrap();
    assert!(l.check_n("c", 6).await.unwrap().allowed);
    // 4 tokens left: a cost of 5 is denied, and then answered from the cache...
    assert!(!l.check_n("c", 5).await.unwrap().allowed);
    let calls = store.calls();
    let d = l.check_n("c", 7).await.unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Cache));
    assert_eq!(store.calls(), calls);
    // ...but a cost of 1 may pass, so it goes to the store, and passes.
    let d = l.check_n("c", 1).await.unwrap();
    assert_eq!((d.allowed, d.source), (true, Source::Store));
    // Once the retry_after has passed, the store decides again.
    clock.advance(Duration::from_secs(2));
    let d = l.check_n("c", 5).await.unwrap();
    assert_eq!(d.source, Source::Store);
}

/// A clock that reads tokio's (paused) time, so that sleeping moves it.
#[derive(Debug, Clone)]
struct TokioClock(tokio::time::Instant);

impl Clock for TokioClock {
    fn now(&self) -> Micros {
        T0 + u64::try_from(self.0.elapsed().as_micros()).unwrap()
    }
}

#[tokio::test(start_paused = true)]
async fn acquire_waits_for_the_shared_quota() {
    let clock = TokioClock(tokio::time::Instant::now());
    let store = Arc::new(ModelStore::new(clock.clone()));
    let quota = Quota::token_bucket(Rate::per_second(10), 1).unwrap();
    let l = Limiter::builder_arc(store)
        .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
        .quota(quota)
        .build()
        .unwrap();
    let start = clock.now();
    let mut times = Vec::new();
    for _ in 0..20 {
        l.acquire("worker", 1, Duration::from_secs(5))
            .await
            .unwrap();
        times.push(clock.now() - start);
    }
    // Never faster than the quota: one token every 100 ms after the first.
    for w in times.windows(2) {
        assert!(w[1] - w[0] >= 100_000, "{times:?}");
    }
    // And not much slower: jitter adds at most a quarter of each wait.
    assert!(times[19] <= 19 * 125_000, "{times:?}");

    // A deadline shorter than the wait: a clear error, and no waiting past it.
    let before = clock.now();
    let err = l
        .acquire("worker", 1, Duration::from_millis(10))
        .await
        .unwrap_err();
    assert!(
        matches!(err, AcquireError::Deadline { next: Some(_), .. }),
        "{err}"
    );
    assert!(clock.now() - before <= 10_000);
}

#[tokio::test(start_paused = true)]
async fn acquire_is_cancel_safe_and_counts_only_what_it_gets() {
    let clock = TokioClock(tokio::time::Instant::now());
    let store = Arc::new(ModelStore::new(clock.clone()));
    let l = Limiter::builder_arc(store)
        .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
        .quota(Quota::fixed_window(Rate::per_second(2)).unwrap())
        .build()
        .unwrap();
    l.check("w").await;
    l.check("w").await;
    // Cancelled while waiting for the next window.
    let r = tokio::time::timeout(
        Duration::from_millis(100),
        l.acquire("w", 1, Duration::from_secs(10)),
    )
    .await;
    assert!(r.is_err());
    // Nothing was counted by the cancelled wait: the next window has both.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(l.check("w").await.allowed);
    assert!(l.check("w").await.allowed);
}
