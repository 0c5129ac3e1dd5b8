//! The Lua scripts and their arguments: **one Lua source per algorithm**,
//! assembled at compile time into the single-quota scripts and the batch
//! script.
//!
//! Each algorithm's arithmetic is written once, in `src/scripts/parts/`
//! (`fixed_window.lua`, `sliding_window.lua`, `sliding_log.lua`,
//! `token_bucket.lua`: decide, writing nothing; `set_write.lua` and
//! `sliding_log_write.lua`: write an admission). `concat!` and
//! `include_str!` put the same text into:
//!
//! - the four single-quota scripts ([`FIXED_WINDOW`], [`SLIDING_WINDOW`],
//!   [`SLIDING_LOG`], [`TOKEN_BUCKET`]: `single_head.lua`, the algorithm's
//!   part, `single_write.lua`, its write, `single_tail.lua`), the lean path
//!   of one decision on an idle connection;
//! - the batch script ([`BATCH`]: `batch_head.lua`, every algorithm's part
//!   in turn, `batch_mid.lua`, the log's write, `batch_tail.lua`), which
//!   decides requests in order, each over one or more quotas, all or
//!   nothing: the several-quota call is a batch of one request, and
//!   decisions waiting for the same connection go out as one batch.
//!
//! A test checks that every script holds its parts' text verbatim.
//!
//! Each script does the whole read-modify-write inside Redis, so two app
//! servers deciding for one caller at the same instant can never both spend
//! the last token. Each part mirrors its function in `ratelimit_core::model`,
//! in integers below 2^53 (exact in Lua's doubles; floor division as
//! `(a - a % b) / b`, exact for such integers: the rounded quotient is never
//! within `1 / b` of an integer it does not reach), and returns
//! integers only (Redis truncates Lua numbers in replies). The scripts are
//! lean: no closures created per call, one `GET` for a counter or bucket
//! state (a batch reads every request's with one `MGET`) and one `PSETEX`
//! to write it, O(log n) sorted-set lookups for a log, integers formatted
//! with `'%d'`.
//!
//! A request over one quota alone goes through **that quota's own script**
//! ([`single`]): its algorithm's single-quota script with the quota's
//! numbers compiled in as Lua constants (one line differs), so each call
//! sends and converts the cost alone. Up to [`MAX_COMPILED`] quotas a
//! process get one; the rest use the algorithm's script, which takes the
//! numbers as arguments.
//!
//! Single-quota calling convention (a quota's own script: `ARGV[2]` is the
//! cost, and the injected clock's two arguments follow it):
//!
//! | | meaning |
//! |---|---|
//! | `KEYS[1]` | the caller's key, from [`crate::keys::key`] |
//! | `ARGV[1]` | the deadline in the server's µs, after which the caller no longer waits, `0` for none; negated as `-(deadline + 1)` to also return `TIME` (`-1`: no deadline, return `TIME`; see [`crate::deadline`]) |
//! | `ARGV[2..=4]` | fixed window, sliding window, sliding log: cost, limit, window µs; token bucket: `cost * unit`, refill, full (the unit itself is never sent: the script answers a bucket's remaining in units, and the client divides) |
//! | `ARGV[5]`, `ARGV[6]` | with an injected clock only: now in µs since the epoch, and the minimum expiry in ms (see [`INJECTED_CLOCK_MIN_EXPIRY`]); without them the script reads the server's `TIME` |
//!
//! Reply: `{allowed (0/1), remaining, reset_after_us, retry_after_us or -1}`
//! (a token bucket's remaining in bucket units),
//! followed by the server's `TIME` in µs when `ARGV[1]` asked for it; or
//! `{-1, server µs}` when `TIME` is past the deadline: **expired, nothing
//! read or written**. Split by [`crate::decode::split`], decoded by
//! [`crate::decode::decision`]. A token bucket's admission not asked for
//! `TIME` returns one integer instead of the four, which
//! [`crate::decode::token_bucket`] (through [`Request::unpack`]) turns into
//! them: a table and its conversion to a reply cost the server about 1 µs
//! of an admitting call's 8 (measured on a 2-vCPU Intel Xeon host).
//!
//! Batch calling convention ([`BATCH`]):
//!
//! | | meaning |
//! |---|---|
//! | `KEYS` | every request's keys, in order (one caller's keys share a hash tag; a cluster batch holds one slot) |
//! | `ARGV[1]` | minimum expiry in ms |
//! | `ARGV[2]` | the fields per request: `1` when every request is on the call's one quota set and the server's clock (the common batch: its deadline alone, all of them in one argument), else `3` |
//! | `ARGV[3]` | the earliest of the requests' deadlines in the server's µs (`0`: none has one): while `TIME` is not past it, no request can have expired and no request's own deadline is read |
//! | `ARGV[4]` | `1` when no key appears twice in `KEYS`, else `0`: the script reads every key's string state up front (one `MGET`), and keeps what it writes for the requests after only when a key repeats |
//! | `ARGV[5]` | the number of quota sets; then per set: its id, its number n of quotas, then per quota: the algorithm (1 fixed window, 2 sliding window, 3 sliding log, 4 token bucket), shadow (0/1), and the single script's `ARGV[2..=4]`. Requests over the same quotas share a set, sent and parsed once per call |
//! | then | with 3 fields, per request: now (`""`: `TIME`), its deadline in the server's µs (0: none), the id of its quota set; with 1, one argument: every request's deadline, in order, separated by spaces (the script splits it only when `TIME` is past the earliest) |
//!
//! Reply: per request 4 integers per quota (each as a single script's
//! reply, allowed first: 0 or 1), except one integer, `-2 - d`, for a token
//! bucket that admits a request that is admitted (`d`: the units it is
//! short of full; as the single script's one integer, it leaves the
//! client to compute the four, and most batched decisions are
//! admissions), or `-1` alone (expired: nothing written); then the
//! server's `TIME`. Decoded by [`crate::decode::batch`] and
//! [`Request::decisions`]. Each request is
//! decided exactly as it would be alone, in order: it sees the writes of
//! the ones before it. A denied request writes nothing; a quota that
//! admits a denied request reports its `remaining` without it.
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

mod call;
mod lua;
mod own;
mod quota_args;

pub use crate::arg::Arg;
pub use call::{Call, Request, injected_now};
pub use lua::{
    BATCH, FIXED_WINDOW, INJECTED_CLOCK_MIN_EXPIRY, PARTS, SLIDING_LOG, SLIDING_WINDOW, Script,
    TOKEN_BUCKET, all, for_quota,
};
pub use own::{MAX_COMPILED, args, single, single_args};
pub use quota_args::{Args, Keys};
