//! The key layout: `<prefix>:{<escaped caller>}:<policy>:<layout>`, the
//! policy left out when it has the default name (see [`key`]).
//!
//! Every key of one caller shares the hash tag `{<escaped caller>}`, so a
//! cluster routes all of a caller's keys to one slot and a multi-key script
//! never meets `CROSSSLOT`. The caller's bytes are percent-encoded: every byte
//! outside `A-Z a-z 0-9 - . _ ~` becomes `%XX` (upper-case hex). So the escaped
//! caller contains no `{`, `}`, `:`, `%` (other than as an escape), space,
//! control or non-ASCII byte; the empty caller is written as a lone `%`, which
//! no other caller produces, so the tag is never empty. Hence:
//!
//! - no input can choose the hash slot: the tag always ends at the `}` this
//!   module writes, and always covers the whole escaped caller;
//! - no two callers share a key: percent-encoding is injective, and the
//!   prefix (which may not contain braces) and the policy name (validated by
//!   [`Quota::named`]) cannot absorb or lend bytes across the braces.
//!
//! The cost is up to three bytes per escaped byte, so a 10 KB caller makes a
//! key of at most about 30 KB, well inside Redis' 512 MB key limit.
//!
//! `ratelimit-cluster` uses this same layout.
//!
//! ```
//! use ratelimit_core::{Quota, Rate};
//! use ratelimit_redis::keys;
//!
//! let quota = Quota::token_bucket(Rate::per_minute(100), 20)?.named("plan")?;
//! assert_eq!(keys::key("rl", b"api:user {42}", &quota), "rl:{api%3Auser%20%7B42%7D}:plan:tb2");
//! let default = Quota::token_bucket(Rate::per_minute(100), 20)?;
//! assert_eq!(keys::key("rl", b"api~42", &default), "rl:{api~42}:tb2");
//! # Ok::<(), ratelimit_core::ConfigError>(())
//! ```

use ratelimit_core::{AlgorithmKind, Quota};

/// The default key prefix: `rl`.
pub const DEFAULT_PREFIX: &str = "rl";

/// The longest prefix accepted.
pub const MAX_PREFIX_LEN: usize = 64;

fn is_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Appends the escaped form of `caller` to `out`: bytes in
/// `A-Z a-z 0-9 - . _ ~` as they are, every other byte as `%XX`; the empty
/// caller as a lone `%` (empty braces `{}` would make Redis hash the whole
/// key, splitting one caller's keys across slots).
pub fn escape_into(caller: &[u8], out: &mut String) {
    if caller.is_empty() {
        out.push('%');
        return;
    }
    out.reserve(caller.len());
    for &b in caller {
        if is_safe(b) {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
    }
}

/// The escaped form of `caller` (see the module docs).
///
/// ```
/// assert_eq!(ratelimit_redis::keys::escape(b"a:b%{c}\n\xff"), "a%3Ab%25%7Bc%7D%0A%FF");
/// ```
pub fn escape(caller: &[u8]) -> String {
    let mut out = String::with_capacity(caller.len());
    escape_into(caller, &mut out);
    out
}

/// Reverses [`escape`]; `None` if `escaped` is not something [`escape`] makes.
pub fn unescape(escaped: &str) -> Option<Vec<u8>> {
    fn hex(b: u8) -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    }
    if escaped == "%" {
        return Some(Vec::new());
    }
    let bytes = escaped.as_bytes();
    if bytes.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hi = hex(*bytes.get(i + 1)?)?;
            let lo = hex(*bytes.get(i + 2)?)?;
            let v = (hi << 4) | lo;
            if is_safe(v) {
                return None;
            }
            out.push(v);
            i += 3;
        } else if is_safe(b) {
            out.push(b);
            i += 1;
        } else {
            return None;
        }
    }
    Some(out)
}

/// Checks a key prefix: 1 to [`MAX_PREFIX_LEN`] characters of
/// `A-Z a-z 0-9 _ - . :`. Braces are refused because they would move the
/// hash tag.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    let ok = !prefix.is_empty()
        && prefix.len() <= MAX_PREFIX_LEN
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid key prefix {prefix:?}: use 1 to {MAX_PREFIX_LEN} characters of A-Z a-z 0-9 _ - . :"
        ))
    }
}

/// The layout code of an algorithm's stored state, the last part of its
/// keys: the algorithm's code ([`AlgorithmKind::code`]) followed by the
/// layout version when the stored layout has changed since the first one.
///
/// | algorithm | code | stored state |
/// |---|---|---|
/// | fixed window | `fw` | string `window:count` |
/// | sliding window counter | `sw` | string `window:prev:curr` |
/// | sliding log | `sl2` | two sorted sets: `…:sl2` (score time, member call id) and `…:sl2:c` (score cumulative cost, same ids) |
/// | token bucket | `tb2` | integer `tat` (µs), or string `tat:rem` |
///
/// A new layout gets a new code, so a server upgraded in place never reads
/// a state written in another layout: keys of the old layout are left alone
/// and expire by their own TTL.
pub const fn layout_code(kind: AlgorithmKind) -> &'static str {
    match kind {
        AlgorithmKind::FixedWindow => "fw",
        AlgorithmKind::SlidingWindow => "sw",
        AlgorithmKind::SlidingLog => "sl2",
        AlgorithmKind::TokenBucket => "tb2",
        // `AlgorithmKind` is non-exhaustive: a later algorithm's first layout.
        other => other.code(),
    }
}

/// The policy name left out of keys: a quota with the default name writes
/// `<prefix>:{<caller>}:<layout>`, every other `<prefix>:{<caller>}:<policy>:<layout>`.
/// Policy names cannot contain `:`, so the two forms never meet.
pub const DEFAULT_POLICY: &str = "default";

/// The Redis key holding `caller`'s state under `quota`:
/// `<prefix>:{<escaped caller>}:<policy>:<layout>`, or
/// `<prefix>:{<escaped caller>}:<layout>` for the default policy name (see
/// [`layout_code`] and [`DEFAULT_POLICY`]).
///
/// `prefix` should have passed [`check_prefix`].
pub fn key(prefix: &str, caller: &[u8], quota: &Quota) -> String {
    let name = quota.name();
    let code = layout_code(quota.kind());
    let mut out = String::with_capacity(prefix.len() + caller.len() + name.len() + 9);
    out.push_str(prefix);
    out.push_str(":{");
    escape_into(caller, &mut out);
    out.push_str("}:");
    if name != DEFAULT_POLICY {
        out.push_str(name);
        out.push(':');
    }
    out.push_str(code);
    out
}

/// The part of `key` Redis Cluster hashes: between the first `{` and the
/// next `}` if that is non-empty, else the whole key (Redis' own rule).
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::Rate;

    #[test]
    fn escape_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let e = escape(&all);
        assert!(e.bytes().all(is_safe_or_escape));
        assert_eq!(unescape(&e).unwrap(), all);
    }

    fn is_safe_or_escape(b: u8) -> bool {
        is_safe(b) || b == b'%'
    }

    #[test]
    fn hash_tag_is_the_whole_escaped_caller() {
        let q = Quota::fixed_window(Rate::per_minute(1)).unwrap();
        for caller in [&b"{x}"[..], b"}{", b"", b"a:b", b"%7B", b"\xff\x00 \n"] {
            let k = key("rl", caller, &q);
            let tag = hash_tag(k.as_bytes());
            assert_eq!(unescape(std::str::from_utf8(tag).unwrap()).unwrap(), caller);
        }
    }

    #[test]
    fn prefixes_with_braces_are_refused() {
        assert!(check_prefix("rl").is_ok());
        assert!(check_prefix("app:rl").is_ok());
        assert!(check_prefix("r{l").is_err());
        assert!(check_prefix("").is_err());
    }
}
