//! Contract 14: a store that reports a bound on the callers it keeps
//! ([`Capabilities::max_callers`]), given more callers than it holds,
//! refuses the new ones and forgets none of the old.
//!
//! [`Capabilities::max_callers`]: ratelimit_core::store::Capabilities::max_callers

use std::time::Duration;

use ratelimit_core::{AlgorithmKind, ManualClock, Quota, Store};

use super::concurrency::{quota, violation};
use super::door;
use super::scenario::{T0, case_prefix};
use super::{Contract, StoreFactory, SuiteConfig, Violation};

/// The limit of the capacity contract's quota: every caller's first call
/// uses all of it.
const LIMIT: u64 = 3;

/// New callers sent beyond half as many again as the bound, so that a
/// store sharded into parts that fill one by one is full too.
const EXTRA: usize = 64;

/// Contract 14: a store that reports it keeps state for at most `C`
/// callers ([`Capabilities::max_callers`]), sent more callers than that,
/// refuses a **new** caller with an error (the limiter answers it by its
/// failure policy) and **never forgets a tracked caller to make room**: a
/// caller over its limit stays denied. A store that reports no bound
/// passes at once.
///
/// For each algorithm, on a fresh store under a frozen clock (nothing
/// expires), a quota of 3 per hour (a token bucket of 3, refilling one
/// per hour):
///
/// 1. `C + C/2 + 64` new callers each send one call of cost 3, using their
///    whole limit: each must be admitted (then it is tracked) or refused
///    with an error; a denial is a false one (the store decides for a
///    caller it does not keep);
/// 2. each tracked caller, oldest first, sends a call of cost 1, each
///    after one more new caller came: it must be denied (an error will not
///    do: a fail-open limiter would admit it);
/// 3. every tracked caller sends a call of cost 1 again: denied.
///
/// At least one caller must be admitted, at most `C` in all. A store that
/// forgets the caller it saw longest ago (or any other) to make room
/// admits that caller again in step 2 or 3. The contract makes about
/// `4.5 × C` requests per algorithm: a network store's bound is checked
/// at that cost.
///
/// [`Capabilities::max_callers`]: ratelimit_core::store::Capabilities::max_callers
pub async fn capacity(factory: &dyn StoreFactory, config: &SuiteConfig) -> Result<(), Violation> {
    let _ = config;
    for kind in AlgorithmKind::ALL {
        let q = quota(kind, Duration::from_secs(3600), LIMIT);
        let clock = ManualClock::new(T0 + 17);
        let stores = factory.stores(1, Some(clock)).await;
        let fail =
            |setup: String, message: String| violation(Contract::Capacity, &q, setup, message);
        let Some(store) = stores.into_iter().next() else {
            return Err(fail(
                String::new(),
                "the factory returned no store".to_owned(),
            ));
        };
        let Some(bound) = store.capabilities().max_callers else {
            return Ok(());
        };
        let first = bound.saturating_add(bound / 2).saturating_add(EXTRA);
        let setup = format!(
            "a store reporting max_callers = {bound}; {first} new callers, each one call of cost \
             {LIMIT} (its whole limit), then each tracked caller a call of cost 1 after one more \
             new caller, then every tracked caller again; frozen clock"
        );
        fill(&*store, &q, bound, first)
            .await
            .map_err(|m| fail(setup, m))?;
    }
    Ok(())
}

/// Steps 1-3 of [`capacity`] on one store.
async fn fill(store: &dyn Store, q: &Quota, bound: usize, first: usize) -> Result<(), String> {
    let prefix = case_prefix();
    let key = |i: usize| {
        let mut k = prefix.clone();
        k.extend_from_slice(format!("caller-{i}").as_bytes());
        k
    };
    let mut tracked: Vec<usize> = Vec::new();
    let mut refused = 0usize;
    // A new caller: admitted (now tracked) or refused.
    let newcomer = |i: usize, tracked: usize| {
        let k = key(i);
        async move {
            match door::ask_one(store, &k, q, LIMIT).await {
                Ok(d) if d.allowed => Ok(true),
                Ok(d) => Err(format!(
                    "new caller #{i}'s first call (cost {LIMIT}, its whole limit), with {tracked} \
                     callers admitted before it, was denied {d:?}: a full store refuses a new \
                     caller with an error; a denial is a decision, which the limiter reports as \
                     the caller's own (a false denial)"
                )),
                Err(e) if door::names_a_broken_rule(&e) => Err(e),
                Err(_) => Ok(false),
            }
        }
    };
    // A tracked caller over its limit: denied.
    let recheck = |i: usize, newcomers: usize| {
        let k = key(i);
        async move {
            match door::ask_one(store, &k, q, 1).await {
                Ok(d) if !d.allowed => Ok(()),
                Ok(d) => Err(format!(
                    "caller #{i}, admitted for its whole limit and so tracked, was admitted again \
                     {d:?} after {newcomers} new callers came: the store forgot a caller over its \
                     limit to make room (a full store refuses the new caller instead)"
                )),
                Err(e) => Err(format!(
                    "caller #{i}, tracked and over its limit, was not decided after {newcomers} \
                     new callers came ({e}): a full store still decides for the callers it keeps \
                     (the limiter answers an error by its failure policy, which may admit)"
                )),
            }
        }
    };
    let over = |tracked: usize| {
        format!(
            "{tracked} new callers admitted, each still counting its whole limit under a frozen \
             clock, but the store reports it keeps at most {bound}: it forgot some to make room, \
             or keeps more than it reports"
        )
    };
    let mut next = 0usize;
    for _ in 0..first {
        if newcomer(next, tracked.len()).await? {
            tracked.push(next);
        } else {
            refused += 1;
        }
        next += 1;
    }
    if tracked.is_empty() {
        return Err(format!(
            "all {first} new callers were refused: a store that reports room for {bound} callers \
             keeps at least one"
        ));
    }
    for j in 0..tracked.len() {
        if newcomer(next, tracked.len()).await? {
            tracked.push(next);
        } else {
            refused += 1;
        }
        next += 1;
        recheck(tracked[j], next).await?;
    }
    for &i in &tracked {
        recheck(i, next).await?;
    }
    // Checked last: a store that forgets callers is told by the caller it
    // let in again; one that keeps more than it reports, here.
    if tracked.len() > bound {
        return Err(over(tracked.len()));
    }
    debug_assert!(refused + tracked.len() == next);
    Ok(())
}
