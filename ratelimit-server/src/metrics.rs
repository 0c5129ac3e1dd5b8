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

use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use foldhash::HashMap;
use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use ratelimit_core::Source;

use crate::config::{Config, Found};

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// How often the recorder's histograms are drained into their buckets
/// (see [`install`]): often, so that each drain is short. The drain runs
/// on a thread that may share a core with the gRPC workers; at 50,000
/// requests a second a drain every 5 s would fold half a million
/// observations at once.
pub const UPKEEP_EVERY: Duration = Duration::from_millis(250);

/// The name of the thread that keeps the recorder up.
pub const UPKEEP_THREAD: &str = "metrics-upkeep";

/// Installs the Prometheus recorder as the process's metrics recorder (once;
/// later calls return the same handle), and starts the thread that drains
/// its histograms every [`UPKEEP_EVERY`]: without it, every observation
/// since the last scrape is held in memory (a few bytes each, two per
/// request) and drained by the scrape. `None` if another recorder was
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
            let upkeep = handle.clone();
            let started = std::thread::Builder::new()
                .name(UPKEEP_THREAD.to_owned())
                .spawn(move || {
                    loop {
                        std::thread::sleep(UPKEEP_EVERY);
                        upkeep.run_upkeep();
                    }
                });
            if let Err(e) = started {
                tracing::warn!(
                    error = %e,
                    "cannot start the metrics upkeep thread: histograms are drained only by scrapes"
                );
            }
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

/// The handles of the metrics a request records, made once per label set
/// and kept (a request then costs no label allocation and no registry
/// lookup). At most [`HANDLES_KEPT`] label sets are kept per metric family;
/// beyond, the handles are made per call (labels holding callers' values:
/// `detailed_metric`, `value_to_metric`).
struct Handles {
    /// Per domain: the request counters for `ok`, `over_limit`, `error`.
    requests: RwLock<HashMap<String, [Counter; 3]>>,
    /// The request-duration histogram.
    duration: Histogram,
    /// Per descriptor path: total hits, within, over, shadow.
    descriptors: RwLock<HashMap<String, [Counter; 4]>>,
    /// Per decision source.
    sources: RwLock<HashMap<&'static str, Counter>>,
}

/// How many label sets each family keeps handles for.
pub const HANDLES_KEPT: usize = 10_000;

static HANDLES: OnceLock<Handles> = OnceLock::new();

/// The handles, made on first use (after [`install`], so that they record
/// into the service's recorder).
fn handles() -> &'static Handles {
    HANDLES.get_or_init(|| {
        install();
        Handles {
            requests: RwLock::default(),
            duration: metrics::histogram!("ratelimit_server_request_duration_seconds"),
            descriptors: RwLock::default(),
            sources: RwLock::default(),
        }
    })
}

/// The handle for `key` in `map`, made by `make` on first use (and kept
/// while fewer than [`HANDLES_KEPT`] are).
fn cached<K, V>(
    map: &RwLock<HashMap<K, V>>,
    key: &str,
    own: impl FnOnce() -> K,
    make: impl FnOnce() -> V,
) -> V
where
    K: std::borrow::Borrow<str> + std::hash::Hash + Eq,
    V: Clone,
{
    if let Some(v) = map.read().unwrap_or_else(|p| p.into_inner()).get(key) {
        return v.clone();
    }
    let v = make();
    let mut m = map.write().unwrap_or_else(|p| p.into_inner());
    if m.len() < HANDLES_KEPT {
        m.entry(own()).or_insert_with(|| v.clone());
    }
    v
}

pub(crate) fn request_done(
    request: &RateLimitRequest,
    response: Option<&RateLimitResponse>,
    elapsed: Duration,
    config: &ArcSwap<Config>,
) {
    let h = handles();
    let known = config.load().has_domain(&request.domain);
    let domain = if known {
        request.domain.as_str()
    } else {
        "unknown"
    };
    let code = match response {
        Some(r) if r.overall_code == 2 => 1,
        Some(_) => 0,
        None => 2,
    };
    let counters = cached(
        &h.requests,
        domain,
        || domain.to_owned(),
        || {
            ["ok", "over_limit", "error"].map(|code| {
                metrics::counter!(
                    "ratelimit_server_requests_total",
                    "domain" => domain.to_owned(),
                    "code" => code
                )
            })
        },
    );
    counters[code].increment(1);
    h.duration.record(elapsed.as_secs_f64());
}

/// The four counters of one descriptor label: total hits, within, over,
/// shadow.
fn descriptor_counters(key: &str) -> [Counter; 4] {
    [
        "ratelimit_server_total_hits",
        "ratelimit_server_within_limit",
        "ratelimit_server_over_limit",
        "ratelimit_server_shadow_mode",
    ]
    .map(|name| metrics::counter!(name, "key" => key.to_owned()))
}

/// The counters of a configured rate limit's own label (its descriptor
/// path), made on its first decision and kept with the limit, so that a
/// descriptor labelled by its limit's path costs no lock, hash or handle
/// clone. A limit built again by a reload makes its own, which record
/// into the same series. A limit Envoy sent with a request lives for that
/// request: it keeps none ([`LimitCounters::none`]), and its label's
/// handles are looked up in the shared map.
#[derive(Debug, Clone)]
pub(crate) struct LimitCounters(Option<OnceLock<[Counter; 4]>>);

impl LimitCounters {
    /// Counters kept with a configured limit, made on its first decision.
    pub(crate) fn kept() -> Self {
        Self(Some(OnceLock::new()))
    }

    /// No counters kept: a limit that lives for one request.
    pub(crate) fn none() -> Self {
        Self(None)
    }
}

/// Counts the hits of a descriptor found as `found`: under its limit's
/// own label from the counters kept with the limit, under any other label
/// (values asked for by `detailed_metric`, `value_to_metric`) from the
/// kept handles of that label.
pub(crate) fn descriptor(found: &Found, hits: u64, within: bool) {
    let limit = &found.limit;
    let shadow = limit.shadow_mode;
    if let Some(cell) = &limit.counters.0
        && Arc::ptr_eq(&found.metric_key, &limit.full_key)
    {
        let kept = cell.get_or_init(|| {
            install();
            descriptor_counters(&limit.full_key)
        });
        count_descriptor(kept, hits, within, shadow);
    } else {
        let key = &*found.metric_key;
        let made = cached(
            &handles().descriptors,
            key,
            || key.to_owned(),
            || descriptor_counters(key),
        );
        count_descriptor(&made, hits, within, shadow);
    }
}

fn count_descriptor(counters: &[Counter; 4], hits: u64, within: bool, shadow: bool) {
    let [total, within_limit, over_limit, shadow_mode] = counters;
    total.increment(hits);
    if within {
        within_limit.increment(hits);
    } else if shadow {
        shadow_mode.increment(hits);
        over_limit.increment(hits);
    } else {
        over_limit.increment(hits);
    }
}

pub(crate) fn source(source: Source) {
    let label = source.label();
    cached(
        &handles().sources,
        label,
        || label,
        || metrics::counter!("ratelimit_server_decisions_total", "source" => label),
    )
    .increment(1);
}

pub(crate) fn global_shadow() {
    metrics::counter!("ratelimit_server_global_shadow_mode_total").increment(1);
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::{UPKEEP_THREAD, install};

    /// The recorder's histograms are drained by a thread of their own,
    /// not only by scrapes (a service nobody scrapes held every
    /// observation in memory): the thread runs once the recorder is in.
    #[test]
    fn installing_the_recorder_starts_its_upkeep() {
        assert!(install().is_some(), "another recorder was installed first");
        let names = || -> Vec<String> {
            std::fs::read_dir("/proc/self/task")
                .expect("/proc/self/task")
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|n| n.trim().to_owned())
                .collect()
        };
        // A new thread names itself once it runs: give it up to 5 s.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !names().iter().any(|n| n == UPKEEP_THREAD) {
            assert!(
                std::time::Instant::now() < deadline,
                "no {UPKEEP_THREAD} thread among {:?}",
                names()
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod counting {
    use std::sync::Arc;

    use ratelimit_core::AlgorithmKind;

    use super::{descriptor, render};
    use crate::config::{Config, Unit};

    /// A descriptor labelled by its limit's path counts on the counters
    /// kept with the limit, one labelled with values (`detailed_metric`)
    /// on the kept handles of its label; both count into the exported
    /// series, shadow hits as over-limit and shadow, and a reload (new
    /// limits, new kept counters) goes on counting into the same series.
    #[test]
    fn hits_are_counted_under_each_label_across_reloads() {
        let yaml = "domain: counted
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: team
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
";
        for reload in 1..=2u64 {
            let config = Config::from_yaml_str("counted.yaml", yaml).expect("config");
            let found = |key: &str| {
                config
                    .lookup("counted", &[(key, "red")], None)
                    .expect("a limit")
            };
            let (user, team, trial) = (found("user"), found("team"), found("trial"));
            assert!(Arc::ptr_eq(&user.metric_key, &user.limit.full_key));
            assert!(!Arc::ptr_eq(&team.metric_key, &team.limit.full_key));
            // A limit sent with the request keeps no counters of its own
            // and counts under its path all the same.
            let sent = config
                .lookup(
                    "counted",
                    &[("sent", "red")],
                    Some((5, Unit::Minute, AlgorithmKind::FixedWindow)),
                )
                .expect("a limit sent with the request");
            assert!(sent.limit.counters.0.is_none());
            assert!(user.limit.counters.0.is_some());
            descriptor(&sent, 1, true);
            descriptor(&user, 2, true);
            descriptor(&user, 1, false);
            descriptor(&team, 3, true);
            descriptor(&trial, 4, false);
            let text = render();
            for (series, value) in [
                (r#"ratelimit_server_total_hits{key="counted.user"}"#, 3),
                (r#"ratelimit_server_within_limit{key="counted.user"}"#, 2),
                (r#"ratelimit_server_over_limit{key="counted.user"}"#, 1),
                (r#"ratelimit_server_total_hits{key="counted.team_red"}"#, 3),
                (
                    r#"ratelimit_server_within_limit{key="counted.team_red"}"#,
                    3,
                ),
                (r#"ratelimit_server_over_limit{key="counted.trial"}"#, 4),
                (r#"ratelimit_server_shadow_mode{key="counted.trial"}"#, 4),
                (
                    r#"ratelimit_server_within_limit{key="counted.sent_red"}"#,
                    1,
                ),
            ] {
                let line = format!("{series} {}\n", value * reload);
                assert!(text.contains(&line), "no {line:?} in\n{text}");
            }
        }
    }
}
