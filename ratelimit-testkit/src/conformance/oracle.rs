//! Brute-force checks over the log of calls. Deliberately independent of the
//! model's arithmetic: each rule is recomputed from the admitted calls alone.
//!
//! These checks assume a clock that only moves forward (the generators that
//! feed them never step it back): what a stepped-back clock does is the
//! model's documented semantics, checked call for call by contract 1.

use std::collections::HashMap;

use ratelimit_core::{Algorithm, Micros, Quota};

/// One call as the store answered it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome {
    pub(crate) t: Micros,
    pub(crate) key: usize,
    pub(crate) policy: usize,
    pub(crate) cost: u64,
    /// Whether the quota (this call's policy) admits the call.
    pub(crate) allowed: bool,
    /// Whether the call was counted: admitted under this quota and, with
    /// several quotas, under every enforced one. Equal to `allowed` for a
    /// single quota.
    pub(crate) counted: bool,
}

/// The calls of each (key, policy), in order, with their index in the log.
fn per_caller(log: &[Outcome]) -> HashMap<(usize, usize), Vec<(usize, Outcome)>> {
    let mut m: HashMap<(usize, usize), Vec<(usize, Outcome)>> = HashMap::new();
    for (i, o) in log.iter().enumerate() {
        m.entry((o.key, o.policy)).or_default().push((i, *o));
    }
    m
}

fn who(i: usize, o: &Outcome) -> String {
    format!(
        "call #{i} (key {}, policy {}, cost {})",
        o.key, o.policy, o.cost
    )
}

/// Contract 2: admitted cost per calendar window <= L, and a call is
/// admitted whenever its window's admitted cost + cost <= L.
pub(crate) fn fixed_window(policies: &[Quota], log: &[Outcome]) -> Result<(), String> {
    for ((_, p), calls) in per_caller(log) {
        let Algorithm::FixedWindow(w) = policies[p].algorithm() else {
            continue;
        };
        let (limit, width) = (w.limit(), w.window_micros());
        let mut sums: HashMap<u64, u64> = HashMap::new();
        for (i, o) in calls {
            let s = sums.entry(o.t / width).or_default();
            let fits = *s + o.cost <= limit;
            if fits != o.allowed {
                let start = (o.t / width) * width;
                return Err(format!(
                    "{} in calendar window [{start}, {}) with {s} already admitted, limit {limit}: \
                     {}",
                    who(i, &o),
                    start + width,
                    if o.allowed {
                        "admitted beyond the limit"
                    } else {
                        "denied although it fits (a false denial)"
                    }
                ));
            }
            if o.counted {
                *s += o.cost;
            }
        }
    }
    Ok(())
}

/// Contract 3: admitted iff `prev * (W - elapsed) / W + curr + cost <= L`,
/// with `prev`/`curr` summed from the admitted log; per calendar window <= L.
pub(crate) fn sliding_window(policies: &[Quota], log: &[Outcome]) -> Result<(), String> {
    for ((_, p), calls) in per_caller(log) {
        let Algorithm::SlidingWindow(w) = policies[p].algorithm() else {
            continue;
        };
        let (limit, width) = (u128::from(w.limit()), w.window_micros());
        let mut sums: HashMap<u64, u128> = HashMap::new();
        for (i, o) in calls {
            let idx = o.t / width;
            let elapsed = u128::from(o.t - idx * width);
            let prev = idx
                .checked_sub(1)
                .and_then(|p| sums.get(&p))
                .copied()
                .unwrap_or(0);
            let curr = sums.get(&idx).copied().unwrap_or(0);
            let w128 = u128::from(width);
            let fits = prev * (w128 - elapsed) + (curr + u128::from(o.cost)) * w128 <= limit * w128;
            if fits != o.allowed {
                return Err(format!(
                    "{} at {elapsed} µs into its window: prev {prev}, curr {curr}, limit {limit}, \
                     window {width} µs: the rule says {}, the store said {}",
                    who(i, &o),
                    if fits { "admit" } else { "deny" },
                    if o.allowed { "admit" } else { "deny" }
                ));
            }
            if o.counted {
                *sums.entry(idx).or_default() += u128::from(o.cost);
                if sums[&idx] > limit {
                    return Err(format!(
                        "{} brought its calendar window to {} admitted, limit {limit}",
                        who(i, &o),
                        sums[&idx]
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Contract 4: admitted cost in every trailing window `(t - W, t]` <= L, and
/// a call is admitted whenever that sum + cost <= L.
pub(crate) fn sliding_log(policies: &[Quota], log: &[Outcome]) -> Result<(), String> {
    for ((_, p), calls) in per_caller(log) {
        let Algorithm::SlidingLog(w) = policies[p].algorithm() else {
            continue;
        };
        let (limit, width) = (w.limit(), w.window_micros());
        // Admitted calls so far, oldest first; `from` skips those that have
        // left every later trailing window (times only move forward here).
        let mut admitted: Vec<(Micros, u64)> = Vec::new();
        let mut from = 0;
        let mut in_window: u64 = 0;
        for (i, o) in calls {
            while from < admitted.len() && admitted[from].0 + width <= o.t {
                in_window -= admitted[from].1;
                from += 1;
            }
            if o.allowed && in_window + o.cost > limit {
                return Err(format!(
                    "{} admitted with {in_window} already admitted in the trailing window \
                     ({}, {}]: {} > limit {limit}",
                    who(i, &o),
                    o.t.saturating_sub(width),
                    o.t,
                    in_window + o.cost
                ));
            }
            if !o.allowed && in_window + o.cost <= limit {
                return Err(format!(
                    "{} denied with only {in_window} admitted in the trailing window ({}, {}]: a \
                     false denial (limit {limit})",
                    who(i, &o),
                    o.t.saturating_sub(width),
                    o.t,
                ));
            }
            if o.counted {
                admitted.push((o.t, o.cost));
                in_window += o.cost;
            }
        }
    }
    Ok(())
}

/// Contract 5: admitted cost in every span `[a, b]` <= capacity + rate·(b - a),
/// and a call is admitted whenever a bucket starting full has the tokens:
/// for every earlier admitted call at `a`, `admitted[a, t) + cost <=
/// capacity + rate·(t - a)` (the max-plus form of a token bucket).
pub(crate) fn token_bucket(policies: &[Quota], log: &[Outcome]) -> Result<(), String> {
    for ((_, p), calls) in per_caller(log) {
        let Algorithm::TokenBucket(b) = policies[p].algorithm() else {
            continue;
        };
        let cap = u128::from(b.capacity());
        let n = u128::from(b.rate().count());
        let per = b.rate().period().as_micros();
        let admitted: Vec<(usize, Outcome)> =
            calls.iter().copied().filter(|(_, o)| o.counted).collect();
        // The span bound, over every pair of admitted calls.
        for (x, &(_, a)) in admitted.iter().enumerate() {
            let mut sum = 0u128;
            for &(j, bb) in &admitted[x..] {
                sum += u128::from(bb.cost);
                if sum * per > cap * per + n * u128::from(bb.t - a.t) {
                    return Err(format!(
                        "{sum} admitted in the span [{}, {}] (up to call #{j}, key {}, policy {}): \
                         more than capacity {cap} + {n} per {per} µs × {} µs",
                        a.t,
                        bb.t,
                        bb.key,
                        bb.policy,
                        bb.t - a.t
                    ));
                }
            }
        }
        // Admitted iff the tokens are there: walking back from each call,
        // `spent` is the cost admitted since the earlier admitted call `a`.
        for (m, &(i, o)) in calls.iter().enumerate() {
            let c = u128::from(o.cost);
            let mut has = c <= cap;
            let mut spent = 0u128;
            for &(_, a) in calls[..m].iter().rev() {
                if !a.counted {
                    continue;
                }
                spent += u128::from(a.cost);
                if (spent + c) * per > cap * per + n * u128::from(o.t - a.t) {
                    has = false;
                    break;
                }
            }
            if has != o.allowed {
                return Err(format!(
                    "{}: a bucket of capacity {cap} refilled at {n} per {per} µs {} the tokens, \
                     but the store {}",
                    who(i, &o),
                    if has { "has" } else { "does not have" },
                    if o.allowed { "admitted" } else { "denied" }
                ));
            }
        }
    }
    Ok(())
}
