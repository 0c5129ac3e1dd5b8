//! The limiter's production controls over `LocalStore`, checked by the
//! testkit's shared functions (`ratelimit_testkit::controls`): the deny
//! cache admits exactly what the store admits, shadow quotas count but
//! never deny, `acquire` paces, shares one quota and is cancel-safe.

mod common;

use common::Local;
use ratelimit_testkit::SuiteConfig;
use ratelimit_testkit::controls;

#[tokio::test(flavor = "multi_thread")]
async fn the_deny_cache_never_changes_what_is_admitted() {
    let t = std::time::Instant::now();
    let report = controls::deny_cache_equivalence(&Local, &SuiteConfig::in_process())
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    println!("local deny cache: {report:?} in {:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_deny_cache_check_rejects_flawed_caches() {
    let rejected = controls::deny_cache_check_can_fail(&Local, &SuiteConfig::in_process())
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    for (flaw, why) in rejected {
        println!("{flaw:?} rejected: {why}\n");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn shadow_quotas_count_but_never_deny() {
    controls::shadow_quotas(&Local)
        .await
        .unwrap_or_else(|v| panic!("{v}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn acquire_paces_shares_and_is_cancel_safe() {
    controls::acquire_paces_one_worker(&Local)
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    let runs = controls::acquire_shares_one_quota(&Local, &SuiteConfig::in_process())
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    for run in runs {
        println!("acquire on one shared quota: {run:?}");
    }
    controls::acquire_cancel_safe(&Local)
        .await
        .unwrap_or_else(|v| panic!("{v}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn leases_follow_their_rules_within_their_bound() {
    let rejected = controls::lease_check_can_fail(&Local, &SuiteConfig::in_process())
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    for (flaw, why) in rejected {
        println!("leases that {flaw:?} rejected: {why}\n");
    }
    let report = controls::leases_follow_their_rules(&Local, &SuiteConfig::in_process())
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    println!("local leases: {report:?}");
}
