//! The outcome of one rate-limit check.

use std::time::Duration;

/// How a decision was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// The store decided, from the caller's state.
    Store,
    /// The store failed or timed out and the limiter's policy is fail-open:
    /// allowed without counting.
    FailOpen,
    /// The store failed or timed out (or the circuit breaker is open) and the
    /// limiter's policy is fail-closed: denied. Nothing is counted by the
    /// store after the limiter has answered (see the Redis store's deadline).
    FailClosed,
    /// The shared store was unavailable and the limiter's in-process fallback
    /// store decided, under each quota divided by the number of instances.
    Fallback,
    /// The limiter's deny cache answered: the store had denied this caller
    /// with an exact `retry_after` that has not yet passed, for a cost no
    /// larger than this call's. No round trip was made.
    Cache,
    /// Admitted only because every quota that would have denied the call is
    /// in shadow (dry-run) mode. The numbers are those of the binding
    /// enforced quota.
    Shadow,
    /// The store could not answer (busy, or unavailable) and the limiter
    /// decided from the store's last answer for this caller, its **lease**:
    /// never more than that answer's `remaining` (divided among the
    /// instances) before the store is asked again, and an exhausted caller
    /// stays denied until that answer's reset. See
    /// [`crate::LimiterBuilder::leases`].
    Lease,
}

impl Source {
    /// A short, stable label: `store`, `fail_open`, `fail_closed`,
    /// `fallback`, `cache`, `shadow`, `lease` (used in metrics and logs).
    pub const fn label(self) -> &'static str {
        match self {
            Self::Store => "store",
            Self::FailOpen => "fail_open",
            Self::FailClosed => "fail_closed",
            Self::Fallback => "fallback",
            Self::Cache => "cache",
            Self::Shadow => "shadow",
            Self::Lease => "lease",
        }
    }
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
/// When `source` is [`Source::FailOpen`] or [`Source::FailClosed`] no store
/// was consulted: `remaining` and `reset_after` are unknown and set to zero,
/// and [`crate::RateLimitHeaders`] leaves them out rather than invent them.
/// A [`Source::Cache`] decision carries the numbers of the store denial it
/// was answered from: `remaining` as the store gave it, `reset_after`
/// counted down to the same instant, and the headers give them all.
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

    /// Whether the store, the fallback store or a shadowed store decision
    /// made it, as opposed to the failure policy or the deny cache (whose
    /// numbers are those of an earlier store denial).
    pub fn is_from_store(&self) -> bool {
        matches!(
            self.source,
            Source::Store | Source::Fallback | Source::Shadow
        )
    }
}

/// The outcome of a check against all of a limiter's quotas at once.
///
/// `decision` is the combined answer: admitted only if every enforced quota
/// admits the call. Its numbers are those of the **binding** quota
/// (`quotas[binding]`): on a denial the quota that forces the longest wait,
/// so `retry_after` is the exact time until *every* quota would admit the
/// same call; on an admission the quota with the least `remaining`
/// relative to its `limit` (the first on a tie).
/// `quotas` holds each quota's own decision, in the limiter's order: for a
/// quota that would admit a call another quota denied, `allowed` is true and
/// `remaining` is its remaining *without* this call (a denied call is
/// counted in no quota).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The combined decision (the binding quota's numbers).
    pub decision: Decision,
    /// Index of the binding quota in the limiter's quotas.
    pub binding: usize,
    /// Each quota's own decision, in the limiter's order.
    pub quotas: Vec<Decision>,
}

impl Verdict {
    /// Whether the call is admitted.
    pub fn allowed(&self) -> bool {
        self.decision.allowed
    }
}
