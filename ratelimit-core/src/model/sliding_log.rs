use std::collections::VecDeque;

use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::Window;

/// Sliding log state: admitted calls as `(time, cost)`, oldest first, calls at
/// the same microsecond merged into one entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlidingLogState {
    /// `(time in µs, cost)` in ascending time order, one entry per time.
    pub entries: VecDeque<(Micros, u64)>,
}

/// Entries at `t <= now - W` have left the trailing window `(now - W, now]`.
/// A log holding more than the limit (the policy's limit was lowered under
/// the same name) denies until enough entries leave; `remaining` is then 0.
/// Admitted iff the cost of the remaining entries plus `cost` is at most the
/// limit. Entries later than `now` (a clock that went back) still count.
///
/// An admission drops the entries that have left the window and records the
/// call; a denial returns the stored log as it is (entries that have left
/// the window are dropped by the next admission), so a store writes nothing.
pub(super) fn step(
    w: &Window,
    state: Option<SlidingLogState>,
    now: Micros,
    cost: u64,
) -> (Decision, SlidingLogState, Micros) {
    let (limit, width) = (w.limit(), w.window_micros());
    let mut s = state.unwrap_or_default();
    let gone = s.entries.partition_point(|&(t, _)| t + width <= now);
    let total: u64 = s.entries.iter().skip(gone).map(|&(_, c)| c).sum();
    let allowed = total + cost <= limit;
    let mut retry = None;
    if allowed {
        s.entries.drain(..gone);
        // Insert keeping time order; merge with an entry at the same time.
        let pos = s.entries.partition_point(|&(t, _)| t < now);
        match s.entries.get_mut(pos) {
            Some((t, c)) if *t == now => *c += cost,
            _ => s.entries.insert(pos, (now, cost)),
        }
    } else {
        // Oldest first: wait until enough entries have left the window.
        let mut left = total;
        for &(t, c) in s.entries.iter().skip(gone) {
            left -= c;
            if left + cost <= limit {
                retry = Some(t + width - now);
                break;
            }
        }
    }
    let used = if allowed { total + cost } else { total };
    let reset = s
        .entries
        .back()
        .map_or(0, |&(t, _)| (t + width).saturating_sub(now));
    (
        Decision::from_store(allowed, limit, limit.saturating_sub(used), reset, retry),
        s,
        reset,
    )
}
