//! Shared by the integration tests: the store factory over `DashMapStore`.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use ratelimit_core::{ManualClock, Store, SystemClock};
use ratelimit_local::DashMapStore;
use ratelimit_testkit::StoreFactory;

/// Stores with the default sweep interval (1 s).
pub struct Local;

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
