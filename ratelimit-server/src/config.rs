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

mod limit;
mod yaml;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use smallvec::SmallVec;

use foldhash::HashMap;
use ratelimit_core::AlgorithmKind;

pub use limit::{RateLimit, Unit, algorithm_name, parse_algorithm};

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
    /// entry's value in the state's identity; empty when no entry has one.
    pub shared: Vec<Option<String>>,
    /// The metrics label: the descriptor path, with values where
    /// `detailed_metric` or `value_to_metric` ask for them (the limit's own
    /// `full_key`, shared, when it has none).
    pub metric_key: Arc<str>,
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
                out.push((l.full_key.to_string(), l.clone()));
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

    /// The rate limit for one descriptor of `domain` (its `entries` as
    /// key/value pairs), as envoyproxy/ratelimit finds it: the most
    /// specific match level by level (`key_value`, then a wildcard value,
    /// then `key` alone), and a limit only where the descriptor's depth
    /// equals the configuration's. `override_limit` is a limit Envoy sent
    /// with the descriptor (`requests_per_unit`, unit): it applies to any
    /// descriptor of a configured domain, decided by `algorithm`.
    pub fn lookup<'a>(
        &'a self,
        domain: &str,
        entries: &[(&'a str, &'a str)],
        override_limit: Option<(u32, Unit, AlgorithmKind)>,
    ) -> Option<Found> {
        let root = self.domains.get(domain)?;
        if let Some((rpu, unit, algorithm)) = override_limit {
            let full_key: Arc<str> = label(domain, entries.iter().copied()).into();
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
                    full_key: Arc::clone(&full_key),
                    counters: crate::metrics::LimitCounters::none(),
                }),
                shared: Vec::new(),
                metric_key: full_key,
            });
        }
        let mut map = &root.children;
        let mut prev = root;
        // One buffer for every level's `key_value`; what each level shows
        // in the metrics label (its value, a pattern, or nothing), kept so
        // that the label is written only when it is not the limit's path.
        let mut with_value = String::with_capacity(
            entries
                .iter()
                .map(|(k, v)| k.len() + v.len() + 1)
                .max()
                .unwrap_or(0),
        );
        let mut shown_at: SmallVec<[&'a str; 4]> = SmallVec::new();
        let mut shared: Vec<Option<String>> = Vec::new();
        let mut found: Option<Arc<RateLimit>> = None;
        for (i, &(key, value)) in entries.iter().enumerate() {
            with_value.clear();
            with_value.push_str(key);
            with_value.push('_');
            with_value.push_str(value);
            let with_value = with_value.as_str();
            let mut next = map.get(with_value);
            let mut wildcard: Option<&str> = None;
            if next.is_none() {
                for w in &prev.wildcards {
                    if wildcard_match(&w.parts, with_value) {
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
            // `key_` taken off a pattern or a wildcard key.
            let unprefixed = |s: &'_ str| -> Option<usize> {
                s.strip_prefix(key)
                    .and_then(|r| r.strip_prefix('_'))
                    .map(|r| s.len() - r.len())
            };
            // The pattern whose matches share one threshold, if a wildcard
            // with `share_threshold` matched: it stands for the value in
            // the state's identity and in the label.
            let pattern = match (wildcard, next) {
                (Some(_), Some(n)) if n.share_threshold && !n.wildcard_pattern.is_empty() => {
                    let p = n.wildcard_pattern.as_str();
                    Some(&p[unprefixed(p).unwrap_or(0)..])
                }
                _ => None,
            };
            if let Some(p) = pattern {
                if shared.is_empty() {
                    shared.resize(entries.len(), None);
                }
                shared[i] = Some(p.to_owned());
            }
            shown_at.push(match next {
                Some(n) => {
                    if let Some(w) = wildcard {
                        if let Some(p) = pattern {
                            p
                        } else if n.value_to_metric {
                            value
                        } else {
                            &w[unprefixed(w).unwrap_or(0)..]
                        }
                    } else if by_value || n.value_to_metric {
                        value
                    } else {
                        ""
                    }
                }
                None => "",
            });
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
        let metric_key: Arc<str> = if limit.detailed_metric {
            if !shared.is_empty() {
                let shown = entries
                    .iter()
                    .enumerate()
                    .map(|(i, &(key, value))| (key, shared[i].as_deref().unwrap_or(value)));
                label(domain, shown).into()
            } else {
                descriptor_values_key(domain, entries).into()
            }
        } else {
            let shown = entries
                .iter()
                .zip(&shown_at)
                .map(|(&(key, _), &s)| (key, s));
            if is_label(&limit.full_key, domain, shown.clone()) {
                Arc::clone(&limit.full_key)
            } else {
                label(domain, shown).into()
            }
        };
        Some(Found {
            limit,
            shared,
            metric_key,
        })
    }
}

/// `domain.key_value.key_value...`, every entry with its value (even an
/// empty one): the metrics label of a `detailed_metric` limit.
fn descriptor_values_key(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut k = String::with_capacity(
        domain.len()
            + entries
                .iter()
                .map(|(k, v)| k.len() + v.len() + 2)
                .sum::<usize>(),
    );
    k.push_str(domain);
    for (key, value) in entries {
        k.push('.');
        k.push_str(key);
        k.push('_');
        k.push_str(value);
    }
    k
}

/// `domain.key_shown.key...`: each level's key, and what it shows (a value
/// or a pattern) after `_` unless that is empty. The metrics label, and
/// envoyproxy/ratelimit's stats key of a descriptor (its values shown).
fn label<'s>(domain: &str, levels: impl Iterator<Item = (&'s str, &'s str)>) -> String {
    let mut k = String::from(domain);
    for (key, shown) in levels {
        k.push('.');
        k.push_str(key);
        if !shown.is_empty() {
            k.push('_');
            k.push_str(shown);
        }
    }
    k
}

/// Whether `path` is the label [`label`] would write for `levels`:
/// compared piece by piece, without writing it (a descriptor that matched
/// its limit's own path, the common case, takes the limit's label as is).
fn is_label<'s>(
    path: &str,
    domain: &str,
    levels: impl Iterator<Item = (&'s str, &'s str)>,
) -> bool {
    let Some(mut rest) = path.strip_prefix(domain) else {
        return false;
    };
    for (key, shown) in levels {
        let Some(r) = rest.strip_prefix('.').and_then(|r| r.strip_prefix(key)) else {
            return false;
        };
        rest = r;
        if !shown.is_empty() {
            let Some(r) = rest.strip_prefix('_').and_then(|r| r.strip_prefix(shown)) else {
                return false;
            };
            rest = r;
        }
    }
    rest.is_empty()
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
}
