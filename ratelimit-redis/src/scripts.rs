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

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, PoisonError, RwLock};
use std::time::Duration;

use smallvec::SmallVec;

use ratelimit_core::model::Charge;
use ratelimit_core::{Algorithm, Micros, Quota, StoreError};

pub use crate::arg::Arg;
use crate::decode::{self, Limit};
use ratelimit_core::store::Decisions;

/// How long keys are kept, at least, when the store uses an injected clock.
///
/// Redis expires keys by its own clock, while an injected clock (a test's
/// `ManualClock`, a replay) may stand still or crawl: a key expired by real
/// time could vanish while the injected time says its state still counts.
/// Keeping it longer is always safe (the model treats an old state as a
/// fresh one), so with an injected clock the expiry is at least this long.
pub const INJECTED_CLOCK_MIN_EXPIRY: Duration = Duration::from_secs(600);

/// One of the Lua scripts: the four single-quota ones, [`BATCH`], and a
/// quota's own single script (see [`single`]).
#[derive(Debug)]
pub struct Script {
    name: &'static str,
    lua: &'static str,
    redis: redis::Script,
    /// A quota's own script: its numbers are compiled in, and `ARGV[2]` is
    /// the cost alone.
    compiled: bool,
    /// Whether a call with this script has succeeded in this process.
    loaded: AtomicBool,
}

impl Script {
    fn new(name: &'static str, lua: &'static str) -> Self {
        Self {
            name,
            lua,
            redis: redis::Script::new(lua),
            compiled: false,
            loaded: AtomicBool::new(false),
        }
    }

    /// Whether a call should carry the source (`EVAL`) rather than the SHA
    /// (`EVALSHA`): a quota's own script, made after the store loaded the
    /// algorithms' scripts on its servers, until a call with it has
    /// succeeded ([`Script::mark_loaded`]). Without it, every caller of a
    /// new quota would meet `NOSCRIPT` at once and pay two more round trips
    /// (the source, then the SHA again); a server that lost it later (a
    /// restart, another node) still answers `NOSCRIPT`, and the stores then
    /// send the source.
    pub fn send_source_first(&self) -> bool {
        self.compiled && !self.loaded.load(Ordering::Relaxed)
    }

    /// Records that a call with this script succeeded.
    pub fn mark_loaded(&self) {
        if self.compiled && !self.loaded.load(Ordering::Relaxed) {
            self.loaded.store(true, Ordering::Relaxed);
        }
    }

    /// Whether this is a quota's own single script, taking the cost alone
    /// where the algorithm's script takes the quota's numbers (see
    /// [`single`]).
    pub fn is_compiled(&self) -> bool {
        self.compiled
    }

    /// A short name: `fixed_window`, `sliding_window`, `sliding_log`,
    /// `token_bucket`, `batch`.
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

    /// `EVALSHA <sha1> <numkeys> <keys…> <args…>` of this script, or `EVAL`
    /// with the source when `source`, as a redis-rs command (the fred
    /// backends build theirs with `fred::script_command`, under the `fred`
    /// feature).
    pub fn command(&self, keys: &[String], args: &[Arg], source: bool) -> redis::Cmd {
        // Sized once: every argument's bytes, and a few for the count.
        let (name, script) = if source {
            ("EVAL", self.lua)
        } else {
            ("EVALSHA", self.sha1())
        };
        let bytes = name.len()
            + script.len()
            + 4
            + keys.iter().map(String::len).sum::<usize>()
            + args.iter().map(Arg::len_hint).sum::<usize>();
        let mut cmd = redis::Cmd::with_capacity(3 + keys.len() + args.len(), bytes);
        cmd.arg(name)
            .arg(script)
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        cmd
    }

    /// The script as a `redis::Script` (its `invoke_async` sends `EVALSHA`
    /// and on `NOSCRIPT` loads the script and retries; the stores build
    /// their own command with [`Script::command`] instead).
    pub fn redis(&self) -> &redis::Script {
        &self.redis
    }
}

/// One single-quota script: the head, the read of a string state (for the
/// algorithms that keep one), the algorithm's part, the write head, its
/// write, what an admission answers early (if anything), the tail.
macro_rules! single {
    ($read:literal, $part:literal, $write:literal) => {
        single!($read, $part, $write, "")
    };
    ($read:literal, $part:literal, $write:literal, $admitted:literal) => {
        concat!(
            include_str!("scripts/parts/single_head.lua"),
            $read,
            include_str!(concat!("scripts/parts/", $part)),
            include_str!("scripts/parts/single_write.lua"),
            include_str!(concat!("scripts/parts/", $write)),
            $admitted,
            include_str!("scripts/parts/single_tail.lua"),
        )
    };
}

/// The algorithms' parts, by file name: the text every script holds.
pub const PARTS: [(&str, &str); 6] = [
    (
        "fixed_window.lua",
        include_str!("scripts/parts/fixed_window.lua"),
    ),
    (
        "sliding_window.lua",
        include_str!("scripts/parts/sliding_window.lua"),
    ),
    (
        "sliding_log.lua",
        include_str!("scripts/parts/sliding_log.lua"),
    ),
    (
        "token_bucket.lua",
        include_str!("scripts/parts/token_bucket.lua"),
    ),
    ("set_write.lua", include_str!("scripts/parts/set_write.lua")),
    (
        "sliding_log_write.lua",
        include_str!("scripts/parts/sliding_log_write.lua"),
    ),
];

const BATCH_LUA: &str = concat!(
    include_str!("scripts/parts/batch_head.lua"),
    include_str!("scripts/parts/token_bucket.lua"),
    "    elseif kind == '1' then\n",
    include_str!("scripts/parts/fixed_window.lua"),
    "    elseif kind == '2' then\n",
    include_str!("scripts/parts/sliding_window.lua"),
    "    else\n",
    include_str!("scripts/parts/sliding_log.lua"),
    include_str!("scripts/parts/batch_mid.lua"),
    include_str!("scripts/parts/sliding_log_write.lua"),
    include_str!("scripts/parts/batch_tail.lua"),
);

/// A single-quota script of an algorithm whose state is one string: read
/// with one `GET` before its part, written with `set_write.lua` after.
macro_rules! single_string {
    ($part:literal $(, $admitted:literal)?) => {
        single!("local v = call('GET', key)\n", $part, "set_write.lua" $(, $admitted)?)
    };
}

/// The fixed window script.
pub static FIXED_WINDOW: LazyLock<Script> =
    LazyLock::new(|| Script::new("fixed_window", single_string!("fixed_window.lua")));
/// The sliding window counter script.
pub static SLIDING_WINDOW: LazyLock<Script> =
    LazyLock::new(|| Script::new("sliding_window", single_string!("sliding_window.lua")));
/// The sliding log script.
pub static SLIDING_LOG: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "sliding_log",
        single!("", "sliding_log.lua", "sliding_log_write.lua"),
    )
});
/// The token bucket script. An admission not asked for the server's `TIME`
/// answers one integer, `z - remaining`: the units the bucket is short of
/// full, from which [`crate::decode::token_bucket`] computes the four (a
/// Lua table and its conversion cost the server about 1 µs a call). A
/// denial answers the four: its shortfall `delta * y + rho` may pass 2^53
/// (a state written under other numbers), where Lua's doubles are no
/// longer exact.
pub static TOKEN_BUCKET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "token_bucket",
        single_string!(
            "token_bucket.lua",
            "  if not tail then return z - remaining end\n"
        ),
    )
});

/// The batch script: requests in order, each over one or more quotas, all
/// or nothing (see the module docs). A several-quota call is a batch of
/// one.
pub static BATCH: LazyLock<Script> = LazyLock::new(|| Script::new("batch", BATCH_LUA));

/// The line of `single_head.lua` that reads the quota's numbers from
/// `ARGV`: a quota's own script replaces it (see [`single`]).
const ARGS_LINE: &str = "local x, y, z, c = ARGV[2] + 0, ARGV[3] + 0, ARGV[4] + 0, 5\n";

/// How many quotas get a script of their own (see [`single`]), per process.
pub const MAX_COMPILED: usize = 256;

/// A quota's numbers as its own script compiles them in: the algorithm's
/// code, `y`, `z` and the token bucket's unit (1 for a window).
type Shape = (&'static str, u64, u64, u64);

/// Quotas' own scripts, by shape, up to a bound; each leaked once (at most
/// [`MAX_COMPILED`] in the process, about 5 KB each), so that a call holds
/// it as `&'static` as it holds the algorithms' scripts.
#[derive(Debug)]
struct Compiled {
    by_shape: RwLock<foldhash::HashMap<Shape, &'static Script>>,
    bound: usize,
}

impl Compiled {
    fn new(bound: usize) -> Self {
        Self {
            by_shape: RwLock::default(),
            bound,
        }
    }

    /// The own script of the quota of `args`, whose algorithm's script is
    /// `generic`, made on first use; `generic` once the bound is reached.
    fn get(&self, generic: &'static Script, args: &QuotaArgs) -> &'static Script {
        let shape: Shape = (args.kind, args.y, args.z, args.unit);
        let found = self
            .by_shape
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&shape)
            .copied();
        if let Some(s) = found {
            return s;
        }
        let mut map = self
            .by_shape
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = map.get(&shape) {
            return s;
        }
        if map.len() >= self.bound {
            return generic;
        }
        let s: &'static Script = Box::leak(Box::new(compile(generic, args)));
        map.insert(shape, s);
        s
    }
}

static COMPILED: LazyLock<Compiled> = LazyLock::new(|| Compiled::new(MAX_COMPILED));

/// The single-quota script a request over `quota` alone is sent with:
/// **the quota's own script**, where the quota's numbers (the limit and
/// window, or the refill, full bucket and unit) are Lua constants compiled
/// into the algorithm's script, so that each call sends and converts one
/// argument (the cost) where [`for_quota`]'s script takes three: about
/// 5,000 fewer server instructions a call (BENCHMARKS.md). The first
/// [`MAX_COMPILED`] quotas of a process get one (Redis keeps each loaded
/// script until `SCRIPT FLUSH`, so their number is bounded); later ones
/// use [`for_quota`]'s. Both decide alike: a test runs them side by side.
pub fn single(quota: &Quota) -> &'static Script {
    COMPILED.get(for_quota(quota), &QuotaArgs::new(quota, 1, false))
}

/// `generic` with the quota of `args` compiled in: its [`ARGS_LINE`]
/// replaced by the quota's constants.
fn compile(generic: &Script, args: &QuotaArgs) -> Script {
    let x = match args.unit {
        1 => "ARGV[2] + 0".to_owned(),
        unit => format!("ARGV[2] * {unit}"),
    };
    let line = format!("local x, y, z, c = {x}, {}, {}, 3\n", args.y, args.z);
    let lua: &'static str = Box::leak(generic.lua.replacen(ARGS_LINE, &line, 1).into_boxed_str());
    Script {
        compiled: true,
        ..Script::new(generic.name, lua)
    }
}

/// The script for `quota`'s algorithm, which takes the quota's numbers as
/// arguments (see [`single`] for the script a lone request is sent with).
pub fn for_quota(quota: &Quota) -> &'static Script {
    match quota.algorithm() {
        Algorithm::FixedWindow(_) => &FIXED_WINDOW,
        Algorithm::SlidingWindow(_) => &SLIDING_WINDOW,
        Algorithm::SlidingLog(_) => &SLIDING_LOG,
        Algorithm::TokenBucket(_) => &TOKEN_BUCKET,
    }
}

/// Every script: the four single-quota ones and [`BATCH`].
pub fn all() -> [&'static Script; 5] {
    [
        &FIXED_WINDOW,
        &SLIDING_WINDOW,
        &SLIDING_LOG,
        &TOKEN_BUCKET,
        &BATCH,
    ]
}

/// With an injected clock: now and the minimum expiry, after the quota's
/// numbers (`ARGV[5..=6]`) or after the cost in a quota's own script.
fn push_now(args: &mut Args, now: Option<Micros>) {
    if let Some(now) = now {
        args.push(Arg::from(now));
        args.push(Arg::from(INJECTED_CLOCK_MIN_EXPIRY.as_millis()));
    }
}

/// A call's `KEYS`: inline for one (a lone request's of one quota).
pub type Keys = SmallVec<[String; 1]>;

/// A call's `ARGV`: inline up to six (a single-quota call's, with an
/// injected clock), so a lone call allocates nothing for them.
pub type Args = SmallVec<[Arg; 6]>;

/// The arguments as the text each is sent as.
fn texts(args: &[Arg]) -> Vec<String> {
    args.iter().map(Arg::to_string).collect()
}

/// The algorithm code of the batch script (see the module docs).
fn kind(quota: &Quota) -> &'static str {
    match quota.algorithm() {
        Algorithm::FixedWindow(_) => "1",
        Algorithm::SlidingWindow(_) => "2",
        Algorithm::SlidingLog(_) => "3",
        Algorithm::TokenBucket(_) => TOKEN_BUCKET_KIND,
    }
}

/// The token bucket's algorithm code in the batch script.
const TOKEN_BUCKET_KIND: &str = "4";

/// The `ARGV` of one single-quota call (see the module docs).
///
/// `now`: `Some` with an injected clock, `None` to use the server's `TIME`.
/// The cost must already have passed [`Quota::check_cost`].
pub fn args(quota: &Quota, now: Option<Micros>, cost: u64) -> Vec<String> {
    let mut args = Args::new();
    args.push(Arg::Int(0));
    QuotaArgs::new(quota, cost, false).push_values(&mut args);
    push_now(&mut args, now);
    texts(&args)
}

/// The `ARGV` of one call of [`single`]`(quota)`, the script the store
/// sends a lone request with: the cost alone for a quota's own script,
/// [`args`] for its algorithm's (no deadline: `ARGV[1]` is `0`).
pub fn single_args(quota: &Quota, now: Option<Micros>, cost: u64) -> Vec<String> {
    let mut args = Args::new();
    args.push(Arg::Int(0));
    QuotaArgs::new(quota, cost, false).push_single(single(quota), &mut args);
    push_now(&mut args, now);
    texts(&args)
}

/// One quota of a request as its script arguments, kept as numbers until a
/// call is built (a batch formats each distinct quota set once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QuotaArgs {
    /// The batch script's algorithm code (see [`kind`]).
    kind: &'static str,
    shadow: bool,
    /// The cost.
    cost: u64,
    /// Bucket units per token (1 for a window).
    unit: u64,
    /// The single script's `ARGV[3..=4]` (`ARGV[2]` is `x`: the cost, times
    /// the unit).
    y: u64,
    z: u64,
}

impl QuotaArgs {
    fn new(quota: &Quota, cost: u64, shadow: bool) -> Self {
        let (unit, y, z) = match quota.algorithm() {
            Algorithm::FixedWindow(w) | Algorithm::SlidingWindow(w) | Algorithm::SlidingLog(w) => {
                (1, w.limit(), w.window_micros())
            }
            Algorithm::TokenBucket(b) => (b.unit(), b.refill(), b.full()),
        };
        Self {
            kind: kind(quota),
            shadow,
            cost,
            unit,
            y,
            z,
        }
    }

    /// `x, y, z`: the single script's `ARGV[2..=4]` (`need` is computed
    /// here for a token bucket: one multiplication less in Lua).
    fn push_values(&self, args: &mut Args) {
        args.push(Arg::from(self.cost * self.unit));
        args.push(Arg::from(self.y));
        args.push(Arg::from(self.z));
    }

    /// What `script` (this quota's own, or its algorithm's) takes after the
    /// deadline: the cost alone, or [`QuotaArgs::push_values`].
    fn push_single(&self, script: &Script, args: &mut Args) {
        if script.compiled {
            args.push(Arg::from(self.cost));
        } else {
            self.push_values(args);
        }
    }

    /// The batch script's five arguments of this quota.
    fn push_batch(&self, args: &mut Args) {
        args.push(Arg::Static(self.kind));
        args.push(Arg::Int(i64::from(self.shadow)));
        self.push_values(args);
    }
}

/// One request, ready to go alone or in a batch: the caller's keys and its
/// quotas' arguments. Built the same way by the single-node store and the
/// cluster store.
#[derive(Debug, Clone)]
pub struct Request {
    /// The script for this request alone: its algorithm's single-quota
    /// script for one quota (sent as the quota's own, [`single`], by
    /// [`Call::alone`]), [`BATCH`] (a batch of one) for several.
    script: &'static Script,
    /// One key per quota, in order; one caller, so one hash slot.
    pub keys: Keys,
    /// The hash slot of the keys.
    slot: u16,
    /// Per quota: its script arguments.
    quota_args: SmallVec<[QuotaArgs; 1]>,
    /// What decoding needs of each quota: its limit and the units its
    /// remaining is answered in.
    pub limits: SmallVec<[Limit; 1]>,
    /// "Now" with an injected clock; `None`: the server's `TIME`.
    pub now: Option<Micros>,
}

impl Request {
    /// A request for `caller` over `charges` (costs already checked).
    pub fn new(prefix: &str, caller: &[u8], charges: &[Charge<'_>], now: Option<Micros>) -> Self {
        Self::build(prefix, caller, charges, now, true)
    }

    /// As [`Request::new`], for a single node, where no call is routed by
    /// hash slot: the slot is not computed ([`Request::slot`] reads 0).
    pub fn on_one_node(
        prefix: &str,
        caller: &[u8],
        charges: &[Charge<'_>],
        now: Option<Micros>,
    ) -> Self {
        Self::build(prefix, caller, charges, now, false)
    }

    fn build(
        prefix: &str,
        caller: &[u8],
        charges: &[Charge<'_>],
        now: Option<Micros>,
        slotted: bool,
    ) -> Self {
        // The algorithm's script for one quota: a request sent alone takes
        // the quota's own ([`Call::alone`]), one in a batch never needs it.
        let script = match charges {
            [c] => for_quota(c.quota),
            _ => &BATCH,
        };
        let keys: Keys = charges
            .iter()
            .map(|c| crate::keys::key(prefix, caller, c.quota))
            .collect();
        Self {
            script,
            slot: match keys.first() {
                Some(k) if slotted => crate::keys::slot(k.as_bytes()),
                _ => 0,
            },
            keys,
            quota_args: charges
                .iter()
                .map(|c| QuotaArgs::new(c.quota, c.cost, c.shadow))
                .collect(),
            limits: charges.iter().map(|c| Limit::of(c.quota)).collect(),
            now,
        }
    }

    /// The same request, sent alone through the batch script (a batch of
    /// one) rather than its single-quota script.
    pub fn through_batch(mut self) -> Self {
        self.script = &BATCH;
        self
    }

    /// The number of quotas.
    pub fn quotas(&self) -> usize {
        self.limits.len()
    }

    /// The hash slot of its keys (they share one; 0 for a request made
    /// [`Request::on_one_node`]).
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// Whether it goes alone through a single-quota script.
    pub fn is_single(&self) -> bool {
        !std::ptr::eq(self.script, &*BATCH)
    }

    /// The four decision integers of the one integer a single token-bucket
    /// call of this request returned (see [`crate::decode::token_bucket`]);
    /// an error for a request of another kind, which never returns one.
    pub fn unpack(&self, packed: i64) -> Result<[i64; 4], StoreError> {
        match self.quota_args.as_slice() {
            [q] if std::ptr::eq(self.script, &*TOKEN_BUCKET) => {
                crate::decode::token_bucket(packed, q.y, q.z)
            }
            _ => Err(StoreError::message(
                format!("unexpected rate-limit script reply {packed}"),
                false,
            )),
        }
    }

    /// Each quota's `(refill, full)` if it is a token bucket: what turns
    /// its one-integer batch answer into the four ([`decode::take_four`]).
    fn buckets(&self) -> impl Iterator<Item = Option<(u64, u64)>> + '_ {
        self.quota_args
            .iter()
            .map(|q| (q.kind == TOKEN_BUCKET_KIND).then_some((q.y, q.z)))
    }

    /// This request's decisions from its answer in a batch reply
    /// ([`decode::Outcome::Decided`]), each quota's answer decoded where it
    /// stands (no copy of the answer, nothing allocated for one quota).
    pub fn decisions(&self, answer: &[i64]) -> Result<Decisions, StoreError> {
        let mut rest = answer;
        let decisions = self
            .buckets()
            .zip(&self.limits)
            .map(|(bucket, &limit)| decode::decision(&decode::take_four(&mut rest, bucket)?, limit))
            .collect::<Result<Decisions, StoreError>>()?;
        if rest.is_empty() {
            Ok(decisions)
        } else {
            Err(decode::bad_batch_answer(answer))
        }
    }
}

/// One script call, ready to send: the script, its keys and its arguments.
/// Built the same way by the single-node store and the cluster store, which
/// differ only in how they send it.
#[derive(Debug)]
pub struct Call {
    /// The script to run.
    pub script: &'static Script,
    /// `KEYS`: every key of every request, in order.
    pub keys: Keys,
    /// `ARGV`.
    pub args: Args,
    /// How many requests the call decides (1 alone, more in a batch). A
    /// cluster node refuses a call of several keys with `TRYAGAIN` while a
    /// slot migration has moved some of them and not others; a batch of
    /// several requests that meets it is sent again request by request
    /// (see [`crate::engine::Straddles`]).
    pub requests: usize,
}

/// `ARGV[2]`/`ARGV[1]`: the minimum expiry, for a request on an injected
/// clock or the server's.
fn min_expiry(now: Option<Micros>) -> Arg {
    match now {
        Some(_) => Arg::from(INJECTED_CLOCK_MIN_EXPIRY.as_millis()),
        None => Arg::Int(0),
    }
}

/// A deadline as the single-quota scripts take it (see
/// [`crate::deadline`]), as the batch script takes it: the instant alone,
/// 0 for none (the batch script always returns `TIME`).
fn batch_deadline(server_micros: i64) -> Arg {
    Arg::Int(batch_deadline_micros(server_micros))
}

/// As [`batch_deadline`], the number.
fn batch_deadline_micros(server_micros: i64) -> i64 {
    if server_micros < 0 {
        -1 - server_micros
    } else {
        server_micros
    }
}

/// Whether no key appears twice (the batch script then keeps none of its
/// writes for later requests: each reads its key's state as the call found
/// it).
fn distinct(keys: &[String]) -> bool {
    match keys {
        [] | [_] => true,
        [a, b] => a != b,
        _ => {
            let mut seen = foldhash::HashSet::with_capacity_and_hasher(
                keys.len(),
                foldhash::fast::RandomState::default(),
            );
            keys.iter().all(|k| seen.insert(k.as_str()))
        }
    }
}

impl Call {
    /// One request alone, with its deadline in the server's µs (as
    /// [`crate::deadline::ServerClock::server_deadline`] gives it): the
    /// single-quota script, or a batch of one for several quotas.
    pub fn alone(request: &Request, server_deadline: i64) -> Self {
        Self::alone_with_keys(request, server_deadline, request.keys.clone())
    }

    /// As [`Call::alone`], moving the keys out of the request rather than
    /// copying them (the request is then only decoded).
    pub fn alone_taking_keys(request: &mut Request, server_deadline: i64) -> Self {
        let keys = std::mem::take(&mut request.keys);
        Self::alone_with_keys(request, server_deadline, keys)
    }

    fn alone_with_keys(request: &Request, server_deadline: i64, keys: Keys) -> Self {
        if request.is_single() {
            let mut args = Args::new();
            args.push(Arg::Int(server_deadline));
            let mut script = request.script;
            if let Some(q) = request.quota_args.first() {
                script = COMPILED.get(script, q);
                q.push_single(script, &mut args);
            }
            push_now(&mut args, request.now);
            Self {
                script,
                keys,
                args,
                requests: 1,
            }
        } else {
            Self::batch_with_keys(&[(request, server_deadline)], keys)
        }
    }

    /// Several requests as one call of [`BATCH`], in order, each with its
    /// deadline in the server's µs. Every request's keys must be in one
    /// hash slot on a cluster.
    pub fn batch(requests: &[(&Request, i64)]) -> Self {
        let keys = requests
            .iter()
            .flat_map(|(r, _)| r.keys.iter().cloned())
            .collect();
        Self::batch_with_keys(requests, keys)
    }

    /// As [`Call::batch`], moving the keys out of the requests rather than
    /// copying them (the requests are then only decoded).
    pub fn batch_taking_keys(requests: &mut [(&mut Request, i64)]) -> Self {
        let keys = requests
            .iter_mut()
            .flat_map(|(r, _)| std::mem::take(&mut r.keys))
            .collect();
        let shared: Vec<(&Request, i64)> = requests.iter().map(|(r, d)| (&**r, *d)).collect();
        Self::batch_with_keys(&shared, keys)
    }

    fn batch_with_keys(requests: &[(&Request, i64)], keys: Keys) -> Self {
        // Requests over the same quotas share one set (most batches hold
        // one): its arguments are sent and parsed once. `set_of[i]` is the
        // set of request i, `sets` the first request of each set.
        let mut sets: Vec<&Request> = Vec::new();
        let mut set_of = Vec::with_capacity(requests.len());
        for (r, _) in requests {
            let found = sets.iter().position(|s| s.quota_args == r.quota_args);
            set_of.push(found.unwrap_or_else(|| {
                sets.push(r);
                sets.len() - 1
            }));
        }
        let mut args = Args::with_capacity(
            5 + sets
                .iter()
                .map(|s| 2 + 5 * s.quota_args.len())
                .sum::<usize>()
                + 3 * requests.len(),
        );
        // One set and the server's clock (the common batch): each request
        // sends its deadline alone, and all go in one argument.
        let compact = sets.len() == 1 && requests.iter().all(|(r, _)| r.now.is_none());
        args.push(min_expiry(requests.first().and_then(|(r, _)| r.now)));
        args.push(Arg::Int(if compact { 1 } else { 3 }));
        // The earliest deadline: while the server's clock is not past it,
        // the script reads no request's own.
        let earliest = requests
            .iter()
            .map(|(_, d)| batch_deadline_micros(*d))
            .filter(|d| *d > 0)
            .min()
            .unwrap_or(0);
        args.push(Arg::Int(earliest));
        args.push(Arg::Int(i64::from(distinct(&keys))));
        args.push(Arg::from(sets.len()));
        for (id, s) in (1..).zip(&sets) {
            args.push(Arg::Int(id));
            args.push(Arg::from(s.quotas()));
            for q in &s.quota_args {
                q.push_batch(&mut args);
            }
        }
        if compact {
            // Every deadline in one argument, in order, space-separated.
            let mut all = String::with_capacity(17 * requests.len());
            for (i, (_, deadline)) in requests.iter().enumerate() {
                if i > 0 {
                    all.push(' ');
                }
                let _ = write!(all, "{}", batch_deadline_micros(*deadline));
            }
            args.push(Arg::Text(all));
        } else {
            for ((r, deadline), set) in requests.iter().zip(set_of) {
                match r.now {
                    Some(now) => args.push(Arg::from(now)),
                    None => args.push(Arg::Static("")),
                }
                args.push(batch_deadline(*deadline));
                args.push(Arg::from(set + 1));
            }
        }
        Self {
            script: &BATCH,
            keys,
            args,
            requests: requests.len(),
        }
    }

    /// The hash slot of the call's keys (one per call).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn part(name: &str) -> &'static str {
        PARTS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, text)| *text)
            .expect("a part")
    }

    /// One Lua source per algorithm: the single-quota script and the batch
    /// script of each algorithm hold the same text, verbatim.
    #[test]
    fn every_script_holds_its_algorithms_part_verbatim() {
        for (script, algorithm, write) in [
            (&*FIXED_WINDOW, "fixed_window.lua", "set_write.lua"),
            (&*SLIDING_WINDOW, "sliding_window.lua", "set_write.lua"),
            (&*SLIDING_LOG, "sliding_log.lua", "sliding_log_write.lua"),
            (&*TOKEN_BUCKET, "token_bucket.lua", "set_write.lua"),
        ] {
            assert!(script.lua().contains(part(algorithm)), "{}", script.name());
            assert!(script.lua().contains(part(write)), "{}", script.name());
            assert!(BATCH.lua().contains(part(algorithm)), "batch: {algorithm}");
        }
        assert!(BATCH.lua().contains(part("sliding_log_write.lua")));
        // The string write is the batch script's own one-line PSETEX, in
        // its two passes and on the path of a lone string quota.
        assert!(BATCH.lua().contains("call('PSETEX', key, mss[i], wv)"));
        assert!(BATCH.lua().contains("call('PSETEX', key, last_mss, wv)"));
        // No script carries a second copy of an algorithm.
        for (name, text) in PARTS {
            assert_eq!(
                BATCH.lua().matches(text).count(),
                usize::from(name != "set_write.lua"),
                "{name}"
            );
        }
    }

    #[test]
    fn a_single_quota_request_goes_alone_with_the_single_script_arguments() {
        let q = Quota::token_bucket(ratelimit_core::Rate::per_minute(100), 20).unwrap();
        let r = Request::new("rl", b"k", &[Charge::new(&q, 2)], None);
        let call = Call::alone(&r, -1);
        // The quota's own script: the deadline and the cost.
        assert!(std::ptr::eq(call.script, single(&q)));
        assert!(call.script.is_compiled());
        assert_eq!(call.args[..], ["-1", "2"]);
        // With an injected clock, now and the minimum expiry after them.
        let r1 = Request::new("rl", b"k", &[Charge::new(&q, 2)], Some(7));
        assert_eq!(Call::alone(&r1, 0).args[..], ["0", "2", "7", "600000"]);
        // The algorithm's script takes the quota's numbers.
        assert_eq!(args(&q, None, 2), ["0", "1200000", "1", "12000000"]);
        let w = Quota::fixed_window(ratelimit_core::Rate::per_minute(100)).unwrap();
        let r2 = Request::new(
            "rl",
            b"k",
            &[Charge::new(&w, 1), Charge::new(&q, 1)],
            Some(7),
        );
        let call = Call::batch(&[(&r, -5), (&r2, 9)]);
        assert!(std::ptr::eq(call.script, &*BATCH));
        assert_eq!(call.keys.len(), 3);
        // Minimum expiry, 3 fields per request, the earliest deadline (of
        // -5, that is 4, and 9), a key repeated (both requests charge the
        // token bucket of caller k), two quota sets (id, number of quotas,
        // 5 arguments per quota), then per request: now, deadline, set.
        assert_eq!(&call.args[..5], ["0", "3", "4", "0", "2"]);
        assert_eq!(&call.args[5..7], ["1", "1"]);
        let mut tb = Args::new();
        r.quota_args[0].push_batch(&mut tb);
        assert_eq!(call.args[7..12], tb[..]);
        // A bucket of 100 per minute: one token is 600,000 units, 1 unit a µs.
        assert_eq!(tb[..], ["4", "0", "1200000", "1", "12000000"]);
        assert_eq!(&call.args[12..14], ["2", "2"]);
        let mut both = Args::new();
        r2.quota_args.iter().for_each(|q| q.push_batch(&mut both));
        assert_eq!(call.args[14..24], both[..]);
        assert_eq!(&both[..5], ["1", "0", "1", "100", "60000000"]);
        assert_eq!(&call.args[24..], ["", "4", "1", "7", "9", "2"]);
        // Requests over the same quotas share one set; on one set and the
        // server's clock the deadlines go in one argument. A key that repeats
        // says so; a request without a deadline (0) is not the earliest.
        let r3 = Request::new("rl", b"other", &[Charge::new(&q, 2)], None);
        let call = Call::batch(&[(&r, 0), (&r3, 5), (&r, -8)]);
        assert_eq!(&call.args[..7], ["0", "1", "5", "0", "1", "1", "1"]);
        assert_eq!(call.args.len(), 5 + 2 + 5 + 1);
        assert_eq!(&call.args[12..], ["0 5 7"]);
        // No deadline at all: 0.
        let call = Call::batch(&[(&r, 0), (&r3, -1)]);
        assert_eq!(&call.args[2..4], ["0", "1"]);
        // On an injected clock, three fields again.
        let r4 = Request::new("rl", b"other", &[Charge::new(&q, 2)], Some(3));
        let call = Call::batch(&[(&r4, 0), (&r4, 4)]);
        assert_eq!(&call.args[..4], ["600000", "3", "4", "0"]);
        assert_eq!(&call.args[12..], ["3", "0", "1", "3", "4", "1"]);
    }

    /// A quota's own script is its algorithm's, verbatim, but for the line
    /// that reads the quota's numbers; one script per quota shape, and the
    /// algorithm's script once [`MAX_COMPILED`] are made.
    #[test]
    fn a_quotas_own_script_differs_from_its_algorithms_by_one_line() {
        use ratelimit_core::Rate;
        let tb = Quota::token_bucket(Rate::per_minute(100), 20).unwrap();
        let fw = Quota::fixed_window(Rate::per_minute(100)).unwrap();
        for (q, line) in [
            (&tb, "local x, y, z, c = ARGV[2] * 600000, 1, 12000000, 3\n"),
            (&fw, "local x, y, z, c = ARGV[2] + 0, 100, 60000000, 3\n"),
        ] {
            let (own, generic) = (single(q), for_quota(q));
            assert!(own.is_compiled() && !generic.is_compiled());
            assert_eq!(generic.lua().matches(ARGS_LINE).count(), 1);
            assert_eq!(own.lua(), generic.lua().replacen(ARGS_LINE, line, 1));
            assert_ne!(own.sha1(), generic.sha1());
            assert!(std::ptr::eq(own, single(q)), "made once per shape");
        }
        // Another capacity is another shape; a quota of the same numbers
        // under another name shares the script.
        let tb30 = Quota::token_bucket(Rate::per_minute(100), 30).unwrap();
        assert!(!std::ptr::eq(single(&tb), single(&tb30)));
        // Past the bound, the algorithm's script; shapes made before still
        // have theirs.
        let few = Compiled::new(2);
        let q = |n| Quota::fixed_window(Rate::per_second(n)).unwrap();
        let own = |n| few.get(&FIXED_WINDOW, &QuotaArgs::new(&q(n), 1, false));
        let (a, b) = (own(1), own(2));
        assert!(a.is_compiled() && b.is_compiled());
        assert!(std::ptr::eq(own(3), &*FIXED_WINDOW));
        assert!(std::ptr::eq(own(1), a));
    }

    #[test]
    fn repeated_keys_are_found_in_batches_of_every_size() {
        let k = |s: &str| s.to_owned();
        assert!(distinct(&[]));
        assert!(distinct(&[k("a")]));
        assert!(distinct(&[k("a"), k("b")]));
        assert!(!distinct(&[k("a"), k("a")]));
        let mut many: Vec<String> = (0..200).map(|i| format!("rl:{{c{i}}}:tb2")).collect();
        assert!(distinct(&many));
        many.push(many[117].clone());
        assert!(!distinct(&many));
    }
}
