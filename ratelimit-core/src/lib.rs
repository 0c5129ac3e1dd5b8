#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod clock;
pub mod decision;
pub mod error;
pub mod headers;
pub mod health;
pub mod limiter;
pub mod model;
pub mod quota;
pub mod store;

pub use clock::{Clock, ManualClock, Micros, SystemClock};
pub use decision::{Decision, Source, Verdict};
pub use error::{ConfigError, CostError, Result, StoreError};
pub use headers::RateLimitHeaders;
pub use health::{BreakerState, CircuitBreaker};
#[cfg(feature = "deny-cache")]
pub use limiter::DenyCache;
#[cfg(feature = "tokio")]
pub use limiter::TokioTimer;
pub use limiter::{
    AcquireError, Check, DEFAULT_TIMEOUT, FailurePolicy, FallbackStore, Limiter, LimiterBuilder,
    LimiterStats, Sleep, Timer,
};
pub use model::{Charge, State, Step};
pub use quota::{
    Algorithm, AlgorithmKind, Bucket, MAX_BUCKET, MAX_EXACT, MAX_SLIDING_LOG_LIMIT, MAX_TIME,
    Quota, Rate, Window,
};
pub use store::{Store, StoreExt};
