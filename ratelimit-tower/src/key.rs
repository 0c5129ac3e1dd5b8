//! Deriving the caller key from a request, and what to do when it cannot be.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::request::Parts;
use http::{HeaderName, HeaderValue, StatusCode};

use crate::problem::{AMBIGUOUS_KEY_TYPE, INVALID_KEY_TYPE, KEY_TOO_LONG_TYPE};

/// The longest caller identifier accepted, in bytes: an API key header's
/// value, a user id, or a key returned by [`KeyExtractor::from_fn`] or
/// [`KeyExtractor::try_from_fn`]. The built-ins' prefix (`key:`, `user:`)
/// comes on top. A longer one is rejected ([`KeyError::TooLong`]), so one
/// request cannot make the store hold an arbitrarily large key.
pub const MAX_KEY_LEN: usize = 256;

type KeyFn = dyn Fn(&Parts) -> Result<Option<String>, KeyError> + Send + Sync;

/// Why a caller key that a request does carry cannot be used.
///
/// A request without a key is not an error ([`KeyExtractor::extract`]
/// returns `Ok(None)` and the [`MissingKey`] setting decides); a request
/// whose key is present but unusable is one of these, and the layer answers
/// it with a client error of its own (never counted, never passed on, never
/// replaced by another extractor's key):
///
/// | error | status | problem type |
/// |---|---|---|
/// | [`KeyError::TooLong`] from a header | `431 Request Header Fields Too Large` | [`crate::KEY_TOO_LONG_TYPE`] |
/// | [`KeyError::TooLong`] otherwise | `400 Bad Request` | [`crate::KEY_TOO_LONG_TYPE`] |
/// | [`KeyError::Duplicate`] | `400 Bad Request` | [`crate::AMBIGUOUS_KEY_TYPE`] |
/// | [`KeyError::NotVisibleAscii`], [`KeyError::Invalid`] | `400 Bad Request` | [`crate::INVALID_KEY_TYPE`] |
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is longer than `max` bytes.
    TooLong {
        /// The header it was read from, if it was read from one.
        header: Option<HeaderName>,
        /// Its length in bytes.
        len: usize,
        /// The longest accepted ([`MAX_KEY_LEN`]).
        max: usize,
    },
    /// The header carrying the key is sent more than once: which one is
    /// the caller is ambiguous, and taking the first (or the last) would let
    /// a client or an intermediary choose.
    Duplicate {
        /// The repeated header.
        header: HeaderName,
    },
    /// The header carrying the key holds bytes other than visible ASCII
    /// (and spaces and tabs).
    NotVisibleAscii {
        /// The header.
        header: HeaderName,
    },
    /// Rejected by a [`KeyExtractor::try_from_fn`] of your own, with the
    /// reason given to the client.
    Invalid(String),
}

impl KeyError {
    /// The status the layer answers this error with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::TooLong {
                header: Some(_), ..
            } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// The problem type of the layer's answer.
    pub fn problem_type(&self) -> &'static str {
        match self {
            Self::TooLong { .. } => KEY_TOO_LONG_TYPE,
            Self::Duplicate { .. } => AMBIGUOUS_KEY_TYPE,
            Self::NotVisibleAscii { .. } | Self::Invalid(_) => INVALID_KEY_TYPE,
        }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLong {
                header: Some(header),
                len,
                max,
            } => write!(
                f,
                "the caller key in header {header} is {len} bytes long; at most {max} bytes are accepted"
            ),
            Self::TooLong {
                header: None,
                len,
                max,
            } => write!(
                f,
                "the caller key is {len} bytes long; at most {max} bytes are accepted"
            ),
            Self::Duplicate { header } => write!(
                f,
                "ambiguous caller key: header {header} is sent more than once; send it exactly once"
            ),
            Self::NotVisibleAscii { header } => write!(
                f,
                "the caller key in header {header} contains bytes other than visible ASCII"
            ),
            Self::Invalid(reason) => f.write_str(reason),
        }
    }
}

impl std::error::Error for KeyError {}

/// Derives the caller key (who is being limited) from the request head.
///
/// The built-ins prefix their keys with what they are (`key:`, `user:`,
/// `ip:`), so an API key can never collide with an IP address or a user
/// name. Keys are passed to the store verbatim (the store escapes them);
/// hash them in a [`KeyExtractor::from_fn`] if your store's keys should not
/// contain API keys in clear.
///
/// # Contract
///
/// [`KeyExtractor::extract`] tells three cases apart: a key
/// (`Ok(Some(key))`), no key (`Ok(None)`: the [`MissingKey`] setting
/// decides), and a key that is present but unusable (`Err(`[`KeyError`]`)`:
/// too long, sent twice, bytes that are not visible ASCII). Only a missing
/// key falls through to the next extractor of an [`KeyExtractor::or`]: an
/// API key that is present but invalid is rejected, never silently replaced
/// by the client's IP address.
///
/// ```
/// use http::HeaderName;
/// use ratelimit_tower::{KeyError, KeyExtractor};
///
/// // The API key, else the client address.
/// let key = KeyExtractor::header(HeaderName::from_static("x-api-key"))
///     .or(KeyExtractor::client_ip());
/// let req = http::Request::builder()
///     .header("x-api-key", "k-123")
///     .body(())
///     .unwrap();
/// assert_eq!(key.extract(&req.into_parts().0), Ok(Some("key:k-123".into())));
///
/// // Two x-api-key headers: which caller is it? Neither, and no fallback.
/// let req = http::Request::builder()
///     .header("x-api-key", "k-123")
///     .header("x-api-key", "k-456")
///     .body(())
///     .unwrap();
/// assert!(matches!(
///     key.extract(&req.into_parts().0),
///     Err(KeyError::Duplicate { .. })
/// ));
/// ```
#[derive(Clone)]
pub struct KeyExtractor {
    f: Arc<KeyFn>,
    describe: Cow<'static, str>,
    /// What the extractor puts before the caller id (`key:`, `user:`,
    /// `ip:`); empty when it puts nothing or may put several.
    prefix: &'static str,
}

impl fmt::Debug for KeyExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("KeyExtractor").field(&self.describe).finish()
    }
}

impl KeyExtractor {
    /// The value of a request header, typically an API key (`x-api-key`):
    /// key `key:<value>`, surrounding whitespace trimmed.
    ///
    /// Absent, empty or only whitespace is a missing key. Present but
    /// unusable is a [`KeyError`]: sent more than once
    /// ([`KeyError::Duplicate`]; a single header line whose value contains
    /// commas is one value), longer than [`MAX_KEY_LEN`] bytes
    /// ([`KeyError::TooLong`]) or holding bytes other than visible ASCII,
    /// space and tab ([`KeyError::NotVisibleAscii`]).
    pub fn header(name: HeaderName) -> Self {
        let describe = Cow::Owned(format!("header({name})"));
        Self::new(describe, move |parts| {
            let mut values = parts.headers.get_all(&name).iter();
            let Some(value) = values.next() else {
                return Ok(None);
            };
            if values.next().is_some() {
                return Err(KeyError::Duplicate {
                    header: name.clone(),
                });
            }
            let value = value
                .to_str()
                .map_err(|_| KeyError::NotVisibleAscii {
                    header: name.clone(),
                })?
                .trim();
            if value.is_empty() {
                return Ok(None);
            }
            check_len(value, Some(&name))?;
            Ok(Some(format!("key:{value}")))
        })
        .prefixed("key:")
    }

    /// An authenticated user, placed in the request extensions by an
    /// authentication layer that runs before this one: key `user:<id>`,
    /// where `id` is what `f` returns for the extension of type `T`. No
    /// extension, `None` or an empty id is a missing key; an id longer than
    /// [`MAX_KEY_LEN`] is [`KeyError::TooLong`].
    ///
    /// ```
    /// use ratelimit_tower::KeyExtractor;
    /// #[derive(Clone)]
    /// struct User { id: u64 }
    /// let key = KeyExtractor::extension(|u: &User| Some(u.id.to_string()));
    /// let mut req = http::Request::new(());
    /// req.extensions_mut().insert(User { id: 7 });
    /// assert_eq!(key.extract(&req.into_parts().0), Ok(Some("user:7".into())));
    /// ```
    pub fn extension<T, F>(f: F) -> Self
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> Option<String> + Send + Sync + 'static,
    {
        let describe = Cow::Owned(format!("extension({})", std::any::type_name::<T>()));
        Self::new(describe, move |parts| {
            let Some(id) = parts.extensions.get::<T>().and_then(&f) else {
                return Ok(None);
            };
            if id.is_empty() {
                return Ok(None);
            }
            check_len(&id, None)?;
            Ok(Some(format!("user:{id}")))
        })
        .prefixed("user:")
    }

    /// The client's IP address from the connection: key `ip:<address>`.
    ///
    /// Read from a [`SocketAddr`] in the request extensions (insert it
    /// yourself when serving with plain hyper) or, with the `axum` feature,
    /// from axum's `ConnectInfo<SocketAddr>` (serve with
    /// `into_make_service_with_connect_info::<SocketAddr>()`).
    ///
    /// Behind a reverse proxy every request comes from the proxy: use
    /// [`KeyExtractor::forwarded_ip`] there.
    pub fn client_ip() -> Self {
        Self::new(Cow::Borrowed("client_ip"), |parts| {
            Ok(peer_addr(parts).map(|a| format!("ip:{}", a.ip())))
        })
        .prefixed("ip:")
    }

    /// The client's IP address as reported by trusted reverse proxies in a
    /// forwarded-for header (e.g. `x-forwarded-for`): key `ip:<address>`.
    ///
    /// Each proxy appends the address it received the request from, so only
    /// the entries added by your own proxies can be believed; anything to
    /// their left was sent by the client and may be forged. With
    /// `trusted_proxies` proxies in front of the service the client is the
    /// `trusted_proxies`-th entry from the right (1: the last entry). Fewer
    /// entries than that, or an entry that is not an IP address, counts as
    /// missing. Use it only when every request does pass through those
    /// proxies; otherwise a client can choose its own key.
    ///
    /// Unlike [`KeyExtractor::header`], repeated header lines are expected
    /// here (proxies may append a line instead of extending the last one)
    /// and are read in order as one list.
    pub fn forwarded_ip(header: HeaderName, trusted_proxies: usize) -> Self {
        let describe = Cow::Owned(format!("forwarded_ip({header}, {trusted_proxies})"));
        Self::new(describe, move |parts| {
            Ok(forwarded_entry(parts, &header, trusted_proxies).map(|ip| format!("ip:{ip}")))
        })
        .prefixed("ip:")
    }

    /// Any derivation of your own. Return `None` when the request carries no
    /// key (the [`MissingKey`] setting then decides); an empty key is
    /// missing too, and one longer than [`MAX_KEY_LEN`] is
    /// [`KeyError::TooLong`]. To reject a present but malformed key
    /// yourself, use [`KeyExtractor::try_from_fn`].
    pub fn from_fn(f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        Self::try_from_fn(move |parts| Ok(f(parts)))
    }

    /// Like [`KeyExtractor::from_fn`], for a derivation that can tell a
    /// missing key (`Ok(None)`) from a present but unusable one (`Err`, e.g.
    /// [`KeyError::Invalid`] with the reason to give the client).
    ///
    /// ```
    /// use ratelimit_tower::{KeyError, KeyExtractor};
    ///
    /// // The tenant is the first path segment, and must be alphanumeric.
    /// let key = KeyExtractor::try_from_fn(|parts| {
    ///     let Some(tenant) = parts.uri.path().split('/').nth(1).filter(|t| !t.is_empty()) else {
    ///         return Ok(None);
    ///     };
    ///     if !tenant.bytes().all(|b| b.is_ascii_alphanumeric()) {
    ///         return Err(KeyError::Invalid("the tenant must be alphanumeric".into()));
    ///     }
    ///     Ok(Some(format!("tenant:{tenant}")))
    /// });
    /// let parts = |uri| http::Request::get(uri).body(()).unwrap().into_parts().0;
    /// assert_eq!(key.extract(&parts("/acme/orders")), Ok(Some("tenant:acme".into())));
    /// assert_eq!(key.extract(&parts("/")), Ok(None));
    /// assert!(key.extract(&parts("/a.b/orders")).is_err());
    /// ```
    pub fn try_from_fn(
        f: impl Fn(&Parts) -> Result<Option<String>, KeyError> + Send + Sync + 'static,
    ) -> Self {
        Self::new(Cow::Borrowed("from_fn"), move |parts| {
            let Some(key) = f(parts)?.filter(|k| !k.is_empty()) else {
                return Ok(None);
            };
            check_len(&key, None)?;
            Ok(Some(key))
        })
    }

    /// This extractor, else `other` when this one finds **no** key. A key
    /// this one finds unusable ([`KeyError`]) is the answer: `other` is not
    /// asked.
    pub fn or(self, other: KeyExtractor) -> Self {
        let describe = Cow::Owned(format!("{}.or({})", self.describe, other.describe));
        Self::new(describe, move |parts| match self.extract(parts)? {
            Some(key) => Ok(Some(key)),
            None => other.extract(parts),
        })
    }

    /// This extractor, keeping only the keys that `accept` accepts: a key
    /// it rejects counts as **no key**, so that an [`KeyExtractor::or`]
    /// after it takes over (or, without one, the [`MissingKey`] setting
    /// decides).
    ///
    /// Use it whenever the key comes from something the client writes
    /// itself, such as an API key header that no earlier layer has
    /// authenticated. Limited on as it comes, every invented key is a new
    /// caller with a full budget of its own: a client that sends a fresh
    /// key with every request is never limited, and each key it invents
    /// takes memory in the store until its state expires (a daily quota
    /// keeps it about a day). Verified, an unknown key is limited with
    /// everything else that has no known key, typically by client address
    /// (`.or(KeyExtractor::client_ip())`), and only keys you issued get a
    /// budget of their own.
    ///
    /// `accept` sees the caller id without the built-ins' prefix (the API
    /// key itself for [`KeyExtractor::header`], the id for
    /// [`KeyExtractor::extension`], the address for the IP extractors), and
    /// the whole key for [`KeyExtractor::from_fn`],
    /// [`KeyExtractor::try_from_fn`] and an [`KeyExtractor::or`] chain. It
    /// runs on every request, inside the service's call: keep it to a
    /// lookup in memory (a set of known keys, a cache of your key store).
    /// A check that needs I/O belongs in an authentication layer before
    /// this one, with [`KeyExtractor::extension`] reading what it found.
    ///
    /// A key that is present but unusable ([`KeyError`]: too long, sent
    /// twice) is still rejected with its own answer; `accept` never sees it.
    ///
    /// ```
    /// use std::collections::HashSet;
    /// use std::net::SocketAddr;
    ///
    /// use http::HeaderName;
    /// use ratelimit_tower::KeyExtractor;
    ///
    /// // Keys this service issued; anything else is limited by address.
    /// let known: HashSet<String> = ["k-123".to_owned()].into();
    /// let key = KeyExtractor::header(HeaderName::from_static("x-api-key"))
    ///     .verified(move |api_key| known.contains(api_key))
    ///     .or(KeyExtractor::client_ip());
    ///
    /// let from = |api_key: Option<&str>| {
    ///     let mut req = http::Request::builder();
    ///     if let Some(k) = api_key {
    ///         req = req.header("x-api-key", k);
    ///     }
    ///     let mut parts = req.body(()).unwrap().into_parts().0;
    ///     let peer: SocketAddr = "203.0.113.7:50123".parse().unwrap();
    ///     parts.extensions.insert(peer);
    ///     parts
    /// };
    /// assert_eq!(key.extract(&from(Some("k-123"))), Ok(Some("key:k-123".into())));
    /// // An invented key buys no budget of its own: it is limited by address,
    /// // together with every other request from there without a known key.
    /// assert_eq!(key.extract(&from(Some("k-invented"))), Ok(Some("ip:203.0.113.7".into())));
    /// assert_eq!(key.extract(&from(None)), Ok(Some("ip:203.0.113.7".into())));
    /// ```
    pub fn verified(self, accept: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        let prefix = self.prefix;
        let describe = Cow::Owned(format!("{}.verified()", self.describe));
        Self::new(describe, move |parts| {
            Ok(self
                .extract(parts)?
                .filter(|key| accept(key.strip_prefix(prefix).unwrap_or(key))))
        })
        .prefixed(prefix)
    }

    /// The caller key of the request whose head is `parts`: `Ok(Some(key))`,
    /// `Ok(None)` when it carries none, or the [`KeyError`] that makes the
    /// key it carries unusable.
    pub fn extract(&self, parts: &Parts) -> Result<Option<String>, KeyError> {
        (self.f)(parts)
    }

    pub(crate) fn describe(&self) -> &str {
        &self.describe
    }

    fn new(
        describe: Cow<'static, str>,
        f: impl Fn(&Parts) -> Result<Option<String>, KeyError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            f: Arc::new(f),
            describe,
            prefix: "",
        }
    }

    fn prefixed(mut self, prefix: &'static str) -> Self {
        self.prefix = prefix;
        self
    }
}

/// `Err(TooLong)` when `id` is longer than [`MAX_KEY_LEN`].
fn check_len(id: &str, header: Option<&HeaderName>) -> Result<(), KeyError> {
    if id.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong {
            header: header.cloned(),
            len: id.len(),
            max: MAX_KEY_LEN,
        });
    }
    Ok(())
}

/// The `trusted_proxies`-th entry from the right of the forwarded-for list.
fn forwarded_entry(parts: &Parts, header: &HeaderName, trusted_proxies: usize) -> Option<IpAddr> {
    if trusted_proxies == 0 {
        return None;
    }
    let mut entries: Vec<&str> = Vec::new();
    for value in parts.headers.get_all(header) {
        entries.extend(value.to_str().ok()?.split(',').map(str::trim));
    }
    let entry = entries
        .len()
        .checked_sub(trusted_proxies)
        .map(|i| entries[i])?;
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|a| a.ip()))
}

impl Default for KeyExtractor {
    /// [`KeyExtractor::client_ip`].
    fn default() -> Self {
        Self::client_ip()
    }
}

fn peer_addr(parts: &Parts) -> Option<SocketAddr> {
    if let Some(addr) = parts.extensions.get::<SocketAddr>() {
        return Some(*addr);
    }
    #[cfg(feature = "axum")]
    if let Some(info) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(info.0);
    }
    None
}

/// What to answer when no caller key can be derived from a request.
///
/// Only for a *missing* key: a key that is present but unusable (too long,
/// sent twice, not visible ASCII) is always rejected with its own answer
/// ([`KeyError`]), even with [`MissingKey::Anonymous`]; it is never counted
/// in the anonymous bucket.
///
/// Never a panic and never a 500: either a clear client error with an
/// `application/problem+json` body of type [`crate::MISSING_KEY_TYPE`], or
/// one shared bucket for every such request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// `400 Bad Request` (the default).
    #[default]
    BadRequest,
    /// `401 Unauthorized` with this `WWW-Authenticate` challenge, for APIs
    /// where the key is a credential.
    Unauthorized {
        /// The `WWW-Authenticate` value, e.g. `ApiKey header="x-api-key"`.
        challenge: HeaderValue,
    },
    /// Count every keyless request against one shared key (under the same
    /// quota): anonymous callers share one bucket.
    Anonymous(String),
}

impl MissingKey {
    /// `401 Unauthorized` with `WWW-Authenticate: ApiKey header="<header>"`.
    pub fn unauthorized_api_key(header: &HeaderName) -> Self {
        let challenge = HeaderValue::from_str(&format!("ApiKey header=\"{header}\""))
            .unwrap_or_else(|_| HeaderValue::from_static("ApiKey"));
        Self::Unauthorized { challenge }
    }

    /// One shared bucket for all keyless requests, keyed `anonymous`.
    pub fn anonymous() -> Self {
        Self::Anonymous("anonymous".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const API_KEY: HeaderName = HeaderName::from_static("x-api-key");

    fn parts(f: impl FnOnce(http::request::Builder) -> http::request::Builder) -> Parts {
        f(http::Request::builder()).body(()).unwrap().into_parts().0
    }

    fn ip(s: &str) -> Result<Option<String>, KeyError> {
        Ok(Some(format!("ip:{s}")))
    }

    #[test]
    fn forwarded_takes_the_trusted_entry() {
        let xff = HeaderName::from_static("x-forwarded-for");
        let p = parts(|b| {
            b.header("x-forwarded-for", "6.6.6.6, 1.2.3.4")
                .header("x-forwarded-for", "10.0.0.1")
        });
        let fwd = |n| KeyExtractor::forwarded_ip(xff.clone(), n);
        assert_eq!(fwd(1).extract(&p), ip("10.0.0.1"));
        assert_eq!(fwd(2).extract(&p), ip("1.2.3.4"));
        assert_eq!(fwd(4).extract(&p), Ok(None));
        assert_eq!(fwd(0).extract(&p), Ok(None));
        let p = parts(|b| b.header("x-forwarded-for", "[::1]:80, garbage"));
        assert_eq!(fwd(1).extract(&p), Ok(None));
        assert_eq!(fwd(2).extract(&p), ip("::1"));
    }

    #[test]
    fn header_missing_and_fallback() {
        let key = KeyExtractor::header(API_KEY).or(KeyExtractor::client_ip());
        for blank in ["", "  "] {
            let mut p = parts(|b| b.header("x-api-key", blank));
            assert_eq!(key.extract(&p), Ok(None));
            p.extensions
                .insert("127.0.0.9:5000".parse::<SocketAddr>().unwrap());
            assert_eq!(key.extract(&p), ip("127.0.0.9"));
        }
        assert!(format!("{key:?}").contains("header(x-api-key).or(client_ip)"));
    }

    #[test]
    fn header_length_limit_is_on_the_value() {
        let key = KeyExtractor::header(API_KEY);
        let longest = "k".repeat(MAX_KEY_LEN);
        let p = parts(|b| b.header("x-api-key", format!(" {longest} ")));
        assert_eq!(key.extract(&p), Ok(Some(format!("key:{longest}"))));
        let p = parts(|b| b.header("x-api-key", format!("{longest}k")));
        let err = key.extract(&p).unwrap_err();
        assert_eq!(
            err,
            KeyError::TooLong {
                header: Some(API_KEY),
                len: MAX_KEY_LEN + 1,
                max: MAX_KEY_LEN
            }
        );
        assert_eq!(err.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        assert_eq!(err.problem_type(), KEY_TOO_LONG_TYPE);
        assert_eq!(
            err.to_string(),
            "the caller key in header x-api-key is 257 bytes long; at most 256 bytes are accepted"
        );
    }

    #[test]
    fn header_sent_twice_is_ambiguous_even_when_equal_or_blank() {
        let key = KeyExtractor::header(API_KEY);
        for (a, b) in [("k1", "k2"), ("k1", "k1"), ("k1", ""), ("", "")] {
            let p = parts(|r| r.header("x-api-key", a).header("x-api-key", b));
            let err = key.extract(&p).unwrap_err();
            assert_eq!(err, KeyError::Duplicate { header: API_KEY });
            assert_eq!(err.status(), StatusCode::BAD_REQUEST);
            assert_eq!(err.problem_type(), AMBIGUOUS_KEY_TYPE);
        }
        // One header line with a comma is one opaque value.
        let p = parts(|r| r.header("x-api-key", "k1, k2"));
        assert_eq!(key.extract(&p), Ok(Some("key:k1, k2".into())));
    }

    #[test]
    fn header_with_bytes_outside_visible_ascii_is_invalid() {
        let key = KeyExtractor::header(API_KEY);
        for raw in [&b"caf\xe9"[..], b"\x80key", b"\xff"] {
            let value = HeaderValue::from_bytes(raw).unwrap();
            let p = parts(|r| r.header("x-api-key", value));
            let err = key.extract(&p).unwrap_err();
            assert_eq!(err, KeyError::NotVisibleAscii { header: API_KEY });
            assert_eq!(err.status(), StatusCode::BAD_REQUEST);
            assert_eq!(err.problem_type(), INVALID_KEY_TYPE);
        }
    }

    #[test]
    fn a_present_but_unusable_key_never_falls_through() {
        let key = KeyExtractor::header(API_KEY).or(KeyExtractor::client_ip());
        let with_peer = |f: fn(http::request::Builder) -> http::request::Builder| {
            let mut p = parts(f);
            p.extensions
                .insert("127.0.0.9:5000".parse::<SocketAddr>().unwrap());
            p
        };
        let too_long = with_peer(|b| b.header("x-api-key", "k".repeat(MAX_KEY_LEN + 1)));
        assert!(matches!(
            key.extract(&too_long),
            Err(KeyError::TooLong { .. })
        ));
        let twice = with_peer(|b| b.header("x-api-key", "a").header("x-api-key", "b"));
        assert!(matches!(
            key.extract(&twice),
            Err(KeyError::Duplicate { .. })
        ));
        let bytes = with_peer(|b| b.header("x-api-key", HeaderValue::from_bytes(b"\xe9").unwrap()));
        assert!(matches!(
            key.extract(&bytes),
            Err(KeyError::NotVisibleAscii { .. })
        ));
        assert_eq!(key.extract(&with_peer(|b| b)), ip("127.0.0.9"));
    }

    #[test]
    fn a_key_that_fails_verification_is_no_key() {
        let key = KeyExtractor::header(API_KEY)
            .verified(|k| k == "known")
            .or(KeyExtractor::client_ip());
        let with_peer = |f: &dyn Fn(http::request::Builder) -> http::request::Builder| {
            let mut p = parts(f);
            p.extensions
                .insert("127.0.0.9:5000".parse::<SocketAddr>().unwrap());
            p
        };
        assert_eq!(
            key.extract(&with_peer(&|b| b.header("x-api-key", "known"))),
            Ok(Some("key:known".into()))
        );
        // Surrounding whitespace is trimmed before the check, as before the key.
        assert_eq!(
            key.extract(&with_peer(&|b| b.header("x-api-key", " known "))),
            Ok(Some("key:known".into()))
        );
        for unknown in ["invented", "key:known", "KNOWN"] {
            assert_eq!(
                key.extract(&with_peer(&|b| b.header("x-api-key", unknown))),
                ip("127.0.0.9"),
                "{unknown}"
            );
        }
        assert_eq!(key.extract(&with_peer(&|b| b)), ip("127.0.0.9"));
        assert!(
            format!("{key:?}").contains("header(x-api-key).verified().or(client_ip)"),
            "{key:?}"
        );

        // Without a fallback, an unknown key is a missing key.
        let alone = KeyExtractor::header(API_KEY).verified(|k| k == "known");
        assert_eq!(
            alone.extract(&parts(|b| b.header("x-api-key", "x"))),
            Ok(None)
        );
    }

    #[test]
    fn verification_never_hides_an_unusable_key() {
        let key = KeyExtractor::header(API_KEY)
            .verified(|_| panic!("an unusable key is never verified"))
            .or(KeyExtractor::client_ip());
        let twice = parts(|b| b.header("x-api-key", "a").header("x-api-key", "b"));
        assert!(matches!(
            key.extract(&twice),
            Err(KeyError::Duplicate { .. })
        ));
        let long = parts(|b| b.header("x-api-key", "k".repeat(MAX_KEY_LEN + 1)));
        assert!(matches!(key.extract(&long), Err(KeyError::TooLong { .. })));
    }

    #[test]
    fn verification_sees_the_id_without_the_built_in_prefix() {
        use std::sync::Mutex;
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let record = |e: KeyExtractor| {
            let seen = seen.clone();
            e.verified(move |k| {
                seen.lock().unwrap().push(k.to_owned());
                true
            })
        };
        let mut p = parts(|b| {
            b.header("x-api-key", "k1")
                .header("x-forwarded-for", "10.1.2.3")
        });
        p.extensions
            .insert("127.0.0.9:5000".parse::<SocketAddr>().unwrap());
        p.extensions.insert(7_u64);
        let xff = HeaderName::from_static("x-forwarded-for");
        for e in [
            KeyExtractor::header(API_KEY),
            KeyExtractor::extension(|u: &u64| Some(u.to_string())),
            KeyExtractor::client_ip(),
            KeyExtractor::forwarded_ip(xff, 1),
            KeyExtractor::from_fn(|_| Some("tenant:acme".into())),
            KeyExtractor::from_fn(|_| None).or(KeyExtractor::header(API_KEY)),
            // Verified twice: the inner check passes on what it saw.
            KeyExtractor::header(API_KEY).verified(|_| true),
        ] {
            assert!(record(e).extract(&p).unwrap().is_some());
        }
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "k1",
                "7",
                "127.0.0.9",
                "10.1.2.3",
                "tenant:acme",
                "key:k1",
                "k1"
            ]
        );
    }

    #[test]
    fn custom_and_extension_keys_are_bounded_too() {
        let long = "u".repeat(MAX_KEY_LEN + 1);
        let l = long.clone();
        let custom = KeyExtractor::from_fn(move |_| Some(l.clone()));
        let err = custom.extract(&parts(|b| b)).unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            err.to_string(),
            "the caller key is 257 bytes long; at most 256 bytes are accepted"
        );
        assert_eq!(
            KeyExtractor::from_fn(|_| Some(String::new())).extract(&parts(|b| b)),
            Ok(None)
        );

        let user = KeyExtractor::extension(|s: &String| Some(s.clone()));
        let mut p = parts(|b| b);
        assert_eq!(user.extract(&p), Ok(None));
        p.extensions.insert("u".repeat(MAX_KEY_LEN));
        assert_eq!(user.extract(&p).unwrap().unwrap().len(), MAX_KEY_LEN + 5);
        p.extensions.insert(long);
        assert!(matches!(
            user.extract(&p),
            Err(KeyError::TooLong { header: None, .. })
        ));

        let refuse = KeyExtractor::try_from_fn(|_| Err(KeyError::Invalid("no tenant".into())))
            .or(KeyExtractor::from_fn(|_| Some("never".into())));
        let err = refuse.extract(&parts(|b| b)).unwrap_err();
        assert_eq!(err.to_string(), "no tenant");
        assert_eq!(err.problem_type(), INVALID_KEY_TYPE);
    }
}
