//! A quota's script arguments: kept as numbers until a call is built,
//! then sent as a single-quota script or the batch script takes them.

use ratelimit_core::{Algorithm, Micros, Quota};
use smallvec::SmallVec;

use super::lua::{INJECTED_CLOCK_MIN_EXPIRY, Script};
use crate::arg::Arg;

/// With an injected clock: now and the minimum expiry, after the quota's
/// numbers (`ARGV[5..=6]`) or after the cost in a quota's own script.
pub(super) fn push_now(args: &mut Args, now: Option<Micros>) {
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
pub(super) fn texts(args: &[Arg]) -> Vec<String> {
    args.iter().map(Arg::to_string).collect()
}

/// The algorithm code of the batch script (see the module docs).
pub(super) fn kind(quota: &Quota) -> &'static str {
    match quota.algorithm() {
        Algorithm::FixedWindow(_) => "1",
        Algorithm::SlidingWindow(_) => "2",
        Algorithm::SlidingLog(_) => "3",
        Algorithm::TokenBucket(_) => TOKEN_BUCKET_KIND,
    }
}

/// The token bucket's algorithm code in the batch script.
pub(super) const TOKEN_BUCKET_KIND: &str = "4";

/// One quota of a request as its script arguments, kept as numbers until a
/// call is built (a batch formats each distinct quota set once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct QuotaArgs {
    /// The batch script's algorithm code (see [`kind`]).
    pub(super) kind: &'static str,
    pub(super) shadow: bool,
    /// The cost.
    pub(super) cost: u64,
    /// Bucket units per token (1 for a window).
    pub(super) unit: u64,
    /// The single script's `ARGV[3..=4]` (`ARGV[2]` is `x`: the cost, times
    /// the unit).
    pub(super) y: u64,
    pub(super) z: u64,
}

impl QuotaArgs {
    pub(super) fn new(quota: &Quota, cost: u64, shadow: bool) -> Self {
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
    pub(super) fn push_values(&self, args: &mut Args) {
        args.push(Arg::from(self.cost * self.unit));
        args.push(Arg::from(self.y));
        args.push(Arg::from(self.z));
    }

    /// What `script` (this quota's own, or its algorithm's) takes after the
    /// deadline: the cost alone, or [`QuotaArgs::push_values`].
    pub(super) fn push_single(&self, script: &Script, args: &mut Args) {
        if script.compiled {
            args.push(Arg::from(self.cost));
        } else {
            self.push_values(args);
        }
    }

    /// The batch script's five arguments of this quota.
    pub(super) fn push_batch(&self, args: &mut Args) {
        args.push(Arg::Static(self.kind));
        args.push(Arg::Int(i64::from(self.shadow)));
        self.push_values(args);
    }
}
