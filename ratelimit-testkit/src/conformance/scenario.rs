//! Generated inputs: a quota and a sequence of calls.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};
use std::collections::HashMap;

use ratelimit_core::model::{self, State};
use ratelimit_core::{Algorithm, AlgorithmKind, Micros, Quota, Rate};

use super::{Contract, SuiteConfig, Violation};

/// A minute boundary: every generated window starts at a known phase from it.
pub(crate) const T0: Micros = 1_800_000_000_000_000;

/// One call: move the clock `dt` µs after the previous call (backwards when
/// `back`, as a stepped system clock would), then call `key` with `cost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Call {
    pub(crate) dt: u64,
    pub(crate) back: bool,
    pub(crate) key: usize,
    pub(crate) cost: u64,
}

/// A quota, a start time and calls.
#[derive(Clone)]
pub(crate) struct Scenario {
    pub(crate) quota: Quota,
    /// From call `.0` on, the policy is reconfigured to `.1` under the same
    /// name (stored state written under the old numbers is read under the new).
    pub(crate) switch: Option<(usize, Quota)>,
    pub(crate) start: Micros,
    pub(crate) calls: Vec<Call>,
    pub(crate) keys: Vec<Vec<u8>>,
}

impl Scenario {
    /// The quota in force at call `i`.
    pub(crate) fn quota_at(&self, i: usize) -> &Quota {
        match &self.switch {
            Some((k, q)) if i >= *k => q,
            _ => &self.quota,
        }
    }

    /// The quota in force after the last call.
    pub(crate) fn final_quota(&self) -> &Quota {
        self.quota_at(usize::MAX)
    }

    /// Absolute times of the calls.
    ///
    /// A step back never returns to before a moment at which some key's
    /// state had already expired (by the model's derived TTL) and so may
    /// have been evicted: what a store does with state it was entitled to
    /// forget is its own business, and no contract speaks of it.
    pub(crate) fn times(&self) -> impl Iterator<Item = (Micros, &Call)> + '_ {
        let mut t = self.start;
        let mut seen = self.start;
        // Per key: the model's state and when it expires.
        let mut last: HashMap<usize, (State, Micros)> = HashMap::new();
        let mut out = Vec::with_capacity(self.calls.len());
        for (i, c) in self.calls.iter().enumerate() {
            t = if c.back {
                let passed = last
                    .values()
                    .map(|&(_, expiry)| expiry)
                    .filter(|&e| e <= seen)
                    .max()
                    .unwrap_or(T0);
                t.saturating_sub(c.dt).max(T0).max(passed)
            } else {
                t + c.dt
            };
            seen = seen.max(t);
            let prior = last.remove(&c.key).map(|(s, _)| s);
            if let Ok(step) = model::decide(self.quota_at(i), prior, t, c.cost) {
                last.insert(c.key, (step.state, t + step.ttl));
            }
            out.push((t, c));
        }
        out.into_iter()
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
        if let Some((k, q)) = &self.switch {
            writeln!(
                f,
                "  from call #{k} on, the same policy reconfigured as: {}",
                describe(q)
            )?;
        }
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
                "  #{i}: t = start {} {} µs{}, key {}, cost {}",
                if t >= self.start { "+" } else { "-" },
                t.abs_diff(self.start),
                if c.back { " (clock stepped back)" } else { "" },
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

/// Quotas at the edges of the exact range: limits up to 10^12, windows up
/// to a day, sliding windows with `limit * window` at 2^53 - 1, token
/// buckets with the largest burst their rate allows.
pub(crate) fn large_quotas(kinds: &'static [AlgorithmKind]) -> impl Strategy<Value = Quota> {
    (
        prop::sample::select(kinds),
        1u64..=1_000_000_000_000,
        1u64..=86_400_000_000,
        0u64..4,
    )
        .prop_map(|(kind, limit, window, slack)| {
            let period = Duration::from_micros(window);
            match kind {
                AlgorithmKind::FixedWindow => Quota::fixed_window(Rate::new(limit, period)),
                AlgorithmKind::SlidingWindow => {
                    let max = (ratelimit_core::MAX_EXACT / window).max(1);
                    Quota::sliding_window(Rate::new(max.saturating_sub(slack).max(1), period))
                }
                AlgorithmKind::SlidingLog => Quota::sliding_log(Rate::new(limit, period)),
                _ => {
                    let probe = Quota::token_bucket(Rate::new(limit, period), 1)
                        .expect("a burst of 1 fits every rate here");
                    let Algorithm::TokenBucket(b) = probe.algorithm() else {
                        unreachable!()
                    };
                    let burst = ((ratelimit_core::MAX_EXACT - b.refill()) / b.unit())
                        .saturating_sub(slack)
                        .max(1);
                    Quota::token_bucket(Rate::new(limit, period), burst)
                }
            }
            .expect("quotas at the edge of the exact range are valid")
        })
}

/// Scenarios over `keys` distinct keys (named `k0`, `k1`, ...) with small
/// quotas and a clock that only moves forward.
pub(crate) fn scenarios(
    kinds: &'static [AlgorithmKind],
    keys: usize,
    max_calls: usize,
) -> BoxedStrategy<Scenario> {
    scenarios_with(quotas(kinds).boxed(), keys, max_calls, false)
}

/// Scenarios that also use quotas at the edge of the exact range, costs up to
/// the limit, and a clock that sometimes steps back.
pub(crate) fn wild_scenarios(
    kinds: &'static [AlgorithmKind],
    keys: usize,
    max_calls: usize,
) -> BoxedStrategy<Scenario> {
    let q = prop_oneof![quotas(kinds), large_quotas(kinds)].boxed();
    scenarios_with(q, keys, max_calls, true)
        .prop_flat_map(|sc| {
            let kind: &'static [AlgorithmKind] = match sc.quota.kind() {
                AlgorithmKind::FixedWindow => &[AlgorithmKind::FixedWindow],
                AlgorithmKind::SlidingWindow => &[AlgorithmKind::SlidingWindow],
                AlgorithmKind::SlidingLog => &[AlgorithmKind::SlidingLog],
                _ => &[AlgorithmKind::TokenBucket],
            };
            let n = sc.calls.len();
            let other = prop_oneof![quotas(kind), large_quotas(kind)];
            (Just(sc), prop::option::weighted(0.25, (0..n, other)))
        })
        .prop_map(|(mut sc, switch)| {
            if let Some((k, q)) = switch {
                let limit = q.limit();
                for c in &mut sc.calls[k..] {
                    c.cost = c.cost.min(limit);
                }
                sc.switch = Some((k, q));
            }
            sc
        })
        .boxed()
}

fn scenarios_with(
    quotas: BoxedStrategy<Quota>,
    keys: usize,
    max_calls: usize,
    wild: bool,
) -> BoxedStrategy<Scenario> {
    quotas
        .prop_flat_map(move |quota| {
            let w = window_of(&quota);
            let limit = quota.limit();
            let dt = prop_oneof![
                3 => Just(0u64),
                4 => 0..=w / 8,
                2 => 0..=w,
                1 => w..=3 * w,
            ];
            let back = if wild {
                prop::bool::weighted(0.1).boxed()
            } else {
                Just(false).boxed()
            };
            let big = if wild {
                prop::bool::weighted(0.2).boxed()
            } else {
                Just(false).boxed()
            };
            let call = (dt, back, 0..keys, 1u64..=4, big, 0u64..=1000).prop_map(
                move |(dt, back, key, small, big, frac)| Call {
                    dt,
                    back,
                    key,
                    cost: if big {
                        (u64::try_from(u128::from(limit) * u128::from(frac) / 1000)
                            .unwrap_or(limit))
                        .clamp(1, limit)
                    } else {
                        small.min(limit)
                    },
                },
            );
            (
                Just(quota),
                0..w,
                prop::collection::vec(call, 1..=max_calls),
            )
                .prop_map(move |(quota, phase, calls)| Scenario {
                    quota,
                    switch: None,
                    start: T0 + phase,
                    calls,
                    keys: (0..keys).map(|i| format!("k{i}").into_bytes()).collect(),
                })
        })
        .boxed()
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
