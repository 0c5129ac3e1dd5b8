//! The store trait: one call per decision.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use crate::clock::Clock;

use crate::decision::Decision;
use crate::error::Result;
use crate::model::Charge;
use crate::quota::Quota;

/// Where callers' rate-limit state lives: in process, in Redis, in a cluster,
/// or anywhere a user implements it.
///
/// # Contract
///
/// `decide` makes one decision for `key` under `quota` at cost `cost`,
/// atomically: the read, the arithmetic and the write of the caller's state
/// happen as one step with respect to every other call on the same key, from
/// this or any other store instance sharing the backend. Its decisions equal
/// those of [`crate::model::decide`] at the store's notion of "now". Keys are
/// arbitrary bytes and fully isolated from each other; state is kept per
/// `(key, quota.name(), quota.kind())` and expires after the model's derived
/// TTL. A denial is `Ok` with `allowed == false`; `Err` means no decision
/// could be made (the limiter applies its failure policy). A cost of zero or
/// above the quota's limit is `Err(StoreError::Cost)`.
///
/// `decide_all` makes one decision for `key` over several quotas, all or
/// nothing: the call is admitted only if every enforced charge admits it,
/// and a denied call is counted in no quota. Its decisions equal
/// [`crate::model::decide_all`]'s. The provided implementation is **not
/// atomic**: it calls `decide` for each charge in order and stops at the
/// first denial, so quotas before it have counted the call, and it returns
/// decisions for the charges up to that denial only; it reports
/// [`Store::atomic_all`] `false`. The shipped stores override both.
///
/// `decide_before` and `decide_all_before` are the same decisions for a
/// caller that stops waiting at `deadline` (the [`crate::Limiter`] passes
/// the end of its timeout). A store that cannot take back a request once
/// sent (a network store: the request may be carried out after the caller
/// has given up and answered by its failure policy) should see to it that
/// such a request counts nothing: the shipped Redis stores send the
/// deadline in server time and their scripts return "expired" without
/// writing once it has passed. The provided implementations ignore the
/// deadline and call `decide` / `decide_all`, which is right for an
/// in-process store (it answers in one step, or not at all). A store that
/// wraps another (to count, log or route its calls) should forward these
/// two as well, or the wrapped store never learns the deadline.
///
/// `ratelimit-testkit` checks all of this for any store.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Makes one decision. See the trait's contract.
    async fn decide(&self, key: &[u8], quota: &Quota, cost: u64) -> Result<Decision>;

    /// Makes one decision synchronously, when the store can answer without
    /// waiting (an in-process store). `None`, the default, means "not
    /// here: call [`Store::decide`]"; network stores leave it so.
    ///
    /// The [`crate::Limiter`] tries it first, so an in-process store answers
    /// without the boxed future of an object-safe async trait. A `Some`
    /// result obeys the same contract as [`Store::decide`], and a store that
    /// answers `Some` once should keep doing so.
    fn decide_sync(&self, key: &[u8], quota: &Quota, cost: u64) -> Option<Result<Decision>> {
        let _ = (key, quota, cost);
        None
    }

    /// Makes one all-or-nothing decision over several quotas; one decision
    /// per charge, in order. See the trait's contract: the provided
    /// implementation is not atomic.
    async fn decide_all(&self, key: &[u8], charges: &[Charge<'_>]) -> Result<Vec<Decision>> {
        let mut out = Vec::with_capacity(charges.len());
        for c in charges {
            let d = self.decide(key, c.quota, c.cost).await?;
            let stop = !d.allowed && !c.shadow;
            out.push(d);
            if stop {
                break;
            }
        }
        Ok(out)
    }

    /// [`Store::decide`] for a caller that stops waiting at `deadline`: a
    /// request carried out after it should count nothing (see the trait's
    /// contract). Provided: ignores the deadline.
    async fn decide_before(
        &self,
        key: &[u8],
        quota: &Quota,
        cost: u64,
        deadline: Instant,
    ) -> Result<Decision> {
        let _ = deadline;
        self.decide(key, quota, cost).await
    }

    /// [`Store::decide_all`] for a caller that stops waiting at `deadline`
    /// (see [`Store::decide_before`]). Provided: ignores the deadline.
    async fn decide_all_before(
        &self,
        key: &[u8],
        charges: &[Charge<'_>],
        deadline: Instant,
    ) -> Result<Vec<Decision>> {
        let _ = deadline;
        self.decide_all(key, charges).await
    }

    /// Whether [`Store::decide_all`] is atomic (all or nothing, one step).
    /// `false` for the provided implementation.
    fn atomic_all(&self) -> bool {
        false
    }

    /// The clock the store decides by, when it is one the application can
    /// read (an in-process clock or an injected one). `None` (the default)
    /// means the store's own clock, such as Redis `TIME`.
    ///
    /// The [`crate::Limiter`] uses it for `X-RateLimit-Reset` unless given a
    /// clock explicitly, so a store on a `ManualClock` gives consistent headers.
    fn clock(&self) -> Option<Arc<dyn Clock>> {
        None
    }
}

#[async_trait]
impl<S: Store + ?Sized> Store for Arc<S> {
    async fn decide(&self, key: &[u8], quota: &Quota, cost: u64) -> Result<Decision> {
        (**self).decide(key, quota, cost).await
    }
    fn decide_sync(&self, key: &[u8], quota: &Quota, cost: u64) -> Option<Result<Decision>> {
        (**self).decide_sync(key, quota, cost)
    }
    async fn decide_all(&self, key: &[u8], charges: &[Charge<'_>]) -> Result<Vec<Decision>> {
        (**self).decide_all(key, charges).await
    }
    async fn decide_before(
        &self,
        key: &[u8],
        quota: &Quota,
        cost: u64,
        deadline: Instant,
    ) -> Result<Decision> {
        (**self).decide_before(key, quota, cost, deadline).await
    }
    async fn decide_all_before(
        &self,
        key: &[u8],
        charges: &[Charge<'_>],
        deadline: Instant,
    ) -> Result<Vec<Decision>> {
        (**self).decide_all_before(key, charges, deadline).await
    }
    fn atomic_all(&self) -> bool {
        (**self).atomic_all()
    }
    fn clock(&self) -> Option<Arc<dyn Clock>> {
        (**self).clock()
    }
}

#[async_trait]
impl<S: Store + ?Sized> Store for Box<S> {
    async fn decide(&self, key: &[u8], quota: &Quota, cost: u64) -> Result<Decision> {
        (**self).decide(key, quota, cost).await
    }
    fn decide_sync(&self, key: &[u8], quota: &Quota, cost: u64) -> Option<Result<Decision>> {
        (**self).decide_sync(key, quota, cost)
    }
    async fn decide_all(&self, key: &[u8], charges: &[Charge<'_>]) -> Result<Vec<Decision>> {
        (**self).decide_all(key, charges).await
    }
    async fn decide_before(
        &self,
        key: &[u8],
        quota: &Quota,
        cost: u64,
        deadline: Instant,
    ) -> Result<Decision> {
        (**self).decide_before(key, quota, cost, deadline).await
    }
    async fn decide_all_before(
        &self,
        key: &[u8],
        charges: &[Charge<'_>],
        deadline: Instant,
    ) -> Result<Vec<Decision>> {
        (**self).decide_all_before(key, charges, deadline).await
    }
    fn atomic_all(&self) -> bool {
        (**self).atomic_all()
    }
    fn clock(&self) -> Option<Arc<dyn Clock>> {
        (**self).clock()
    }
}
