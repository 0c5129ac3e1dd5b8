//! Contract 11: several quotas on one call, all or nothing.

use std::collections::HashMap;
use std::fmt;

use proptest::prelude::*;
use ratelimit_core::model::{self, Charge, State};
use ratelimit_core::{AlgorithmKind, Decision, ManualClock, Micros, Quota};
use tokio::runtime::Handle;

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
}

#[derive(Clone)]
struct Multi {
    policies: Vec<Quota>,
    shadow: Vec<bool>,
    start: Micros,
    calls: Vec<MultiCall>,
    keys: Vec<KeyTemplate>,
}

impl Multi {
    fn charges(&self, costs: &[u64]) -> Vec<Charge<'_>> {
        self.policies
            .iter()
            .zip(costs)
            .zip(&self.shadow)
            .map(|((quota, &cost), &shadow)| Charge {
                quota,
                cost,
                shadow,
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
            let prior = (0..self.policies.len())
                .map(|p| {
                    states
                        .get(&(c.key, p))
                        .filter(|(_, exp)| *exp > t)
                        .map(|(s, _)| s.clone())
                })
                .collect();
            let step = model::decide_all(&self.charges(&c.costs), prior, t)
                .expect("costs are within the limits");
            for (p, w) in step.writes.iter().enumerate() {
                if let Some((s, ttl)) = w {
                    states.insert((c.key, p), (s.clone(), t + ttl));
                }
            }
            if !step.admitted {
                let wait = step
                    .decisions
                    .iter()
                    .zip(&self.shadow)
                    .filter(|(d, shadow)| !d.allowed && !**shadow)
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
                "  #{i}: t = start + {} µs{}, key {}, costs {:?}",
                t - self.start,
                match c.retry {
                    Some(true) => " (retry_after - 1 µs)",
                    Some(false) => " (retry_after)",
                    None => "",
                },
                c.key,
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
            let call = (
                prop_oneof![3 => Just(0u64), 4 => 0..=w / 4, 2 => 0..=w, 1 => w..=3 * w],
                prop::option::weighted(0.25, any::<bool>()),
                0..keys.len(),
                costs,
            )
                .prop_map(|(dt, retry, key, costs)| MultiCall {
                    dt,
                    retry,
                    key,
                    costs,
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

/// Contract 11: with several quotas on one call
/// ([`ratelimit_core::Store::decide_all`]), the call is admitted only if
/// every enforced quota admits it, and a denied call is counted in no
/// quota. Two or three quotas of any mix of algorithms (names built to
/// collide under naive joins), each with its own cost, one of them in
/// shadow mode in a quarter of the cases, calls on the last denial's
/// `retry_after` ± 1 µs.
///
/// Checked two ways: by brute force over the log of counted calls, each
/// quota's own bounds (contracts 2-5, a call counted only when the whole
/// call was admitted) hold; and call for call against
/// [`ratelimit_core::model::decide_all`]. A store on the trait's provided
/// (non-atomic) `decide_all` fails: it returns decisions only up to the
/// first denial, and a quota checked before a denying one counts the call.
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
                    let got = store
                        .decide_all(&key, &m.charges(&c.costs))
                        .await
                        .map_err(|e| format!("call #{i}: the store failed: {e}"))?;
                    if got.len() != m.policies.len() {
                        return Err(format!(
                            "call #{i}: {} decisions for {} quotas (a store on the non-atomic \
                             default stops at the first denial)",
                            got.len(),
                            m.policies.len()
                        ));
                    }
                    let admitted = got
                        .iter()
                        .zip(&m.shadow)
                        .all(|(d, shadow)| *shadow || d.allowed);
                    for (p, d) in got.iter().enumerate() {
                        logs[p].push(Outcome {
                            t: *t,
                            key: c.key,
                            policy: p,
                            cost: c.costs[p],
                            allowed: d.allowed,
                            counted: admitted && d.allowed,
                        });
                    }
                    got_all.push((i, got, step.clone()));
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
                for (i, got, step) in got_all {
                    for (p, (d, m)) in got.iter().zip(&step.decisions).enumerate() {
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
