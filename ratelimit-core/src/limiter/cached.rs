//! The deny cache on the check's path (feature `deny-cache`): a cached
//! denial answers a call before the store is asked, and the store's
//! denials are remembered, with every quota's numbers for a verdict.

use std::time::Duration;

use crate::clock::Micros;
use crate::decision::{Decision, Source, Verdict};
use crate::quota::Quota;

use super::Limiter;
use super::telemetry;

impl Limiter {
    #[cfg(feature = "deny-cache")]
    pub(super) fn cached_denial(
        &self,
        index: usize,
        quota: &Quota,
        key: &[u8],
        cost: u64,
        now: Micros,
    ) -> Option<Decision> {
        let hit = self.cache_hit(index, key, cost, now)?;
        telemetry::cache_hit(&self.inner.labels, quota);
        Some(cached_decision(&hit, quota, now))
    }

    /// The cached denial of quota `index` that covers a call of `cost` at `now`.
    #[cfg(feature = "deny-cache")]
    pub(super) fn cache_hit(
        &self,
        index: usize,
        key: &[u8],
        cost: u64,
        now: Micros,
    ) -> Option<super::deny_cache::Hit> {
        let inner = &*self.inner;
        let cache = inner.deny_cache.as_ref()?;
        let fp = *inner.fingerprints.get(index)?;
        cache.denied(key, fp, cost, now)
    }

    /// A verdict from the cache: the enforced quota whose cached denial is
    /// the longest binds; every other quota's decision is its own cached
    /// denial or its numbers in the binding denial's snapshot. Without the
    /// numbers of every enforced quota there is no cached verdict (the store
    /// decides), so that its headers list every policy as the store's do.
    #[cfg(feature = "deny-cache")]
    pub(super) fn cached_verdict(&self, key: &[u8], costs: &[u64], now: Micros) -> Option<Verdict> {
        let inner = &*self.inner;
        inner.deny_cache.as_ref()?;
        let hits: Vec<Option<super::deny_cache::Hit>> = (0..inner.quotas.len())
            .map(|i| {
                (!inner.shadow[i])
                    .then(|| self.cache_hit(i, key, costs[i], now))
                    .flatten()
            })
            .collect();
        let binding = (0..hits.len())
            .filter(|&i| hits[i].is_some())
            .max_by_key(|&i| hits[i].as_ref().map(|h| h.until))?;
        let snapshot = hits[binding].as_ref()?.snapshot.clone();
        let mut quotas = Vec::with_capacity(inner.quotas.len());
        for (i, q) in inner.quotas.iter().enumerate() {
            let d = match (&hits[i], snapshot.as_deref().and_then(|s| s.get(i))) {
                (Some(hit), _) => cached_decision(hit, q, now),
                (None, Some(n)) => {
                    let (remaining, reset_after) = n.at(now, q);
                    Decision {
                        allowed: n.allowed,
                        limit: q.limit(),
                        remaining,
                        reset_after,
                        retry_after: None,
                        source: Source::Cache,
                    }
                }
                // A shadow quota's numbers are never shown.
                (None, None) if inner.shadow[i] => Decision {
                    source: Source::Cache,
                    ..Decision::from_policy(true, q.limit())
                },
                (None, None) => return None,
            };
            quotas.push(d);
        }
        telemetry::cache_hit(&inner.labels, &inner.quotas[binding]);
        let verdict = Verdict {
            decision: quotas[binding].clone(),
            binding,
            quotas,
        };
        self.count_verdict(&verdict);
        Some(verdict)
    }

    #[cfg(feature = "deny-cache")]
    pub(super) fn remember_denial(
        &self,
        index: usize,
        key: &[u8],
        cost: u64,
        d: &Decision,
        sent: Micros,
        snapshot: Option<super::deny_cache::Snapshot>,
    ) {
        let inner = &*self.inner;
        let (Some(cache), Some(&fp)) = (inner.deny_cache.as_ref(), inner.fingerprints.get(index))
        else {
            return;
        };
        if let (false, Source::Store) = (d.allowed, d.source) {
            cache.remember(key, fp, cost, sent, d, snapshot);
        }
    }

    /// Remembers each enforced quota's denial in a store verdict, with every
    /// quota's numbers.
    #[cfg(feature = "deny-cache")]
    pub(super) fn remember_verdict(
        &self,
        key: &[u8],
        costs: &[u64],
        decisions: &[Decision],
        sent: Micros,
    ) {
        let inner = &*self.inner;
        if inner.deny_cache.is_none() {
            return;
        }
        let denied = |(i, d): &(usize, &Decision)| !inner.shadow[*i] && !d.allowed;
        if !decisions.iter().enumerate().any(|p| denied(&p)) {
            return;
        }
        let snapshot: super::deny_cache::Snapshot = decisions
            .iter()
            .zip(costs)
            .map(|(d, &cost)| super::deny_cache::Numbers::in_denied_verdict(d, cost, sent))
            .collect();
        for (i, d) in decisions.iter().enumerate().filter(denied) {
            self.remember_denial(i, key, costs[i], d, sent, Some(snapshot.clone()));
        }
    }
}

/// A cached denial as a decision at `now`: the exact wait left, and the
/// numbers the store gave (see the deny cache's docs).
#[cfg(feature = "deny-cache")]
fn cached_decision(hit: &super::deny_cache::Hit, quota: &Quota, now: Micros) -> Decision {
    let (remaining, reset_after) = hit.numbers.at(now, quota);
    Decision {
        allowed: false,
        limit: quota.limit(),
        remaining,
        reset_after,
        retry_after: Some(Duration::from_micros(hit.until - now)),
        source: Source::Cache,
    }
}
