//! The demo: the traffic shapes of the problem against all four algorithms.
//!
//! `cargo run -p ratelimit-examples --bin demo` runs on the in-process store
//! (no server needed).

use std::sync::Arc;

use ratelimit_core::{ManualClock, Store, SystemClock};
use ratelimit_examples::demo;
use ratelimit_local::DashMapStore;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let clock = ManualClock::new(demo::NOON);
    let store: Arc<dyn Store> = Arc::new(DashMapStore::with_clock(clock.clone()));
    let backend = "in-process DashMapStore";
    let rows = demo::run_all(store, &clock, &demo::run_id(&SystemClock)).await;
    println!(
        "Plan: 100 requests per minute. Store: {backend}. Time: a ManualClock from 2026-11-30 12:00:00 UTC.\n"
    );
    print!("{}", demo::render(&rows));
    println!(
        "\nThe fixed window passes 200 requests in two seconds across 12:04:00; the sliding log never\n\
         lets more than 100 through in any trailing minute; the sliding window counter stays within\n\
         a few percent of it on two counters; the token bucket sells rate and burst separately.\n\
         Retry-After is the exact wait, rounded up to whole seconds as HTTP requires."
    );
}
