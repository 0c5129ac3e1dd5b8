//! [`FastClock`]: the local store's default clock.

use std::sync::atomic::{AtomicU64, Ordering};

use ratelimit_core::{Clock, Micros, SystemClock};

/// How often, in clock time, [`FastClock`] catches up with the wall clock.
const ANCHOR_EVERY: Micros = 1_000_000;

/// A cheap wall clock: the system clock read once, then advanced by a
/// monotonic counter ([`quanta`]: the CPU's time-stamp counter where it is
/// reliable, else the OS monotonic clock), and caught up with the system
/// clock once a second.
///
/// Reading it costs a counter read, a multiplication and a few atomic loads,
/// where [`SystemClock`] asks the OS for the time of day each call. It never
/// goes back: when the system clock is behind the counter's extrapolation
/// (it was stepped back, or slewed), this clock waits for it rather than
/// jumping back; when it is ahead, this clock jumps forward at the next
/// catch-up. So it follows the system clock forward within about a second.
///
/// ```
/// use ratelimit_core::{Clock, SystemClock};
/// use ratelimit_local::FastClock;
///
/// let clock = FastClock::new();
/// let (a, b) = (clock.now(), SystemClock.now());
/// assert!(a.abs_diff(b) < 60_000_000);
/// assert!(clock.now() >= a);
/// ```
#[derive(Debug)]
pub struct FastClock {
    counter: quanta::Clock,
    start: u64,
    /// Wall-clock µs at counter time 0 (`wall - elapsed`).
    offset: AtomicU64,
    /// Counter µs after which the next call catches up.
    next_anchor: AtomicU64,
}

impl Default for FastClock {
    fn default() -> Self {
        Self::new()
    }
}

impl FastClock {
    /// A clock reading the system's wall time now (calibrates the counter
    /// on first use in the process).
    pub fn new() -> Self {
        let counter = quanta::Clock::new();
        let start = counter.raw();
        let wall = SystemClock.now();
        Self {
            counter,
            start,
            offset: AtomicU64::new(wall),
            next_anchor: AtomicU64::new(ANCHOR_EVERY),
        }
    }

    #[cold]
    fn catch_up(&self, elapsed: Micros) -> Micros {
        let due = self.next_anchor.load(Ordering::Relaxed);
        let extrapolated = elapsed.wrapping_add(self.offset.load(Ordering::Relaxed));
        if elapsed < due
            || self
                .next_anchor
                .compare_exchange(
                    due,
                    elapsed + ANCHOR_EVERY,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return extrapolated;
        }
        // Forward only: a wall clock behind the counter is waited for, so
        // the offset never decreases.
        let wall = SystemClock.now().max(extrapolated);
        self.offset
            .fetch_max(wall.wrapping_sub(elapsed), Ordering::Relaxed);
        wall
    }
}

impl Clock for FastClock {
    #[inline(always)]
    fn now(&self) -> Micros {
        let elapsed = self.counter.delta_as_nanos(self.start, self.counter.raw()) / 1_000;
        if elapsed >= self.next_anchor.load(Ordering::Relaxed) {
            return self.catch_up(elapsed);
        }
        elapsed.wrapping_add(self.offset.load(Ordering::Relaxed))
    }
}
