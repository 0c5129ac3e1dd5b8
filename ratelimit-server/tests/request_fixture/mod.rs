//! What `tests/allocations.rs` and `benches/request_cost.rs` share: the
//! counting allocator (`stats_alloc`'s), the configuration of three
//! descriptors and the requests of one to three of them.
#![allow(dead_code, unreachable_pub)]

use std::alloc::System;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

/// Counts every allocation of the binary that includes this module.
#[global_allocator]
pub static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Three descriptors (`a`, `b`, `c`), limits no request reaches.
pub const CONFIG: &str = "domain: cost
descriptors:
  - key: a
    rate_limit:
      unit: minute
      requests_per_unit: 1000000000
  - key: b
    rate_limit:
      unit: minute
      requests_per_unit: 1000000000
  - key: c
    rate_limit:
      unit: minute
      requests_per_unit: 1000000000
";

/// A request of `n` descriptors (`a`, `b`, `c`) for caller `key`.
pub fn request(n: usize, key: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "cost".into(),
        descriptors: ["a", "b", "c"][..n]
            .iter()
            .map(|k| RateLimitDescriptor {
                entries: vec![Entry {
                    key: (*k).into(),
                    value: format!("caller-{key}"),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}
