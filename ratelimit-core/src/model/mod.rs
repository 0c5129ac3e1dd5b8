//! The model: one pure function per algorithm,
//! `(state, now, cost, quota) -> (decision, new state, ttl)`.
//!
//! This is the single definition of the arithmetic. The local store calls it,
//! the Redis scripts mirror it operation for operation, and the testkit
//! compares every store against it. Everything is integer arithmetic whose
//! intermediate values stay below 2^53 (the quota constructors guarantee it),
//! so a Lua script using doubles computes the same numbers bit for bit.
//!
//! Two rules hold for every algorithm:
//!
//! - **A denial returns the stored state unchanged** (`step.state` equals
//!   the `state` passed in), so a store writes nothing for a denial. Where
//!   the time has moved the state on (a sliding window counter now in a
//!   later window, a sliding log with entries that have left the window),
//!   that move is computed on read, and stored only by the next admission.
//! - **A clock that steps back** is read as that earlier instant, with
//!   everything admitted since still counted: a token bucket has the level it
//!   had then minus what was spent since (possibly below empty: denied, with
//!   a `retry_after` that includes the step; no tokens for time that has not
//!   passed); a sliding log counts its entries later than `now`; the window
//!   counters count by the window `now` falls in (a state of another window
//!   is a fresh one). The token bucket and the sliding log never admit
//!   more after a step back than they would at the latest instant seen.

mod all;
mod fixed_window;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub use all::{AllStep, Charge, decide_all};
pub use fixed_window::FixedWindowState;
pub use sliding_log::SlidingLogState;
pub use sliding_window::SlidingWindowState;
pub use token_bucket::TokenBucketState;

use crate::clock::Micros;
use crate::decision::Decision;
use crate::error::CostError;
use crate::quota::{Algorithm, Quota};

/// A caller's stored state, one variant per algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Fixed window state.
    FixedWindow(FixedWindowState),
    /// Sliding window counter state.
    SlidingWindow(SlidingWindowState),
    /// Sliding log state.
    SlidingLog(SlidingLogState),
    /// Token bucket state.
    TokenBucket(TokenBucketState),
}

/// The result of one model step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The decision.
    pub decision: Decision,
    /// The state to store.
    pub state: State,
    /// Microseconds from `now` after which `state` behaves exactly as a fresh
    /// caller's (no state): the derived time to live.
    pub ttl: Micros,
}

/// One decision: the pure model every store must agree with.
///
/// `state` is the caller's stored state (`None` for a fresh caller, or a
/// state of another algorithm, which is treated as fresh). Returns an error
/// only for a cost that can never be admitted (zero, or above the limit).
///
/// ```
/// use ratelimit_core::{model, Quota, Rate};
/// let q = Quota::fixed_window(Rate::per_minute(2)).unwrap();
/// let now = 60_000_000 * 1000 + 59_000_000; // 59 s into a minute
/// let a = model::decide(&q, None, now, 2).unwrap();
/// assert!(a.decision.allowed);
/// let b = model::decide(&q, Some(a.state), now, 1).unwrap();
/// assert!(!b.decision.allowed);
/// assert_eq!(b.decision.retry_after, Some(std::time::Duration::from_secs(1)));
/// ```
pub fn decide(
    quota: &Quota,
    state: Option<State>,
    now: Micros,
    cost: u64,
) -> Result<Step, CostError> {
    quota.check_cost(cost)?;
    Ok(match (quota.algorithm(), state) {
        (Algorithm::FixedWindow(w), s) => {
            let s = match s {
                Some(State::FixedWindow(s)) => Some(s),
                _ => None,
            };
            let (d, s, ttl) = fixed_window::step(w, s, now, cost);
            Step {
                decision: d,
                state: State::FixedWindow(s),
                ttl,
            }
        }
        (Algorithm::SlidingWindow(w), s) => {
            let s = match s {
                Some(State::SlidingWindow(s)) => Some(s),
                _ => None,
            };
            let (d, s, ttl) = sliding_window::step(w, s, now, cost);
            Step {
                decision: d,
                state: State::SlidingWindow(s),
                ttl,
            }
        }
        (Algorithm::SlidingLog(w), s) => {
            let s = match s {
                Some(State::SlidingLog(s)) => Some(s),
                _ => None,
            };
            let (d, s, ttl) = sliding_log::step(w, s, now, cost);
            Step {
                decision: d,
                state: State::SlidingLog(s),
                ttl,
            }
        }
        (Algorithm::TokenBucket(b), s) => {
            let s = match s {
                Some(State::TokenBucket(s)) => Some(s),
                _ => None,
            };
            let (d, s, ttl) = token_bucket::step(b, s, now, cost);
            Step {
                decision: d,
                state: State::TokenBucket(s),
                ttl,
            }
        }
    })
}

/// The token bucket step alone, on its own state: exactly what [`decide`]
/// does for a token bucket quota, returning `(decision, new state, ttl)`.
///
/// For stores that keep each algorithm's state in its own layout (the local
/// store updates a bucket's theoretical arrival time with one
/// compare-and-swap). `cost` must have passed [`Quota::check_cost`]: at
/// least 1 and at most the capacity.
#[inline]
pub fn token_bucket_step(
    bucket: &crate::Bucket,
    state: Option<TokenBucketState>,
    now: Micros,
    cost: u64,
) -> (Decision, TokenBucketState, Micros) {
    token_bucket::step(bucket, state, now, cost)
}

#[cfg(test)]
mod tests;
