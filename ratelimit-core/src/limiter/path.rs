//! How one check travels: the deny cache, the breaker, the store's one door
//! (ready answers taken in place, futures awaited under the timeout and the
//! panic guard), then the decision accepted or, on failure, made by the
//! fallback store or the failure policy; counted and recorded either way.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;

use smallvec::SmallVec;
use tracing::Instrument;

use crate::clock::Micros;
use crate::decision::{Decision, Source, Verdict};
use crate::error::{Result as StoreResult, StoreError};
use crate::model::Charge;
use crate::quota::Quota;
use crate::store::{Answer, Deadline, Decisions, Request, first};

use super::Limiter;
use super::check::{Check, INLINE_KEY, KeyBuf, SHORT_KEY, key_in};
use super::degraded::Failure;
use super::telemetry;
use super::timer::{Guard, Guarded};
use crate::health::Permit;

/// What asking the store in place came to.
enum Asked<'a> {
    /// The store answered (told to the breaker).
    Answered(Decisions),
    /// No decision (counted, told to the breaker).
    Failed(Failure),
    /// The store must be awaited.
    Pending(Answer<'a>, Option<Permit<'a>>),
}

/// What a check decided in place asked the store (for the out-of-line
/// paths that finish it).
struct InPlace<'k> {
    key: &'k [u8],
    cost: u64,
    shadow: bool,
    now: Micros,
}

/// What a check decided in place could not finish.
enum Left {
    /// The store failed: the fallback store (through its future) or the
    /// policy decides.
    Failed(Failure),
    /// The store answered pending after all: ask again with an owned key.
    Pending,
}

impl Limiter {
    /// One quota (`index` in the limiter's quotas, or `usize::MAX` for a
    /// quota from [`Limiter::check_quota`]): decided in place when the
    /// store answers in place, else through a future.
    ///
    /// The common case is a plain limiter (an in-process store; no shadow
    /// quota, deny cache or breaker: one flag, set when the limiter is
    /// built) with no subscriber taking debug spans and a short key: it
    /// is decided here, with nothing but the key, the request, the store's
    /// answer and the counters. Anything else goes to
    /// [`Limiter::check_one_full`], and everything but a decision the store
    /// made to a cold function.
    #[inline(always)]
    pub(super) fn check_one<'a>(
        &'a self,
        index: usize,
        quota: &'a Quota,
        caller: &[u8],
        cost: u64,
    ) -> Check<'a> {
        let inner = &*self.inner;
        if !inner.plain.load(Ordering::Relaxed) || telemetry::spans_enabled() {
            return self.check_one_full(index, quota, caller, cost);
        }
        let mut buf = [0u8; SHORT_KEY];
        let Some(key) = key_in(&inner.prefix, caller, &mut buf) else {
            return self.check_one_full(index, quota, caller, cost);
        };
        let charges = enforced(quota, cost);
        let request = Request::new(key, &charges).with_deadline(Deadline::within(inner.timeout));
        let store = &*inner.store;
        let started = telemetry::Started::now();
        // The decision is counted and moved into the check inside the
        // panic guard (nothing but the check is moved out of it); any
        // other answer is kept for the cold path. A panic leaves both
        // `None`.
        let mut check = None;
        let mut other = None;
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let mut answer = store.decide(request);
            match answer.decided_mut() {
                Some(d) => {
                    self.count_in(d, quota, None);
                    check = Some(Check::from_answer(Some(answer)));
                }
                None => other = Some(answer),
            }
        }));
        started.record(&inner.labels);
        match check {
            Some(check) => check,
            None => self.plain_undecided(index, quota, caller, cost, other),
        }
    }

    /// What a plain limiter's store answered that is not a decision made
    /// in place (`None`: the store panicked). The key is built again here,
    /// so that the hot path keeps less across the store's call.
    #[cold]
    #[inline(never)]
    fn plain_undecided<'a>(
        &'a self,
        index: usize,
        quota: &'a Quota,
        caller: &[u8],
        cost: u64,
        answer: Option<Answer<'_>>,
    ) -> Check<'a> {
        let key = KeyBuf::new(&self.inner.prefix, caller);
        let key = key.as_slice();
        match answer {
            Some(answer) => {
                let asked = InPlace {
                    key,
                    cost,
                    shadow: false,
                    now: 0,
                };
                self.in_place_answered(index, quota, caller, asked, answer, None, None)
            }
            None => {
                let failure = self.failed(Failure::Panicked, None);
                self.in_place_failed(index, quota, caller, key, cost, failure, None)
            }
        }
    }

    /// [`Limiter::check_one`] with everything a limiter may do around the
    /// store: the deny cache, the breaker, shadow quotas, the decision's
    /// span, keys of any length.
    #[inline(never)]
    fn check_one_full<'a>(
        &'a self,
        index: usize,
        quota: &'a Quota,
        caller: &[u8],
        cost: u64,
    ) -> Check<'a> {
        let inner = &*self.inner;
        if !inner.in_process.load(Ordering::Relaxed) {
            return self.one_later(index, quota, caller, cost, Left::Pending);
        }
        let mut buf = [0u8; INLINE_KEY];
        let Some(key) = key_in(&inner.prefix, caller, &mut buf) else {
            return self.one_later(index, quota, caller, cost, Left::Pending);
        };
        // What follows is [`Limiter::one_async`] for a store that answers in
        // place: the same deny cache, breaker, panic guard, counters, shadow
        // handling and telemetry, with no future. The happy path stays in
        // this function; everything else is handed to cold ones.
        let span = telemetry::span_if_enabled(&inner.namespace);
        let entered = span.as_ref().map(tracing::Span::enter);
        let shadow = inner.shadow.get(index).copied().unwrap_or(false);
        let now = self.now_if_needed();
        #[cfg(feature = "deny-cache")]
        if !shadow && let Some(d) = self.cached_denial(index, quota, key, cost, now) {
            self.count_in(&d, quota, span.as_ref());
            return Check::ready(d);
        }
        let permit = match self.permit(now) {
            Ok(p) => p,
            Err(failure) => {
                drop(entered);
                return self.in_place_failed(index, quota, caller, key, cost, failure, span);
            }
        };
        let charges = enforced(quota, cost);
        let request = Request::new(key, &charges).with_deadline(Deadline::within(inner.timeout));
        let store = &*inner.store;
        let started = telemetry::Started::now();
        // The answer is written in place (the closure returns nothing to
        // move out of the unwinding frame).
        let mut slot = None;
        let caught = std::panic::catch_unwind(AssertUnwindSafe(|| {
            slot = Some(store.decide(request));
        }));
        started.record(&inner.labels);
        let (Ok(()), Some(answer)) = (caught, &mut slot) else {
            let failure = self.failed(Failure::Panicked, permit);
            drop(entered);
            return self.in_place_failed(index, quota, caller, key, cost, failure, span);
        };
        if let Some(d) = answer.decided_mut() {
            self.answered(permit);
            self.accept(index, quota, key, cost, shadow, now, d);
            self.count_in(d, quota, span.as_ref());
            drop(entered);
            return Check::from_answer(slot);
        }
        drop(entered);
        let Some(answer) = slot else {
            unreachable!("the answer was written")
        };
        let asked = InPlace {
            key,
            cost,
            shadow,
            now,
        };
        self.in_place_answered(index, quota, caller, asked, answer, permit, span)
    }

    /// What [`Limiter::check_one`] could not decide in place, as a future
    /// that owns its key.
    #[cold]
    #[inline(never)]
    fn one_later<'a>(
        &'a self,
        index: usize,
        quota: &'a Quota,
        caller: &[u8],
        cost: u64,
        left: Left,
    ) -> Check<'a> {
        // The key moves into the future (inline when short: nothing on the
        // heap for it), which is instrumented only when a subscriber takes
        // its span. The future is written out in each arm so that it is
        // built where it is boxed (bound to a local first, it was moved
        // twice). A failure ends the store's part before the degraded
        // path starts: the two futures share their room, nothing boxed.
        let key = KeyBuf::new(&self.inner.prefix, caller);
        macro_rules! later {
            () => {
                async move {
                    let key = key.as_slice();
                    match left {
                        Left::Failed(failure) => {
                            self.after_failure(index, quota, key, cost, failure).await
                        }
                        Left::Pending => match self.one_async(index, quota, key, cost).await {
                            Ok(d) => d,
                            Err(failure) => {
                                self.after_failure(index, quota, key, cost, failure).await
                            }
                        },
                    }
                }
            };
        }
        match telemetry::span_if_enabled(&self.inner.namespace) {
            Some(span) => Check::pending(later!().instrument(span)),
            None => Check::pending(later!()),
        }
    }

    /// An in-place answer that is not a decision ready in place
    /// ([`Answer::decided`]): a set of one decision, an error (decided by
    /// the fallback store or handed to the async path), or a future (handed
    /// to the async path).
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn in_place_answered<'a>(
        &'a self,
        index: usize,
        quota: &'a Quota,
        caller: &[u8],
        asked: InPlace<'_>,
        answer: Answer<'_>,
        permit: Option<Permit<'_>>,
        span: Option<tracing::Span>,
    ) -> Check<'a> {
        let InPlace {
            key,
            cost,
            shadow,
            now,
        } = asked;
        let entered = span.as_ref().map(tracing::Span::enter);
        let failure = match answer.into_single() {
            Ok(Ok(mut d)) => {
                self.answered(permit);
                self.accept(index, quota, key, cost, shadow, now, &mut d);
                self.count_in(&d, quota, span.as_ref());
                return Check::ready(d);
            }
            Ok(Err(e)) => Failure::Error(e),
            Err(pending) => {
                // Told it answers in place, it did not: from now on this
                // limiter takes the async path at once. The answer was
                // never polled (dropping the permit frees a probe's slot).
                drop((pending, permit));
                self.inner.in_process.store(false, Ordering::Relaxed);
                self.inner.plain.store(false, Ordering::Relaxed);
                drop(entered);
                return self.one_later(index, quota, caller, cost, Left::Pending);
            }
        };
        let failure = self.failed(failure, permit);
        drop(entered);
        self.in_place_failed(index, quota, caller, key, cost, failure, span)
    }

    /// A failed in-place decision: decided by the fallback store when it
    /// answers in place, else handed to the async path.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn in_place_failed<'a>(
        &'a self,
        index: usize,
        quota: &'a Quota,
        caller: &[u8],
        key: &[u8],
        cost: u64,
        failure: Failure,
        span: Option<tracing::Span>,
    ) -> Check<'a> {
        let _entered = span.as_ref().map(tracing::Span::enter);
        let decided = match self.leased_one(index, quota, key, cost) {
            Some(d) => Some(d),
            None if failure.is_busy() => Some(self.by_policy(quota)),
            None => self.fallback_one_in_place(index, quota, key, cost),
        };
        match decided {
            Some(d) => {
                self.fail(quota, &failure);
                self.count_in(&d, quota, span.as_ref());
                Check::ready(d)
            }
            None => self.one_later(index, quota, caller, cost, Left::Failed(failure)),
        }
    }

    /// One quota through the store's future; a failure is handed back for
    /// [`Limiter::after_failure`].
    async fn one_async(
        &self,
        index: usize,
        quota: &Quota,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, Failure> {
        let inner = &*self.inner;
        let shadow = inner.shadow.get(index).copied().unwrap_or(false);
        let now = self.now_if_needed();
        #[cfg(feature = "deny-cache")]
        if !shadow && let Some(d) = self.cached_denial(index, quota, key, cost, now) {
            self.count(&d, quota);
            return Ok(d);
        }
        let charges = [Charge {
            quota,
            cost,
            shadow: false,
        }];
        let mut d = self
            .ask(key, &charges, now)
            .await
            .and_then(|ds| first(ds).map_err(|e| self.failed(Failure::Error(e), None)))?;
        self.accept(index, quota, key, cost, shadow, now, &mut d);
        self.count(&d, quota);
        Ok(d)
    }

    /// Several quotas, all or nothing, in one store request.
    pub(super) async fn decide_many(&self, key: &[u8], costs: &[u64]) -> Verdict {
        let inner = &*self.inner;
        let now = inner.clock.now();
        #[cfg(feature = "deny-cache")]
        if let Some(v) = self.cached_verdict(key, costs, now) {
            return v;
        }
        let charges: SmallVec<[Charge<'_>; 4]> = inner
            .quotas
            .iter()
            .zip(costs)
            .zip(&inner.shadow)
            .map(|((quota, &cost), &shadow)| Charge {
                quota,
                cost,
                shadow,
            })
            .collect();
        let verdict = match self.ask(key, &charges, now).await {
            Ok(decisions) => {
                #[cfg(feature = "deny-cache")]
                self.remember_verdict(key, costs, &decisions, now);
                for (i, (quota, d)) in inner.quotas.iter().zip(decisions.iter()).enumerate() {
                    self.lease_from(i, quota, key, d, now);
                }
                self.combine(decisions.into_vec())
            }
            Err(failure) => {
                let binding = &inner.quotas[0];
                self.fail(binding, &failure);
                let fallback = match self.leased_many(key, costs) {
                    Some(v) => Some(v),
                    None if failure.is_busy() => None,
                    None => self.fallback_many(key, costs).await,
                };
                match fallback {
                    Some(v) => v,
                    None => {
                        let decisions = inner.quotas.iter().map(|q| self.by_policy(q)).collect();
                        self.combine(decisions)
                    }
                }
            }
        };
        self.count_verdict(&verdict);
        verdict
    }

    /// The clock time, read only when something uses it (the circuit
    /// breaker, the deny cache); 0 otherwise.
    #[inline]
    fn now_if_needed(&self) -> Micros {
        let inner = &*self.inner;
        #[cfg(feature = "deny-cache")]
        let cache = inner.deny_cache.is_some();
        #[cfg(not(feature = "deny-cache"))]
        let cache = false;
        if inner.breaker.is_some() || cache || inner.leases.is_some() {
            inner.clock.now()
        } else {
            0
        }
    }

    /// Asks the store through its one door, in place: through the breaker
    /// and the panic guard, with the limiter's timeout as the deadline. A
    /// ready answer is settled here; a pending one is handed back.
    #[inline]
    fn ask_now<'a>(&'a self, key: &'a [u8], charges: &'a [Charge<'a>], now: Micros) -> Asked<'a> {
        let inner = &*self.inner;
        let permit = match self.permit(now) {
            Ok(p) => p,
            Err(failure) => return Asked::Failed(failure),
        };
        let request = Request::new(key, charges).with_deadline(Deadline::within(inner.timeout));
        let started = telemetry::Started::now();
        let store = &*inner.store;
        let answer = match std::panic::catch_unwind(AssertUnwindSafe(|| store.decide(request))) {
            Ok(answer) => answer,
            Err(_) => return Asked::Failed(self.failed(Failure::Panicked, permit)),
        };
        match answer.into_ready() {
            Ok(result) => {
                started.record(&inner.labels);
                match self.settle(Guard::Done(result), permit, charges.len()) {
                    Ok(d) => Asked::Answered(d),
                    Err(f) => Asked::Failed(f),
                }
            }
            Err(pending) => Asked::Pending(pending, permit),
        }
    }

    /// Asks the store and waits for its answer (within the timeout).
    pub(super) async fn ask<'a>(
        &'a self,
        key: &'a [u8],
        charges: &'a [Charge<'a>],
        now: Micros,
    ) -> Result<Decisions, Failure> {
        match self.ask_now(key, charges, now) {
            Asked::Answered(d) => Ok(d),
            Asked::Failed(f) => Err(f),
            Asked::Pending(answer, permit) => {
                let inner = &*self.inner;
                let started = telemetry::Started::now();
                let outcome = Guarded {
                    call: answer,
                    sleep: None,
                    arm: !inner.bounded,
                    timer: &*inner.timer,
                    timeout: inner.timeout,
                }
                .await;
                started.record(&inner.labels);
                self.settle(outcome, permit, charges.len())
            }
        }
    }

    /// The circuit breaker's word on a store request at `now`: go (with a
    /// probe's slot when half open), or, when open, the short circuit,
    /// counted.
    #[inline]
    fn permit(&self, now: Micros) -> Result<Option<Permit<'_>>, Failure> {
        let inner = &*self.inner;
        match &inner.breaker {
            Some(b) => match b.permit(now) {
                Permit::Open => {
                    inner.counters.bump(|c| &c.short_circuits);
                    telemetry::short_circuit(&inner.labels);
                    Err(Failure::Open)
                }
                p => Ok(Some(p)),
            },
            None => Ok(None),
        }
    }

    /// How a store request ended, counted, recorded and told to the
    /// breaker. An answer without one decision per charge is an error.
    #[inline]
    fn settle(
        &self,
        outcome: Guard<StoreResult<Decisions>>,
        permit: Option<Permit<'_>>,
        charges: usize,
    ) -> Result<Decisions, Failure> {
        match outcome {
            Guard::Done(Ok(v)) if v.len() == charges => {
                self.answered(permit);
                Ok(v)
            }
            Guard::Done(Ok(v)) => Err(self.failed(
                Failure::Error(StoreError::message(
                    format!(
                        "the store answered {} decisions for {charges} charges",
                        v.len()
                    ),
                    false,
                )),
                permit,
            )),
            Guard::Done(Err(e)) => Err(self.failed(Failure::Error(e), permit)),
            Guard::Panicked => Err(self.failed(Failure::Panicked, permit)),
            Guard::TimedOut { late } => Err(self.failed(Failure::Timeout { late }, permit)),
        }
    }

    /// A store request answered: the breaker closes if it was open.
    #[inline(always)]
    fn answered(&self, permit: Option<Permit<'_>>) {
        if let Some(b) = &self.inner.breaker {
            self.breaker_success(b);
        }
        drop(permit);
    }

    /// A success told to the breaker (kept off the path of a limiter
    /// without one).
    #[inline(never)]
    fn breaker_success(&self, b: &crate::health::Health) {
        let inner = &*self.inner;
        if b.success(inner.clock.now()) {
            tracing::info!(namespace = %inner.namespace, "rate-limit store answers again: circuit breaker closed");
            telemetry::breaker(&inner.labels, false);
        }
    }

    /// A store request failed (an error, a panic, a timeout): counted,
    /// recorded, and told to the breaker.
    #[cold]
    fn failed(&self, failure: Failure, permit: Option<Permit<'_>>) -> Failure {
        let inner = &*self.inner;
        let probe = matches!(permit, Some(Permit::Probe(_)));
        let (timeout, kind) = match &failure {
            Failure::Error(StoreError::Overloaded { .. }) => {
                inner.counters.bump(|c| &c.shed);
                (false, "shed")
            }
            Failure::Error(_) => (false, "error"),
            Failure::Panicked => (false, "panic"),
            Failure::Timeout { late: false } => (true, "timeout"),
            Failure::Timeout { late: true } => (true, "late"),
            // A short circuit: counted by `permit`, the store was not asked.
            Failure::Open => return failure,
        };
        inner
            .counters
            .bump(|c| if timeout { &c.timeouts } else { &c.errors });
        telemetry::store_failure(&inner.labels, kind);
        // Evidence against the store: not a timeout this process caused by
        // being late, nor an error that says the request itself was bad.
        let evidence = match &failure {
            Failure::Timeout { late } => !late,
            Failure::Error(e) => e.is_transient() && !e.is_busy(),
            Failure::Panicked => true,
            Failure::Open => false,
        };
        if let Some(b) = inner.breaker.as_ref().filter(|_| evidence || probe)
            && b.failure(inner.clock.now(), probe)
        {
            tracing::warn!(namespace = %inner.namespace, probe, "rate-limit store failing: circuit breaker open");
            telemetry::breaker(&inner.labels, true);
        }
        drop(permit);
        failure
    }

    /// A store decision for one quota: remembered by the deny cache, and
    /// admitted if only a shadow quota denies it (in place).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn accept(
        &self,
        index: usize,
        quota: &Quota,
        key: &[u8],
        cost: u64,
        shadow: bool,
        now: Micros,
        d: &mut Decision,
    ) {
        #[cfg(feature = "deny-cache")]
        if !shadow {
            self.remember_denial(index, key, cost, d, now, None);
        }
        #[cfg(not(feature = "deny-cache"))]
        let _ = cost;
        self.lease_from(index, quota, key, d, now);
        if shadow && !d.allowed {
            self.shadow_denied(quota);
            d.allowed = true;
            d.retry_after = None;
            d.source = Source::Shadow;
        }
    }

    /// One quota whose store request failed (or was short-circuited):
    /// logged, then decided by the fallback store or the failure policy,
    /// counted.
    async fn after_failure(
        &self,
        index: usize,
        quota: &Quota,
        key: &[u8],
        cost: u64,
        failure: Failure,
    ) -> Decision {
        self.fail(quota, &failure);
        let d = match self.leased_one(index, quota, key, cost) {
            Some(d) => d,
            None if failure.is_busy() => self.by_policy(quota),
            None => match self.fallback_one(index, quota, key, cost).await {
                Some(d) => d,
                None => self.by_policy(quota),
            },
        };
        self.count(&d, quota);
        d
    }
}

/// One enforced (not shadow) charge of `cost` on `quota`.
#[inline(always)]
fn enforced(quota: &Quota, cost: u64) -> [Charge<'_>; 1] {
    [Charge {
        quota,
        cost,
        shadow: false,
    }]
}
