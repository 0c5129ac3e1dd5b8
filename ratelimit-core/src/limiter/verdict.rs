//! Decisions combined and counted: several quotas' decisions into one
//! verdict (the binding quota, shadow quotas admitted but counted), and
//! every decision counted in the limiter's stats, its metrics and the
//! current span.

use std::sync::atomic::Ordering;

use crate::decision::{Decision, Source, Verdict};
use crate::quota::Quota;

use super::Limiter;
use super::telemetry;

impl Limiter {
    /// Combines per-quota decisions: admitted iff every enforced quota
    /// admits; the binding quota is the denying one with the longest wait,
    /// or the admitting one with the least remaining relative to its limit.
    pub(super) fn combine(&self, decisions: Vec<Decision>) -> Verdict {
        let inner = &*self.inner;
        self.combine_of(decisions, &inner.quotas, &inner.shadow)
    }

    /// [`Limiter::combine`] over `quotas` with their `shadow` flags (the
    /// limiter's own, or a call's).
    pub(super) fn combine_of<Q: std::borrow::Borrow<Quota>>(
        &self,
        decisions: Vec<Decision>,
        quotas: &[Q],
        shadow: &[bool],
    ) -> Verdict {
        let shadowed_at = |i: usize| shadow.get(i).copied().unwrap_or(false);
        let enforced = |i: &usize| !shadowed_at(*i);
        let all: Vec<usize> = (0..decisions.len()).collect();
        let admitted = all
            .iter()
            .filter(|i| enforced(i))
            .all(|&i| decisions[i].allowed);
        let candidates: Vec<usize> = {
            let e: Vec<usize> = all.iter().copied().filter(enforced).collect();
            if e.is_empty() { all.clone() } else { e }
        };
        let binding = if admitted {
            // The least remaining relative to its limit (a/b < c/d iff
            // a·d < c·b); the first on a tie.
            candidates
                .iter()
                .copied()
                .reduce(|best, i| {
                    let (b, d) = (&decisions[best], &decisions[i]);
                    let lhs = u128::from(d.remaining) * u128::from(b.limit.max(1));
                    let rhs = u128::from(b.remaining) * u128::from(d.limit.max(1));
                    if lhs < rhs { i } else { best }
                })
                .unwrap_or(0)
        } else {
            candidates
                .iter()
                .copied()
                .filter(|&i| !decisions[i].allowed)
                .max_by_key(|&i| decisions[i].retry_after)
                .unwrap_or(0)
        };
        let Some(mut decision) = decisions.get(binding).cloned() else {
            // No decision at all (no quota): nothing admits the call.
            return Verdict {
                decision: Decision::from_policy(false, 0),
                binding: 0,
                quotas: decisions,
            };
        };
        decision.allowed = admitted;
        if admitted {
            decision.retry_after = None;
            let shadowed: Vec<usize> = all
                .iter()
                .copied()
                .filter(|&i| shadowed_at(i) && !decisions[i].allowed)
                .collect();
            for &i in &shadowed {
                if let Some(q) = quotas.get(i) {
                    self.shadow_denied(q.borrow());
                }
            }
            if !shadowed.is_empty() && decision.source == Source::Store {
                decision.source = Source::Shadow;
            }
        }
        Verdict {
            decision,
            binding,
            quotas: decisions,
        }
    }

    /// A shadow quota would have denied: counted, and logged at most once a
    /// second per limiter.
    pub(super) fn shadow_denied(&self, quota: &Quota) {
        let inner = &*self.inner;
        inner.counters.bump(|c| &c.shadow_denials);
        telemetry::shadow_denial(&inner.labels, quota);
        let now = inner.clock.now();
        let last = inner.last_shadow_log.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 1_000_000
            && inner
                .last_shadow_log
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::info!(
                namespace = %inner.namespace,
                policy = quota.name(),
                would_deny = inner.counters.sum(|s| &s.shadow_denials),
                "shadow quota would have denied a call (admitted; logged at most once a second)"
            );
        }
    }

    /// Counts the decision in the stats, metrics and the current span.
    pub(super) fn count(&self, d: &Decision, quota: &Quota) {
        self.count_in(d, quota, Some(&tracing::Span::current()));
    }

    /// Counts a decision under one quota in the stats, metrics and `span`.
    #[inline(always)]
    pub(super) fn count_in(&self, d: &Decision, quota: &Quota, span: Option<&tracing::Span>) {
        self.bump_stats(d);
        telemetry::decision(&self.inner.labels, quota, d, span);
        telemetry::policy_decision(&self.inner.labels, quota, d);
    }

    /// Counts a verdict over several quotas: the call under its binding
    /// quota (stats, metrics, the current span), and each quota's own
    /// decision under its policy (metrics).
    pub(super) fn count_verdict(&self, v: &Verdict) {
        self.count_verdict_of(v, &self.inner.quotas);
    }

    /// [`Limiter::count_verdict`] under `quotas` (the limiter's own, or a
    /// call's).
    pub(super) fn count_verdict_of<Q: std::borrow::Borrow<Quota>>(
        &self,
        v: &Verdict,
        quotas: &[Q],
    ) {
        let inner = &*self.inner;
        self.bump_stats(&v.decision);
        if let Some(binding) = quotas.get(v.binding) {
            telemetry::decision(
                &inner.labels,
                binding.borrow(),
                &v.decision,
                Some(&tracing::Span::current()),
            );
        }
        for (quota, d) in quotas.iter().zip(&v.quotas) {
            telemetry::policy_decision(&inner.labels, quota.borrow(), d);
        }
    }

    /// Counts a decision in the limiter's stats.
    #[inline]
    pub(super) fn bump_stats(&self, d: &Decision) {
        let counters = &self.inner.counters;
        if d.source == Source::Store {
            return counters.bump(|c| if d.allowed { &c.allowed } else { &c.denied });
        }
        counters.bump(|c| match d.source {
            Source::Store | Source::Shadow if d.allowed => &c.allowed,
            Source::Store | Source::Shadow => &c.denied,
            Source::FailOpen => &c.fail_open,
            Source::FailClosed => &c.fail_closed,
            Source::Fallback => &c.fallback,
            Source::Cache => &c.cache_hits,
            Source::Lease => &c.leased,
        });
    }
}
