//! When the store gives no decision: why ([`Failure`]), and what decides
//! instead: the caller's live lease, the fallback store, or the failure
//! policy; and the warning a failure logs (at most one a second in the
//! process).

use std::time::Duration;

use smallvec::SmallVec;

use crate::clock::Micros;
use crate::decision::{Decision, Source, Verdict};
use crate::error::StoreError;
use crate::model::Charge;
use crate::quota::Quota;
use crate::store::{Request, first};

use super::{FailurePolicy, Limiter};

/// Why a store request produced no decision.
pub(crate) enum Failure {
    Error(StoreError),
    /// No answer within the timeout; `late`: the timer fired well after it
    /// was due (this process was starved), so it is no evidence against
    /// the store.
    Timeout {
        late: bool,
    },
    Panicked,
    /// The circuit breaker is open: the store was not asked.
    Open,
}

impl Failure {
    /// Whether the store is busy rather than unavailable (see
    /// [`StoreError::is_busy`]): a timeout, a request the store shed or
    /// that expired. An open breaker, an error that proves the store
    /// unreachable and a panic are not.
    pub(crate) fn is_busy(&self) -> bool {
        match self {
            Self::Error(e) => e.is_busy(),
            Self::Timeout { .. } => true,
            Self::Panicked | Self::Open => false,
        }
    }

    /// What to log: the error and whether it is transient.
    fn describe(&self, timeout: Duration) -> (String, bool) {
        match self {
            Self::Error(e) => (e.to_string(), e.is_transient()),
            Self::Timeout { late: false } => (StoreError::Timeout(timeout).to_string(), true),
            Self::Timeout { late: true } => (
                format!(
                    "{} (the timer fired late: this process was starved, not counted against the \
                     store)",
                    StoreError::Timeout(timeout)
                ),
                true,
            ),
            Self::Panicked => ("the store panicked".to_owned(), false),
            Self::Open => (
                "circuit breaker open: the store failed repeatedly and is not asked until its \
                 cool-down ends"
                    .to_owned(),
                true,
            ),
        }
    }
}

impl Limiter {
    /// The decision of the caller's live lease under quota `index` (or
    /// `quota`, for [`Limiter::check_quota`]), spent when it admits; `None`
    /// without leases or a live lease.
    pub(super) fn leased_one(
        &self,
        index: usize,
        quota: &Quota,
        key: &[u8],
        cost: u64,
    ) -> Option<Decision> {
        let inner = &*self.inner;
        let leases = inner.leases.as_ref()?;
        let fingerprint = match inner.fingerprints.get(index) {
            Some(&f) => f,
            None => super::builder::fingerprint(quota),
        };
        let shadow = inner.shadow.get(index).copied().unwrap_or(false);
        let ask = super::lease::Ask {
            fingerprint,
            quota,
            cost,
            shadow,
        };
        let mut d = leases.decide(key, ask, inner.clock.now())?;
        if shadow && !d.allowed {
            self.shadow_denied(quota);
            d.allowed = true;
            d.retry_after = None;
        }
        Some(d)
    }

    /// A verdict from the caller's live leases under every quota; `None`
    /// without leases or a live lease for each.
    pub(super) fn leased_many(&self, key: &[u8], costs: &[u64]) -> Option<Verdict> {
        let inner = &*self.inner;
        let leases = inner.leases.as_ref()?;
        let asks: SmallVec<[super::lease::Ask<'_>; 4]> = inner
            .quotas
            .iter()
            .zip(costs)
            .zip(&inner.shadow)
            .zip(&inner.fingerprints)
            .map(
                |(((quota, &cost), &shadow), &fingerprint)| super::lease::Ask {
                    fingerprint,
                    quota,
                    cost,
                    shadow,
                },
            )
            .collect();
        let decisions = leases.decide_all(key, &asks, inner.clock.now())?;
        Some(self.combine(decisions))
    }

    /// Records a store decision under quota `index` (or `quota`) as the
    /// caller's lease, for a request sent at `sent`.
    #[inline]
    pub(super) fn lease_from(
        &self,
        index: usize,
        quota: &Quota,
        key: &[u8],
        d: &Decision,
        sent: Micros,
    ) {
        let inner = &*self.inner;
        if let Some(leases) = &inner.leases
            && d.source == Source::Store
        {
            let fingerprint = match inner.fingerprints.get(index) {
                Some(&f) => f,
                None => super::builder::fingerprint(quota),
            };
            leases.record(key, fingerprint, d, sent);
        }
    }

    /// The fallback store's quota for quota `index` (or `quota` divided, for
    /// a quota from [`Limiter::check_quota`]), and the cost capped to it.
    pub(super) fn divided(&self, index: usize, quota: &Quota, cost: u64) -> Option<(Quota, u64)> {
        let fb = self.inner.fallback.as_ref()?;
        let divided = match fb.quotas.get(index) {
            Some(q) => q.clone(),
            None => quota.divided(fb.instances).ok()?,
        };
        let cost = cost.min(divided.limit());
        Some((divided, cost))
    }

    /// The fallback store's decision, when it answers in place.
    pub(super) fn fallback_one_in_place(
        &self,
        index: usize,
        quota: &Quota,
        key: &[u8],
        cost: u64,
    ) -> Option<Decision> {
        let fb = self.inner.fallback.as_ref()?;
        let (divided, cost) = self.divided(index, quota, cost)?;
        let charges = [Charge::new(&divided, cost)];
        let answer = fb.store.decide(Request::new(key, &charges));
        let mut d = first(answer.into_ready().ok()?.ok()?).ok()?;
        d.source = Source::Fallback;
        Some(d)
    }

    pub(super) async fn fallback_one(
        &self,
        index: usize,
        quota: &Quota,
        key: &[u8],
        cost: u64,
    ) -> Option<Decision> {
        let fb = self.inner.fallback.as_ref()?;
        let (divided, cost) = self.divided(index, quota, cost)?;
        let charges = [Charge::new(&divided, cost)];
        let answer = fb.store.decide(Request::new(key, &charges));
        let mut d = first(answer.await.ok()?).ok()?;
        d.source = Source::Fallback;
        Some(d)
    }

    pub(super) async fn fallback_many(&self, key: &[u8], costs: &[u64]) -> Option<Verdict> {
        let inner = &*self.inner;
        let fb = inner.fallback.as_ref()?;
        let charges: SmallVec<[Charge<'_>; 4]> = fb
            .quotas
            .iter()
            .zip(costs)
            .zip(&inner.shadow)
            .map(|((quota, &cost), &shadow)| Charge {
                quota,
                cost: cost.min(quota.limit()),
                shadow,
            })
            .collect();
        let decisions = fb.store.decide(Request::new(key, &charges)).await.ok()?;
        if decisions.len() != charges.len() {
            return None;
        }
        let mut decisions = decisions.into_vec();
        for d in &mut decisions {
            d.source = Source::Fallback;
        }
        Some(self.combine(decisions))
    }

    pub(super) fn by_policy(&self, quota: &Quota) -> Decision {
        Decision::from_policy(self.inner.policy == FailurePolicy::FailOpen, quota.limit())
    }

    /// Logs a store failure: at most one warning a second **in the
    /// process**, whatever the number of limiters (an outage at API
    /// traffic rates must not flood the logs), saying how many failures
    /// went unlogged since the last one; the counters see every one.
    pub(super) fn fail(&self, quota: &Quota, failure: &Failure) {
        let inner = &*self.inner;
        if matches!(failure, Failure::Open) {
            return;
        }
        match super::warnings::may_warn() {
            Some(suppressed) => {
                let (error, transient) = failure.describe(inner.timeout);
                let stats = self.stats();
                tracing::warn!(
                    namespace = %inner.namespace,
                    policy = quota.name(),
                    error = %error,
                    transient,
                    fail_open = inner.policy == FailurePolicy::FailOpen,
                    fallback = inner.fallback.is_some(),
                    leases = inner.leases.is_some(),
                    errors = stats.errors,
                    timeouts = stats.timeouts,
                    suppressed,
                    "rate-limit store failed; deciding by lease, fallback or failure policy \
                     (logged at most once a second in this process; `suppressed`: failures \
                     not logged since the last warning)"
                );
            }
            None if tracing::enabled!(tracing::Level::DEBUG) => {
                let (error, _) = failure.describe(inner.timeout);
                tracing::debug!(namespace = %inner.namespace, policy = quota.name(), error = %error, "rate-limit store failed");
            }
            None => {}
        }
    }
}
