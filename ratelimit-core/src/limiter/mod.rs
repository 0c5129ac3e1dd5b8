//! The limiter an application holds: a store, quotas, a namespace, a
//! failure policy, a timeout, and the production controls around the store
//! call (circuit breaker, fallback store, deny cache, shadow quotas,
//! metrics and traces).

mod acquire;
mod breaker;
mod builder;
#[cfg(feature = "deny-cache")]
mod deny_cache;
mod telemetry;
mod timer;

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

pub use acquire::AcquireError;
pub use breaker::{BreakerState, CircuitBreaker};
pub use builder::LimiterBuilder;
#[cfg(feature = "deny-cache")]
pub use deny_cache::DenyCache;
#[cfg(feature = "tokio")]
pub use timer::TokioTimer;
pub use timer::{Sleep, Timer};

use crate::clock::{Clock, Micros};
use crate::decision::{Decision, Source, Verdict};
use crate::error::{CostError, Result as StoreResult, StoreError};
use crate::headers::RateLimitHeaders;
use crate::model::Charge;
use crate::quota::Quota;
use crate::store::Store;

use tracing::Instrument;

use breaker::{Breaker, Permit};
use timer::{Guard, Guarded};

/// The byte between a limiter's namespace and the caller in store keys: `~`.
///
/// Namespaces are restricted to `A-Z a-z 0-9 _ - .`, so the first `~` always
/// ends the namespace; `~` is also left unescaped by the Redis key layout.
pub const NAMESPACE_SEPARATOR: u8 = b'~';

/// Store keys up to this many bytes are built on the stack.
const INLINE_KEY: usize = 128;

/// The default time a limiter waits for its store: 20 ms.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(20);

/// What a limiter answers when its store (and its fallback store, if any)
/// fails, times out, or is skipped by an open circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailurePolicy {
    /// Admit the call: availability over enforcement. For general API
    /// quota, where an outage of the limiter must not become an outage of
    /// the API. A call answered by policy is not counted by the store: the
    /// limiter passes the end of its timeout to the store
    /// ([`Store::decide_before`]), and the shipped Redis stores make a
    /// request still queued on a paused connection count nothing when it
    /// runs after it (calls already running at that instant may still
    /// count: their reply, not their run, was late).
    FailOpen,
    /// Deny the call: enforcement over availability. For logins, password
    /// resets and anything an attacker would love the limiter to forget.
    FailClosed,
}

/// Counters of how a limiter's decisions were reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LimiterStats {
    /// Decisions made by the store that admitted the call.
    pub allowed: u64,
    /// Decisions made by the store that denied the call.
    pub denied: u64,
    /// Calls admitted by the fail-open policy.
    pub fail_open: u64,
    /// Calls denied by the fail-closed policy.
    pub fail_closed: u64,
    /// Calls decided by the fallback store while the shared store was unavailable.
    pub fallback: u64,
    /// Calls denied from the deny cache, without a round trip.
    pub cache_hits: u64,
    /// Calls admitted only because the quotas that denied are in shadow mode.
    pub shadow_denials: u64,
    /// Store errors (including panics), not counting timeouts.
    pub errors: u64,
    /// Store calls that timed out.
    pub timeouts: u64,
    /// Calls not sent to the store because the circuit breaker was open.
    pub short_circuits: u64,
}

/// How many stripes the counters are split into: each thread bumps one
/// stripe (chosen once per thread), so threads deciding at once do not
/// contend on one cache line; the stats add the stripes up.
const STRIPES: usize = 8;

/// One stripe of the counters, on a cache-line pair of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe {
    allowed: AtomicU64,
    denied: AtomicU64,
    fail_open: AtomicU64,
    fail_closed: AtomicU64,
    fallback: AtomicU64,
    cache_hits: AtomicU64,
    shadow_denials: AtomicU64,
    errors: AtomicU64,
    timeouts: AtomicU64,
    short_circuits: AtomicU64,
}

/// The limiter's counters, striped per thread and kept in an allocation of
/// their own (away from the limiter's read-mostly fields).
#[derive(Debug, Default)]
struct Counters {
    stripes: Box<[Stripe; STRIPES]>,
}

impl Counters {
    /// The calling thread's stripe.
    #[inline]
    fn local(&self) -> &Stripe {
        &self.stripes[stripe_index()]
    }

    /// One counter summed over the stripes.
    fn sum(&self, counter: impl Fn(&Stripe) -> &AtomicU64) -> u64 {
        self.stripes
            .iter()
            .map(|s| counter(s).load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

/// The calling thread's counter stripe: threads take stripes in turn, on
/// their first decision.
#[inline]
fn stripe_index() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX
        .try_with(|i| {
            let mut v = i.get();
            if v >= STRIPES {
                v = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
                i.set(v);
            }
            v
        })
        // A thread being torn down shares the first stripe.
        .unwrap_or(0)
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// What an application holds: checks callers against one or more quotas.
///
/// With several quotas a call is decided **all or nothing** in one store
/// call ([`Store::decide_all`]): admitted only if every quota admits it, and
/// a denied call is counted in no quota. A store error, panic or timeout
/// never reaches the caller: it becomes a [`Decision`] from the fallback
/// store (if configured) or the [`FailurePolicy`], is counted in
/// [`Limiter::stats`], recorded in metrics (feature `metrics`) and logged
/// through `tracing` (at most one warning a second). After repeated
/// failures the circuit breaker stops calling the store for a cool-down.
///
/// ```
/// # #[cfg(feature = "tokio")]
/// # async fn example(store: impl ratelimit_core::Store + 'static) -> Result<(), Box<dyn std::error::Error>> {
/// use ratelimit_core::{FailurePolicy, Limiter, Quota, Rate};
/// use std::time::Duration;
///
/// let limiter = Limiter::builder(store)
///     .quota(Quota::token_bucket(Rate::per_second(10), 10)?.named("second")?)
///     .quota(Quota::fixed_window(Rate::per_day(1_000))?.named("day")?)
///     .namespace("api")?
///     .failure_policy(FailurePolicy::FailOpen)
///     .timeout(Duration::from_millis(20))
///     .build()?;
/// let verdict = limiter.check_all("customer-42", 1).await?;
/// if !verdict.allowed() {
///     // answer 429 with limiter.headers_all(&verdict)
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

/// The in-process store used while the shared one is unavailable, and the
/// quotas divided for it.
#[derive(Debug)]
pub(crate) struct Fallback {
    store: Arc<dyn Store>,
    quotas: Vec<Quota>,
    instances: u32,
}

struct Inner {
    store: Arc<dyn Store>,
    quotas: Vec<Quota>,
    shadow: Vec<bool>,
    /// Per quota: a fingerprint of its name and numbers (deny cache keys).
    #[cfg_attr(not(feature = "deny-cache"), allow(dead_code))]
    fingerprints: Vec<u64>,
    namespace: String,
    policy: FailurePolicy,
    timeout: Duration,
    timer: Arc<dyn Timer>,
    clock: Arc<dyn Clock>,
    counters: Counters,
    /// Whether the store has answered [`Store::decide_sync`] (until it
    /// declines once): single-quota checks try it before any future.
    sync_store: AtomicBool,
    last_warning: AtomicU64,
    last_shadow_log: AtomicU64,
    breaker: Option<Breaker>,
    fallback: Option<Fallback>,
    #[cfg(feature = "deny-cache")]
    deny_cache: Option<deny_cache::Cache>,
    jitter: acquire::Jitter,
    labels: telemetry::Labels,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        let mut d = f.debug_struct("Limiter");
        d.field("store", &i.store)
            .field("quotas", &i.quotas)
            .field("shadow", &i.shadow)
            .field("namespace", &i.namespace)
            .field("policy", &i.policy)
            .field("timeout", &i.timeout)
            .field("breaker", &i.breaker.is_some())
            .field("fallback", &i.fallback);
        #[cfg(feature = "deny-cache")]
        d.field("deny_cache", &i.deny_cache);
        d.finish()
    }
}

/// Why a store call produced no decision.
enum Failure {
    Error(StoreError),
    Timeout,
    Panicked,
    /// The circuit breaker is open: the store was not called.
    Open,
}

impl Failure {
    /// What to log: the error and whether it is transient.
    fn describe(&self, timeout: Duration) -> (String, bool) {
        match self {
            Self::Error(e) => (e.to_string(), e.is_transient()),
            Self::Timeout => (StoreError::Timeout(timeout).to_string(), true),
            Self::Panicked => ("the store panicked".to_owned(), false),
            Self::Open => (
                "circuit breaker open: the store failed repeatedly and is not called until its \
                 cool-down ends"
                    .to_owned(),
                true,
            ),
        }
    }
}

type Call<'a, T> = Pin<Box<dyn Future<Output = StoreResult<T>> + Send + 'a>>;

/// What the synchronous attempt at one decision came to.
enum Attempt {
    /// Decided, counted and recorded.
    Done(Decision),
    /// The store failed or the breaker is open (counted): the fallback
    /// store or the failure policy decides, on the async path.
    Failed(Failure),
    /// The store answers only through its future: the async path decides.
    NotSync,
}

/// One decision: [`Store::decide_sync`] first (an in-process store answers
/// there, with no future to box), else the store's boxed `decide` future.
/// Polled inside the limiter's panic guard and timeout.
struct SyncFirst<'a> {
    store: &'a dyn Store,
    key: &'a [u8],
    quota: &'a Quota,
    cost: u64,
    /// The limiter's timeout: the store is told the caller stops waiting
    /// then ([`Store::decide_before`]).
    timeout: std::time::Duration,
    pending: Option<Call<'a, Decision>>,
}

impl Future for SyncFirst<'_> {
    type Output = StoreResult<Decision>;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = &mut *self;
        if this.pending.is_none() {
            if let Some(r) = this.store.decide_sync(this.key, this.quota, this.cost) {
                return std::task::Poll::Ready(r);
            }
            let deadline = std::time::Instant::now() + this.timeout;
            this.pending = Some(
                this.store
                    .decide_before(this.key, this.quota, this.cost, deadline),
            );
        }
        match &mut this.pending {
            Some(call) => call.as_mut().poll(cx),
            None => std::task::Poll::Pending,
        }
    }
}

/// `namespace ~ caller`: written into `inline` when it fits (the common
/// short key: no allocation), else on the heap.
#[inline]
fn namespaced<'a>(
    namespace: &str,
    caller: &[u8],
    inline: &'a mut [u8; INLINE_KEY],
) -> Result<&'a [u8], Vec<u8>> {
    let ns = namespace.as_bytes();
    let len = ns.len() + 1 + caller.len();
    if len <= INLINE_KEY {
        inline[..ns.len()].copy_from_slice(ns);
        inline[ns.len()] = NAMESPACE_SEPARATOR;
        inline[ns.len() + 1..len].copy_from_slice(caller);
        Ok(&inline[..len])
    } else {
        Err([ns, &[NAMESPACE_SEPARATOR], caller].concat())
    }
}

impl Limiter {
    /// Starts building a limiter over `store`.
    pub fn builder(store: impl Store + 'static) -> LimiterBuilder {
        Self::builder_arc(Arc::new(store))
    }

    /// Starts building a limiter over a shared store.
    pub fn builder_arc(store: Arc<dyn Store>) -> LimiterBuilder {
        LimiterBuilder::new(store)
    }

    /// Checks one call of cost 1 for `caller` against every quota.
    ///
    /// A cost of 1 is valid for every quota, so this cannot fail.
    pub async fn check(&self, caller: impl AsRef<[u8]>) -> Decision {
        let caller = caller.as_ref();
        let inner = &*self.inner;
        if let [q] = &inner.quotas[..] {
            // A cost of 1 needs no check. An in-process store decides here,
            // before any future below this one is created.
            let span = telemetry::span(&inner.namespace);
            return match self.decide_one_sync(0, q, caller, 1, &span) {
                Attempt::Done(d) => d,
                attempt => self.one_async(0, q, caller, 1, attempt, span).await,
            };
        }
        match self.check_all(caller, 1).await {
            Ok(v) => v.decision,
            // Unreachable: every validated quota has a limit of at least 1.
            Err(_) => Decision::from_policy(inner.policy == FailurePolicy::FailOpen, 0),
        }
    }

    /// Checks one call of cost `cost` (under every quota) for `caller`: the
    /// combined decision of [`Limiter::check_all`].
    ///
    /// Errors only for a cost that can never be admitted by some quota.
    pub async fn check_n(
        &self,
        caller: impl AsRef<[u8]>,
        cost: u64,
    ) -> Result<Decision, CostError> {
        let caller = caller.as_ref();
        if self.inner.quotas.len() == 1 {
            let q = &self.inner.quotas[0];
            q.check_cost(cost)?;
            return Ok(self.one(0, q, caller, cost).await);
        }
        Ok(self.check_all(caller, cost).await?.decision)
    }

    /// Checks one call of cost `cost` under every quota, all or nothing,
    /// returning each quota's decision and which one binds.
    pub async fn check_all(
        &self,
        caller: impl AsRef<[u8]>,
        cost: u64,
    ) -> Result<Verdict, CostError> {
        let n = self.inner.quotas.len();
        let costs: Vec<u64> = vec![cost; n];
        self.check_costs(caller, &costs).await
    }

    /// Checks one call with its own cost under each quota (in the limiter's
    /// order): a request counts 1 against a request quota and its size
    /// against a byte quota. All or nothing, in one store call.
    ///
    /// Errors for a cost that can never be admitted, or when `costs` does
    /// not have one cost per quota.
    pub async fn check_costs(
        &self,
        caller: impl AsRef<[u8]>,
        costs: &[u64],
    ) -> Result<Verdict, CostError> {
        let inner = &*self.inner;
        if costs.len() != inner.quotas.len() {
            return Err(CostError::Count {
                given: costs.len(),
                quotas: inner.quotas.len(),
            });
        }
        for (q, &c) in inner.quotas.iter().zip(costs) {
            q.check_cost(c)?;
        }
        let caller = caller.as_ref();
        if inner.quotas.len() == 1 {
            let d = self.one(0, &inner.quotas[0], caller, costs[0]).await;
            return Ok(Verdict {
                decision: d.clone(),
                binding: 0,
                quotas: vec![d],
            });
        }
        Ok(self
            .with_key(caller, async |key| self.decide_many(key, costs).await)
            .instrument(telemetry::span(&inner.namespace))
            .await)
    }

    /// Checks `caller` against `quota` only (which need not be one of the
    /// limiter's own quotas): for per-route or per-plan policies. Enforced,
    /// whatever the limiter's shadow settings.
    pub async fn check_quota(
        &self,
        quota: &Quota,
        caller: impl AsRef<[u8]>,
        cost: u64,
    ) -> Result<Decision, CostError> {
        quota.check_cost(cost)?;
        Ok(self.one(usize::MAX, quota, caller.as_ref(), cost).await)
    }

    /// One quota (`index` in the limiter's quotas, or `usize::MAX` for a
    /// quota from [`Limiter::check_quota`]), in its decision span: decided
    /// synchronously when the store answers so ([`Store::decide_sync`]: no
    /// future is created below this one), else through the async path.
    async fn one(&self, index: usize, quota: &Quota, caller: &[u8], cost: u64) -> Decision {
        let span = telemetry::span(&self.inner.namespace);
        match self.decide_one_sync(index, quota, caller, cost, &span) {
            Attempt::Done(d) => d,
            attempt => {
                self.one_async(index, quota, caller, cost, attempt, span)
                    .await
            }
        }
    }

    /// What [`Limiter::decide_one_sync`] left to the async path, in `span`.
    async fn one_async(
        &self,
        index: usize,
        quota: &Quota,
        caller: &[u8],
        cost: u64,
        attempt: Attempt,
        span: tracing::Span,
    ) -> Decision {
        match attempt {
            Attempt::Done(d) => d,
            Attempt::Failed(failure) => {
                self.with_key(caller, async |key| {
                    self.after_failure(index, quota, key, cost, failure).await
                })
                .instrument(span)
                .await
            }
            Attempt::NotSync => {
                self.with_key(caller, async |key| {
                    self.decide_one(index, quota, key, cost).await
                })
                .instrument(span)
                .await
            }
        }
    }

    /// Builds `namespace ~ caller` on the stack (for the common short key)
    /// and runs `f` with it.
    #[inline]
    fn with_key_sync<R>(&self, caller: &[u8], f: impl FnOnce(&[u8]) -> R) -> R {
        let mut inline = [0u8; INLINE_KEY];
        match namespaced(&self.inner.namespace, caller, &mut inline) {
            Ok(key) => f(key),
            Err(heap) => f(&heap),
        }
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
        if inner.breaker.is_some() || cache {
            inner.clock.now()
        } else {
            0
        }
    }

    /// [`Limiter::decide_one`] without a future, for a store that answers
    /// synchronously: the same deny cache, breaker, panic guard, counters,
    /// shadow handling and telemetry, in `span`. What it cannot finish
    /// without waiting (a store failure's fallback) it hands back.
    fn decide_one_sync(
        &self,
        index: usize,
        quota: &Quota,
        caller: &[u8],
        cost: u64,
        span: &tracing::Span,
    ) -> Attempt {
        let inner = &*self.inner;
        if !inner.sync_store.load(Ordering::Relaxed) {
            return Attempt::NotSync;
        }
        let _entered = (!span.is_disabled()).then(|| span.enter());
        self.with_key_sync(caller, |key| {
            let shadow = inner.shadow.get(index).copied().unwrap_or(false);
            let now = self.now_if_needed();
            #[cfg(feature = "deny-cache")]
            if !shadow {
                if let Some(d) = self.cached_denial(index, quota, key, cost, now) {
                    self.count_in(&d, quota, span);
                    return Attempt::Done(d);
                }
            }
            let permit = match self.permit(now) {
                Ok(p) => p,
                Err(failure) => return Attempt::Failed(failure),
            };
            let started = telemetry::Started::now();
            let store = &*inner.store;
            let answer =
                std::panic::catch_unwind(AssertUnwindSafe(|| store.decide_sync(key, quota, cost)));
            started.record(&inner.labels);
            let failure = match answer {
                Ok(Some(Ok(mut d))) => {
                    self.answered(permit);
                    self.accept(index, quota, key, cost, shadow, now, &mut d);
                    self.count_in(&d, quota, span);
                    return Attempt::Done(d);
                }
                Ok(Some(Err(e))) => Failure::Error(e),
                Err(_) => Failure::Panicked,
                // Not an in-process store: from now on this limiter takes
                // the async path at once (dropping the permit frees a
                // probe's slot for it).
                Ok(None) => {
                    inner.sync_store.store(false, Ordering::Relaxed);
                    return Attempt::NotSync;
                }
            };
            Attempt::Failed(self.failed(failure, permit))
        })
    }

    /// Builds `namespace ~ caller` (on the stack for the common short key)
    /// and runs `f` with it.
    async fn with_key<R>(&self, caller: &[u8], f: impl AsyncFnOnce(&[u8]) -> R) -> R {
        let mut inline = [0u8; INLINE_KEY];
        match namespaced(&self.inner.namespace, caller, &mut inline) {
            Ok(key) => f(key).await,
            Err(heap) => f(&heap).await,
        }
    }

    /// Runs one store call through the breaker, the timeout and the panic
    /// guard.
    async fn call<'a, T, F>(&'a self, call: F, now: Micros) -> Result<T, Failure>
    where
        F: Future<Output = StoreResult<T>> + Unpin + Send + 'a,
    {
        let inner = &*self.inner;
        let permit = self.permit(now)?;
        let started = telemetry::Started::now();
        let outcome = Guarded {
            call,
            sleep: None,
            timer: &*inner.timer,
            timeout: inner.timeout,
        }
        .await;
        started.record(&inner.labels);
        self.settle(outcome, permit)
    }

    /// The circuit breaker's word on a store call at `now`: go (with a
    /// probe's slot when half open), or, when open, the short circuit,
    /// counted.
    #[inline]
    fn permit(&self, now: Micros) -> Result<Option<Permit<'_>>, Failure> {
        let inner = &*self.inner;
        match &inner.breaker {
            Some(b) => match b.permit(now) {
                Permit::Open => {
                    bump(&inner.counters.local().short_circuits);
                    telemetry::short_circuit(&inner.labels);
                    Err(Failure::Open)
                }
                p => Ok(Some(p)),
            },
            None => Ok(None),
        }
    }

    /// How a store call ended, counted, recorded and told to the breaker.
    fn settle<T>(
        &self,
        outcome: Guard<StoreResult<T>>,
        permit: Option<Permit<'_>>,
    ) -> Result<T, Failure> {
        match outcome {
            Guard::Done(Ok(v)) => {
                self.answered(permit);
                Ok(v)
            }
            Guard::Done(Err(e)) => Err(self.failed(Failure::Error(e), permit)),
            Guard::Panicked => Err(self.failed(Failure::Panicked, permit)),
            Guard::TimedOut => Err(self.failed(Failure::Timeout, permit)),
        }
    }

    /// A store call answered: the breaker closes if it was open.
    #[inline]
    fn answered(&self, permit: Option<Permit<'_>>) {
        let inner = &*self.inner;
        if let Some(b) = &inner.breaker {
            if b.success() {
                tracing::info!(namespace = %inner.namespace, "rate-limit store answers again: circuit breaker closed");
                telemetry::breaker(&inner.labels, false);
            }
        }
        drop(permit);
    }

    /// A store call failed (an error, a panic, a timeout): counted,
    /// recorded, and told to the breaker.
    #[cold]
    fn failed(&self, failure: Failure, permit: Option<Permit<'_>>) -> Failure {
        let inner = &*self.inner;
        let probe = matches!(permit, Some(Permit::Probe(_)));
        let (counter, kind) = match failure {
            Failure::Error(_) => (&inner.counters.local().errors, "error"),
            Failure::Panicked => (&inner.counters.local().errors, "panic"),
            Failure::Timeout => (&inner.counters.local().timeouts, "timeout"),
            // A short circuit: counted by `permit`, the store was not called.
            Failure::Open => return failure,
        };
        bump(counter);
        telemetry::store_failure(&inner.labels, kind);
        if let Some(b) = &inner.breaker {
            if b.failure(inner.clock.now(), probe) {
                tracing::warn!(namespace = %inner.namespace, probe, "rate-limit store failing: circuit breaker open");
                telemetry::breaker(&inner.labels, true);
            }
        }
        drop(permit);
        failure
    }

    /// One quota (`index` in the limiter's quotas, or `usize::MAX` for a
    /// quota from [`Limiter::check_quota`]), through the store's future.
    async fn decide_one(&self, index: usize, quota: &Quota, key: &[u8], cost: u64) -> Decision {
        let inner = &*self.inner;
        let shadow = inner.shadow.get(index).copied().unwrap_or(false);
        let now = self.now_if_needed();
        #[cfg(feature = "deny-cache")]
        if !shadow {
            if let Some(d) = self.cached_denial(index, quota, key, cost, now) {
                self.count(&d, quota);
                return d;
            }
        }
        // An in-process store answers synchronously, without a boxed future.
        let call = SyncFirst {
            store: &*inner.store,
            key,
            quota,
            cost,
            timeout: inner.timeout,
            pending: None,
        };
        match self.call(call, now).await {
            Ok(mut d) => {
                self.accept(index, quota, key, cost, shadow, now, &mut d);
                self.count(&d, quota);
                d
            }
            Err(failure) => self.after_failure(index, quota, key, cost, failure).await,
        }
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
            self.remember_denial(index, key, cost, d, now);
        }
        #[cfg(not(feature = "deny-cache"))]
        let _ = (index, key, cost, now);
        if shadow && !d.allowed {
            self.shadow_denied(quota);
            d.allowed = true;
            d.retry_after = None;
            d.source = Source::Shadow;
        }
    }

    /// One quota whose store call failed (or was short-circuited): logged,
    /// then decided by the fallback store or the failure policy, counted.
    async fn after_failure(
        &self,
        index: usize,
        quota: &Quota,
        key: &[u8],
        cost: u64,
        failure: Failure,
    ) -> Decision {
        self.fail(quota, &failure);
        let d = match self.fallback_one(index, quota, key, cost).await {
            Some(d) => d,
            None => self.by_policy(quota),
        };
        self.count(&d, quota);
        d
    }

    /// Several quotas, all or nothing, in one store call.
    async fn decide_many(&self, key: &[u8], costs: &[u64]) -> Verdict {
        let inner = &*self.inner;
        let now = inner.clock.now();
        #[cfg(feature = "deny-cache")]
        if let Some(v) = self.cached_verdict(key, costs, now) {
            return v;
        }
        let charges: Vec<Charge<'_>> = inner
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
        let deadline = std::time::Instant::now() + inner.timeout;
        let call: Call<'_, Vec<Decision>> =
            (*inner.store).decide_all_before(key, &charges, deadline);
        let verdict = match self.call(call, now).await {
            Ok(decisions) => {
                #[cfg(feature = "deny-cache")]
                for (i, d) in decisions.iter().enumerate() {
                    if !inner.shadow[i] {
                        self.remember_denial(i, key, costs[i], d, now);
                    }
                }
                self.combine(decisions)
            }
            Err(failure) => {
                let binding = &inner.quotas[0];
                self.fail(binding, &failure);
                match self.fallback_many(key, costs).await {
                    Some(v) => v,
                    None => {
                        let decisions = inner.quotas.iter().map(|q| self.by_policy(q)).collect();
                        self.combine(decisions)
                    }
                }
            }
        };
        self.count(&verdict.decision, &inner.quotas[verdict.binding]);
        verdict
    }

    /// Combines per-quota decisions: admitted iff every enforced quota
    /// admits; the binding quota is the denying one with the longest wait,
    /// or the admitting one with the least remaining relative to its limit.
    fn combine(&self, mut decisions: Vec<Decision>) -> Verdict {
        let inner = &*self.inner;
        // A store using the non-atomic default stops at the first denial:
        // the quotas it did not reach are unknown.
        for q in inner.quotas.iter().skip(decisions.len()) {
            decisions.push(Decision::from_policy(true, q.limit()));
        }
        let enforced = |i: &usize| !inner.shadow[*i];
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
        let mut decision = decisions[binding].clone();
        decision.allowed = admitted;
        if admitted {
            decision.retry_after = None;
            let shadowed: Vec<usize> = all
                .iter()
                .copied()
                .filter(|&i| inner.shadow[i] && !decisions[i].allowed)
                .collect();
            for &i in &shadowed {
                self.shadow_denied(&inner.quotas[i]);
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

    async fn fallback_one(
        &self,
        index: usize,
        quota: &Quota,
        key: &[u8],
        cost: u64,
    ) -> Option<Decision> {
        let fb = self.inner.fallback.as_ref()?;
        let divided = match fb.quotas.get(index) {
            Some(q) => q.clone(),
            None => quota.divided(fb.instances).ok()?,
        };
        let cost = cost.min(divided.limit());
        let mut d = fb.store.decide(key, &divided, cost).await.ok()?;
        d.source = Source::Fallback;
        Some(d)
    }

    async fn fallback_many(&self, key: &[u8], costs: &[u64]) -> Option<Verdict> {
        let inner = &*self.inner;
        let fb = inner.fallback.as_ref()?;
        let charges: Vec<Charge<'_>> = fb
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
        let mut decisions = fb.store.decide_all(key, &charges).await.ok()?;
        for d in &mut decisions {
            d.source = Source::Fallback;
        }
        Some(self.combine(decisions))
    }

    fn by_policy(&self, quota: &Quota) -> Decision {
        Decision::from_policy(self.inner.policy == FailurePolicy::FailOpen, quota.limit())
    }

    /// Logs a store failure: at most one warning per second per limiter (an
    /// outage at API traffic rates must not flood the logs; the counters see
    /// every one).
    fn fail(&self, quota: &Quota, failure: &Failure) {
        let inner = &*self.inner;
        let (error, transient) = failure.describe(inner.timeout);
        let now = inner.clock.now();
        let last = inner.last_warning.load(Ordering::Relaxed);
        let open = inner.policy == FailurePolicy::FailOpen;
        if !matches!(failure, Failure::Open)
            && now.saturating_sub(last) >= 1_000_000
            && inner
                .last_warning
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let stats = self.stats();
            tracing::warn!(
                namespace = %inner.namespace,
                policy = quota.name(),
                error = %error,
                transient,
                fail_open = open,
                fallback = inner.fallback.is_some(),
                errors = stats.errors,
                timeouts = stats.timeouts,
                "rate-limit store failed; deciding by fallback or failure policy (logged at most once a second)"
            );
        } else {
            tracing::debug!(namespace = %inner.namespace, policy = quota.name(), error = %error, "rate-limit store failed");
        }
    }

    /// A shadow quota would have denied: counted, and logged at most once a
    /// second per limiter.
    fn shadow_denied(&self, quota: &Quota) {
        let inner = &*self.inner;
        bump(&inner.counters.local().shadow_denials);
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
    fn count(&self, d: &Decision, quota: &Quota) {
        self.count_in(d, quota, &tracing::Span::current());
    }

    /// Counts the decision in the stats, metrics and `span`.
    #[inline]
    fn count_in(&self, d: &Decision, quota: &Quota, span: &tracing::Span) {
        let c = self.inner.counters.local();
        bump(match d.source {
            Source::Store | Source::Shadow if d.allowed => &c.allowed,
            Source::Store | Source::Shadow => &c.denied,
            Source::FailOpen => &c.fail_open,
            Source::FailClosed => &c.fail_closed,
            Source::Fallback => &c.fallback,
            Source::Cache => &c.cache_hits,
        });
        telemetry::decision(&self.inner.labels, quota, d, span);
    }

    #[cfg(feature = "deny-cache")]
    fn cached_denial(
        &self,
        index: usize,
        quota: &Quota,
        key: &[u8],
        cost: u64,
        now: Micros,
    ) -> Option<Decision> {
        let inner = &*self.inner;
        let cache = inner.deny_cache.as_ref()?;
        let fp = *inner.fingerprints.get(index)?;
        let until = cache.denied_until(key, fp, cost, now)?;
        telemetry::cache_hit(&inner.labels, quota);
        Some(Decision {
            allowed: false,
            limit: quota.limit(),
            remaining: 0,
            reset_after: Duration::ZERO,
            retry_after: Some(Duration::from_micros(until - now)),
            source: Source::Cache,
        })
    }

    #[cfg(feature = "deny-cache")]
    fn cached_verdict(&self, key: &[u8], costs: &[u64], now: Micros) -> Option<Verdict> {
        let inner = &*self.inner;
        inner.deny_cache.as_ref()?;
        let (binding, d) = inner
            .quotas
            .iter()
            .enumerate()
            .filter(|(i, _)| !inner.shadow[*i])
            .filter_map(|(i, q)| Some((i, self.cached_denial(i, q, key, costs[i], now)?)))
            .max_by_key(|(_, d)| d.retry_after)?;
        let quotas = inner
            .quotas
            .iter()
            .enumerate()
            .map(|(i, q)| {
                if i == binding {
                    d.clone()
                } else {
                    Decision {
                        source: Source::Cache,
                        ..Decision::from_policy(true, q.limit())
                    }
                }
            })
            .collect();
        self.count(&d, &inner.quotas[binding]);
        Some(Verdict {
            decision: d,
            binding,
            quotas,
        })
    }

    #[cfg(feature = "deny-cache")]
    fn remember_denial(&self, index: usize, key: &[u8], cost: u64, d: &Decision, sent: Micros) {
        let inner = &*self.inner;
        let (Some(cache), Some(&fp)) = (inner.deny_cache.as_ref(), inner.fingerprints.get(index))
        else {
            return;
        };
        if let (false, Source::Store, Some(retry)) = (d.allowed, d.source, d.retry_after) {
            cache.remember(key, fp, cost, sent, retry);
        }
    }

    /// The response headers for `decision`, under the limiter's first quota
    /// (none when that quota is in shadow mode). With several quotas, use
    /// [`Limiter::headers_all`].
    pub fn headers(&self, decision: &Decision) -> RateLimitHeaders {
        if self.inner.shadow[0] {
            return RateLimitHeaders::empty();
        }
        self.headers_for(decision, &self.inner.quotas[0])
    }

    /// The response headers for `decision`, made under `quota`.
    pub fn headers_for(&self, decision: &Decision, quota: &Quota) -> RateLimitHeaders {
        RateLimitHeaders::new(decision, quota, self.inner.clock.now())
    }

    /// The response headers for a verdict over all quotas: `RateLimit-Policy`
    /// and `RateLimit` list every enforced quota; `Retry-After` and
    /// `X-RateLimit-*` follow the binding quota. Shadow quotas never appear.
    pub fn headers_all(&self, verdict: &Verdict) -> RateLimitHeaders {
        let inner = &*self.inner;
        let listed: Vec<(&Decision, &Quota)> = verdict
            .quotas
            .iter()
            .zip(&inner.quotas)
            .zip(&inner.shadow)
            .filter(|(_, shadow)| !**shadow)
            .map(|(pair, _)| pair)
            .collect();
        if inner.shadow.get(verdict.binding).copied().unwrap_or(true) {
            return RateLimitHeaders::empty();
        }
        RateLimitHeaders::for_all(
            &verdict.decision,
            &inner.quotas[verdict.binding],
            &listed,
            inner.clock.now(),
        )
    }

    /// The current time by the limiter's clock.
    pub fn now(&self) -> Micros {
        self.inner.clock.now()
    }

    /// The limiter's quotas, in order.
    pub fn quotas(&self) -> &[Quota] {
        &self.inner.quotas
    }

    /// Whether quota `index` is in shadow (dry-run) mode.
    pub fn is_shadow(&self, index: usize) -> bool {
        self.inner.shadow.get(index).copied().unwrap_or(false)
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.inner.policy
    }

    /// The store timeout.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The circuit breaker's state now (`None` when the limiter has none).
    pub fn breaker_state(&self) -> Option<BreakerState> {
        let now = self.inner.clock.now();
        self.inner.breaker.as_ref().map(|b| b.state(now))
    }

    /// How decisions have been reached so far.
    pub fn stats(&self) -> LimiterStats {
        let c = &self.inner.counters;
        LimiterStats {
            allowed: c.sum(|s| &s.allowed),
            denied: c.sum(|s| &s.denied),
            fail_open: c.sum(|s| &s.fail_open),
            fail_closed: c.sum(|s| &s.fail_closed),
            fallback: c.sum(|s| &s.fallback),
            cache_hits: c.sum(|s| &s.cache_hits),
            shadow_denials: c.sum(|s| &s.shadow_denials),
            errors: c.sum(|s| &s.errors),
            timeouts: c.sum(|s| &s.timeouts),
            short_circuits: c.sum(|s| &s.short_circuits),
        }
    }
}
