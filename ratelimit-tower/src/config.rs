//! What a layer hands to every service it makes: the limiter and how to
//! read a request. Set by [`crate::RateLimitLayer`], read by
//! [`crate::RateLimit`].

use ratelimit_core::Limiter;

use crate::cost::Cost;
use crate::key::{KeyExtractor, MissingKey};
use crate::policy::Policies;

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) limiter: Limiter,
    pub(crate) key: KeyExtractor,
    pub(crate) missing: MissingKey,
    /// `None`: every request is checked against all of the limiter's
    /// quotas at once (all or nothing).
    pub(crate) policies: Option<Policies>,
    pub(crate) cost: Cost,
}
