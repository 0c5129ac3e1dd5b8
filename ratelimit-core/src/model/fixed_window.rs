use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::Window;

/// Fixed window state: the calendar window index and the cost admitted in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FixedWindowState {
    /// `now / window`: which calendar window the count belongs to.
    pub window: u64,
    /// Cost admitted in that window.
    pub count: u64,
}

/// Admitted iff `count + cost <= limit` in the current calendar window
/// `[idx * W, (idx + 1) * W)`. A state from any other window is a fresh one.
pub(super) fn step(
    w: &Window,
    state: Option<FixedWindowState>,
    now: Micros,
    cost: u64,
) -> (Decision, FixedWindowState, Micros) {
    let (limit, width) = (w.limit(), w.window_micros());
    let idx = now / width;
    let mut count = match state {
        Some(s) if s.window == idx => s.count,
        _ => 0,
    };
    let until_end = (idx + 1) * width - now;
    let allowed = count + cost <= limit;
    if allowed {
        count += cost;
    }
    let decision = Decision::from_store(
        allowed,
        limit,
        limit.saturating_sub(count),
        until_end,
        (!allowed).then_some(until_end),
    );
    (decision, FixedWindowState { window: idx, count }, until_end)
}
