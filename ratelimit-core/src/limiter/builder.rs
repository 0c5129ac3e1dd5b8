//! [`LimiterBuilder`]: how a [`Limiter`] is configured.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::ConfigError;
use crate::quota::Quota;
use crate::store::Store;

#[cfg(feature = "deny-cache")]
use super::deny_cache::{self, DenyCache};
use super::{
    Counters, DEFAULT_TIMEOUT, FailurePolicy, Fallback, Inner, Limiter, Timer, acquire, telemetry,
};
use crate::health::{CircuitBreaker, Health};

/// Builds a [`Limiter`]. See [`Limiter::builder`].
#[derive(Debug)]
pub struct LimiterBuilder {
    store: Arc<dyn Store>,
    quotas: Vec<Quota>,
    shadow: Vec<bool>,
    namespace: String,
    policy: Option<FailurePolicy>,
    timeout: Duration,
    timer: Option<Arc<dyn Timer>>,
    clock: Option<Arc<dyn Clock>>,
    breaker: Option<CircuitBreaker>,
    fallback: Option<(Arc<dyn Store>, u32)>,
    instances: Option<u32>,
    fallback_callers: usize,
    /// `Some(capacity)`: up to that many leases (callers and quotas); `None`: none.
    leases: Option<usize>,
    /// Built for quotas that come with each call: no quota of its own.
    per_call: bool,
    #[cfg(feature = "deny-cache")]
    deny_cache: Option<DenyCache>,
}

impl LimiterBuilder {
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            quotas: Vec::new(),
            shadow: Vec::new(),
            namespace: "rl".to_owned(),
            policy: None,
            timeout: DEFAULT_TIMEOUT,
            timer: None,
            clock: None,
            breaker: Some(CircuitBreaker::DEFAULT),
            fallback: None,
            instances: None,
            fallback_callers: super::fallback_store::DEFAULT_FALLBACK_CALLERS,
            leases: Some(super::lease::DEFAULT_LEASE_CALLERS),
            per_call: false,
            #[cfg(feature = "deny-cache")]
            deny_cache: None,
        }
    }

    /// Adds an enforced quota. With several, a call must pass all of them,
    /// decided all or nothing (see [`Limiter::check_all`]).
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quotas.push(quota);
        self.shadow.push(false);
        self
    }

    /// Adds a quota in **shadow** (dry-run) mode: decided and counted as
    /// usual, but its denial never denies a call. The decision says so
    /// ([`crate::Source::Shadow`]), no 429 follows, the headers leave it
    /// out, and would-be denials are counted ([`crate::LimiterStats`],
    /// metrics) and logged at most once a second. How a team rolls out a
    /// new limit.
    pub fn shadow_quota(mut self, quota: Quota) -> Self {
        self.quotas.push(quota);
        self.shadow.push(true);
        self
    }

    /// The key namespace (default `"rl"`): 1 to 64 characters of
    /// `A-Z a-z 0-9 _ - .`. Two limiters with different namespaces never share
    /// state, even on one store.
    pub fn namespace(mut self, namespace: &str) -> Result<Self, ConfigError> {
        if !crate::quota::valid_name(namespace) {
            return Err(ConfigError::InvalidNamespace {
                namespace: namespace.to_owned(),
            });
        }
        self.namespace = namespace.to_owned();
        Ok(self)
    }

    /// What to answer when the store cannot decide (an error, a timeout,
    /// an open breaker) and neither the caller's lease nor the fallback
    /// store can (see [`Limiter`]'s docs, "Degraded answers"): a caller
    /// without a lease while the store is busy, or while it is unavailable
    /// with no fallback store. **Choosing it is a decision**:
    /// [`FailurePolicy::FailOpen`] admits uncounted calls. Without a
    /// fallback store ([`LimiterBuilder::instances`]) a limiter over a
    /// store that can be unavailable must be given one or the other:
    /// [`LimiterBuilder::build`] refuses to guess. With a fallback store,
    /// it defaults to deny.
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The number of application instances sharing the quotas, and the
    /// degraded mode by default: while the shared store is unavailable (a
    /// node that refuses connections, an open breaker), a caller without a
    /// lease is decided in process, on the limiter's own
    /// [`super::FallbackStore`], under each quota divided by `instances`
    /// (decisions say [`crate::Source::Fallback`] and their headers give
    /// the divided numbers); and every lease is the store's remaining
    /// divided by `instances`. See [`Limiter`]'s docs, "Degraded answers".
    /// Give the number once, where the limiter is built; zero is refused.
    pub fn instances(mut self, instances: u32) -> Self {
        self.instances = Some(instances);
        self
    }

    /// The most callers the built-in fallback store tracks (default
    /// 100,000); a new caller beyond it is answered by the failure policy
    /// (see [`super::FallbackStore`]).
    pub fn fallback_callers(mut self, max: usize) -> Self {
        self.fallback_callers = max;
        self
    }

    /// A limiter whose quotas come with each call
    /// ([`Limiter::check_charges`]), with none of its own: for a service
    /// whose quotas arrive with each request (the rate-limit service). Its
    /// `check`, `check_n`, `check_all` and `check_costs` have no quota to
    /// check (the last three answer [`crate::CostError::NoQuota`], `check`
    /// denies and logs an error); quotas added with
    /// [`LimiterBuilder::quota`] are refused by [`LimiterBuilder::build`].
    pub fn quotas_per_call(mut self) -> Self {
        self.per_call = true;
        self
    }

    /// At most `callers` leases, one per caller and quota (default
    /// [`super::DEFAULT_LEASE_CALLERS`], 100,000; on for every store that is
    /// not in process): while the store cannot answer, a caller it answered
    /// recently is decided from that answer ([`crate::Source::Lease`]):
    /// admitted at most its `remaining` (divided by
    /// [`LimiterBuilder::instances`]) times, and an exhausted caller denied
    /// until its reset. Beyond the limit, leases admit at most what the
    /// store itself admitted after the first lease in use was granted (the
    /// bound is stated in [`Limiter`]'s docs, "Degraded answers").
    /// Callers the store never answered (or whose lease has reset) are
    /// decided by the fallback store when the store is unavailable, by the
    /// failure policy when it is busy. Zero is refused by
    /// [`LimiterBuilder::build`]: turn leases off with
    /// [`LimiterBuilder::no_leases`].
    pub fn leases(mut self, callers: usize) -> Self {
        self.leases = Some(callers);
        self
    }

    /// No leases: while the store cannot answer, every call is decided by
    /// the fallback store or the failure policy as if the store had never
    /// answered its caller.
    pub fn no_leases(mut self) -> Self {
        self.leases = None;
        self
    }

    /// How long to wait for the store (default [`DEFAULT_TIMEOUT`], 20 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The circuit breaker for a store that judges no failure domains of
    /// its own (default [`CircuitBreaker::DEFAULT`]: open when at least 50 %
    /// of at least 20 calls in the last second failed; probe every 100 ms).
    /// While open, decisions cost no network time. A store that reports
    /// [`crate::store::Capabilities::failure_domains`] (the Redis stores:
    /// one breaker per node) or answers in process gets none from the
    /// limiter.
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// No circuit breaker: every call goes to the store.
    pub fn no_circuit_breaker(mut self) -> Self {
        self.breaker = None;
        self
    }

    /// [`LimiterBuilder::instances`] with a fallback store of your own (an
    /// in-process store, such as `ratelimit-local`'s `LocalStore` with a
    /// bound on its callers) instead of the built-in one.
    pub fn fallback(mut self, store: impl Store + 'static, instances: u32) -> Self {
        self.fallback = Some((Arc::new(store), instances));
        self
    }

    /// A local deny cache (feature `deny-cache`): calls the store certainly
    /// denies, because it denied the same caller a call no larger under the
    /// same quota with a `retry_after` that has not passed, are answered in
    /// process ([`crate::Source::Cache`]). It never denies a call the store
    /// would admit; see [`DenyCache`] for the argument.
    #[cfg(feature = "deny-cache")]
    pub fn deny_cache(mut self, cache: DenyCache) -> Self {
        self.deny_cache = Some(cache);
        self
    }

    /// The timer for timeouts and waits (default [`super::TokioTimer`] with
    /// the `tokio` feature).
    pub fn timer(mut self, timer: impl Timer + 'static) -> Self {
        self.timer = Some(Arc::new(timer));
        self
    }

    /// The clock used for `X-RateLimit-Reset`, the breaker, the deny cache
    /// and [`Limiter::acquire`]. Default: the store's clock when it exposes
    /// one ([`crate::store::Capabilities::clock`]: the local store, or a
    /// store built on an injected clock), else [`SystemClock`].
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Builds the limiter.
    pub fn build(self) -> Result<Limiter, ConfigError> {
        match (self.quotas.is_empty(), self.per_call) {
            (true, false) => return Err(ConfigError::NoQuota),
            (false, true) => {
                return Err(ConfigError::InvalidSetting {
                    setting: "LimiterBuilder::quotas_per_call",
                    detail: "a limiter whose quotas come with each call has none of its own: \
                             drop its LimiterBuilder::quota calls, or quotas_per_call"
                        .to_owned(),
                });
            }
            _ => {}
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::InvalidSetting {
                setting: "LimiterBuilder::timeout",
                detail: "a timeout of zero leaves the store no time to answer any call; give it \
                         the time a call may take (the default is 20 ms)"
                    .to_owned(),
            });
        }
        if self.leases == Some(0) {
            return Err(ConfigError::InvalidSetting {
                setting: "LimiterBuilder::leases",
                detail: "leases for zero callers keep none; give a number of callers (the \
                         default is 100,000), or turn leases off with \
                         LimiterBuilder::no_leases"
                    .to_owned(),
            });
        }
        if self.fallback_callers == 0 {
            return Err(ConfigError::InvalidSetting {
                setting: "LimiterBuilder::fallback_callers",
                detail: "a fallback store for zero callers decides none of them; give a number \
                         of callers (the default is 100,000)"
                    .to_owned(),
            });
        }
        if self.instances == Some(0) || matches!(self.fallback, Some((_, 0))) {
            return Err(ConfigError::InvalidSetting {
                setting: "LimiterBuilder::instances",
                detail: "zero instances share nothing; give the number of application \
                         instances sharing the quota (at least 1)"
                    .to_owned(),
            });
        }
        for (i, a) in self.quotas.iter().enumerate() {
            if self.quotas[..i]
                .iter()
                .any(|b| b.name() == a.name() && b.kind() == a.kind())
            {
                return Err(ConfigError::DuplicatePolicy {
                    name: a.name().to_owned(),
                });
            }
        }
        #[cfg(feature = "tokio")]
        let timer = self
            .timer
            .unwrap_or_else(|| Arc::new(super::timer::TokioTimer));
        #[cfg(not(feature = "tokio"))]
        let timer = self.timer.ok_or(ConfigError::NoTimer)?;
        let capabilities = self.store.capabilities();
        let clock = self
            .clock
            .or_else(|| capabilities.clock.clone())
            .unwrap_or_else(|| Arc::new(SystemClock));
        if !capabilities.in_process
            && self.fallback.is_none()
            && self.instances.is_none()
            && self.policy.is_none()
        {
            return Err(ConfigError::NoDegradedMode);
        }
        let sharing = match (&self.fallback, self.instances) {
            (Some((_, n)), _) => *n,
            (None, Some(n)) => n,
            (None, None) => 1,
        };
        let leases = self
            .leases
            .filter(|_| !capabilities.in_process)
            .map(|callers| super::lease::Leases::new(callers, sharing));
        let fallback_store = match (self.fallback, self.instances) {
            (Some((store, n)), _) => Some((store, n)),
            (None, Some(n)) => Some((
                Arc::new(super::FallbackStore::new(
                    clock.clone(),
                    self.fallback_callers,
                )) as Arc<dyn Store>,
                n,
            )),
            (None, None) => None,
        };
        let fallback = match fallback_store {
            Some((store, instances)) => Some(Fallback {
                quotas: self
                    .quotas
                    .iter()
                    .map(|q| q.divided(instances))
                    .collect::<Result<_, _>>()?,
                store,
                instances,
            }),
            None => None,
        };
        if self.quotas.len() > 1 && !capabilities.atomic {
            tracing::warn!(
                store = ?self.store,
                "this store does not decide several quotas atomically: a quota checked before \
                 a denying one counts the denied call"
            );
        }
        let fingerprints = self.quotas.iter().map(fingerprint).collect();
        let seed = clock.now() ^ (Arc::as_ptr(&self.store) as *const () as usize as u64);
        #[cfg(feature = "deny-cache")]
        let cache = self.deny_cache.is_some();
        #[cfg(not(feature = "deny-cache"))]
        let cache = false;
        // In-process stores get no breaker (below).
        let plain = capabilities.in_process && !cache && !self.shadow.iter().any(|&s| s);
        Ok(Limiter {
            inner: Arc::new(Inner {
                labels: telemetry::Labels::new(&self.namespace, self.per_call),
                store: self.store,
                quotas: self.quotas,
                shadow: self.shadow,
                fingerprints,
                prefix: super::Prefix::new(&self.namespace),
                namespace: self.namespace,
                policy: self.policy.unwrap_or(FailurePolicy::FailClosed),
                timeout: self.timeout,
                bounded: capabilities.bounded,
                timer,
                clock,
                counters: Counters::default(),
                in_process: std::sync::atomic::AtomicBool::new(capabilities.in_process),
                plain: std::sync::atomic::AtomicBool::new(plain),
                last_shadow_log: AtomicU64::new(0),
                // An in-process store is never unavailable: its failures are
                // bugs or bad input, which a breaker would only hide. A store
                // with failure domains keeps a breaker per domain itself.
                breaker: if capabilities.in_process || capabilities.failure_domains {
                    None
                } else {
                    self.breaker.map(Health::new)
                },
                fallback,
                leases,
                #[cfg(feature = "deny-cache")]
                deny_cache: self.deny_cache.map(deny_cache::Cache::new),
                jitter: acquire::Jitter::new(seed),
            }),
        })
    }
}

/// A stable-within-the-process fingerprint of a quota's name and numbers.
pub(super) fn fingerprint(q: &Quota) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    q.hash(&mut h);
    h.finish()
}
