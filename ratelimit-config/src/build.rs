//! From the file as written to validated quotas, through `ratelimit-core`'s
//! constructors only.

use std::collections::HashMap;

use ratelimit_core::{ConfigError, Quota, Rate};

use crate::Policy;
use crate::error::Error;
use crate::raw::{AlgorithmName, RawFile, RawPolicy};
use crate::units::{UNIT_LIST, humanize_durations};

/// What to write instead, per field.
pub(crate) fn fix_for(field: &str) -> String {
    match field {
        "name" => "name the policy with 1 to 64 characters of A-Z a-z 0-9 _ - ., e.g. \"api\"".into(),
        "algorithm" => "algorithm is one of \"fixed_window\", \"sliding_window\", \"sliding_log\", \"token_bucket\"".into(),
        "rate" => format!(
            "rate is \"<count>/<period>\", e.g. \"100/min\", \"10/s\" or \"5/15m\" (units {UNIT_LIST})"
        ),
        "burst" => "burst is the most tokens the bucket holds, a whole number of at least 1, e.g. 20".into(),
        "limit" => "limit is the most admitted per window, a whole number of at least 1, e.g. 100".into(),
        "window" => format!(
            "window is a duration with a unit, e.g. \"1m\", \"15m\", \"1h\" or \"500ms\" (units {UNIT_LIST})"
        ),
        "shadow" => "shadow is true or false (the default): a shadow policy is decided and counted but never denies a call".into(),
        "policies" => "list the policies under a top-level `policies` key, each with a name and an algorithm".into(),
        _ => FIELDS.into(),
    }
}

/// The fields a policy may have.
pub(crate) const FIELDS: &str = "a policy has `name`, `algorithm`, then `rate` and `burst` \
     (token_bucket) or `limit` and `window` (fixed_window, sliding_window, sliding_log), \
     and optionally `shadow`";

struct At<'a> {
    index: usize,
    name: Option<&'a str>,
}

impl At<'_> {
    fn error(&self, field: &str, problem: impl Into<String>) -> Error {
        self.error_with(field, problem, fix_for(field))
    }

    fn error_with(&self, field: &str, problem: impl Into<String>, fix: impl Into<String>) -> Error {
        Error::Invalid {
            location: format!("policies[{}].{field}", self.index),
            policy: self.name.map(str::to_owned),
            problem: problem.into(),
            fix: fix.into(),
        }
    }

    fn missing(&self, field: &str, algorithm: &str) -> Error {
        self.error(field, format!("missing `{field}`, which {algorithm} needs"))
    }

    fn misplaced(&self, field: &str, algorithm: AlgorithmName) -> Error {
        let takes = if algorithm == AlgorithmName::TokenBucket {
            "`rate` and `burst`"
        } else {
            "`limit` and `window`"
        };
        self.error_with(
            field,
            format!(
                "`{field}` does not apply to algorithm \"{}\", which takes {takes}",
                algorithm.as_str()
            ),
            if algorithm == AlgorithmName::TokenBucket {
                format!("remove `{field}`; write e.g. rate = \"100/min\" and burst = 20")
            } else {
                format!("remove `{field}`; write e.g. limit = 100 and window = \"1m\"")
            },
        )
    }

    /// A constructor's error, reported against the field it is about, with
    /// its durations written as in a file (`400d`, not `34560000s`).
    fn rejected(&self, e: &ConfigError, algorithm: AlgorithmName, rate: Rate) -> Error {
        let named = match e {
            ConfigError::Zero { field }
            | ConfigError::NonFinite { field }
            | ConfigError::WindowTooShort { field }
            | ConfigError::WindowTooLong { field, .. }
            | ConfigError::OutOfRange { field, .. } => Some(*field),
            _ => None,
        };
        let field = match (algorithm, named) {
            (AlgorithmName::TokenBucket, Some("burst")) => "burst",
            (AlgorithmName::TokenBucket, _) => "rate",
            (_, Some("limit")) => "limit",
            (_, _) => "window",
        };
        let mut durations = vec![rate.period()];
        if let ConfigError::WindowTooLong { max, .. } = e {
            durations.push(*max);
        }
        self.error(field, humanize_durations(&e.to_string(), &durations))
    }
}

fn bucket_parts(at: &At<'_>, raw: &RawPolicy) -> Result<(Rate, u64), Error> {
    let algorithm = AlgorithmName::TokenBucket;
    if raw.limit.is_some() {
        return Err(at.misplaced("limit", algorithm));
    }
    if raw.window.is_some() {
        return Err(at.misplaced("window", algorithm));
    }
    let rate = raw
        .rate
        .ok_or_else(|| at.missing("rate", algorithm.as_str()))?;
    let burst = raw
        .burst
        .ok_or_else(|| at.missing("burst", algorithm.as_str()))?;
    Ok((rate.0, burst.0))
}

fn window_rate(at: &At<'_>, raw: &RawPolicy, algorithm: AlgorithmName) -> Result<Rate, Error> {
    if raw.rate.is_some() {
        return Err(at.misplaced("rate", algorithm));
    }
    if raw.burst.is_some() {
        return Err(at.misplaced("burst", algorithm));
    }
    let limit = raw
        .limit
        .ok_or_else(|| at.missing("limit", algorithm.as_str()))?;
    let window = raw
        .window
        .ok_or_else(|| at.missing("window", algorithm.as_str()))?;
    Ok(Rate::new(limit.0, window.0))
}

fn build_one(index: usize, raw: &RawPolicy) -> Result<Policy, Error> {
    let at = At {
        index,
        name: raw.name.as_deref(),
    };
    let Some(name) = raw.name.as_deref() else {
        return Err(at.error("name", "missing `name`, which every policy needs"));
    };
    let Some(algorithm) = raw.algorithm else {
        return Err(at.error("algorithm", "missing `algorithm`"));
    };
    let (built, rate) = match algorithm {
        AlgorithmName::TokenBucket => {
            let (rate, burst) = bucket_parts(&at, raw)?;
            (Quota::token_bucket(rate, burst), rate)
        }
        AlgorithmName::FixedWindow => {
            let rate = window_rate(&at, raw, algorithm)?;
            (Quota::fixed_window(rate), rate)
        }
        AlgorithmName::SlidingWindow => {
            let rate = window_rate(&at, raw, algorithm)?;
            (Quota::sliding_window(rate), rate)
        }
        AlgorithmName::SlidingLog => {
            let rate = window_rate(&at, raw, algorithm)?;
            (Quota::sliding_log(rate), rate)
        }
    };
    let quota = built
        .map_err(|e| at.rejected(&e, algorithm, rate))?
        .named(name)
        .map_err(|e| at.error("name", e.to_string()))?;
    Ok(Policy {
        quota,
        shadow: raw.shadow.unwrap_or(false),
    })
}

/// Every policy of the file, in order, or the first problem found.
pub(crate) fn build(file: RawFile) -> Result<Vec<Policy>, Error> {
    let Some(policies) = file.policies else {
        return Err(Error::Invalid {
            location: "policies".into(),
            policy: None,
            problem: "missing `policies`".into(),
            fix: fix_for("policies"),
        });
    };
    if policies.is_empty() {
        return Err(Error::Invalid {
            location: "policies".into(),
            policy: None,
            problem: "the list of policies is empty".into(),
            fix: "define at least one policy".into(),
        });
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut built = Vec::with_capacity(policies.len());
    for (index, raw) in policies.iter().enumerate() {
        let policy = build_one(index, raw)?;
        let name = policy.quota.name();
        if let Some(first) = seen.insert(name.to_owned(), index) {
            return Err(Error::Invalid {
                location: format!("policies[{index}].name"),
                policy: Some(name.to_owned()),
                problem: format!("policy {name:?} is already defined by policies[{first}]"),
                fix: "give each policy its own name".into(),
            });
        }
        built.push(policy);
    }
    Ok(built)
}
