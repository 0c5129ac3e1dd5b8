//! The JSON form of `RateLimitRequest` and `RateLimitResponse` (the
//! proto3 JSON mapping, as envoyproxy/ratelimit's `/json` endpoint speaks
//! it): field names in lowerCamelCase (snake_case accepted on input),
//! enums by name, 64-bit integers as numbers or strings, durations as
//! `"59s"`, default values left out.
//!
//! ```
//! use ratelimit_server::json;
//!
//! let request = json::request_from_json(
//!     br#"{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}"#,
//! ).unwrap();
//! assert_eq!(request.domain, "edge");
//! assert_eq!(request.descriptors[0].entries[0].key, "remote_address");
//! ```

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::config::Unit;

/// A JSON integer: a number or a string of digits (proto3 JSON allows both).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Int {
    Num(u64),
    Str(String),
}

impl Int {
    fn get(&self, field: &str) -> Result<u64, String> {
        match self {
            Self::Num(n) => Ok(*n),
            Self::Str(s) => s
                .parse()
                .map_err(|_| format!("{field}: {s:?} is not a whole number")),
        }
    }
}

/// A unit by name (`"MINUTE"`) or number.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum UnitJson {
    Num(i32),
    Name(String),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: Option<Int>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: Option<Int>,
    #[serde(default, alias = "is_negative_hits")]
    is_negative_hits: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JsonOverride {
    #[serde(default, alias = "requests_per_unit")]
    requests_per_unit: Option<Int>,
    #[serde(default)]
    unit: Option<UnitJson>,
}

/// Reads a `RateLimitRequest` from its JSON form; the error says what is
/// wrong.
pub fn request_from_json(body: &[u8]) -> Result<RateLimitRequest, String> {
    let r: JsonRequest =
        serde_json::from_slice(body).map_err(|e| format!("invalid RateLimitRequest JSON: {e}"))?;
    let hits_addend = match &r.hits_addend {
        Some(h) => u32::try_from(h.get("hitsAddend")?)
            .map_err(|_| "hitsAddend: above 4294967295".to_owned())?,
        None => 0,
    };
    let mut descriptors = Vec::with_capacity(r.descriptors.len());
    for (i, d) in r.descriptors.into_iter().enumerate() {
        let limit = match d.limit {
            Some(o) => {
                let rpu = match &o.requests_per_unit {
                    Some(n) => u32::try_from(n.get("requestsPerUnit")?).map_err(|_| {
                        format!("descriptors[{i}].limit.requestsPerUnit: too large")
                    })?,
                    None => 0,
                };
                let unit = match o.unit {
                    Some(UnitJson::Num(n)) => n,
                    Some(UnitJson::Name(s)) => {
                        Unit::parse(&s).map(Unit::proto).ok_or_else(|| {
                            format!("descriptors[{i}].limit.unit: unknown unit {s:?}")
                        })?
                    }
                    None => 0,
                };
                Some(RateLimitOverride {
                    requests_per_unit: rpu,
                    unit,
                })
            }
            None => None,
        };
        let hits = match &d.hits_addend {
            Some(h) => Some(UInt64Value {
                value: h.get("hitsAddend")?,
            }),
            None => None,
        };
        descriptors.push(RateLimitDescriptor {
            entries: d
                .entries
                .into_iter()
                .map(|e| Entry {
                    key: e.key,
                    value: e.value,
                })
                .collect(),
            limit,
            hits_addend: hits,
            is_negative_hits: d.is_negative_hits,
        });
    }
    Ok(RateLimitRequest {
        domain: r.domain,
        descriptors,
        hits_addend,
    })
}

fn code_name(code: i32) -> &'static str {
    match code {
        1 => "OK",
        2 => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

fn unit_name(unit: i32) -> &'static str {
    Unit::from_proto(unit).map_or("UNKNOWN", Unit::name)
}

/// The JSON form of a `RateLimitResponse`.
pub fn response_to_json(r: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    out.insert("overallCode".into(), json!(code_name(r.overall_code)));
    let statuses: Vec<Value> = r
        .statuses
        .iter()
        .map(|s| {
            let mut m = Map::new();
            m.insert("code".into(), json!(code_name(s.code)));
            if let Some(l) = &s.current_limit {
                let mut lm = Map::new();
                if !l.name.is_empty() {
                    lm.insert("name".into(), json!(l.name));
                }
                if l.requests_per_unit != 0 {
                    lm.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
                }
                if l.unit != 0 {
                    lm.insert("unit".into(), json!(unit_name(l.unit)));
                }
                m.insert("currentLimit".into(), Value::Object(lm));
            }
            if s.limit_remaining != 0 {
                m.insert("limitRemaining".into(), json!(s.limit_remaining));
            }
            if let Some(d) = &s.duration_until_reset {
                let text = if d.nanos == 0 {
                    format!("{}s", d.seconds)
                } else {
                    format!("{}.{:09}s", d.seconds, d.nanos)
                };
                m.insert("durationUntilReset".into(), json!(text));
            }
            Value::Object(m)
        })
        .collect();
    if !statuses.is_empty() {
        out.insert("statuses".into(), Value::Array(statuses));
    }
    if !r.response_headers_to_add.is_empty() {
        out.insert(
            "responseHeadersToAdd".into(),
            Value::Array(
                r.response_headers_to_add
                    .iter()
                    .map(|h| json!({"key": h.key, "value": h.value}))
                    .collect(),
            ),
        );
    }
    Value::Object(out)
}
