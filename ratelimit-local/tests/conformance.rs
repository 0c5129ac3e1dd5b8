//! The shared conformance suite (contracts 1-9) against `DashMapStore`.

use std::sync::Arc;

use ratelimit_core::{ManualClock, Store, SystemClock};
use ratelimit_local::DashMapStore;
use ratelimit_testkit::{StoreFactory, SuiteConfig, run_all};

struct Local;

#[async_trait::async_trait]
impl StoreFactory for Local {
    async fn stores(&self, n: usize, clock: Option<ManualClock>) -> Vec<Arc<dyn Store>> {
        // One map per call; every "instance" is the same in-process store.
        let store: Arc<dyn Store> = match clock {
            Some(c) => Arc::new(DashMapStore::with_clock(c)),
            None => Arc::new(DashMapStore::with_clock(SystemClock)),
        };
        vec![store; n]
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dashmap_store_meets_every_contract() {
    if let Err(v) = run_all(&Local, &SuiteConfig::default()).await {
        panic!("{v}");
    }
}
