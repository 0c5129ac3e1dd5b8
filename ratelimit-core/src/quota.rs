//! Validated quota configuration for the four algorithms.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Micros, duration_to_micros};
use crate::error::ConfigError;

/// The largest integer that every store must represent exactly: 2^53 - 1.
///
/// Redis' Lua numbers are doubles, so every intermediate product of the
/// arithmetic must stay at or below this value. Constructors reject
/// configurations that could exceed it.
pub const MAX_EXACT: u64 = (1 << 53) - 1;

/// The latest clock time every store must handle exactly: 2^52 µs after the
/// Unix epoch (in the year 2112).
///
/// A token bucket's state is the instant it is full again, up to
/// `now + capacity x (µs per token)`; with `now` below 2^52 and a bucket
/// within [`MAX_BUCKET`], that instant stays below 2^53, exact in Redis'
/// Lua numbers.
pub const MAX_TIME: Micros = 1 << 52;

/// The largest token bucket accepted, in the model's units: `capacity x
/// unit + refill` (a full bucket's refill time in µs, scaled by the
/// reduced rate) at most 2^52, so that [`MAX_TIME`] plus it stays exact.
/// For example a burst of 1,000,000 at one token per hour (3.6e15) fits; a
/// burst of 2,000,000 at that rate does not.
pub const MAX_BUCKET: u64 = 1 << 52;

/// The largest sliding log limit accepted: 100,000 per window.
///
/// A sliding log keeps one entry per admitted call, so a caller's state
/// grows with the limit: up to 100,000 entries (about 1.6 MB in process,
/// and in Redis about 10-20 MB per caller as sorted sets: see the Redis
/// crate's README). Above it, use a sliding window counter (two counters,
/// within a fraction of the exact count) or a token bucket.
pub const MAX_SLIDING_LOG_LIMIT: u64 = 100_000;

/// The longest window or period accepted: 400 days.
pub const MAX_WINDOW: Duration = Duration::from_secs(400 * 24 * 3600);

const MAX_NAME_LEN: usize = 64;

/// Which bytes a policy name (and a limiter's namespace) may hold:
/// `A-Z a-z 0-9 _ - .`, as a table so that checking a name is one load
/// and one well-predicted branch a byte (a name of hex digits mixes the
/// digit and letter ranges, which a chain of range tests mispredicts).
const NAME_BYTES: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'.';
        b += 1;
    }
    t
};

/// Whether `name` is 1 to 64 characters of `A-Z a-z 0-9 _ - .`: a valid
/// policy name or namespace.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .fold(true, |ok, b| ok & NAME_BYTES[usize::from(b)])
}

/// "`count` per `period`": the unvalidated numbers a quota is built from.
///
/// `Rate::per_minute(100)` reads as, and means, 100 per minute. Validation
/// happens when a [`Quota`] is built from it.
///
/// ```
/// use ratelimit_core::Rate;
/// use std::time::Duration;
/// assert_eq!(Rate::per_minute(100), Rate::new(100, Duration::from_secs(60)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    count: u64,
    period: Duration,
}

impl Rate {
    /// `count` per `period`.
    pub const fn new(count: u64, period: Duration) -> Self {
        Self { count, period }
    }
    /// `count` per second.
    pub const fn per_second(count: u64) -> Self {
        Self::new(count, Duration::from_secs(1))
    }
    /// `count` per minute.
    pub const fn per_minute(count: u64) -> Self {
        Self::new(count, Duration::from_secs(60))
    }
    /// `count` per hour.
    pub const fn per_hour(count: u64) -> Self {
        Self::new(count, Duration::from_secs(3600))
    }
    /// `count` per day (86,400 seconds).
    pub const fn per_day(count: u64) -> Self {
        Self::new(count, Duration::from_secs(86_400))
    }
    /// `count` per `seconds`, for configuration read from text.
    ///
    /// Rejects non-finite, negative, zero and sub-microsecond periods.
    pub fn per_secs_f64(count: u64, seconds: f64) -> Result<Self, ConfigError> {
        if !seconds.is_finite() {
            return Err(ConfigError::NonFinite { field: "period" });
        }
        if seconds <= 0.0 {
            return Err(ConfigError::Zero { field: "period" });
        }
        if seconds > MAX_WINDOW.as_secs_f64() {
            return Err(ConfigError::WindowTooLong {
                field: "period",
                max: MAX_WINDOW,
            });
        }
        let period = Duration::from_secs_f64(seconds);
        if period < Duration::from_micros(1) {
            return Err(ConfigError::WindowTooShort { field: "period" });
        }
        Ok(Self::new(count, period))
    }
    /// The count.
    pub const fn count(&self) -> u64 {
        self.count
    }
    /// The period.
    pub const fn period(&self) -> Duration {
        self.period
    }
}

/// Which of the four algorithms a quota uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AlgorithmKind {
    /// At most `limit` per calendar window; up to twice that across a boundary.
    FixedWindow,
    /// Two counters, the previous window weighted by how much of it still overlaps.
    SlidingWindow,
    /// One entry per admitted call; exact in every trailing window.
    SlidingLog,
    /// A bucket of `capacity` tokens refilled at a steady rate.
    TokenBucket,
}

impl AlgorithmKind {
    /// A short, stable code used in store keys: `fw`, `sw`, `sl`, `tb`.
    pub const fn code(self) -> &'static str {
        match self {
            Self::FixedWindow => "fw",
            Self::SlidingWindow => "sw",
            Self::SlidingLog => "sl",
            Self::TokenBucket => "tb",
        }
    }
    /// All four algorithms.
    pub const ALL: [AlgorithmKind; 4] = [
        Self::FixedWindow,
        Self::SlidingWindow,
        Self::SlidingLog,
        Self::TokenBucket,
    ];
}

impl fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::FixedWindow => "fixed window",
            Self::SlidingWindow => "sliding window counter",
            Self::SlidingLog => "sliding log",
            Self::TokenBucket => "token bucket",
        })
    }
}

/// A window-based configuration: `limit` units per `window` (fixed window,
/// sliding window counter, sliding log).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    limit: u64,
    window: Micros,
}

impl Window {
    /// The most cost admitted per window.
    pub const fn limit(&self) -> u64 {
        self.limit
    }
    /// The window length in microseconds.
    pub const fn window_micros(&self) -> Micros {
        self.window
    }
}

/// Token bucket configuration, reduced to exact integer units.
///
/// One token is `unit` bucket units and the bucket gains `refill` units per
/// microsecond, where `refill / unit` is the configured rate reduced by the
/// greatest common divisor. So "100 per minute" becomes `unit = 600_000`,
/// `refill = 1`: one token every 600,000 µs, with no rounding anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bucket {
    capacity: u64,
    rate: Rate,
    unit: u64,
    refill: u64,
}

impl Bucket {
    /// The most tokens the bucket holds (the burst).
    pub const fn capacity(&self) -> u64 {
        self.capacity
    }
    /// The configured refill rate.
    pub const fn rate(&self) -> Rate {
        self.rate
    }
    /// Bucket units per token.
    pub const fn unit(&self) -> u64 {
        self.unit
    }
    /// Bucket units gained per microsecond.
    pub const fn refill(&self) -> u64 {
        self.refill
    }
    /// A full bucket in units: `capacity * unit`.
    pub const fn full(&self) -> u64 {
        self.capacity * self.unit
    }
}

/// The validated algorithm parameters of a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Fixed (calendar) window.
    FixedWindow(Window),
    /// Sliding window counter.
    SlidingWindow(Window),
    /// Sliding log.
    SlidingLog(Window),
    /// Token bucket.
    TokenBucket(Bucket),
}

impl Algorithm {
    /// Which algorithm this is.
    pub const fn kind(&self) -> AlgorithmKind {
        match self {
            Self::FixedWindow(_) => AlgorithmKind::FixedWindow,
            Self::SlidingWindow(_) => AlgorithmKind::SlidingWindow,
            Self::SlidingLog(_) => AlgorithmKind::SlidingLog,
            Self::TokenBucket(_) => AlgorithmKind::TokenBucket,
        }
    }
}

/// A validated, named rate-limit policy: an algorithm and its numbers.
///
/// Built only through constructors that reject zero limits, zero windows,
/// zero rates and values outside the exact range ([`MAX_EXACT`]).
///
/// | algorithm | `limit()` | `window()` (as in `RateLimit-Policy: w=`) |
/// |---|---|---|
/// | fixed window, sliding window, sliding log | the limit per window | the window |
/// | token bucket | the capacity (burst) | the time to refill a full bucket |
///
/// ```
/// use ratelimit_core::{Quota, Rate};
/// # fn main() -> Result<(), ratelimit_core::ConfigError> {
/// // What you sell: 100 per minute, burst 20.
/// let plan = Quota::token_bucket(Rate::per_minute(100), 20)?.named("plan")?;
/// assert_eq!(plan.limit(), 20);
/// // Cheap general quota; few, high-value keys.
/// let general = Quota::sliding_window(Rate::per_minute(100))?;
/// let login = Quota::sliding_log(Rate::new(5, std::time::Duration::from_secs(900)))?;
/// assert!(Quota::fixed_window(Rate::per_minute(0)).is_err());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Quota {
    name: Arc<str>,
    algorithm: Algorithm,
}

/// The name of a quota not given one.
const DEFAULT_NAME: &str = "default";

fn window_of(rate: Rate, field: &'static str) -> Result<Window, ConfigError> {
    if rate.count == 0 {
        return Err(ConfigError::Zero { field: "limit" });
    }
    if rate.count > MAX_EXACT {
        return Err(ConfigError::OutOfRange {
            field: "limit",
            detail: format!("must be at most 2^53 - 1, got {}", rate.count),
        });
    }
    let window = period_micros(rate.period, field)?;
    Ok(Window {
        limit: rate.count,
        window,
    })
}

fn period_micros(period: Duration, field: &'static str) -> Result<Micros, ConfigError> {
    if period.is_zero() {
        return Err(ConfigError::Zero { field });
    }
    if period > MAX_WINDOW {
        return Err(ConfigError::WindowTooLong {
            field,
            max: MAX_WINDOW,
        });
    }
    if !period.subsec_nanos().is_multiple_of(1000) || period < Duration::from_micros(1) {
        return Err(ConfigError::WindowTooShort { field });
    }
    Ok(duration_to_micros(period))
}

const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

impl Quota {
    fn new(algorithm: Algorithm) -> Self {
        Self {
            name: Arc::from(DEFAULT_NAME),
            algorithm,
        }
    }

    /// At most `rate.count()` per calendar window of `rate.period()`.
    ///
    /// Allows up to twice the limit in a trailing window that spans a
    /// boundary: use it for compatibility, not for quota you sell.
    pub fn fixed_window(rate: Rate) -> Result<Self, ConfigError> {
        Ok(Self::new(Algorithm::FixedWindow(window_of(
            rate, "window",
        )?)))
    }

    /// Sliding window counter: admitted iff
    /// `prev * (W - elapsed) / W + curr + cost <= limit`.
    ///
    /// The arithmetic is exact integers, so `limit * window_µs` must be at
    /// most 2^53 - 1 (for example 150 million per minute, 2.5 million per
    /// hour, 104,000 per day). Use a token bucket above that.
    pub fn sliding_window(rate: Rate) -> Result<Self, ConfigError> {
        let w = window_of(rate, "window")?;
        if u128::from(w.limit) * u128::from(w.window) > u128::from(MAX_EXACT) {
            return Err(ConfigError::OutOfRange {
                field: "limit",
                detail: format!(
                    "limit x window in microseconds must be at most 2^53 - 1 for exact arithmetic; \
                     {} x {} is larger: lower the limit, shorten the window, or use a token bucket",
                    w.limit, w.window
                ),
            });
        }
        Ok(Self::new(Algorithm::SlidingWindow(w)))
    }

    /// Sliding log: exactly at most `rate.count()` in every trailing window.
    ///
    /// Stores one entry per admitted call (calls at the same microsecond are
    /// merged), so memory grows with the limit: meant for few, high-value keys.
    ///
    /// The limit is at most [`MAX_SLIDING_LOG_LIMIT`] (100,000): above it the
    /// constructor says to use a sliding window counter or a token bucket.
    pub fn sliding_log(rate: Rate) -> Result<Self, ConfigError> {
        let w = window_of(rate, "window")?;
        if w.limit > MAX_SLIDING_LOG_LIMIT {
            return Err(ConfigError::OutOfRange {
                field: "limit",
                detail: format!(
                    "a sliding log keeps one entry per admitted call, so its limit is at most \
                     {MAX_SLIDING_LOG_LIMIT} per window, got {}: use a sliding window counter \
                     (Quota::sliding_window: two counters per caller) or a token bucket \
                     (Quota::token_bucket) for larger limits",
                    w.limit
                ),
            });
        }
        Ok(Self::new(Algorithm::SlidingLog(w)))
    }

    /// Token bucket refilled at `rate`, holding at most `burst` tokens.
    ///
    /// "100 per minute, burst 20" is `token_bucket(Rate::per_minute(100), 20)`.
    /// A fresh caller starts with a full bucket. In any span of length T at
    /// most `burst + rate * T` is admitted.
    pub fn token_bucket(rate: Rate, burst: u64) -> Result<Self, ConfigError> {
        if rate.count == 0 {
            return Err(ConfigError::Zero { field: "rate" });
        }
        if burst == 0 {
            return Err(ConfigError::Zero { field: "burst" });
        }
        let period = period_micros(rate.period, "period")?;
        let g = gcd(rate.count, period);
        let refill = rate.count / g;
        let unit = period / g;
        let full = u128::from(burst) * u128::from(unit);
        if full + u128::from(refill) > u128::from(MAX_BUCKET) {
            return Err(ConfigError::OutOfRange {
                field: "burst",
                detail: format!(
                    "burst x (microseconds per token, reduced) must be at most 2^52 for exact \
                     arithmetic (the time a bucket is full again, now plus that, must stay \
                     below 2^53 in Redis' Lua numbers); burst {burst} at {} per {:?} is too \
                     large: lower the burst or use a rate that divides its period more evenly",
                    rate.count, rate.period
                ),
            });
        }
        Ok(Self::new(Algorithm::TokenBucket(Bucket {
            capacity: burst,
            rate,
            unit,
            refill,
        })))
    }

    /// Gives the quota a policy name (default `"default"`), used in store keys
    /// and in the `RateLimit-Policy` / `RateLimit` headers.
    ///
    /// Names are 1 to 64 characters of `A-Z a-z 0-9 _ - .`.
    pub fn named(mut self, name: &str) -> Result<Self, ConfigError> {
        if !valid_name(name) {
            return Err(ConfigError::InvalidName {
                name: name.to_owned(),
            });
        }
        self.name = Arc::from(name);
        Ok(self)
    }

    /// The policy name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The policy name, shared.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn name_arc(&self) -> &Arc<str> {
        &self.name
    }

    /// This quota divided among `instances` application instances, for the
    /// limiter's in-process fallback store: the same name, algorithm and
    /// window, with the limit (or the token bucket's burst and rate) divided
    /// and rounded down, but never below 1. `instances` of 0 counts as 1.
    ///
    /// ```
    /// use ratelimit_core::{Quota, Rate};
    /// let q = Quota::token_bucket(Rate::per_minute(100), 20).unwrap();
    /// let local = q.divided(4).unwrap();
    /// assert_eq!(local.limit(), 5);
    /// assert_eq!(local.window(), q.window());
    /// ```
    pub fn divided(&self, instances: u32) -> Result<Self, ConfigError> {
        let n = u64::from(instances.max(1));
        let mut q = match &self.algorithm {
            Algorithm::FixedWindow(w) | Algorithm::SlidingWindow(w) | Algorithm::SlidingLog(w) => {
                let rate = Rate::new((w.limit / n).max(1), Duration::from_micros(w.window));
                match self.algorithm {
                    Algorithm::FixedWindow(_) => Self::fixed_window(rate)?,
                    Algorithm::SlidingWindow(_) => Self::sliding_window(rate)?,
                    _ => Self::sliding_log(rate)?,
                }
            }
            Algorithm::TokenBucket(b) => {
                let burst = (b.capacity / n).max(1);
                // Dividing the rate by stretching the period keeps it exact
                // where the period allows; else divide the count.
                let stretched = b
                    .rate
                    .period
                    .checked_mul(u32::try_from(n).unwrap_or(u32::MAX))
                    .filter(|p| *p <= MAX_WINDOW)
                    .map(|p| Rate::new(b.rate.count, p));
                match stretched.map(|r| Self::token_bucket(r, burst)) {
                    Some(Ok(q)) => q,
                    _ => Self::token_bucket(
                        Rate::new((b.rate.count / n).max(1), b.rate.period),
                        burst,
                    )?,
                }
            }
        };
        q.name = self.name.clone();
        Ok(q)
    }

    /// The validated algorithm parameters.
    pub const fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }

    /// Which algorithm.
    pub const fn kind(&self) -> AlgorithmKind {
        self.algorithm.kind()
    }

    /// What `X-RateLimit-Limit` reports: the limit per window, or the bucket
    /// capacity.
    pub const fn limit(&self) -> u64 {
        match &self.algorithm {
            Algorithm::FixedWindow(w) | Algorithm::SlidingWindow(w) | Algorithm::SlidingLog(w) => {
                w.limit
            }
            Algorithm::TokenBucket(b) => b.capacity,
        }
    }

    /// The window the limit applies to: the window, or for a token bucket the
    /// time to refill a full bucket from empty (rounded up to a microsecond).
    pub fn window(&self) -> Duration {
        match &self.algorithm {
            Algorithm::FixedWindow(w) | Algorithm::SlidingWindow(w) | Algorithm::SlidingLog(w) => {
                Duration::from_micros(w.window)
            }
            Algorithm::TokenBucket(b) => Duration::from_micros(b.full().div_ceil(b.refill)),
        }
    }

    /// Checks a cost against this quota: it must be at least 1 and at most
    /// the limit (a larger cost could never be admitted).
    pub fn check_cost(&self, cost: u64) -> Result<(), crate::error::CostError> {
        if cost == 0 {
            return Err(crate::error::CostError::Zero);
        }
        if cost > self.limit() {
            return Err(crate::error::CostError::ExceedsLimit {
                cost,
                limit: self.limit(),
                policy: self.name().to_owned(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_zeros() {
        assert_eq!(
            Quota::fixed_window(Rate::per_minute(0)),
            Err(ConfigError::Zero { field: "limit" })
        );
        assert_eq!(
            Quota::sliding_log(Rate::new(1, Duration::ZERO)),
            Err(ConfigError::Zero { field: "window" })
        );
        assert_eq!(
            Quota::token_bucket(Rate::per_minute(0), 1),
            Err(ConfigError::Zero { field: "rate" })
        );
        assert_eq!(
            Quota::token_bucket(Rate::per_minute(1), 0),
            Err(ConfigError::Zero { field: "burst" })
        );
    }

    #[test]
    fn rejects_non_finite_and_out_of_range() {
        assert!(matches!(
            Rate::per_secs_f64(1, f64::NAN),
            Err(ConfigError::NonFinite { .. })
        ));
        assert!(matches!(
            Rate::per_secs_f64(1, f64::INFINITY),
            Err(ConfigError::NonFinite { .. })
        ));
        assert!(matches!(
            Rate::per_secs_f64(1, -1.0),
            Err(ConfigError::Zero { .. })
        ));
        assert!(matches!(
            Rate::per_secs_f64(1, 1e-9),
            Err(ConfigError::WindowTooShort { .. })
        ));
        assert!(matches!(
            Quota::fixed_window(Rate::new(1, Duration::from_nanos(1500))),
            Err(ConfigError::WindowTooShort { .. })
        ));
        assert!(matches!(
            Quota::fixed_window(Rate::new(1, MAX_WINDOW + Duration::from_secs(1))),
            Err(ConfigError::WindowTooLong { .. })
        ));
        assert!(matches!(
            Quota::sliding_window(Rate::per_day(1_000_000)),
            Err(ConfigError::OutOfRange { .. })
        ));
        assert!(Quota::sliding_window(Rate::per_day(100_000)).is_ok());
        assert!(matches!(
            Quota::token_bucket(Rate::new(7, Duration::from_secs(86_400 * 3)), u64::MAX / 2),
            Err(ConfigError::OutOfRange { .. })
        ));
    }

    /// Regression: a bucket whose full refill time nears 2^53 µs made the
    /// Redis scripts store `now + full`, past 2^53, off by one microsecond
    /// (found by contract 11 with a set's state read by a single quota).
    #[test]
    fn a_bucket_stays_exact_until_max_time() {
        // 3 per minute is 20,000,000 µs per token: 450,359,962 tokens is
        // 9.007e15 µs, past 2^52.
        assert!(matches!(
            Quota::token_bucket(Rate::per_minute(3), 450_359_962),
            Err(ConfigError::OutOfRange { field: "burst", .. })
        ));
        let max = MAX_BUCKET / 20_000_000;
        let q = Quota::token_bucket(Rate::per_minute(3), max).unwrap();
        let Algorithm::TokenBucket(b) = q.algorithm() else {
            panic!()
        };
        assert!(b.full() + b.refill() <= MAX_BUCKET);
        assert!(MAX_TIME + b.full() + b.refill() <= MAX_EXACT + 1);
        assert!(Quota::token_bucket(Rate::per_minute(3), max + 1).is_err());
    }

    #[test]
    fn bucket_units_are_reduced() {
        let q = Quota::token_bucket(Rate::per_minute(100), 20).unwrap();
        let Algorithm::TokenBucket(b) = q.algorithm() else {
            panic!()
        };
        assert_eq!((b.unit(), b.refill(), b.full()), (600_000, 1, 12_000_000));
        assert_eq!(q.window(), Duration::from_secs(12));
        let q = Quota::token_bucket(Rate::per_minute(7), 3).unwrap();
        let Algorithm::TokenBucket(b) = q.algorithm() else {
            panic!()
        };
        assert_eq!((b.unit(), b.refill()), (60_000_000, 7));
    }

    #[test]
    fn names_are_validated() {
        let q = Quota::fixed_window(Rate::per_second(1)).unwrap();
        assert_eq!(q.name(), "default");
        assert!(q.clone().named("gold-plan.v2").is_ok());
        for bad in ["", "a b", "a:b", "{x}", "é", &"x".repeat(65)] {
            assert!(q.clone().named(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_byte_of_a_name_is_checked_against_the_rule() {
        let q = Quota::fixed_window(Rate::per_second(1)).unwrap();
        for c in (0u8..=127).map(char::from) {
            let allowed = c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
            let name = format!("d0{c}f9");
            assert_eq!(q.clone().named(&name).is_ok(), allowed, "{name:?}");
        }
        for c in ['é', 'ÿ', '\u{80}', '\u{10ffff}'] {
            assert!(q.clone().named(&format!("ok{c}")).is_err(), "{c:?}");
        }
        assert!(q.clone().named(&"a".repeat(64)).is_ok());
        assert!(q.clone().named("d0123456789abcdef0123456789abcdef").is_ok());
    }

    #[test]
    fn sliding_logs_are_capped() {
        assert!(Quota::sliding_log(Rate::per_hour(MAX_SLIDING_LOG_LIMIT)).is_ok());
        let Err(ConfigError::OutOfRange { detail, .. }) =
            Quota::sliding_log(Rate::per_hour(MAX_SLIDING_LOG_LIMIT + 1))
        else {
            panic!("a sliding log above the cap is an error")
        };
        assert!(detail.contains("sliding window counter"), "{detail}");
    }

    #[test]
    fn costs_are_checked() {
        let q = Quota::sliding_log(Rate::per_second(5)).unwrap();
        assert!(q.check_cost(0).is_err());
        assert!(q.check_cost(5).is_ok());
        assert!(q.check_cost(6).is_err());
    }
}
