//! Contracts 1-8, each as a proptest property over a store factory.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use ratelimit_core::model::{self, State};
use ratelimit_core::{AlgorithmKind, Clock, Decision, ManualClock, Micros, Quota, Store};
use tokio::runtime::Handle;

use super::oracle::{self, Outcome};
use super::scenario::{Scenario, case_prefix, key_bytes, run_cases, scenarios, wild_scenarios};
use super::{Contract, StoreFactory, SuiteConfig, Violation};

const ALL: &[AlgorithmKind] = &AlgorithmKind::ALL;

async fn one_store(
    factory: &dyn StoreFactory,
    clock: &ManualClock,
) -> Result<Arc<dyn Store>, String> {
    factory
        .stores(1, Some(clock.clone()))
        .await
        .into_iter()
        .next()
        .ok_or_else(|| "the factory returned no store".to_owned())
}

/// Runs the scenario on a fresh store, returning each call's decision.
async fn play(
    factory: &dyn StoreFactory,
    sc: &Scenario,
) -> Result<
    (
        ManualClock,
        Arc<dyn Store>,
        Vec<u8>,
        Vec<(Outcome, Decision)>,
    ),
    String,
> {
    let clock = ManualClock::new(sc.start);
    let store = one_store(factory, &clock).await?;
    let prefix = case_prefix();
    let mut out = Vec::with_capacity(sc.calls.len());
    for (i, (t, c)) in sc.times().enumerate() {
        clock.set(t);
        let key = key_bytes(&prefix, &sc.keys[c.key]);
        let d = store
            .decide(&key, sc.quota_at(i), c.cost)
            .await
            .map_err(|e| format!("call #{i}: the store failed: {e}"))?;
        out.push((
            Outcome {
                t,
                key: c.key,
                cost: c.cost,
                allowed: d.allowed,
            },
            d,
        ));
    }
    Ok((clock, store, prefix, out))
}

fn same(store: &Decision, model: &Decision) -> bool {
    store.allowed == model.allowed
        && store.limit == model.limit
        && store.remaining == model.remaining
        && store.retry_after == model.retry_after
        && store.reset_after == model.reset_after
}

/// The model's decisions for the scenario, per call, and each key's last
/// state and TTL.
/// Per key: the last state, the time it was written and its TTL.
type LastStates = HashMap<usize, (State, Micros, Micros)>;

fn model_run(sc: &Scenario) -> (Vec<Decision>, LastStates) {
    let mut states: LastStates = HashMap::new();
    let mut out = Vec::new();
    for (i, (t, c)) in sc.times().enumerate() {
        let prior = states.remove(&c.key).map(|(s, _, _)| s);
        let step = model::decide(sc.quota_at(i), prior, t, c.cost)
            .expect("costs are clamped to the limit");
        out.push(step.decision);
        states.insert(c.key, (step.state, t, step.ttl));
    }
    (out, states)
}

fn compare(sc: &Scenario, got: &[(Outcome, Decision)]) -> Result<(), String> {
    let (want, _) = model_run(sc);
    for (i, ((o, d), m)) in got.iter().zip(&want).enumerate() {
        if sc.switch.as_ref().is_some_and(|(k, _)| i >= *k) {
            // After a reconfiguration under the same name, state written under
            // the old numbers may be read, or may have been evicted by its old
            // TTL: stores legitimately differ. Every answer must still be sane.
            let q = sc.quota_at(i);
            let retry_ok = match (d.allowed, d.retry_after) {
                (true, None) => true,
                (false, Some(r)) => !r.is_zero(),
                _ => false,
            };
            if d.limit != q.limit() || d.remaining > q.limit() || !retry_ok {
                return Err(format!(
                    "call #{i} after the policy was reconfigured: an insane decision {d:?} under {}",
                    super::scenario::describe(q)
                ));
            }
            continue;
        }
        if !same(d, m) {
            return Err(format!(
                "call #{i} (key {}, cost {}, t = start + {} µs): the store decided\n    {d:?}\n  but the model decides\n    {m:?}",
                o.key,
                o.cost,
                o.t - sc.start
            ));
        }
    }
    Ok(())
}

/// Contract 1: with an injected clock, the store's decisions equal the core
/// model's, call for call (allowed, limit, remaining, reset_after,
/// retry_after), over several keys and all four algorithms, with small
/// quotas and quotas at the edge of the exact range (2^53), costs up to the
/// limit, and a clock that sometimes steps back. Some sequences reconfigure
/// the policy under the same name part-way: from then on decisions must be
/// sane (right limit, `remaining <= limit`, a positive `retry_after` exactly
/// when denied) and the store must not fail.
pub async fn model_agreement(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    let h = Handle::current();
    run_cases(
        config,
        Contract::ModelAgreement,
        wild_scenarios(ALL, 3, 60),
        |sc| {
            h.block_on(async {
                let (_, _, _, got) = play(factory, &sc).await?;
                compare(&sc, &got)
            })
        },
    )
}

async fn invariant(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
    contract: Contract,
    kind: &'static [AlgorithmKind],
    check: fn(&Quota, &[Outcome]) -> Result<(), String>,
) -> Result<(), Violation> {
    let h = Handle::current();
    run_cases(config, contract, scenarios(kind, 2, 80), |sc| {
        h.block_on(async {
            let (_, _, _, got) = play(factory, &sc).await?;
            let log: Vec<Outcome> = got.iter().map(|(o, _)| *o).collect();
            check(&sc.quota, &log)
        })
    })
}

/// Contract 2: a fixed window admits at most L per calendar window.
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

/// Contract 6: after a scenario, the caller repeats a call until denied; the
/// same call one microsecond before `now + retry_after` is denied, and at
/// `now + retry_after` it is admitted.
pub async fn retry_after_exact(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    let h = Handle::current();
    run_cases(config, Contract::RetryAfter, scenarios(ALL, 1, 30), |sc| {
        h.block_on(async {
            let (clock, store, prefix, got) = play(factory, &sc).await?;
            let key = key_bytes(&prefix, &sc.keys[0]);
            let cost = got.last().map_or(1, |(o, _)| o.cost);
            let limit = sc.quota.limit();
            for _ in 0..=limit {
                let d = store.decide(&key, &sc.quota, cost).await.map_err(|e| e.to_string())?;
                if d.allowed {
                    continue;
                }
                let now = clock.now();
                let retry = d
                    .retry_after
                    .ok_or_else(|| format!("denied at {now} without a retry_after: {d:?}"))?;
                let retry = u64::try_from(retry.as_micros()).unwrap_or(u64::MAX);
                if retry == 0 {
                    return Err(format!("denied with retry_after = 0: {d:?}"));
                }
                clock.set(now + retry - 1);
                let early = store.decide(&key, &sc.quota, cost).await.map_err(|e| e.to_string())?;
                if early.allowed {
                    return Err(format!(
                        "denied at {now} with retry_after {retry} µs, but admitted one microsecond early"
                    ));
                }
                clock.set(now + retry);
                let on_time = store.decide(&key, &sc.quota, cost).await.map_err(|e| e.to_string())?;
                if !on_time.allowed {
                    return Err(format!(
                        "denied at {now} with retry_after {retry} µs, and denied again at now + retry_after: {on_time:?}"
                    ));
                }
                return Ok(());
            }
            Err(format!("{} calls of cost {cost} at one instant were never denied", limit + 1))
        })
    })
}

/// Families of keys built to break naive key layouts: braces that choose a
/// hash slot, separators and their percent escapes, control and non-UTF-8
/// bytes (which a lossy conversion would merge), keys longer than a
/// truncating store keeps. Each case takes one whole family plus random bytes.
fn adversarial_keys() -> impl Strategy<Value = Vec<Vec<u8>>> {
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
            keys
        })
}

/// Contract 7: traffic on one key never changes another key's decisions,
/// whatever bytes the keys contain: each key's decisions equal the model's for
/// that key alone, with adversarial keys interleaved.
pub async fn keys_isolated(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    let h = Handle::current();
    let strategy = (adversarial_keys(), scenarios(ALL, 1, 60)).prop_flat_map(|(keys, sc)| {
        let n = keys.len();
        let calls = sc.calls.clone();
        (
            Just(keys),
            Just(sc),
            prop::collection::vec(0..n, calls.len()),
        )
            .prop_map(|(keys, mut sc, which)| {
                for (c, k) in sc.calls.iter_mut().zip(which) {
                    c.key = k;
                }
                sc.keys = keys;
                sc
            })
    });
    run_cases(config, Contract::KeyIsolation, strategy, |sc| {
        h.block_on(async {
            let (_, _, _, got) = play(factory, &sc).await?;
            compare(&sc, &got)
                .map_err(|e| format!("a key's decisions changed with other keys' traffic: {e}"))
        })
    })
}

/// Contract 8: once a key's derived TTL has passed, its next call is decided
/// exactly as on a fresh key.
pub async fn state_expires(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    let h = Handle::current();
    run_cases(
        config,
        Contract::StateExpires,
        scenarios(ALL, 2, 40),
        |sc| {
            h.block_on(async {
            let (clock, store, prefix, _) = play(factory, &sc).await?;
            let (_, states) = model_run(&sc);
            let expiry = states.values().map(|&(_, t, ttl)| t + ttl).max().unwrap_or(sc.start);
            clock.set(expiry);
            for &k in states.keys() {
                let cost = sc.final_quota().limit();
                let key = key_bytes(&prefix, &sc.keys[k]);
                let d = store
                    .decide(&key, sc.final_quota(), cost)
                    .await
                    .map_err(|e| e.to_string())?;
                let fresh = model::decide(sc.final_quota(), None, expiry, cost)
                    .expect("valid cost")
                    .decision;
                if !same(&d, &fresh) {
                    return Err(format!(
                        "key {k} after its TTL (at {expiry}), a call of cost {cost} was decided\n    {d:?}\n  but a fresh key gets\n    {fresh:?}"
                    ));
                }
            }
            Ok(())
        })
        },
    )
}
