//! Prints one of the store's Lua scripts as assembled from its parts (for
//! the shell benches that load them with `redis-cli SCRIPT LOAD`):
//! `fixed_window`, `sliding_window`, `sliding_log`, `token_bucket` or
//! `batch`; or, with a quota after the name, that quota's own script (the
//! one the store sends a lone request of that quota with, its numbers
//! compiled in): `token_bucket <tokens> <per seconds> <capacity>` or
//! `fixed_window|sliding_window|sliding_log <limit> <per seconds>`.
//!
//! ```text
//! cargo run -q --release -p ratelimit-benches --bin script_source -- token_bucket
//! cargo run -q --release -p ratelimit-benches --bin script_source -- token_bucket 1 3600 20
//! ```

use std::time::Duration;

use ratelimit_core::{Quota, Rate};
use ratelimit_redis::scripts;

const USAGE: &str = "usage: script_source <fixed_window|sliding_window|sliding_log|token_bucket|batch> \
                     [<limit> <per seconds> [<capacity>]]";

fn fail(why: &str) -> ! {
    eprintln!("{why}\n{USAGE}");
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize| -> u64 {
        args[i]
            .parse()
            .unwrap_or_else(|_| fail(&format!("not a whole number: {}", args[i])))
    };
    let script = match (args.first().map(String::as_str), args.len()) {
        (Some(name), 1) => scripts::all()
            .into_iter()
            .find(|s| s.name() == name)
            .unwrap_or_else(|| fail(&format!("no script named {name}"))),
        (Some(name), 3 | 4) => {
            let rate = Rate::new(number(1), Duration::from_secs(number(2)));
            let quota = match (name, args.len()) {
                ("token_bucket", 4) => Quota::token_bucket(rate, number(3)),
                ("fixed_window", 3) => Quota::fixed_window(rate),
                ("sliding_window", 3) => Quota::sliding_window(rate),
                ("sliding_log", 3) => Quota::sliding_log(rate),
                _ => fail("a quota of that algorithm takes other numbers"),
            }
            .unwrap_or_else(|e| fail(&e.to_string()));
            scripts::single(&quota)
        }
        _ => fail("no script named"),
    };
    print!("{}", script.lua());
}
