//! envoyproxy/ratelimit's own configuration files: the good ones load
//! unchanged and match as envoyproxy/ratelimit matches (the expectations of
//! its `test/config/config_test.go`), the ones it rejects are rejected with
//! the file, the place and a fix.

mod common;

use std::path::PathBuf;

use ratelimit_core::AlgorithmKind;
use ratelimit_server::config::{Config, LoadOptions, Unit};

use common::fixture;

fn load(name: &str) -> Config {
    Config::load(&[PathBuf::from(fixture(name))], LoadOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn limit(config: &Config, domain: &str, entries: &[(&str, &str)]) -> Option<(u32, Unit)> {
    config
        .lookup(domain, entries, None)
        .map(|f| (f.limit.requests_per_unit, f.limit.unit.expect("unit")))
}

#[test]
fn every_example_file_loads_unchanged() {
    let dir = PathBuf::from(fixture(""));
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("fixtures") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            Config::load(std::slice::from_ref(&path), LoadOptions::default())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert!(n >= 9, "{n} files");
}

#[test]
fn matching_follows_envoyproxy_ratelimit() {
    let c = load("test__config__basic_config.yaml");
    let d = "test-domain";
    // Unknown domain and unknown key: no limit.
    assert_eq!(limit(&c, "foo_domain", &[("foo", "bar")]), None);
    assert_eq!(limit(&c, d, &[("foo", "bar")]), None);
    // key1_value1 has no limit of its own; its subkey1 does, most specific
    // value first.
    assert_eq!(limit(&c, d, &[("key1", "value1")]), None);
    assert_eq!(
        limit(&c, d, &[("key1", "value1"), ("subkey1", "something")]),
        Some((5, Unit::Second))
    );
    assert_eq!(
        limit(&c, d, &[("key1", "value1"), ("subkey1", "subvalue1")]),
        Some((10, Unit::Second))
    );
    assert_eq!(
        limit(&c, d, &[("key2", "something")]),
        Some((20, Unit::Minute))
    );
    assert_eq!(
        limit(&c, d, &[("key2", "value2")]),
        Some((30, Unit::Minute))
    );
    // Whitelisted: a key/value without a limit.
    assert_eq!(limit(&c, d, &[("key2", "value3")]), None);
    // Deeper than the configuration: no limit.
    assert_eq!(limit(&c, d, &[("key2", "value2"), ("subkey", "x")]), None);
    assert_eq!(limit(&c, d, &[("key3", "foo")]), Some((1, Unit::Hour)));
    assert_eq!(
        limit(&c, d, &[("key5", "value5"), ("subkey5", "subvalue5")]),
        Some((25, Unit::Day))
    );
    let key4 = c.lookup(d, &[("key4", "x")], None).expect("key4");
    assert_eq!(key4.limit.name, "key4_rate_limit");
    assert!(
        c.lookup(d, &[("key6", "x")], None)
            .expect("key6")
            .limit
            .unlimited
    );
    // detailed_metric puts the value in the metrics key.
    let key7 = c.lookup(d, &[("key7", "unspecified")], None).expect("key7");
    assert_eq!(&*key7.metric_key, "test-domain.key7_unspecified");
    assert_eq!(
        &*c.lookup(d, &[("key3", "foo")], None)
            .expect("key3")
            .metric_key,
        "test-domain.key3"
    );
}

#[test]
fn wildcards_and_shared_thresholds_match_as_envoyproxy_ratelimit() {
    let c = load("test__config__wildcard.yaml");
    let d = "test-domain";
    assert_eq!(limit(&c, d, &[("wild", "foo1")]), Some((20, Unit::Minute)));
    assert_eq!(limit(&c, d, &[("wild", "foo")]), Some((20, Unit::Minute)));
    assert_eq!(limit(&c, d, &[("wild", "fo")]), None);
    assert_eq!(limit(&c, d, &[("noWild", "foo1")]), None);
    assert_eq!(
        limit(&c, d, &[("noVal", "anything")]),
        Some((20, Unit::Minute))
    );
    assert_eq!(
        limit(&c, d, &[("midWild", "barab")]),
        Some((20, Unit::Minute))
    );
    assert_eq!(limit(&c, d, &[("midWild", "barba")]), None);
    assert_eq!(
        limit(&c, d, &[("multiWild", "foo1bar2baz")]),
        Some((10, Unit::Minute))
    );
    assert_eq!(
        limit(&c, d, &[("nestedWild", "val1"), ("wild", "goo2")]),
        Some((20, Unit::Minute))
    );

    let s = load("test__config__share_threshold.yaml");
    let a = s
        .lookup(d, &[("files", "files/a.pdf")], None)
        .expect("files/a");
    let b = s
        .lookup(d, &[("files", "files/b.csv")], None)
        .expect("files/b");
    assert_eq!(a.shared, vec![Some("files/*".to_owned())]);
    assert_eq!(
        ratelimit_server::service::state_name(&[("files", "files/a.pdf")], &a.shared),
        ratelimit_server::service::state_name(&[("files", "files/b.csv")], &b.shared),
        "share_threshold: one state for every match"
    );
    // An explicit value wins over the wildcard.
    assert_eq!(limit(&s, d, &[("file", "test1")]), Some((50, Unit::Minute)));
    assert_eq!(
        limit(&s, d, &[("file", "test2")]),
        Some((100, Unit::Minute))
    );
    // value_to_metric with share_threshold: the pattern in the metrics key.
    let r = s
        .lookup(d, &[("route", "api/v1"), ("method", "GET")], None)
        .expect("route");
    assert_eq!(&*r.metric_key, "test-domain.route_api/*.method");
}

#[test]
fn the_files_envoyproxy_ratelimit_rejects_are_rejected_with_the_place_and_a_fix() {
    let cases = [
        (
            "bad_limit_unit.yaml",
            "invalid rate limit unit 'foo'",
            "descriptors[0] (key1=value1), rate_limit.unit",
        ),
        ("bad_yaml.yaml", "error loading config file", ""),
        (
            "duplicate_key.yaml",
            "duplicate descriptor composite key 'test-domain.key1_value1'",
            "descriptors[1]",
        ),
        (
            "empty_domain.yaml",
            "config file cannot have empty domain",
            "",
        ),
        (
            "empty_key.yaml",
            "descriptor has empty key",
            "descriptors[0]",
        ),
        (
            "misspelled_key.yaml",
            "unknown key 'ratelimit'",
            "descriptors[0]",
        ),
        (
            "misspelled_key2.yaml",
            "unknown key 'requestsperunit'",
            "rate_limit",
        ),
        (
            "non_map_list.yaml",
            "list of type other than map",
            "descriptors[0]",
        ),
        ("non_string_key.yaml", "key is not of type string", ""),
        (
            "replaces_empty.yaml",
            "should not have an empty replaces entry",
            "replaces[0]",
        ),
        (
            "replaces_self.yaml",
            "replaces should not contain name of same descriptor",
            "replaces[0]",
        ),
        (
            "unlimited_with_unit.yaml",
            "should not specify rate limit unit when unlimited",
            "descriptors[0] (foo)",
        ),
    ];
    for (file, message, place) in cases {
        let path = PathBuf::from(fixture(&format!("bad/{file}")));
        let e = Config::load(&[path], LoadOptions::default()).expect_err(file);
        assert!(e.file.ends_with(file), "{file}: {e}");
        assert!(e.message.contains(message), "{file}: {e}");
        assert!(e.path.contains(place), "{file}: {e}");
        assert!(!e.fix.is_empty(), "{file}: {e}");
        assert!(e.to_string().contains("fix: "), "{e}");
    }
    // A second file of the same domain, unless merging is asked for.
    let two = [
        PathBuf::from(fixture("test__config__basic_config.yaml")),
        PathBuf::from(fixture("bad/duplicate_domain.yaml")),
    ];
    let e = Config::load(&two, LoadOptions::default()).expect_err("duplicate domain");
    assert!(e.message.contains("duplicate domain 'test-domain'"), "{e}");
    assert!(e.fix.contains("--merge-domains"), "{e}");
    let merged = Config::load(
        &two,
        LoadOptions {
            merge_domains: true,
            ..LoadOptions::default()
        },
    );
    assert!(merged.is_ok());
}

#[test]
fn the_algorithm_extension_is_read_and_checked() {
    let ok = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n      algorithm: token_bucket\n      burst: 20\n  - key: login\n    rate_limit:\n      unit: hour\n      requests_per_unit: 5\n      algorithm: sliding_log\n";
    let c = Config::from_yaml_str("ext.yaml", ok).expect("valid");
    let k = c.lookup("d", &[("k", "a")], None).expect("k");
    assert_eq!(k.limit.algorithm, AlgorithmKind::TokenBucket);
    assert_eq!(k.limit.quota.as_ref().expect("quota").limit(), 20);
    let l = c.lookup("d", &[("login", "a")], None).expect("login");
    assert_eq!(l.limit.algorithm, AlgorithmKind::SlidingLog);

    let bad = [
        (
            "algorithm: leaky_bucket",
            "unknown algorithm 'leaky_bucket'",
            "token_bucket",
        ),
        (
            "algorithm: fixed_window\n      burst: 3",
            "burst is given for the fixed_window",
            "algorithm: token_bucket",
        ),
    ];
    for (extra, message, fix) in bad {
        let text = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n      {extra}\n"
        );
        let e = Config::from_yaml_str("ext.yaml", &text).expect_err(extra);
        assert!(e.message.contains(message), "{e}");
        assert!(e.fix.contains(fix), "{e}");
        assert!(e.path.contains("descriptors[0] (k), rate_limit"), "{e}");
    }
    let too_long = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requests_per_unit: 200000\n      algorithm: sliding_log\n";
    let e = Config::from_yaml_str("ext.yaml", too_long).expect_err("sliding log cap");
    assert!(e.fix.contains("sliding_window"), "{e}");
}

#[test]
fn metrics_labels_show_values_only_where_asked() {
    let c = Config::from_yaml_str(
        "labels.yaml",
        "domain: d
descriptors:
  - key: plan
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: ip
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    value: api*
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: tenant
    value: t*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: route
    descriptors:
      - key: method
        value: GET
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: team
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: zone
    value: z*
    share_threshold: true
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
",
    )
    .expect("config");
    let label = |entries: &[(&str, &str)]| -> String {
        c.lookup("d", entries, None)
            .unwrap_or_else(|| panic!("{entries:?} matches"))
            .metric_key
            .to_string()
    };
    // The limit's own path: by value, by key, nested, a wildcard's pattern.
    assert_eq!(label(&[("plan", "gold")]), "d.plan_gold");
    assert_eq!(label(&[("user", "u42")]), "d.user");
    assert_eq!(
        label(&[("route", "r"), ("method", "GET")]),
        "d.route.method_GET"
    );
    assert_eq!(label(&[("path", "api/v1")]), "d.path_api*");
    // The request's value: value_to_metric, on a key and on a wildcard.
    assert_eq!(label(&[("ip", "10.0.0.1")]), "d.ip_10.0.0.1");
    assert_eq!(label(&[("tenant", "t7")]), "d.tenant_t7");
    // detailed_metric: every entry with its value.
    assert_eq!(label(&[("team", "core")]), "d.team_core");
    // detailed_metric with share_threshold: the shared pattern stands for
    // the value, in the label and in the state's identity.
    assert_eq!(label(&[("zone", "z9")]), "d.zone_z*");
    let z = c.lookup("d", &[("zone", "z9")], None).expect("zone");
    assert_eq!(z.shared, vec![Some("z*".to_owned())]);
    // A label that is the limit's path is the limit's own, not a copy.
    let f = c.lookup("d", &[("plan", "gold")], None).expect("plan");
    assert!(std::sync::Arc::ptr_eq(&f.metric_key, &f.limit.full_key));
    assert!(f.shared.is_empty());
}
