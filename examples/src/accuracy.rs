//! The accuracy report: generated traffic replayed against the four
//! algorithms, each compared request for request with the exact sliding log.
//!
//! # Method
//!
//! - **Traffic** is generated from a seeded RNG (ChaCha8, portable across
//!   platforms) and is *open loop*: one list of arrivals per shape, replayed
//!   unchanged against every algorithm, so that every algorithm answers the
//!   same requests. (A retry wave is therefore the arrivals of clients whose
//!   requests failed upstream and who retry on a fixed backoff schedule, not
//!   a reaction to each algorithm's own denials: that would give each
//!   algorithm different traffic and no common reference.)
//! - **Decisions** come from the in-process store (`LocalStore::decide_now`)
//!   driven by a [`ManualClock`] set to each arrival's time: the core model,
//!   as every store computes it. Each caller has its own key; every request
//!   costs 1.
//! - **The reference** is the sliding log on the same quota (100 per minute)
//!   and the same arrivals: exact, at most 100 in every trailing minute, and
//!   no false denials.
//!
//! # Measures, per traffic shape and algorithm
//!
//! - **wrongly admitted**: requests the algorithm admitted although the
//!   caller already had 100 admissions in the trailing minute `(t - 60 s, t]`
//!   (so the exact sliding log, holding the same admissions, would have
//!   denied them); **wrongly denied**: requests it denied although fewer than
//!   100 were admitted in the trailing minute (the sliding log would have
//!   admitted them). Each decision is judged by the exact rule applied to the
//!   admissions the algorithm itself made before it: what the sliding log
//!   decides from the same state. Counts, and shares of all requests.
//! - **differs from the log**: requests on which the algorithm and a
//!   sliding log replaying the same arrivals decided differently. After a
//!   first disagreement the two hold different admissions, so this also
//!   counts the same admission made a little earlier or later by one than by
//!   the other (a phase shift, not an error of either).
//! - **most in a trailing 60 s**: the largest number of requests of one caller
//!   admitted in any window `(t - 60 s, t]`. The plan promises 100.
//! - **mean rate difference**: for every caller, at every whole second from
//!   the first arrival to one minute after the last, the number admitted in
//!   the trailing minute by the algorithm, `A(t)`, and by the replayed
//!   sliding log, `E(t)`; then `sum |A(t) - E(t)| / sum E(t)`: how far the
//!   admitted rate strays from the exact one, relative to the exact one.
//! - For the sliding window counter, also its **estimate error**: at each
//!   request, its estimate `prev * (W - elapsed) / W + curr` of what the
//!   caller already had admitted in the trailing minute, against the exact
//!   count of the same admissions; `sum |estimate - exact| / sum exact`. This
//!   is the quantity behind Cloudflare's published 6 % figure.

use std::collections::HashMap;
use std::fmt::Write as _;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ratelimit_core::{AlgorithmKind, ManualClock, Micros, Quota};
use ratelimit_local::LocalStore;

use crate::demo::{NOON, max_in_trailing};

/// The plan every algorithm enforces: 100 per minute.
pub const LIMIT: u64 = 100;
/// One minute, in µs.
pub const WINDOW: Micros = 60 * SEC;
/// The seed of the published report.
pub const SEED: u64 = 2017;

const MS: Micros = 1_000;
const SEC: Micros = 1_000_000;

/// One request: when (µs since the epoch) and from which caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// µs since the Unix epoch.
    pub at: Micros,
    /// The caller (one key per caller).
    pub caller: u32,
}

/// A traffic shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    /// One caller: 100 requests over 12:03:59.000-.099, 100 over 12:04:00.000-.099.
    BoundaryBurst,
    /// Cron jobs: each fires 40-90 requests (10 ms apart) at the top of every
    /// minute, started 0-1 s late (jitter varies minute to minute).
    Cron,
    /// Callers whose backlog of 150-250 requests failed upstream, all retried
    /// in step after 1, 2, 4, 8, 16 and 32 s.
    RetryWave,
    /// Independent Poisson callers at 10-80 % of the limit.
    PoissonUnder,
    /// Independent Poisson callers at 100-200 % of the limit.
    PoissonOver,
}

impl Shape {
    /// Every shape, in table order.
    pub const ALL: [Shape; 5] = [
        Self::BoundaryBurst,
        Self::Cron,
        Self::RetryWave,
        Self::PoissonUnder,
        Self::PoissonOver,
    ];

    /// The name shown in the table.
    pub fn name(self) -> &'static str {
        match self {
            Self::BoundaryBurst => "boundary burst",
            Self::Cron => "cron at :00",
            Self::RetryWave => "retry waves",
            Self::PoissonUnder => "Poisson, under",
            Self::PoissonOver => "Poisson, over",
        }
    }

    fn index(self) -> u64 {
        Self::ALL.iter().position(|&s| s == self).unwrap_or(0) as u64
    }
}

/// How much traffic: the published run, or a short one for the test suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Length {
    /// 3 minutes, a tenth of the callers.
    Short,
    /// 10 minutes: 50 cron jobs, 20 retrying callers, 200 Poisson callers
    /// under the limit and 100 over it.
    Full,
}

impl Length {
    /// Minutes of traffic.
    pub fn minutes(self) -> u64 {
        match self {
            Self::Short => 3,
            Self::Full => 10,
        }
    }

    /// Callers of a shape.
    pub fn callers(self, shape: Shape) -> u32 {
        let full = match shape {
            Shape::BoundaryBurst => return 1,
            Shape::Cron => 50,
            Shape::RetryWave => 20,
            Shape::PoissonUnder => 200,
            Shape::PoissonOver => 100,
        };
        match self {
            Self::Short => full / 10,
            Self::Full => full,
        }
    }
}

/// The arrivals of one shape, sorted by time (then caller).
pub fn traffic(shape: Shape, length: Length, seed: u64) -> Vec<Arrival> {
    let mut rng =
        ChaCha8Rng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(shape.index()));
    let span = length.minutes() * WINDOW;
    let mut out = Vec::new();
    let mut push = |at: Micros, caller: u32| out.push(Arrival { at, caller });
    match shape {
        Shape::BoundaryBurst => {
            for i in 0..100 {
                push(NOON + 3 * WINDOW + 59 * SEC + i * MS, 0);
            }
            for i in 0..100 {
                push(NOON + 4 * WINDOW + i * MS, 0);
            }
        }
        Shape::Cron => {
            for job in 0..length.callers(shape) {
                let size = rng.random_range(40..=90u64);
                for minute in 0..length.minutes() {
                    let late = rng.random_range(0..SEC);
                    for i in 0..size {
                        push(NOON + minute * WINDOW + late + i * 10 * MS, job);
                    }
                }
            }
        }
        Shape::RetryWave => {
            for caller in 0..length.callers(shape) {
                let backlog = rng.random_range(150..=250u64);
                let start = NOON + rng.random_range(0..span - 64 * SEC);
                for delay in [0, 1, 2, 4, 8, 16, 32] {
                    for i in 0..backlog {
                        push(start + delay * SEC + i * 400, caller);
                    }
                }
            }
        }
        Shape::PoissonUnder | Shape::PoissonOver => {
            let (low, high) = if shape == Shape::PoissonUnder {
                (0.1, 0.8)
            } else {
                (1.0, 2.0)
            };
            for caller in 0..length.callers(shape) {
                let per_minute = LIMIT as f64 * rng.random_range(low..high);
                let mean_gap = WINDOW as f64 / per_minute;
                let mut t = 0.0f64;
                loop {
                    // Exponential gaps: 1 - u is in (0, 1], so ln is finite.
                    let u: f64 = rng.random();
                    t += -(1.0 - u).ln() * mean_gap;
                    if t >= span as f64 {
                        break;
                    }
                    push(NOON + t as Micros, caller);
                }
            }
        }
    }
    out.sort_by_key(|a| (a.at, a.caller));
    out
}

/// The four algorithms as configured for the report: 100 per minute (the
/// token bucket as the plan is sold, 100 per minute with a burst of 20).
pub fn quotas() -> Vec<Quota> {
    crate::demo::quotas()
}

/// A short label for an algorithm as configured.
pub fn label(quota: &Quota) -> String {
    match quota.kind() {
        AlgorithmKind::TokenBucket => "token bucket (burst 20)".to_owned(),
        kind => kind.to_string(),
    }
}

/// Each arrival's decision under `quota`, from a fresh in-process store
/// whose clock is set to each arrival's time.
pub fn replay(arrivals: &[Arrival], quota: &Quota) -> Vec<bool> {
    let clock = ManualClock::new(arrivals.first().map_or(NOON, |a| a.at));
    let store = LocalStore::with_clock(clock.clone());
    let mut keys: HashMap<u32, Vec<u8>> = HashMap::new();
    arrivals
        .iter()
        .map(|a| {
            clock.set(a.at);
            let key = keys
                .entry(a.caller)
                .or_insert_with(|| format!("caller-{}", a.caller).into_bytes());
            store
                .decide_now(key, quota, 1)
                .expect("a cost of 1 is within every quota")
                .allowed
        })
        .collect()
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The traffic shape.
    pub shape: Shape,
    /// The algorithm.
    pub kind: AlgorithmKind,
    /// Its label.
    pub algorithm: String,
    /// Requests sent.
    pub requests: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// Admitted although the caller's own admissions in the trailing minute
    /// had already reached the limit.
    pub wrongly_admitted: u64,
    /// Denied although the caller's own admissions in the trailing minute
    /// were below the limit.
    pub wrongly_denied: u64,
    /// Decided differently from a sliding log replaying the same arrivals.
    pub differs: u64,
    /// The most requests of one caller admitted in any trailing minute.
    pub max_trailing: u64,
    /// `sum |A(t) - E(t)| / sum E(t)` over callers and whole seconds.
    pub mean_rate_difference: f64,
}

/// Admission times per caller.
fn admitted_by_caller(arrivals: &[Arrival], decisions: &[bool]) -> HashMap<u32, Vec<Micros>> {
    let mut by: HashMap<u32, Vec<Micros>> = HashMap::new();
    for (a, &ok) in arrivals.iter().zip(decisions) {
        let times = by.entry(a.caller).or_default();
        if ok {
            times.push(a.at);
        }
    }
    by
}

/// Number of `times` (sorted) in `(t - WINDOW, t]`.
fn in_trailing(times: &[Micros], t: Micros) -> u64 {
    let hi = times.partition_point(|&x| x <= t);
    let lo = times.partition_point(|&x| x + WINDOW <= t);
    (hi - lo) as u64
}

/// Compares one algorithm's decisions with the exact sliding log's.
pub fn measure(
    shape: Shape,
    quota: &Quota,
    arrivals: &[Arrival],
    decisions: &[bool],
    exact: &[bool],
) -> Row {
    let mut row = Row {
        shape,
        kind: quota.kind(),
        algorithm: label(quota),
        requests: arrivals.len() as u64,
        admitted: 0,
        wrongly_admitted: 0,
        wrongly_denied: 0,
        differs: 0,
        max_trailing: 0,
        mean_rate_difference: 0.0,
    };
    let mut own: HashMap<u32, Vec<Micros>> = HashMap::new();
    for ((a, &got), &want) in arrivals.iter().zip(decisions).zip(exact) {
        let times = own.entry(a.caller).or_default();
        // What the exact sliding log decides from the same admissions.
        let exact_rule = in_trailing(times, a.at) < LIMIT;
        row.admitted += u64::from(got);
        row.wrongly_admitted += u64::from(got && !exact_rule);
        row.wrongly_denied += u64::from(!got && exact_rule);
        row.differs += u64::from(got != want);
        if got {
            times.push(a.at);
        }
    }
    let ours = admitted_by_caller(arrivals, decisions);
    let reference = admitted_by_caller(arrivals, exact);
    row.max_trailing = ours
        .values()
        .map(|times| max_in_trailing(times, WINDOW).0)
        .max()
        .unwrap_or(0);
    if let (Some(first), Some(last)) = (arrivals.first(), arrivals.last()) {
        let (mut diff, mut base) = (0u64, 0u64);
        for (caller, times) in &ours {
            let exact_times = &reference[caller];
            let mut t = first.at;
            while t <= last.at + WINDOW {
                let (a, e) = (in_trailing(times, t), in_trailing(exact_times, t));
                diff += a.abs_diff(e);
                base += e;
                t += SEC;
            }
        }
        if base > 0 {
            row.mean_rate_difference = diff as f64 / base as f64;
        }
    }
    row
}

/// The sliding window counter's estimate error on its own admissions (see
/// the module docs), as a fraction.
pub fn estimate_error(arrivals: &[Arrival], decisions: &[bool]) -> f64 {
    let mut admitted: HashMap<u32, Vec<Micros>> = HashMap::new();
    let (mut diff, mut base) = (0.0f64, 0.0f64);
    for (a, &ok) in arrivals.iter().zip(decisions) {
        let times = admitted.entry(a.caller).or_default();
        let start = a.at - a.at % WINDOW;
        let elapsed = a.at - start;
        let count_from = |from: Micros| times.len() - times.partition_point(|&x| x < from);
        let curr = count_from(start);
        let prev = count_from(start.saturating_sub(WINDOW)) - curr;
        let estimate = prev as f64 * (WINDOW - elapsed) as f64 / WINDOW as f64 + curr as f64;
        let exact = in_trailing(times, a.at) as f64;
        diff += (estimate - exact).abs();
        base += exact;
        if ok {
            times.push(a.at);
        }
    }
    if base > 0.0 { diff / base } else { 0.0 }
}

/// The whole report.
#[derive(Debug, Clone)]
pub struct Report {
    /// The length it was run at.
    pub length: Length,
    /// The seed.
    pub seed: u64,
    /// One row per shape and algorithm, shapes in [`Shape::ALL`] order.
    pub rows: Vec<Row>,
    /// Per shape, the sliding window counter's estimate error.
    pub estimate_errors: Vec<(Shape, f64)>,
}

/// Runs every shape against every algorithm.
pub fn run(length: Length, seed: u64) -> Report {
    let quotas = quotas();
    let exact_quota = quotas
        .iter()
        .find(|q| q.kind() == AlgorithmKind::SlidingLog)
        .expect("the sliding log is among the quotas")
        .clone();
    let mut rows = Vec::new();
    let mut estimate_errors = Vec::new();
    for shape in Shape::ALL {
        let arrivals = traffic(shape, length, seed);
        let exact = replay(&arrivals, &exact_quota);
        for quota in &quotas {
            let decisions = if quota == &exact_quota {
                exact.clone()
            } else {
                replay(&arrivals, quota)
            };
            if quota.kind() == AlgorithmKind::SlidingWindow {
                estimate_errors.push((shape, estimate_error(&arrivals, &decisions)));
            }
            rows.push(measure(shape, quota, &arrivals, &decisions, &exact));
        }
    }
    Report {
        length,
        seed,
        rows,
        estimate_errors,
    }
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0".into();
    }
    format!("{part} ({:.3} %)", part as f64 * 100.0 / whole as f64)
}

/// The report as markdown: the table, the totals, and the sliding window
/// counter's estimate error.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Plan: {LIMIT} requests per minute per caller; the reference is the exact sliding log. \
         {} minutes of traffic per shape, seed {}.\n",
        report.length.minutes(),
        report.seed
    );
    out.push_str(
        "| traffic | algorithm | requests | admitted | wrongly admitted | wrongly denied | differs from the log | most in a trailing 60 s | mean rate difference |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for r in &report.rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} % |",
            r.shape.name(),
            r.algorithm,
            r.requests,
            r.admitted,
            percent(r.wrongly_admitted, r.requests),
            percent(r.wrongly_denied, r.requests),
            percent(r.differs, r.requests),
            r.max_trailing,
            r.mean_rate_difference * 100.0
        );
    }
    out.push_str(
        "\nAll shapes together:\n\n\
         | algorithm | requests | wrongly admitted or denied | most in a trailing 60 s |\n\
         |---|--:|--:|--:|\n",
    );
    let mut kinds: Vec<(AlgorithmKind, String)> = Vec::new();
    for r in &report.rows {
        if !kinds.iter().any(|(k, _)| *k == r.kind) {
            kinds.push((r.kind, r.algorithm.clone()));
        }
    }
    for (kind, name) in kinds {
        let rows = report.rows.iter().filter(|r| r.kind == kind);
        let (requests, wrong, most) = rows.fold((0, 0, 0), |(n, w, m), r| {
            (
                n + r.requests,
                w + r.wrongly_admitted + r.wrongly_denied,
                m.max(r.max_trailing),
            )
        });
        let _ = writeln!(
            out,
            "| {name} | {requests} | {} | {most} |",
            percent(wrong, requests)
        );
    }
    out.push_str(
        "\nThe sliding window counter's estimate of a caller's trailing-minute count, against the exact count \
         of the same admissions (mean |estimate - exact| / mean exact, at every request):\n\n\
         | traffic | estimate error |\n|---|--:|\n",
    );
    for (shape, e) in &report.estimate_errors {
        let _ = writeln!(out, "| {} | {:.1} % |", shape.name(), e * 100.0);
    }
    out
}

/// A row of `report` by shape and algorithm.
pub fn row(report: &Report, shape: Shape, kind: AlgorithmKind) -> Option<&Row> {
    report
        .rows
        .iter()
        .find(|r| r.shape == shape && r.kind == kind)
}

/// What one algorithm did with the boundary burst, for the picture:
/// arrivals, decisions and the quota.
pub fn boundary_burst() -> Vec<(Quota, Vec<Arrival>, Vec<bool>)> {
    let arrivals = traffic(Shape::BoundaryBurst, Length::Short, SEED);
    quotas()
        .into_iter()
        .map(|q| {
            let d = replay(&arrivals, &q);
            (q, arrivals.clone(), d)
        })
        .collect()
}
