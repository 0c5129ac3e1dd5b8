//! The heap allocations of one `ShouldRateLimit` request in the service
//! (in process, the local store, after every caller's first request), held
//! to the numbers measured when the request path was last tuned: a change
//! that allocates more per request fails here, by name and number.
//! `benches/request_cost.rs` measures the same with the time per request.
//!
//! The counting allocator is `stats_alloc`'s (`request_fixture`), for this
//! test binary only.

mod request_fixture;

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use ratelimit_local::LocalStore;
use ratelimit_server::{Config, RateLimitService, Settings};
use request_fixture::{CONFIG, GLOBAL, request};
use stats_alloc::Region;

/// Allocations per request, by descriptors per request (1, 2, 3): the
/// numbers of the tuned path, plus one for a map's occasional growth.
const BUDGET: [f64; 3] = [7.0, 12.0, 15.0];

#[test]
fn a_request_allocates_within_its_budget() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let service = RateLimitService::new(
        Arc::new(LocalStore::new()),
        Config::from_yaml_str("cost.yaml", CONFIG).expect("config"),
        Settings::default(),
        "local",
    )
    .expect("service");
    let mut measured = Vec::new();
    rt.block_on(async {
        for n in 1..=3 {
            let requests: Vec<RateLimitRequest> = (0..200).map(|k| request(n, k)).collect();
            // Every caller's first request (its state is created).
            for r in &requests {
                service.should_rate_limit(r).await.expect("answer");
            }
            let region = Region::new(GLOBAL);
            for r in &requests {
                service.should_rate_limit(r).await.expect("answer");
            }
            let used = region.change();
            measured.push((used.allocations + used.reallocations) as f64 / 200.0);
        }
    });
    for (i, (m, budget)) in measured.iter().zip(BUDGET).enumerate() {
        assert!(
            *m <= budget,
            "{} descriptor(s): {m} allocations per request, over the budget of {budget} \
             (all: {measured:?})",
            i + 1
        );
    }
    println!("allocations per request, 1 to 3 descriptors: {measured:?}");
}
