//! The Lua scripts, one per algorithm, and their arguments.
//!
//! Each script does the whole read-modify-write of one decision inside Redis,
//! so two app servers deciding for one caller at the same instant can never
//! both spend the last token. Each mirrors its function in
//! `ratelimit_core::model` operation for operation, in integers below 2^53
//! (exact in Lua's doubles; floor division via the exact `math.fmod`), and
//! returns integers only (Redis truncates Lua numbers in replies).
//!
//! Calling convention, shared by all four scripts:
//!
//! | | meaning |
//! |---|---|
//! | `KEYS[1]` | the caller's key, from [`crate::keys::key`] |
//! | `ARGV[1]` | now in µs since the epoch, or `""` to use the server's `TIME` |
//! | `ARGV[2]` | minimum expiry in ms (0 with the server clock; see [`INJECTED_CLOCK_MIN_EXPIRY`]) |
//! | `ARGV[3]` | cost |
//! | `ARGV[4..]` | fixed window, sliding window, sliding log: limit, window µs; token bucket: unit, refill, full |
//!
//! Reply: `{allowed (0/1), remaining, reset_after_us, retry_after_us or -1}`,
//! decoded by [`crate::decode::decision`].
//!
//! Stored state (one key per caller, policy and algorithm):
//!
//! | algorithm | type | value |
//! |---|---|---|
//! | fixed window | string | `window:count` |
//! | sliding window counter | string | `window:prev:curr` |
//! | sliding log | sorted set | member `time:cost`, score `time` (µs) |
//! | token bucket | string | `level:updated` (level in bucket units) |
//!
//! Every write sets the key's expiry to the model's derived TTL rounded up to
//! whole milliseconds plus one (the server's expiry clock counts whole ms), so
//! a key disappears only once its state equals a fresh key's. A denial writes
//! only when the model's new state differs from the stored one (a sliding
//! window rolled into a new window, a bucket refilled): storing exactly the
//! model's state keeps the two in step even when the clock later steps back.

use std::sync::LazyLock;
use std::time::Duration;

use ratelimit_core::{Algorithm, Micros, Quota};

/// How long keys are kept, at least, when the store uses an injected clock.
///
/// Redis expires keys by its own clock, while an injected clock (a test's
/// `ManualClock`, a replay) may stand still or crawl: a key expired by real
/// time could vanish while the injected time says its state still counts.
/// Keeping it longer is always safe (the model treats an old state as a
/// fresh one), so with an injected clock the expiry is at least this long.
pub const INJECTED_CLOCK_MIN_EXPIRY: Duration = Duration::from_secs(600);

/// One of the four Lua scripts.
#[derive(Debug)]
pub struct Script {
    name: &'static str,
    lua: &'static str,
    redis: redis::Script,
}

impl Script {
    fn new(name: &'static str, lua: &'static str) -> Self {
        Self {
            name,
            lua,
            redis: redis::Script::new(lua),
        }
    }

    /// A short name: `fixed_window`, `sliding_window`, `sliding_log`, `token_bucket`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The Lua source.
    pub fn lua(&self) -> &'static str {
        self.lua
    }

    /// The SHA-1 of the source, in lower-case hex, as `EVALSHA` takes it.
    pub fn sha1(&self) -> &str {
        self.redis.get_hash()
    }

    /// The script as a `redis::Script`, whose `invoke_async` sends `EVALSHA`
    /// and on `NOSCRIPT` loads the script and retries.
    pub fn redis(&self) -> &redis::Script {
        &self.redis
    }
}

/// The fixed window script.
pub static FIXED_WINDOW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "fixed_window",
        concat!(
            include_str!("scripts/prelude.lua"),
            include_str!("scripts/fixed_window.lua")
        ),
    )
});
/// The sliding window counter script.
pub static SLIDING_WINDOW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "sliding_window",
        concat!(
            include_str!("scripts/prelude.lua"),
            include_str!("scripts/sliding_window.lua")
        ),
    )
});
/// The sliding log script.
pub static SLIDING_LOG: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "sliding_log",
        concat!(
            include_str!("scripts/prelude.lua"),
            include_str!("scripts/sliding_log.lua")
        ),
    )
});
/// The token bucket script.
pub static TOKEN_BUCKET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "token_bucket",
        concat!(
            include_str!("scripts/prelude.lua"),
            include_str!("scripts/token_bucket.lua")
        ),
    )
});

/// The script for `quota`'s algorithm.
pub fn for_quota(quota: &Quota) -> &'static Script {
    match quota.algorithm() {
        Algorithm::FixedWindow(_) => &FIXED_WINDOW,
        Algorithm::SlidingWindow(_) => &SLIDING_WINDOW,
        Algorithm::SlidingLog(_) => &SLIDING_LOG,
        Algorithm::TokenBucket(_) => &TOKEN_BUCKET,
    }
}

/// All four scripts.
pub fn all() -> [&'static Script; 4] {
    [&FIXED_WINDOW, &SLIDING_WINDOW, &SLIDING_LOG, &TOKEN_BUCKET]
}

/// The `ARGV` of one call (see the module docs).
///
/// `now`: `Some` with an injected clock, `None` to use the server's `TIME`.
/// The cost must already have passed [`Quota::check_cost`].
pub fn args(quota: &Quota, now: Option<Micros>, cost: u64) -> Vec<String> {
    let mut args = Vec::with_capacity(6);
    match now {
        Some(now) => {
            args.push(now.to_string());
            args.push(INJECTED_CLOCK_MIN_EXPIRY.as_millis().to_string());
        }
        None => {
            args.push(String::new());
            args.push("0".to_owned());
        }
    }
    args.push(cost.to_string());
    match quota.algorithm() {
        Algorithm::FixedWindow(w) | Algorithm::SlidingWindow(w) | Algorithm::SlidingLog(w) => {
            args.push(w.limit().to_string());
            args.push(w.window_micros().to_string());
        }
        Algorithm::TokenBucket(b) => {
            args.push(b.unit().to_string());
            args.push(b.refill().to_string());
            args.push(b.full().to_string());
        }
    }
    args
}
