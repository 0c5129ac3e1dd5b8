//! Which quota applies to a request: per plan, per route, or a default.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use ratelimit_core::Quota;

type SelectFn = dyn Fn(&Parts) -> Option<Quota> + Send + Sync;

/// Several named policies and the rule that picks one per request.
///
/// For each request, in order:
/// 1. the selector closure ([`Policies::select`]), if it returns a quota
///    (per plan: look at the API key's plan in an extension or header);
/// 2. the route with the longest matching path prefix ([`Policies::route`]);
///    `/api` matches `/api` and `/api/...` but not `/apiary`;
/// 3. the default quota ([`Policies::default_quota`]).
///
/// When none applies the request is not limited: it passes to the inner
/// service untouched, without rate-limit headers.
///
/// Give each quota its own name ([`Quota::named`]): the name is the
/// `RateLimit-Policy` name, the `violated-policies` entry and part of the
/// store key, so two policies with distinct names never share state.
///
/// ```
/// # fn main() -> Result<(), ratelimit_core::ConfigError> {
/// use ratelimit_tower::{Policies, Quota, Rate};
/// use std::time::Duration;
///
/// let free = Quota::token_bucket(Rate::per_minute(10), 5)?.named("free")?;
/// let pro = Quota::token_bucket(Rate::per_minute(100), 20)?.named("pro")?;
/// let search = Quota::sliding_window(Rate::per_minute(30))?.named("search")?;
/// let policies = Policies::new()
///     .select(move |parts| {
///         let plan = parts.headers.get("x-plan")?;
///         (plan == "pro").then(|| pro.clone())
///     })
///     .route("/search", search)
///     .default_quota(free);
/// let req = http::Request::get("/search?q=x").body(()).unwrap().into_parts().0;
/// assert_eq!(policies.resolve(&req).unwrap().name(), "search");
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct Policies {
    select: Option<Arc<SelectFn>>,
    routes: Vec<(String, Quota)>,
    default: Option<Quota>,
}

impl fmt::Debug for Policies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policies")
            .field("select", &self.select.as_ref().map(|_| "<fn>"))
            .field("routes", &self.routes)
            .field("default", &self.default)
            .finish()
    }
}

impl Policies {
    /// No policies: nothing is limited until some are added.
    pub fn new() -> Self {
        Self::default()
    }

    /// The closure asked first for every request; `None` falls through to
    /// the routes and the default. Replaces an earlier selector.
    pub fn select(mut self, f: impl Fn(&Parts) -> Option<Quota> + Send + Sync + 'static) -> Self {
        self.select = Some(Arc::new(f));
        self
    }

    /// `quota` for paths under `prefix` (segment-wise: `/api` matches `/api`
    /// and `/api/x`, not `/apiary`). The longest matching prefix wins.
    pub fn route(mut self, prefix: impl Into<String>, quota: Quota) -> Self {
        self.routes.push((prefix.into(), quota));
        // Longest first, so the first match is the most specific.
        self.routes.sort_by_key(|r| std::cmp::Reverse(r.0.len()));
        self
    }

    /// The quota for requests no selector or route claims.
    pub fn default_quota(mut self, quota: Quota) -> Self {
        self.default = Some(quota);
        self
    }

    /// Removes the default: requests no selector or route claims pass
    /// unlimited.
    pub fn no_default(mut self) -> Self {
        self.default = None;
        self
    }

    /// The quota for the request whose head is `parts`, if any.
    pub fn resolve(&self, parts: &Parts) -> Option<Quota> {
        if let Some(q) = self.select.as_ref().and_then(|f| f(parts)) {
            return Some(q);
        }
        let path = parts.uri.path();
        self.routes
            .iter()
            .find(|(prefix, _)| prefix_matches(prefix, path))
            .map(|(_, q)| q.clone())
            .or_else(|| self.default.clone())
    }
}

fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        None => false,
        Some(rest) => rest.is_empty() || prefix.ends_with('/') || rest.starts_with('/'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::Rate;

    #[test]
    fn prefixes_are_segment_wise() {
        assert!(prefix_matches("/api", "/api"));
        assert!(prefix_matches("/api", "/api/x"));
        assert!(prefix_matches("/api/", "/api/x"));
        assert!(prefix_matches("/", "/anything"));
        assert!(!prefix_matches("/api", "/apiary"));
        assert!(!prefix_matches("/api", "/"));
    }

    #[test]
    fn longest_prefix_then_default() {
        let q = |n: &str| {
            Quota::fixed_window(Rate::per_minute(1))
                .unwrap()
                .named(n)
                .unwrap()
        };
        let p = Policies::new()
            .route("/a", q("a"))
            .route("/a/b", q("ab"))
            .default_quota(q("d"));
        let get = |path: &str| {
            let parts = http::Request::get(path).body(()).unwrap().into_parts().0;
            p.resolve(&parts).map(|q| q.name().to_owned())
        };
        assert_eq!(get("/a/b/c").as_deref(), Some("ab"));
        assert_eq!(get("/a/c").as_deref(), Some("a"));
        assert_eq!(get("/z").as_deref(), Some("d"));
        let p = p.no_default();
        let parts = http::Request::get("/z").body(()).unwrap().into_parts().0;
        assert!(p.resolve(&parts).is_none());
    }
}
