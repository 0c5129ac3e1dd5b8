//! Response headers a client can act on, built from a decision.

use std::time::Duration;

use crate::clock::Micros;
use crate::decision::{Decision, Source};
use crate::quota::Quota;

/// The rate-limit response fields for one decision, as plain name/value pairs.
///
/// - `Retry-After`: delay-seconds, rounded **up** (only when denied by the store).
/// - `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`
///   (Unix epoch seconds, rounded up: the de-facto convention).
/// - `RateLimit-Policy: "name";q=<limit>;w=<window seconds>` and
///   `RateLimit: "name";r=<remaining>;t=<seconds to reset>`, in the
///   structured-field syntax of draft-ietf-httpapi-ratelimit-headers-11.
///
/// For a decision made by the failure policy (the store was not consulted)
/// only the fields known from configuration are given: `X-RateLimit-Limit`
/// and `RateLimit-Policy`. Nothing is invented. A denial answered from the
/// limiter's deny cache carries every field, as a store denial does: the
/// cache keeps the store's numbers and the instant the state resets (see
/// `DenyCache`, feature `deny-cache`).
///
/// ```
/// use ratelimit_core::{model, Quota, Rate, RateLimitHeaders};
/// let q = Quota::fixed_window(Rate::per_minute(100)).unwrap();
/// let now = 1_800_000_000_000_000 - 30_000_000; // 30 s before a minute boundary
/// let step = model::decide(&q, None, now, 50).unwrap();
/// let h = RateLimitHeaders::new(&step.decision, &q, now);
/// assert_eq!(h.get("RateLimit-Policy"), Some("\"default\";q=100;w=60"));
/// assert_eq!(h.get("RateLimit"), Some("\"default\";r=50;t=30"));
/// assert_eq!(h.get("X-RateLimit-Reset"), Some("1800000000"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitHeaders {
    fields: Vec<(&'static str, String)>,
}

/// Whether a decision's `remaining` and `reset_after` are known: the store
/// (or the fallback store) made it, or the deny cache answered it from a
/// store denial's numbers.
fn numbers_known(d: &Decision) -> bool {
    d.is_from_store() || d.source == Source::Cache
}

/// Whole seconds, rounded up.
pub fn ceil_secs(d: Duration) -> u64 {
    let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    micros.div_ceil(1_000_000)
}

impl RateLimitHeaders {
    /// The fields for `decision`, made under `quota` at `now` (µs since the epoch).
    pub fn new(decision: &Decision, quota: &Quota, now: Micros) -> Self {
        let mut fields = Vec::with_capacity(6);
        let name = quota.name();
        if let Some(retry) = decision.retry_after.filter(|_| !decision.allowed) {
            fields.push(("Retry-After", ceil_secs(retry).max(1).to_string()));
        }
        fields.push(("X-RateLimit-Limit", decision.limit.to_string()));
        if numbers_known(decision) {
            fields.push(("X-RateLimit-Remaining", decision.remaining.to_string()));
            let reset_at = now.saturating_add(
                u64::try_from(decision.reset_after.as_micros()).unwrap_or(u64::MAX),
            );
            fields.push((
                "X-RateLimit-Reset",
                reset_at.div_ceil(1_000_000).to_string(),
            ));
        }
        fields.push((
            "RateLimit-Policy",
            format!(
                "\"{name}\";q={};w={}",
                quota.limit(),
                ceil_secs(quota.window()).max(1)
            ),
        ));
        if numbers_known(decision) {
            fields.push((
                "RateLimit",
                format!(
                    "\"{name}\";r={};t={}",
                    decision.remaining,
                    ceil_secs(decision.reset_after)
                ),
            ));
        }
        Self { fields }
    }

    /// No fields at all (for a decision under a shadow quota only).
    pub fn empty() -> Self {
        Self { fields: Vec::new() }
    }

    /// The fields for a verdict over several quotas: `Retry-After` and
    /// `X-RateLimit-*` from the binding quota's decision; `RateLimit-Policy`
    /// and `RateLimit` list every quota in `listed` (draft-11 fields are
    /// lists), each with its own numbers (`RateLimit` only for quotas whose
    /// numbers are known).
    ///
    /// ```
    /// use ratelimit_core::{model, Quota, Rate, RateLimitHeaders};
    /// let s = Quota::fixed_window(Rate::per_second(10)).unwrap().named("second").unwrap();
    /// let d = Quota::fixed_window(Rate::per_day(1000)).unwrap().named("day").unwrap();
    /// let now = 20_834 * 86_400_000_000; // midnight UTC
    /// let a = model::decide(&s, None, now, 1).unwrap().decision;
    /// let b = model::decide(&d, None, now, 1).unwrap().decision;
    /// let h = RateLimitHeaders::for_all(&a, &s, &[(&a, &s), (&b, &d)], now);
    /// assert_eq!(h.get("X-RateLimit-Remaining"), Some("9"));
    /// assert_eq!(
    ///     h.get("RateLimit-Policy"),
    ///     Some("\"second\";q=10;w=1, \"day\";q=1000;w=86400")
    /// );
    /// assert_eq!(h.get("RateLimit"), Some("\"second\";r=9;t=1, \"day\";r=999;t=86400"));
    /// ```
    pub fn for_all(
        decision: &Decision,
        binding: &Quota,
        listed: &[(&Decision, &Quota)],
        now: Micros,
    ) -> Self {
        let mut h = Self::new(decision, binding, now);
        h.fields
            .retain(|(k, _)| *k != "RateLimit-Policy" && *k != "RateLimit");
        let policies: Vec<String> = listed
            .iter()
            .map(|(_, q)| {
                format!(
                    "\"{}\";q={};w={}",
                    q.name(),
                    q.limit(),
                    ceil_secs(q.window()).max(1)
                )
            })
            .collect();
        if !policies.is_empty() {
            h.fields.push(("RateLimit-Policy", policies.join(", ")));
        }
        let states: Vec<String> = listed
            .iter()
            .filter(|(d, _)| numbers_known(d))
            .map(|(d, q)| {
                format!(
                    "\"{}\";r={};t={}",
                    q.name(),
                    d.remaining,
                    ceil_secs(d.reset_after)
                )
            })
            .collect();
        if !states.is_empty() {
            h.fields.push(("RateLimit", states.join(", ")));
        }
        h
    }

    /// The fields in order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.fields.iter().map(|(k, v)| (*k, v.as_str()))
    }

    /// The value of one field, by exact name.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    }

    /// Typed headers (feature `http`).
    #[cfg(feature = "http")]
    pub fn to_header_map(&self) -> http::HeaderMap {
        let mut map = http::HeaderMap::with_capacity(self.fields.len());
        self.write_to(&mut map);
        map
    }

    /// Inserts the fields into `map`, replacing fields of the same name (feature `http`).
    #[cfg(feature = "http")]
    pub fn write_to(&self, map: &mut http::HeaderMap) {
        for (k, v) in &self.fields {
            // Names are static ASCII and values are digits, quotes and
            // policy names restricted to A-Z a-z 0-9 _ - . by `Quota::named`.
            if let Ok(value) = http::HeaderValue::from_str(v)
                && let Ok(name) = http::HeaderName::from_bytes(k.as_bytes())
            {
                map.insert(name, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Rate, model};

    #[test]
    fn retry_after_rounds_up() {
        let q = Quota::token_bucket(Rate::per_minute(100), 1).unwrap();
        let now = 1_000_000_000_000;
        let a = model::decide(&q, None, now, 1).unwrap();
        let b = model::decide(&q, Some(a.state), now + 1, 1).unwrap();
        assert_eq!(b.decision.retry_after, Some(Duration::from_micros(599_999)));
        let h = RateLimitHeaders::new(&b.decision, &q, now + 1);
        assert_eq!(h.get("Retry-After"), Some("1"));
        assert_eq!(h.get("X-RateLimit-Remaining"), Some("0"));
        assert_eq!(h.get("RateLimit-Policy"), Some("\"default\";q=1;w=1"));
    }

    #[test]
    fn policy_decisions_invent_nothing() {
        let q = Quota::sliding_window(Rate::per_minute(10))
            .unwrap()
            .named("api")
            .unwrap();
        let d = Decision::from_policy(true, 10);
        let h = RateLimitHeaders::new(&d, &q, 5);
        let names: Vec<_> = h.iter().map(|(k, _)| k).collect();
        assert_eq!(names, ["X-RateLimit-Limit", "RateLimit-Policy"]);
        let d = Decision::from_policy(false, 10);
        assert_eq!(RateLimitHeaders::new(&d, &q, 5).get("Retry-After"), None);
    }

    #[cfg(feature = "http")]
    #[test]
    fn header_map() {
        let q = Quota::fixed_window(Rate::per_minute(100)).unwrap();
        let d = model::decide(&q, None, 0, 1).unwrap().decision;
        let m = RateLimitHeaders::new(&d, &q, 0).to_header_map();
        assert_eq!(m["x-ratelimit-remaining"], "99");
        assert_eq!(m["ratelimit"], "\"default\";r=99;t=60");
    }
}
