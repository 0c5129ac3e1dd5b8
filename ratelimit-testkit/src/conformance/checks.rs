//! Contracts 1-8, each as a proptest property over a store factory.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use ratelimit_core::model::{self, State};
use ratelimit_core::{AlgorithmKind, Clock, Decision, MAX_TIME, ManualClock, Micros, Quota, Store};
use tokio::runtime::Handle;

use super::door;
use super::oracle::{self, Outcome};
use super::scenario::{
    KeyTemplate, Scenario, Shape, case_prefix, describe, key_bytes, micros, run_cases, scenarios,
};
use super::{Contract, StoreFactory, SuiteConfig, Violation};

const ALL: &[AlgorithmKind] = &AlgorithmKind::ALL;

/// One run of a scenario: the clock, the stores, the case prefix, and each
/// call's outcome and decision.
pub(crate) struct Played {
    pub(crate) clock: ManualClock,
    pub(crate) stores: Vec<Arc<dyn Store>>,
    pub(crate) prefix: Vec<u8>,
    pub(crate) got: Vec<(Outcome, Decision)>,
}

/// Runs the scenario on fresh stores from the factory, calling them
/// round-robin (one store: every call on it).
pub(crate) async fn play(
    factory: &dyn StoreFactory,
    sc: &Scenario,
    instances: usize,
) -> Result<Played, String> {
    let clock = ManualClock::new(sc.start);
    let stores = factory.stores(instances, Some(clock.clone())).await;
    if stores.len() != instances {
        return Err(format!(
            "the factory returned {} stores, {instances} were asked for",
            stores.len()
        ));
    }
    let prefix = case_prefix();
    let mut got = Vec::new();
    for (i, c) in sc.timed().into_iter().enumerate() {
        clock.set(c.t);
        let key = key_bytes(&prefix, &sc.keys[c.key]);
        let d = door::ask_one(
            &*stores[i % instances],
            &key,
            sc.quota_at(i, c.policy),
            c.cost,
        )
        .await
        .map_err(|e| format!("call #{i}: {e}"))?;
        got.push((
            Outcome {
                t: c.t,
                key: c.key,
                policy: c.policy,
                cost: c.cost,
                allowed: d.allowed,
                counted: d.allowed,
            },
            d,
        ));
    }
    Ok(Played {
        clock,
        stores,
        prefix,
        got,
    })
}

/// Every field of a decision, `source` included.
pub(crate) fn same(store: &Decision, model: &Decision) -> bool {
    store == model
}

/// Per (key, policy): the last state, the time it was written and its TTL.
type LastStates = HashMap<(usize, usize), (State, Micros, Micros)>;

/// The model's decisions for the scenario, per call, and each caller's
/// last state. A state past its TTL is read as fresh (stores may have
/// evicted it).
fn model_run(sc: &Scenario) -> (Vec<Decision>, LastStates) {
    let mut states: LastStates = HashMap::new();
    let mut out = Vec::new();
    for (i, c) in sc.timed().into_iter().enumerate() {
        let prior = states
            .remove(&(c.key, c.policy))
            .filter(|&(_, t, ttl)| t + ttl > c.t)
            .map(|(s, _, _)| s);
        let step = model::decide(sc.quota_at(i, c.policy), prior, c.t, c.cost)
            .expect("costs are clamped to the limit");
        out.push(step.decision);
        states.insert((c.key, c.policy), (step.state, c.t, step.ttl));
    }
    (out, states)
}

pub(crate) fn compare(sc: &Scenario, got: &[(Outcome, Decision)]) -> Result<(), String> {
    let (want, _) = model_run(sc);
    for (i, ((o, d), m)) in got.iter().zip(&want).enumerate() {
        if sc.switched(i, o.policy) {
            // After a reconfiguration under the same name, state written under
            // the old numbers may be read, or may have been evicted by its old
            // TTL: stores legitimately differ. Every answer must still be sane.
            let q = sc.quota_at(i, o.policy);
            let retry_ok = match (d.allowed, d.retry_after) {
                (true, None) => true,
                (false, Some(r)) => !r.is_zero(),
                _ => false,
            };
            if d.limit != q.limit() || d.remaining > q.limit() || !retry_ok || d.source != m.source
            {
                return Err(format!(
                    "call #{i} after the policy was reconfigured: an insane decision {d:?} under {}",
                    describe(q)
                ));
            }
            continue;
        }
        if !same(d, m) {
            return Err(format!(
                "call #{i} (key {}, policy {}, cost {}, t = start + {} µs): the store decided\n    \
                 {d:?}\n  but the model decides\n    {m:?}",
                o.key,
                o.policy,
                o.cost,
                i128::from(o.t) - i128::from(sc.start)
            ));
        }
    }
    Ok(())
}

/// Contract 1: with an injected clock, the store's decisions equal the core
/// model's, call for call (every field of the [`Decision`], `source`
/// included), over several callers and two or three policies of all four
/// algorithms (names built to collide under naive key joins), small,
/// production-sized and edge-of-range quotas, calls on window starts, TTLs
/// and `retry_after` edges, fills of 1,000+ calls on one caller, and a clock
/// that sometimes steps back. Some sequences reconfigure a policy under the
/// same name part-way: from then on its decisions must be sane (right
/// limit, `remaining <= limit`, a positive `retry_after` exactly when
/// denied) and the store must not fail.
pub async fn model_agreement(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    let h = Handle::current();
    let shape = Shape {
        kinds: ALL,
        max_calls: 60,
        back: true,
        switch: true,
    };
    run_cases(
        config,
        Contract::ModelAgreement,
        config.cases,
        scenarios(shape),
        |sc| {
            h.block_on(async {
                let p = play(factory, &sc, 1).await?;
                compare(&sc, &p.got)
            })
        },
    )
}

async fn invariant(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
    contract: Contract,
    kind: &'static [AlgorithmKind],
    check: fn(&[Quota], &[Outcome]) -> Result<(), String>,
) -> Result<(), Violation> {
    let h = Handle::current();
    let shape = Shape {
        kinds: kind,
        max_calls: 80,
        back: false,
        switch: false,
    };
    run_cases(config, contract, config.cases, scenarios(shape), |sc| {
        h.block_on(async {
            let p = play(factory, &sc, 1).await?;
            let log: Vec<Outcome> = p.got.iter().map(|(o, _)| *o).collect();
            check(&sc.policies, &log)
        })
    })
}

/// Contract 2: a fixed window admits at most L per calendar window, and
/// admits every call that fits its window's count (no false denials).
pub async fn fixed_window_bound(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    invariant(
        factory,
        config,
        Contract::FixedWindow,
        &[AlgorithmKind::FixedWindow],
        oracle::fixed_window,
    )
    .await
}

/// Contract 3: a sliding window counter admits iff
/// `prev * (W - elapsed) / W + curr + cost <= L`, and at most L per calendar window.
pub async fn sliding_window_rule(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    invariant(
        factory,
        config,
        Contract::SlidingWindow,
        &[AlgorithmKind::SlidingWindow],
        oracle::sliding_window,
    )
    .await
}

/// Contract 4: a sliding log admits at most L in every trailing window and
/// never denies a call that fits.
pub async fn sliding_log_exact(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    invariant(
        factory,
        config,
        Contract::SlidingLog,
        &[AlgorithmKind::SlidingLog],
        oracle::sliding_log,
    )
    .await
}

/// Contract 5: a token bucket admits at most `capacity + rate * T` in any
/// span T, and admits whenever the bucket has the tokens.
pub async fn token_bucket_bound(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    invariant(
        factory,
        config,
        Contract::TokenBucket,
        &[AlgorithmKind::TokenBucket],
        oracle::token_bucket,
    )
    .await
}

async fn decide_at(
    store: &dyn Store,
    clock: &ManualClock,
    t: Micros,
    key: &[u8],
    quota: &Quota,
    cost: u64,
) -> Result<Decision, String> {
    clock.set(t);
    door::ask_one(store, key, quota, cost)
        .await
        .map_err(|e| format!("at {t}: {e}"))
}

/// Contract 6: after a scenario, the caller repeats a call until denied; the
/// same call one microsecond before `now + retry_after` is denied, and at
/// `now + retry_after` it is admitted. Scenarios as for contract 1 (clock
/// steps back included); the repeated call has the last call's cost, or a
/// larger one where reaching a denial would take more than 64 calls.
pub async fn retry_after_exact(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    let h = Handle::current();
    let shape = Shape {
        kinds: ALL,
        max_calls: 30,
        back: true,
        switch: false,
    };
    run_cases(
        config,
        Contract::RetryAfter,
        config.cases,
        scenarios(shape),
        |sc| {
            h.block_on(async {
                let p = play(factory, &sc, 1).await?;
                let store = &*p.stores[0];
                let (key_index, policy, last_cost) = p
                    .got
                    .last()
                    .map_or((0, 0, 1), |(o, _)| (o.key, o.policy, o.cost));
                let key = key_bytes(&p.prefix, &sc.keys[key_index]);
                let quota = sc.final_quota(policy);
                let limit = quota.limit();
                let cost = last_cost.min(limit).max(limit.div_ceil(64));
                for _ in 0..=limit / cost + 1 {
                    let now = p.clock.now();
                    let d = decide_at(store, &p.clock, now, &key, quota, cost).await?;
                    if d.allowed {
                        continue;
                    }
                    let retry = d
                        .retry_after
                        .ok_or_else(|| format!("denied at {now} without a retry_after: {d:?}"))?;
                    let retry = micros(retry);
                    if retry == 0 {
                        return Err(format!("denied with retry_after = 0: {d:?}"));
                    }
                    let early =
                        decide_at(store, &p.clock, now + retry - 1, &key, quota, cost).await?;
                    if early.allowed {
                        return Err(format!(
                            "a call of cost {cost} denied at {now} with retry_after {retry} µs, \
                             but admitted one microsecond early"
                        ));
                    }
                    let on_time =
                        decide_at(store, &p.clock, now + retry, &key, quota, cost).await?;
                    if !on_time.allowed {
                        return Err(format!(
                            "a call of cost {cost} denied at {now} with retry_after {retry} µs, \
                             and denied again at now + retry_after: {on_time:?}"
                        ));
                    }
                    return Ok(());
                }
                Err(format!(
                    "{} calls of cost {cost} at one instant were never denied (limit {limit})",
                    limit / cost + 2
                ))
            })
        },
    )
}

/// Families of caller ids built to break naive key layouts: braces that
/// choose a hash slot, separators and their percent escapes, control and
/// non-UTF-8 bytes (which a lossy conversion would merge), ids longer than a
/// truncating store keeps. Each case takes one whole family plus random bytes.
fn adversarial_keys() -> impl Strategy<Value = Vec<KeyTemplate>> {
    let long = |n: usize, tail: &[u8]| {
        let mut k = vec![b'x'; n];
        k.extend_from_slice(tail);
        k
    };
    let families: Vec<Vec<Vec<u8>>> = vec![
        vec![
            b"a:b".to_vec(),
            b"a%3Ab".to_vec(),
            b"a%3ab".to_vec(),
            b"a".to_vec(),
        ],
        vec![
            b"{a}".to_vec(),
            b"a".to_vec(),
            b"{a".to_vec(),
            b"{}".to_vec(),
            b"}".to_vec(),
        ],
        vec![
            long(10 * 1024, b""),
            long(10 * 1024, b"y"),
            long(10 * 1024 + 1, b""),
        ],
        vec![
            vec![0xff],
            vec![0xfe],
            vec![0xff, 0xfe],
            "\u{fffd}".as_bytes().to_vec(),
        ],
        vec![
            b"a\0".to_vec(),
            b"a".to_vec(),
            b"a\0b".to_vec(),
            b"".to_vec(),
        ],
        vec![
            b" ".to_vec(),
            b"\n".to_vec(),
            b"".to_vec(),
            b"%".to_vec(),
            b"%25".to_vec(),
        ],
        vec![
            "é".as_bytes().to_vec(),
            b"e".to_vec(),
            vec![0xc3, 0x28],
            vec![0xc3],
        ],
    ];
    (
        prop::sample::select(families),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..24), 0..2),
    )
        .prop_map(|(family, random)| {
            let mut keys = family;
            keys.extend(random);
            keys.sort();
            keys.dedup();
            keys.into_iter().map(|k| (Vec::new(), k)).collect()
        })
}

/// Contract 7: traffic on one key never changes another key's decisions,
/// whatever bytes the keys contain: each key's decisions equal the model's for
/// that key alone, with adversarial keys interleaved over several policies.
pub async fn keys_isolated(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    let h = Handle::current();
    let shape = Shape {
        kinds: ALL,
        max_calls: 60,
        back: false,
        switch: false,
    };
    let strategy = (adversarial_keys(), scenarios(shape)).prop_flat_map(|(keys, sc)| {
        let n = keys.len();
        let calls = sc.calls.len();
        (Just(keys), Just(sc), prop::collection::vec(0..n, calls)).prop_map(
            |(keys, mut sc, which)| {
                for (c, k) in sc.calls.iter_mut().zip(which) {
                    c.key = k;
                }
                sc.keys = keys;
                sc
            },
        )
    });
    run_cases(
        config,
        Contract::KeyIsolation,
        config.cases,
        strategy,
        |sc| {
            h.block_on(async {
                let p = play(factory, &sc, 1).await?;
                compare(&sc, &p.got)
                    .map_err(|e| format!("a key's decisions changed with other keys' traffic: {e}"))
            })
        },
    )
}

/// Contract 8: one microsecond before a caller's derived TTL runs out, its
/// state still counts (a call of the full limit is decided as the model
/// decides from that state); once the TTL has passed, the next call is
/// decided exactly as on a fresh key. Checked for every (caller, policy) of
/// the scenario, in the order their TTLs run out; clock steps back included.
pub async fn state_expires(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    let h = Handle::current();
    let shape = Shape {
        kinds: ALL,
        max_calls: 40,
        back: true,
        switch: false,
    };
    run_cases(
        config,
        Contract::StateExpires,
        config.cases,
        scenarios(shape),
        |sc| {
            h.block_on(async {
                let p = play(factory, &sc, 1).await?;
                let store = &*p.stores[0];
                let (_, states) = model_run(&sc);
                let mut order: Vec<_> = states.into_iter().collect();
                order.sort_by_key(|&(kp, (_, t, ttl))| (t + ttl, kp));
                let mut now = p.clock.now();
                for ((k, policy), (state, t, ttl)) in order {
                    let quota = sc.final_quota(policy);
                    let cost = quota.limit();
                    let key = key_bytes(&p.prefix, &sc.keys[k]);
                    let expiry = t + ttl;
                    if expiry > MAX_TIME {
                        // Stores need not handle times past MAX_TIME, and
                        // the rest expire later still.
                        break;
                    }
                    if ttl > 0 && expiry > now {
                        let before = expiry - 1;
                        now = before;
                        let d = decide_at(store, &p.clock, before, &key, quota, cost).await?;
                        let want =
                            model::decide(quota, Some(state), before, cost).expect("valid cost");
                        if !same(&d, &want.decision) {
                            return Err(format!(
                                "key {k}, policy {policy}, one microsecond before its TTL runs out \
                                 (at {before}): a call of cost {cost} was decided\n    {d:?}\n  \
                                 but the model, from the caller's state, decides\n    {:?}",
                                want.decision
                            ));
                        }
                        if want.decision.allowed {
                            // The state changed; this caller's expiry moved.
                            continue;
                        }
                    }
                    let at = expiry.max(now);
                    now = at;
                    let d = decide_at(store, &p.clock, at, &key, quota, cost).await?;
                    let fresh = model::decide(quota, None, at, cost)
                        .expect("valid cost")
                        .decision;
                    if !same(&d, &fresh) {
                        return Err(format!(
                            "key {k}, policy {policy} after its TTL (at {at}), a call of cost \
                             {cost} was decided\n    {d:?}\n  but a fresh key gets\n    {fresh:?}"
                        ));
                    }
                }
                Ok(())
            })
        },
    )
}
