//! Generated inputs: a quota and a sequence of calls.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};
use ratelimit_core::{Algorithm, AlgorithmKind, Micros, Quota, Rate};

use super::{Contract, SuiteConfig, Violation};

/// A minute boundary: every generated window starts at a known phase from it.
pub(crate) const T0: Micros = 1_800_000_000_000_000;

/// One call: wait `dt` µs after the previous call, then call `key` with `cost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Call {
    pub(crate) dt: u64,
    pub(crate) key: usize,
    pub(crate) cost: u64,
}

/// A quota, a start time and calls.
#[derive(Clone)]
pub(crate) struct Scenario {
    pub(crate) quota: Quota,
    pub(crate) start: Micros,
    pub(crate) calls: Vec<Call>,
    pub(crate) keys: Vec<Vec<u8>>,
}

impl Scenario {
    /// Absolute times of the calls.
    pub(crate) fn times(&self) -> impl Iterator<Item = (Micros, &Call)> + '_ {
        let mut t = self.start;
        self.calls.iter().map(move |c| {
            t += c.dt;
            (t, c)
        })
    }
}

pub(crate) fn describe(q: &Quota) -> String {
    match q.algorithm() {
        Algorithm::FixedWindow(w) => format!(
            "fixed window: limit {} per {} µs",
            w.limit(),
            w.window_micros()
        ),
        Algorithm::SlidingWindow(w) => format!(
            "sliding window counter: limit {} per {} µs",
            w.limit(),
            w.window_micros()
        ),
        Algorithm::SlidingLog(w) => format!(
            "sliding log: limit {} per {} µs",
            w.limit(),
            w.window_micros()
        ),
        Algorithm::TokenBucket(b) => format!(
            "token bucket: {} per {:?}, capacity {}",
            b.rate().count(),
            b.rate().period(),
            b.capacity()
        ),
    }
}

impl fmt::Debug for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "  quota: {}", describe(&self.quota))?;
        writeln!(f, "  start: T0 + {} µs (T0 = {T0})", self.start - T0)?;
        if self.keys.len() > 1 || self.keys.first().is_some_and(|k| k != b"k0") {
            writeln!(
                f,
                "  keys: {:?}",
                self.keys
                    .iter()
                    .map(|k| String::from_utf8_lossy(k))
                    .collect::<Vec<_>>()
            )?;
        }
        for (i, (t, c)) in self.times().enumerate() {
            writeln!(
                f,
                "  #{i}: t = start + {} µs, key {}, cost {}",
                t - self.start,
                c.key,
                c.cost
            )?;
        }
        Ok(())
    }
}

pub(crate) fn window_of(q: &Quota) -> u64 {
    u64::try_from(q.window().as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Quotas of the given kinds with small limits and windows.
pub(crate) fn quotas(kinds: &'static [AlgorithmKind]) -> impl Strategy<Value = Quota> {
    (
        prop::sample::select(kinds),
        1u64..=10,
        prop_oneof![1_000u64..=50_000, 50_000u64..=3_000_000],
        1u64..=10,
    )
        .prop_map(|(kind, limit, window, burst)| {
            let rate = Rate::new(limit, Duration::from_micros(window));
            match kind {
                AlgorithmKind::FixedWindow => Quota::fixed_window(rate),
                AlgorithmKind::SlidingWindow => Quota::sliding_window(rate),
                AlgorithmKind::SlidingLog => Quota::sliding_log(rate),
                _ => Quota::token_bucket(rate, burst),
            }
            .expect("small quotas are valid")
        })
}

/// Scenarios over `keys` distinct keys (named `k0`, `k1`, ...).
pub(crate) fn scenarios(
    kinds: &'static [AlgorithmKind],
    keys: usize,
    max_calls: usize,
) -> impl Strategy<Value = Scenario> {
    quotas(kinds).prop_flat_map(move |quota| {
        let w = window_of(&quota);
        let limit = quota.limit();
        let dt = prop_oneof![
            3 => Just(0u64),
            4 => 0..=w / 8,
            2 => 0..=w,
            1 => w..=3 * w,
        ];
        let call = (dt, 0..keys, 1u64..=4).prop_map(move |(dt, key, cost)| Call {
            dt,
            key,
            cost: cost.min(limit),
        });
        (
            Just(quota),
            0..w,
            prop::collection::vec(call, 1..=max_calls),
        )
            .prop_map(move |(quota, phase, calls)| Scenario {
                quota,
                start: T0 + phase,
                calls,
                keys: (0..keys).map(|i| format!("k{i}").into_bytes()).collect(),
            })
    })
}

/// Unique key prefixes: one run id per process, one counter per case, so
/// suites can share a server and run in parallel.
pub(crate) fn case_prefix() -> Vec<u8> {
    static RUN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static CASE: AtomicU64 = AtomicU64::new(0);
    let run = *RUN.get_or_init(rand::random::<u64>);
    format!("t{run:016x}c{}/", CASE.fetch_add(1, Ordering::Relaxed)).into_bytes()
}

pub(crate) fn key_bytes(prefix: &[u8], key: &[u8]) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(key);
    k
}

/// Runs a property with proptest (shrinking on failure) from inside a
/// multi-threaded tokio runtime.
pub(crate) fn run_cases<S>(
    config: &SuiteConfig,
    contract: Contract,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), String>,
) -> Result<(), Violation>
where
    S: Strategy,
    S::Value: fmt::Debug,
{
    tokio::task::block_in_place(|| {
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&config.seed.to_le_bytes());
        seed[8] = contract as u8;
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
        let mut runner = TestRunner::new_with_rng(
            Config {
                cases: config.cases,
                failure_persistence: None,
                max_shrink_iters: 2_000,
                ..Config::default()
            },
            rng,
        );
        match runner.run(&strategy, |v| check(v).map_err(TestCaseError::fail)) {
            Ok(()) => Ok(()),
            Err(TestError::Fail(reason, value)) => Err(Violation {
                contract,
                message: reason.message().to_string(),
                sequence: format!("{value:?}"),
            }),
            Err(TestError::Abort(reason)) => Err(Violation {
                contract,
                message: format!("aborted: {}", reason.message()),
                sequence: String::new(),
            }),
        }
    })
}
