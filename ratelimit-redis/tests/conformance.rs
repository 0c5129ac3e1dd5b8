//! The shared conformance suite (contracts 1-9 and 11) against a real Redis server,
//! once per client library: model agreement with the injected clock, the
//! invariants and the concurrency bound with the server's clock too.

mod common;

use common::{Factory, Lib};
use ratelimit_testkit::{SuiteConfig, run_all};

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_store_meets_every_contract() {
    let factory = Factory::new(Lib::RedisRs);
    if let Err(v) = run_all(&factory, &SuiteConfig::default()).await {
        panic!("{v}");
    }
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_store_meets_every_contract() {
    let factory = Factory::new(Lib::Fred);
    if let Err(v) = run_all(&factory, &SuiteConfig::default()).await {
        panic!("{v}");
    }
}
