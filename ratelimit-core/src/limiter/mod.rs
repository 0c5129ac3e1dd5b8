//! The limiter an application holds: a store, quotas, a namespace, a
//! failure policy, a timeout, and the production controls around the store
//! call (circuit breaker, fallback store, deny cache, shadow quotas,
//! metrics and traces).

mod acquire;
mod builder;
#[cfg(feature = "deny-cache")]
mod cached;
mod charges;
mod check;
mod degraded;
#[cfg(feature = "deny-cache")]
mod deny_cache;
mod fallback_store;
mod lease;
mod path;
mod stats;
mod telemetry;
mod timer;
mod verdict;
mod warnings;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

pub use acquire::AcquireError;
pub use builder::LimiterBuilder;
pub use check::Check;
#[cfg(feature = "deny-cache")]
pub use deny_cache::DenyCache;
pub use fallback_store::{DEFAULT_FALLBACK_CALLERS, FallbackStore};
pub use lease::DEFAULT_LEASE_CALLERS;
pub use stats::LimiterStats;
#[cfg(feature = "tokio")]
pub use timer::TokioTimer;
pub use timer::{Sleep, Timer};

use crate::clock::{Clock, Micros};
use crate::decision::{Decision, Verdict};
use crate::error::CostError;
use crate::headers::RateLimitHeaders;
use crate::quota::Quota;
use crate::store::Store;

use tracing::Instrument;

use crate::health::{BreakerState, Health};
use check::KeyBuf;
pub(crate) use check::Prefix;
use stats::Counters;

/// The byte between a limiter's namespace and the caller in store keys: `~`.
///
/// Namespaces are restricted to `A-Z a-z 0-9 _ - .`, so the first `~` always
/// ends the namespace; `~` is also left unescaped by the Redis key layout.
pub const NAMESPACE_SEPARATOR: u8 = b'~';

/// The default time a limiter waits for its store: 20 ms.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(20);

/// What a limiter answers when its store (and its fallback store, if any)
/// fails, times out, or is skipped by an open circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailurePolicy {
    /// Admit the call: availability over enforcement. For general API
    /// quota, where an outage of the limiter must not become an outage of
    /// the API. A call answered by policy is not counted by the store: the
    /// limiter passes the end of its timeout to the store as the request's
    /// [`crate::store::Deadline`], and the shipped Redis stores make a
    /// request still queued on a paused connection count nothing when it
    /// runs after it (calls already running at that instant may still
    /// count: their reply, not their run, was late).
    FailOpen,
    /// Deny the call: enforcement over availability. For logins, password
    /// resets and anything an attacker would love the limiter to forget.
    FailClosed,
}

/// What an application holds: checks callers against one or more quotas.
///
/// Every check is one request to the store ([`Store::decide`]): with
/// several quotas, one request with a charge per quota, decided **all or
/// nothing**: admitted only if every quota admits it, and a denied call is
/// counted in no quota. A store error, panic or timeout never reaches the
/// caller: it becomes a degraded [`Decision`] (see below), is counted in
/// [`Limiter::stats`], recorded in metrics (feature `metrics`) and logged
/// through `tracing` (at most one warning a second in the process, with
/// the count of those not logged). After repeated failures the circuit
/// breaker stops calling the store for a cool-down. Build it once and keep
/// it (it is cheap to clone): its leases, breaker and counters live as
/// long as it does.
///
/// # Degraded answers
///
/// The caller's timeout ([`LimiterBuilder::timeout`]) is the only patience:
/// it travels with the request as its deadline, the shipped stores wait for
/// a reply until then and no longer, and a request carried out after it
/// counts nothing. When the store cannot answer in time, the call is
/// decided, in this order:
///
/// 1. **From the caller's lease** ([`Source::Lease`](crate::Source::Lease)),
///    when the store answered this caller under this quota before the
///    caller's state resets (its window ends, its bucket is full): the
///    store's `remaining` then, divided by the instances sharing the quota
///    ([`LimiterBuilder::instances`]), is all the lease admits until the
///    store answers again, and what it admitted stays spent until that
///    reset; an exhausted caller is denied until its reset.
/// 2. Else, when the store is **unavailable** (a breaker open, a node that
///    refuses connections): by the fallback store, in process, at each
///    limit ÷ the instances ([`Source::Fallback`](crate::Source::Fallback)).
/// 3. Else (the store is **busy**: a timeout, a request shed by its
///    admission, [`StoreError::is_busy`](crate::StoreError::is_busy)), or
///    without a fallback store: by the [`FailurePolicy`] (fail-closed unless
///    chosen otherwise).
///
/// **The bound.** For one caller and quota of limit `L`, within one window
/// (one lease's life), the leases of `N` instances admit, beyond what the
/// store admitted, at most what the store admitted after the first lease
/// in use was granted, and never more than `N × ⌊(L - 1) / N⌋` (derived in
/// the lease module: every share is at most the store's remaining when its
/// first answer of the window came, divided by `N`, and what a lease spends
/// stays spent). One instance (or sticky routing), or instances whose
/// store fails for all of them at once, admit nothing beyond `L` from
/// leases; what can pass the limit comes from one instance failing while
/// another keeps spending through the store. The fallback adds its own
/// `L ÷ N` per instance, and only while the store is unavailable; the
/// failure policy admits nothing unless it is fail-open. Degraded answers
/// never count budget the store did not state: a token bucket's refill and
/// a sliding window's decay while degraded are not counted, so a degraded
/// instance may deny what the store would admit, never the reverse.
/// `ratelimit-testkit`'s lease check holds every store to these rules and
/// this bound.
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
    /// Per quota: a fingerprint of its name and numbers (deny cache and
    /// lease keys).
    fingerprints: Vec<u64>,
    namespace: String,
    /// `namespace ~`, the head of every store key.
    prefix: check::Prefix,
    policy: FailurePolicy,
    timeout: Duration,
    /// The store bounds its calls by the request's deadline
    /// ([`crate::store::Capabilities::bounded`]): no timer of the limiter's.
    bounded: bool,
    timer: Arc<dyn Timer>,
    clock: Arc<dyn Clock>,
    counters: Counters,
    /// Whether the store answers in place ([`crate::store::Capabilities::in_process`]),
    /// until it once answers pending: checks then decide without a future.
    in_process: AtomicBool,
    /// `in_process`, and no shadow quota, deny cache or breaker: a check
    /// needs nothing but the store's decision and the counters.
    plain: AtomicBool,
    last_shadow_log: AtomicU64,
    breaker: Option<Health>,
    fallback: Option<Fallback>,
    /// The store's last answer per caller and quota, for when it cannot
    /// answer (none for an in-process store).
    leases: Option<lease::Leases>,
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
    /// With one quota and an in-process store the decision is made here,
    /// synchronously, and the returned [`Check`] only hands it over: no
    /// future is boxed and nothing is allocated for a store key
    /// (namespace, `~` and caller) of up to 96 bytes. A cost of 1 is valid
    /// for every quota, so this cannot fail.
    #[inline]
    pub fn check(&self, caller: impl AsRef<[u8]>) -> Check<'_> {
        self.check_caller(caller.as_ref()).handed()
    }

    /// [`Limiter::check`], not generic: one function the callers share,
    /// with the index and cost of a single quota known.
    #[inline(never)]
    fn check_caller(&self, caller: &[u8]) -> Check<'_> {
        match &self.inner.quotas[..] {
            [q] => self.check_one(0, q, caller, 1),
            [] => self.no_quota(),
            _ => self.check_several(caller),
        }
    }

    /// A check on a limiter with no quotas of its own (built for quotas
    /// per call): nothing can admit the call; said once a second at most.
    #[cold]
    fn no_quota(&self) -> Check<'_> {
        if warnings::may_warn().is_some() {
            tracing::error!(
                namespace = %self.inner.namespace,
                "Limiter::check on a limiter with no quotas of its own (built with \
                 quotas_per_call): denied; pass the call's quotas to Limiter::check_charges"
            );
        }
        Check::ready(Decision::from_policy(false, 0))
    }

    /// [`Limiter::check`] with several quotas: one request, all or nothing.
    #[inline(never)]
    fn check_several(&self, caller: &[u8]) -> Check<'_> {
        let key = KeyBuf::owned(&self.inner.prefix, caller);
        Check::pending(async move {
            let costs = vec![1; self.inner.quotas.len()];
            let decided = self.decide_many(&key, &costs);
            match telemetry::span_if_enabled(&self.inner.namespace) {
                Some(span) => decided.instrument(span).await,
                None => decided.await,
            }
            .decision
        })
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
        match &self.inner.quotas[..] {
            [] => Err(CostError::NoQuota),
            [q] => {
                q.check_cost(cost)?;
                Ok(self.check_one(0, q, caller, cost).await)
            }
            _ => Ok(self.check_all(caller, cost).await?.decision),
        }
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
    /// against a byte quota. All or nothing, in one store request.
    ///
    /// Errors for a cost that can never be admitted, or when `costs` does
    /// not have one cost per quota.
    pub async fn check_costs(
        &self,
        caller: impl AsRef<[u8]>,
        costs: &[u64],
    ) -> Result<Verdict, CostError> {
        let inner = &*self.inner;
        if inner.quotas.is_empty() {
            return Err(CostError::NoQuota);
        }
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
            let d = self.check_one(0, &inner.quotas[0], caller, costs[0]).await;
            return Ok(Verdict {
                decision: d.clone(),
                binding: 0,
                quotas: vec![d],
            });
        }
        let key = KeyBuf::new(&inner.prefix, caller);
        let decided = self.decide_many(key.as_slice(), costs);
        Ok(match telemetry::span_if_enabled(&inner.namespace) {
            Some(span) => decided.instrument(span).await,
            None => decided.await,
        })
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
        Ok(self
            .check_one(usize::MAX, quota, caller.as_ref(), cost)
            .await)
    }

    /// The response headers for `decision`, under the limiter's first quota
    /// (none when that quota is in shadow mode). With several quotas, use
    /// [`Limiter::headers_all`].
    pub fn headers(&self, decision: &Decision) -> RateLimitHeaders {
        match (self.inner.quotas.first(), self.inner.shadow.first()) {
            (Some(quota), Some(false)) => self.headers_for(decision, quota),
            _ => RateLimitHeaders::empty(),
        }
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
        let (Some(binding), Some(false)) = (
            inner.quotas.get(verdict.binding),
            inner.shadow.get(verdict.binding),
        ) else {
            return RateLimitHeaders::empty();
        };
        RateLimitHeaders::for_all(&verdict.decision, binding, &listed, inner.clock.now())
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
        self.inner.counters.snapshot()
    }
}
