//! Human units: rates such as `"100/min"` and durations such as `"15m"`.
//!
//! Parsing only turns text into numbers, exactly (no floating point). Whether
//! the numbers make a usable quota (zero, too long, too precise, too large) is
//! decided by `ratelimit-core`'s constructors, never here.

use std::time::Duration;

use ratelimit_core::Rate;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// The unit names accepted, with their length in nanoseconds.
const UNITS: &[(&[&str], u128)] = &[
    (&["us", "µs", "μs", "usec", "usecs"], 1_000),
    (&["ms", "msec", "msecs"], 1_000_000),
    (&["s", "sec", "secs", "second", "seconds"], NANOS_PER_SEC),
    (
        &["m", "min", "mins", "minute", "minutes"],
        60 * NANOS_PER_SEC,
    ),
    (&["h", "hr", "hrs", "hour", "hours"], 3_600 * NANOS_PER_SEC),
    (&["d", "day", "days"], 86_400 * NANOS_PER_SEC),
];

/// What a unit list looks like in an error message.
pub(crate) const UNIT_LIST: &str = "us, ms, s, m (minute), h, d";

fn unit_nanos(unit: &str) -> Option<u128> {
    let unit = unit.to_lowercase();
    UNITS
        .iter()
        .find(|(names, _)| names.contains(&unit.as_str()))
        .map(|&(_, nanos)| nanos)
}

/// Parses a duration: a number (whole or decimal) and a unit, e.g. `"15m"`,
/// `"1.5s"`, `"500 ms"`. With `number_optional`, a bare unit (`"min"`) means
/// one of it, as in the period of `"100/min"`.
pub(crate) fn parse_duration(text: &str, number_optional: bool) -> Result<Duration, String> {
    let text = text.trim();
    if text.starts_with('-') {
        return Err(format!("{text:?} is negative"));
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = (text[..split].trim(), text[split..].trim());
    if unit.is_empty() {
        return Err(format!("{text:?} has no unit"));
    }
    let Some(per_unit) = unit_nanos(unit) else {
        return Err(format!("unknown unit {unit:?}"));
    };
    if number.is_empty() {
        return if number_optional {
            nanos_to_duration(per_unit, text)
        } else {
            Err(format!("{text:?} has no number before its unit"))
        };
    }
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(format!("{number:?} in {text:?} is not a number"));
    }
    let too_large = || format!("{text:?} is too large");
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_large())?
    };
    let mut nanos = whole.checked_mul(per_unit).ok_or_else(too_large)?;
    if !fraction.is_empty() {
        let scale = u32::try_from(fraction.len())
            .ok()
            .and_then(|n| 10u128.checked_pow(n))
            .ok_or_else(|| format!("{number:?} in {text:?} has too many decimals"))?;
        let digits: u128 = fraction
            .parse()
            .map_err(|_| format!("{number:?} in {text:?} has too many decimals"))?;
        let part = digits.checked_mul(per_unit).ok_or_else(too_large)?;
        if part % scale != 0 {
            return Err(format!("{text:?} is not a whole number of nanoseconds"));
        }
        nanos = nanos.checked_add(part / scale).ok_or_else(too_large)?;
    }
    nanos_to_duration(nanos, text)
}

fn nanos_to_duration(nanos: u128, text: &str) -> Result<Duration, String> {
    let secs =
        u64::try_from(nanos / NANOS_PER_SEC).map_err(|_| format!("{text:?} is too large"))?;
    // The remainder is below 10^9, so it fits.
    let sub = u32::try_from(nanos % NANOS_PER_SEC).unwrap_or(0);
    Ok(Duration::new(secs, sub))
}

/// Parses a rate: `"<count>/<period>"`, e.g. `"100/min"`, `"10/s"`,
/// `"5/15m"`, `"1000 / 1h"`.
pub(crate) fn parse_rate(text: &str) -> Result<Rate, String> {
    let trimmed = text.trim();
    let Some((count, period)) = trimmed.split_once('/') else {
        return Err(format!("{trimmed:?} has no \"/\""));
    };
    let count = count.trim();
    if count.starts_with('-') {
        return Err(format!("the count {count:?} is negative"));
    }
    if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("the count {count:?} is not a whole number"));
    }
    let count: u64 = count
        .parse()
        .map_err(|_| format!("the count {count:?} is too large"))?;
    let period = parse_duration(period, true).map_err(|e| format!("the period: {e}"))?;
    Ok(Rate::new(count, period))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok = |s: &str| parse_duration(s, false).unwrap();
        assert_eq!(ok("15m"), Duration::from_secs(900));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok(".5 s"), Duration::from_millis(500));
        assert_eq!(ok("500 ms"), Duration::from_millis(500));
        assert_eq!(ok("1H"), Duration::from_secs(3600));
        assert_eq!(ok("2 days"), Duration::from_secs(172_800));
        assert_eq!(ok("7µs"), Duration::from_micros(7));
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("0.0000005s"), Duration::from_nanos(500));
        assert_eq!(
            parse_duration("min", true).unwrap(),
            Duration::from_secs(60)
        );
        for bad in [
            "min",
            "15",
            "-1m",
            "1.2.3s",
            "1x",
            ".s",
            "1e3s",
            "0.0000000001s",
            "99999999999999999999999999d",
        ] {
            assert!(parse_duration(bad, false).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("100/min").unwrap(), Rate::per_minute(100));
        assert_eq!(parse_rate(" 10 / s ").unwrap(), Rate::per_second(10));
        assert_eq!(
            parse_rate("5/15m").unwrap(),
            Rate::new(5, Duration::from_secs(900))
        );
        assert_eq!(parse_rate("0/min").unwrap(), Rate::per_minute(0));
        for bad in [
            "100",
            "100/",
            "/min",
            "-1/min",
            "1.5/min",
            "ten/min",
            "100/fortnight",
            "100/-1m",
            "99999999999999999999999/s",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }
}
