//! The limiter an application holds: store + quotas + namespace + failure
//! policy + timeout.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::clock::{Clock, Micros, SystemClock};
use crate::decision::Decision;
use crate::error::{ConfigError, CostError, StoreError};
use crate::headers::RateLimitHeaders;
use crate::quota::Quota;
use crate::store::Store;

/// The byte between a limiter's namespace and the caller in store keys: `~`.
///
/// Namespaces are restricted to `A-Z a-z 0-9 _ - .`, so the first `~` always
/// ends the namespace; `~` is also left unescaped by the Redis key layout.
pub const NAMESPACE_SEPARATOR: u8 = b'~';

/// Store keys up to this many bytes are built on the stack.
const INLINE_KEY: usize = 128;

/// The default time a limiter waits for its store: 20 ms.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(20);

/// What a limiter answers when its store fails or times out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailurePolicy {
    /// Admit the call uncounted: availability over enforcement. For general
    /// API quota, where an outage of the limiter must not become an outage
    /// of the API.
    FailOpen,
    /// Deny the call: enforcement over availability. For logins, password
    /// resets and anything an attacker would love the limiter to forget.
    FailClosed,
}

/// A boxed future returned by a [`Timer`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Something that can sleep: the limiter's timeouts use it, so the core
/// needs no runtime. With the `tokio` feature, [`TokioTimer`] is the default.
pub trait Timer: Send + Sync + fmt::Debug {
    /// A future that completes after `duration`.
    fn sleep(&self, duration: Duration) -> Sleep;
}

/// The tokio timer (feature `tokio`). Needs a tokio runtime with time enabled.
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioTimer;

#[cfg(feature = "tokio")]
impl Timer for TokioTimer {
    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// Counters of how a limiter's decisions were reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LimiterStats {
    /// Decisions made by the store that admitted the call.
    pub allowed: u64,
    /// Decisions made by the store that denied the call.
    pub denied: u64,
    /// Calls admitted by the fail-open policy.
    pub fail_open: u64,
    /// Calls denied by the fail-closed policy.
    pub fail_closed: u64,
    /// Store errors (including panics), not counting timeouts.
    pub errors: u64,
    /// Store calls that timed out.
    pub timeouts: u64,
}

#[derive(Debug, Default)]
struct Counters {
    allowed: AtomicU64,
    denied: AtomicU64,
    fail_open: AtomicU64,
    fail_closed: AtomicU64,
    errors: AtomicU64,
    timeouts: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// What an application holds: checks callers against one or more quotas.
///
/// A store error, panic or timeout never reaches the caller: it becomes a
/// [`Decision`] according to the [`FailurePolicy`], is counted in
/// [`Limiter::stats`] and is logged through `tracing`.
///
/// ```
/// # #[cfg(feature = "tokio")]
/// # async fn example(store: impl ratelimit_core::Store + 'static) -> Result<(), Box<dyn std::error::Error>> {
/// use ratelimit_core::{FailurePolicy, Limiter, Quota, Rate};
/// use std::time::Duration;
///
/// let limiter = Limiter::builder(store)
///     .quota(Quota::token_bucket(Rate::per_minute(100), 20)?)
///     .namespace("api")?
///     .failure_policy(FailurePolicy::FailOpen)
///     .timeout(Duration::from_millis(20))
///     .build()?;
/// let decision = limiter.check("customer-42").await;
/// if !decision.allowed {
///     // answer 429 with limiter.headers(&decision)
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    quotas: Vec<Quota>,
    namespace: String,
    policy: FailurePolicy,
    timeout: Duration,
    timer: Arc<dyn Timer>,
    clock: Arc<dyn Clock>,
    counters: Counters,
    last_warning: AtomicU64,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.inner.store)
            .field("quotas", &self.inner.quotas)
            .field("namespace", &self.inner.namespace)
            .field("policy", &self.inner.policy)
            .field("timeout", &self.inner.timeout)
            .finish()
    }
}

/// Builds a [`Limiter`]. See [`Limiter::builder`].
#[derive(Debug)]
pub struct LimiterBuilder {
    store: Arc<dyn Store>,
    quotas: Vec<Quota>,
    namespace: String,
    policy: FailurePolicy,
    timeout: Duration,
    timer: Option<Arc<dyn Timer>>,
    clock: Option<Arc<dyn Clock>>,
}

impl LimiterBuilder {
    /// Adds a quota. With several, a call must pass all of them (see
    /// [`Limiter::check_n`]).
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quotas.push(quota);
        self
    }

    /// The key namespace (default `"rl"`): 1 to 64 characters of
    /// `A-Z a-z 0-9 _ - .`. Two limiters with different namespaces never share
    /// state, even on one store.
    pub fn namespace(mut self, namespace: &str) -> Result<Self, ConfigError> {
        let ok = !namespace.is_empty()
            && namespace.len() <= 64
            && namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !ok {
            return Err(ConfigError::InvalidNamespace {
                namespace: namespace.to_owned(),
            });
        }
        self.namespace = namespace.to_owned();
        Ok(self)
    }

    /// What to answer when the store fails (default: fail open).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// How long to wait for the store (default [`DEFAULT_TIMEOUT`], 20 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The timer for timeouts (default [`TokioTimer`] with the `tokio` feature).
    pub fn timer(mut self, timer: impl Timer + 'static) -> Self {
        self.timer = Some(Arc::new(timer));
        self
    }

    /// The clock used for `X-RateLimit-Reset`. Default: the store's clock
    /// when it exposes one ([`Store::clock`]: the local store, or a store
    /// built on an injected clock), else [`SystemClock`].
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Builds the limiter.
    pub fn build(self) -> Result<Limiter, ConfigError> {
        if self.quotas.is_empty() {
            return Err(ConfigError::NoQuota);
        }
        #[cfg(feature = "tokio")]
        let timer = self.timer.unwrap_or_else(|| Arc::new(TokioTimer));
        #[cfg(not(feature = "tokio"))]
        let timer = self.timer.ok_or(ConfigError::NoTimer)?;
        let clock = self
            .clock
            .or_else(|| self.store.clock())
            .unwrap_or_else(|| Arc::new(SystemClock));
        Ok(Limiter {
            inner: Arc::new(Inner {
                store: self.store,
                quotas: self.quotas,
                namespace: self.namespace,
                policy: self.policy,
                timeout: self.timeout,
                timer,
                clock,
                counters: Counters::default(),
                last_warning: AtomicU64::new(0),
            }),
        })
    }
}

impl Limiter {
    /// Starts building a limiter over `store`.
    pub fn builder(store: impl Store + 'static) -> LimiterBuilder {
        Self::builder_arc(Arc::new(store))
    }

    /// Starts building a limiter over a shared store.
    pub fn builder_arc(store: Arc<dyn Store>) -> LimiterBuilder {
        LimiterBuilder {
            store,
            quotas: Vec::new(),
            namespace: "rl".to_owned(),
            policy: FailurePolicy::FailOpen,
            timeout: DEFAULT_TIMEOUT,
            timer: None,
            clock: None,
        }
    }

    /// Checks one call of cost 1 for `caller` against every quota.
    ///
    /// A cost of 1 is valid for every quota, so this cannot fail.
    pub async fn check(&self, caller: impl AsRef<[u8]>) -> Decision {
        match self.check_n(caller, 1).await {
            Ok(d) => d,
            // Unreachable: every validated quota has a limit of at least 1.
            Err(_) => Decision::from_policy(self.inner.policy == FailurePolicy::FailOpen, 0),
        }
    }

    /// Checks one call of cost `cost` for `caller`.
    ///
    /// With several quotas they are checked in order and the first denial is
    /// returned; quotas checked before it have already counted the call (as
    /// in every multi-window limiter without a two-phase protocol). When all
    /// admit, the decision with the least `remaining` is returned.
    ///
    /// Errors only for a cost that can never be admitted by some quota.
    pub async fn check_n(
        &self,
        caller: impl AsRef<[u8]>,
        cost: u64,
    ) -> Result<Decision, CostError> {
        let caller = caller.as_ref();
        for q in &self.inner.quotas {
            q.check_cost(cost)?;
        }
        let mut best: Option<Decision> = None;
        for q in &self.inner.quotas {
            let d = self.decide(q, caller, cost).await;
            if !d.allowed {
                return Ok(d);
            }
            if best.as_ref().is_none_or(|b| d.remaining < b.remaining) {
                best = Some(d);
            }
        }
        // `build` guarantees at least one quota.
        Ok(best.unwrap_or_else(|| Decision::from_policy(true, 0)))
    }

    /// Checks `caller` against `quota` only (which need not be one of the
    /// limiter's own quotas): for per-route or per-plan policies.
    pub async fn check_quota(
        &self,
        quota: &Quota,
        caller: impl AsRef<[u8]>,
        cost: u64,
    ) -> Result<Decision, CostError> {
        quota.check_cost(cost)?;
        Ok(self.decide(quota, caller.as_ref(), cost).await)
    }

    async fn decide(&self, quota: &Quota, caller: &[u8], cost: u64) -> Decision {
        let inner = &*self.inner;
        // `namespace ~ caller`, on the stack for the common short key.
        let len = inner.namespace.len() + 1 + caller.len();
        let mut inline = [0u8; INLINE_KEY];
        let heap;
        let key: &[u8] = if len <= INLINE_KEY {
            let ns = inner.namespace.len();
            inline[..ns].copy_from_slice(inner.namespace.as_bytes());
            inline[ns] = NAMESPACE_SEPARATOR;
            inline[ns + 1..len].copy_from_slice(caller);
            &inline[..len]
        } else {
            heap = [inner.namespace.as_bytes(), &[NAMESPACE_SEPARATOR], caller].concat();
            &heap
        };
        // An in-process store answers synchronously: no future, no box.
        let outcome = match std::panic::catch_unwind(AssertUnwindSafe(|| {
            inner.store.decide_sync(key, quota, cost)
        })) {
            Ok(Some(result)) => Guard::Done(result),
            Err(_) => Guard::Panicked,
            Ok(None) => {
                // Through the trait object directly: the blanket `impl
                // Store for Arc<S>` would box a second future.
                let call = (*inner.store).decide(key, quota, cost);
                Guarded {
                    call,
                    sleep: None,
                    timer: &*inner.timer,
                    timeout: inner.timeout,
                }
                .await
            }
        };
        let error = match outcome {
            Guard::Done(Ok(d)) => {
                bump(if d.allowed {
                    &inner.counters.allowed
                } else {
                    &inner.counters.denied
                });
                return d;
            }
            Guard::Done(Err(e)) => {
                bump(&inner.counters.errors);
                e
            }
            Guard::Panicked => {
                bump(&inner.counters.errors);
                StoreError::message("the store panicked", false)
            }
            Guard::TimedOut => {
                bump(&inner.counters.timeouts);
                StoreError::Timeout(inner.timeout)
            }
        };
        let open = inner.policy == FailurePolicy::FailOpen;
        bump(if open {
            &inner.counters.fail_open
        } else {
            &inner.counters.fail_closed
        });
        // At most one warning per second per limiter: an outage at API
        // traffic rates must not flood the logs. The counters see every one.
        let now = inner.clock.now();
        let last = inner.last_warning.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 1_000_000
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
                transient = error.is_transient(),
                fail_open = open,
                errors = stats.errors,
                timeouts = stats.timeouts,
                "rate-limit store failed; deciding by failure policy (logged at most once a second)"
            );
        } else {
            tracing::debug!(namespace = %inner.namespace, policy = quota.name(), error = %error, "rate-limit store failed");
        }
        Decision::from_policy(open, quota.limit())
    }

    /// The response headers for `decision`, under the limiter's first quota.
    pub fn headers(&self, decision: &Decision) -> RateLimitHeaders {
        self.headers_for(decision, &self.inner.quotas[0])
    }

    /// The response headers for `decision`, made under `quota`.
    pub fn headers_for(&self, decision: &Decision, quota: &Quota) -> RateLimitHeaders {
        RateLimitHeaders::new(decision, quota, self.inner.clock.now())
    }

    /// The current time by the limiter's clock.
    pub fn now(&self) -> Micros {
        self.inner.clock.now()
    }

    /// The limiter's quotas, in order.
    pub fn quotas(&self) -> &[Quota] {
        &self.inner.quotas
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.inner.policy
    }

    /// The store timeout.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// How decisions have been reached so far.
    pub fn stats(&self) -> LimiterStats {
        let c = &self.inner.counters;
        LimiterStats {
            allowed: c.allowed.load(Ordering::Relaxed),
            denied: c.denied.load(Ordering::Relaxed),
            fail_open: c.fail_open.load(Ordering::Relaxed),
            fail_closed: c.fail_closed.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            timeouts: c.timeouts.load(Ordering::Relaxed),
        }
    }
}

enum Guard<T> {
    Done(T),
    Panicked,
    TimedOut,
}

/// Polls the store call, catching panics, racing it against the timer. The
/// timer is armed only once the call has returned `Pending`, so a store that
/// answers at once (the in-process one) never pays for a sleep.
struct Guarded<'a, T> {
    call: Pin<Box<dyn Future<Output = T> + Send + 'a>>,
    sleep: Option<Sleep>,
    timer: &'a dyn Timer,
    timeout: Duration,
}

impl<T> Future for Guarded<'_, T> {
    type Output = Guard<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match std::panic::catch_unwind(AssertUnwindSafe(|| this.call.as_mut().poll(cx))) {
            Ok(Poll::Ready(v)) => return Poll::Ready(Guard::Done(v)),
            Ok(Poll::Pending) => {}
            Err(_) => return Poll::Ready(Guard::Panicked),
        }
        let (timer, timeout) = (this.timer, this.timeout);
        let sleep = this.sleep.get_or_insert_with(|| timer.sleep(timeout));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Guard::TimedOut),
            Poll::Pending => Poll::Pending,
        }
    }
}
