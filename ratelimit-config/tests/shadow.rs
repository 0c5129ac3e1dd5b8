//! Shadow (dry-run) policies: `shadow = true` in a file, read with the
//! `policies_*` functions and added to a limiter as shadow quotas; the
//! functions that return plain quotas refuse them.

use ratelimit_config::{Error, Format, Policy};
use ratelimit_core::{Limiter, LimiterBuilder, Quota, Rate};

const TOML: &str = r#"
[[policies]]
name = "api"
algorithm = "token_bucket"
rate = "100/min"
burst = 20

[[policies]]
name = "api-trial"
algorithm = "sliding_window"
limit = 50
window = "1m"
shadow = true

[[policies]]
name = "login"
algorithm = "sliding_log"
limit = 5
window = "15m"
shadow = false
"#;

const YAML: &str = "
policies:
  - {name: api, algorithm: token_bucket, rate: 100/min, burst: 20}
  - {name: api-trial, algorithm: sliding_window, limit: 50, window: 1m, shadow: true}
  - {name: login, algorithm: sliding_log, limit: 5, window: 15m, shadow: false}
";

const JSON: &str = r#"{"policies": [
  {"name": "api", "algorithm": "token_bucket", "rate": "100/min", "burst": 20},
  {"name": "api-trial", "algorithm": "sliding_window", "limit": 50, "window": "1m", "shadow": true},
  {"name": "login", "algorithm": "sliding_log", "limit": 5, "window": "15m", "shadow": false}
]}"#;

fn expected() -> Vec<Policy> {
    vec![
        Policy::new(
            Quota::token_bucket(Rate::per_minute(100), 20)
                .and_then(|q| q.named("api"))
                .unwrap(),
            false,
        ),
        Policy::new(
            Quota::sliding_window(Rate::per_minute(50))
                .and_then(|q| q.named("api-trial"))
                .unwrap(),
            true,
        ),
        Policy::new(
            Quota::sliding_log(Rate::new(5, std::time::Duration::from_secs(900)))
                .and_then(|q| q.named("login"))
                .unwrap(),
            false,
        ),
    ]
}

/// A builder over the in-process store.
#[allow(deprecated)] // whichever name the in-process store goes by
fn builder() -> LimiterBuilder {
    Limiter::builder(ratelimit_local::DashMapStore::new())
}

#[test]
fn shadow_policies_are_read_with_their_flag_in_every_format() {
    assert_eq!(
        ratelimit_config::policies_from_toml_str(TOML).unwrap(),
        expected()
    );
    assert_eq!(
        ratelimit_config::policies_from_yaml_str(YAML).unwrap(),
        expected()
    );
    assert_eq!(
        ratelimit_config::policies_from_json_str(JSON).unwrap(),
        expected()
    );
    assert_eq!(
        ratelimit_config::policies_from_str(YAML, Format::Yaml).unwrap(),
        expected()
    );
    let path = std::env::temp_dir().join(format!(
        "ratelimit-config-shadow-{}.toml",
        std::process::id()
    ));
    std::fs::write(&path, TOML).unwrap();
    let read = ratelimit_config::policies_from_path(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(read.unwrap(), expected());
}

#[test]
fn add_policies_adds_shadow_policies_as_shadow_quotas() {
    let policies = ratelimit_config::policies_from_toml_str(TOML).unwrap();
    let limiter = ratelimit_config::add_policies(builder(), policies)
        .build()
        .unwrap();
    let names: Vec<&str> = limiter.quotas().iter().map(Quota::name).collect();
    assert_eq!(names, ["api", "api-trial", "login"]);
    let shadow: Vec<bool> = (0..3).map(|i| limiter.is_shadow(i)).collect();
    assert_eq!(shadow, [false, true, false]);

    // One at a time: the shadow one alone.
    let trial = expected().swap_remove(1);
    let limiter = trial.add_to(builder()).build().unwrap();
    assert_eq!(limiter.quotas()[0].name(), "api-trial");
    assert!(limiter.is_shadow(0));
}

#[test]
fn the_quota_functions_refuse_a_shadow_policy_and_say_what_to_use() {
    for (format, text) in [
        (Format::Toml, TOML),
        (Format::Yaml, YAML),
        (Format::Json, JSON),
    ] {
        let err = ratelimit_config::from_str(text, format).unwrap_err();
        let Error::Invalid {
            location,
            policy,
            fix,
            ..
        } = &err
        else {
            panic!("{format}: {err:?}");
        };
        assert_eq!(location, "policies[1].shadow", "{format}");
        assert_eq!(policy.as_deref(), Some("api-trial"), "{format}");
        assert!(fix.contains("policies_from_path"), "{fix}");
        assert!(fix.contains("add_policies"), "{fix}");
    }
    // `shadow = false` is what the quota functions always returned.
    let enforced = TOML.replace("shadow = true", "shadow = false");
    let quotas = ratelimit_config::from_toml_str(&enforced).unwrap();
    let want: Vec<Quota> = expected().into_iter().map(|p| p.quota).collect();
    assert_eq!(quotas, want);
}
