//! Deriving the caller key from a request, and what to do when it cannot be.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::request::Parts;
use http::{HeaderName, HeaderValue};

/// The longest caller key accepted, in bytes. A longer key (an absurd API
/// key header, say) is treated as missing, so one request cannot make the
/// store hold an arbitrarily large key.
pub const MAX_KEY_LEN: usize = 256;

type KeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Derives the caller key (who is being limited) from the request head.
///
/// The built-ins prefix their keys with what they are (`key:`, `user:`,
/// `ip:`), so an API key can never collide with an IP address or a user
/// name. Keys are passed to the store verbatim (the store escapes them);
/// hash them in a [`KeyExtractor::from_fn`] if your store's keys should not
/// contain API keys in clear.
///
/// ```
/// use http::HeaderName;
/// use ratelimit_tower::KeyExtractor;
///
/// // The API key, else the client address.
/// let key = KeyExtractor::header(HeaderName::from_static("x-api-key"))
///     .or(KeyExtractor::client_ip());
/// let req = http::Request::builder()
///     .header("x-api-key", "k-123")
///     .body(())
///     .unwrap();
/// assert_eq!(key.extract(&req.into_parts().0).as_deref(), Some("key:k-123"));
/// ```
#[derive(Clone)]
pub struct KeyExtractor {
    f: Arc<KeyFn>,
    describe: Cow<'static, str>,
}

impl fmt::Debug for KeyExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("KeyExtractor").field(&self.describe).finish()
    }
}

impl KeyExtractor {
    /// The value of a request header, typically an API key (`x-api-key`):
    /// key `key:<value>`. Missing, empty, non-visible-ASCII or longer than
    /// [`MAX_KEY_LEN`] counts as missing.
    pub fn header(name: HeaderName) -> Self {
        let describe = Cow::Owned(format!("header({name})"));
        Self::new(describe, move |parts| {
            let value = parts.headers.get(&name)?.to_str().ok()?.trim();
            if value.is_empty() {
                return None;
            }
            Some(format!("key:{value}"))
        })
    }

    /// An authenticated user, placed in the request extensions by an
    /// authentication layer that runs before this one: key `user:<id>`,
    /// where `id` is what `f` returns for the extension of type `T`.
    ///
    /// ```
    /// use ratelimit_tower::KeyExtractor;
    /// #[derive(Clone)]
    /// struct User { id: u64 }
    /// let key = KeyExtractor::extension(|u: &User| Some(u.id.to_string()));
    /// let mut req = http::Request::new(());
    /// req.extensions_mut().insert(User { id: 7 });
    /// assert_eq!(key.extract(&req.into_parts().0).as_deref(), Some("user:7"));
    /// ```
    pub fn extension<T, F>(f: F) -> Self
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> Option<String> + Send + Sync + 'static,
    {
        let describe = Cow::Owned(format!("extension({})", std::any::type_name::<T>()));
        Self::new(describe, move |parts| {
            let id = f(parts.extensions.get::<T>()?)?;
            (!id.is_empty()).then(|| format!("user:{id}"))
        })
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
            peer_addr(parts).map(|a| format!("ip:{}", a.ip()))
        })
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
    pub fn forwarded_ip(header: HeaderName, trusted_proxies: usize) -> Self {
        let describe = Cow::Owned(format!("forwarded_ip({header}, {trusted_proxies})"));
        Self::new(describe, move |parts| {
            if trusted_proxies == 0 {
                return None;
            }
            let mut entries: Vec<&str> = Vec::new();
            for value in parts.headers.get_all(&header) {
                entries.extend(value.to_str().ok()?.split(',').map(str::trim));
            }
            let entry = entries
                .len()
                .checked_sub(trusted_proxies)
                .map(|i| entries[i])?;
            let ip = entry
                .parse::<IpAddr>()
                .ok()
                .or_else(|| entry.parse::<SocketAddr>().ok().map(|a| a.ip()))?;
            Some(format!("ip:{ip}"))
        })
    }

    /// Any derivation of your own. Return `None` when the request carries no
    /// key; the [`MissingKey`] setting then decides.
    pub fn from_fn(f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        Self::new(Cow::Borrowed("from_fn"), f)
    }

    /// This extractor, else `other` when this one finds no key.
    pub fn or(self, other: KeyExtractor) -> Self {
        let describe = Cow::Owned(format!("{}.or({})", self.describe, other.describe));
        Self::new(describe, move |parts| {
            self.extract(parts).or_else(|| other.extract(parts))
        })
    }

    /// The caller key of the request whose head is `parts`, or `None` when
    /// it has none (or only one longer than [`MAX_KEY_LEN`]).
    pub fn extract(&self, parts: &Parts) -> Option<String> {
        (self.f)(parts).filter(|k| !k.is_empty() && k.len() <= MAX_KEY_LEN)
    }

    pub(crate) fn describe(&self) -> &str {
        &self.describe
    }

    fn new(
        describe: Cow<'static, str>,
        f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            f: Arc::new(f),
            describe,
        }
    }
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

    fn parts(f: impl FnOnce(http::request::Builder) -> http::request::Builder) -> Parts {
        f(http::Request::builder()).body(()).unwrap().into_parts().0
    }

    #[test]
    fn forwarded_takes_the_trusted_entry() {
        let xff = HeaderName::from_static("x-forwarded-for");
        let p = parts(|b| {
            b.header("x-forwarded-for", "6.6.6.6, 1.2.3.4")
                .header("x-forwarded-for", "10.0.0.1")
        });
        assert_eq!(
            KeyExtractor::forwarded_ip(xff.clone(), 1).extract(&p),
            Some("ip:10.0.0.1".into())
        );
        assert_eq!(
            KeyExtractor::forwarded_ip(xff.clone(), 2).extract(&p),
            Some("ip:1.2.3.4".into())
        );
        assert_eq!(KeyExtractor::forwarded_ip(xff.clone(), 4).extract(&p), None);
        assert_eq!(KeyExtractor::forwarded_ip(xff.clone(), 0).extract(&p), None);
        let p = parts(|b| b.header("x-forwarded-for", "[::1]:80, garbage"));
        assert_eq!(KeyExtractor::forwarded_ip(xff.clone(), 1).extract(&p), None);
        assert_eq!(
            KeyExtractor::forwarded_ip(xff, 2).extract(&p),
            Some("ip:::1".into())
        );
    }

    #[test]
    fn header_and_fallback() {
        let key = KeyExtractor::header(HeaderName::from_static("x-api-key"))
            .or(KeyExtractor::client_ip());
        let mut p = parts(|b| b.header("x-api-key", "  "));
        assert_eq!(key.extract(&p), None);
        p.extensions
            .insert("127.0.0.9:5000".parse::<SocketAddr>().unwrap());
        assert_eq!(key.extract(&p), Some("ip:127.0.0.9".into()));
        let long = "k".repeat(MAX_KEY_LEN);
        let p = parts(|b| b.header("x-api-key", long.as_str()));
        assert_eq!(key.extract(&p), None);
        assert!(format!("{key:?}").contains("header(x-api-key).or(client_ip)"));
    }
}
