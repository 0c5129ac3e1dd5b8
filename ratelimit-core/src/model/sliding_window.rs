use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::Window;

/// Sliding window counter state: the current calendar window and the cost
/// admitted in it and in the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlidingWindowState {
    /// `now / window` of the `curr` counter.
    pub window: u64,
    /// Cost admitted in window `window - 1`.
    pub prev: u64,
    /// Cost admitted in window `window`.
    pub curr: u64,
}

/// With `e = now - idx * W` the time into the current window, admitted iff
/// `prev * (W - e) + (curr + cost) * W <= limit * W` (the estimate
/// `prev * (W - e) / W + curr + cost <= limit`, multiplied out so it stays in
/// integers). Every product is at most `limit * W <= 2^53 - 1`.
///
/// The state is rolled into the current window lazily: a state of window
/// `idx - 1` is read as `(prev = curr, curr = 0)`, any other window as fresh.
/// A denial leaves the state as stored.
pub(super) fn step(
    w: &Window,
    state: Option<SlidingWindowState>,
    now: Micros,
    cost: u64,
) -> (Decision, SlidingWindowState, Micros) {
    let (limit, width) = (w.limit(), w.window_micros());
    let idx = now / width;
    let e = now - idx * width;
    let (prev, curr) = match &state {
        Some(s) if s.window == idx => (s.prev, s.curr),
        Some(s) if s.window + 1 == idx => (s.curr, 0),
        _ => (0, 0),
    };
    // Counters above the limit (the policy's limit was lowered under the same
    // name) count as the limit, so every product stays within limit * W.
    let (prev, mut curr) = (prev.min(limit), curr.min(limit));
    let weighted = prev * (width - e);
    let allowed = curr + cost <= limit && weighted <= (limit - curr - cost) * width;
    let mut retry = None;
    if allowed {
        curr += cost;
    } else if curr + cost <= limit {
        // Admissible later in this window, once the previous window's weight
        // has shrunk: the first e' with prev * (W - e') <= a * W. prev > 0 here.
        let a = limit - curr - cost;
        let first = width - (a * width) / prev;
        retry = Some(first - e);
    } else {
        // Only in the next window, where prev' = curr > 0 and curr' = 0: the
        // first e'' with curr * (W - e'') <= (limit - cost) * W.
        let first = width - ((limit - cost) * width) / curr;
        retry = Some(width - e + first);
    }
    let used = weighted + curr * width;
    let remaining = (limit * width).saturating_sub(used) / width;
    let reset = if curr > 0 {
        2 * width - e
    } else if prev > 0 {
        width - e
    } else {
        0
    };
    // A denial returns the stored state as it is, even when `now` is in a
    // later window: the roll into the new window is only ever computed on
    // read (above), so a store writes nothing for a denial, and a clock that
    // steps back into the stored window finds its counts again.
    let state = match state {
        Some(stored) if !allowed => stored,
        _ => SlidingWindowState {
            window: idx,
            prev,
            curr,
        },
    };
    (
        Decision::from_store(allowed, limit, remaining, reset, retry),
        state,
        reset,
    )
}
