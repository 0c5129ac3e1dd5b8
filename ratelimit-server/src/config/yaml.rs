//! Reading one file: its YAML checked key by key as envoyproxy/ratelimit
//! reads it (unknown keys refused with the keys that belong there, known
//! keys out of place ignored with a warning), then each descriptor and
//! `rate_limit` block into the domain's descriptor tree.

use std::collections::BTreeMap;
use std::sync::Arc;

use foldhash::HashMap;
use ratelimit_core::AlgorithmKind;
use serde_norway::Value;

use super::{
    Config, ConfigError, LoadOptions, Node, RateLimit, Unit, Wildcard, algorithm_name,
    parse_algorithm,
};

/// The keys envoyproxy/ratelimit accepts anywhere in a file, and ours.
const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    // Extensions.
    "algorithm",
    "burst",
];

const ROOT_KEYS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];
const RATE_LIMIT_KEYS: &[&str] = &[
    "requests_per_unit",
    "unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "burst",
];

impl Config {
    pub(super) fn add_yaml(
        &mut self,
        file: &str,
        text: &str,
        options: LoadOptions,
    ) -> Result<(), ConfigError> {
        let err = |path: &str, message: String, fix: &str| ConfigError {
            file: file.to_owned(),
            path: path.to_owned(),
            message,
            fix: fix.to_owned(),
        };
        let root: Value = serde_norway::from_str(text).map_err(|e| {
            err(
                "",
                format!("error loading config file: {e}"),
                "write valid YAML: a mapping with `domain` and `descriptors`",
            )
        })?;
        let root = match root {
            Value::Mapping(m) => m,
            Value::Null => serde_norway::Mapping::new(),
            _ => {
                return Err(err(
                    "",
                    "the file is not a mapping".into(),
                    "start the file with `domain: <name>` and a `descriptors:` list",
                ));
            }
        };
        let map = check_keys(file, "", &root, ROOT_KEYS)?;
        let domain = match map.get("domain") {
            Some(v) => scalar_string(v).ok_or_else(|| {
                err(
                    "domain",
                    "the domain is not a string".into(),
                    "write `domain: <name>`",
                )
            })?,
            None => String::new(),
        };
        if domain.is_empty() {
            return Err(err(
                "",
                "config file cannot have empty domain".into(),
                "add `domain: <name>` at the top of the file (the domain Envoy's filter sends)",
            ));
        }
        let here = format!("domain {domain:?}");
        let descriptors = match map.get("descriptors") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Sequence(s)) => s.iter().collect(),
            Some(_) => {
                return Err(err(
                    &format!("{here}, descriptors"),
                    "descriptors is not a list".into(),
                    "write `descriptors:` followed by a list of `- key: ...` entries",
                ));
            }
        };
        if let Some(existing) = self.domains.get_mut(&domain) {
            if !options.merge_domains {
                return Err(err(
                    &here,
                    format!("duplicate domain '{domain}' in config file"),
                    "keep each domain in one file, or start the server with --merge-domains",
                ));
            }
            let mut loader = Loader {
                file,
                options,
                limits: 0,
            };
            loader.descriptors(existing, &format!("{domain}."), &here, &descriptors)?;
            self.limits += loader.limits;
            return Ok(());
        }
        let mut node = Node::default();
        let mut loader = Loader {
            file,
            options,
            limits: 0,
        };
        loader.descriptors(&mut node, &format!("{domain}."), &here, &descriptors)?;
        self.limits += loader.limits;
        self.domains.insert(domain, node);
        Ok(())
    }
}

/// A scalar's text, as Go's YAML decoder gives it to a string field.
fn scalar_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null => Some(String::new()),
        _ => None,
    }
}

/// Checks a mapping's keys: every key a string envoyproxy/ratelimit knows
/// (else an error naming it and the keys that belong here), a known key out
/// of place is ignored with a warning as envoyproxy/ratelimit ignores it.
/// Returns the mapping by key.
fn check_keys<'v>(
    file: &str,
    path: &str,
    map: &'v serde_norway::Mapping,
    here: &[&str],
) -> Result<BTreeMap<String, &'v Value>, ConfigError> {
    let mut out = BTreeMap::new();
    for (k, v) in map {
        let Value::String(k) = k else {
            return Err(ConfigError {
                file: file.to_owned(),
                path: path.to_owned(),
                message: format!(
                    "config error, key is not of type string: {}",
                    serde_norway::to_string(k).unwrap_or_default().trim_end()
                ),
                fix: format!("use one of the keys {}", here.join(", ")),
            });
        };
        if !VALID_KEYS.contains(&k.as_str()) {
            return Err(ConfigError {
                file: file.to_owned(),
                path: path.to_owned(),
                message: format!("config error, unknown key '{k}'"),
                fix: format!(
                    "use one of the keys {}{}",
                    here.join(", "),
                    suggestion(k, here)
                ),
            });
        }
        if !here.contains(&k.as_str()) {
            tracing::warn!(
                file,
                path,
                key = %k,
                "key out of place, ignored (as envoyproxy/ratelimit ignores it): expected one of {}",
                here.join(", ")
            );
            continue;
        }
        out.insert(k.clone(), v);
    }
    Ok(out)
}

/// ` (did you mean `x`?)` for a misspelled key.
fn suggestion(k: &str, here: &[&str]) -> String {
    let squash = |s: &str| s.replace('_', "").to_ascii_lowercase();
    here.iter()
        .find(|c| squash(c) == squash(k))
        .map(|c| format!(" (did you mean `{c}`?)"))
        .unwrap_or_default()
}

struct Loader<'a> {
    file: &'a str,
    options: LoadOptions,
    limits: usize,
}

impl Loader<'_> {
    fn err(&self, path: &str, message: impl Into<String>, fix: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            path: path.to_owned(),
            message: message.into(),
            fix: fix.into(),
        }
    }

    fn flag(
        &self,
        path: &str,
        map: &BTreeMap<String, &Value>,
        name: &str,
    ) -> Result<bool, ConfigError> {
        match map.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(self.err(
                &format!("{path}, {name}"),
                format!("{name} is not a boolean"),
                format!("write `{name}: true` or `{name}: false`"),
            )),
        }
    }

    fn descriptors(
        &mut self,
        parent: &mut Node,
        parent_key: &str,
        parent_path: &str,
        list: &[&Value],
    ) -> Result<(), ConfigError> {
        for (i, item) in list.iter().enumerate() {
            let Value::Mapping(m) = item else {
                return Err(self.err(
                    &format!("{parent_path}, descriptors[{i}]"),
                    format!(
                        "config error, yaml file contains list of type other than map: {}",
                        serde_norway::to_string(item).unwrap_or_default().trim_end()
                    ),
                    "write each descriptor as a mapping: `- key: <key>` with optional `value:` and `rate_limit:`",
                ));
            };
            let at = format!("{parent_path}, descriptors[{i}]");
            let map = check_keys(self.file, &at, m, DESCRIPTOR_KEYS)?;
            let key = map
                .get("key")
                .and_then(|v| scalar_string(v))
                .unwrap_or_default();
            if key.is_empty() {
                return Err(self.err(
                    &at,
                    "descriptor has empty key",
                    "give every descriptor a `key:` (the descriptor entry's key Envoy sends)",
                ));
            }
            let value = match map.get("value") {
                Some(v) => scalar_string(v).ok_or_else(|| {
                    self.err(
                        &format!("{at}, value"),
                        "value is not a string",
                        "write `value: <text>`",
                    )
                })?,
                None => String::new(),
            };
            let at = if value.is_empty() {
                format!("{at} ({key})")
            } else {
                format!("{at} ({key}={value})")
            };
            let final_key = if value.is_empty() {
                key.clone()
            } else {
                format!("{key}_{value}")
            };
            let full_key = format!("{parent_key}{final_key}");
            if parent.children.contains_key(&final_key) {
                return Err(self.err(
                    &at,
                    format!("duplicate descriptor composite key '{full_key}'"),
                    "remove one of the two descriptors with this key and value, or merge them",
                ));
            }
            let shadow_mode = self.flag(&at, &map, "shadow_mode")?;
            let quota_mode = self.flag(&at, &map, "quota_mode")?;
            let detailed_metric = self.flag(&at, &map, "detailed_metric")?;
            let value_to_metric = self.flag(&at, &map, "value_to_metric")?;
            let share_threshold = self.flag(&at, &map, "share_threshold")?;
            if let Some(meta) = map.get("metadata")
                && !matches!(meta, Value::Mapping(_) | Value::Null)
            {
                return Err(self.err(
                    &format!("{at}, metadata"),
                    "error parsing metadata: not a mapping",
                    "write metadata as a mapping of names to values",
                ));
            }
            let limit = match map.get("rate_limit") {
                None | Some(Value::Null) => None,
                Some(Value::Mapping(rl)) => Some(Arc::new(self.rate_limit(
                    &format!("{at}, rate_limit"),
                    rl,
                    full_key.clone(),
                    shadow_mode,
                    quota_mode,
                    detailed_metric,
                )?)),
                Some(_) => {
                    return Err(self.err(
                        &format!("{at}, rate_limit"),
                        "rate_limit is not a mapping",
                        "write `rate_limit:` with `unit:` and `requests_per_unit:` under it",
                    ));
                }
            };
            if share_threshold && !final_key.contains('*') {
                return Err(self.err(
                    &at,
                    format!(
                        "share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
                    ),
                    "remove share_threshold, or give the descriptor a wildcard value such as `files/*`",
                ));
            }
            if final_key.contains('*') {
                parent.wildcards.push(Wildcard {
                    key: final_key.clone(),
                    parts: final_key.split('*').map(str::to_owned).collect(),
                });
            }
            let mut node = Node {
                children: HashMap::default(),
                wildcards: Vec::new(),
                limit,
                value_to_metric,
                share_threshold,
                wildcard_pattern: if share_threshold {
                    final_key.clone()
                } else {
                    String::new()
                },
            };
            let children = match map.get("descriptors") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Sequence(s)) => s.iter().collect(),
                Some(_) => {
                    return Err(self.err(
                        &format!("{at}, descriptors"),
                        "descriptors is not a list",
                        "write nested descriptors as a list of `- key: ...` entries",
                    ));
                }
            };
            self.descriptors(&mut node, &format!("{full_key}."), &at, &children)?;
            parent.children.insert(final_key, node);
        }
        Ok(())
    }

    fn rate_limit(
        &mut self,
        at: &str,
        m: &serde_norway::Mapping,
        full_key: String,
        shadow_mode: bool,
        quota_mode: bool,
        detailed_metric: bool,
    ) -> Result<RateLimit, ConfigError> {
        let map = check_keys(self.file, at, m, RATE_LIMIT_KEYS)?;
        let unlimited = self.flag(at, &map, "unlimited")?;
        let unit_text = match map.get("unit") {
            None | Some(Value::Null) => String::new(),
            Some(v) => scalar_string(v).unwrap_or_default(),
        };
        let unit = Unit::parse(&unit_text);
        if unlimited {
            if unit.is_some() {
                return Err(self.err(
                    at,
                    "should not specify rate limit unit when unlimited",
                    "remove `unit` (and `requests_per_unit`) from an unlimited rate limit",
                ));
            }
        } else if unit.is_none() {
            return Err(self.err(
                &format!("{at}.unit"),
                format!("invalid rate limit unit '{unit_text}'"),
                "use second, minute, hour, day, week, month or year",
            ));
        }
        let requests_per_unit = match map.get("requests_per_unit") {
            None | Some(Value::Null) => 0,
            Some(Value::Number(n)) => n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    self.err(
                        &format!("{at}.requests_per_unit"),
                        format!("requests_per_unit {n} is not a whole number from 0 to 4294967295"),
                        "write a whole number of requests per unit, such as `requests_per_unit: 100`",
                    )
                })?,
            Some(other) => {
                return Err(self.err(
                    &format!("{at}.requests_per_unit"),
                    format!(
                        "requests_per_unit is not a number: {}",
                        serde_norway::to_string(other).unwrap_or_default().trim_end()
                    ),
                    "write a whole number of requests per unit, such as `requests_per_unit: 100`",
                ));
            }
        };
        let name = match map.get("name") {
            None => String::new(),
            Some(v) => scalar_string(v).unwrap_or_default(),
        };
        let mut replaces = Vec::new();
        match map.get("replaces") {
            None | Some(Value::Null) => {}
            Some(Value::Sequence(list)) => {
                for (i, r) in list.iter().enumerate() {
                    let rat = format!("{at}.replaces[{i}]");
                    let Value::Mapping(rm) = r else {
                        return Err(self.err(
                            &rat,
                            "config error, yaml file contains list of type other than map",
                            "write `- name: <the name of the rate limit replaced>`",
                        ));
                    };
                    let rmap = check_keys(self.file, &rat, rm, &["name"])?;
                    let n = rmap
                        .get("name")
                        .and_then(|v| scalar_string(v))
                        .unwrap_or_default();
                    if n.is_empty() {
                        return Err(self.err(
                            &rat,
                            "should not have an empty replaces entry",
                            "give the name of the rate limit this one replaces: `- name: <name>`",
                        ));
                    }
                    if n == name {
                        return Err(self.err(
                            &rat,
                            "replaces should not contain name of same descriptor",
                            "name another descriptor's rate limit, or remove this entry",
                        ));
                    }
                    replaces.push(n);
                }
            }
            Some(_) => {
                return Err(self.err(
                    &format!("{at}.replaces"),
                    "replaces is not a list",
                    "write `replaces:` followed by `- name: <name>` entries",
                ));
            }
        }
        let algorithm = match map.get("algorithm") {
            None | Some(Value::Null) => self.options.default_algorithm,
            Some(v) => {
                let s = scalar_string(v).unwrap_or_default();
                parse_algorithm(&s).ok_or_else(|| {
                    self.err(
                        &format!("{at}.algorithm"),
                        format!("unknown algorithm '{s}'"),
                        "use fixed_window (the default, envoyproxy/ratelimit's), sliding_window, sliding_log or token_bucket",
                    )
                })?
            }
        };
        let burst = match map.get("burst") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) if n.as_u64().is_some_and(|b| b > 0) => n.as_u64(),
            Some(_) => {
                return Err(self.err(
                    &format!("{at}.burst"),
                    "burst is not a whole number of at least 1",
                    "write the most requests a token bucket admits at once, such as `burst: 20`",
                ));
            }
        };
        if burst.is_some() && algorithm != AlgorithmKind::TokenBucket {
            return Err(self.err(
                &format!("{at}.burst"),
                format!("burst is given for the {} algorithm", algorithm_name(algorithm)),
                "remove burst, or set `algorithm: token_bucket` (a burst belongs to a token bucket)",
            ));
        }
        let quota = match (unlimited, unit) {
            (false, Some(unit)) => RateLimit::build_quota(requests_per_unit, unit, algorithm, burst)
                .map_err(|e| {
                    self.err(
                        at,
                        format!("{requests_per_unit} per {} cannot be decided by the {}: {e}", unit.name().to_ascii_lowercase(), algorithm_name(algorithm)),
                        match algorithm {
                            AlgorithmKind::SlidingLog => "a sliding log keeps one entry per request: use sliding_window or token_bucket above 100000 per unit",
                            AlgorithmKind::SlidingWindow => "lower requests_per_unit, use a shorter unit, or use token_bucket",
                            _ => "lower requests_per_unit or burst",
                        },
                    )
                })?,
            _ => None,
        };
        self.limits += 1;
        Ok(RateLimit {
            requests_per_unit,
            unit: if unlimited { None } else { unit },
            unlimited,
            name,
            replaces,
            shadow_mode,
            quota_mode,
            detailed_metric,
            algorithm,
            burst,
            quota,
            full_key: full_key.into(),
            counters: crate::metrics::LimitCounters::kept(),
        })
    }
}
