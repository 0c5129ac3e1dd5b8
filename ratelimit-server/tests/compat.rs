//! Compatibility with envoyproxy/ratelimit's fixed window.
//!
//! A model of envoyproxy/ratelimit's Redis fixed window (its
//! `fixedRateLimitCacheImpl` and `BaseRateLimiter`, at the commit the
//! fixtures name, without the local cache and with
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` off, its defaults): one counter
//! per descriptor per calendar window, `INCRBY hits` on every request,
//! `OVER_LIMIT` when the counter after the increment exceeds the limit.
//! The same traffic goes through the service (in process, on a manual
//! clock) and through the model, and every answer is compared.
//!
//! The model reads the configuration and matches descriptors itself, from
//! the rules envoyproxy/ratelimit's README documents, sharing no code with
//! the service's configuration: a matching mistake of the service is not
//! made again by the model.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt64Value};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ratelimit_core::{Clock, ManualClock};
use ratelimit_local::LocalStore;
use ratelimit_server::config::Config;
use ratelimit_server::{RateLimitService, Settings};
use serde::Deserialize;

use common::{descriptor, request};

/// A configuration file as the model reads it: only what it models (an
/// unknown key is an error, so nothing is silently left out).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    domain: String,
    #[serde(default)]
    descriptors: Vec<Rule>,
}

/// One descriptor of the configuration: a key, perhaps a value (exact, or
/// with `*` wildcards), perhaps a rate limit, perhaps nested descriptors.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    key: String,
    value: Option<String>,
    rate_limit: Option<RuleLimit>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    share_threshold: bool,
    #[serde(default)]
    descriptors: Vec<Rule>,
}

/// A `rate_limit` block.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleLimit {
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: u32,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: String,
    #[serde(default)]
    replaces: Vec<Replaced>,
}

/// One entry of `replaces`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Replaced {
    name: String,
}

/// The units the README documents: the unit's length in seconds and its
/// value in the response.
fn unit_of(name: &str) -> (u64, PbUnit) {
    match name.to_ascii_lowercase().as_str() {
        "second" => (1, PbUnit::Second),
        "minute" => (60, PbUnit::Minute),
        "hour" => (3_600, PbUnit::Hour),
        "day" => (86_400, PbUnit::Day),
        other => panic!("the model knows no unit {other:?}"),
    }
}

/// `*` in `pattern` matches any run of characters (none included); every
/// other character matches itself. Walks both strings once, returning to
/// the last `*` when a literal stops matching.
fn glob(pattern: &str, value: &str) -> bool {
    let (p, v): (Vec<char>, Vec<char>) = (pattern.chars().collect(), value.chars().collect());
    let (mut pi, mut vi) = (0, 0);
    // The last `*` seen and where in `value` its run ends for now.
    let mut star: Option<(usize, usize)> = None;
    while vi < v.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, vi));
            pi += 1;
        } else if pi < p.len() && p[pi] == v[vi] {
            pi += 1;
            vi += 1;
        } else if let Some((sp, sv)) = star {
            // Let the `*` take one more character and try again after it.
            star = Some((sp, sv + 1));
            pi = sp + 1;
            vi = sv + 1;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// How a rule matched one entry of a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// `value` equal to the entry's value.
    Exact,
    /// A `value` with `*` matching the entry's value.
    Wildcard,
    /// No `value`: any value of the key.
    AnyValue,
}

/// The rule of `rules` for the entry `(key, value)`, the most specific
/// first (README, "Example 3": key and value before key alone), a wildcard
/// value in between (the first in the file's order; this configuration's
/// wildcards never overlap).
fn choose<'r>(rules: &'r [Rule], key: &str, value: &str) -> Option<(&'r Rule, How)> {
    let of_key = || rules.iter().filter(move |r| r.key == key);
    if let Some(r) = of_key().find(|r| r.value.as_deref() == Some(value)) {
        return Some((r, How::Exact));
    }
    if let Some(r) = of_key().find(|r| {
        r.value
            .as_deref()
            .is_some_and(|p| p.contains('*') && glob(p, value))
    }) {
        return Some((r, How::Wildcard));
    }
    of_key()
        .find(|r| r.value.is_none())
        .map(|r| (r, How::AnyValue))
}

/// Per entry of a descriptor, what its counter is kept under: the key, and
/// the entry's value or (`true`) the wildcard pattern with
/// `share_threshold`, shared by every value it matches.
type Identity = Vec<(String, String, bool)>;

/// What one descriptor matched: its rule and its counter's identity.
struct Matched<'r> {
    rule: &'r Rule,
    limit: &'r RuleLimit,
    identity: Identity,
}

/// The rate limit of one descriptor, by the README's rules: one level of
/// the configuration per entry ("Example 4": a limit applies only to a
/// descriptor with as many entries as the configuration has levels down to
/// it), the most specific rule at each level ("Example 3"), and a wildcard
/// with `share_threshold` counting all its values as one ("Sharing
/// thresholds for wildcard matches").
fn find<'r>(file: &'r ModelFile, domain: &str, entries: &[(&str, &str)]) -> Option<Matched<'r>> {
    if domain != file.domain || entries.is_empty() {
        return None;
    }
    let mut rules = &file.descriptors[..];
    let mut identity = Vec::with_capacity(entries.len());
    let mut rule = None;
    for &(key, value) in entries {
        let (r, how) = choose(rules, key, value)?;
        identity.push(match (how, &r.value) {
            (How::Wildcard, Some(pattern)) if r.share_threshold => {
                (key.to_owned(), pattern.clone(), true)
            }
            _ => (key.to_owned(), value.to_owned(), false),
        });
        rules = &r.descriptors;
        rule = Some(r);
    }
    let rule = rule?;
    Some(Matched {
        rule,
        limit: rule.rate_limit.as_ref()?,
        identity,
    })
}

/// envoyproxy/ratelimit's fixed window, as a model.
struct EnvoyModel {
    file: ModelFile,
    /// Per counter (the domain, each entry's identity, the window's start in
    /// Unix seconds), the hits counted.
    counters: HashMap<(String, Identity, u64), u64>,
}

impl EnvoyModel {
    /// The model over a configuration file's text.
    fn from_yaml(text: &str) -> Self {
        let file: ModelFile = serde_norway::from_str(text).expect("the model reads the file");
        Self {
            file,
            counters: HashMap::new(),
        }
    }

    /// `ShouldRateLimit` at `now_s` (Unix seconds).
    fn should_rate_limit(&mut self, req: &RateLimitRequest, now_s: u64) -> RateLimitResponse {
        let found: Vec<Option<Matched<'_>>> = req
            .descriptors
            .iter()
            .map(|d| {
                let entries: Vec<(&str, &str)> = d
                    .entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect();
                find(&self.file, &req.domain, &entries)
            })
            .collect();
        // A limit named by a `replaces` of any matched limit of the request
        // is dropped (README, "Replaces").
        let replaced: Vec<&str> = found
            .iter()
            .flatten()
            .flat_map(|m| m.limit.replaces.iter().map(|r| r.name.as_str()))
            .collect();
        let mut statuses = Vec::with_capacity(found.len());
        let mut failed = 0;
        for (d, m) in req.descriptors.iter().zip(&found) {
            let Some(m) = m else {
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                });
                continue;
            };
            // README, "Example 5": OK, with the most a u32 holds left.
            if m.limit.unlimited {
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                });
                continue;
            }
            if !m.limit.name.is_empty() && replaced.contains(&m.limit.name.as_str()) {
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                });
                continue;
            }
            let hits = match &d.hits_addend {
                Some(h) => h.value,
                None => u64::from(req.hits_addend.max(1)),
            };
            let (divider, unit) = unit_of(m.limit.unit.as_deref().expect("a limit has a unit"));
            let window = now_s / divider * divider;
            let counter = self
                .counters
                .entry((req.domain.clone(), m.identity.clone(), window))
                .or_insert(0);
            *counter += hits;
            let after = *counter;
            let rpu = u64::from(m.limit.requests_per_unit);
            let over = after > rpu;
            // README, "ShadowMode": whatever the outcome, OK.
            let code = if over && !m.rule.shadow_mode {
                failed += 1;
                Code::OverLimit
            } else {
                Code::Ok
            };
            statuses.push(DescriptorStatus {
                code: code as i32,
                current_limit: Some(PbRateLimit {
                    name: m.limit.name.clone(),
                    requests_per_unit: m.limit.requests_per_unit,
                    unit: unit as i32,
                }),
                limit_remaining: if over { 0 } else { (rpu - after) as u32 },
                duration_until_reset: Some(PbDuration {
                    seconds: (window + divider - now_s) as i64,
                    nanos: 0,
                }),
                quota: None,
            });
        }
        RateLimitResponse {
            overall_code: if failed > 0 {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32,
            statuses,
            ..Default::default()
        }
    }
}

const CONFIG: &str = r#"
domain: compat
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 3
  - key: remote_address
    value: 10.0.0.9
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 7
    descriptors:
      - key: path
        value: /api/*
        rate_limit:
          unit: minute
          requests_per_unit: 5
      - key: path
        value: /files/*
        share_threshold: true
        rate_limit:
          unit: minute
          requests_per_unit: 4
  - key: plan
    value: gold
    rate_limit:
      name: gold
      unit: hour
      requests_per_unit: 20
  - key: plan
    value: gold-override
    rate_limit:
      replaces:
        - name: gold
      unit: minute
      requests_per_unit: 2
  - key: trial
    shadow_mode: true
    rate_limit:
      unit: second
      requests_per_unit: 2
  - key: internal
    rate_limit:
      unlimited: true
"#;

fn service(clock: &ManualClock) -> RateLimitService {
    let config = Config::from_yaml_str("compat.yaml", CONFIG).expect("config");
    RateLimitService::new(
        Arc::new(LocalStore::with_clock(clock.clone())),
        config,
        Settings::default(),
        "local",
    )
    .expect("service settings")
}

/// One request carrying exactly one limited descriptor (perhaps with
/// unlimited, unmatched or replaced ones beside it), one hit.
fn one_limited(rng: &mut StdRng) -> RateLimitRequest {
    let ip = ["10.0.0.1", "10.0.0.2", "10.0.0.9"][rng.random_range(0..3)];
    let user = ["alice", "bob"][rng.random_range(0..2)];
    // "/api/": the wildcard's `*` matching no character.
    let api = ["/api/a", "/api/b", "/api/"][rng.random_range(0..3)];
    let file = ["/files/x.pdf", "/files/y.csv", "/files/z"][rng.random_range(0..3)];
    let mut ds = match rng.random_range(0..7) {
        0 => vec![descriptor(&[("remote_address", ip)])],
        1 => vec![descriptor(&[("user", user)])],
        2 => vec![descriptor(&[("user", user), ("path", api)])],
        3 => vec![descriptor(&[("user", user), ("path", file)])],
        4 => vec![descriptor(&[("plan", "gold")])],
        // Both match; the override replaces "gold".
        5 => vec![
            descriptor(&[("plan", "gold")]),
            descriptor(&[("plan", "gold-override")]),
        ],
        _ => vec![descriptor(&[("trial", user)])],
    };
    // Descriptors that limit nothing, on either side.
    if rng.random_bool(0.3) {
        ds.push(descriptor(&[("internal", "x")]));
    }
    if rng.random_bool(0.2) {
        ds.insert(0, descriptor(&[("unknown", "y")]));
    }
    if rng.random_bool(0.1) {
        // Deeper than any configuration: matches nothing.
        ds.push(descriptor(&[("remote_address", ip), ("extra", "1")]));
    }
    if rng.random_bool(0.2) {
        // Near misses, matching nothing: a value no rule names (and no rule
        // of the key alone), a value a wildcard's prefix nearly matches, a
        // nested key at the top level, a level below a limit.
        ds.push(match rng.random_range(0..4) {
            0 => descriptor(&[("plan", "silver")]),
            1 => descriptor(&[("user", user), ("path", "/apiary")]),
            2 => descriptor(&[("path", api)]),
            _ => descriptor(&[("user", user), ("path", file), ("more", "1")]),
        });
    }
    request("compat", ds)
}

fn run(clock: &ManualClock, svc: &RateLimitService, req: &RateLimitRequest) -> RateLimitResponse {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _ = clock;
    rt.block_on(svc.should_rate_limit(req)).expect("answer")
}

#[test]
fn the_models_wildcards_match_as_the_readme_says() {
    // README, "Example 9": trailing, middle and multiple wildcards.
    assert!(glob("value*", "value1") && glob("value*", "valueXYZ"));
    assert!(glob("value*", "value"));
    assert!(!glob("value*", "valu"));
    assert!(glob("/api/*/action", "/api/123/action"));
    assert!(glob("/api/*/action", "/api/user-id/action"));
    assert!(!glob("/api/*/action", "/api/123/other"));
    assert!(glob(
        "/api/*/resource/*/action",
        "/api/v2/resource/456/action"
    ));
    assert!(!glob("/api/*/resource/*/action", "/api/v2/resource/456"));
    // A literal after a `*` that first matches too early.
    assert!(glob("*ab", "aab") && glob("a*b*c", "abbbc") && !glob("a*b", "ba"));
    // Exact before wildcard before the key alone ("Example 3").
    let file = EnvoyModel::from_yaml(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: k\n    value: a*\n    rate_limit: {unit: second, requests_per_unit: 2}\n  - key: k\n    value: ab\n    rate_limit: {unit: second, requests_per_unit: 3}\n",
    )
    .file;
    let rpu = |v: &str| find(&file, "d", &[("k", v)]).map(|m| m.limit.requests_per_unit);
    assert_eq!(
        (rpu("ab"), rpu("abc"), rpu("b")),
        (Some(3), Some(2), Some(1))
    );
    assert_eq!(
        find(&file, "d", &[("k", "ab"), ("x", "y")]).map(|_| ()),
        None
    );
    assert_eq!(find(&file, "other", &[("k", "ab")]).map(|_| ()), None);
}

#[test]
fn the_default_fixed_window_answers_as_envoyproxy_ratelimit_call_for_call() {
    // 2026-12-01T10:59:58.5Z: the traffic crosses second, minute and hour
    // boundaries.
    let start = 1_796_122_798_500_000;
    let clock = ManualClock::new(start);
    let svc = service(&clock);
    let mut model = EnvoyModel::from_yaml(CONFIG);
    let mut rng = StdRng::seed_from_u64(22);
    let (mut ok, mut over) = (0, 0);
    for call in 0..6_000 {
        // Mostly bursts within a second, sometimes a long pause.
        let step = if rng.random_bool(0.02) {
            rng.random_range(1_000_000..90_000_000)
        } else {
            rng.random_range(0..400_000)
        };
        clock.advance_micros(step);
        let req = one_limited(&mut rng);
        let ours = run(&clock, &svc, &req);
        let theirs = model.should_rate_limit(&req, clock.now() / 1_000_000);
        assert_eq!(
            ours,
            theirs,
            "call {call} at {} µs differs:\nrequest {req:?}",
            clock.now()
        );
        if ours.overall_code == Code::Ok as i32 {
            ok += 1;
        } else {
            over += 1;
        }
    }
    // Both outcomes are common: the comparison is not vacuous.
    assert!(ok > 1_000 && over > 1_000, "ok {ok}, over {over}");
}

#[test]
fn the_documented_differences_show_where_they_should() {
    let clock = ManualClock::new(1_796_122_800_000_000);
    let svc = service(&clock);
    let mut model = EnvoyModel::from_yaml(CONFIG);
    let now_s = || clock.now() / 1_000_000;
    let with_hits = |hits: u64| {
        let mut d = descriptor(&[("user", "carol")]);
        d.hits_addend = Some(UInt64Value { value: hits });
        request("compat", vec![d])
    };

    // 1. A cost that would pass the limit (7 per minute): 5, then 3.
    //    envoyproxy/ratelimit counts the denied 3 (the counter is 8), so a
    //    later single hit is denied too; here the denied 3 counts nothing
    //    and the single hit passes (6 of 7).
    for (hits, envoy_over, ours_over) in [(5, false, false), (3, true, true), (1, true, false)] {
        let req = with_hits(hits);
        let ours = run(&clock, &svc, &req);
        let theirs = model.should_rate_limit(&req, now_s());
        assert_eq!(theirs.overall_code == Code::OverLimit as i32, envoy_over);
        assert_eq!(
            ours.overall_code == Code::OverLimit as i32,
            ours_over,
            "{ours:?}"
        );
    }

    // 2. All or nothing: "dave" spends the per-second limit of his address
    //    (3), then sends his address and his user together: the request is
    //    denied by the address, and his user's minute limit (7) is not
    //    charged here, while envoyproxy/ratelimit charges it.
    for _ in 0..3 {
        let req = request(
            "compat",
            vec![descriptor(&[("remote_address", "10.0.0.5")])],
        );
        assert_eq!(run(&clock, &svc, &req).overall_code, Code::Ok as i32);
        model.should_rate_limit(&req, now_s());
    }
    let both = request(
        "compat",
        vec![
            descriptor(&[("remote_address", "10.0.0.5")]),
            descriptor(&[("user", "dave")]),
        ],
    );
    let ours = run(&clock, &svc, &both);
    let theirs = model.should_rate_limit(&both, now_s());
    assert_eq!(ours.overall_code, Code::OverLimit as i32);
    assert_eq!(theirs.overall_code, Code::OverLimit as i32);
    // Ours: the user's own status says OK with all 7 left (not counted).
    assert_eq!(ours.statuses[1].code, Code::Ok as i32);
    assert_eq!(ours.statuses[1].limit_remaining, 7);
    // envoyproxy/ratelimit: OK too, but 6 left: it counted the denied call.
    assert_eq!(theirs.statuses[1].limit_remaining, 6);

    // 3. A descriptor that can never pass (requests_per_unit 0) denies the
    //    request and nothing else is counted.
    let blocked = request(
        "compat",
        vec![
            descriptor(&[("remote_address", "10.0.0.9")]),
            descriptor(&[("user", "erin")]),
        ],
    );
    let ours = run(&clock, &svc, &blocked);
    assert_eq!(ours.overall_code, Code::OverLimit as i32);
    assert_eq!(ours.statuses[0].code, Code::OverLimit as i32);
    let alone = request("compat", vec![descriptor(&[("user", "erin")])]);
    let ours = run(&clock, &svc, &alone);
    assert_eq!(
        ours.statuses[0].limit_remaining, 6,
        "erin was not charged before"
    );

    // 4. The unit boundary resets both.
    clock.advance(Duration::from_secs(60));
    let req = with_hits(7);
    let ours = run(&clock, &svc, &req);
    let theirs = model.should_rate_limit(&req, now_s());
    assert_eq!(ours, theirs);
}
