//! The scripts: each assembled at compile time from the algorithms' parts
//! in `parts/` (see the module docs of [`crate::scripts`]), and which one
//! a quota's algorithm takes.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ratelimit_core::{Algorithm, Quota};

use crate::arg::Arg;

/// How long keys are kept, at least, when the store uses an injected clock.
///
/// Redis expires keys by its own clock, while an injected clock (a test's
/// `ManualClock`, a replay) may stand still or crawl: a key expired by real
/// time could vanish while the injected time says its state still counts.
/// Keeping it longer is always safe (the model treats an old state as a
/// fresh one), so with an injected clock the expiry is at least this long.
pub const INJECTED_CLOCK_MIN_EXPIRY: Duration = Duration::from_secs(600);

/// One of the Lua scripts: the four single-quota ones, [`BATCH`], and a
/// quota's own single script (see [`crate::scripts::single`]).
#[derive(Debug)]
pub struct Script {
    pub(super) name: &'static str,
    pub(super) lua: &'static str,
    pub(super) redis: redis::Script,
    /// A quota's own script: its numbers are compiled in, and `ARGV[2]` is
    /// the cost alone.
    pub(super) compiled: bool,
    /// Whether a call with this script has succeeded in this process.
    pub(super) loaded: AtomicBool,
}

impl Script {
    pub(super) fn new(name: &'static str, lua: &'static str) -> Self {
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
    /// [`crate::scripts::single`]).
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
            include_str!("parts/single_head.lua"),
            $read,
            include_str!(concat!("parts/", $part)),
            include_str!("parts/single_write.lua"),
            include_str!(concat!("parts/", $write)),
            $admitted,
            include_str!("parts/single_tail.lua"),
        )
    };
}

/// The algorithms' parts, by file name: the text every script holds.
pub const PARTS: [(&str, &str); 6] = [
    ("fixed_window.lua", include_str!("parts/fixed_window.lua")),
    (
        "sliding_window.lua",
        include_str!("parts/sliding_window.lua"),
    ),
    ("sliding_log.lua", include_str!("parts/sliding_log.lua")),
    ("token_bucket.lua", include_str!("parts/token_bucket.lua")),
    ("set_write.lua", include_str!("parts/set_write.lua")),
    (
        "sliding_log_write.lua",
        include_str!("parts/sliding_log_write.lua"),
    ),
];

const BATCH_LUA: &str = concat!(
    include_str!("parts/batch_head.lua"),
    include_str!("parts/token_bucket.lua"),
    "    elseif kind == '1' then\n",
    include_str!("parts/fixed_window.lua"),
    "    elseif kind == '2' then\n",
    include_str!("parts/sliding_window.lua"),
    "    else\n",
    include_str!("parts/sliding_log.lua"),
    include_str!("parts/batch_mid.lua"),
    include_str!("parts/sliding_log_write.lua"),
    include_str!("parts/batch_tail.lua"),
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

/// The script for `quota`'s algorithm, which takes the quota's numbers as
/// arguments (see [`crate::scripts::single`] for the script a lone request is sent with).
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
}
