#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod cost;
mod key;
mod layer;
mod policy;
mod problem;
mod service;

pub use cost::Cost;
pub use key::{KeyError, KeyExtractor, MAX_KEY_LEN, MissingKey};
pub use layer::RateLimitLayer;
pub use policy::Policies;
pub use problem::{
    AMBIGUOUS_KEY_TYPE, COST_TOO_HIGH_TYPE, INVALID_KEY_TYPE, KEY_TOO_LONG_TYPE, MISSING_KEY_TYPE,
    PROBLEM_JSON, Problem, QUOTA_EXCEEDED_TYPE, ResponseBody, UNAVAILABLE_TYPE,
};
pub use service::{RateLimit, RateLimitFuture, RateLimitInfo};

/// Re-exported so applications name the same types the layer uses.
pub use ratelimit_core::{Decision, FailurePolicy, Limiter, Quota, Rate, Source};
