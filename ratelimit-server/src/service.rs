//! The decision: one `ShouldRateLimit` request, every descriptor decided
//! all or nothing in one store call.
//!
//! Each descriptor that matches a rate limit becomes one charge of one
//! store request. The store request's key is the domain; each charge's
//! quota is named after the descriptor's entries (a SHA-256 of them, so
//! that any value is a valid, fixed-length policy name), so one
//! descriptor's state is the same whichever other descriptors come with
//! it. The store admits the request only if every enforced descriptor
//! admits it, and a denied request is counted in no descriptor: contract
//! 11 of the design. (envoyproxy/ratelimit counts every descriptor of
//! every request, denied or not.)

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use ratelimit_core::headers::ceil_secs;
use ratelimit_core::store::Store;
use ratelimit_core::{
    AlgorithmKind, Clock, Decision, FailurePolicy, Limiter, Quota, RateLimitHeaders, Source,
    SystemClock, Verdict,
};
use sha2::{Digest, Sha256};
use smallvec::SmallVec;

use crate::config::{Config, Found, RateLimit, Unit};
use crate::metrics;

pub use crate::error::{InvalidRequest, ServiceError};

/// What the service does while its store cannot answer (an error, a
/// timeout, an unhealthy node): the library's degraded modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Degraded {
    /// The store answers in process and is never unavailable (the local
    /// store).
    None,
    /// An in-process fallback store at each limit divided by the number of
    /// service instances sharing the store; the failure policy decides
    /// what the fallback cannot (a caller beyond its bound).
    Instances(u32, FailurePolicy),
    /// Admit (`FailOpen`) or deny (`FailClosed`) every request the store
    /// cannot decide.
    Policy(FailurePolicy),
}

/// How the service decides.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The key namespace in the store (default `rls`).
    pub namespace: String,
    /// How long a decision waits for the store (default 20 ms).
    pub timeout: Duration,
    /// The degraded mode.
    pub degraded: Degraded,
    /// Add `Retry-After`, `X-RateLimit-*` and the IETF draft-11
    /// `RateLimit-Policy` / `RateLimit` fields to `response_headers_to_add`.
    pub response_headers: bool,
    /// Global shadow mode: every request is answered OK, decided and
    /// counted as usual (envoyproxy/ratelimit's `SHADOW_MODE`).
    pub global_shadow_mode: bool,
    /// The algorithm of limits Envoy sends with a descriptor.
    pub default_algorithm: AlgorithmKind,
    /// The most callers the fallback store tracks.
    pub fallback_callers: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            namespace: "rls".to_owned(),
            timeout: ratelimit_core::DEFAULT_TIMEOUT,
            degraded: Degraded::None,
            response_headers: false,
            global_shadow_mode: false,
            default_algorithm: AlgorithmKind::FixedWindow,
            fallback_callers: 100_000,
        }
    }
}

/// The descriptors a request's working lists hold without allocating.
const FEW: usize = 4;

/// What one descriptor of a request came to.
#[derive(Debug)]
enum Slot {
    /// No rate limit matched (or it was replaced): OK, no limit.
    Free,
    /// `unlimited: true`.
    Unlimited,
    /// A limit no request can pass: `requests_per_unit: 0`, or a cost above
    /// the limit.
    Never(Found),
    /// A `hits_addend` of 0: a check that counts nothing.
    Check(Found),
    /// Charged: index of the charge.
    Charged(Found, usize),
}

/// One charge of the store request.
struct Charge {
    quota: Quota,
    /// The quota as the headers name it.
    display: Quota,
    cost: u64,
    shadow: bool,
}

/// The rate-limit service: a store, the configuration (swapped on reload)
/// and the settings. Shared by the gRPC and HTTP front ends.
pub struct RateLimitService {
    store: Arc<dyn Store>,
    /// Decides every request: kept for the service's life, so that its
    /// leases, breaker, counters and log guard serve every request.
    limiter: Limiter,
    config: ArcSwap<Config>,
    settings: Settings,
    clock: Arc<dyn Clock>,
    serving: AtomicBool,
    backend: String,
}

impl fmt::Debug for RateLimitService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("store", &self.store)
            .field("settings", &self.settings)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

/// The policy name of one descriptor's state: `d` and the hex of the first
/// 16 bytes of the SHA-256 of its entries (with shared wildcard patterns in
/// place of values), each length-prefixed so no two lists collide.
pub fn state_name(entries: &[(&str, &str)], shared: &[Option<String>]) -> String {
    state_name_of(entries.iter().copied(), shared)
        .as_str()
        .to_owned()
}

/// A state name, on the stack: built for every charged descriptor of
/// every request, and copied once, into the quota's name.
struct StateName([u8; 33]);

impl StateName {
    fn as_str(&self) -> &str {
        // `d` and hex digits: ASCII, always UTF-8.
        std::str::from_utf8(&self.0).unwrap_or("d")
    }
}

/// [`state_name`] over the entries as they come.
fn state_name_of<'a>(
    entries: impl Iterator<Item = (&'a str, &'a str)>,
    shared: &[Option<String>],
) -> StateName {
    let mut h = Sha256::new();
    for (i, (k, v)) in entries.enumerate() {
        let v = shared.get(i).and_then(|s| s.as_deref()).unwrap_or(v);
        h.update((k.len() as u64).to_be_bytes());
        h.update(k.as_bytes());
        h.update((v.len() as u64).to_be_bytes());
        h.update(v.as_bytes());
    }
    let digest = h.finalize();
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut name = [b'd'; 33];
    for (i, b) in digest[..16].iter().enumerate() {
        name[1 + 2 * i] = HEX[usize::from(b >> 4)];
        name[2 + 2 * i] = HEX[usize::from(b & 0x0f)];
    }
    StateName(name)
}

/// A header-safe policy name for a rate limit: its `name`, else its
/// descriptor path, with characters outside `A-Z a-z 0-9 _ - .` replaced by
/// `_`, at most 64.
fn display_name(limit: &RateLimit) -> String {
    let source = if limit.name.is_empty() {
        &*limit.full_key
    } else {
        limit.name.as_str()
    };
    let mut s: String = source
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.len() > 64 {
        s.truncate(64);
    }
    if s.is_empty() {
        s.push_str("limit");
    }
    s
}

impl RateLimitService {
    /// A service over `store` with `config`. `backend` labels the store in
    /// logs and `/rlconfig` (`local`, `redis`, `cluster`).
    ///
    /// The requests are decided by one [`Limiter`] built here and kept for
    /// the service's life (its quotas come with each request: see
    /// [`Limiter::check_charges`]): its leases, breaker, counters and log
    /// guard serve every request, and with [`Degraded::Instances`] so does
    /// one in-process fallback store.
    ///
    /// Fails on settings the limiter refuses (a namespace outside
    /// `A-Z a-z 0-9 _ - .`, a zero timeout, zero instances).
    pub fn new(
        store: Arc<dyn Store>,
        config: Config,
        settings: Settings,
        backend: impl Into<String>,
    ) -> Result<Self, ratelimit_core::ConfigError> {
        let clock = store
            .capabilities()
            .clock
            .unwrap_or_else(|| Arc::new(SystemClock));
        let mut b = Limiter::builder_arc(store.clone())
            .quotas_per_call()
            .namespace(&settings.namespace)?
            .timeout(settings.timeout)
            .clock(ClockRef(clock.clone()));
        b = match settings.degraded {
            Degraded::None => b,
            Degraded::Instances(n, policy) => b
                .fallback(
                    ratelimit_local::LocalStore::new().max_callers(settings.fallback_callers),
                    n,
                )
                .failure_policy(policy),
            Degraded::Policy(p) => b.failure_policy(p),
        };
        let limiter = b.build()?;
        metrics::config_loaded(&config);
        Ok(Self {
            store,
            limiter,
            config: ArcSwap::from_pointee(config),
            settings,
            clock,
            serving: AtomicBool::new(true),
            backend: backend.into(),
        })
    }

    /// The limiter that decides every request (its statistics, its
    /// breaker).
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Puts `config` in force for every request that starts from now on;
    /// requests already running finish under the configuration they
    /// started with. Stored state carries over (it is kept per descriptor,
    /// not per limit).
    pub fn replace_config(&self, config: Config) {
        metrics::config_loaded(&config);
        self.config.store(Arc::new(config));
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The backend's label.
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// Whether the service reports itself serving (health checks).
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }

    /// Sets what health checks report (false from the start of a shutdown).
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Relaxed);
    }

    /// Decides one `ShouldRateLimit` request.
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, ServiceError> {
        let started = Instant::now();
        let result = self.decide(request).await;
        metrics::request_done(
            request,
            result.as_ref().ok(),
            started.elapsed(),
            &self.config,
        );
        result
    }

    async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, ServiceError> {
        crate::limits::check(request).map_err(ServiceError::Invalid)?;
        if request.domain.is_empty() {
            return Err(ServiceError::Invalid(InvalidRequest(
                "rate limit domain must not be empty".into(),
            )));
        }
        if request.descriptors.is_empty() {
            return Err(ServiceError::Invalid(InvalidRequest(
                "rate limit descriptor list must not be empty".into(),
            )));
        }
        let config = self.config.load();
        let n = request.descriptors.len();

        // 1. What each descriptor matches.
        // (A request holds a few descriptors: their working lists stay on
        // the stack up to `FEW`.)
        let mut found: SmallVec<[Option<Found>; FEW]> = SmallVec::with_capacity(n);
        let mut unlimited: SmallVec<[bool; FEW]> = smallvec::smallvec![false; n];
        let mut replaced: Vec<String> = Vec::new();
        let mut costs: SmallVec<[u64; FEW]> = SmallVec::with_capacity(n);
        for (i, d) in request.descriptors.iter().enumerate() {
            if d.is_negative_hits {
                return Err(ServiceError::Invalid(InvalidRequest(format!(
                    "descriptor {i}: is_negative_hits (giving budget back) is not supported: no \
                     store counts a call back"
                ))));
            }
            let entries: SmallVec<[(&str, &str); FEW]> = d
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect();
            let override_limit = match &d.limit {
                Some(o) => match Unit::from_proto(o.unit) {
                    Some(unit) => {
                        Some((o.requests_per_unit, unit, self.settings.default_algorithm))
                    }
                    None => {
                        return Err(ServiceError::Invalid(InvalidRequest(format!(
                            "descriptor {i}: limit override with unknown unit {}",
                            o.unit
                        ))));
                    }
                },
                None => None,
            };
            let f = if entries.is_empty() {
                None
            } else {
                config.lookup(&request.domain, &entries, override_limit)
            };
            costs.push(match &d.hits_addend {
                Some(h) => h.value,
                None => u64::from(request.hits_addend.max(1)),
            });
            if let Some(f) = &f {
                replaced.extend(f.limit.replaces.iter().cloned());
                if f.limit.unlimited {
                    unlimited[i] = true;
                }
            }
            found.push(f);
        }

        // 2. The charges.
        let mut slots: SmallVec<[Slot; FEW]> = SmallVec::with_capacity(n);
        let mut charges: SmallVec<[Charge; FEW]> = SmallVec::new();
        let quota_mode_count = found
            .iter()
            .zip(&unlimited)
            .filter(|(f, u)| {
                !**u && f.as_ref().is_some_and(|f| {
                    f.limit.quota_mode
                        && (f.limit.name.is_empty() || !replaced.contains(&f.limit.name))
                })
            })
            .count();
        for (i, f) in found.into_iter().enumerate() {
            let Some(f) = f else {
                slots.push(Slot::Free);
                continue;
            };
            if unlimited[i] {
                slots.push(Slot::Unlimited);
                continue;
            }
            if !f.limit.name.is_empty() && replaced.contains(&f.limit.name) {
                slots.push(Slot::Free);
                continue;
            }
            let cost = costs[i];
            let Some(quota) = &f.limit.quota else {
                slots.push(Slot::Never(f));
                continue;
            };
            if cost == 0 {
                slots.push(Slot::Check(f));
                continue;
            }
            let state = state_name_of(
                request.descriptors[i]
                    .entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str())),
                &f.shared,
            );
            let name = state.as_str();
            // A quota-mode descriptor alone decides like any other; with
            // several, each is charged as a shadow quota and the request is
            // over the limit only if all of them are.
            let shadow = f.limit.shadow_mode || (f.limit.quota_mode && quota_mode_count > 1);
            // (A request holds a few descriptors: a scan beats a map.)
            if let Some(c) = charges.iter().position(|c| c.quota.name() == name) {
                // Two descriptors with the same entries share one state:
                // charge it once for both.
                let total = charges[c].cost.saturating_add(cost);
                if charges[c].quota.check_cost(total).is_err() {
                    slots.push(Slot::Never(f));
                    continue;
                }
                charges[c].cost = total;
                charges[c].shadow &= shadow;
                slots.push(Slot::Charged(f, c));
                continue;
            }
            if quota.check_cost(cost).is_err() {
                slots.push(Slot::Never(f));
                continue;
            }
            let named = quota
                .clone()
                .named(name)
                .map_err(|e| ServiceError::Internal(e.to_string()))?;
            let display = if self.settings.response_headers {
                quota
                    .clone()
                    .named(&display_name(&f.limit))
                    .map_err(|e| ServiceError::Internal(e.to_string()))?
            } else {
                named.clone()
            };
            charges.push(Charge {
                quota: named,
                display,
                cost,
                shadow,
            });
            slots.push(Slot::Charged(f, charges.len() - 1));
        }

        // 3. One store request for every charge, unless some enforced
        // descriptor can never pass (then nothing is counted anywhere).
        let never_enforced = slots.iter().any(|s| {
            matches!(s, Slot::Never(f) if !(f.limit.shadow_mode || (f.limit.quota_mode && quota_mode_count > 1)))
        });
        let verdict = if charges.is_empty() || never_enforced {
            None
        } else {
            Some(self.check(&request.domain, &charges).await?)
        };

        // 4. The statuses and the overall code.
        let mut statuses = Vec::with_capacity(n);
        let mut over = false;
        let (mut quota_total, mut quota_over) = (0usize, 0usize);
        for (i, slot) in slots.iter().enumerate() {
            let status = match slot {
                Slot::Free => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                },
                Slot::Unlimited => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                Slot::Never(f) => {
                    metrics::descriptor(f, costs[i], false);
                    self.tally(
                        f,
                        true,
                        &mut over,
                        &mut quota_total,
                        &mut quota_over,
                        quota_mode_count,
                    );
                    DescriptorStatus {
                        code: if f.limit.shadow_mode {
                            Code::Ok
                        } else {
                            Code::OverLimit
                        } as i32,
                        current_limit: Some(pb_limit(&f.limit)),
                        limit_remaining: 0,
                        duration_until_reset: f
                            .limit
                            .unit
                            .map(|u| until_window_end(u, self.clock.now())),
                        quota: None,
                    }
                }
                // A check that counts nothing, and a charge that was not
                // asked (another descriptor can never pass): OK, not
                // decided; a charge that was: its decision.
                Slot::Check(f) | Slot::Charged(f, _) => {
                    let decided = match (slot, &verdict) {
                        (Slot::Charged(_, c), Some(v)) => Some((*c, &v.quotas[*c])),
                        _ => None,
                    };
                    let denied = decided.is_some_and(|(_, d)| !d.allowed);
                    if let Some((c, _)) = decided {
                        metrics::descriptor(f, charges[c].cost, !denied);
                    }
                    self.tally(
                        f,
                        denied,
                        &mut over,
                        &mut quota_total,
                        &mut quota_over,
                        quota_mode_count,
                    );
                    match decided {
                        Some((_, d)) => DescriptorStatus {
                            code: if denied && !f.limit.shadow_mode {
                                Code::OverLimit
                            } else {
                                Code::Ok
                            } as i32,
                            current_limit: Some(pb_limit(&f.limit)),
                            limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
                            duration_until_reset: duration_of(d),
                            quota: None,
                        },
                        None => DescriptorStatus {
                            code: Code::Ok as i32,
                            current_limit: Some(pb_limit(&f.limit)),
                            ..Default::default()
                        },
                    }
                }
            };
            statuses.push(status);
        }
        if quota_mode_count > 1 && quota_total > 0 && quota_total == quota_over {
            over = true;
        }
        if let Some(v) = &verdict {
            metrics::source(v.decision.source);
        }
        let mut response_headers_to_add = Vec::new();
        if self.settings.response_headers
            && let Some(v) = &verdict
        {
            response_headers_to_add = self.headers(v, &charges);
        }
        let mut overall = if over { Code::OverLimit } else { Code::Ok };
        if over && self.settings.global_shadow_mode {
            metrics::global_shadow();
            overall = Code::Ok;
        }
        Ok(RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add,
            ..Default::default()
        })
    }

    /// Counts a descriptor's outcome into the overall code.
    fn tally(
        &self,
        f: &Found,
        denied: bool,
        over: &mut bool,
        quota_total: &mut usize,
        quota_over: &mut usize,
        quota_mode_count: usize,
    ) {
        if f.limit.quota_mode && quota_mode_count > 1 {
            *quota_total += 1;
            if denied {
                *quota_over += 1;
            }
        } else if denied && !f.limit.shadow_mode {
            *over = true;
        }
    }

    /// Decides every charge in one store request, through the service's
    /// limiter: the library's timeout, deadline, leases, fallback store and
    /// failure policy apply.
    async fn check(&self, domain: &str, charges: &[Charge]) -> Result<Verdict, ServiceError> {
        let asked: SmallVec<[ratelimit_core::Charge<'_>; FEW]> = charges
            .iter()
            .map(|c| ratelimit_core::Charge {
                quota: &c.quota,
                cost: c.cost,
                shadow: c.shadow,
            })
            .collect();
        self.limiter
            .check_charges(domain, &asked)
            .await
            .map_err(|e| ServiceError::Internal(e.to_string()))
    }

    /// `Retry-After`, `X-RateLimit-*`, `RateLimit-Policy` and `RateLimit`
    /// for a verdict, naming each limit by its `name` or descriptor path.
    fn headers(&self, v: &Verdict, charges: &[Charge]) -> Vec<HeaderValue> {
        let listed: Vec<(&Decision, &Quota)> = v
            .quotas
            .iter()
            .zip(charges)
            .filter(|(_, c)| !c.shadow)
            .map(|(d, c)| (d, &c.display))
            .collect();
        let Some(binding) = charges.get(v.binding).filter(|c| !c.shadow) else {
            return Vec::new();
        };
        RateLimitHeaders::for_all(&v.decision, &binding.display, &listed, self.clock.now())
            .iter()
            .map(|(k, value)| HeaderValue {
                key: k.to_owned(),
                value: value.to_owned(),
                ..Default::default()
            })
            .collect()
    }
}

/// The clock the service stamps with, shared with the limiter.
#[derive(Debug, Clone)]
struct ClockRef(Arc<dyn Clock>);

impl Clock for ClockRef {
    fn now(&self) -> ratelimit_core::Micros {
        self.0.now()
    }
}

/// `current_limit` for a configured limit.
fn pb_limit(limit: &RateLimit) -> PbRateLimit {
    PbRateLimit {
        name: limit.name.clone(),
        requests_per_unit: limit.requests_per_unit,
        unit: limit.unit.map_or(0, Unit::proto),
    }
}

/// Whole seconds, rounded up, as envoyproxy/ratelimit reports durations
/// (a client that reads only the seconds never retries early).
fn whole_seconds(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(ceil_secs(d)).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// `duration_until_reset` of one decision: on a denial the exact wait until
/// the same request passes (`retry_after`); on an admission the time until
/// the state is back to a fresh caller's (for the fixed window, the end of
/// the window, as envoyproxy/ratelimit reports). Unknown (none) when the
/// store was not consulted.
fn duration_of(d: &Decision) -> Option<PbDuration> {
    if !matches!(d.source, Source::Store | Source::Fallback | Source::Shadow) {
        return None;
    }
    let until = if d.allowed {
        d.reset_after
    } else {
        d.retry_after.unwrap_or(d.reset_after)
    };
    Some(whole_seconds(until))
}

/// Until the end of the calendar window of `unit` at `now` (µs).
fn until_window_end(unit: Unit, now: ratelimit_core::Micros) -> PbDuration {
    let w = unit.seconds() * 1_000_000;
    whole_seconds(Duration::from_micros(w - now % w))
}
