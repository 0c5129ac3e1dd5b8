//! Generated inputs: policies, keys and a sequence of calls.
//!
//! The generators aim at what breaks stores, not at uniform draws:
//!
//! - **sizes**: limits log-uniform from 1 to 10^6 and at the edge of the
//!   exact range (2^53), windows log-uniform from 1 µs to the 400-day
//!   maximum and the production windows (second, minute, hour, day), costs
//!   from 1 to the limit biased to 1 and to the limit;
//! - **edges**: about 30 % of the calls are placed on purpose at the next
//!   window start or one microsecond before it, at the caller's derived TTL
//!   or one microsecond before, at the last denial's `retry_after` or one
//!   microsecond before (times computed with the model as the calls are laid
//!   out);
//! - **policies**: two or three policies per scenario, with policy names and
//!   caller ids chosen to collide under a naive `caller.policy` or
//!   `policy.caller` join;
//! - **long logs**: one scenario in ten first fills one caller with 1,000 to
//!   1,500 calls (a sliding log then holds at least 1,000 live entries);
//! - **clock steps back** (model agreement, `Retry-After`, expiry).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};

use ratelimit_core::model::{self, State};
use ratelimit_core::quota::MAX_WINDOW;
use ratelimit_core::{
    Algorithm, AlgorithmKind, MAX_BUCKET, MAX_EXACT, MAX_TIME, Micros, Quota, Rate,
};

use super::{Contract, SuiteConfig, Violation};

/// A minute boundary: every generated window starts at a known phase from it.
pub(crate) const T0: Micros = 1_800_000_000_000_000;

/// Calls never go past this time ([`MAX_TIME`]), so every time, TTL and
/// token bucket state stays below 2^53.
const T_MAX: Micros = MAX_TIME - 1;

/// The longest window, in µs.
const MAX_WINDOW_MICROS: u64 = MAX_WINDOW.as_micros() as u64;

/// When a call happens: after the previous call, or on an edge of its
/// caller's state under its policy (computed with the model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum When {
    /// `dt` µs after the previous call.
    After(u64),
    /// `dt` µs before the previous call: the clock stepped back.
    Back(u64),
    /// At the next start of a window of the call's policy (or 1 µs before).
    WindowStart { minus: bool },
    /// At the expiry (derived TTL) of the caller's state (or 1 µs before).
    Ttl { minus: bool },
    /// At `retry_after` of the caller's last denial (or 1 µs before).
    Retry { minus: bool },
}

/// One generated call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Call {
    pub(crate) when: When,
    pub(crate) key: usize,
    pub(crate) policy: usize,
    pub(crate) cost: u64,
}

/// One call laid out in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timed {
    pub(crate) t: Micros,
    pub(crate) key: usize,
    pub(crate) policy: usize,
    pub(crate) cost: u64,
    pub(crate) when: When,
}

/// A caller id: `head ++ case prefix ++ tail`, so that suites sharing a
/// server never meet, while ids can still be built to collide under naive
/// joins on either side.
pub(crate) type KeyTemplate = (Vec<u8>, Vec<u8>);

/// Policies, a start time and calls.
#[derive(Clone)]
pub(crate) struct Scenario {
    /// Distinct names; all of one algorithm for the invariant contracts.
    pub(crate) policies: Vec<Quota>,
    /// From call `.0` on, policy 0 is reconfigured to `.1` under the same
    /// name (stored state written under the old numbers is read under the new).
    pub(crate) switch: Option<(usize, Quota)>,
    pub(crate) start: Micros,
    /// Calls of cost 1 on key 0, policy 0, `fill_step` µs apart, before `calls`.
    pub(crate) fill: usize,
    pub(crate) fill_step: u64,
    pub(crate) calls: Vec<Call>,
    pub(crate) keys: Vec<KeyTemplate>,
}

/// Per (key, policy) while laying out calls: the model's state, when it
/// expires, and when the last denial may be retried.
#[derive(Default)]
struct Track {
    state: Option<State>,
    expiry: Option<Micros>,
    retry_at: Option<Micros>,
}

impl Scenario {
    /// The quota in force for `policy` at call `i` (counting fill calls).
    pub(crate) fn quota_at(&self, i: usize, policy: usize) -> &Quota {
        match &self.switch {
            Some((k, q)) if policy == 0 && i >= self.fill + *k => q,
            _ => &self.policies[policy],
        }
    }

    /// The quota in force for `policy` after the last call.
    pub(crate) fn final_quota(&self, policy: usize) -> &Quota {
        self.quota_at(usize::MAX, policy)
    }

    /// Whether call `i` (counting fill calls) comes after policy 0 was
    /// reconfigured.
    pub(crate) fn switched(&self, i: usize, policy: usize) -> bool {
        policy == 0
            && self
                .switch
                .as_ref()
                .is_some_and(|(k, _)| i >= self.fill + *k)
    }

    /// Every call with its absolute time.
    ///
    /// A step back never returns to before a moment at which some caller's
    /// state had already expired (by the model's derived TTL) and so may
    /// have been evicted: what a store does with state it was entitled to
    /// forget is its own business, and no contract speaks of it.
    pub(crate) fn timed(&self) -> Vec<Timed> {
        let mut t = self.start;
        let mut seen = self.start;
        let mut track: HashMap<(usize, usize), Track> = HashMap::new();
        let fill = (0..self.fill).map(|_| Call {
            when: When::After(self.fill_step),
            key: 0,
            policy: 0,
            cost: 1,
        });
        let mut out = Vec::with_capacity(self.fill + self.calls.len());
        for (i, c) in fill.chain(self.calls.iter().copied()).enumerate() {
            let quota = self.quota_at(i, c.policy);
            let tr = track.entry((c.key, c.policy)).or_default();
            let edge = |at: Option<Micros>, minus: bool| {
                at.map_or(t, |a| a.saturating_sub(u64::from(minus)).max(t))
            };
            t = match c.when {
                When::After(dt) => t.saturating_add(dt),
                When::Back(dt) => {
                    let passed = track
                        .values()
                        .filter_map(|tr| tr.expiry)
                        .filter(|&e| e <= seen)
                        .max()
                        .unwrap_or(T0);
                    t.saturating_sub(dt).max(T0).max(passed)
                }
                When::WindowStart { minus } => {
                    let w = window_of(quota);
                    edge(Some((t / w + 1) * w), minus)
                }
                When::Ttl { minus } => edge(tr.expiry, minus),
                When::Retry { minus } => edge(tr.retry_at, minus),
            }
            .min(T_MAX);
            seen = seen.max(t);
            let tr = track.entry((c.key, c.policy)).or_default();
            let prior = if tr.expiry.is_some_and(|e| e > t) {
                tr.state.take()
            } else {
                None
            };
            if let Ok(step) = model::decide(quota, prior, t, c.cost) {
                tr.expiry = Some(t + step.ttl);
                tr.retry_at = step.decision.retry_after.map(|r| t + micros(r));
                tr.state = Some(step.state);
            }
            out.push(Timed {
                t,
                key: c.key,
                policy: c.policy,
                cost: c.cost,
                when: c.when,
            });
        }
        out
    }
}

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

pub(crate) fn describe(q: &Quota) -> String {
    let body = match q.algorithm() {
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
    };
    format!("{:?} {body}", q.name())
}

fn show_key((head, tail): &KeyTemplate) -> String {
    format!(
        "{}<prefix>{}",
        String::from_utf8_lossy(head).escape_debug(),
        String::from_utf8_lossy(tail).escape_debug()
    )
}

impl fmt::Debug for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (p, q) in self.policies.iter().enumerate() {
            writeln!(f, "  quota: policy {p}: {}", describe(q))?;
        }
        if let Some((k, q)) = &self.switch {
            writeln!(
                f,
                "  from call #{} on, policy 0 reconfigured under the same name as: {}",
                self.fill + k,
                describe(q)
            )?;
        }
        writeln!(f, "  start: T0 + {} µs (T0 = {T0})", self.start - T0)?;
        writeln!(
            f,
            "  keys: {}",
            self.keys
                .iter()
                .map(show_key)
                .collect::<Vec<_>>()
                .join(", ")
        )?;
        if self.fill > 0 {
            writeln!(
                f,
                "  #0..#{}: {} calls of cost 1 on key 0, policy 0, {} µs apart",
                self.fill - 1,
                self.fill,
                self.fill_step
            )?;
        }
        for (i, c) in self.timed().iter().enumerate().skip(self.fill) {
            let how = match c.when {
                When::After(_) => String::new(),
                When::Back(_) => " (clock stepped back)".to_owned(),
                When::WindowStart { minus } => {
                    format!(" (window start{})", if minus { " - 1 µs" } else { "" })
                }
                When::Ttl { minus } => format!(" (TTL{})", if minus { " - 1 µs" } else { "" }),
                When::Retry { minus } => {
                    format!(" (retry_after{})", if minus { " - 1 µs" } else { "" })
                }
            };
            writeln!(
                f,
                "  #{i}: t = start {} {} µs{how}, key {}, policy {}, cost {}",
                if c.t >= self.start { "+" } else { "-" },
                c.t.abs_diff(self.start),
                c.key,
                c.policy,
                c.cost
            )?;
        }
        Ok(())
    }
}

pub(crate) fn window_of(q: &Quota) -> u64 {
    micros(q.window()).max(1)
}

/// Log-uniform integers in `[lo, hi]` (shrinking towards `lo`).
fn log_uniform(lo: u64, hi: u64) -> BoxedStrategy<u64> {
    let (l, h) = ((lo.max(1) as f64).ln(), (hi.max(1) as f64).ln());
    (0.0f64..=1.0)
        .prop_map(move |x| ((l + (h - l) * x).exp().round() as u64).clamp(lo, hi))
        .boxed()
}

/// Windows: log-uniform from 1 µs to 400 days, and the production ones.
fn windows() -> BoxedStrategy<u64> {
    prop_oneof![
        3 => log_uniform(1, MAX_WINDOW_MICROS),
        2 => prop::sample::select(vec![
            1_000_000u64,
            60_000_000,
            3_600_000_000,
            86_400_000_000,
            86_400_000_001,
            MAX_WINDOW_MICROS,
        ]),
    ]
    .boxed()
}

/// Builds a quota of `kind` from the drawn numbers, falling back to smaller
/// numbers where a constructor rejects them (so the generator follows the
/// range each algorithm accepts).
fn build(kind: AlgorithmKind, limit: u64, window: u64, burst: u64, edge: bool) -> Quota {
    let period = Duration::from_micros(window);
    let mut limit = limit.clamp(1, MAX_EXACT);
    loop {
        let rate = Rate::new(limit, period);
        let q = match kind {
            AlgorithmKind::FixedWindow => Quota::fixed_window(rate),
            AlgorithmKind::SlidingWindow => {
                let max = (MAX_EXACT / window).max(1);
                let l = if edge { max } else { limit.min(max) };
                Quota::sliding_window(Rate::new(l, period))
            }
            AlgorithmKind::SlidingLog => Quota::sliding_log(rate),
            _ => token_bucket(rate, burst, edge),
        };
        match q {
            Ok(q) => return q,
            Err(_) if limit > 1 => limit /= 10,
            Err(_) => {
                return Quota::fixed_window(Rate::per_second(1)).expect("a valid fallback");
            }
        }
    }
}

fn token_bucket(rate: Rate, burst: u64, edge: bool) -> Result<Quota, ratelimit_core::ConfigError> {
    let probe = Quota::token_bucket(rate, 1)?;
    let Algorithm::TokenBucket(b) = probe.algorithm() else {
        unreachable!("a token bucket")
    };
    let max = (MAX_BUCKET - b.refill()) / b.unit();
    let mut burst = if edge { max } else { burst.min(max) }.max(1);
    loop {
        match Quota::token_bucket(rate, burst) {
            Ok(q) => return Ok(q),
            Err(_) if burst > 1 => burst /= 2,
            Err(e) => return Err(e),
        }
    }
}

/// Quotas of the given kinds: small (limits ≤ 10, windows 1 ms–3 s, where
/// denials come quickly), production-sized (log-uniform limits up to 10^6,
/// windows up to 400 days), and at the edge of the exact range.
pub(crate) fn quotas(kinds: &'static [AlgorithmKind]) -> BoxedStrategy<Quota> {
    let kind = prop::sample::select(kinds);
    let small = (
        kind.clone(),
        1u64..=10,
        prop_oneof![1_000u64..=50_000, 50_000u64..=3_000_000],
        1u64..=10,
    )
        .prop_map(|(k, l, w, b)| build(k, l, w, b, false));
    let production = (
        kind.clone(),
        log_uniform(1, 1_000_000),
        windows(),
        log_uniform(1, 1_000_000),
    )
        .prop_map(|(k, l, w, b)| build(k, l, w, b, false));
    let edge = (
        kind,
        prop_oneof![Just(MAX_EXACT), log_uniform(1, MAX_EXACT)],
        windows(),
        Just(0u64),
    )
        .prop_map(|(k, l, w, _)| build(k, l, w, 0, true));
    prop_oneof![3 => small, 3 => production, 1 => edge].boxed()
}

/// Policy name sets that collide under a naive join with the caller ids of
/// [`KEY_SETS`]: `"{p}a" . "b.c"` = `"{p}a.b" . "c"`, and
/// `"b.c" . "c.{p}a"`-style joins on the other side.
const NAME_SETS: [[&str; 3]; 4] = [
    ["b.c", "c", "b"],
    ["b-c", "c", "b"],
    ["b_c", "c", "b"],
    ["default", "default.c", "c"],
];

/// Caller ids as `(head, tail)` around the case prefix.
fn key_sets() -> Vec<Vec<KeyTemplate>> {
    let k = |h: &str, t: &str| (h.as_bytes().to_vec(), t.as_bytes().to_vec());
    vec![
        vec![k("", "a"), k("", "a.b"), k("c.", "a")],
        vec![k("", "a"), k("", "a-b"), k("c-", "a")],
        vec![k("", "a"), k("", "a_b"), k("c_", "a")],
        vec![k("", "k0"), k("", "k1"), k("", "k2")],
    ]
}

/// How each call's time is chosen, relative to the policy's window `w`.
fn when(w: u64, back: bool) -> BoxedStrategy<When> {
    let minus = any::<bool>();
    let forward = prop_oneof![
        3 => Just(When::After(0)),
        4 => (0..=w / 8).prop_map(When::After),
        2 => (0..=w).prop_map(When::After),
        1 => (w..=w.saturating_mul(3)).prop_map(When::After),
        2 => minus.prop_map(|minus| When::WindowStart { minus }),
        1 => minus.prop_map(|minus| When::Ttl { minus }),
        2 => minus.prop_map(|minus| When::Retry { minus }),
    ];
    if back {
        prop_oneof![14 => forward, 1 => (0..=w).prop_map(When::Back)].boxed()
    } else {
        forward.boxed()
    }
}

/// Costs for a limit `l`: 1, `l`, `l - 1`, small, and anything up to `l`.
fn costs(l: u64) -> BoxedStrategy<u64> {
    prop_oneof![
        5 => Just(1u64),
        2 => Just(l),
        1 => Just(l.saturating_sub(1).max(1)),
        2 => 1..=l.min(4),
        2 => log_uniform(1, l),
    ]
    .boxed()
}

/// What a scenario may contain.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// Algorithms the policies are drawn from.
    pub(crate) kinds: &'static [AlgorithmKind],
    /// Most calls after the fill.
    pub(crate) max_calls: usize,
    /// Clock steps back.
    pub(crate) back: bool,
    /// Policy 0 reconfigured part-way under the same name.
    pub(crate) switch: bool,
}

/// Scenarios of the given shape: two or three policies (one in six
/// scenarios has one), up to three callers, edges, fills.
pub(crate) fn scenarios(shape: Shape) -> BoxedStrategy<Scenario> {
    let Shape {
        kinds,
        max_calls,
        back,
        switch,
    } = shape;
    // Half the time every policy has the same algorithm (so naive key joins
    // meet), else each draws its own.
    let same_kind = any::<bool>();
    (
        same_kind,
        prop::collection::vec(quotas(kinds), 3),
        prop_oneof![1 => Just(1usize), 5 => 2usize..=3],
        prop::sample::select(NAME_SETS.to_vec()),
        prop::sample::select(key_sets()),
        1usize..=3,
    )
        .prop_map(|(same, qs, n, names, keys, nkeys)| {
            let first = qs[0].kind();
            let policies: Vec<Quota> = qs
                .into_iter()
                .take(n)
                .zip(names)
                .map(|(q, name)| {
                    let q = if same && q.kind() != first {
                        rebuild_as(&q, first)
                    } else {
                        q
                    };
                    q.named(name).expect("valid names")
                })
                .collect();
            (policies, keys.into_iter().take(nkeys).collect::<Vec<_>>())
        })
        .prop_flat_map(move |(policies, keys)| {
            let nkeys = keys.len();
            let calls = policies
                .iter()
                .enumerate()
                .map(|(p, q)| {
                    (
                        when(window_of(q), back),
                        0..nkeys,
                        costs(q.limit()),
                        Just(p),
                    )
                        .prop_map(|(when, key, cost, policy)| Call {
                            when,
                            key,
                            policy,
                            cost,
                        })
                        .boxed()
                })
                .collect::<Vec<_>>();
            let call = prop::strategy::Union::new(calls);
            let w0 = window_of(&policies[0]);
            let fill = prop_oneof![9 => Just(0usize), 1 => 1_000usize..=1_500];
            let other = if switch {
                prop::option::weighted(0.25, quotas(kinds_of(policies[0].kind()))).boxed()
            } else {
                Just(None).boxed()
            };
            (
                Just(policies),
                Just(keys),
                0..w0,
                fill,
                prop::collection::vec(call, 1..=max_calls),
                other,
                any::<prop::sample::Index>(),
            )
                .prop_map(move |(policies, keys, phase, fill, calls, other, at)| {
                    let mut sc = Scenario {
                        fill_step: 1,
                        policies,
                        switch: None,
                        start: T0 + phase,
                        fill,
                        calls,
                        keys,
                    };
                    if fill > 0 {
                        sc.policies[0] = fill_quota(&sc.policies[0], fill);
                        sc.fill_step = fill_step(&sc.policies[0], fill);
                        let limit = sc.policies[0].limit();
                        for c in sc.calls.iter_mut().filter(|c| c.policy == 0) {
                            c.cost = c.cost.min(limit);
                        }
                    }
                    if let Some(q) = other {
                        let k = at.index(sc.calls.len());
                        let q = q.named(sc.policies[0].name()).expect("valid name");
                        let limit = q.limit();
                        for c in sc.calls[k..].iter_mut().filter(|c| c.policy == 0) {
                            c.cost = c.cost.min(limit);
                        }
                        sc.switch = Some((k, q));
                    }
                    sc
                })
        })
        .boxed()
}

fn kinds_of(kind: AlgorithmKind) -> &'static [AlgorithmKind] {
    match kind {
        AlgorithmKind::FixedWindow => &[AlgorithmKind::FixedWindow],
        AlgorithmKind::SlidingWindow => &[AlgorithmKind::SlidingWindow],
        AlgorithmKind::SlidingLog => &[AlgorithmKind::SlidingLog],
        _ => &[AlgorithmKind::TokenBucket],
    }
}

fn rebuild_as(q: &Quota, kind: AlgorithmKind) -> Quota {
    build(kind, q.limit(), window_of(q), q.limit(), false)
}

/// A policy that can hold a long fill: a sliding log keeps every fill call
/// live (limit at least the fill, window longer than the fill); other
/// algorithms keep their numbers.
fn fill_quota(q: &Quota, fill: usize) -> Quota {
    match q.algorithm() {
        Algorithm::SlidingLog(w) => {
            let n = fill as u64;
            let period = Duration::from_micros(w.window_micros().max(4 * n));
            let limit = w.limit().max(n + n / 4);
            Quota::sliding_log(Rate::new(limit, period))
                .or_else(|_| Quota::sliding_log(Rate::new(n, period)))
                .and_then(|nq| nq.named(q.name()))
                .unwrap_or_else(|_| q.clone())
        }
        _ => q.clone(),
    }
}

/// Fill calls spaced so that a sliding log keeps them all live.
fn fill_step(q: &Quota, fill: usize) -> u64 {
    if fill == 0 {
        return 1;
    }
    (window_of(q) / (4 * fill as u64)).clamp(1, 1_000_000)
}

/// Unique key prefixes: one run id per process, one counter per case, so
/// suites can share a server and run in parallel.
pub(crate) fn case_prefix() -> Vec<u8> {
    static RUN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static CASE: AtomicU64 = AtomicU64::new(0);
    let run = *RUN.get_or_init(rand::random::<u64>);
    format!("t{run:016x}c{}/", CASE.fetch_add(1, Ordering::Relaxed)).into_bytes()
}

/// The store key of a caller template under a case prefix.
pub(crate) fn key_bytes(prefix: &[u8], (head, tail): &KeyTemplate) -> Vec<u8> {
    let mut k = head.clone();
    k.extend_from_slice(prefix);
    k.extend_from_slice(tail);
    k
}

/// Runs a property with proptest (shrinking on failure) from inside a
/// multi-threaded tokio runtime.
pub(crate) fn run_cases<S>(
    config: &SuiteConfig,
    contract: Contract,
    cases: u32,
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
        seed[8] = contract.number();
        seed[9] = contract as u8;
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
        let mut runner = TestRunner::new_with_rng(
            Config {
                cases: cases.max(1),
                failure_persistence: None,
                max_shrink_iters: 1_000,
                ..Config::default()
            },
            rng,
        );
        // A broken rule of the door (see `door::names_a_broken_rule`) does
        // not depend on the sequence: it is reported as found, not shrunk
        // (every later case passes), so a store that hangs past a deadline
        // costs one grace period, not one per shrinking step.
        let rule_broken = std::sync::atomic::AtomicBool::new(false);
        let checked = |v| {
            if rule_broken.load(std::sync::atomic::Ordering::Relaxed) {
                return Ok(());
            }
            check(v).map_err(|e| {
                if super::door::names_a_broken_rule(&e) {
                    rule_broken.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                TestCaseError::fail(e)
            })
        };
        match runner.run(&strategy, checked) {
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
