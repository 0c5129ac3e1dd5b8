//! The file as written, before validation: every field optional so that a
//! missing one is reported by name, unknown fields rejected.

use std::fmt;
use std::time::Duration;

use ratelimit_core::Rate;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use crate::units::{parse_duration, parse_rate};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a map with one key, `policies`")]
pub(crate) struct RawFile {
    pub(crate) policies: Option<Vec<RawPolicy>>,
}

#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a policy: a map with `name`, `algorithm` and the algorithm's numbers"
)]
pub(crate) struct RawPolicy {
    pub(crate) name: Option<String>,
    pub(crate) algorithm: Option<AlgorithmName>,
    pub(crate) rate: Option<RateText>,
    pub(crate) burst: Option<Count>,
    pub(crate) limit: Option<Count>,
    pub(crate) window: Option<DurationText>,
    pub(crate) shadow: Option<bool>,
}

/// The four algorithms as spelled in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum AlgorithmName {
    FixedWindow,
    #[serde(alias = "sliding_window_counter")]
    SlidingWindow,
    SlidingLog,
    TokenBucket,
}

impl AlgorithmName {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::FixedWindow => "fixed_window",
            Self::SlidingWindow => "sliding_window",
            Self::SlidingLog => "sliding_log",
            Self::TokenBucket => "token_bucket",
        }
    }
}

/// `"100/min"`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RateText(pub(crate) Rate);

/// `"15m"`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DurationText(pub(crate) Duration);

/// A whole number, never negative.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Count(pub(crate) u64);

/// What a count too large for any quota is told: the accepted range. The
/// constructors give the exact bound of each field (2^53 - 1 for a limit,
/// 100,000 for a sliding log, less for a burst at some rates).
pub(crate) fn too_large(v: impl fmt::Display) -> String {
    format!(
        "{v} is out of range: a count is a whole number from 1 to {} (2^53 - 1)",
        ratelimit_core::MAX_EXACT
    )
}

impl<'de> Deserialize<'de> for RateText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RateText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a rate as a string \"<count>/<period>\", such as \"100/min\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<RateText, E> {
                parse_rate(s)
                    .map(RateText)
                    .map_err(|e| E::custom(format!("cannot read {s:?} as a rate: {e}")))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DurationText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration as a string with a unit, such as \"1m\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<DurationText, E> {
                parse_duration(s, false)
                    .map(DurationText)
                    .map_err(|e| E::custom(format!("cannot read {s:?} as a duration: {e}")))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number such as 20")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Count, E> {
                Ok(Count(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Count, E> {
                u64::try_from(v)
                    .map(Count)
                    .map_err(|_| E::custom(format!("{v} is negative")))
            }
            fn visit_u128<E: de::Error>(self, v: u128) -> Result<Count, E> {
                u64::try_from(v)
                    .map(Count)
                    .map_err(|_| E::custom(too_large(v)))
            }
            fn visit_i128<E: de::Error>(self, v: i128) -> Result<Count, E> {
                if v < 0 {
                    return Err(E::custom(format!("{v} is negative")));
                }
                u64::try_from(v)
                    .map(Count)
                    .map_err(|_| E::custom(too_large(v)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Count, E> {
                // Never accepted: a count is written as an integer. Say why.
                Err(E::custom(if v < 0.0 {
                    format!("{v} is negative")
                } else if v.fract() != 0.0 || !v.is_finite() {
                    format!("{v} is not a whole number")
                } else if v >= 18_446_744_073_709_551_616.0 {
                    too_large(format_args!("{v:e}"))
                } else {
                    format!(
                        "{v:?} is written as a decimal number; write a whole number \
                         without a decimal point or exponent"
                    )
                }))
            }
        }
        d.deserialize_any(V)
    }
}
