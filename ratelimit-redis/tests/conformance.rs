//! The shared conformance suite (contracts 1-14) against a real Redis
//! server, once per client library, and once more with every decision sent
//! through the batch script: model agreement with the injected clock, the
//! invariants and the concurrency bounds (whose many threads at once also
//! form real batches) with the server's clock too.

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

/// The batch script's arithmetic, checked on its own: every decision goes
/// through it (a batch of one when alone; the concurrency contracts' many
/// threads form real batches of many).
#[tokio::test(flavor = "multi_thread")]
async fn the_batch_script_meets_every_contract() {
    let factory = Factory::new(Lib::RedisRs).batch_only();
    if let Err(v) = run_all(&factory, &SuiteConfig::default()).await {
        panic!("{v}");
    }
}
