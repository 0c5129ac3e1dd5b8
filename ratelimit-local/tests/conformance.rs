//! The shared conformance suite (contracts 1-14) against `LocalStore`, at
//! the in-process case counts: with the default sweep, with a sweep step
//! on every call, and bounded in the callers it keeps (contract 14 checks
//! the bound; the unbounded stores report none).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Local;
use ratelimit_core::{ManualClock, Store, SystemClock};
use ratelimit_local::LocalStore;
use ratelimit_testkit::conformance::concurrency_report;
use ratelimit_testkit::{StoreFactory, SuiteConfig, run_all};

/// Stores whose automatic sweep takes a step on every call: if a step ever
/// removed a caller whose state differs from a fresh one, a contract would
/// catch the changed decision.
struct SweepEveryCall;

#[async_trait::async_trait]
impl StoreFactory for SweepEveryCall {
    async fn stores(&self, n: usize, clock: Option<ManualClock>) -> Vec<Arc<dyn Store>> {
        let store = match clock {
            Some(c) => LocalStore::with_clock(c),
            None => LocalStore::with_clock(SystemClock),
        };
        let store: Arc<dyn Store> = Arc::new(store.sweep_interval(Duration::ZERO));
        vec![store; n]
    }
}

/// Stores bounded to 256 entries ([`LocalStore::max_callers`], reported in
/// their capabilities): full, a store must refuse a new caller and forget
/// none of the ones it keeps.
struct Bounded;

/// The bound of [`Bounded`]'s stores.
const BOUND: usize = 256;

#[async_trait::async_trait]
impl StoreFactory for Bounded {
    async fn stores(&self, n: usize, clock: Option<ManualClock>) -> Vec<Arc<dyn Store>> {
        let store = match clock {
            Some(c) => LocalStore::with_clock(c),
            None => LocalStore::with_clock(SystemClock),
        };
        let store: Arc<dyn Store> = Arc::new(store.max_callers(BOUND));
        vec![store; n]
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dashmap_store_meets_every_contract() {
    let t = std::time::Instant::now();
    if let Err(v) = run_all(&Local, &SuiteConfig::in_process()).await {
        panic!("{v}");
    }
    println!("local conformance: {:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_sweeping_on_every_call_meets_every_contract() {
    if let Err(v) = run_all(&SweepEveryCall, &SuiteConfig::in_process()).await {
        panic!("{v}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_bounded_in_its_callers_meets_every_contract() {
    let store = Bounded.stores(1, None).await;
    assert_eq!(store[0].capabilities().max_callers, Some(BOUND));
    if let Err(v) = run_all(&Bounded, &SuiteConfig::in_process()).await {
        panic!("{v}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_calls_really_interleave() {
    let report = concurrency_report(&Local, &SuiteConfig::in_process())
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    println!("{report}");
    assert!(report.calls_per_thread.iter().all(|&c| c > 0), "{report}");
    assert!(
        report
            .admitted_per_thread
            .iter()
            .filter(|&&a| a > 0)
            .count()
            > 1,
        "one thread took every admission: {report}"
    );
}
