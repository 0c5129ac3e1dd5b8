//! One rate limit: its unit, its algorithm, and the quota that decides it.

use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::{AlgorithmKind, Quota, Rate};

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
    /// stats key, used as the metrics label (shared: a descriptor that
    /// matches the limit without a value in its label takes it as is).
    pub full_key: Arc<str>,
    /// The metrics counters of `full_key`, made on the limit's first
    /// decision.
    pub(crate) counters: crate::metrics::LimitCounters,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_parse_in_any_case() {
        assert_eq!(Unit::parse("second"), Some(Unit::Second));
        assert_eq!(Unit::parse("MINUTE"), Some(Unit::Minute));
        assert_eq!(Unit::parse("Week"), Some(Unit::Week));
        assert_eq!(Unit::parse("unknown"), None);
        assert_eq!(Unit::Month.seconds(), 30 * 86_400);
    }
}
