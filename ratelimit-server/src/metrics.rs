//! Prometheus metrics, served at `/metrics`.
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `ratelimit_server_requests_total` | `domain`, `code` | requests answered (`ok`, `over_limit`, `error`); an unconfigured domain is labelled `unknown` |
//! | `ratelimit_server_request_duration_seconds` | | time to decide a request (histogram) |
//! | `ratelimit_server_total_hits` | `key` | hits (costs) per rate limit, labelled by descriptor path as envoyproxy/ratelimit's stats are (`detailed_metric` and `value_to_metric` add values) |
//! | `ratelimit_server_over_limit` | `key` | hits denied |
//! | `ratelimit_server_within_limit` | `key` | hits admitted |
//! | `ratelimit_server_shadow_mode` | `key` | hits a shadow-mode limit would have denied |
//! | `ratelimit_server_decisions_total` | `source` | how decisions were reached: `store`, `fallback`, `fail_open`, `fail_closed`, `shadow` |
//! | `ratelimit_server_global_shadow_mode_total` | | over-limit answers turned OK by global shadow mode |
//! | `ratelimit_server_config_load_success_total`, `ratelimit_server_config_load_error_total` | | configuration loads and reloads |
//! | `ratelimit_server_config_domains`, `ratelimit_server_config_limits` | | the configuration in force |
//!
//! No label ever holds a caller's value unless the configuration asks for
//! it (`detailed_metric`, `value_to_metric`).

use std::sync::OnceLock;
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use ratelimit_core::Source;

use crate::config::Config;

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the Prometheus recorder as the process's metrics recorder (once;
/// later calls return the same handle). `None` if another recorder was
/// installed first.
pub fn install() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("ratelimit_server_request_duration_seconds".into()),
                    &[
                        0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
                        0.05, 0.1, 0.25, 1.0,
                    ],
                )
                .ok()?
                .build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            Some(handle)
        })
        .as_ref()
}

/// The metrics in the Prometheus text format.
pub fn render() -> String {
    match install() {
        Some(h) => h.render(),
        None => "# metrics recorder not installed\n".to_owned(),
    }
}

pub(crate) fn config_loaded(config: &Config) {
    install();
    metrics::counter!("ratelimit_server_config_load_success_total").increment(1);
    // Exported from the first load on, at zero until a load fails: a
    // series to alert on.
    metrics::counter!("ratelimit_server_config_load_error_total").increment(0);
    metrics::gauge!("ratelimit_server_config_domains").set(config.domains().len() as f64);
    metrics::gauge!("ratelimit_server_config_limits").set(config.limit_count() as f64);
}

/// Counts a configuration (re)load that failed.
pub fn config_load_failed() {
    install();
    metrics::counter!("ratelimit_server_config_load_error_total").increment(1);
}

pub(crate) fn request_done(
    request: &RateLimitRequest,
    response: Option<&RateLimitResponse>,
    elapsed: Duration,
    config: &ArcSwap<Config>,
) {
    let domain = if config.load().has_domain(&request.domain) {
        request.domain.clone()
    } else {
        "unknown".to_owned()
    };
    let code = match response {
        Some(r) if r.overall_code == 2 => "over_limit",
        Some(_) => "ok",
        None => "error",
    };
    metrics::counter!("ratelimit_server_requests_total", "domain" => domain, "code" => code)
        .increment(1);
    metrics::histogram!("ratelimit_server_request_duration_seconds").record(elapsed.as_secs_f64());
}

pub(crate) fn descriptor(key: &str, hits: u64, within: bool, shadow: bool) {
    let key = key.to_owned();
    metrics::counter!("ratelimit_server_total_hits", "key" => key.clone()).increment(hits);
    if within {
        metrics::counter!("ratelimit_server_within_limit", "key" => key).increment(hits);
    } else if shadow {
        metrics::counter!("ratelimit_server_shadow_mode", "key" => key.clone()).increment(hits);
        metrics::counter!("ratelimit_server_over_limit", "key" => key).increment(hits);
    } else {
        metrics::counter!("ratelimit_server_over_limit", "key" => key).increment(hits);
    }
}

pub(crate) fn source(source: Source) {
    metrics::counter!("ratelimit_server_decisions_total", "source" => source.label()).increment(1);
}

pub(crate) fn global_shadow() {
    metrics::counter!("ratelimit_server_global_shadow_mode_total").increment(1);
}
