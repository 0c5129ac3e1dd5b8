//! Calls whose quotas come with them: [`Limiter::check_charges`], for a
//! service whose quotas arrive with each request (a rate-limit service,
//! where every descriptor of a request is one charge).

use smallvec::SmallVec;
use tracing::Instrument;

use crate::decision::{Source, Verdict};
use crate::error::CostError;
use crate::model::Charge;
use crate::quota::Quota;
use crate::store::Request;

use super::Limiter;
use super::check::KeyBuf;
use super::telemetry;

impl Limiter {
    /// Checks one call of `caller` against the quotas that come with it,
    /// all or nothing, in one store request: admitted only if every
    /// enforced charge admits it, and a denied call is counted under none.
    /// A shadow charge (`Charge::shadow`) is decided and counted but never
    /// denies.
    ///
    /// For a service whose quotas arrive with each request: the limiter's
    /// own quotas are not used (build it with
    /// [`super::LimiterBuilder::quotas_per_call`]), and everything else of
    /// it is: its store, namespace, timeout, leases (by quota name and
    /// numbers), fallback store (each quota divided by the instances),
    /// failure policy, counters, metrics and log guard, so that one limiter
    /// kept for the service's life serves every request.
    ///
    /// Errors for no charge, a cost that can never be admitted, or two
    /// charges for one quota name and algorithm.
    pub async fn check_charges(
        &self,
        caller: impl AsRef<[u8]>,
        charges: &[Charge<'_>],
    ) -> Result<Verdict, CostError> {
        if charges.is_empty() {
            return Err(CostError::NoCharge);
        }
        for (i, c) in charges.iter().enumerate() {
            c.quota.check_cost(c.cost)?;
            if charges[..i]
                .iter()
                .any(|b| b.quota.name() == c.quota.name() && b.quota.kind() == c.quota.kind())
            {
                return Err(CostError::DuplicateQuota {
                    policy: c.quota.name().to_owned(),
                });
            }
        }
        let inner = &*self.inner;
        let key = KeyBuf::new(&inner.prefix, caller.as_ref());
        // The span only when a subscriber takes it: wrapping the future
        // moves it (a kilobyte) and builds the span on every call.
        let decided = self.decide_charges(key.as_slice(), charges);
        Ok(match telemetry::span_if_enabled(&inner.namespace) {
            Some(span) => decided.instrument(span).await,
            None => decided.await,
        })
    }

    /// [`Limiter::check_charges`] once the charges are checked.
    async fn decide_charges(&self, key: &[u8], charges: &[Charge<'_>]) -> Verdict {
        let inner = &*self.inner;
        let now = inner.clock.now();
        let quotas: SmallVec<[&Quota; 4]> = charges.iter().map(|c| c.quota).collect();
        let shadow: SmallVec<[bool; 4]> = charges.iter().map(|c| c.shadow).collect();
        let verdict = match self.ask(key, charges, now).await {
            Ok(decisions) => {
                for (c, d) in charges.iter().zip(decisions.iter()) {
                    self.lease_from(usize::MAX, c.quota, key, d, now);
                }
                self.combine_of(decisions.into_vec(), &quotas, &shadow)
            }
            Err(failure) => {
                self.fail(charges[0].quota, &failure);
                let degraded = match self.leased_charges(key, charges) {
                    Some(decisions) => Some(decisions),
                    None if failure.is_busy() => None,
                    None => self.fallback_charges(key, charges).await,
                };
                let decisions = degraded
                    .unwrap_or_else(|| charges.iter().map(|c| self.by_policy(c.quota)).collect());
                self.combine_of(decisions, &quotas, &shadow)
            }
        };
        self.count_verdict_of(&verdict, &quotas);
        verdict
    }

    /// The decisions of the caller's live leases under every charge;
    /// `None` without leases or a live lease for each.
    fn leased_charges(&self, key: &[u8], charges: &[Charge<'_>]) -> Option<Vec<crate::Decision>> {
        let inner = &*self.inner;
        let leases = inner.leases.as_ref()?;
        let asks: SmallVec<[super::lease::Ask<'_>; 4]> = charges
            .iter()
            .map(|c| super::lease::Ask {
                fingerprint: super::builder::fingerprint(c.quota),
                quota: c.quota,
                cost: c.cost,
                shadow: c.shadow,
            })
            .collect();
        leases.decide_all(key, &asks, inner.clock.now())
    }

    /// The fallback store's decisions under every charge's quota divided by
    /// the instances; `None` without a fallback store or an answer from it.
    async fn fallback_charges(
        &self,
        key: &[u8],
        charges: &[Charge<'_>],
    ) -> Option<Vec<crate::Decision>> {
        let fb = self.inner.fallback.as_ref()?;
        let divided: SmallVec<[Quota; 4]> = charges
            .iter()
            .map(|c| c.quota.divided(fb.instances))
            .collect::<Result<_, _>>()
            .ok()?;
        let asked: SmallVec<[Charge<'_>; 4]> = charges
            .iter()
            .zip(&divided)
            .map(|(c, quota)| Charge {
                quota,
                cost: c.cost.min(quota.limit()),
                shadow: c.shadow,
            })
            .collect();
        let decisions = fb.store.decide(Request::new(key, &asked)).await.ok()?;
        if decisions.len() != asked.len() {
            return None;
        }
        let mut decisions = decisions.into_vec();
        for d in &mut decisions {
            d.source = Source::Fallback;
        }
        Some(decisions)
    }
}
