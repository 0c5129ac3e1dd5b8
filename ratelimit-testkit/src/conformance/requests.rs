//! Contracts 12 and 13: requests the other contracts never send. 12:
//! requests with no deadline (what the `StoreExt` shorthands send), decided
//! as any other. 13: requests [`Request::check`] refuses, refused by the
//! store, counting nothing.

use std::collections::HashMap;
use std::time::Instant;

use proptest::prelude::*;
use ratelimit_core::model::{self, Charge, State};
use ratelimit_core::store::{Deadline, Request};
use ratelimit_core::{AlgorithmKind, Decision, ManualClock, Micros, Quota, Rate, Store};
use tokio::runtime::Handle;

use super::door;
use super::scenario::{Scenario, Shape, case_prefix, key_bytes, run_cases, scenarios};
use super::{Contract, StoreFactory, SuiteConfig, Violation};

/// The model's state per (key, policy) of a scenario, and when it expires.
#[derive(Default)]
struct Model {
    states: HashMap<(usize, usize), (State, Micros)>,
}

impl Model {
    /// The model's decisions for `key` charging each `(policy, cost)` at
    /// `t`, all or nothing, counted.
    fn decide(
        &mut self,
        sc: &Scenario,
        key: usize,
        charged: &[(usize, u64)],
        t: Micros,
    ) -> Result<Vec<Decision>, String> {
        let charges: Vec<Charge<'_>> = charged
            .iter()
            .map(|&(p, cost)| Charge::new(&sc.policies[p], cost))
            .collect();
        let prior = charged
            .iter()
            .map(|&(p, _)| {
                self.states
                    .get(&(key, p))
                    .filter(|(_, expires)| *expires > t)
                    .map(|(s, _)| s.clone())
            })
            .collect();
        let step = model::decide_all(&charges, prior, t).map_err(|e| e.to_string())?;
        for (&(p, _), write) in charged.iter().zip(step.writes) {
            if let Some((state, ttl)) = write {
                self.states.insert((key, p), (state, t + ttl));
            }
        }
        Ok(step.decisions)
    }
}

/// The first store of a fresh set from the factory, on `clock`.
async fn one_store(
    factory: &dyn StoreFactory,
    clock: &ManualClock,
) -> Result<std::sync::Arc<dyn Store>, String> {
    factory
        .stores(1, Some(clock.clone()))
        .await
        .into_iter()
        .next()
        .ok_or_else(|| "the factory returned no store".to_owned())
}

/// How a call of contract 12 is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Undated {
    /// One charge, no deadline.
    None,
    /// Every policy of the scenario at once (the call's own at its cost,
    /// the others at cost 1), no deadline.
    NoneSet,
    /// One charge with the suite's ordinary relative deadline.
    Within,
    /// One charge with an absolute deadline far in the future.
    At,
}

/// Contract 12: requests with **no deadline** (what the `StoreExt`
/// shorthands send, and what a store's own callers may send) are decided
/// as any other: every decision equals the model's, call for call.
///
/// Scenarios as for contract 1 (all four algorithms, several callers and
/// policies, edges, long fills); about three calls in four are sent with
/// no deadline, a third of those charging every policy of the scenario at
/// once; the rest with a relative deadline or an absolute one far in the
/// future. A store that reads the deadline on a path of its own (say, to
/// choose a script or a timeout) and decides differently without one
/// fails.
pub async fn no_deadline(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    let h = Handle::current();
    let shape = Shape {
        kinds: &AlgorithmKind::ALL,
        max_calls: 40,
        back: false,
        switch: false,
    };
    let forms = prop::collection::vec(
        prop_oneof![
            4 => Just(Undated::None),
            2 => Just(Undated::NoneSet),
            1 => Just(Undated::Within),
            1 => Just(Undated::At),
        ],
        1..=64,
    );
    run_cases(
        config,
        Contract::NoDeadline,
        config.fewer_cases(),
        (scenarios(shape), forms),
        |(sc, forms)| h.block_on(check_undated(factory, &sc, &forms)),
    )
}

async fn check_undated(
    factory: &dyn StoreFactory,
    sc: &Scenario,
    forms: &[Undated],
) -> Result<(), String> {
    let clock = ManualClock::new(sc.start);
    let store = one_store(factory, &clock).await?;
    let prefix = case_prefix();
    let mut model = Model::default();
    for (i, c) in sc.timed().into_iter().enumerate() {
        clock.set(c.t);
        let key = key_bytes(&prefix, &sc.keys[c.key]);
        let form = forms[i % forms.len()];
        let mut charged = vec![(c.policy, c.cost)];
        if form == Undated::NoneSet {
            charged.extend(
                (0..sc.policies.len())
                    .filter(|&p| p != c.policy)
                    .map(|p| (p, 1)),
            );
        }
        let charges: Vec<Charge<'_>> = charged
            .iter()
            .map(|&(p, cost)| Charge::new(&sc.policies[p], cost))
            .collect();
        let deadline = match form {
            Undated::None | Undated::NoneSet => Deadline::NONE,
            Undated::Within => Deadline::within(door::DEADLINE),
            Undated::At => Deadline::at(Instant::now() + door::DEADLINE),
        };
        let got = door::ask_before(&*store, &key, &charges, deadline)
            .await
            .map_err(|e| format!("call #{i} ({form:?}): {e}"))?;
        let want = model.decide(sc, c.key, &charged, c.t)?;
        if got[..] != want[..] {
            return Err(format!(
                "call #{i} ({form:?}: key {}, (policy, cost) {charged:?}): the store decided\n    \
                 {:?}\n  but the model decides\n    {want:?}",
                c.key,
                &got[..]
            ));
        }
    }
    Ok(())
}

/// A request [`Request::check`] refuses, sent before a call of contract 13
/// on the call's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// Nothing refused before the call.
    Nothing,
    /// No charge at all.
    NoCharge,
    /// The call's policy at cost 0.
    ZeroCost,
    /// The call's policy at its limit + 1.
    OverLimit,
    /// Every policy of the scenario at a valid cost (the call's own at its
    /// cost), then one more quota at a cost it can never admit.
    BadCostLast,
    /// The call's policy twice, at the call's cost.
    Twice,
}

/// The quota the [`Refused::BadCostLast`] requests end with, at cost 0 or
/// above its limit of 5.
fn extra_quota() -> Quota {
    Quota::fixed_window(Rate::per_minute(5))
        .and_then(|q| q.named("refused-extra"))
        .expect("a valid quota")
}

/// Contract 13: a request that [`Request::check`] refuses (no charge, a
/// cost of zero or above the quota's limit, the same quota twice) is
/// refused by the store with an error, and **counts nothing**: every later
/// decision is the model's over the valid calls alone.
///
/// Scenarios as for contract 1; before about half of the calls, a refused
/// request is sent on the same key (with no deadline or an ordinary one):
/// no charge; the call's policy at cost 0 or at its limit + 1; every
/// policy at a valid cost followed by one more quota at a cost it can
/// never admit (a store that charges quotas one after another counts the
/// valid ones before it finds the bad one); the call's policy twice.
pub async fn refusals(factory: &dyn StoreFactory, config: &SuiteConfig) -> Result<(), Violation> {
    let h = Handle::current();
    let shape = Shape {
        kinds: &AlgorithmKind::ALL,
        max_calls: 40,
        back: false,
        switch: false,
    };
    let forms = prop::collection::vec(
        prop_oneof![
            4 => Just(Refused::Nothing),
            1 => Just(Refused::NoCharge),
            1 => Just(Refused::ZeroCost),
            1 => Just(Refused::OverLimit),
            2 => Just(Refused::BadCostLast),
            2 => Just(Refused::Twice),
        ],
        1..=64,
    );
    run_cases(
        config,
        Contract::Refusals,
        config.fewer_cases(),
        (scenarios(shape), forms),
        |(sc, forms)| h.block_on(check_refusals(factory, &sc, &forms)),
    )
}

async fn check_refusals(
    factory: &dyn StoreFactory,
    sc: &Scenario,
    forms: &[Refused],
) -> Result<(), String> {
    let clock = ManualClock::new(sc.start);
    let store = one_store(factory, &clock).await?;
    let prefix = case_prefix();
    let extra = extra_quota();
    let mut model = Model::default();
    for (i, c) in sc.timed().into_iter().enumerate() {
        clock.set(c.t);
        let key = key_bytes(&prefix, &sc.keys[c.key]);
        let quota = &sc.policies[c.policy];
        let form = forms[i % forms.len()];
        let refused: Vec<Charge<'_>> = match form {
            Refused::Nothing | Refused::NoCharge => Vec::new(),
            Refused::ZeroCost => vec![Charge::new(quota, 0)],
            Refused::OverLimit => vec![Charge::new(quota, quota.limit() + 1)],
            Refused::BadCostLast => {
                let mut charges = vec![Charge::new(quota, c.cost)];
                charges.extend(
                    (sc.policies.iter().enumerate())
                        .filter(|&(p, _)| p != c.policy)
                        .map(|(_, q)| Charge::new(q, 1)),
                );
                let bad = if i % 2 == 0 { 0 } else { extra.limit() + 1 };
                charges.push(Charge::new(&extra, bad));
                charges
            }
            Refused::Twice => vec![Charge::new(quota, c.cost), Charge::new(quota, c.cost)],
        };
        if form != Refused::Nothing {
            if Request::new(&key, &refused).check().is_ok() {
                return Err(format!(
                    "call #{i} ({form:?}): the suite built a request Request::check accepts"
                ));
            }
            let deadline = if i % 2 == 0 {
                Deadline::NONE
            } else {
                Deadline::within(door::DEADLINE)
            };
            match door::ask_before(&*store, &key, &refused, deadline).await {
                Ok(ds) => {
                    return Err(format!(
                        "call #{i} ({form:?}, {} charges): a request Request::check refuses was \
                         decided {ds:?}; it must be refused with an error and count nothing",
                        refused.len()
                    ));
                }
                Err(e) if door::names_a_broken_rule(&e) => {
                    return Err(format!("call #{i} ({form:?}): {e}"));
                }
                Err(_) => {}
            }
        }
        let got = door::ask_one(&*store, &key, quota, c.cost)
            .await
            .map_err(|e| format!("call #{i}: {e}"))?;
        let want = model.decide(sc, c.key, &[(c.policy, c.cost)], c.t)?;
        if want.first() != Some(&got) {
            return Err(format!(
                "call #{i} (key {}, policy {}, cost {}, after {form:?}): the store decided\n    \
                 {got:?}\n  but the model, counting none of the refused requests before it, \
                 decides\n    {:?}",
                c.key, c.policy, c.cost, want
            ));
        }
    }
    Ok(())
}
