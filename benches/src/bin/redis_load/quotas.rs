//! The quotas each section measures under (`--deny` or not, memory).

use ratelimit_core::{AlgorithmKind, Quota, Rate};

/// Which quotas a section uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Throughput, default: every call admitted and every caller's state
    /// kept between its calls, so every script reads existing state and
    /// writes, ours and the naive ones alike. Windows: 1000 per second (a
    /// caller is visited every ~0.1-0.3 s, within the window's life). Token
    /// buckets: 1 per second, burst 1,000,000 (a bucket that is never full
    /// again during the run, so its key never expires; no caller gets near
    /// a million calls).
    Admit,
    /// Throughput with `--deny`: the sold plan, 100 per minute (token
    /// bucket burst 20): after its first calls almost every call is denied.
    Deny,
    /// Memory: 100 per hour (token bucket burst 20), so no key expires while
    /// it is counted.
    Memory,
}

#[derive(Debug, Clone)]
pub(crate) struct Quotas {
    pub(crate) mode: Mode,
}

impl Quotas {
    pub(crate) fn ours(&self, kind: AlgorithmKind) -> Quota {
        let (window_rate, tb_rate, burst) = match self.mode {
            Mode::Admit => (Rate::per_second(1000), Rate::per_second(1), 1_000_000),
            Mode::Deny => (Rate::per_minute(100), Rate::per_minute(100), 20),
            Mode::Memory => (Rate::per_hour(100), Rate::per_hour(100), 20),
        };
        match kind {
            AlgorithmKind::FixedWindow => Quota::fixed_window(window_rate),
            AlgorithmKind::SlidingWindow => Quota::sliding_window(window_rate),
            AlgorithmKind::SlidingLog => Quota::sliding_log(window_rate),
            _ => Quota::token_bucket(tb_rate, burst),
        }
        .expect("valid quota")
    }

    /// ARGV of the naive token bucket (rate per second, capacity, cost):
    /// the same rate and burst as ours.
    pub(crate) fn naive_tb_args(&self) -> Vec<String> {
        let (rate, cap) = match self.mode {
            Mode::Admit => (1.0, 1_000_000),
            Mode::Deny => (100.0 / 60.0, 20),
            Mode::Memory => (100.0 / 3600.0, 20),
        };
        vec![format!("{rate}"), cap.to_string(), "1".into()]
    }

    /// ARGV of the naive fixed window (limit, window in seconds): the same
    /// limit and window as ours.
    pub(crate) fn naive_fw_args(&self) -> Vec<String> {
        let (limit, secs) = match self.mode {
            Mode::Admit => (1000, 1),
            Mode::Deny => (100, 60),
            Mode::Memory => (100, 3600),
        };
        vec![limit.to_string(), secs.to_string()]
    }

    pub(crate) fn describe(&self) -> &'static str {
        match self.mode {
            Mode::Admit => {
                "every call admitted, state kept: windows 1000/s; token buckets 1/s burst 1,000,000"
            }
            Mode::Deny => "the plan, 100/min (token bucket burst 20): most calls denied",
            Mode::Memory => "100/hour (token bucket burst 20)",
        }
    }
}

pub(crate) fn algo_name(kind: AlgorithmKind) -> &'static str {
    match kind {
        AlgorithmKind::FixedWindow => "fixed_window",
        AlgorithmKind::SlidingWindow => "sliding_window",
        AlgorithmKind::SlidingLog => "sliding_log",
        _ => "token_bucket",
    }
}

pub(crate) const ALGORITHMS: [AlgorithmKind; 4] = [
    AlgorithmKind::FixedWindow,
    AlgorithmKind::SlidingWindow,
    AlgorithmKind::SlidingLog,
    AlgorithmKind::TokenBucket,
];
