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

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt64Value};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ratelimit_core::{Clock, ManualClock};
use ratelimit_local::LocalStore;
use ratelimit_server::config::{Config, Unit};
use ratelimit_server::{RateLimitService, Settings};

use common::{descriptor, request};

/// envoyproxy/ratelimit's fixed window, as a model.
struct EnvoyModel {
    config: Config,
    counters: HashMap<String, u64>,
}

impl EnvoyModel {
    fn new(config: Config) -> Self {
        Self {
            config,
            counters: HashMap::new(),
        }
    }

    /// `ShouldRateLimit` at `now_s` (Unix seconds).
    fn should_rate_limit(&mut self, req: &RateLimitRequest, now_s: u64) -> RateLimitResponse {
        let n = req.descriptors.len();
        let mut limits = Vec::with_capacity(n);
        let mut unlimited = vec![false; n];
        let mut replacing = Vec::new();
        for (i, d) in req.descriptors.iter().enumerate() {
            let entries: Vec<(&str, &str)> = d
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect();
            let found = self.config.lookup(&req.domain, &entries, None);
            if let Some(f) = &found {
                replacing.extend(f.limit.replaces.clone());
                if f.limit.unlimited {
                    unlimited[i] = true;
                }
            }
            limits.push(found.filter(|f| !f.limit.unlimited));
        }
        for l in limits.iter_mut() {
            if l.as_ref()
                .is_some_and(|f| !f.limit.name.is_empty() && replacing.contains(&f.limit.name))
            {
                *l = None;
            }
        }
        let mut statuses = Vec::with_capacity(n);
        let mut failed = 0;
        let (mut quota_total, mut quota_failed) = (0, 0);
        for (i, d) in req.descriptors.iter().enumerate() {
            if unlimited[i] {
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                });
                continue;
            }
            let Some(f) = &limits[i] else {
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                });
                continue;
            };
            let hits = match &d.hits_addend {
                Some(h) => h.value,
                None => u64::from(req.hits_addend.max(1)),
            };
            let unit = f.limit.unit.expect("a limited descriptor has a unit");
            let divider = unit.seconds();
            let mut key = format!("{}_", req.domain);
            for (j, e) in d.entries.iter().enumerate() {
                let v = f.shared[j].as_deref().unwrap_or(&e.value);
                key.push_str(&format!("{}_{}_", e.key, v));
            }
            key.push_str(&(now_s / divider * divider).to_string());
            let counter = self.counters.entry(key).or_insert(0);
            *counter += hits;
            let after = *counter;
            let rpu = u64::from(f.limit.requests_per_unit);
            let over = after > rpu;
            let mut status = DescriptorStatus {
                code: if over { Code::OverLimit } else { Code::Ok } as i32,
                current_limit: Some(PbRateLimit {
                    name: f.limit.name.clone(),
                    requests_per_unit: f.limit.requests_per_unit,
                    unit: unit.proto(),
                }),
                limit_remaining: if over { 0 } else { (rpu - after) as u32 },
                duration_until_reset: Some(PbDuration {
                    seconds: (divider - now_s % divider) as i64,
                    nanos: 0,
                }),
                quota: None,
            };
            if over && f.limit.shadow_mode {
                status.code = Code::Ok as i32;
            }
            if f.limit.quota_mode {
                quota_total += 1;
                if over {
                    quota_failed += 1;
                }
            } else if status.code == Code::OverLimit as i32 {
                failed += 1;
            }
            statuses.push(status);
        }
        let over = failed > 0 || (quota_total > 0 && quota_total == quota_failed);
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
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
    let api = ["/api/a", "/api/b"][rng.random_range(0..2)];
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
fn the_default_fixed_window_answers_as_envoyproxy_ratelimit_call_for_call() {
    // 2026-12-01T10:59:58.5Z: the traffic crosses second, minute and hour
    // boundaries.
    let start = 1_796_122_798_500_000;
    let clock = ManualClock::new(start);
    let svc = service(&clock);
    let mut model = EnvoyModel::new(Config::from_yaml_str("compat.yaml", CONFIG).expect("config"));
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
    let mut model = EnvoyModel::new(Config::from_yaml_str("compat.yaml", CONFIG).expect("config"));
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
    let _ = Unit::Minute;
}
