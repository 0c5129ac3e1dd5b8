//! The limiter's production controls over a real Redis server, once per
//! client library, checked by the testkit's shared functions
//! (`ratelimit_testkit::controls`): the deny cache admits exactly what the
//! store admits (every algorithm, costs > 1, several quotas), shadow quotas
//! count but never deny (and the key in Redis shows it), `acquire` paces,
//! shares one quota and is cancel-safe. The stores run on an injected
//! clock that the checks move themselves.

mod common;

use std::time::Instant;

use common::{Factory, Lib};
use ratelimit_testkit::SuiteConfig;
use ratelimit_testkit::controls::{self, ShadowReport};

async fn deny_cache(lib: Lib) {
    let factory = Factory::new(lib);
    let t = Instant::now();
    let rejected = controls::deny_cache_check_can_fail(&factory, &SuiteConfig::network())
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    for (flaw, why) in &rejected {
        println!("{lib:?}: a deny cache that {flaw:?} is rejected: {why}\n");
    }
    let report = controls::deny_cache_equivalence(&factory, &SuiteConfig::network())
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    println!("{lib:?}: deny cache {report:?}, {:?}", t.elapsed());
}

/// The shadow quota's key, read straight from the server: a fixed window
/// stored as `window:count`, charged with what the check says.
fn stored_shadow_count(factory: &Factory, report: &ShadowReport) {
    let pattern = ratelimit_redis::keys::key("*", &report.key, &report.quota);
    let mut con = factory.server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query(&mut con).unwrap();
    assert_eq!(
        keys.len(),
        1,
        "one key for the shadow quota ({pattern}): {keys:?}"
    );
    let value: String = redis::cmd("GET").arg(&keys[0]).query(&mut con).unwrap();
    let window = report.at / report.quota.window().as_micros() as u64;
    assert_eq!(
        value,
        format!("{window}:{}", report.charged),
        "the shadow quota's stored state ({})",
        keys[0]
    );
}

async fn shadow_and_acquire(lib: Lib) {
    let factory = Factory::new(lib);
    let t = Instant::now();
    let report = controls::shadow_quotas(&factory)
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    stored_shadow_count(&factory, &report);
    controls::acquire_paces_one_worker(&factory)
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    let runs = controls::acquire_shares_one_quota(&factory, &SuiteConfig::network())
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    for run in runs {
        println!("{lib:?}: acquire on one shared quota: {run:?}");
    }
    controls::acquire_cancel_safe(&factory)
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    println!("{lib:?}: shadow quotas and acquire, {:?}", t.elapsed());
}

/// While the store cannot answer, leases decide by their rules, within
/// their bound (the lease check's own self-test first).
async fn leases(lib: Lib) {
    let factory = Factory::new(lib);
    let t = Instant::now();
    let rejected = controls::lease_check_can_fail(&factory, &SuiteConfig::network())
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    assert_eq!(rejected.len(), controls::LeaseFlaw::ALL.len());
    let report = controls::leases_follow_their_rules(&factory, &SuiteConfig::network())
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    println!("{lib:?}: leases {report:?}, {:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_leases_follow_their_rules_within_their_bound() {
    leases(Lib::RedisRs).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_leases_follow_their_rules_within_their_bound() {
    leases(Lib::Fred).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_deny_cache_never_changes_what_is_admitted() {
    deny_cache(Lib::RedisRs).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_shadow_quotas_and_acquire() {
    shadow_and_acquire(Lib::RedisRs).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_deny_cache_never_changes_what_is_admitted() {
    deny_cache(Lib::Fred).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_shadow_quotas_and_acquire() {
    shadow_and_acquire(Lib::Fred).await;
}
