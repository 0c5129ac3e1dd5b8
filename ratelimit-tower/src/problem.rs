//! `application/problem+json` bodies (RFC 9457) for the layer's own answers.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{Either, Full};
use serde::Serialize;

/// The media type of the layer's own response bodies.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Problem type of a `429`: the quota is exhausted. The URI the IETF
/// rate-limit headers draft registers for this problem.
pub const QUOTA_EXCEEDED_TYPE: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// Problem type of the answer to a request with no caller key.
pub const MISSING_KEY_TYPE: &str = "urn:ratelimit:problem:missing-key";

/// Problem type of the answer to a request whose caller key is longer than
/// [`crate::MAX_KEY_LEN`] ([`crate::KeyError::TooLong`]).
pub const KEY_TOO_LONG_TYPE: &str = "urn:ratelimit:problem:key-too-long";

/// Problem type of the answer to a request that sends the header carrying
/// its caller key more than once ([`crate::KeyError::Duplicate`]).
pub const AMBIGUOUS_KEY_TYPE: &str = "urn:ratelimit:problem:ambiguous-key";

/// Problem type of the answer to a request whose caller key is present but
/// malformed ([`crate::KeyError::NotVisibleAscii`],
/// [`crate::KeyError::Invalid`]).
pub const INVALID_KEY_TYPE: &str = "urn:ratelimit:problem:invalid-key";

/// Problem type of the answer to a request whose cost exceeds the limit of
/// its quota (it could never be admitted).
pub const COST_TOO_HIGH_TYPE: &str = "urn:ratelimit:problem:cost-exceeds-limit";

/// Problem type of a `503` from a fail-closed limiter whose store failed.
pub const UNAVAILABLE_TYPE: &str = "urn:ratelimit:problem:limiter-unavailable";

/// The body of every response the layer answers itself: the inner
/// service's body (`Left`) or a problem+json document (`Right`).
pub type ResponseBody<B> = Either<B, Full<Bytes>>;

/// An RFC 9457 problem details document.
///
/// ```
/// let p = ratelimit_tower::Problem {
///     r#type: ratelimit_tower::QUOTA_EXCEEDED_TYPE.into(),
///     title: "Too Many Requests".into(),
///     status: 429,
///     detail: "policy \"api\" is exhausted".into(),
///     violated_policies: Some(vec!["api".into()]),
/// };
/// let json = serde_json::to_value(&p).unwrap();
/// assert_eq!(json["violated-policies"][0], "api");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// A URI naming the kind of problem.
    #[serde(rename = "type")]
    pub r#type: String,
    /// A short summary of the kind of problem.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What happened to this request.
    pub detail: String,
    /// The names of the policies the request violated (only on a 429).
    #[serde(rename = "violated-policies", skip_serializing_if = "Option::is_none")]
    pub violated_policies: Option<Vec<String>>,
}

impl Problem {
    pub(crate) fn new(r#type: &str, status: StatusCode, detail: String) -> Self {
        Self {
            r#type: r#type.to_owned(),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail,
            violated_policies: None,
        }
    }

    /// The problem as a response with status, `Content-Type:
    /// application/problem+json` and `Cache-Control: no-store`.
    pub fn into_response<B>(self) -> Response<ResponseBody<B>> {
        // Serializing strings and integers cannot fail; fall back to a
        // fixed body rather than ever panicking.
        let body = serde_json::to_vec(&self).unwrap_or_else(|_| b"{}".to_vec());
        let mut response = Response::new(Either::Right(Full::new(Bytes::from(body))));
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }
}
