//! The demo: the traffic shapes of the problem against all four algorithms.
//!
//! ```text
//! cargo run -p ratelimit-examples --bin demo                          # in-process store
//! cargo run -p ratelimit-examples --bin demo -- --redis redis://127.0.0.1:6379/
//! ```
//!
//! Time comes from a `ManualClock` either way (the Redis store is built with
//! an injected clock, for replays), so both print the same table.

use std::process::ExitCode;
use std::sync::Arc;

use ratelimit_core::{ManualClock, Store, SystemClock};
use ratelimit_examples::demo;
use ratelimit_local::LocalStore;
use ratelimit_redis::RedisStore;

const USAGE: &str = "usage: demo [--redis <URL>]";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let redis_url = match args.as_slice() {
        [] => None,
        [flag, url] if flag == "--redis" => Some(url.clone()),
        [flag] if flag == "--help" || flag == "-h" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let clock = ManualClock::new(demo::NOON);
    let run_id = demo::run_id(&SystemClock);
    let (store, backend): (Arc<dyn Store>, String) = match redis_url {
        None => (
            Arc::new(LocalStore::with_clock(clock.clone())),
            "in-process LocalStore".into(),
        ),
        Some(url) => {
            let built = RedisStore::builder(url.as_str())
                .prefix(&format!("demo{run_id}"))
                .clock(clock.clone())
                .build()
                .await;
            match built {
                Ok(store) => (Arc::new(store), format!("RedisStore at {url}")),
                Err(e) => {
                    eprintln!("cannot use Redis at {url}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    let rows = demo::run_all(store, &clock, &run_id).await;
    println!(
        "Plan: 100 requests per minute. Store: {backend}. Time: a ManualClock from 2026-11-30 12:00:00 UTC.\n"
    );
    print!("{}", demo::render(&rows));
    println!(
        "\nThe fixed window passes 200 requests in two seconds across 12:04:00; the sliding log never\n\
         lets more than 100 through in any trailing minute; the sliding window counter holds the\n\
         boundary on two counters; the token bucket sells rate and burst separately.\n\
         Retry-After is the exact wait, rounded up to whole seconds as HTTP requires."
    );
    ExitCode::SUCCESS
}
