//! Metrics (feature `metrics`, through the `metrics` facade: no exporter is
//! forced on the application) and `tracing` spans.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `ratelimit_decisions_total` | counter | `namespace`, `policy` (the binding quota; `per_call` under a limiter whose quotas come with each call, [`crate::LimiterBuilder::quotas_per_call`], whose quota names are per caller), `outcome` (`allowed`/`denied`), `source` (`store`, `fail_open`, `fail_closed`, `fallback`, `cache`, `shadow`, `lease`) |
//! | `ratelimit_policy_decisions_total` | counter | `namespace`, `policy` (every quota checked, shadow quotas included), `outcome` (that quota's own answer), `source` |
//! | `ratelimit_store_duration_seconds` | histogram | `namespace` |
//! | `ratelimit_store_failures_total` | counter | `namespace`, `kind` (`error`, `timeout`, `late`, `panic`, `shed`: refused at once by a busy store's admission) |
//! | `ratelimit_breaker_open` | gauge (0/1) | `namespace` |
//! | `ratelimit_breaker_short_circuits_total` | counter | `namespace` |
//! | `ratelimit_deny_cache_hits_total` | counter | `namespace`, `policy` |
//! | `ratelimit_shadow_denials_total` | counter | `namespace`, `policy` |
//!
//! `ratelimit_decisions_total` counts each call once, under the quota that
//! bound it; `ratelimit_policy_decisions_total` counts it once under every
//! quota it was checked against, with that quota's own answer, so a daily
//! quota is visible (and how close it is to denying) long before it binds.
//! A quota that would admit a call another quota denied counts `allowed`
//! there; a shadow quota that would deny counts `denied` although the call
//! was admitted.
//!
//! A caller key is never a label (cardinality, and keys may be API keys).
//!
//! Every metric is described (`# HELP` in the Prometheus format) whatever
//! the order in which the application installs its recorder and builds its
//! limiters: the descriptions are sent again whenever a metric is emitted
//! to a recorder that has not had them yet.
//!
//! `ratelimit_store_duration_seconds` is recorded through the facade as a
//! histogram; an exporter decides how to aggregate it. With
//! `metrics-exporter-prometheus`, configure buckets for it (else it renders
//! a summary, whose quantiles cannot be added up across instances). The
//! example server uses these, in seconds, from an in-process store's
//! microseconds to past the default 20 ms timeout:
//! `0.00001, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02,
//! 0.05, 0.1, 0.25`:
//!
//! ```text
//! PrometheusBuilder::new().set_buckets_for_metric(
//!     Matcher::Full("ratelimit_store_duration_seconds".into()),
//!     &[0.00001, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25],
//! )?
//! ```
//!
//! Every decision runs in a `ratelimit.decision` span at debug level, with
//! `namespace`, and, once decided, `policy` (the binding quota),
//! `algorithm`, `outcome` and `source`.

use crate::decision::Decision;
use crate::quota::Quota;

/// The limiter's constant label values.
#[derive(Debug, Clone)]
pub(crate) struct Labels {
    #[cfg(feature = "metrics")]
    namespace: metrics::SharedString,
    /// The limiter's quotas come with each call
    /// ([`crate::LimiterBuilder::quotas_per_call`]): their names are
    /// per caller (a service names each descriptor's state), so the
    /// `policy` label is `per_call`, not the name, or every caller would
    /// be a series of its own.
    #[cfg(feature = "metrics")]
    per_call: bool,
    /// The handles of the series this limiter records, made on first use
    /// and kept while the recorder stays the same (a decision then
    /// allocates no label set and looks nothing up in the registry).
    #[cfg(feature = "metrics")]
    handles: std::sync::Arc<std::sync::RwLock<Handles>>,
}

/// A limiter's metric handles for one recorder: per `(metric, policy,
/// outcome, source)` a counter (the policy by its name's address: the
/// limiter's quotas, or `per_call`), and the store duration histogram.
#[cfg(feature = "metrics")]
#[derive(Debug, Default)]
struct Handles {
    /// The recorder they were made with (its address).
    recorder: usize,
    counters: Vec<(Series, metrics::Counter)>,
    store: Option<metrics::Histogram>,
}

/// Which counter: the metric, the policy's name (address, 0 for
/// `per_call`), the outcome, the source.
#[cfg(feature = "metrics")]
type Series = (&'static str, usize, &'static str, &'static str);

/// The most counters a limiter keeps handles for (its quotas × outcomes ×
/// sources); beyond, the handles are made per call.
#[cfg(feature = "metrics")]
const HANDLES_KEPT: usize = 512;

/// The address of the current recorder.
#[cfg(feature = "metrics")]
#[inline]
fn recorder() -> usize {
    metrics::with_recorder(|r| {
        std::ptr::from_ref::<dyn metrics::Recorder>(r)
            .cast::<()>()
            .addr()
    })
}

#[cfg(feature = "metrics")]
impl Labels {
    /// The counter of `series`, made by `make` unless kept.
    fn counter(&self, series: Series, make: impl FnOnce() -> metrics::Counter) -> metrics::Counter {
        let current = recorder();
        {
            let h = self.handles.read().unwrap_or_else(|p| p.into_inner());
            if h.recorder == current
                && let Some((_, c)) = h.counters.iter().find(|(s, _)| *s == series)
            {
                return c.clone();
            }
        }
        let c = make();
        let mut h = self.handles_for(current);
        if h.counters.len() < HANDLES_KEPT {
            h.counters.push((series, c.clone()));
        }
        c
    }

    /// The handles, written, emptied first if they were made with another
    /// recorder than `current`.
    fn handles_for(&self, current: usize) -> std::sync::RwLockWriteGuard<'_, Handles> {
        let mut h = self.handles.write().unwrap_or_else(|p| p.into_inner());
        if h.recorder != current {
            *h = Handles {
                recorder: current,
                ..Handles::default()
            };
        }
        h
    }

    /// The store duration histogram.
    fn store_duration(&self) -> metrics::Histogram {
        let current = recorder();
        {
            let h = self.handles.read().unwrap_or_else(|p| p.into_inner());
            if h.recorder == current
                && let Some(store) = &h.store
            {
                return store.clone();
            }
        }
        let made = metrics::histogram!(
            "ratelimit_store_duration_seconds",
            "namespace" => self.namespace.clone()
        );
        let mut h = self.handles_for(current);
        h.store = Some(made.clone());
        made
    }

    /// The policy's part of a series' identity.
    fn policy_id(&self, q: &Quota) -> usize {
        if self.per_call {
            0
        } else {
            q.name_arc().as_ptr().cast::<()>().addr()
        }
    }
}

impl Labels {
    pub(crate) fn new(namespace: &str, per_call: bool) -> Self {
        #[cfg(feature = "metrics")]
        {
            described();
            Self {
                namespace: metrics::SharedString::from_shared(std::sync::Arc::from(namespace)),
                per_call,
                handles: std::sync::Arc::default(),
            }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = (namespace, per_call);
            Self {}
        }
    }
}

/// Describes every metric to the current recorder unless it has had the
/// descriptions already: a recorder installed after the limiters were built
/// gets them with the first metric emitted to it.
#[cfg(feature = "metrics")]
#[inline]
fn described() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    /// The address of the recorder that last had the descriptions.
    static DESCRIBED: AtomicUsize = AtomicUsize::new(0);
    let current = metrics::with_recorder(|r| {
        std::ptr::from_ref::<dyn metrics::Recorder>(r)
            .cast::<()>()
            .addr()
    });
    if DESCRIBED.load(Ordering::Relaxed) != current
        && DESCRIBED.swap(current, Ordering::Relaxed) != current
    {
        describe();
    }
}

#[cfg(feature = "metrics")]
#[cold]
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    {
        describe_counter!(
            "ratelimit_decisions_total",
            "Rate-limit decisions (one per call) by the binding policy, outcome and source"
        );
        describe_counter!(
            "ratelimit_policy_decisions_total",
            "Each quota's own rate-limit decision, for every policy a call was checked against"
        );
        describe_histogram!(
            "ratelimit_store_duration_seconds",
            Unit::Seconds,
            "Time spent in rate-limit store calls"
        );
        describe_counter!(
            "ratelimit_store_failures_total",
            "Rate-limit store calls that failed, by kind (error, timeout, late, panic, shed)"
        );
        describe_gauge!(
            "ratelimit_breaker_open",
            "1 while the rate-limit store's circuit breaker is open"
        );
        describe_counter!(
            "ratelimit_breaker_short_circuits_total",
            "Calls not sent to the rate-limit store because the breaker was open"
        );
        describe_counter!(
            "ratelimit_deny_cache_hits_total",
            "Calls denied from the local deny cache without a store round trip"
        );
        describe_counter!(
            "ratelimit_shadow_denials_total",
            "Calls a shadow (dry-run) quota would have denied"
        );
    }
}

/// The `policy` label of `q`: its name, or `per_call` under a limiter whose
/// quotas come with each call (see [`Labels`]).
#[cfg(feature = "metrics")]
fn policy(labels: &Labels, q: &Quota) -> metrics::SharedString {
    if labels.per_call {
        metrics::SharedString::const_str(PER_CALL)
    } else {
        metrics::SharedString::from_shared(q.name_arc().clone())
    }
}

/// The `policy` label of every decision of a limiter whose quotas come with
/// each call.
#[cfg(feature = "metrics")]
const PER_CALL: &str = "per_call";

/// The span every decision runs in.
#[inline]
pub(crate) fn span(namespace: &str) -> tracing::Span {
    tracing::debug_span!(
        "ratelimit.decision",
        namespace,
        policy = tracing::field::Empty,
        algorithm = tracing::field::Empty,
        outcome = tracing::field::Empty,
        source = tracing::field::Empty,
    )
}

/// Whether a subscriber may take debug spans (one load of tracing's
/// global level filter).
#[inline(always)]
pub(crate) fn spans_enabled() -> bool {
    tracing::level_enabled!(tracing::Level::DEBUG)
}

/// The span of a decision, or `None` when no subscriber takes debug spans
/// (checked before anything is built for it).
#[inline]
pub(crate) fn span_if_enabled(namespace: &str) -> Option<tracing::Span> {
    if !spans_enabled() {
        return None;
    }
    let span = span(namespace);
    (!span.is_disabled()).then_some(span)
}

/// One decision: the fields of its span (`span`) and the decisions counter.
#[inline]
pub(crate) fn decision(labels: &Labels, quota: &Quota, d: &Decision, span: Option<&tracing::Span>) {
    let outcome = || if d.allowed { "allowed" } else { "denied" };
    if let Some(span) = span.filter(|s| !s.is_disabled()) {
        span.record("policy", quota.name());
        span.record("algorithm", quota.kind().code());
        span.record("outcome", outcome());
        span.record("source", d.source.label());
    }
    #[cfg(feature = "metrics")]
    described();
    #[cfg(feature = "metrics")]
    labels
        .counter(
            (
                "ratelimit_decisions_total",
                labels.policy_id(quota),
                outcome(),
                d.source.label(),
            ),
            || {
                metrics::counter!(
                    "ratelimit_decisions_total",
                    "namespace" => labels.namespace.clone(),
                    "policy" => policy(labels, quota),
                    "outcome" => outcome(),
                    "source" => d.source.label()
                )
            },
        )
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = labels;
}

/// One quota's own decision on a call checked against it.
#[inline]
pub(crate) fn policy_decision(labels: &Labels, quota: &Quota, d: &Decision) {
    #[cfg(feature = "metrics")]
    {
        let denied = !d.allowed || d.source == crate::decision::Source::Shadow;
        let outcome = if denied { "denied" } else { "allowed" };
        labels
            .counter(
                (
                    "ratelimit_policy_decisions_total",
                    labels.policy_id(quota),
                    outcome,
                    d.source.label(),
                ),
                || {
                    metrics::counter!(
                        "ratelimit_policy_decisions_total",
                        "namespace" => labels.namespace.clone(),
                        "policy" => policy(labels, quota),
                        "outcome" => outcome,
                        "source" => d.source.label()
                    )
                },
            )
            .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (labels, quota, d);
}

/// The start of a store call (timed only with metrics).
pub(crate) struct Started {
    #[cfg(feature = "metrics")]
    at: std::time::Instant,
}

impl Started {
    pub(crate) fn now() -> Self {
        Self {
            #[cfg(feature = "metrics")]
            at: std::time::Instant::now(),
        }
    }

    pub(crate) fn record(self, labels: &Labels) {
        #[cfg(feature = "metrics")]
        labels
            .store_duration()
            .record(self.at.elapsed().as_secs_f64());
        #[cfg(not(feature = "metrics"))]
        let _ = labels;
    }
}

pub(crate) fn store_failure(labels: &Labels, kind: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "ratelimit_store_failures_total",
        "namespace" => labels.namespace.clone(),
        "kind" => kind
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (labels, kind);
}

pub(crate) fn breaker(labels: &Labels, open: bool) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("ratelimit_breaker_open", "namespace" => labels.namespace.clone())
        .set(if open { 1.0 } else { 0.0 });
    #[cfg(not(feature = "metrics"))]
    let _ = (labels, open);
}

pub(crate) fn short_circuit(labels: &Labels) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "ratelimit_breaker_short_circuits_total",
        "namespace" => labels.namespace.clone()
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = labels;
}

#[cfg_attr(not(feature = "deny-cache"), allow(dead_code))]
pub(crate) fn cache_hit(labels: &Labels, quota: &Quota) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "ratelimit_deny_cache_hits_total",
        "namespace" => labels.namespace.clone(),
        "policy" => policy(labels, quota)
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (labels, quota);
}

pub(crate) fn shadow_denial(labels: &Labels, quota: &Quota) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "ratelimit_shadow_denials_total",
        "namespace" => labels.namespace.clone(),
        "policy" => policy(labels, quota)
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (labels, quota);
}
