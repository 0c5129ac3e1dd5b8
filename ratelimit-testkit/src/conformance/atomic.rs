//! Contract 11: several quotas on one call, all or nothing.

use std::collections::HashMap;
use std::fmt;

use proptest::prelude::*;
use ratelimit_core::model::{self, Charge, State};
use ratelimit_core::{AlgorithmKind, Decision, ManualClock, Micros, Quota};
use tokio::runtime::Handle;

use super::door;
use super::oracle::{self, Outcome};
use super::scenario::{
    KeyTemplate, Scenario, Shape, T0, case_prefix, describe, key_bytes, micros, run_cases,
    scenarios, window_of,
};
use super::{Contract, StoreFactory, SuiteConfig, Violation};

/// One call charging every policy, each with its own cost.
#[derive(Debug, Clone)]
struct MultiCall {
    dt: u64,
    /// Placed at the last denial's `retry_after` (or 1 µs before).
    retry: Option<bool>,
    key: usize,
    costs: Vec<u64>,
    /// Bit `p` set: policy `p` is charged (a quota checked alone, or
    /// within a smaller set, shares its state with the full set).
    mask: u32,
}

#[derive(Clone)]
struct Multi {
    policies: Vec<Quota>,
    shadow: Vec<bool>,
    start: Micros,
    calls: Vec<MultiCall>,
    keys: Vec<KeyTemplate>,
}

/// The policies a call charges, in order.
fn charged(mask: u32, n: usize) -> Vec<usize> {
    (0..n).filter(|p| mask & (1 << p) != 0).collect()
}

impl Multi {
    /// The charges of a call on the policies in `mask`, in order.
    fn charges(&self, costs: &[u64], mask: u32) -> Vec<Charge<'_>> {
        charged(mask, self.policies.len())
            .into_iter()
            .map(|p| Charge {
                quota: &self.policies[p],
                cost: costs[p],
                shadow: self.shadow[p],
            })
            .collect()
    }

    /// The calls' times, and the model's decisions for them.
    fn run_model(&self) -> Vec<(Micros, model::AllStep)> {
        let mut t = self.start;
        let mut states: HashMap<(usize, usize), (State, Micros)> = HashMap::new();
        let mut retry_at: HashMap<usize, Micros> = HashMap::new();
        let mut out = Vec::new();
        for c in &self.calls {
            t = match (c.retry, retry_at.get(&c.key)) {
                (Some(minus), Some(&r)) => r.saturating_sub(u64::from(minus)).max(t),
                _ => t + c.dt,
            };
            let policies = charged(c.mask, self.policies.len());
            let prior = policies
                .iter()
                .map(|&p| {
                    states
                        .get(&(c.key, p))
                        .filter(|(_, exp)| *exp > t)
                        .map(|(s, _)| s.clone())
                })
                .collect();
            let step = model::decide_all(&self.charges(&c.costs, c.mask), prior, t)
                .expect("costs are within the limits");
            for (&p, w) in policies.iter().zip(&step.writes) {
                if let Some((s, ttl)) = w {
                    states.insert((c.key, p), (s.clone(), t + ttl));
                }
            }
            if !step.admitted {
                let wait = step
                    .decisions
                    .iter()
                    .zip(&policies)
                    .filter(|(d, p)| !d.allowed && !self.shadow[**p])
                    .filter_map(|(d, _)| d.retry_after)
                    .max();
                if let Some(w) = wait {
                    retry_at.insert(c.key, t + micros(w));
                }
            }
            out.push((t, step));
        }
        out
    }
}

impl fmt::Debug for Multi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (p, q) in self.policies.iter().enumerate() {
            let mode = if self.shadow[p] { " (shadow)" } else { "" };
            writeln!(f, "  quota: policy {p}{mode}: {}", describe(q))?;
        }
        writeln!(f, "  start: T0 + {} µs (T0 = {T0})", self.start - T0)?;
        for (i, ((t, _), c)) in self.run_model().iter().zip(&self.calls).enumerate() {
            writeln!(
                f,
                "  #{i}: t = start + {} µs{}, key {}, policies {:?}, costs {:?}",
                t - self.start,
                match c.retry {
                    Some(true) => " (retry_after - 1 µs)",
                    Some(false) => " (retry_after)",
                    None => "",
                },
                c.key,
                charged(c.mask, self.policies.len()),
                c.costs
            )?;
        }
        Ok(())
    }
}

fn multis(kinds: &'static [AlgorithmKind]) -> BoxedStrategy<Multi> {
    let shape = Shape {
        kinds,
        max_calls: 1,
        back: false,
        switch: false,
    };
    scenarios(shape)
        .prop_filter("two or more policies", |sc: &Scenario| {
            sc.policies.len() >= 2
        })
        .prop_flat_map(|sc| {
            let policies = sc.policies;
            let keys = sc.keys;
            let n = policies.len();
            let w = policies.iter().map(window_of).min().unwrap_or(1);
            let limits: Vec<u64> = policies.iter().map(Quota::limit).collect();
            let costs = limits
                .iter()
                .map(|&l| {
                    prop_oneof![4 => Just(1u64), 1 => Just(l), 2 => 1..=l.min(4), 1 => 1..=l]
                        .boxed()
                })
                .collect::<Vec<_>>();
            let full = (1u32 << n) - 1;
            let call = (
                prop_oneof![3 => Just(0u64), 4 => 0..=w / 4, 2 => 0..=w, 1 => w..=3 * w],
                prop::option::weighted(0.25, any::<bool>()),
                0..keys.len(),
                costs,
                prop_oneof![3 => Just(full), 2 => 1..full],
            )
                .prop_map(|(dt, retry, key, costs, mask)| MultiCall {
                    dt,
                    retry,
                    key,
                    costs,
                    mask,
                });
            (
                Just(policies),
                prop::option::weighted(0.25, 0..n),
                Just(keys),
                0..w,
                prop::collection::vec(call, 1..=60),
            )
                .prop_map(|(policies, shadow_one, keys, phase, calls)| Multi {
                    shadow: (0..policies.len()).map(|p| Some(p) == shadow_one).collect(),
                    policies,
                    start: T0 + phase,
                    calls,
                    keys,
                })
        })
        .boxed()
}

fn same(a: &Decision, b: &Decision) -> bool {
    a == b
}

/// Contract 11: with several quotas on one request, the call is admitted
/// only if every enforced quota admits it, and a denied call is counted in
/// no quota; and a quota checked alone, or within a smaller set, is the
/// same state as within the full set (one keyspace per quota). Two or three
/// quotas of any mix of algorithms (names built to collide under naive
/// joins), each with its own cost, one of them in shadow mode in a quarter
/// of the cases; each request charges all of them or a non-empty subset;
/// calls on the last denial's `retry_after` ± 1 µs.
///
/// Checked two ways: by brute force over the log of counted calls, each
/// quota's own bounds (contracts 2-5, a call counted only when the whole
/// request was admitted) hold; and call for call against
/// [`ratelimit_core::model::decide_all`] with one state per (key, quota).
/// A store that charges quotas one after another (the ones before a
/// denying quota count the denied call), or keeps a set's states apart
/// from the single quotas', fails.
pub async fn quotas_atomic(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    let h = Handle::current();
    run_cases(
        config,
        Contract::Atomicity,
        config.cases,
        multis(&AlgorithmKind::ALL),
        |m| {
            h.block_on(async {
                let clock = ManualClock::new(m.start);
                let store = factory
                    .stores(1, Some(clock.clone()))
                    .await
                    .into_iter()
                    .next()
                    .ok_or("the factory returned no store")?;
                let prefix = case_prefix();
                let want = m.run_model();
                let mut logs: Vec<Vec<Outcome>> = vec![Vec::new(); m.policies.len()];
                let mut got_all = Vec::new();
                for (i, ((t, step), c)) in want.iter().zip(&m.calls).enumerate() {
                    clock.set(*t);
                    let key = key_bytes(&prefix, &m.keys[c.key]);
                    let policies = charged(c.mask, m.policies.len());
                    let got = door::ask(&*store, &key, &m.charges(&c.costs, c.mask))
                        .await
                        .map_err(|e| format!("call #{i}: {e}"))?;
                    let admitted = got
                        .iter()
                        .zip(&policies)
                        .all(|(d, &p)| m.shadow[p] || d.allowed);
                    for (&p, d) in policies.iter().zip(got.iter()) {
                        logs[p].push(Outcome {
                            t: *t,
                            key: c.key,
                            policy: p,
                            cost: c.costs[p],
                            allowed: d.allowed,
                            counted: admitted && d.allowed,
                        });
                    }
                    got_all.push((i, policies, got, step.clone()));
                }
                // Each quota's own bounds, counting only admitted calls.
                for (p, log) in logs.iter().enumerate() {
                    let q = std::slice::from_ref(&m.policies[p]);
                    let only: Vec<Outcome> =
                        log.iter().map(|o| Outcome { policy: 0, ..*o }).collect();
                    let check = match m.policies[p].kind() {
                        AlgorithmKind::FixedWindow => oracle::fixed_window,
                        AlgorithmKind::SlidingWindow => oracle::sliding_window,
                        AlgorithmKind::SlidingLog => oracle::sliding_log,
                        _ => oracle::token_bucket,
                    };
                    check(q, &only).map_err(|e| {
                        format!("policy {p}, counting only calls admitted by every quota: {e}")
                    })?;
                }
                // Call for call against the model.
                for (i, policies, got, step) in got_all {
                    for (&p, (d, m)) in policies.iter().zip(got.iter().zip(&step.decisions)) {
                        if !same(d, m) {
                            return Err(format!(
                                "call #{i}, policy {p}: the store decided\n    {d:?}\n  but the \
                                 model (all or nothing) decides\n    {m:?}"
                            ));
                        }
                    }
                }
                Ok(())
            })
        },
    )
}
