//! The suite must prove it can fail: deliberately wrong stores, each rejected
//! with a message naming the contract and the failing sequence.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ratelimit_core::model::{self, State};
use ratelimit_core::{
    Algorithm, Clock, Decision, ManualClock, Quota, Rate, Result, Store, SystemClock,
};
use ratelimit_testkit::conformance::{self, Contract, StoreFactory, SuiteConfig, Violation};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Flaw {
    /// A fixed window posing as a sliding log.
    FixedWindowAsLog,
    /// Forgets a key's state every fourth call.
    Forgetful,
    /// Reads, yields, then writes: a lost update under concurrency.
    Racy,
    /// Rounds retry_after up to whole milliseconds.
    SloppyRetry,
    /// Keys go through a lossy UTF-8 conversion and are cut at 64 bytes.
    LeakyKeys,
}

#[derive(Debug)]
struct WrongStore {
    flaw: Flaw,
    clock: Arc<dyn Clock>,
    map: Mutex<HashMap<Vec<u8>, (State, u64)>>,
}

#[async_trait]
impl Store for WrongStore {
    async fn decide(&self, key: &[u8], quota: &Quota, cost: u64) -> Result<Decision> {
        quota.check_cost(cost)?;
        let mut k = quota.name().as_bytes().to_vec();
        k.extend_from_slice(quota.kind().code().as_bytes());
        if self.flaw == Flaw::LeakyKeys {
            let lossy = String::from_utf8_lossy(key).into_owned().into_bytes();
            k.extend_from_slice(&lossy[..lossy.len().min(64)]);
        } else {
            k.extend_from_slice(key);
        }
        let now = self.clock.now();
        let effective = match (self.flaw, quota.algorithm()) {
            (Flaw::FixedWindowAsLog, Algorithm::SlidingLog(w)) => Quota::fixed_window(Rate::new(
                w.limit(),
                Duration::from_micros(w.window_micros()),
            ))
            .unwrap(),
            _ => quota.clone(),
        };
        let (prior, calls) = {
            let map = self.map.lock().unwrap();
            map.get(&k)
                .cloned()
                .map_or((None, 0), |(s, n)| (Some(s), n))
        };
        if self.flaw == Flaw::Racy {
            tokio::task::yield_now().await;
        }
        let prior = if self.flaw == Flaw::Forgetful && calls % 4 == 3 {
            None
        } else {
            prior
        };
        let step = model::decide(&effective, prior, now, cost)?;
        self.map.lock().unwrap().insert(k, (step.state, calls + 1));
        let mut d = step.decision;
        if self.flaw == Flaw::SloppyRetry {
            d.retry_after = d
                .retry_after
                .map(|r| Duration::from_millis(u64::try_from(r.as_millis()).unwrap() + 1));
        }
        Ok(d)
    }
}

struct Factory(Flaw);

#[async_trait]
impl StoreFactory for Factory {
    async fn stores(&self, n: usize, clock: Option<ManualClock>) -> Vec<Arc<dyn Store>> {
        let clock: Arc<dyn Clock> = match clock {
            Some(c) => Arc::new(c),
            None => Arc::new(SystemClock),
        };
        let store: Arc<dyn Store> = Arc::new(WrongStore {
            flaw: self.0,
            clock,
            map: Mutex::default(),
        });
        vec![store; n]
    }
}

fn config() -> SuiteConfig {
    SuiteConfig {
        concurrency_duration: Duration::from_millis(500),
        ..SuiteConfig::default()
    }
}

fn assert_rejected(result: std::result::Result<(), Violation>, contract: Contract) -> Violation {
    let v = result.expect_err("the suite accepted a wrong store");
    assert_eq!(v.contract, contract, "wrong contract named: {v}");
    let text = v.to_string();
    eprintln!("rejected as expected:\n{text}\n");
    assert!(
        text.contains(&format!("contract {}", contract as u8)),
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
async fn fixed_window_posing_as_sliding_log_is_rejected() {
    let f = Factory(Flaw::FixedWindowAsLog);
    let v = assert_rejected(
        conformance::sliding_log_exact(&f, &config()).await,
        Contract::SlidingLog,
    );
    assert!(v.message.contains("trailing window"), "{v}");
    assert!(v.sequence.contains("#1"), "{v}");
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
async fn racy_store_is_rejected() {
    let f = Factory(Flaw::Racy);
    // Sequential contracts cannot see the race...
    conformance::model_agreement(&f, &config())
        .await
        .expect("a racy store is right when called one at a time");
    // ...the concurrency contract does.
    let v = assert_rejected(
        conformance::concurrency(&f, &config()).await,
        Contract::Concurrency,
    );
    assert!(v.message.contains("over-admitted"), "{v}");
    assert_rejected(
        conformance::run_all(&f, &config()).await,
        Contract::Concurrency,
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
async fn a_correct_store_passes_everything() {
    // The same store with no flaw that matters (Racy is only wrong when concurrent).
    struct Correct;
    #[async_trait]
    impl StoreFactory for Correct {
        async fn stores(&self, n: usize, clock: Option<ManualClock>) -> Vec<Arc<dyn Store>> {
            let s: Arc<dyn Store> = Arc::new(match clock {
                Some(c) => ratelimit_local::DashMapStore::with_clock(c),
                None => ratelimit_local::DashMapStore::new(),
            });
            vec![s; n]
        }
    }
    conformance::run_all(&Correct, &config()).await.unwrap();
}
