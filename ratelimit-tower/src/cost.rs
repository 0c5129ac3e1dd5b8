//! The cost (weight) of a request.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;

type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;

/// How many units of quota a request consumes. The default is 1.
///
/// A cost of **0** means "not counted": the request passes to the inner
/// service without a check and without rate-limit headers (for example
/// `HEAD` or health checks). A cost above the limit of the request's quota
/// could never be admitted; it is answered `400 Bad Request` with a
/// problem+json body of type [`crate::COST_TOO_HIGH_TYPE`] instead of a
/// 429 that would invite a retry that can never succeed.
///
/// ```
/// use ratelimit_tower::Cost;
/// // Writes cost 5, reads cost 1.
/// let cost = Cost::from_fn(|parts| if parts.method == http::Method::GET { 1 } else { 5 });
/// # let _ = cost;
/// ```
#[derive(Clone)]
pub struct Cost {
    f: Option<Arc<CostFn>>,
}

impl Cost {
    /// Every request costs 1.
    pub fn one() -> Self {
        Self { f: None }
    }

    /// The cost computed from the request head (method, URI, headers,
    /// extensions). The body is never read.
    pub fn from_fn(f: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        Self {
            f: Some(Arc::new(f)),
        }
    }

    /// The cost of the request whose head is `parts`.
    pub fn of(&self, parts: &Parts) -> u64 {
        self.f.as_ref().map_or(1, |f| f(parts))
    }
}

impl Default for Cost {
    fn default() -> Self {
        Self::one()
    }
}

impl fmt::Debug for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.f {
            None => f.write_str("Cost(1)"),
            Some(_) => f.write_str("Cost(<fn>)"),
        }
    }
}
