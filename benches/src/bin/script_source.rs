//! Prints one of the store's Lua scripts as assembled from its parts (for
//! the shell benches that load them with `redis-cli SCRIPT LOAD`):
//! `fixed_window`, `sliding_window`, `sliding_log`, `token_bucket` or
//! `batch`.
//!
//! ```text
//! cargo run -q --release -p ratelimit-benches --bin script_source -- token_bucket
//! ```

use ratelimit_redis::scripts;

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    match scripts::all().into_iter().find(|s| s.name() == name) {
        Some(script) => print!("{}", script.lua()),
        None => {
            eprintln!(
                "usage: script_source <fixed_window|sliding_window|sliding_log|token_bucket|batch>"
            );
            std::process::exit(2);
        }
    }
}
