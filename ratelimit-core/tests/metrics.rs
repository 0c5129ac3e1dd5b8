//! The limiter's metrics through the `metrics` facade: every metric is
//! described to a recorder installed after the limiter was built, and every
//! quota a call is checked against has its own series.

#![cfg(all(feature = "tokio", feature = "metrics"))]

mod common;

use std::sync::{Arc, Mutex};

use common::ModelStore;
use metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    with_local_recorder,
};
use ratelimit_core::{Limiter, ManualClock, Quota, Rate};

/// Remembers the names described and every increment of every series
/// (a series once per increment).
#[derive(Debug, Default)]
struct Seen {
    described: Mutex<Vec<String>>,
    series: Arc<Mutex<Vec<String>>>,
}

/// A counter that writes its series into `Seen::series` on every
/// increment.
#[derive(Debug)]
struct Tick {
    series: String,
    seen: Arc<Mutex<Vec<String>>>,
}

impl metrics::CounterFn for Tick {
    fn increment(&self, value: u64) {
        let mut seen = self.seen.lock().unwrap();
        for _ in 0..value {
            seen.push(self.series.clone());
        }
    }

    fn absolute(&self, _: u64) {}
}

impl Seen {
    fn described(&self) -> Vec<String> {
        let mut v = self.described.lock().unwrap().clone();
        v.sort();
        v.dedup();
        v
    }

    fn series(&self, name: &str) -> Vec<String> {
        self.series
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.starts_with(&format!("{name}{{")))
            .cloned()
            .collect()
    }

    fn name(key: &Key) -> String {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        format!("{}{{{}}}", key.name(), labels.join(","))
    }
}

impl Recorder for Seen {
    fn describe_counter(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.described.lock().unwrap().push(key.as_str().to_owned());
    }
    fn describe_gauge(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.described.lock().unwrap().push(key.as_str().to_owned());
    }
    fn describe_histogram(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.described.lock().unwrap().push(key.as_str().to_owned());
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(Tick {
            series: Self::name(key),
            seen: Arc::clone(&self.series),
        }))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

const ALL: [&str; 8] = [
    "ratelimit_breaker_open",
    "ratelimit_breaker_short_circuits_total",
    "ratelimit_decisions_total",
    "ratelimit_deny_cache_hits_total",
    "ratelimit_policy_decisions_total",
    "ratelimit_shadow_denials_total",
    "ratelimit_store_duration_seconds",
    "ratelimit_store_failures_total",
];

fn plan() -> Limiter {
    let clock = ManualClock::new(1_800_000_000_000_000);
    Limiter::builder_arc(Arc::new(ModelStore::with_sync(clock.clone(), true)))
        .quota(
            Quota::token_bucket(Rate::per_minute(100), 2)
                .unwrap()
                .named("api")
                .unwrap(),
        )
        .quota(
            Quota::sliding_window(Rate::per_day(1_000))
                .unwrap()
                .named("daily")
                .unwrap(),
        )
        .namespace("plan")
        .unwrap()
        .build()
        .unwrap()
}

/// Three calls of one caller (two admitted, the third denied by `api`),
/// with `recorder` installed for this thread only.
fn three_calls(limiter: &Limiter, recorder: &Seen) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    with_local_recorder(recorder, || {
        rt.block_on(async {
            for _ in 0..3 {
                limiter.check_all("caller", 1).await.unwrap();
            }
        })
    });
}

#[test]
fn a_recorder_installed_after_the_limiter_gets_every_description() {
    // Built first, with no recorder: descriptions sent now go nowhere.
    let limiter = plan();
    let first = Seen::default();
    let second = Seen::default();
    three_calls(&limiter, &first);
    assert_eq!(first.described(), ALL, "described to the first recorder");
    // Another recorder (a restart of the exporter, a test's own) too.
    three_calls(&limiter, &second);
    assert_eq!(second.described(), ALL, "described to the second recorder");
}

#[test]
fn every_policy_checked_has_its_own_series() {
    let limiter = plan();
    let seen = Seen::default();
    three_calls(&limiter, &seen);
    // One decision per call, under the binding policy.
    let decisions = seen.series("ratelimit_decisions_total");
    assert_eq!(decisions.len(), 3, "{decisions:?}");
    // Every quota's own answer: `daily` admitted all three (it never
    // bound), `api` two of them.
    let policies = seen.series("ratelimit_policy_decisions_total");
    let count = |s: &str| policies.iter().filter(|p| p.contains(s)).count();
    assert_eq!(policies.len(), 6, "{policies:?}");
    assert_eq!(
        count("policy=daily,outcome=allowed,source=store"),
        3,
        "{policies:?}"
    );
    assert_eq!(
        count("policy=api,outcome=allowed,source=store"),
        2,
        "{policies:?}"
    );
    assert_eq!(
        count("policy=api,outcome=denied,source=store"),
        1,
        "{policies:?}"
    );
    assert!(policies.iter().all(|p| p.contains("namespace=plan")));
    assert!(
        !policies.iter().any(|p| p.contains("caller")),
        "a caller key as a label"
    );
}

/// A limiter whose quotas come with each call (a service naming each
/// caller's state) labels its decisions `policy=per_call`: with the quota
/// names as labels, every caller would be a series of its own, and the
/// exporter's memory would grow with the callers.
#[test]
fn quotas_per_call_are_one_policy_label_not_one_per_caller() {
    let clock = ManualClock::new(1_800_000_000_000_000);
    let limiter = Limiter::builder_arc(Arc::new(ModelStore::with_sync(clock, true)))
        .quotas_per_call()
        .namespace("service")
        .unwrap()
        .build()
        .unwrap();
    let seen = Seen::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    with_local_recorder(&seen, || {
        rt.block_on(async {
            for caller in 0..50 {
                let state = Quota::fixed_window(Rate::per_minute(10))
                    .unwrap()
                    .named(&format!("d{caller:032x}"))
                    .unwrap();
                limiter
                    .check_charges(
                        format!("caller-{caller}"),
                        &[ratelimit_core::model::Charge::new(&state, 1)],
                    )
                    .await
                    .unwrap();
            }
        })
    });
    let mut decisions = seen.series("ratelimit_decisions_total");
    decisions.sort();
    decisions.dedup();
    assert_eq!(
        decisions,
        [
            "ratelimit_decisions_total{namespace=service,policy=per_call,outcome=allowed,source=store}"
        ],
        "one series for fifty callers"
    );
    let mut policies = seen.series("ratelimit_policy_decisions_total");
    policies.dedup();
    assert_eq!(policies.len(), 1, "{policies:?}");
}
