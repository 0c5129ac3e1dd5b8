//! The key layout: `<prefix>:{<tag>}:<policy>:<layout>`, where the tag is
//! the escaped caller, or a hash of it for long callers, and the policy is
//! left out when it has the default name (see [`key`]).
//!
//! Every key of one caller shares the hash tag `{<tag>}`, so a cluster
//! routes all of a caller's keys to one slot and a multi-key script never
//! meets `CROSSSLOT`. The caller's bytes are percent-encoded: every byte
//! outside `A-Z a-z 0-9 - . _ ~` becomes `%XX` (upper-case hex). So the
//! escaped caller contains no `{`, `}`, `:`, `#`, `%` (other than as an
//! escape), space, control or non-ASCII byte; the empty caller is written as
//! a lone `%`, which no other caller produces, so the tag is never empty.
//!
//! **Long callers are hashed.** A caller whose escaped form is longer than
//! [`MAX_ESCAPED_CALLER_LEN`] (128) bytes gets the tag `#<sha256>`: a `#`
//! and the 64 lower-case hex digits of the SHA-256 of the caller's raw bytes
//! (65 bytes). Escaping turns every `#` into `%23`, so no escaped caller
//! starts with `#` and a hashed tag never equals an escaped one. Hence:
//!
//! - no input can choose the hash slot: the tag always ends at the `}` this
//!   module writes, and always covers the whole escaped (or hashed) caller;
//! - no two callers share a key: percent-encoding is injective, two long
//!   callers share a tag only if their SHA-256 digests collide, a short and
//!   a long caller never (the `#`), and the prefix (which may not contain
//!   braces) and the policy name (validated by [`Quota::named`]) cannot
//!   absorb or lend bytes across the braces;
//! - every key is bounded: at most [`MAX_KEY_LEN`] bytes whatever the
//!   caller (a 10 KB caller of `{`, 30 KB escaped, makes a key of under 100
//!   bytes with prefix `rl`).
//!
//! Hashing costs nothing in isolation or placement, only readability: a long
//! caller's key no longer shows who it is. Callers up to 42 bytes are never
//! hashed (even if every byte is escaped), callers of only safe bytes up to
//! 128. Keys written before long callers were hashed (when the tag was the
//! escaped caller, however long) are not read any more: such a caller
//! starts from a fresh state once, and the old key expires by its TTL.
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
//!
//! let long = keys::key("rl", &[b'{'; 10_240], &quota);
//! assert!(long.starts_with("rl:{#"));
//! assert!(long.len() < 100);
//! # Ok::<(), ratelimit_core::ConfigError>(())
//! ```

use ratelimit_core::{AlgorithmKind, Quota};
use sha2::{Digest, Sha256};

/// The default key prefix: `rl`.
pub const DEFAULT_PREFIX: &str = "rl";

/// The longest prefix accepted.
pub const MAX_PREFIX_LEN: usize = 64;

/// The longest escaped caller written as it is in the hash tag; a caller
/// whose escaped form is longer is hashed (see the module docs).
pub const MAX_ESCAPED_CALLER_LEN: usize = 128;

/// The length of a hashed tag: `#` and 64 hex digits.
pub const HASHED_TAG_LEN: usize = 65;

/// The longest policy name [`Quota::named`] accepts.
pub const MAX_POLICY_NAME_LEN: usize = 64;

/// Room left for the algorithm code (2 to 4 characters).
const MAX_CODE_LEN: usize = 4;

/// The longest key this module makes, for any caller: a prefix of
/// [`MAX_PREFIX_LEN`], `:{`, a tag of at most [`MAX_ESCAPED_CALLER_LEN`],
/// `}:`, a policy name of [`MAX_POLICY_NAME_LEN`], `:` and an algorithm code
/// of at most 4 characters: 265 bytes.
pub const MAX_KEY_LEN: usize =
    MAX_PREFIX_LEN + 2 + MAX_ESCAPED_CALLER_LEN + 2 + MAX_POLICY_NAME_LEN + 1 + MAX_CODE_LEN;

fn is_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";
const HEX_LOWER: &[u8; 16] = b"0123456789abcdef";

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

/// The length of `caller`'s escaped form, without building it.
pub fn escaped_len(caller: &[u8]) -> usize {
    if caller.is_empty() {
        return 1;
    }
    caller.iter().map(|&b| if is_safe(b) { 1 } else { 3 }).sum()
}

/// Appends the hash tag's content for `caller` to `out`: its escaped form
/// ([`escape_into`]) when that is at most [`MAX_ESCAPED_CALLER_LEN`] bytes,
/// else `#` and the lower-case hex SHA-256 of the caller's bytes.
pub fn tag_into(caller: &[u8], out: &mut String) {
    tag_into_escaping_to(caller, escaped_len(caller), out);
}

/// As [`tag_into`], `escaped` being [`escaped_len`] of `caller`.
fn tag_into_escaping_to(caller: &[u8], escaped: usize, out: &mut String) {
    if escaped <= MAX_ESCAPED_CALLER_LEN {
        // Every byte safe (the empty caller's escaped length is 1): safe
        // bytes are ASCII, so the caller goes in as it is, in one copy.
        let whole = (escaped == caller.len())
            .then(|| std::str::from_utf8(caller).ok())
            .flatten();
        match whole {
            Some(s) => out.push_str(s),
            None => escape_into(caller, out),
        }
        return;
    }
    let digest = Sha256::digest(caller);
    out.reserve(HASHED_TAG_LEN);
    out.push('#');
    for b in digest {
        out.push(char::from(HEX_LOWER[usize::from(b >> 4)]));
        out.push(char::from(HEX_LOWER[usize::from(b & 0x0f)]));
    }
}

/// The hash tag's content for `caller`, what a key holds between `{` and
/// `}` (see [`tag_into`]).
///
/// ```
/// use ratelimit_redis::keys;
/// assert_eq!(keys::tag(b"user:42"), "user%3A42");
/// let long = keys::tag(&[b'k'; 129]);
/// assert_eq!(long.len(), keys::HASHED_TAG_LEN);
/// assert!(long.starts_with('#'));
/// ```
pub fn tag(caller: &[u8]) -> String {
    let mut out = String::with_capacity(escaped_len(caller).min(MAX_ESCAPED_CALLER_LEN));
    tag_into(caller, &mut out);
    out
}

/// The escaped form of `caller` (see the module docs). Keys hold it only up
/// to [`MAX_ESCAPED_CALLER_LEN`] bytes: see [`tag`].
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
/// `<prefix>:{<tag>}:<policy>:<layout>`, or `<prefix>:{<tag>}:<layout>`
/// for the default policy name (see [`layout_code`] and [`DEFAULT_POLICY`]),
/// the tag as [`tag`] makes it; at most [`MAX_KEY_LEN`] bytes.
///
/// `prefix` should have passed [`check_prefix`].
pub fn key(prefix: &str, caller: &[u8], quota: &Quota) -> String {
    let name = quota.name();
    let code = layout_code(quota.kind());
    let escaped = escaped_len(caller);
    let caller_len = escaped.min(MAX_ESCAPED_CALLER_LEN);
    let mut out = String::with_capacity(prefix.len() + caller_len + name.len() + 9);
    out.push_str(prefix);
    out.push_str(":{");
    tag_into_escaping_to(caller, escaped, &mut out);
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
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// The number of hash slots of Redis Cluster.
pub const SLOTS: usize = 16_384;

/// The hash slot of `key` in Redis Cluster: CRC16 (XMODEM) of its
/// [`hash_tag`], modulo [`SLOTS`].
///
/// ```
/// // Redis' own example: CLUSTER KEYSLOT foo is 12182.
/// assert_eq!(ratelimit_redis::keys::slot(b"foo"), 12182);
/// assert_eq!(ratelimit_redis::keys::slot(b"a{foo}b"), 12182);
/// ```
pub fn slot(key: &[u8]) -> u16 {
    // SLOTS is 2^14: the modulo is a mask, and the result fits in u16.
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key)) & 0x3FFF
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
        for caller in [
            &b"{x}"[..],
            b"}{",
            b"",
            b"a:b",
            b"%7B",
            b"\xff\x00 \n",
            b"#x",
        ] {
            let k = key("rl", caller, &q);
            let tag = hash_tag(k.as_bytes());
            assert_eq!(unescape(std::str::from_utf8(tag).unwrap()).unwrap(), caller);
        }
    }

    #[test]
    fn long_callers_are_hashed_into_a_bounded_tag() {
        let q = Quota::fixed_window(Rate::per_minute(1)).unwrap();
        // 42 bytes that all escape: 126 escaped bytes, kept.
        let short = vec![b'{'; 42];
        assert_eq!(tag(&short), escape(&short));
        // One more: 129 escaped bytes, hashed.
        let long = vec![b'{'; 43];
        let t = tag(&long);
        assert_eq!(t.len(), HASHED_TAG_LEN);
        assert!(t.starts_with('#'));
        assert!(
            t[1..]
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        // 128 safe bytes kept, 129 hashed.
        assert_eq!(tag(&[b'k'; 128]), "k".repeat(128));
        assert!(tag(&[b'k'; 129]).starts_with('#'));
        // Differ in the last byte: different tags.
        let mut other = long.clone();
        *other.last_mut().unwrap() = b'}';
        assert_ne!(tag(&other), t);
        // No escaped caller starts with `#`.
        assert_eq!(escape(b"#abc"), "%23abc");
        // The hashed key's tag is the hashed tag, and the key is short.
        let k = key("rl", &[b'{'; 10 * 1024], &q);
        assert_eq!(hash_tag(k.as_bytes()), tag(&[b'{'; 10 * 1024]).as_bytes());
        assert!(k.len() < 100, "{k}");
    }

    #[test]
    fn every_key_is_within_the_bound() {
        let prefix = "p".repeat(MAX_PREFIX_LEN);
        assert!(check_prefix(&prefix).is_ok());
        let name = "n".repeat(MAX_POLICY_NAME_LEN);
        let q = Quota::sliding_log(Rate::per_minute(1))
            .unwrap()
            .named(&name)
            .unwrap();
        assert!(
            Quota::fixed_window(Rate::per_minute(1))
                .unwrap()
                .named(&"n".repeat(MAX_POLICY_NAME_LEN + 1))
                .is_err(),
            "MAX_POLICY_NAME_LEN follows Quota::named"
        );
        let mut longest = 0;
        for len in 0..400 {
            for fill in [b'k', b'{', 0xff] {
                let k = key(&prefix, &vec![fill; len], &q);
                longest = longest.max(k.len());
            }
        }
        assert!(longest <= MAX_KEY_LEN, "{longest} > {MAX_KEY_LEN}");
        assert!(longest >= MAX_KEY_LEN - MAX_CODE_LEN, "the bound is tight");
    }

    #[test]
    fn prefixes_with_braces_are_refused() {
        assert!(check_prefix("rl").is_ok());
        assert!(check_prefix("app:rl").is_ok());
        assert!(check_prefix("r{l").is_err());
        assert!(check_prefix("").is_err());
    }
}
