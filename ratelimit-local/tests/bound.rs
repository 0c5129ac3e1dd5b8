//! The bound on tracked callers: a flood of distinct keys costs at most the
//! bound; new callers beyond it are refused and answered by the limiter's
//! failure policy; no tracked caller is forgotten to make room.

use std::time::Duration;

use ratelimit_core::{
    FailurePolicy, Limiter, ManualClock, Quota, Rate, Source, StoreError, StoreExt,
};
use ratelimit_local::LocalStore;

const T0: u64 = 1_800_000_000_000_000;

#[tokio::test]
async fn a_flood_of_distinct_keys_is_bounded_and_no_caller_is_forgotten() {
    let clock = ManualClock::new(T0);
    let q = Quota::fixed_window(Rate::per_minute(1)).unwrap();
    let store = LocalStore::with_clock(clock.clone()).max_callers(1_000);
    for i in 0..100_000u32 {
        let _ = store.decide_one(format!("k{i}").as_bytes(), &q, 1).await;
    }
    assert_eq!(store.tracked(), 1_000);
    assert_eq!(store.len(), 1_000);
    assert_eq!(store.refused(), 99_000);
    // The first 1,000 are tracked and over their limit: still denied.
    for i in 0..1_000u32 {
        let d = store
            .decide_one(format!("k{i}").as_bytes(), &q, 1)
            .await
            .unwrap();
        assert!(!d.allowed, "caller {i} was forgotten and admitted again");
    }
    // A new caller is refused, with a reason that says what happened.
    match store.decide_one(b"newcomer", &q, 1).await {
        Err(StoreError::Unavailable { reason, .. }) => assert!(reason.contains("full"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // Several quotas: a request that would track a new entry is refused too.
    let day = Quota::fixed_window(Rate::per_day(5))
        .unwrap()
        .named("day")
        .unwrap();
    let charges = [
        ratelimit_core::Charge::new(&q, 1),
        ratelimit_core::Charge::new(&day, 1),
    ];
    assert!(store.decide_all(b"k1", &charges).await.is_err());
    // Once idle callers expire and are swept, room comes back.
    clock.advance(Duration::from_secs(120));
    store.sweep();
    assert_eq!(store.tracked(), 0);
    assert!(store.decide_one(b"newcomer", &q, 1).await.unwrap().allowed);
}

#[tokio::test]
async fn through_a_limiter_refused_callers_follow_the_failure_policy() {
    let clock = ManualClock::new(T0);
    let q = Quota::token_bucket(Rate::per_minute(10), 10).unwrap();
    for (policy, allowed, source) in [
        (None, false, Source::FailClosed),
        (Some(FailurePolicy::FailOpen), true, Source::FailOpen),
    ] {
        let mut b = Limiter::builder(LocalStore::with_clock(clock.clone()).max_callers(10))
            .quota(q.clone());
        if let Some(p) = policy {
            b = b.failure_policy(p);
        }
        let l = b.build().unwrap();
        for i in 0..10 {
            assert_eq!(l.check(format!("known-{i}")).await.source, Source::Store);
        }
        let d = l.check("stranger").await;
        assert_eq!((d.allowed, d.source), (allowed, source));
        assert_eq!(l.stats().errors, 1);
    }
}
