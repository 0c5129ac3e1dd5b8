//! A denial answered from the deny cache carries the same response fields
//! as the store's denial at the same instant: `Retry-After`,
//! `X-RateLimit-*`, `RateLimit-Policy` and `RateLimit`, for one quota and
//! for several. Time is a `ManualClock` shared by the limiter and the store.

#![cfg(all(feature = "tokio", feature = "deny-cache"))]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::ModelStore;
use ratelimit_core::{
    DenyCache, FailurePolicy, Limiter, ManualClock, Micros, Quota, Rate, RateLimitHeaders, Source,
};

const T0: Micros = 1_800_000_000_000_000 + 12_345_678;

fn limiter(store: &Arc<ModelStore>, quotas: &[Quota], cache: bool) -> Limiter {
    let mut b = Limiter::builder_arc(store.clone()).failure_policy(FailurePolicy::FailClosed);
    for q in quotas {
        b = b.quota(q.clone());
    }
    if cache {
        b = b.deny_cache(DenyCache::new(1_000));
    }
    b.build().unwrap()
}

fn fields(h: &RateLimitHeaders) -> Vec<(String, String)> {
    h.iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

const NAMES: [&str; 6] = [
    "Retry-After",
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
    "RateLimit-Policy",
    "RateLimit",
];

/// Denied by the store, then answered from the cache at several later
/// instants: each time the same fields, with the same values, as the store's
/// own denial at that instant (a second limiter without a cache over the
/// same store).
#[tokio::test]
async fn a_cached_denial_carries_every_field_of_a_store_denial() {
    let quotas = [
        Quota::fixed_window(Rate::per_minute(3)).unwrap(),
        Quota::sliding_window(Rate::per_minute(3)).unwrap(),
        Quota::sliding_log(Rate::per_minute(3)).unwrap(),
        Quota::token_bucket(Rate::per_minute(100), 3).unwrap(),
    ];
    for quota in quotas {
        let name = quota.kind().to_string();
        let clock = ManualClock::new(T0);
        let store = Arc::new(ModelStore::new(clock.clone()));
        let cached = limiter(&store, std::slice::from_ref(&quota), true);
        let exact = limiter(&store, std::slice::from_ref(&quota), false);
        for _ in 0..3 {
            assert!(cached.check("c").await.allowed, "{name}");
            clock.advance(Duration::from_millis(7));
        }
        let d = cached.check("c").await;
        assert_eq!((d.allowed, d.source), (false, Source::Store), "{name}");
        let wait = d.retry_after.unwrap();
        let store_fields = fields(&cached.headers(&d));
        let names: Vec<&str> = store_fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, NAMES, "{name}: a store denial's fields");
        // Later instants while the denial holds: a tenth, half and all but
        // a microsecond of the wait.
        let steps = [
            wait / 10,
            wait / 2 - wait / 10,
            wait - wait / 2 - Duration::from_micros(1),
        ];
        for step in steps {
            clock.advance(step);
            let calls = store.calls();
            let from_cache = cached.check("c").await;
            assert_eq!(
                (from_cache.allowed, from_cache.source),
                (false, Source::Cache),
                "{name}"
            );
            assert_eq!(store.calls(), calls, "{name}: answered without the store");
            let from_store = exact.check("c").await;
            assert_eq!(from_store.source, Source::Store, "{name}");
            assert_eq!(
                fields(&cached.headers(&from_cache)),
                fields(&exact.headers(&from_store)),
                "{name}: at {step:?} more, the cached denial's fields differ from the store's"
            );
            assert_eq!(from_cache.remaining, from_store.remaining, "{name}");
            assert_eq!(from_cache.reset_after, from_store.reset_after, "{name}");
            assert_eq!(from_cache.retry_after, from_store.retry_after, "{name}");
        }
    }
}

/// Several quotas: a caller over its daily quota. Every cached 429 lists
/// both policies in `RateLimit`, with the per-second bucket refilling and
/// the daily reset counting down, exactly as the store's verdict does.
#[tokio::test]
async fn a_cached_verdict_lists_every_policy() {
    let second = Quota::token_bucket(Rate::per_second(10), 10)
        .unwrap()
        .named("second")
        .unwrap();
    let day = Quota::fixed_window(Rate::per_day(15))
        .unwrap()
        .named("day")
        .unwrap();
    let quotas = [second, day];
    let clock = ManualClock::new(T0);
    let store = Arc::new(ModelStore::new(clock.clone()));
    let cached = limiter(&store, &quotas, true);
    let exact = limiter(&store, &quotas, false);
    for _ in 0..10 {
        assert!(cached.check("c").await.allowed);
    }
    clock.advance(Duration::from_secs(1));
    for _ in 0..5 {
        assert!(cached.check("c").await.allowed);
    }
    // The day is spent; the bucket has 5 of 10 tokens.
    let v = cached.check_all("c", 1).await.unwrap();
    assert!(!v.allowed());
    assert_eq!(v.decision.source, Source::Store);
    let h = cached.headers_all(&v);
    let state = h.get("RateLimit").unwrap();
    assert!(
        state.starts_with("\"second\";r=5;t=1, \"day\";r=0;t="),
        "{state}"
    );
    // 0.25 s later (2 tokens back), 0.25 s after that (bucket full: its
    // reset has passed), and an hour later.
    for step in [250, 250, 3_600_000] {
        clock.advance(Duration::from_millis(step));
        let calls = store.calls();
        let from_cache = cached.check_all("c", 1).await.unwrap();
        assert_eq!(from_cache.decision.source, Source::Cache);
        assert_eq!(store.calls(), calls, "answered without the store");
        let from_store = exact.check_all("c", 1).await.unwrap();
        assert_eq!(from_store.decision.source, Source::Store);
        assert_eq!(
            fields(&cached.headers_all(&from_cache)),
            fields(&exact.headers_all(&from_store)),
            "{step} ms later"
        );
        assert_eq!(from_cache.binding, from_store.binding);
        for (a, b) in from_cache.quotas.iter().zip(&from_store.quotas) {
            assert_eq!(
                (a.allowed, a.remaining, a.reset_after),
                (b.allowed, b.remaining, b.reset_after),
                "{step} ms later"
            );
        }
    }
    let h = cached.headers_all(&cached.check_all("c", 1).await.unwrap());
    let names: Vec<&str> = h.iter().map(|(k, _)| k).collect();
    assert_eq!(names, NAMES);
    // A full bucket: 10 left; its `t` counts the denied call as the
    // store's verdict does (0.1 s, rounded up).
    assert!(
        h.get("RateLimit")
            .unwrap()
            .starts_with("\"second\";r=10;t=1, \"day\";r=0;t="),
        "{:?}",
        h.get("RateLimit")
    );
}
