//! The suite must prove it can fail: a public corpus of deliberately wrong
//! stores, one class of mistake each, every one rejected with the contract
//! that catches it named and the failing sequence shown.
//!
//! Every wrong store is the correct model behind a `Store` with one flaw, so
//! a rejection can only come from that flaw. The suite's seed is fixed, so
//! each rejection below is deterministic, except the race (contract 9),
//! which is sized so that a race window on one call in 64 is hit in every
//! run (see `racy_store_is_rejected`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ratelimit_core::model::{self, Charge, State};
use ratelimit_core::{
    Algorithm, Clock, Decision, ManualClock, Micros, Quota, Rate, Result, Source, Store,
    SystemClock,
};
use ratelimit_testkit::conformance::{self, Contract, StoreFactory, SuiteConfig, Violation};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Flaw {
    /// None: the control.
    None,
    /// Each instance keeps its own map (the factory's instances share nothing).
    PerInstanceState,
    /// Each instance caches the state it read or wrote, and reads its cache first.
    InstanceCache,
    /// One call in 64 reads, waits 100 µs, then writes: a lost update.
    Racy,
    /// The policy name is left out of the key: policies of one algorithm share state.
    PolicyIgnored,
    /// The key joins `caller "." policy`: ("a", "b.c") and ("a.b", "c") meet.
    SeparatorCollision,
    /// For limits above 1,000 every call counts as cost 1.
    CostIgnoredAboveLimit,
    /// Windows longer than a day are taken as one day.
    WrongOverADay,
    /// A fixed window that denies the call that would use the last unit.
    FixedWindowOverDenies,
    /// A sliding window counter that forgets the previous window at `elapsed = 0`.
    SlidingWindowElapsedZero,
    /// A sliding log that drops entries one microsecond before they leave.
    SlidingLogEvictsEarly,
    /// A token bucket refilling 1 % fast.
    TokenBucketFast,
    /// State forgotten one microsecond before its TTL runs out.
    ExpiresEarly,
    /// `retry_after` one microsecond short.
    RetryShort,
    /// Store denials reported as fail-closed policy decisions.
    SourceMisreported,
    /// After 700 calls on one key, decides by a clock 1 µs behind.
    DriftsAfterMany,
    /// A fixed window posing as a sliding log.
    FixedWindowAsLog,
    /// Forgets a key's state every fourth call.
    Forgetful,
    /// Rounds retry_after up to whole milliseconds.
    SloppyRetry,
    /// Keys go through a lossy UTF-8 conversion and are cut at 64 bytes.
    LeakyKeys,
    /// Several quotas one after another (the trait's provided `decide_all`).
    NonAtomicDefault,
    /// Several quotas: the ones before a denying quota count the denied call.
    ChargesEarlierQuotas,
}

#[derive(Debug, Clone)]
struct Entry {
    state: State,
    calls: u64,
    written: Micros,
    expires: Micros,
}

type Map = Arc<Mutex<HashMap<Vec<u8>, Entry>>>;

#[derive(Debug)]
struct WrongStore {
    flaw: Flaw,
    clock: Arc<dyn Clock>,
    map: Map,
    cache: Mutex<HashMap<Vec<u8>, Entry>>,
    calls: AtomicU64,
}

impl WrongStore {
    fn map_key(&self, key: &[u8], quota: &Quota) -> Vec<u8> {
        let (name, code) = (quota.name().as_bytes(), quota.kind().code().as_bytes());
        match self.flaw {
            Flaw::PolicyIgnored => [code, &[0xFF], key].concat(),
            Flaw::SeparatorCollision => [key, b".", name, b"|", code].concat(),
            Flaw::LeakyKeys => {
                let lossy = String::from_utf8_lossy(key).into_owned().into_bytes();
                [name, &[0xFF], code, &[0xFF], &lossy[..lossy.len().min(64)]].concat()
            }
            _ => [name, &[0xFF], code, &[0xFF], key].concat(),
        }
    }

    /// The quota and cost the flawed store actually decides with.
    fn effective(&self, quota: &Quota, cost: u64) -> (Quota, u64) {
        let window = |q: &Quota| Duration::from_micros(q.window().as_micros() as u64);
        match (self.flaw, quota.algorithm()) {
            (Flaw::FixedWindowAsLog, Algorithm::SlidingLog(w)) => (
                Quota::fixed_window(Rate::new(w.limit(), window(quota))).unwrap(),
                cost,
            ),
            (Flaw::TokenBucketFast, Algorithm::TokenBucket(b)) => {
                let r = b.rate();
                let fast = Rate::new(r.count() * 101, r.period() * 100);
                (
                    Quota::token_bucket(fast, b.capacity())
                        .unwrap_or_else(|_| quota.clone())
                        .named(quota.name())
                        .unwrap(),
                    cost,
                )
            }
            (Flaw::WrongOverADay, Algorithm::FixedWindow(w) | Algorithm::SlidingWindow(w))
                if w.window_micros() > 86_400_000_000 =>
            {
                let rate = Rate::new(w.limit(), Duration::from_secs(86_400));
                let q = if quota.kind() == ratelimit_core::AlgorithmKind::FixedWindow {
                    Quota::fixed_window(rate)
                } else {
                    Quota::sliding_window(rate)
                };
                (q.unwrap_or_else(|_| quota.clone()), cost)
            }
            (Flaw::CostIgnoredAboveLimit, _) if quota.limit() > 1000 => (quota.clone(), 1),
            _ => (quota.clone(), cost),
        }
    }
}

#[async_trait]
impl Store for WrongStore {
    async fn decide(&self, key: &[u8], quota: &Quota, cost: u64) -> Result<Decision> {
        quota.check_cost(cost)?;
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let k = self.map_key(key, quota);
        let mut now = self.clock.now();
        let cached = if self.flaw == Flaw::InstanceCache {
            self.cache.lock().unwrap().get(&k).cloned()
        } else {
            None
        };
        // The read-modify-write holds the map's lock throughout (the
        // store is atomic), except in the racy store's one call in 64.
        let mut map = self.map.lock().unwrap();
        let entry = cached.or_else(|| map.get(&k).cloned());
        if self.flaw == Flaw::Racy && n % 64 == 0 {
            // A round trip between the read and the write, holding no lock.
            drop(map);
            std::thread::sleep(Duration::from_micros(100));
            map = self.map.lock().unwrap();
        }
        let calls = entry.as_ref().map_or(0, |e| e.calls);
        if self.flaw == Flaw::DriftsAfterMany && calls >= 700 {
            now -= 1;
        }
        let horizon = now + u64::from(self.flaw == Flaw::ExpiresEarly);
        let written = entry.as_ref().map(|e| e.written);
        let mut prior = entry.filter(|e| e.expires > horizon).map(|e| e.state);
        if self.flaw == Flaw::Forgetful && calls % 4 == 3 {
            prior = None;
        }
        if let (Flaw::SlidingWindowElapsedZero, Algorithm::SlidingWindow(w)) =
            (self.flaw, quota.algorithm())
        {
            let width = w.window_micros();
            if now % width == 0 && written.is_some_and(|t| t / width + 1 == now / width) {
                prior = None;
            }
        }
        if let (Flaw::SlidingLogEvictsEarly, Some(State::SlidingLog(s)), Algorithm::SlidingLog(w)) =
            (self.flaw, prior.as_mut(), quota.algorithm())
        {
            let width = w.window_micros();
            while s
                .entries
                .front()
                .is_some_and(|&(t, _)| t + width <= now + 1)
            {
                s.entries.pop_front();
            }
        }
        let (effective, cost) = self.effective(quota, cost);
        let step = model::decide(&effective, prior, now, cost)?;
        let mut d = step.decision;
        if self.flaw == Flaw::FixedWindowOverDenies
            && matches!(quota.algorithm(), Algorithm::FixedWindow(_))
            && d.allowed
            && d.remaining == 0
        {
            return Ok(Decision {
                allowed: false,
                retry_after: Some(d.reset_after),
                ..d
            });
        }
        let entry = Entry {
            state: step.state,
            calls: calls + 1,
            written: now,
            expires: now + step.ttl,
        };
        if self.flaw == Flaw::InstanceCache {
            self.cache.lock().unwrap().insert(k.clone(), entry.clone());
        }
        map.insert(k, entry);
        drop(map);
        match self.flaw {
            Flaw::SloppyRetry => {
                d.retry_after = d
                    .retry_after
                    .map(|r| Duration::from_millis(u64::try_from(r.as_millis()).unwrap() + 1));
            }
            Flaw::RetryShort => {
                d.retry_after = d.retry_after.map(|r| r - Duration::from_micros(1));
            }
            Flaw::SourceMisreported if !d.allowed => d.source = Source::FailClosed,
            _ => {}
        }
        Ok(d)
    }

    async fn decide_all(&self, key: &[u8], charges: &[Charge<'_>]) -> Result<Vec<Decision>> {
        if self.flaw == Flaw::NonAtomicDefault {
            // What the trait provides: one quota at a time, stop at a denial.
            let mut out = Vec::new();
            for c in charges {
                let d = self.decide(key, c.quota, c.cost).await?;
                let stop = !d.allowed && !c.shadow;
                out.push(d);
                if stop {
                    break;
                }
            }
            return Ok(out);
        }
        for c in charges {
            c.quota.check_cost(c.cost)?;
        }
        let now = self.clock.now();
        let mut map = self.map.lock().unwrap();
        let keys: Vec<Vec<u8>> = charges.iter().map(|c| self.map_key(key, c.quota)).collect();
        let states: Vec<Option<State>> = keys
            .iter()
            .map(|k| {
                map.get(k)
                    .filter(|e| e.expires > now)
                    .map(|e| e.state.clone())
            })
            .collect();
        let write = |map: &mut HashMap<Vec<u8>, Entry>, k: &[u8], state: State, ttl: u64| {
            let calls = map.get(k).map_or(0, |e| e.calls);
            map.insert(
                k.to_vec(),
                Entry {
                    state,
                    calls: calls + 1,
                    written: now,
                    expires: now + ttl,
                },
            );
        };
        if self.flaw == Flaw::ChargesEarlierQuotas {
            let mut out = Vec::new();
            let mut denied = false;
            for ((c, k), prior) in charges.iter().zip(&keys).zip(states) {
                let step = model::decide(c.quota, prior, now, c.cost)?;
                denied |= !step.decision.allowed && !c.shadow;
                if step.decision.allowed && !denied {
                    write(&mut map, k, step.state, step.ttl);
                }
                out.push(step.decision);
            }
            return Ok(out);
        }
        let step = model::decide_all(charges, states, now)?;
        for (k, w) in keys.iter().zip(step.writes) {
            if let Some((state, ttl)) = w {
                write(&mut map, k, state, ttl);
            }
        }
        Ok(step.decisions)
    }

    fn atomic_all(&self) -> bool {
        self.flaw != Flaw::NonAtomicDefault
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
        let shared: Map = Arc::default();
        let make = |map: Map| -> Arc<dyn Store> {
            Arc::new(WrongStore {
                flaw: self.0,
                clock: clock.clone(),
                map,
                cache: Mutex::default(),
                calls: AtomicU64::new(0),
            })
        };
        match self.0 {
            Flaw::PerInstanceState => (0..n).map(|_| make(Arc::default())).collect(),
            Flaw::InstanceCache => (0..n).map(|_| make(shared.clone())).collect(),
            _ => vec![make(shared); n],
        }
    }
}

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
    assert!(v.message.contains("non-atomic"), "{v}");
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
                Some(c) => ratelimit_local::DashMapStore::with_clock(c),
                None => ratelimit_local::DashMapStore::new(),
            });
            vec![s; n]
        }
    }
    conformance::run_all(&Correct, &config()).await.unwrap();
}
