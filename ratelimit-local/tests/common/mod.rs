//! Shared by the integration tests: the store factory over `LocalStore`.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use ratelimit_core::{ManualClock, Store, SystemClock};
use ratelimit_local::LocalStore;
use ratelimit_testkit::StoreFactory;

/// Stores with the default sweep interval (1 s).
pub struct Local;

#[async_trait::async_trait]
impl StoreFactory for Local {
    async fn stores(&self, n: usize, clock: Option<ManualClock>) -> Vec<Arc<dyn Store>> {
        // One map per call; every "instance" is the same in-process store.
        let store: Arc<dyn Store> = match clock {
            Some(c) => Arc::new(LocalStore::with_clock(c)),
            None => Arc::new(LocalStore::with_clock(SystemClock)),
        };
        vec![store; n]
    }
}
