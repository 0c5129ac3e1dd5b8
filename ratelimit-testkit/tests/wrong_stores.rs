//! The suite must prove it can fail: the public corpus of deliberately
//! wrong stores ([`ratelimit_testkit::wrong`]), one class of mistake each,
//! every one rejected with the contract that catches it named and the
//! failing sequence shown.
//!
//! Every wrong store is the correct model behind the one door with one
//! flaw, so a rejection can only come from that flaw. The suite's seed is
//! fixed, so each rejection below is deterministic, except the races
//! (contract 9), which are sized so that they are hit in every run (see
//! `racy_store_is_rejected` and `racy_sets_are_rejected`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ratelimit_core::{ManualClock, Store};
use ratelimit_testkit::conformance::{self, Contract, StoreFactory, SuiteConfig, Violation};
use ratelimit_testkit::wrong::{Flaw, WrongFactory as Factory};

fn config() -> SuiteConfig {
    SuiteConfig {
        concurrency_duration: Duration::from_millis(500),
        ..SuiteConfig::in_process()
    }
}

fn assert_rejected(result: std::result::Result<(), Violation>, contract: Contract) -> Violation {
    let v = result.expect_err("the suite accepted a wrong store");
    assert_eq!(v.contract, contract, "wrong contract named: {v}");
    let text = v.to_string();
    eprintln!("rejected as expected:\n{text}\n");
    assert!(
        text.contains(&format!("contract {}", contract.number())),
        "the message does not name the contract: {text}"
    );
    assert!(text.contains("failing sequence"), "{text}");
    assert!(
        text.contains("quota:"),
        "the message has no sequence: {text}"
    );
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn per_instance_state_is_rejected() {
    let f = Factory(Flaw::PerInstanceState);
    conformance::model_agreement(&f, &config())
        .await
        .expect("one instance alone is right");
    let v = assert_rejected(
        conformance::shared_state(&f, &config()).await,
        Contract::SharedState,
    );
    assert!(v.message.contains("instances do not share state"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn instance_local_cache_is_rejected() {
    let f = Factory(Flaw::InstanceCache);
    conformance::model_agreement(&f, &config())
        .await
        .expect("one instance alone is right");
    let v = assert_rejected(
        conformance::shared_state(&f, &config()).await,
        Contract::SharedState,
    );
    assert!(v.message.contains("instances do not share state"), "{v}");
}

/// The race window is one call in 64; each round of the concurrency
/// contract makes 512 calls on 8 threads, 16 rounds per algorithm. This test
/// was run 50 times in a row (`cargo test -p ratelimit-testkit --test
/// wrong_stores racy` in a loop) and rejected the store every time.
#[tokio::test(flavor = "multi_thread")]
async fn racy_store_is_rejected() {
    let f = Factory(Flaw::Racy);
    // Sequential contracts cannot see the race...
    conformance::model_agreement(&f, &config())
        .await
        .expect("a racy store is right when called one at a time");
    conformance::shared_state(&f, &config())
        .await
        .expect("and when its instances are called one at a time");
    // ...the concurrency contract does.
    let v = assert_rejected(
        conformance::concurrency(&f, &config()).await,
        Contract::Concurrency,
    );
    assert!(v.message.contains("over-admitted"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_name_left_out_of_the_key_is_rejected() {
    let f = Factory(Flaw::PolicyIgnored);
    assert_rejected(
        conformance::model_agreement(&f, &config()).await,
        Contract::ModelAgreement,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn colliding_key_separator_is_rejected() {
    let f = Factory(Flaw::SeparatorCollision);
    assert_rejected(
        conformance::model_agreement(&f, &config()).await,
        Contract::ModelAgreement,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cost_ignored_for_large_limits_is_rejected() {
    let f = Factory(Flaw::CostIgnoredAboveLimit);
    assert_rejected(
        conformance::fixed_window_bound(&f, &config()).await,
        Contract::FixedWindow,
    );
    assert_rejected(
        conformance::token_bucket_bound(&f, &config()).await,
        Contract::TokenBucket,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_only_for_windows_over_a_day_is_rejected() {
    let f = Factory(Flaw::WrongOverADay);
    assert_rejected(
        conformance::fixed_window_bound(&f, &config()).await,
        Contract::FixedWindow,
    );
    assert_rejected(
        conformance::model_agreement(&f, &config()).await,
        Contract::ModelAgreement,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn fixed_window_that_over_denies_is_rejected() {
    let f = Factory(Flaw::FixedWindowOverDenies);
    let v = assert_rejected(
        conformance::fixed_window_bound(&f, &config()).await,
        Contract::FixedWindow,
    );
    assert!(v.message.contains("false denial"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sliding_window_wrong_at_elapsed_zero_is_rejected() {
    let f = Factory(Flaw::SlidingWindowElapsedZero);
    let v = assert_rejected(
        conformance::sliding_window_rule(&f, &config()).await,
        Contract::SlidingWindow,
    );
    assert!(v.message.contains("at 0 µs into its window"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sliding_log_evicting_early_is_rejected() {
    let f = Factory(Flaw::SlidingLogEvictsEarly);
    assert_rejected(
        conformance::sliding_log_exact(&f, &config()).await,
        Contract::SlidingLog,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn token_bucket_refilling_fast_is_rejected() {
    let f = Factory(Flaw::TokenBucketFast);
    assert_rejected(
        conformance::token_bucket_bound(&f, &config()).await,
        Contract::TokenBucket,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn state_expiring_early_is_rejected() {
    let f = Factory(Flaw::ExpiresEarly);
    let v = assert_rejected(
        conformance::state_expires(&f, &config()).await,
        Contract::StateExpires,
    );
    assert!(v.message.contains("one microsecond before"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_after_one_microsecond_short_is_rejected() {
    let f = Factory(Flaw::RetryShort);
    let v = assert_rejected(
        conformance::retry_after_exact(&f, &config()).await,
        Contract::RetryAfter,
    );
    assert!(v.message.contains("retry_after"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn misreported_source_is_rejected() {
    let f = Factory(Flaw::SourceMisreported);
    let v = assert_rejected(
        conformance::model_agreement(&f, &config()).await,
        Contract::ModelAgreement,
    );
    assert!(v.message.contains("FailClosed"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn store_drifting_after_many_calls_is_rejected() {
    let f = Factory(Flaw::DriftsAfterMany);
    assert_rejected(
        conformance::model_agreement(&f, &config()).await,
        Contract::ModelAgreement,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn fixed_window_posing_as_sliding_log_is_rejected() {
    let f = Factory(Flaw::FixedWindowAsLog);
    let v = assert_rejected(
        conformance::sliding_log_exact(&f, &config()).await,
        Contract::SlidingLog,
    );
    assert!(v.message.contains("trailing window"), "{v}");
    // The whole suite stops at the first broken contract: model agreement.
    assert_rejected(
        conformance::run_all(&f, &config()).await,
        Contract::ModelAgreement,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn forgetful_store_is_rejected() {
    let f = Factory(Flaw::Forgetful);
    assert_rejected(
        conformance::model_agreement(&f, &config()).await,
        Contract::ModelAgreement,
    );
    assert_rejected(
        conformance::token_bucket_bound(&f, &config()).await,
        Contract::TokenBucket,
    );
    assert_rejected(
        conformance::fixed_window_bound(&f, &config()).await,
        Contract::FixedWindow,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sloppy_retry_after_is_rejected() {
    let f = Factory(Flaw::SloppyRetry);
    let v = assert_rejected(
        conformance::retry_after_exact(&f, &config()).await,
        Contract::RetryAfter,
    );
    assert!(v.message.contains("retry_after"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn leaky_keys_are_rejected() {
    let f = Factory(Flaw::LeakyKeys);
    conformance::model_agreement(&f, &config())
        .await
        .expect("plain ASCII keys do not collide");
    assert_rejected(
        conformance::keys_isolated(&f, &config()).await,
        Contract::KeyIsolation,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn several_quotas_one_after_another_are_rejected() {
    let f = Factory(Flaw::NonAtomicDefault);
    let v = assert_rejected(
        conformance::quotas_atomic(&f, &config()).await,
        Contract::Atomicity,
    );
    assert!(v.message.contains("decisions for"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn charging_earlier_quotas_on_a_later_denial_is_rejected() {
    let f = Factory(Flaw::ChargesEarlierQuotas);
    let v = assert_rejected(
        conformance::quotas_atomic(&f, &config()).await,
        Contract::Atomicity,
    );
    assert!(v.message.contains("policy"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_flawless_wrong_store_passes_everything() {
    // The same machinery with no flaw: every rejection above is the flaw's.
    // run_all includes contract 11 (several quotas, all or nothing).
    conformance::run_all(&Factory(Flaw::None), &config())
        .await
        .unwrap_or_else(|v| panic!("{v}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_local_store_passes_everything() {
    struct Correct;
    #[async_trait]
    impl StoreFactory for Correct {
        async fn stores(&self, n: usize, clock: Option<ManualClock>) -> Vec<Arc<dyn Store>> {
            let s: Arc<dyn Store> = Arc::new(match clock {
                Some(c) => ratelimit_local::LocalStore::with_clock(c),
                None => ratelimit_local::LocalStore::new(),
            });
            vec![s; n]
        }
    }
    conformance::run_all(&Correct, &config()).await.unwrap();
}

/// The limiter always sends its timeout as the request's deadline: a store
/// wrong only then is caught because the suite sends deadlines too.
#[tokio::test(flavor = "multi_thread")]
async fn wrong_only_with_a_deadline_is_rejected() {
    let f = Factory(Flaw::WrongWithDeadline);
    assert_rejected(
        conformance::model_agreement(&f, &config()).await,
        Contract::ModelAgreement,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sets_wrong_only_with_a_deadline_are_rejected() {
    let f = Factory(Flaw::WrongSetsWithDeadline);
    conformance::model_agreement(&f, &config())
        .await
        .expect("single quotas are right");
    assert_rejected(
        conformance::quotas_atomic(&f, &config()).await,
        Contract::Atomicity,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sets_kept_apart_from_single_quotas_are_rejected() {
    let f = Factory(Flaw::SetsApart);
    conformance::model_agreement(&f, &config())
        .await
        .expect("single quotas are right");
    assert_rejected(
        conformance::quotas_atomic(&f, &config()).await,
        Contract::Atomicity,
    );
    let v = assert_rejected(
        conformance::concurrency_sets(&f, &config()).await,
        Contract::Concurrency,
    );
    assert!(v.message.contains("over-admitted"), "{v}");
}

/// Every set request races; each round makes about 1,600 requests on 8
/// threads, a third of them sets. Run 50 times in a row (`cargo test -p
/// ratelimit-testkit --test wrong_stores racy_sets` in a loop): rejected
/// every time.
#[tokio::test(flavor = "multi_thread")]
async fn racy_sets_are_rejected() {
    let f = Factory(Flaw::RacySets);
    conformance::quotas_atomic(&f, &config())
        .await
        .expect("a racy set is right when called one at a time");
    let v = assert_rejected(
        conformance::concurrency_sets(&f, &config()).await,
        Contract::Concurrency,
    );
    assert!(v.message.contains("over-admitted"), "{v}");
}

/// Right in time, wrong past the deadline: a store that counts a request
/// whose deadline had passed and decides it; one that counts it and then
/// answers `Expired` anyway (found by the later decisions, which the model
/// makes counting none of the expired requests); one that counts nothing
/// but answers another error than `Expired`; and one that reports it bounds
/// its calls by the deadline (the limiter then arms no timer) yet never
/// answers such a request (found after the 5 s grace).
#[tokio::test(flavor = "multi_thread")]
async fn stores_wrong_past_the_deadline_are_rejected() {
    for (flaw, says) in [
        (Flaw::IgnoresDeadline, "had passed was decided"),
        (
            Flaw::CountsThenExpires,
            "counting none of the expired requests",
        ),
        (Flaw::TimeoutPastDeadline, "instead of StoreError::Expired"),
        (Flaw::HangsDespiteBounded, "Capabilities::bounded"),
    ] {
        let f = Factory(flaw);
        conformance::model_agreement(&f, &config())
            .await
            .expect("requests in time are right");
        // Bounded: the contract runs on a thread of its own, so that a suite
        // waiting on the hanging store for ever fails this test instead of
        // hanging the run (the contract blocks its thread while it runs).
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let _ = tx.send(rt.block_on(conformance::deadlines(&Factory(flaw), &config())));
        });
        let verdict = rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("{flaw:?}: the deadline contract never returned"));
        let v = assert_rejected(verdict, Contract::Deadline);
        assert!(v.message.contains(says), "{flaw:?}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_pending_despite_answering_in_process_is_rejected() {
    let f = Factory(Flaw::PendingDespiteInProcess);
    let v = assert_rejected(
        conformance::model_agreement(&f, &config()).await,
        Contract::ModelAgreement,
    );
    assert!(v.message.contains("in_process"), "{v}");
}

/// The limiter's built-in fallback store decides real requests while the
/// shared store is down: it meets every contract too.
#[tokio::test(flavor = "multi_thread")]
async fn the_limiters_fallback_store_passes_everything() {
    struct Fallback;
    #[async_trait]
    impl StoreFactory for Fallback {
        async fn stores(&self, n: usize, clock: Option<ManualClock>) -> Vec<Arc<dyn Store>> {
            let clock: Arc<dyn ratelimit_core::Clock> = match clock {
                Some(c) => Arc::new(c),
                None => Arc::new(ratelimit_core::SystemClock),
            };
            // Bounded (4,096 callers, reported): contract 14 checks it forgets
            // no one when full.
            let s: Arc<dyn Store> = Arc::new(ratelimit_core::FallbackStore::new(clock, 4_096));
            vec![s; n]
        }
    }
    conformance::run_all(&Fallback, &config()).await.unwrap();
}

/// The `StoreExt` shorthands send no deadline: a store wrong only then
/// passes every contract that sends one, and is caught by contract 12.
#[tokio::test(flavor = "multi_thread")]
async fn wrong_only_without_a_deadline_is_rejected() {
    let f = Factory(Flaw::WrongWithoutDeadline);
    conformance::model_agreement(&f, &config())
        .await
        .expect("requests with a deadline are right");
    conformance::quotas_atomic(&f, &config())
        .await
        .expect("sets with a deadline are right");
    let v = assert_rejected(
        conformance::no_deadline(&f, &config()).await,
        Contract::NoDeadline,
    );
    assert!(v.message.contains("None"), "{v}");
}

/// A store that refuses what `Request::check` refuses, but counts the
/// charges that were valid on their own first: no other contract sends
/// such a request; contract 13 finds the count in the next decision.
#[tokio::test(flavor = "multi_thread")]
async fn counting_a_refused_request_is_rejected() {
    let f = Factory(Flaw::CountsRefused);
    conformance::model_agreement(&f, &config())
        .await
        .expect("valid requests are right");
    conformance::quotas_atomic(&f, &config())
        .await
        .expect("valid sets are right");
    let v = assert_rejected(
        conformance::refusals(&f, &config()).await,
        Contract::Refusals,
    );
    assert!(
        v.message.contains("counting none of the refused requests"),
        "{v}"
    );
}

/// Full, it forgets the caller written longest ago instead of refusing the
/// new one: every contract with a few callers passes; contract 14, with
/// more callers than the store reports it keeps, finds a caller over its
/// limit admitted again.
#[tokio::test(flavor = "multi_thread")]
async fn forgetting_a_caller_to_make_room_is_rejected() {
    let f = Factory(Flaw::ForgetsToMakeRoom);
    conformance::model_agreement(&f, &config())
        .await
        .expect("a store that is never full is right");
    let v = assert_rejected(
        conformance::capacity(&f, &config()).await,
        Contract::Capacity,
    );
    assert!(v.message.contains("forgot a caller over its limit"), "{v}");
}

/// Requests of cost above 1 decided optimistically, the retry after a
/// conflict charging 1: right one at a time and under concurrency of cost
/// 1; the concurrency check with costs above 1 rejects it, whether the
/// store answers ready or pending. Each round makes 264 requests on
/// 8 threads, two thirds of them of cost above 1, each holding a 20 µs
/// window between its read and its write. Run 20 times in a row (`cargo
/// test -p ratelimit-testkit --test wrong_stores losing_the_cost` in a
/// loop): rejected every time.
#[tokio::test(flavor = "multi_thread")]
async fn losing_the_cost_on_a_conflict_is_rejected() {
    for flaw in [Flaw::CostLostOnRetry, Flaw::PendingCostLostOnRetry] {
        let f = Factory(flaw);
        conformance::model_agreement(&f, &config())
            .await
            .unwrap_or_else(|v| panic!("{flaw:?}: one at a time it is right: {v}"));
        conformance::concurrency(&f, &config())
            .await
            .unwrap_or_else(|v| panic!("{flaw:?}: cost 1 under concurrency is right: {v}"));
        let v = assert_rejected(
            conformance::concurrency_costs(&f, &config()).await,
            Contract::Concurrency,
        );
        assert!(v.message.contains("over-admitted"), "{flaw:?}: {v}");
    }
}

/// The contracts that close the suite's blind spots pass on the flawless
/// store, ready and reporting a bound on its callers, and so every
/// rejection above is the flaw's.
#[tokio::test(flavor = "multi_thread")]
async fn the_flawless_store_meets_the_new_contracts() {
    let f = Factory(Flaw::None);
    for (name, result) in [
        ("no_deadline", conformance::no_deadline(&f, &config()).await),
        ("refusals", conformance::refusals(&f, &config()).await),
        ("capacity", conformance::capacity(&f, &config()).await),
        (
            "concurrency_costs",
            conformance::concurrency_costs(&f, &config()).await,
        ),
    ] {
        result.unwrap_or_else(|v| panic!("{name}: {v}"));
    }
}
