//! Metrics (feature `metrics`, through the `metrics` facade: no exporter is
//! forced on the application) and `tracing` spans.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `ratelimit_decisions_total` | counter | `namespace`, `policy`, `outcome` (`allowed`/`denied`), `source` (`store`, `fail_open`, `fail_closed`, `fallback`, `cache`, `shadow`) |
//! | `ratelimit_store_duration_seconds` | histogram | `namespace` |
//! | `ratelimit_store_failures_total` | counter | `namespace`, `kind` (`error`, `timeout`, `panic`) |
//! | `ratelimit_breaker_open` | gauge (0/1) | `namespace` |
//! | `ratelimit_breaker_short_circuits_total` | counter | `namespace` |
//! | `ratelimit_deny_cache_hits_total` | counter | `namespace`, `policy` |
//! | `ratelimit_shadow_denials_total` | counter | `namespace`, `policy` |
//!
//! A caller key is never a label (cardinality, and keys may be API keys).
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
}

impl Labels {
    pub(crate) fn new(namespace: &str) -> Self {
        #[cfg(feature = "metrics")]
        {
            describe();
            Self {
                namespace: metrics::SharedString::from_shared(std::sync::Arc::from(namespace)),
            }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = namespace;
            Self {}
        }
    }
}

#[cfg(feature = "metrics")]
fn describe() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
        describe_counter!(
            "ratelimit_decisions_total",
            "Rate-limit decisions by policy, outcome and source"
        );
        describe_histogram!(
            "ratelimit_store_duration_seconds",
            Unit::Seconds,
            "Time spent in rate-limit store calls"
        );
        describe_counter!(
            "ratelimit_store_failures_total",
            "Rate-limit store calls that failed, by kind (error, timeout, panic)"
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
    });
}

#[cfg(feature = "metrics")]
fn policy(q: &Quota) -> metrics::SharedString {
    metrics::SharedString::from_shared(q.name_arc().clone())
}

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

/// One decision: the fields of its span (`span`) and the decisions counter.
#[inline]
pub(crate) fn decision(labels: &Labels, quota: &Quota, d: &Decision, span: &tracing::Span) {
    let outcome = if d.allowed { "allowed" } else { "denied" };
    if !span.is_disabled() {
        span.record("policy", quota.name());
        span.record("algorithm", quota.kind().code());
        span.record("outcome", outcome);
        span.record("source", d.source.label());
    }
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "ratelimit_decisions_total",
        "namespace" => labels.namespace.clone(),
        "policy" => policy(quota),
        "outcome" => outcome,
        "source" => d.source.label()
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = labels;
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
        metrics::histogram!(
            "ratelimit_store_duration_seconds",
            "namespace" => labels.namespace.clone()
        )
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
        "policy" => policy(quota)
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
        "policy" => policy(quota)
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (labels, quota);
}
