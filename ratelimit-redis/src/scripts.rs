//! The Lua scripts, one per algorithm, the multi-quota script, and their
//! arguments.
//!
//! Each script does the whole read-modify-write of one decision inside Redis,
//! so two app servers deciding for one caller at the same instant can never
//! both spend the last token. Each mirrors its function in
//! `ratelimit_core::model`, in integers below 2^53 (exact in Lua's doubles;
//! floor division as `(a - math.fmod(a, b)) / b`, exact because `fmod` is),
//! and returns integers only (Redis truncates Lua numbers in replies). The
//! scripts are lean: no helper closures created per call, one `GET` for a
//! counter or bucket state and O(log n) sorted-set lookups for a log, integers handed to Redis as Lua numbers (Redis
//! writes an integral number below 2^53 as its exact decimal digits).
//!
//! Calling convention:
//!
//! | | meaning |
//! |---|---|
//! | `KEYS[1]` | the caller's key, from [`crate::keys::key`] |
//! | `ARGV[1]` | now in µs since the epoch, or `""` to use the server's `TIME` |
//! | `ARGV[2]` | minimum expiry in ms (0 with the server clock; see [`INJECTED_CLOCK_MIN_EXPIRY`]) |
//! | `ARGV[3]` | the deadline in the server's µs, after which the caller no longer waits, `0` for none; negated as `-(deadline + 1)` to also return `TIME` (`-1`: no deadline, return `TIME`; see [`crate::deadline`]) |
//! | `ARGV[4..]` | fixed window, sliding window, sliding log: cost, limit, window µs; token bucket: `cost * unit`, refill, full, unit |
//!
//! Reply: `{allowed (0/1), remaining, reset_after_us, retry_after_us or -1}`,
//! followed by the server's `TIME` in µs when `ARGV[3]` asked for it; or
//! `{-1, server µs}` when `TIME` is past the deadline: **expired, nothing
//! read or written**. Split by [`crate::decode::split`], decoded by
//! [`crate::decode::decision`].
//!
//! # Several quotas in one call
//!
//! [`MULTI`] (`multi.lua`) decides one call against N quotas of any mix of
//! algorithms, all or nothing, as `ratelimit_core::model::decide_all` does,
//! in one `EVALSHA` whatever N. It holds the four algorithms' arithmetic as
//! Lua functions (the same code as their single scripts, which stay the
//! single-quota path) and runs in two phases: it decides every quota from
//! its stored state without writing; then, only if every enforced (not
//! shadow) quota admits the call, it writes the state of each quota that
//! admits it, exactly as the single script would. A denied call writes
//! nothing; a quota that admits a denied call reports its `remaining`
//! without the call (`remaining + cost`, at most the limit).
//!
//! | | meaning |
//! |---|---|
//! | `KEYS[i]` | quota i's key, from [`crate::keys::key`] (one caller: one hash tag, one slot) |
//! | `ARGV[1..=3]` | now, the minimum expiry and the deadline, as above |
//! | then per quota | the algorithm (1 fixed window, 2 sliding window, 3 sliding log, 4 token bucket), shadow (0/1), and the single script's `ARGV[4..]` |
//!
//! Reply: 4 integers per quota, in order, each group as a single script's
//! reply, then the server's µs if asked; or `{-1, server µs}` when expired.
//! Built by [`args_multi`] and decoded by [`crate::decode::decisions`].
//!
//! Stored state (one key per caller, policy and algorithm; the layouts and
//! their versioned key codes are in [`crate::keys::layout_code`]):
//!
//! | algorithm | type | value |
//! |---|---|---|
//! | fixed window | string | `window:count` |
//! | sliding window counter | string | `window:prev:curr` |
//! | sliding log | two sorted sets (`KEYS[1]` and `KEYS[1]:c`, one hash tag) | times (score µs, member call id) and cumulative costs (score, same ids, plus a base) |
//! | token bucket | string | the theoretical arrival time `tat` (µs) as one integer; `tat:rem` when the rate leaves a sub-µs remainder |
//!
//! Every write sets the key's expiry to the model's derived TTL rounded up to
//! whole milliseconds plus one (the server's expiry clock counts whole ms), so
//! a key disappears only once its state equals a fresh key's. **A denial
//! writes nothing**, for every algorithm: the model returns the stored state
//! unchanged for a denial (a sliding window counter is rolled into a new
//! window on read only; a sliding log drops entries that left the window only
//! when it admits), so there is nothing to write, and a clock that later
//! steps back finds the same state the model does.

use std::sync::LazyLock;
use std::time::Duration;

use ratelimit_core::model::Charge;
use ratelimit_core::{Algorithm, Micros, Quota};

/// How long keys are kept, at least, when the store uses an injected clock.
///
/// Redis expires keys by its own clock, while an injected clock (a test's
/// `ManualClock`, a replay) may stand still or crawl: a key expired by real
/// time could vanish while the injected time says its state still counts.
/// Keeping it longer is always safe (the model treats an old state as a
/// fresh one), so with an injected clock the expiry is at least this long.
pub const INJECTED_CLOCK_MIN_EXPIRY: Duration = Duration::from_secs(600);

/// One of the Lua scripts: the four single-quota ones and [`MULTI`].
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

    /// A short name: `fixed_window`, `sliding_window`, `sliding_log`,
    /// `token_bucket`, `multi`.
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
pub static FIXED_WINDOW: LazyLock<Script> =
    LazyLock::new(|| Script::new("fixed_window", include_str!("scripts/fixed_window.lua")));
/// The sliding window counter script.
pub static SLIDING_WINDOW: LazyLock<Script> =
    LazyLock::new(|| Script::new("sliding_window", include_str!("scripts/sliding_window.lua")));
/// The sliding log script.
pub static SLIDING_LOG: LazyLock<Script> =
    LazyLock::new(|| Script::new("sliding_log", include_str!("scripts/sliding_log.lua")));
/// The token bucket script.
pub static TOKEN_BUCKET: LazyLock<Script> =
    LazyLock::new(|| Script::new("token_bucket", include_str!("scripts/token_bucket.lua")));

/// The multi-quota script: several quotas, all or nothing, in one call
/// (see the module docs).
pub static MULTI: LazyLock<Script> =
    LazyLock::new(|| Script::new("multi", include_str!("scripts/multi.lua")));

/// The script for `quota`'s algorithm.
pub fn for_quota(quota: &Quota) -> &'static Script {
    match quota.algorithm() {
        Algorithm::FixedWindow(_) => &FIXED_WINDOW,
        Algorithm::SlidingWindow(_) => &SLIDING_WINDOW,
        Algorithm::SlidingLog(_) => &SLIDING_LOG,
        Algorithm::TokenBucket(_) => &TOKEN_BUCKET,
    }
}

/// Every script: the four single-quota ones and [`MULTI`].
pub fn all() -> [&'static Script; 5] {
    [
        &FIXED_WINDOW,
        &SLIDING_WINDOW,
        &SLIDING_LOG,
        &TOKEN_BUCKET,
        &MULTI,
    ]
}

/// `ARGV[1..=3]`: now, the minimum expiry, and no deadline (`0`; see
/// [`Call::set_deadline`]).
fn push_now(args: &mut Vec<String>, now: Option<Micros>) {
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
    args.push("0".to_owned());
}

fn push_quota(args: &mut Vec<String>, quota: &Quota, cost: u64) {
    match quota.algorithm() {
        Algorithm::FixedWindow(w) | Algorithm::SlidingWindow(w) | Algorithm::SlidingLog(w) => {
            args.push(cost.to_string());
            args.push(w.limit().to_string());
            args.push(w.window_micros().to_string());
        }
        Algorithm::TokenBucket(b) => {
            // `need` is computed here: one multiplication less in Lua.
            args.push((cost * b.unit()).to_string());
            args.push(b.refill().to_string());
            args.push(b.full().to_string());
            args.push(b.unit().to_string());
        }
    }
}

/// The `ARGV` of one [`MULTI`] call over `charges` (see the module docs);
/// the `KEYS` are each charge's key, in the same order.
///
/// `now`: `Some` with an injected clock, `None` to use the server's `TIME`.
/// Every cost must already have passed [`Quota::check_cost`].
pub fn args_multi(charges: &[Charge<'_>], now: Option<Micros>) -> Vec<String> {
    let mut args = Vec::with_capacity(3 + 6 * charges.len());
    push_now(&mut args, now);
    for c in charges {
        let kind = match c.quota.algorithm() {
            Algorithm::FixedWindow(_) => "1",
            Algorithm::SlidingWindow(_) => "2",
            Algorithm::SlidingLog(_) => "3",
            Algorithm::TokenBucket(_) => "4",
        };
        args.push(kind.to_owned());
        args.push(if c.shadow { "1" } else { "0" }.to_owned());
        push_quota(&mut args, c.quota, c.cost);
    }
    args
}

/// The `ARGV` of one call (see the module docs).
///
/// `now`: `Some` with an injected clock, `None` to use the server's `TIME`.
/// The cost must already have passed [`Quota::check_cost`].
pub fn args(quota: &Quota, now: Option<Micros>, cost: u64) -> Vec<String> {
    let mut args = Vec::with_capacity(7);
    push_now(&mut args, now);
    push_quota(&mut args, quota, cost);
    args
}

/// One script call, ready to send: the script, its keys and its arguments.
/// Built the same way by the single-node store and the cluster store, which
/// differ only in how they send it.
#[derive(Debug)]
pub struct Call {
    /// The script to run.
    pub script: &'static Script,
    /// `KEYS`: every key of one caller, so all in one hash slot.
    pub keys: Vec<String>,
    /// `ARGV`.
    pub args: Vec<String>,
}

impl Call {
    /// One decision under `quota` for `caller` (see [`args`]).
    pub fn one(prefix: &str, caller: &[u8], quota: &Quota, cost: u64, now: Option<Micros>) -> Self {
        Self {
            script: for_quota(quota),
            keys: vec![crate::keys::key(prefix, caller, quota)],
            args: args(quota, now, cost),
        }
    }

    /// One all-or-nothing decision over `charges` for `caller` (see
    /// [`args_multi`]).
    pub fn all(prefix: &str, caller: &[u8], charges: &[Charge<'_>], now: Option<Micros>) -> Self {
        Self {
            script: &MULTI,
            keys: charges
                .iter()
                .map(|c| crate::keys::key(prefix, caller, c.quota))
                .collect(),
            args: args_multi(charges, now),
        }
    }

    /// Sets `ARGV[3]`, the deadline in the server's µs (`0`: none;
    /// `-(deadline + 1)`: also return the server's `TIME`; see
    /// [`crate::deadline`]).
    pub fn set_deadline(&mut self, server_micros: i64) {
        if let Some(a) = self.args.get_mut(2) {
            *a = server_micros.to_string();
        }
    }

    /// The hash slot of the call's keys (they share one).
    pub fn slot(&self) -> u16 {
        crate::keys::slot(self.keys.first().map_or(&b""[..], |k| k.as_bytes()))
    }
}

/// "Now" for a store with an injected clock (`None`: the server's `TIME`),
/// refused beyond [`ratelimit_core::MAX_TIME`] (2^52 µs), past which a
/// token bucket's state could leave the range Lua's doubles hold exactly.
pub fn injected_now(
    clock: Option<&std::sync::Arc<dyn ratelimit_core::Clock>>,
) -> Result<Option<Micros>, ratelimit_core::StoreError> {
    let Some(clock) = clock else { return Ok(None) };
    let now = clock.now();
    if now > ratelimit_core::MAX_TIME {
        return Err(ratelimit_core::StoreError::message(
            format!(
                "injected clock reads {now} µs, beyond 2^52 (ratelimit_core::MAX_TIME): Lua \
                 cannot hold a token bucket's state exactly past it"
            ),
            false,
        ));
    }
    Ok(Some(now))
}
