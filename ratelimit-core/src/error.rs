//! Errors: configuration, cost and store errors.

use std::time::Duration;

/// A configuration that cannot be built, with what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A limit, window, rate or burst of zero.
    #[error("{field} must be greater than zero")]
    Zero {
        /// Which value.
        field: &'static str,
    },
    /// NaN or infinity.
    #[error("{field} must be a finite number")]
    NonFinite {
        /// Which value.
        field: &'static str,
    },
    /// A window shorter than one microsecond, or not a whole number of microseconds.
    #[error("{field} must be a whole number of microseconds, at least 1 µs")]
    WindowTooShort {
        /// Which value.
        field: &'static str,
    },
    /// A window longer than the supported maximum.
    #[error("{field} must be at most {max:?}")]
    WindowTooLong {
        /// Which value.
        field: &'static str,
        /// The longest accepted.
        max: Duration,
    },
    /// A value outside the exact integer range.
    #[error("{field} is out of range: {detail}")]
    OutOfRange {
        /// Which value.
        field: &'static str,
        /// What the bound is and what to change.
        detail: String,
    },
    /// A policy name that cannot be used in keys or headers.
    #[error("invalid policy name {name:?}: use 1 to 64 characters of A-Z a-z 0-9 _ - .")]
    InvalidName {
        /// The name given.
        name: String,
    },
    /// A namespace that cannot be used in keys.
    #[error("invalid namespace {namespace:?}: use 1 to 64 characters of A-Z a-z 0-9 _ - .")]
    InvalidNamespace {
        /// The namespace given.
        namespace: String,
    },
    /// A limiter built without a quota.
    #[error("a limiter needs at least one quota")]
    NoQuota,
    /// Two quotas of one limiter with the same name and algorithm: they
    /// would share state.
    #[error(
        "two quotas named {name:?} with the same algorithm: they would share state; give each          its own name with Quota::named"
    )]
    DuplicatePolicy {
        /// The name.
        name: String,
    },
    /// A limiter over a store that can be unavailable, with no degraded mode
    /// chosen.
    #[error(
        "no degraded mode: say what this limiter decides while its store is unavailable. \
         Usually `.instances(n)` (n = the application instances sharing the quota): an \
         in-process fallback at each limit / n, still limiting. Or `.failure_policy(FailurePolicy::FailClosed)` \
         (deny: logins, password resets) or `.failure_policy(FailurePolicy::FailOpen)` (admit \
         uncounted calls)"
    )]
    NoDegradedMode,
    /// A limiter setting that cannot work (a zero bound, or one the
    /// limiter's timeout makes meaningless), named, with what to change.
    #[error("{setting}: {detail}")]
    InvalidSetting {
        /// The builder method, such as `LimiterBuilder::leases`.
        setting: &'static str,
        /// What is wrong and what to change.
        detail: String,
    },
    /// A limiter built without a timer while the `tokio` feature is off.
    #[error("no timer: enable ratelimit-core's `tokio` feature or call `LimiterBuilder::timer`")]
    NoTimer,
}

/// A cost that can never be admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CostError {
    /// A cost of zero: every call costs at least 1.
    #[error("cost must be at least 1")]
    Zero,
    /// A cost larger than the limit or capacity: it would be denied forever.
    #[error(
        "cost {cost} exceeds the limit {limit} of policy {policy:?}: it could never be admitted"
    )]
    ExceedsLimit {
        /// The cost asked for.
        cost: u64,
        /// The policy's limit or capacity.
        limit: u64,
        /// The policy name.
        policy: String,
    },
    /// A call with no charge ([`crate::Limiter::check_charges`]).
    #[error("a call needs at least one charge")]
    NoCharge,
    /// Two charges of one call for the same quota name and algorithm: they
    /// would share one state.
    #[error(
        "two charges for policy {policy:?} in one call: they would share one state; give each \
         quota its own name"
    )]
    DuplicateQuota {
        /// The policy name.
        policy: String,
    },
    /// A limiter built for quotas that come with each call
    /// ([`crate::LimiterBuilder::quotas_per_call`]) was asked to check
    /// quotas of its own.
    #[error(
        "this limiter has no quotas of its own (built with quotas_per_call): pass the call's \
         quotas to Limiter::check_charges"
    )]
    NoQuota,
    /// Per-quota costs that do not match the limiter's quotas one to one.
    #[error("{given} costs given for {quotas} quotas: give one cost per quota, in order")]
    Count {
        /// How many costs were given.
        given: usize,
        /// How many quotas the limiter has.
        quotas: usize,
    },
}

/// An error from a store: the decision could not be made.
///
/// The limiter turns it into a decision through its failure policy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The cost can never be admitted.
    #[error(transparent)]
    Cost(#[from] CostError),
    /// No reply within the given time: the request may or may not have been
    /// carried out (a network store carries its deadline, so one carried
    /// out later counts nothing).
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    /// The request's deadline had passed when the store came to carry it
    /// out (at the server, for a network store): it counted nothing.
    #[error("expired before it ran (counted nothing)")]
    Expired,
    /// The request itself is invalid (no charge, two charges for one
    /// quota): it counted nothing, and asking again will not help.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The failure domain serving this request (a Redis node, a cluster
    /// master) is judged unhealthy: the store failed fast without sending.
    #[error("{domain} unavailable: {reason}")]
    Unavailable {
        /// The failure domain, such as a node's address.
        domain: String,
        /// Why, such as "breaker open after 12 of 20 calls failed".
        reason: String,
    },
    /// The failure domain serving this request (a Redis node, a cluster
    /// master) is busy: at the rate it completes requests, this one would
    /// not have been answered within its deadline, so it was not sent (it
    /// counted nothing). A busy domain is not a failed one: it is not held
    /// against the domain, and the limiter decides the call as it decides
    /// for a busy store (its caller's lease, else the failure policy).
    #[error("{}", overloaded(domain, *in_flight, *limit))]
    Overloaded {
        /// The failure domain, such as a node's address.
        domain: std::sync::Arc<str>,
        /// The requests in flight on it when this one was refused.
        in_flight: u64,
        /// How many it completes within this request's deadline, as last
        /// measured; `None` when the request was refused because less time
        /// was left than one call takes.
        limit: Option<u64>,
    },
    /// The backend failed; `transient` says whether a retry may succeed.
    #[error("{message}")]
    Backend {
        /// What went wrong.
        message: String,
        /// Whether retrying later may succeed (connection loss, timeout, failover).
        transient: bool,
        /// The backend's own error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
}

impl StoreError {
    /// A backend error with its source.
    pub fn backend(
        message: impl Into<String>,
        transient: bool,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Self::Backend {
            message: message.into(),
            transient,
            source: Some(source.into()),
        }
    }

    /// A backend error without a source.
    pub fn message(message: impl Into<String>, transient: bool) -> Self {
        Self::Backend {
            message: message.into(),
            transient,
            source: None,
        }
    }

    /// Whether the same call may succeed later (timeouts, lost connections).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Cost(_) => false,
            Self::Timeout(_)
            | Self::Expired
            | Self::Unavailable { .. }
            | Self::Overloaded { .. } => true,
            Self::InvalidRequest(_) => false,
            Self::Backend { transient, .. } => *transient,
        }
    }
}

/// The message of [`StoreError::Overloaded`].
fn overloaded(domain: &str, in_flight: u64, limit: Option<u64>) -> String {
    match limit {
        Some(limit) => format!(
            "{domain} busy: {in_flight} requests in flight, at its limit of {limit} (what it \
             completes within the deadline): not sent, counted nothing"
        ),
        None => format!(
            "{domain} busy: {in_flight} requests in flight, and less time left than one call \
             takes: not sent, counted nothing"
        ),
    }
}

impl StoreError {
    /// Whether the error says the store is **busy** rather than
    /// unavailable: it answers, but not in time for this request (a
    /// timeout, a request shed by the store's admission, a request that
    /// expired before it ran). The limiter decides a busy store's calls by
    /// its callers' leases, else by its failure policy; the fallback store
    /// is for a store that is unavailable.
    pub fn is_busy(&self) -> bool {
        matches!(
            self,
            Self::Timeout(_) | Self::Expired | Self::Overloaded { .. }
        )
    }
}

/// `Result` with [`StoreError`] by default.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
