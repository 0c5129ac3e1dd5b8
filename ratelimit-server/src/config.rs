//! envoyproxy/ratelimit's YAML configuration, read as-is.
//!
//! A file holds one `domain` and a tree of `descriptors`; each descriptor
//! has a `key`, an optional `value` (with `*` wildcards), an optional
//! `rate_limit` block (`unit`, `requests_per_unit`, `unlimited`, `name`,
//! `replaces`) and the flags `shadow_mode`, `quota_mode`,
//! `detailed_metric`, `value_to_metric`, `share_threshold` and `metadata`.
//! Every key envoyproxy/ratelimit accepts is accepted here, with the same
//! meaning, and every file it rejects is rejected.
//!
//! The extension: a `rate_limit` block may say which algorithm decides it,
//! `algorithm: fixed_window` (the default, what envoyproxy/ratelimit does),
//! `sliding_window`, `sliding_log` or `token_bucket`, and a token bucket
//! may take a `burst` (default: `requests_per_unit`).
//!
//! ```
//! use ratelimit_server::config::Config;
//!
//! let config = Config::from_yaml_str(
//!     "policies.yaml",
//!     "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n      algorithm: sliding_window\n",
//! )?;
//! let found = config.lookup("edge", &[("remote_address", "10.0.0.1")], None).unwrap();
//! assert_eq!(found.limit.requests_per_unit, 10);
//! # Ok::<(), ratelimit_server::config::ConfigError>(())
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::{AlgorithmKind, Quota, Rate};
use serde_norway::Value;

/// The unit of a rate limit, as envoyproxy/ratelimit spells it (any case).
///
/// A month is 30 days and a year 365 days, as in envoyproxy/ratelimit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3,600 seconds.
    Hour,
    /// 86,400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// The unit named `s`, in any case (`second`, `MINUTE`, ...).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_uppercase().as_str() {
            "SECOND" => Self::Second,
            "MINUTE" => Self::Minute,
            "HOUR" => Self::Hour,
            "DAY" => Self::Day,
            "WEEK" => Self::Week,
            "MONTH" => Self::Month,
            "YEAR" => Self::Year,
            _ => return None,
        })
    }

    /// The unit's length in seconds.
    pub const fn seconds(self) -> u64 {
        match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3_600,
            Self::Day => 86_400,
            Self::Week => 7 * 86_400,
            Self::Month => 30 * 86_400,
            Self::Year => 365 * 86_400,
        }
    }

    /// The unit's length.
    pub const fn duration(self) -> Duration {
        Duration::from_secs(self.seconds())
    }

    /// The proto enum name (`SECOND`, ...), as the JSON mapping writes it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Second => "SECOND",
            Self::Minute => "MINUTE",
            Self::Hour => "HOUR",
            Self::Day => "DAY",
            Self::Week => "WEEK",
            Self::Month => "MONTH",
            Self::Year => "YEAR",
        }
    }

    /// The value of `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit`.
    pub const fn proto(self) -> i32 {
        match self {
            Self::Second => 1,
            Self::Minute => 2,
            Self::Hour => 3,
            Self::Day => 4,
            Self::Month => 5,
            Self::Year => 6,
            Self::Week => 7,
        }
    }

    /// The unit of a proto value of `RateLimitResponse.RateLimit.Unit` or
    /// `envoy.type.v3.RateLimitUnit` (the same numbers for the units both
    /// have).
    pub const fn from_proto(v: i32) -> Option<Self> {
        Some(match v {
            1 => Self::Second,
            2 => Self::Minute,
            3 => Self::Hour,
            4 => Self::Day,
            5 => Self::Month,
            6 => Self::Year,
            7 => Self::Week,
            _ => return None,
        })
    }
}

/// The algorithm a rate limit is decided by (the `algorithm` extension).
pub fn parse_algorithm(s: &str) -> Option<AlgorithmKind> {
    Some(match s {
        "fixed_window" => AlgorithmKind::FixedWindow,
        "sliding_window" => AlgorithmKind::SlidingWindow,
        "sliding_log" => AlgorithmKind::SlidingLog,
        "token_bucket" => AlgorithmKind::TokenBucket,
        _ => return None,
    })
}

/// The spelling of an algorithm in the configuration.
pub const fn algorithm_name(kind: AlgorithmKind) -> &'static str {
    match kind {
        AlgorithmKind::FixedWindow => "fixed_window",
        AlgorithmKind::SlidingWindow => "sliding_window",
        AlgorithmKind::SlidingLog => "sliding_log",
        _ => "token_bucket",
    }
}

/// One configured rate limit (a descriptor's `rate_limit` block with the
/// descriptor's flags), or a limit Envoy sent with the descriptor.
#[derive(Debug, Clone)]
pub struct RateLimit {
    /// `requests_per_unit` (0: every request is over the limit).
    pub requests_per_unit: u32,
    /// `unit` (`None` for an unlimited descriptor).
    pub unit: Option<Unit>,
    /// `unlimited: true`: always OK, never counted.
    pub unlimited: bool,
    /// `name`, referred to by other limits' `replaces`.
    pub name: String,
    /// The names of the limits this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// `shadow_mode`: decided and counted, always answered OK.
    pub shadow_mode: bool,
    /// `quota_mode`: the request is over the limit only if every quota-mode
    /// descriptor of it is.
    pub quota_mode: bool,
    /// `detailed_metric`: metrics per descriptor value.
    pub detailed_metric: bool,
    /// The algorithm (the `algorithm` extension; default fixed window).
    pub algorithm: AlgorithmKind,
    /// The token bucket's burst (the `burst` extension).
    pub burst: Option<u64>,
    /// The quota that decides it (`None` when unlimited or when
    /// `requests_per_unit` is 0). Its name is a placeholder: each
    /// descriptor value gets its own state.
    pub quota: Option<Quota>,
    /// The descriptor path (`domain.key_value.key`): envoyproxy/ratelimit's
    /// stats key, used as the metrics label.
    pub full_key: String,
}

impl RateLimit {
    /// Builds the quota of `requests_per_unit` per `unit` under `algorithm`.
    pub fn build_quota(
        requests_per_unit: u32,
        unit: Unit,
        algorithm: AlgorithmKind,
        burst: Option<u64>,
    ) -> Result<Option<Quota>, ratelimit_core::ConfigError> {
        if requests_per_unit == 0 {
            return Ok(None);
        }
        let rate = Rate::new(u64::from(requests_per_unit), unit.duration());
        Ok(Some(match algorithm {
            AlgorithmKind::SlidingWindow => Quota::sliding_window(rate)?,
            AlgorithmKind::SlidingLog => Quota::sliding_log(rate)?,
            AlgorithmKind::TokenBucket => {
                Quota::token_bucket(rate, burst.unwrap_or(u64::from(requests_per_unit)))?
            }
            _ => Quota::fixed_window(rate)?,
        }))
    }
}

/// A configuration that cannot be loaded: which file, where in it, what is
/// wrong and what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or the name given for a string).
    pub file: String,
    /// Where in the file: the domain, the descriptor path and the field;
    /// empty for an error of the whole file.
    pub path: String,
    /// What is wrong.
    pub message: String,
    /// What to change.
    pub fix: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}; fix: {}", self.file, self.message, self.fix)
        } else {
            write!(
                f,
                "{}: {}: {}; fix: {}",
                self.file, self.path, self.message, self.fix
            )
        }
    }
}

impl std::error::Error for ConfigError {}

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

/// A wildcard value, split on `*` once at load time.
#[derive(Debug, Clone)]
struct Wildcard {
    /// The node's key in its parent's map (`key_pattern`).
    key: String,
    parts: Vec<String>,
}

/// One node of a domain's descriptor tree.
#[derive(Debug, Clone, Default)]
struct Node {
    children: HashMap<String, Node>,
    wildcards: Vec<Wildcard>,
    limit: Option<Arc<RateLimit>>,
    value_to_metric: bool,
    share_threshold: bool,
    wildcard_pattern: String,
}

/// What a descriptor matched.
#[derive(Debug, Clone)]
pub struct Found {
    /// The rate limit.
    pub limit: Arc<RateLimit>,
    /// Per entry of the descriptor, the wildcard pattern whose matches
    /// share one threshold (`share_threshold`), used in place of the
    /// entry's value in the state's identity.
    pub shared: Vec<Option<String>>,
    /// The metrics label: the descriptor path, with values where
    /// `detailed_metric` or `value_to_metric` ask for them.
    pub metric_key: String,
}

/// A loaded configuration: every domain of every file.
#[derive(Debug, Clone, Default)]
pub struct Config {
    domains: HashMap<String, Node>,
    /// The files it was loaded from.
    files: Vec<PathBuf>,
    /// The number of rate limits.
    limits: usize,
}

/// How configuration files are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Several files may configure one domain (envoyproxy/ratelimit's
    /// `MERGE_DOMAIN_CONFIG`); else a second one is an error.
    pub merge_domains: bool,
    /// The algorithm of a `rate_limit` without `algorithm`.
    pub default_algorithm: AlgorithmKind,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            merge_domains: false,
            default_algorithm: AlgorithmKind::FixedWindow,
        }
    }
}

/// Whether `value` matches a wildcard pattern split on `*` (each `*`
/// matches zero or more characters), as envoyproxy/ratelimit matches.
fn wildcard_match(parts: &[String], value: &str) -> bool {
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return false;
    };
    if parts.len() == 1 {
        return first == value;
    }
    if !value.starts_with(first.as_str()) || !value.ends_with(last.as_str()) {
        return false;
    }
    let fixed: usize = parts.iter().map(String::len).sum();
    if value.len() < fixed {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part.as_str()) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

impl Config {
    /// Loads every path: a file, or a directory whose `*.yaml` and `*.yml`
    /// files (not hidden ones) are read in name order.
    pub fn load(paths: &[PathBuf], options: LoadOptions) -> Result<Self, ConfigError> {
        let mut files = Vec::new();
        for path in paths {
            files.extend(config_files(path)?);
        }
        if files.is_empty() {
            return Err(ConfigError {
                file: paths
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                path: String::new(),
                message: "no configuration file found".into(),
                fix: "give a YAML file, or a directory holding *.yaml files".into(),
            });
        }
        let mut config = Self::default();
        for file in &files {
            let text = std::fs::read_to_string(file).map_err(|e| ConfigError {
                file: file.display().to_string(),
                path: String::new(),
                message: format!("cannot read the file: {e}"),
                fix: "check that the file exists and is readable".into(),
            })?;
            config.add_yaml(&file.display().to_string(), &text, options)?;
        }
        config.files = files;
        Ok(config)
    }

    /// Loads one file's text, named `file` in errors.
    pub fn from_yaml_str(file: &str, text: &str) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        config.add_yaml(file, text, LoadOptions::default())?;
        Ok(config)
    }

    /// [`Config::from_yaml_str`] with options.
    pub fn from_yaml_str_with(
        file: &str,
        text: &str,
        options: LoadOptions,
    ) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        config.add_yaml(file, text, options)?;
        Ok(config)
    }

    /// The files the configuration was loaded from.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The configured domains, sorted.
    pub fn domains(&self) -> Vec<&str> {
        let mut d: Vec<&str> = self.domains.keys().map(String::as_str).collect();
        d.sort_unstable();
        d
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// How many rate limits the configuration holds.
    pub fn limit_count(&self) -> usize {
        self.limits
    }

    /// Every rate limit, as `(descriptor path, limit)`, sorted by path (for
    /// `/rlconfig`).
    pub fn dump(&self) -> Vec<(String, Arc<RateLimit>)> {
        fn walk(node: &Node, out: &mut Vec<(String, Arc<RateLimit>)>) {
            if let Some(l) = &node.limit {
                out.push((l.full_key.clone(), l.clone()));
            }
            for child in node.children.values() {
                walk(child, out);
            }
        }
        let mut out = Vec::new();
        for node in self.domains.values() {
            walk(node, &mut out);
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn add_yaml(
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

    /// The rate limit for one descriptor of `domain` (its `entries` as
    /// key/value pairs), as envoyproxy/ratelimit finds it: the most
    /// specific match level by level (`key_value`, then a wildcard value,
    /// then `key` alone), and a limit only where the descriptor's depth
    /// equals the configuration's. `override_limit` is a limit Envoy sent
    /// with the descriptor (`requests_per_unit`, unit): it applies to any
    /// descriptor of a configured domain, decided by `algorithm`.
    pub fn lookup(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        override_limit: Option<(u32, Unit, AlgorithmKind)>,
    ) -> Option<Found> {
        let root = self.domains.get(domain)?;
        if let Some((rpu, unit, algorithm)) = override_limit {
            let full_key = descriptor_key(domain, entries);
            return Some(Found {
                limit: Arc::new(RateLimit {
                    requests_per_unit: rpu,
                    unit: Some(unit),
                    unlimited: false,
                    name: String::new(),
                    replaces: Vec::new(),
                    shadow_mode: false,
                    quota_mode: false,
                    detailed_metric: false,
                    algorithm,
                    burst: None,
                    quota: RateLimit::build_quota(rpu, unit, algorithm, None).ok()?,
                    full_key: full_key.clone(),
                }),
                shared: vec![None; entries.len()],
                metric_key: full_key,
            });
        }
        let mut map = &root.children;
        let mut prev = root;
        let mut detailed = String::from(domain);
        let mut valued = String::from(domain);
        let mut shared: Vec<Option<String>> = vec![None; entries.len()];
        let mut found: Option<Arc<RateLimit>> = None;
        let mut any_shared = false;
        for (i, &(key, value)) in entries.iter().enumerate() {
            let with_value = format!("{key}_{value}");
            detailed.push('.');
            detailed.push_str(&with_value);
            let mut next = map.get(&with_value);
            let mut wildcard: Option<&str> = None;
            if next.is_none() {
                for w in &prev.wildcards {
                    if wildcard_match(&w.parts, &with_value) {
                        next = map.get(&w.key);
                        wildcard = Some(&w.key);
                        break;
                    }
                }
            }
            let by_value = next.is_some();
            if next.is_none() {
                next = map.get(key);
            }
            let prefix = format!("{key}_");
            if let (Some(_), Some(n)) = (wildcard, next)
                && n.share_threshold
                && !n.wildcard_pattern.is_empty()
            {
                shared[i] = Some(
                    n.wildcard_pattern
                        .strip_prefix(&prefix)
                        .unwrap_or(&n.wildcard_pattern)
                        .to_owned(),
                );
                any_shared = true;
            }
            valued.push('.');
            match next {
                Some(n) => {
                    let shown: &str = if let Some(w) = wildcard {
                        if let Some(p) = &shared[i] {
                            p
                        } else if n.value_to_metric {
                            value
                        } else {
                            w.strip_prefix(&prefix).unwrap_or(w)
                        }
                    } else if by_value || n.value_to_metric {
                        value
                    } else {
                        ""
                    };
                    valued.push_str(key);
                    if !shown.is_empty() {
                        valued.push('_');
                        valued.push_str(shown);
                    }
                }
                None => valued.push_str(key),
            }
            if let Some(l) = next.and_then(|n| n.limit.as_ref())
                && i == entries.len() - 1
            {
                found = Some(l.clone());
            }
            match next {
                Some(n) if !n.children.is_empty() => {
                    map = &n.children;
                    prev = n;
                }
                _ => break,
            }
        }
        let limit = found?;
        let metric_key = if limit.detailed_metric {
            if any_shared {
                let mut k = String::from(domain);
                for (i, &(key, value)) in entries.iter().enumerate() {
                    k.push('.');
                    k.push_str(key);
                    match &shared[i] {
                        Some(p) => {
                            k.push('_');
                            k.push_str(p);
                        }
                        None if !value.is_empty() => {
                            k.push('_');
                            k.push_str(value);
                        }
                        None => {}
                    }
                }
                k
            } else {
                detailed
            }
        } else {
            valued
        };
        Some(Found {
            limit,
            shared,
            metric_key,
        })
    }
}

/// `domain.key_value.key...`: the stats key of a descriptor Envoy sent a
/// limit with.
fn descriptor_key(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut k = String::from(domain);
    for (key, value) in entries {
        k.push('.');
        k.push_str(key);
        if !value.is_empty() {
            k.push('_');
            k.push_str(value);
        }
    }
    k
}

/// The YAML files a path names: the file itself, or a directory's `*.yaml`
/// and `*.yml` files in name order (hidden files skipped).
pub fn config_files(path: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let meta = std::fs::metadata(path).map_err(|e| ConfigError {
        file: path.display().to_string(),
        path: String::new(),
        message: format!("cannot read: {e}"),
        fix: "give the path of an envoyproxy/ratelimit YAML file or of a directory of them".into(),
    })?;
    if !meta.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| ConfigError {
        file: path.display().to_string(),
        path: String::new(),
        message: format!("cannot list the directory: {e}"),
        fix: "check the directory's permissions".into(),
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !name.starts_with('.')
                && (name.ends_with(".yaml") || name.ends_with(".yml"))
                && p.is_file()
        })
        .collect();
    files.sort();
    Ok(files)
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
                children: HashMap::new(),
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
            full_key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(p: &str) -> Vec<String> {
        p.split('*').map(str::to_owned).collect()
    }

    #[test]
    fn wildcards_match_as_envoyproxy_does() {
        assert!(wildcard_match(&parts("wild_foo*"), "wild_foo"));
        assert!(wildcard_match(&parts("wild_foo*"), "wild_foobar"));
        assert!(!wildcard_match(&parts("wild_foo*"), "wild_fo"));
        assert!(wildcard_match(&parts("midWild_bar*b"), "midWild_barab"));
        assert!(!wildcard_match(&parts("midWild_bar*b"), "midWild_barba"));
        assert!(wildcard_match(&parts("m_foo*bar*baz"), "m_foo1bar2baz"));
        assert!(!wildcard_match(&parts("m_foo*bar*baz"), "m_foobaz"));
        assert!(wildcard_match(&parts("m_foo*bar*baz"), "m_foobarbaz"));
        assert!(!wildcard_match(&parts("p_ab*ba"), "p_aba"));
    }

    #[test]
    fn units_parse_in_any_case() {
        assert_eq!(Unit::parse("second"), Some(Unit::Second));
        assert_eq!(Unit::parse("MINUTE"), Some(Unit::Minute));
        assert_eq!(Unit::parse("Week"), Some(Unit::Week));
        assert_eq!(Unit::parse("unknown"), None);
        assert_eq!(Unit::Month.seconds(), 30 * 86_400);
    }
}
