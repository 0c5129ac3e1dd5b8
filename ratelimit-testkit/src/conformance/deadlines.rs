//! Contract 10: a request carried out after its deadline counts nothing.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use proptest::prelude::*;
use ratelimit_core::model::{self, Charge, State};
use ratelimit_core::store::{Answer, Capabilities, Deadline, Decisions, Request};
use ratelimit_core::{AlgorithmKind, ManualClock, Micros, Store, StoreError};
use tokio::runtime::Handle;

use super::door;
use super::scenario::{Scenario, Shape, case_prefix, key_bytes, run_cases, scenarios};
use super::{Contract, StoreFactory, SuiteConfig, Violation};

/// How a call of the scenario is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Send {
    /// With the suite's ordinary (relative, generous) deadline.
    InTime,
    /// With a relative deadline of zero: passed as the store receives it.
    ZeroTimeout,
    /// With an absolute deadline at or before the moment it is sent.
    Past,
    /// As `Past`, charging every policy of the scenario at once.
    PastSet,
}

/// What the store under test answered, as [`Witness`] saw it.
#[derive(Debug)]
enum Seen {
    /// No answer yet.
    Nothing,
    /// Decisions.
    Decided,
    /// [`StoreError::Expired`].
    Expired,
    /// Another error (its `Debug`).
    Other(String),
}

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Nothing => f.write_str("no answer"),
            Self::Decided => f.write_str("decisions"),
            Self::Expired => f.write_str("StoreError::Expired"),
            Self::Other(e) => write!(f, "StoreError::{e}"),
        }
    }
}

/// The store under test, forwarding its one door and its capabilities (so
/// that the door's rules apply to it unchanged) and keeping what it
/// answered: the door reports a store's error as text, and contract 10
/// needs to tell [`StoreError::Expired`] from every other error.
#[derive(Debug)]
struct Witness<'s> {
    store: &'s dyn Store,
    seen: Mutex<Seen>,
}

impl<'s> Witness<'s> {
    fn new(store: &'s dyn Store) -> Self {
        Self {
            store,
            seen: Mutex::new(Seen::Nothing),
        }
    }

    fn note(&self, result: &ratelimit_core::Result<Decisions>) {
        let seen = match result {
            Ok(_) => Seen::Decided,
            Err(StoreError::Expired) => Seen::Expired,
            Err(e) => Seen::Other(format!("{e:?}")),
        };
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = seen;
    }

    fn seen(&self) -> Seen {
        std::mem::replace(
            &mut *self.seen.lock().unwrap_or_else(|p| p.into_inner()),
            Seen::Nothing,
        )
    }
}

impl Store for Witness<'_> {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        match self.store.decide(request).into_ready() {
            Ok(result) => {
                self.note(&result);
                Answer::ready(result)
            }
            Err(pending) => Answer::pending(async move {
                let result = pending.await;
                self.note(&result);
                result
            }),
        }
    }

    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }
}

/// Contract 10: a request whose deadline has passed when the store comes
/// to carry it out (the limiter has answered it by its failure policy
/// already) counts nothing: the store answers
/// [`StoreError::Expired`], and every later decision is the model's over
/// the other calls alone.
///
/// No other error will do: `Expired` is the one that says the request
/// counted nothing (a [`StoreError::Timeout`], say, says it may have run),
/// and the one the limiter's circuit breaker does not hold against the
/// store (a request that was late says nothing about the store's health).
///
/// Scenarios as for contract 1 (all four algorithms, several keys and
/// policies); about half of the calls are sent with a deadline already
/// passed: a zero relative deadline, an absolute one at the moment of
/// sending, or an absolute one on a request charging every policy at once.
pub async fn deadlines(factory: &dyn StoreFactory, config: &SuiteConfig) -> Result<(), Violation> {
    let h = Handle::current();
    let shape = Shape {
        kinds: &AlgorithmKind::ALL,
        max_calls: 40,
        back: false,
        switch: false,
    };
    let sends = prop::collection::vec(
        prop_oneof![
            4 => Just(Send::InTime),
            1 => Just(Send::ZeroTimeout),
            1 => Just(Send::Past),
            2 => Just(Send::PastSet),
        ],
        1..=64,
    );
    run_cases(
        config,
        Contract::Deadline,
        config.fewer_cases(),
        (scenarios(shape), sends),
        |(sc, sends)| h.block_on(check(factory, &sc, &sends)),
    )
}

async fn check(factory: &dyn StoreFactory, sc: &Scenario, sends: &[Send]) -> Result<(), String> {
    let clock = ManualClock::new(sc.start);
    let store = factory
        .stores(1, Some(clock.clone()))
        .await
        .into_iter()
        .next()
        .ok_or("the factory returned no store")?;
    let prefix = case_prefix();
    let mut states: HashMap<(usize, usize), (State, Micros)> = HashMap::new();
    for (i, c) in sc.timed().into_iter().enumerate() {
        clock.set(c.t);
        let key = key_bytes(&prefix, &sc.keys[c.key]);
        let quota = sc.quota_at(i, c.policy);
        let send = sends[i % sends.len()];
        let deadline = match send {
            Send::InTime => None,
            Send::ZeroTimeout => Some(Deadline::within(std::time::Duration::ZERO)),
            Send::Past | Send::PastSet => Some(Deadline::at(Instant::now())),
        };
        if let Some(deadline) = deadline {
            let mut charges = vec![Charge::new(quota, c.cost)];
            if send == Send::PastSet {
                for (p, q) in sc.policies.iter().enumerate() {
                    if p != c.policy && (q.name() != quota.name() || q.kind() != quota.kind()) {
                        charges.push(Charge::new(q, 1));
                    }
                }
            }
            let witness = Witness::new(&*store);
            match door::ask_before(&witness, &key, &charges, deadline).await {
                Ok(ds) => {
                    return Err(format!(
                        "call #{i} ({send:?}, {} charges): a request whose deadline had passed \
                         was decided {ds:?}; it must fail (StoreError::Expired) and count nothing",
                        charges.len()
                    ));
                }
                Err(e) if door::names_a_broken_rule(&e) => {
                    return Err(format!(
                        "call #{i} ({send:?}, {} charges): {e}",
                        charges.len()
                    ));
                }
                Err(e) => match witness.seen() {
                    Seen::Expired => continue,
                    seen => {
                        return Err(format!(
                            "call #{i} ({send:?}, {} charges): a request whose deadline had \
                             passed was answered \"{e}\" ({seen}) instead of \
                             StoreError::Expired, the one error that says it counted nothing",
                            charges.len()
                        ));
                    }
                },
            }
        }
        let got = door::ask_one(&*store, &key, quota, c.cost)
            .await
            .map_err(|e| format!("call #{i}: {e}"))?;
        let prior = states
            .remove(&(c.key, c.policy))
            .filter(|&(_, exp)| exp > c.t)
            .map(|(s, _)| s);
        let step = model::decide(quota, prior, c.t, c.cost).map_err(|e| e.to_string())?;
        if got != step.decision {
            return Err(format!(
                "call #{i} (key {}, policy {}, cost {}): the store decided\n    {got:?}\n  but \
                 the model, counting none of the expired requests before it, decides\n    {:?}",
                c.key, c.policy, c.cost, step.decision
            ));
        }
        states.insert((c.key, c.policy), (step.state, c.t + step.ttl));
    }
    Ok(())
}
