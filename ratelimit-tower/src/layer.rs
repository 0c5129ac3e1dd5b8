//! The layer: configuration shared by every [`RateLimit`] service it makes.

use std::sync::Arc;

use ratelimit_core::Limiter;
use tower_layer::Layer;

use crate::config::Config;
use crate::cost::Cost;
use crate::key::{KeyExtractor, MissingKey};
use crate::policy::Policies;
use crate::service::RateLimit;

/// Applies rate limiting to a service: makes [`RateLimit`] services.
///
/// Built over a [`Limiter`], which brings the store (any store), the key
/// namespace, the failure policy and the store timeout. The layer adds how
/// to read a request:
///
/// | setting | default | method |
/// |---|---|---|
/// | caller key | client IP ([`KeyExtractor::client_ip`]) | [`RateLimitLayer::key`] |
/// | no key | `400` problem+json | [`RateLimitLayer::on_missing_key`] |
/// | a present but unusable key ([`crate::KeyError`]) | `431` or `400` problem+json | not configurable |
/// | quotas | all of the limiter's quotas, all or nothing, for every request | [`RateLimitLayer::policies`] |
/// | cost | 1 | [`RateLimitLayer::cost`] |
///
/// A limiter with several quotas ("10 per second and 1,000 per day") checks
/// every request against all of them in one store call: a request is
/// admitted only if every quota admits it, a denied request is counted in
/// none, `RateLimit-Policy`/`RateLimit` list every quota, and `Retry-After`
/// and `X-RateLimit-*` follow the binding one. One quota *chosen* per
/// request (per plan, per route) is [`Policies`];
/// a different *failure policy* for some routes (fail closed for logins,
/// open for the rest) needs a second limiter, hence a second layer on
/// those routes.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use axum::{Router, routing::get};
/// use http::HeaderName;
/// use ratelimit_local::LocalStore;
/// use ratelimit_tower::{
///     FailurePolicy, KeyExtractor, Limiter, MissingKey, Quota, Rate, RateLimitLayer,
/// };
///
/// let plan = Quota::token_bucket(Rate::per_minute(100), 20)?.named("api")?;
/// let limiter = Limiter::builder(LocalStore::new())
///     .quota(plan)
///     .namespace("api")?
///     .failure_policy(FailurePolicy::FailOpen)
///     .build()?;
/// let api_key = HeaderName::from_static("x-api-key");
/// let layer = RateLimitLayer::new(limiter)
///     .key(KeyExtractor::header(api_key.clone()))
///     .on_missing_key(MissingKey::unauthorized_api_key(&api_key));
/// // `route_layer`, not `layer`: unknown URLs (404) and wrong methods (405)
/// // never reach the limiter.
/// let app: Router = Router::new().route("/", get(|| async { "hello" }).route_layer(layer));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// axum::serve(listener, app).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    config: Arc<Config>,
}

impl RateLimitLayer {
    /// A layer over `limiter`: every request is checked against all of the
    /// limiter's quotas, keyed by client IP, at cost 1.
    pub fn new(limiter: Limiter) -> Self {
        Self {
            config: Arc::new(Config {
                limiter,
                key: KeyExtractor::default(),
                missing: MissingKey::default(),
                policies: None,
                cost: Cost::default(),
            }),
        }
    }

    /// How to derive the caller key.
    pub fn key(mut self, key: KeyExtractor) -> Self {
        Arc::make_mut(&mut self.config).key = key;
        self
    }

    /// What to answer when the key cannot be derived.
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        Arc::make_mut(&mut self.config).missing = missing;
        self
    }

    /// Which one quota applies to which request (replaces the default: all
    /// of the limiter's quotas for every request).
    pub fn policies(mut self, policies: Policies) -> Self {
        Arc::make_mut(&mut self.config).policies = Some(policies);
        self
    }

    /// The cost of a request.
    pub fn cost(mut self, cost: Cost) -> Self {
        Arc::make_mut(&mut self.config).cost = cost;
        self
    }

    /// The limiter (for its [`Limiter::stats`], say).
    pub fn limiter(&self) -> &Limiter {
        &self.config.limiter
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::from_config(inner, Arc::clone(&self.config))
    }
}
