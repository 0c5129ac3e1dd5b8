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

/// A duration as a person writes it: in the largest unit that divides it
/// exactly (`d`, `h`, `m`, `s`, `ms`, `µs`), so 400 days is `"400d"`, not
/// `"34560000s"`, and 90 seconds `"90s"`. Zero is `"0s"`; a duration that is
/// not a whole number of microseconds is written in microseconds with
/// decimals (`"0.5µs"`). Every result reads back with the units of a file.
pub(crate) fn human_duration(d: Duration) -> String {
    const STEPS: &[(u128, &str)] = &[
        (86_400 * NANOS_PER_SEC, "d"),
        (3_600 * NANOS_PER_SEC, "h"),
        (60 * NANOS_PER_SEC, "m"),
        (NANOS_PER_SEC, "s"),
        (1_000_000, "ms"),
        (1_000, "µs"),
    ];
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    for &(per, unit) in STEPS {
        if nanos.is_multiple_of(per) {
            return format!("{}{unit}", nanos / per);
        }
    }
    let fraction = format!("{:03}", nanos % 1_000);
    format!("{}.{}µs", nanos / 1_000, fraction.trim_end_matches('0'))
}

/// Rewrites, in `message`, each whole-word `Debug` form of `durations`
/// (`"34560000s"`, which is how `ratelimit-core` prints a `Duration`) in
/// [`human_duration`]'s form (`"400d"`). A word is whole when no letter or
/// digit touches it (nor a `.` before it), so `"60s"` inside `"360s"` or
/// `"1.60s"` is left alone.
pub(crate) fn humanize_durations(message: &str, durations: &[Duration]) -> String {
    let mut out = message.to_owned();
    for &d in durations {
        let (from, to) = (format!("{d:?}"), human_duration(d));
        if from != to {
            out = replace_word(&out, &from, &to);
        }
    }
    out
}

fn replace_word(text: &str, from: &str, to: &str) -> String {
    let word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let mut out = String::with_capacity(text.len());
    let mut done = 0;
    for (at, _) in text.match_indices(from) {
        if at < done {
            continue;
        }
        let end = at + from.len();
        let before = text[..at].chars().next_back();
        if word(before) || before == Some('.') || word(text[end..].chars().next()) {
            continue;
        }
        out.push_str(&text[done..at]);
        out.push_str(to);
        done = end;
    }
    out.push_str(&text[done..]);
    out
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
    fn durations_are_printed_in_the_largest_exact_unit() {
        let cases = [
            (Duration::from_secs(400 * 86_400), "400d"),
            (Duration::from_secs(86_400), "1d"),
            (Duration::from_secs(90_000), "25h"),
            (Duration::from_secs(3_600), "1h"),
            (Duration::from_secs(900), "15m"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_millis(1_500), "1500ms"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_micros(7), "7µs"),
            (Duration::from_micros(1_000_001), "1000001µs"),
            (Duration::from_nanos(500), "0.5µs"),
            (Duration::from_nanos(1_000_000_500), "1000000.5µs"),
            (Duration::ZERO, "0s"),
        ];
        for (d, text) in cases {
            assert_eq!(human_duration(d), text, "{d:?}");
            assert_eq!(parse_duration(text, false).unwrap(), d, "{text} reads back");
        }
    }

    #[test]
    fn debug_durations_in_a_message_are_rewritten_as_whole_words() {
        let year = Duration::from_secs(400 * 86_400);
        assert_eq!(
            humanize_durations("window must be at most 34560000s", &[year]),
            "window must be at most 400d"
        );
        let minute = Duration::from_secs(60);
        assert_eq!(
            humanize_durations("60s, 360s, 60sec, 1.60s, 60s.", &[minute]),
            "1m, 360s, 60sec, 1.60s, 1m."
        );
        assert_eq!(
            humanize_durations("at 7 per 259200s is", &[Duration::from_secs(259_200)]),
            "at 7 per 3d is"
        );
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
