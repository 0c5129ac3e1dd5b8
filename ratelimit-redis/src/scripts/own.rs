//! A quota's own script: its algorithm's single-quota script with the
//! quota's numbers compiled in as Lua constants, so that a call sends the
//! cost alone; made on first use, up to [`MAX_COMPILED`] a process.

use std::sync::{LazyLock, PoisonError, RwLock};

use ratelimit_core::{Micros, Quota};

use super::lua::{Script, for_quota};
use super::quota_args::{Args, QuotaArgs, push_now, texts};
use crate::arg::Arg;

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
pub(super) struct Compiled {
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
    pub(super) fn get(&self, generic: &'static Script, args: &QuotaArgs) -> &'static Script {
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

pub(super) static COMPILED: LazyLock<Compiled> = LazyLock::new(|| Compiled::new(MAX_COMPILED));

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

#[cfg(test)]
mod tests {
    use ratelimit_core::Quota;

    use super::*;
    use crate::scripts::FIXED_WINDOW;

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
}
