//! Good files in all three formats read as the quotas the Rust constructors
//! build; every bad file is rejected with the place, the policy, and what to
//! change.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ratelimit_config::{Error, Format};
use ratelimit_core::{MAX_EXACT, Quota, Rate};

fn file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/files")
        .join(rel)
}

fn expected() -> Vec<Quota> {
    vec![
        Quota::token_bucket(Rate::per_minute(100), 20)
            .and_then(|q| q.named("api"))
            .unwrap(),
        Quota::sliding_log(Rate::new(5, Duration::from_secs(900)))
            .and_then(|q| q.named("login"))
            .unwrap(),
        Quota::sliding_window(Rate::per_hour(1000))
            .and_then(|q| q.named("search"))
            .unwrap(),
        Quota::fixed_window(Rate::new(10, Duration::from_millis(1500)))
            .and_then(|q| q.named("legacy"))
            .unwrap(),
    ]
}

#[test]
fn good_files_in_every_format_read_as_the_same_quotas() {
    for name in ["policies.toml", "policies.yaml", "policies.json"] {
        let path = file(&format!("good/{name}"));
        let quotas = ratelimit_config::from_path(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(quotas, expected(), "{name}");
    }
}

#[test]
fn explicit_format_functions_agree_with_the_extension() {
    let read = |name: &str| std::fs::read_to_string(file(&format!("good/{name}"))).unwrap();
    assert_eq!(
        ratelimit_config::from_toml_str(&read("policies.toml")).unwrap(),
        expected()
    );
    assert_eq!(
        ratelimit_config::from_yaml_str(&read("policies.yaml")).unwrap(),
        expected()
    );
    assert_eq!(
        ratelimit_config::from_json_str(&read("policies.json")).unwrap(),
        expected()
    );
    assert_eq!(Format::from_path("a/b.YML"), Some(Format::Yaml));
    assert_eq!(Format::from_path("b.json"), Some(Format::Json));
    assert_eq!(Format::from_path("b.conf"), None);
    assert_eq!(Format::from_path("toml"), None);
}

/// One bad file: where the error must point, which policy it must name, and
/// words its message must contain.
struct Bad {
    file: &'static str,
    location: &'static str,
    policy: Option<&'static str>,
    says: &'static [&'static str],
}

const BAD: &[Bad] = &[
    Bad {
        file: "unit.toml",
        location: "policies[0].rate",
        policy: Some("api"),
        says: &[
            "unknown unit \"fortnight\"",
            "line 4",
            "<count>/<period>",
            "units us, ms, s",
        ],
    },
    Bad {
        file: "zero_burst.toml",
        location: "policies[0].burst",
        policy: Some("api"),
        says: &["burst must be greater than zero", "at least 1"],
    },
    Bad {
        file: "zero_window.yaml",
        location: "policies[0].window",
        policy: Some("login"),
        says: &["window must be greater than zero", "e.g. \"1m\""],
    },
    Bad {
        file: "zero_rate.yaml",
        location: "policies[0].rate",
        policy: Some("api"),
        says: &["rate must be greater than zero", "\"100/min\""],
    },
    Bad {
        file: "negative.toml",
        location: "policies[1].burst",
        policy: Some("api"),
        says: &["-1 is negative", "line 11 column 9", "at least 1"],
    },
    Bad {
        file: "non_integer.json",
        location: "policies[0].limit",
        policy: Some("search"),
        says: &["99.5 is not a whole number", "line 1", "e.g. 100"],
    },
    Bad {
        file: "non_integer_rate.toml",
        location: "policies[0].rate",
        policy: Some("api"),
        says: &["the count \"1.5\" is not a whole number"],
    },
    Bad {
        file: "string_burst.json",
        location: "policies[0].burst",
        policy: Some("api"),
        says: &["invalid type: string \"20\"", "a whole number"],
    },
    Bad {
        file: "missing_burst.yaml",
        location: "policies[0].burst",
        policy: Some("api"),
        says: &["missing `burst`", "token_bucket needs", "e.g. 20"],
    },
    Bad {
        file: "missing_algorithm.json",
        location: "policies[0].algorithm",
        policy: Some("api"),
        says: &["missing `algorithm`", "\"token_bucket\""],
    },
    Bad {
        file: "unknown_field.toml",
        location: "policies[0].bursts",
        policy: Some("api"),
        says: &["unknown field `bursts`", "line 5", "`burst`"],
    },
    Bad {
        file: "unknown_top_level.yaml",
        location: "policy",
        policy: None,
        says: &["unknown field `policy`", "`policies`"],
    },
    Bad {
        file: "unknown_algorithm.yaml",
        location: "policies[0].algorithm",
        policy: Some("api"),
        says: &[
            "unknown variant `leaky_bucket`",
            "line 3",
            "\"sliding_log\"",
        ],
    },
    Bad {
        file: "burst_on_window.toml",
        location: "policies[0].burst",
        policy: Some("search"),
        says: &[
            "`burst` does not apply to algorithm \"sliding_window\"",
            "remove `burst`",
        ],
    },
    Bad {
        file: "rate_on_window.json",
        location: "policies[0].rate",
        policy: Some("search"),
        says: &["`rate` does not apply", "limit = 100 and window = \"1m\""],
    },
    Bad {
        file: "window_without_unit.toml",
        location: "policies[0].window",
        policy: Some("login"),
        says: &["invalid type: integer `900`", "with a unit"],
    },
    Bad {
        file: "window_too_long.toml",
        location: "policies[0].window",
        policy: Some("yearly"),
        says: &["window must be at most 400d;"],
    },
    Bad {
        file: "out_of_range.yaml",
        location: "policies[0].limit",
        policy: Some("huge"),
        says: &["out of range", "use a token bucket"],
    },
    Bad {
        file: "huge_burst.toml",
        location: "policies[0].burst",
        policy: Some("api"),
        says: &[
            "burst is out of range",
            "at 7 per 3d is too large",
            "lower the burst",
        ],
    },
    Bad {
        file: "too_precise.toml",
        location: "policies[0].window",
        policy: Some("fast"),
        says: &["whole number of microseconds"],
    },
    Bad {
        file: "bad_name.toml",
        location: "policies[0].name",
        policy: Some("api key"),
        says: &["invalid policy name \"api key\"", "A-Z a-z 0-9 _ - ."],
    },
    Bad {
        file: "duplicate_name.yaml",
        location: "policies[2].name",
        policy: Some("api"),
        says: &["already defined by policies[0]", "its own name"],
    },
    Bad {
        file: "float_count.yaml",
        location: "policies[0].burst",
        policy: Some("api"),
        says: &[
            "1000.0 is written as a decimal number",
            "without a decimal point",
        ],
    },
    Bad {
        file: "not_a_map.json",
        location: "(top level)",
        policy: None,
        says: &["the file is a list, not a map", "top-level `policies` key"],
    },
    Bad {
        file: "duplicate_key.toml",
        location: "policies[1].limit",
        policy: Some("login"),
        says: &[
            "`limit` is written twice in this policy",
            "line 12 column 1",
            "keep one `limit` and remove the other",
        ],
    },
    Bad {
        file: "duplicate_key.yaml",
        location: "policies[0].name",
        policy: Some("api"),
        says: &[
            "`name` is written twice in this policy",
            "line 6 column 5",
            "keep one `name` and remove the other",
        ],
    },
    Bad {
        file: "duplicate_key.json",
        location: "policies[0].rate",
        policy: Some("api"),
        says: &[
            "`rate` is written twice in this policy",
            "line 2",
            "keep one `rate` and remove the other",
        ],
    },
    Bad {
        file: "huge_count.toml",
        location: "policies[0].burst",
        policy: Some("api"),
        says: &[
            "18446744073709551616 is out of range",
            "from 1 to 9007199254740991 (2^53 - 1)",
            "line 5 column 9",
        ],
    },
    Bad {
        file: "huge_count.yaml",
        location: "policies[0].limit",
        policy: Some("login"),
        says: &[
            "18446744073709551616 is out of range",
            "from 1 to 9007199254740991 (2^53 - 1)",
            "line 4",
        ],
    },
    Bad {
        file: "shadow_not_a_boolean.yaml",
        location: "policies[0].shadow",
        policy: Some("api"),
        says: &["expected a boolean", "shadow is true or false"],
    },
    Bad {
        file: "empty.toml",
        location: "policies",
        policy: None,
        says: &["missing `policies`"],
    },
];

#[test]
fn every_bad_file_names_the_field_the_policy_and_the_fix() {
    for bad in BAD {
        let path = file(&format!("bad/{}", bad.file));
        let err = match ratelimit_config::from_path(&path) {
            Ok(q) => panic!("{} was accepted: {q:?}", bad.file),
            Err(e) => e,
        };
        let Error::Invalid {
            location,
            policy,
            fix,
            ..
        } = &err
        else {
            panic!("{}: expected a located error, got {err:?}", bad.file);
        };
        assert_eq!(location, bad.location, "{}: {err}", bad.file);
        assert_eq!(policy.as_deref(), bad.policy, "{}: {err}", bad.file);
        assert!(!fix.is_empty(), "{}: no fix in {err}", bad.file);
        let text = err.to_string();
        assert!(text.starts_with(bad.location), "{}: {text}", bad.file);
        if let Some(name) = bad.policy {
            assert!(text.contains(&format!("(policy {name:?})")), "{text}");
        }
        for fragment in bad.says {
            assert!(
                text.contains(fragment),
                "{}: {text:?} lacks {fragment:?}",
                bad.file
            );
        }
    }
    // Every bad file is in the table, and the table has more than a dozen.
    let on_disk = std::fs::read_dir(file("bad")).unwrap().count();
    assert_eq!(on_disk, BAD.len() + 3, "malformed.* are checked separately");
    assert!(BAD.len() >= 12);
}

#[test]
fn malformed_files_are_syntax_errors_with_a_line() {
    for (name, format, says) in [
        ("malformed.toml", Format::Toml, "line 2 column 12"),
        ("malformed.yaml", Format::Yaml, "line 3 column 4"),
        ("malformed.json", Format::Json, "trailing comma at line 1"),
    ] {
        let err = ratelimit_config::from_path(file(&format!("bad/{name}"))).unwrap_err();
        let Error::Syntax { format: f, message } = &err else {
            panic!("{name}: {err:?}");
        };
        assert_eq!(*f, format);
        assert!(message.contains(says), "{name}: {message}");
        assert!(err.to_string().starts_with(&format!("not valid {format}")));
    }
}

#[test]
fn unreadable_and_unnamed_files_say_so() {
    let err = ratelimit_config::from_path("no/such/policies.toml").unwrap_err();
    assert!(matches!(err, Error::Read { .. }), "{err:?}");
    let err = ratelimit_config::from_path("policies.ini").unwrap_err();
    assert!(matches!(err, Error::UnknownFormat { .. }), "{err:?}");
    assert!(err.to_string().contains("from_toml_str"), "{err}");
    let err = ratelimit_config::from_json_str(r#"{"policies": []}"#).unwrap_err();
    assert_eq!(err.location(), Some("policies"));
    let err = ratelimit_config::from_yaml_str("policies: [5]").unwrap_err();
    assert_eq!(err.location(), Some("policies[0]"));
    assert!(
        err.to_string()
            .contains("the policy is a number, not a map"),
        "{err}"
    );
}

type Constructor = fn(Rate) -> Result<Quota, ratelimit_core::ConfigError>;

/// The file accepts exactly what the constructors accept, and on rejection
/// reports the constructor's own message, its durations written as in a
/// file (`400d` where the constructor says `34560000s`).
#[test]
fn the_rules_are_the_constructors_rules() {
    let limits = [0, 1, 100, 150_000_000, 1_000_000, MAX_EXACT, MAX_EXACT + 1];
    let windows = [
        ("0s", Duration::ZERO),
        ("1us", Duration::from_micros(1)),
        ("0.5us", Duration::from_nanos(500)),
        ("1.0000005s", Duration::from_nanos(1_000_000_500)),
        ("1m", Duration::from_secs(60)),
        ("1d", Duration::from_secs(86_400)),
        ("400d", Duration::from_secs(400 * 86_400)),
        ("401d", Duration::from_secs(401 * 86_400)),
    ];
    // How the constructors print these durations, and how the file's
    // messages do.
    let rewritten: &[(&str, &str)] = &[("60s", "1m"), ("86400s", "1d"), ("34560000s", "400d")];
    let window_algorithms: [(&str, Constructor); 3] = [
        ("fixed_window", Quota::fixed_window),
        ("sliding_window", Quota::sliding_window),
        ("sliding_log", Quota::sliding_log),
    ];
    let mut checked = 0;
    for &limit in &limits {
        for &(text, window) in &windows {
            for (alg, build) in window_algorithms {
                let json = format!(
                    r#"{{"policies": [{{"name": "p", "algorithm": "{alg}", "limit": {limit}, "window": "{text}"}}]}}"#
                );
                let direct = build(Rate::new(limit, window)).and_then(|q| q.named("p"));
                compare(&json, direct, rewritten);
                checked += 1;
            }
            for burst in [0, 1, 20, MAX_EXACT] {
                let json = format!(
                    r#"{{"policies": [{{"name": "p", "algorithm": "token_bucket", "rate": "{limit}/{text}", "burst": {burst}}}]}}"#
                );
                let direct =
                    Quota::token_bucket(Rate::new(limit, window), burst).and_then(|q| q.named("p"));
                compare(&json, direct, rewritten);
                checked += 1;
            }
        }
    }
    assert_eq!(checked, limits.len() * windows.len() * 7);
}

fn compare(
    json: &str,
    direct: Result<Quota, ratelimit_core::ConfigError>,
    rewritten: &[(&str, &str)],
) {
    let read = ratelimit_config::from_json_str(json);
    match (read, direct) {
        (Ok(read), Ok(direct)) => assert_eq!(read, vec![direct], "{json}"),
        (Err(Error::Invalid { problem, .. }), Err(direct)) => {
            let mut want = direct.to_string();
            for (debug, human) in rewritten {
                want = want
                    .replace(&format!("most {debug}"), &format!("most {human}"))
                    .replace(&format!("per {debug} "), &format!("per {human} "));
            }
            assert_eq!(problem, want, "{json}")
        }
        (read, direct) => panic!("{json}: file {read:?}, constructor {direct:?}"),
    }
}

/// A key written twice names the key, the policy and the line, and says to
/// remove one; the parsers' own words ("duplicate key", "duplicate field")
/// came with the fix for a missing `policies` key, or with none.
#[test]
fn a_key_written_twice_is_named_with_its_policy_and_line_in_every_format() {
    let cases = [
        (
            Format::Toml,
            "[[policies]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nname = \"web\"\n",
            "policies[0].name",
            Some("api"),
            "`name` is written twice in this policy (the second at line 4 column 1)",
        ),
        (
            Format::Yaml,
            "policies:\n  - name: api\n    algorithm: token_bucket\n    rate: 1/s\n    burst: 1\n    burst: 2\n",
            "policies[0].burst",
            Some("api"),
            "`burst` is written twice in this policy (the second at line 6 column 5)",
        ),
        (
            Format::Json,
            r#"{"policies": [{"name": "api", "algorithm": "token_bucket", "name": "web"}]}"#,
            "policies[0].name",
            Some("api"),
            "`name` is written twice in this policy (the second at line 1 column ",
        ),
        (
            Format::Yaml,
            "policies: []\npolicies: []\n",
            "policies",
            None,
            "`policies` is written twice in one map (the second at line 2 column 1)",
        ),
        (
            Format::Json,
            r#"{"policies": [], "policies": []}"#,
            "policies",
            None,
            "`policies` is written twice in one map (the second at line 1 column ",
        ),
        (
            Format::Toml,
            "policies = [{ name = \"api\", name = \"web\" }]\n",
            "policies",
            None,
            "`name` is written twice in one table (the second at line 1 column 29)",
        ),
    ];
    for (format, text, location, policy, says) in cases {
        let err = ratelimit_config::from_str(text, format).unwrap_err();
        let message = err.to_string();
        assert_eq!(err.location(), Some(location), "{format}: {message}");
        assert_eq!(err.policy(), policy, "{format}: {message}");
        assert!(message.contains(says), "{format}: {message}");
        assert!(message.contains("and remove the other"), "{message}");
        assert!(!message.contains("top-level `policies` key"), "{message}");
    }
}

/// 2^64 does not fit a `u64`: the message names the field and the range a
/// count may take, in TOML and YAML (whose numbers the crate used to read
/// into JSON values first) as in JSON; so does a number past 2^128.
#[test]
fn a_count_beyond_u64_names_its_field_and_the_accepted_range() {
    let huge = "18446744073709551616";
    let bigger = "1606938044258990275541962092341162602522202993782792835301376";
    for (format, text, location) in [
        (
            Format::Toml,
            format!(
                "[[policies]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nrate = \"1/s\"\nburst = {huge}\n"
            ),
            "policies[0].burst",
        ),
        (
            Format::Toml,
            format!(
                "[[policies]]\nname = \"api\"\nalgorithm = \"sliding_log\"\nwindow = \"1s\"\nlimit = {bigger}\n"
            ),
            "policies[0].limit",
        ),
        (
            Format::Yaml,
            format!(
                "policies:\n  - name: api\n    algorithm: token_bucket\n    rate: 1/s\n    burst: {huge}\n"
            ),
            "policies[0].burst",
        ),
        (
            Format::Yaml,
            format!(
                "policies:\n  - {{name: api, algorithm: fixed_window, window: 1s, limit: {huge}}}\n"
            ),
            "policies[0].limit",
        ),
        (
            Format::Json,
            format!(
                r#"{{"policies": [{{"name": "api", "algorithm": "token_bucket", "rate": "1/s", "burst": {huge}}}]}}"#
            ),
            "policies[0].burst",
        ),
    ] {
        let err = ratelimit_config::from_str(&text, format).unwrap_err();
        let message = err.to_string();
        assert_eq!(err.location(), Some(location), "{format}: {message}");
        assert_eq!(err.policy(), Some("api"), "{format}: {message}");
        assert!(
            message.contains(
                "is out of range: a count is a whole number from 1 to 9007199254740991 (2^53 - 1)"
            ),
            "{format}: {message}"
        );
        assert!(!message.contains("JSON"), "{format}: {message}");
    }
}

/// A document nested 100,000 deep is refused by the depth limit, found on
/// the text before any parser reads it (the YAML parser's time grows with
/// the square of the depth: 24 s and more for this one).
#[test]
fn a_document_nested_100000_deep_is_refused_by_the_depth_limit() {
    const N: usize = 100_000;
    let nested = |open: &str, close: &str| format!("{}{}", open.repeat(N), close.repeat(N));
    for (format, text) in [
        (Format::Yaml, format!("policies: {}", nested("[", "]"))),
        (Format::Yaml, format!("policies: {}", nested("{a: ", "}"))),
        (Format::Yaml, format!("policies:\n{}x\n", "- ".repeat(N))),
        (Format::Toml, format!("policies = {}", nested("[", "]"))),
        (Format::Toml, format!("x = {}", nested("{a = ", "}"))),
        (
            Format::Json,
            format!("{{\"policies\": {}}}", nested("[", "]")),
        ),
    ] {
        let err = ratelimit_config::from_str(&text, format).unwrap_err();
        let Error::TooDeep {
            format: f,
            limit,
            line,
            ..
        } = err
        else {
            panic!("{format}: {err}");
        };
        assert_eq!((f, limit), (format, ratelimit_config::MAX_DEPTH));
        assert!(line <= 2, "{format}: line {line}");
        assert!(
            err.to_string().contains("deeper than 64 levels"),
            "{format}: {err}"
        );
    }
    // Nesting within the limit is read as before: here, a list where a
    // count belongs.
    let err = ratelimit_config::from_json_str(
        r#"{"policies": [{"name": "api", "algorithm": "token_bucket", "rate": "1/s", "burst": [[[[[1]]]]]}]}"#,
    )
    .unwrap_err();
    assert_eq!(err.location(), Some("policies[0].burst"), "{err}");
}

/// Bounds are printed as a person writes a duration (`400d`, `3d`), not in
/// raw seconds (`34560000s`, `259200s`).
#[test]
fn bounds_in_messages_are_written_in_human_units() {
    let err = ratelimit_config::from_yaml_str(
        "policies:\n  - {name: yearly, algorithm: fixed_window, limit: 10, window: 401d}\n",
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("window must be at most 400d;"),
        "{err}"
    );
    let err = ratelimit_config::from_toml_str(
        "[[policies]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nrate = \"100/401d\"\nburst = 1\n",
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("period must be at most 400d;"),
        "{err}"
    );
    let err = ratelimit_config::from_toml_str(
        "[[policies]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nrate = \"7/72h\"\nburst = 9007199254740991\n",
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("at 7 per 3d is too large"),
        "{err}"
    );
    assert!(!err.to_string().contains("259200s"), "{err}");
}
