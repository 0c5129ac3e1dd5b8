//! The process-wide guard on store-failure warnings: at most one a second,
//! whatever the number of limiters, with a count of those left unlogged.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// At most one warning per `every` µs, and how many were left unlogged.
#[derive(Debug)]
struct Guard {
    /// When the last warning was logged (µs, plus one; 0: never).
    last: AtomicU64,
    /// Failures not logged since the last warning.
    suppressed: AtomicU64,
    every: u64,
}

impl Guard {
    const fn new(every: u64) -> Self {
        Self {
            last: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            every,
        }
    }

    /// At `now` (µs): `Some(n)` if a warning may be logged, `n` the
    /// failures left unlogged since the last one; else `None`, and this
    /// failure is counted as unlogged.
    fn may_warn(&self, now: u64) -> Option<u64> {
        let now = now.saturating_add(1);
        let last = self.last.load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= self.every)
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// The process's guard: one warning a second.
static GUARD: Guard = Guard::new(1_000_000);

/// Whether a store failure may be logged as a warning now: `Some(n)`, with
/// the `n` failures left unlogged since the last warning, at most once a
/// second in the process; `None` (the failure counted as unlogged)
/// otherwise. Timed by a monotonic clock of its own: limiters may run on
/// injected clocks.
pub(super) fn may_warn() -> Option<u64> {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    GUARD.may_warn(u64::try_from(base.elapsed().as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_a_second_with_the_count_of_the_rest() {
        let g = Guard::new(1_000_000);
        assert_eq!(g.may_warn(0), Some(0));
        for t in 1..=100 {
            assert_eq!(g.may_warn(t * 9_000), None);
        }
        assert_eq!(g.may_warn(999_999), None);
        assert_eq!(g.may_warn(1_000_000), Some(101));
        assert_eq!(g.may_warn(1_000_001), None);
        assert_eq!(g.may_warn(2_000_000), Some(1));
    }
}
