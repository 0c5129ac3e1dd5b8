//! Several quotas, all or nothing: the model of one call checked against
//! every quota of a limiter at once.

use crate::clock::Micros;
use crate::decision::Decision;
use crate::error::CostError;
use crate::quota::Quota;

use super::{State, decide};

/// One quota of a multi-quota call: the quota, what the call costs under
/// it, and whether the quota is in shadow (dry-run) mode.
#[derive(Debug, Clone, Copy)]
pub struct Charge<'a> {
    /// The quota.
    pub quota: &'a Quota,
    /// The call's cost under this quota (at least 1, at most its limit).
    pub cost: u64,
    /// A shadow quota is decided and counted like the others, but its
    /// denial never denies the call.
    pub shadow: bool,
}

impl<'a> Charge<'a> {
    /// An enforced charge of `cost` under `quota`.
    pub const fn new(quota: &'a Quota, cost: u64) -> Self {
        Self {
            quota,
            cost,
            shadow: false,
        }
    }
}

/// The result of one multi-quota model step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllStep {
    /// Whether the call is admitted: every enforced charge admits it.
    pub admitted: bool,
    /// Each charge's own decision, in order (see [`decide_all`]).
    pub decisions: Vec<Decision>,
    /// For each charge, the state to store and its TTL, or `None` to write
    /// nothing (a denied call is counted in no quota).
    pub writes: Vec<Option<(State, Micros)>>,
}

/// One call against several quotas: admitted only if every enforced quota
/// admits it; then each quota that admits it counts it (a shadow quota that
/// would deny does not). A denied call is counted in no quota.
///
/// `states[i]` is the stored state of `charges[i]` (as for [`decide`]).
/// Each charge's decision is its own: `allowed` says whether that quota
/// admits the call; for a quota that admits a call that is denied anyway,
/// `remaining` is its remaining *without* this call, and `reset_after` is
/// at most as long as the model gives for the charged state (an upper
/// bound). A denying quota's `retry_after` is its own exact wait; the wait
/// until every quota admits the same call is the largest of them.
///
/// ```
/// use ratelimit_core::model::{self, Charge};
/// use ratelimit_core::{Quota, Rate};
/// let second = Quota::fixed_window(Rate::per_second(10)).unwrap().named("second").unwrap();
/// let day = Quota::fixed_window(Rate::per_day(1)).unwrap().named("day").unwrap();
/// let now = 1_800_000_000_000_000;
/// let charges = [Charge::new(&second, 1), Charge::new(&day, 1)];
/// let a = model::decide_all(&charges, vec![None, None], now).unwrap();
/// assert!(a.admitted);
/// let states: Vec<_> = a.writes.into_iter().map(|w| w.map(|(s, _)| s)).collect();
/// let b = model::decide_all(&charges, states, now + 1).unwrap();
/// assert!(!b.admitted);
/// // The per-second quota still has 9: the denied call was not counted there.
/// assert_eq!(b.decisions[0].remaining, 9);
/// assert!(b.writes.iter().all(Option::is_none));
/// ```
pub fn decide_all(
    charges: &[Charge<'_>],
    states: Vec<Option<State>>,
    now: Micros,
) -> Result<AllStep, CostError> {
    let mut steps = Vec::with_capacity(charges.len());
    for (c, s) in charges
        .iter()
        .zip(states.into_iter().chain(std::iter::repeat(None)))
    {
        steps.push(decide(c.quota, s, now, c.cost)?);
    }
    let admitted = charges
        .iter()
        .zip(&steps)
        .all(|(c, s)| c.shadow || s.decision.allowed);
    let mut decisions = Vec::with_capacity(steps.len());
    let mut writes = Vec::with_capacity(steps.len());
    for (c, step) in charges.iter().zip(steps) {
        let mut d = step.decision;
        if d.allowed && admitted {
            writes.push(Some((step.state, step.ttl)));
        } else {
            if d.allowed {
                // Admissible, but the call is denied: not counted here.
                d.remaining = d.remaining.saturating_add(c.cost).min(d.limit);
            }
            writes.push(None);
        }
        decisions.push(d);
    }
    Ok(AllStep {
        admitted,
        decisions,
        writes,
    })
}
