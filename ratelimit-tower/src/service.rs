//! The service: checks each request, answers 429 itself or calls the inner
//! service and adds the rate-limit headers to its response.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Either;
use ratelimit_core::{Decision, Quota, RateLimitHeaders, Source};
use tower_service::Service;

use crate::config::Config;
use crate::key::{KeyError, MissingKey};
use crate::problem::{
    COST_TOO_HIGH_TYPE, MISSING_KEY_TYPE, Problem, QUOTA_EXCEEDED_TYPE, ResponseBody,
    UNAVAILABLE_TYPE,
};

/// What the layer decided for a request it let through, inserted into the
/// request's extensions before the inner service is called (handlers can
/// read it, e.g. with axum's `Extension<RateLimitInfo>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitInfo {
    /// The name of the policy the request was checked against (with
    /// several quotas: the binding one, the least remaining).
    pub policy: String,
    /// The caller key.
    pub key: String,
    /// The decision (allowed: by the store, or by the fail-open policy).
    pub decision: Decision,
}

/// Rate-limits requests to `S`. Made by [`crate::RateLimitLayer`].
///
/// For each request: pick the quota ([`crate::Policies`]; none → pass
/// through untouched), derive the caller key ([`crate::KeyExtractor`]; none →
/// [`MissingKey`]; present but unusable → the [`KeyError`]'s `400` or `431`,
/// uncounted), compute the cost ([`crate::Cost`]; 0 → pass through
/// uncounted), then ask the limiter:
///
/// | decision | response |
/// |---|---|
/// | allowed by the store | the inner response + `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`, `RateLimit-Policy`, `RateLimit` |
/// | denied by the store | `429`, `Retry-After` + the same headers, problem+json of type [`QUOTA_EXCEEDED_TYPE`] with `violated-policies`; the inner service is **not** called |
/// | store failed, fail-open | the inner response + only `X-RateLimit-Limit` and `RateLimit-Policy` (nothing else is known) |
/// | store failed, fail-closed | `503`, only `X-RateLimit-Limit` and `RateLimit-Policy`, no `Retry-After`, problem+json of type [`UNAVAILABLE_TYPE`]; the inner service is **not** called |
///
/// Fail-closed answers `503 Service Unavailable`, not `429`: the client has
/// not exceeded anything, the server cannot currently decide. A 429 would
/// tell a well-behaved client that *it* sent too much, and without a
/// `Retry-After` (none can be known while the store is down) it would have
/// nothing to act on; 503 is the truthful status and is what retry logic
/// already treats as a transient server condition.
///
/// # Retries and write endpoints
///
/// A 429 (and a 503) invites the client to send the same request again.
/// A request the layer denies never reaches the inner service, so it did
/// nothing; but a client that timed out on an *admitted* write and retries
/// after a later 429 may send that write twice. Endpoints that change state
/// (`POST`, `PATCH`) must therefore be safe to retry: accept an
/// `Idempotency-Key` header and return the stored result for a repeated key
/// instead of acting twice.
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S: fmt::Debug> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<S> RateLimit<S> {
    pub(crate) fn from_config(inner: S, config: Arc<Config>) -> Self {
        Self { inner, config }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// The response future of [`RateLimit`].
pub struct RateLimitFuture<T, E> {
    inner: Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>,
}

impl<T, E> fmt::Debug for RateLimitFuture<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RateLimitFuture")
    }
}

impl<T, E> Future for RateLimitFuture<T, E> {
    type Output = Result<T, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = RateLimitFuture<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // Use the service that was polled ready; leave a fresh clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        let (mut parts, body) = req.into_parts();

        // One chosen quota, or (no `Policies`) all of the limiter's quotas.
        let quota = match &config.policies {
            Some(policies) => match policies.resolve(&parts) {
                Some(q) => Some(q),
                None => return pass_through(inner.call(Request::from_parts(parts, body))),
            },
            None => None,
        };
        let key = match config.key.extract(&parts) {
            Ok(Some(key)) => key,
            Err(e) => return ready(invalid_key(&config, &e)),
            Ok(None) => match &config.missing {
                MissingKey::Anonymous(key) => key.clone(),
                MissingKey::BadRequest => {
                    return ready(missing_key(&config, StatusCode::BAD_REQUEST, None));
                }
                MissingKey::Unauthorized { challenge } => {
                    return ready(missing_key(
                        &config,
                        StatusCode::UNAUTHORIZED,
                        Some(challenge.clone()),
                    ));
                }
            },
        };
        let cost = config.cost.of(&parts);
        if cost == 0 {
            return pass_through(inner.call(Request::from_parts(parts, body)));
        }

        RateLimitFuture {
            inner: Box::pin(async move {
                let limiter = &config.limiter;
                let checked = match &quota {
                    Some(q) => limiter
                        .check_quota(q, key.as_bytes(), cost)
                        .await
                        .map(|d| (d.clone(), limiter.headers_for(&d, q), q.clone(), vec![])),
                    None => limiter.check_all(key.as_bytes(), cost).await.map(|v| {
                        let headers = limiter.headers_all(&v);
                        let quota = limiter.quotas()[v.binding].clone();
                        let violated = v
                            .quotas
                            .iter()
                            .zip(limiter.quotas())
                            .enumerate()
                            .filter(|(i, (d, _))| !d.allowed && !limiter.is_shadow(*i))
                            .map(|(_, (_, q))| q.name().to_owned())
                            .collect();
                        (v.decision, headers, quota, violated)
                    }),
                };
                let (decision, headers, quota, violated) = match checked {
                    Ok(c) => c,
                    Err(e) => {
                        let problem = Problem::new(
                            COST_TOO_HIGH_TYPE,
                            StatusCode::BAD_REQUEST,
                            e.to_string(),
                        );
                        return Ok(problem.into_response());
                    }
                };
                if !decision.allowed {
                    // The key is not logged: it may be an API key.
                    tracing::debug!(
                        policy = quota.name(),
                        source = ?decision.source,
                        "rate limit: request denied"
                    );
                    return Ok(denied(&decision, &quota, &violated, &headers));
                }
                parts.extensions.insert(RateLimitInfo {
                    policy: quota.name().to_owned(),
                    key,
                    decision,
                });
                let mut response = inner.call(Request::from_parts(parts, body)).await?;
                headers.write_to(response.headers_mut());
                Ok(response.map(Either::Left))
            }),
        }
    }
}

fn pass_through<F, B, E>(call: F) -> RateLimitFuture<Response<ResponseBody<B>>, E>
where
    F: Future<Output = Result<Response<B>, E>> + Send + 'static,
{
    RateLimitFuture {
        inner: Box::pin(async move { Ok(call.await?.map(Either::Left)) }),
    }
}

fn ready<T: Send + 'static, E: 'static>(response: T) -> RateLimitFuture<T, E> {
    RateLimitFuture {
        inner: Box::pin(async move { Ok(response) }),
    }
}

fn missing_key<B>(
    config: &Config,
    status: StatusCode,
    challenge: Option<HeaderValue>,
) -> Response<ResponseBody<B>> {
    let detail = format!(
        "no rate-limit caller key could be derived from this request (looked for: {})",
        config.key.describe()
    );
    let mut response = Problem::new(MISSING_KEY_TYPE, status, detail).into_response();
    if let Some(challenge) = challenge {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, challenge);
    }
    response
}

fn invalid_key<B>(config: &Config, error: &KeyError) -> Response<ResponseBody<B>> {
    // The key is not logged: it may be an API key.
    tracing::debug!(
        extractor = config.key.describe(),
        error = %error,
        "rate limit: unusable caller key"
    );
    let detail = format!(
        "{error} (rate-limit caller key, looked for: {})",
        config.key.describe()
    );
    Problem::new(error.problem_type(), error.status(), detail).into_response()
}

fn denied<B>(
    decision: &Decision,
    quota: &Quota,
    violated: &[String],
    headers: &RateLimitHeaders,
) -> Response<ResponseBody<B>> {
    let name = quota.name();
    let problem = if decision.source == Source::FailClosed {
        Problem::new(
            UNAVAILABLE_TYPE,
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the rate limiter for policy \"{name}\" cannot reach its store and fails closed; \
                 the request was not processed"
            ),
        )
    } else {
        let retry = headers
            .get("Retry-After")
            .map(|s| format!("; retry after {s} s"))
            .unwrap_or_default();
        let mut p = Problem::new(
            QUOTA_EXCEEDED_TYPE,
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "quota \"{name}\" of {} is exhausted for this caller{retry}",
                quota.limit()
            ),
        );
        p.violated_policies = Some(if violated.is_empty() {
            vec![name.to_owned()]
        } else {
            violated.to_vec()
        });
        p
    };
    let mut response = problem.into_response();
    headers.write_to(response.headers_mut());
    response
}
