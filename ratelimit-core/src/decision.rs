//! The outcome of one rate-limit check.

use std::time::Duration;

/// How a decision was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The store decided, from the caller's state.
    Store,
    /// The store failed or timed out and the limiter's policy is fail-open:
    /// allowed without counting.
    FailOpen,
    /// The store failed or timed out and the limiter's policy is fail-closed:
    /// denied without counting.
    FailClosed,
}

/// The outcome of a check. A denial is a value, not an error.
///
/// What the numbers mean per algorithm:
///
/// | algorithm | `limit` | `remaining` | `reset_after` |
/// |---|---|---|---|
/// | fixed window | limit per window | limit minus cost admitted this window | until the window ends |
/// | sliding window counter | limit per window | unit-cost calls admissible now | until the weighted count is back to zero |
/// | sliding log | limit per window | limit minus cost in the trailing window | until the newest entry leaves the window |
/// | token bucket | capacity (burst) | whole tokens in the bucket | until the bucket is full again |
///
/// `retry_after` is set only when denied: the exact time after which the same
/// call would be admitted, absent other traffic.
///
/// When `source` is not [`Source::Store`] the store was not consulted:
/// `remaining` and `reset_after` are unknown and set to zero, and
/// [`crate::RateLimitHeaders`] leaves them out rather than invent them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the call is admitted.
    pub allowed: bool,
    /// The limit (or bucket capacity) of the policy.
    pub limit: u64,
    /// What is left after this call (see the table).
    pub remaining: u64,
    /// Time until the caller's state is back to that of a fresh caller.
    pub reset_after: Duration,
    /// When denied by the store: the exact wait until the same call is admitted.
    pub retry_after: Option<Duration>,
    /// How the decision was reached.
    pub source: Source,
}

impl Decision {
    /// A decision made by a store.
    pub fn from_store(
        allowed: bool,
        limit: u64,
        remaining: u64,
        reset_after_micros: u64,
        retry_after_micros: Option<u64>,
    ) -> Self {
        Self {
            allowed,
            limit,
            remaining,
            reset_after: Duration::from_micros(reset_after_micros),
            retry_after: retry_after_micros.map(Duration::from_micros),
            source: Source::Store,
        }
    }

    /// A decision made by the failure policy, without the store.
    pub fn from_policy(allowed: bool, limit: u64) -> Self {
        Self {
            allowed,
            limit,
            remaining: 0,
            reset_after: Duration::ZERO,
            retry_after: None,
            source: if allowed {
                Source::FailOpen
            } else {
                Source::FailClosed
            },
        }
    }

    /// Whether the store made this decision (as opposed to the failure policy).
    pub fn is_from_store(&self) -> bool {
        self.source == Source::Store
    }
}
