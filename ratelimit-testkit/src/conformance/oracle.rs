//! Brute-force checks over the log of calls. Deliberately independent of the
//! model's arithmetic: each rule is recomputed from the admitted calls alone.

use std::collections::HashMap;

use ratelimit_core::{Algorithm, Micros, Quota};

/// One call as the store answered it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome {
    pub(crate) t: Micros,
    pub(crate) key: usize,
    pub(crate) cost: u64,
    pub(crate) allowed: bool,
}

fn per_key(log: &[Outcome]) -> HashMap<usize, Vec<(usize, Outcome)>> {
    let mut m: HashMap<usize, Vec<(usize, Outcome)>> = HashMap::new();
    for (i, o) in log.iter().enumerate() {
        m.entry(o.key).or_default().push((i, *o));
    }
    m
}

/// Contract 2: admitted cost per calendar window <= L.
pub(crate) fn fixed_window(q: &Quota, log: &[Outcome]) -> Result<(), String> {
    let Algorithm::FixedWindow(w) = q.algorithm() else {
        return Ok(());
    };
    calendar_bound(w.limit(), w.window_micros(), log)
}

fn calendar_bound(limit: u64, width: u64, log: &[Outcome]) -> Result<(), String> {
    let mut sums: HashMap<(usize, u64), u64> = HashMap::new();
    for (i, o) in log.iter().enumerate().filter(|(_, o)| o.allowed) {
        let s = sums.entry((o.key, o.t / width)).or_default();
        *s += o.cost;
        if *s > limit {
            return Err(format!(
                "call #{i} (key {}) brought calendar window [{}, {}) to {} admitted, limit {limit}",
                o.key,
                (o.t / width) * width,
                (o.t / width + 1) * width,
                s
            ));
        }
    }
    Ok(())
}

/// Contract 3: admitted iff `prev * (W - elapsed) / W + curr + cost <= L`,
/// with `prev`/`curr` summed from the admitted log; per calendar window <= L.
pub(crate) fn sliding_window(q: &Quota, log: &[Outcome]) -> Result<(), String> {
    let Algorithm::SlidingWindow(w) = q.algorithm() else {
        return Ok(());
    };
    let (limit, width) = (u128::from(w.limit()), w.window_micros());
    for calls in per_key(log).values() {
        for (n, &(i, o)) in calls.iter().enumerate() {
            let idx = o.t / width;
            let elapsed = u128::from(o.t - idx * width);
            let (mut prev, mut curr) = (0u128, 0u128);
            for &(_, p) in calls[..n].iter().filter(|(_, p)| p.allowed) {
                if p.t / width == idx {
                    curr += u128::from(p.cost);
                } else if p.t / width + 1 == idx {
                    prev += u128::from(p.cost);
                }
            }
            let w128 = u128::from(width);
            let fits = prev * (w128 - elapsed) + (curr + u128::from(o.cost)) * w128 <= limit * w128;
            if fits != o.allowed {
                return Err(format!(
                    "call #{i} (key {}, cost {}) at {} µs into its window: prev {prev}, curr {curr}, \
                     limit {limit}, window {width} µs: the rule says {}, the store said {}",
                    o.key,
                    o.cost,
                    elapsed,
                    if fits { "admit" } else { "deny" },
                    if o.allowed { "admit" } else { "deny" }
                ));
            }
        }
    }
    calendar_bound(w.limit(), width, log)
}

/// Contract 4: admitted cost in every trailing window `(t - W, t]` <= L, and
/// a call is admitted whenever that sum + cost <= L.
pub(crate) fn sliding_log(q: &Quota, log: &[Outcome]) -> Result<(), String> {
    let Algorithm::SlidingLog(w) = q.algorithm() else {
        return Ok(());
    };
    let (limit, width) = (w.limit(), w.window_micros());
    for calls in per_key(log).values() {
        for (n, &(i, o)) in calls.iter().enumerate() {
            let in_window: u64 = calls[..n]
                .iter()
                .filter(|(_, p)| p.allowed && p.t + width > o.t && p.t <= o.t)
                .map(|(_, p)| p.cost)
                .sum();
            if o.allowed && in_window + o.cost > limit {
                return Err(format!(
                    "call #{i} (key {}, cost {}) admitted with {in_window} already admitted in the \
                     trailing window ({}, {}]: {} > limit {limit}",
                    o.key,
                    o.cost,
                    o.t.saturating_sub(width),
                    o.t,
                    in_window + o.cost
                ));
            }
            if !o.allowed && in_window + o.cost <= limit {
                return Err(format!(
                    "call #{i} (key {}, cost {}) denied with only {in_window} admitted in the \
                     trailing window: a false denial (limit {limit})",
                    o.key, o.cost
                ));
            }
        }
    }
    Ok(())
}

/// Contract 5: admitted cost in every span `[a, b]` <= capacity + rate·(b - a),
/// and a call is admitted whenever a bucket starting full has the tokens:
/// for every earlier admitted call at `a`, `admitted[a, t) + cost <=
/// capacity + rate·(t - a)` (the max-plus form of a token bucket).
pub(crate) fn token_bucket(q: &Quota, log: &[Outcome]) -> Result<(), String> {
    let Algorithm::TokenBucket(b) = q.algorithm() else {
        return Ok(());
    };
    let cap = u128::from(b.capacity());
    let n = u128::from(b.rate().count());
    let p = b.rate().period().as_micros();
    for calls in per_key(log).values() {
        let admitted: Vec<(usize, Outcome)> =
            calls.iter().copied().filter(|(_, o)| o.allowed).collect();
        // The span bound, over every pair of admitted calls.
        for (x, &(_, a)) in admitted.iter().enumerate() {
            let mut sum = 0u128;
            for &(j, bb) in &admitted[x..] {
                sum += u128::from(bb.cost);
                if sum * p > cap * p + n * u128::from(bb.t - a.t) {
                    return Err(format!(
                        "{sum} admitted in the span [{}, {}] (up to call #{j}, key {}): more than \
                         capacity {cap} + {n} per {p} µs × {} µs",
                        a.t,
                        bb.t,
                        bb.key,
                        bb.t - a.t
                    ));
                }
            }
        }
        // Admitted iff the tokens are there.
        for (m, &(i, o)) in calls.iter().enumerate() {
            let c = u128::from(o.cost);
            let mut has = c <= cap;
            for (k, &(_, a)) in calls[..m].iter().enumerate() {
                if !a.allowed {
                    continue;
                }
                let spent: u128 = calls[k..m]
                    .iter()
                    .filter(|(_, x)| x.allowed)
                    .map(|(_, x)| u128::from(x.cost))
                    .sum();
                if (spent + c) * p > cap * p + n * u128::from(o.t - a.t) {
                    has = false;
                    break;
                }
            }
            if has != o.allowed {
                return Err(format!(
                    "call #{i} (key {}, cost {}): a bucket of capacity {cap} refilled at {n} per \
                     {p} µs {} the tokens, but the store {}",
                    o.key,
                    o.cost,
                    if has { "has" } else { "does not have" },
                    if o.allowed { "admitted" } else { "denied" }
                ));
            }
        }
    }
    Ok(())
}
