//! Time sources. Time is integer microseconds since the Unix epoch.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch.
///
/// Integers stay exact in Lua's doubles below 2^53 (year 2255 in microseconds);
/// nanoseconds would not.
pub type Micros = u64;

/// A source of the current time in microseconds since the Unix epoch.
///
/// Stores and limiters take a clock so that tests can drive time with a
/// [`ManualClock`] instead of sleeping.
pub trait Clock: Send + Sync + Debug {
    /// The current time in microseconds since the Unix epoch.
    fn now(&self) -> Micros;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Micros {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Micros {
        (**self).now()
    }
}

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        // A clock before 1970 is a broken machine; saturate to 0 instead of panicking.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to. Clones share one time.
///
/// ```
/// use ratelimit_core::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(1_000_000);
/// let shared = clock.clone();
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(shared.now(), 2_500_000);
/// shared.set(42);
/// assert_eq!(clock.now(), 42);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock that reads `now` microseconds since the Unix epoch.
    pub fn new(now: Micros) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(now)),
        }
    }

    /// Moves the shared time forward by `by` (saturating at `u64::MAX`).
    pub fn advance(&self, by: Duration) {
        self.advance_micros(u64::try_from(by.as_micros()).unwrap_or(u64::MAX));
    }

    /// Moves the shared time forward by `micros` microseconds (saturating).
    pub fn advance_micros(&self, micros: u64) {
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(micros))
            });
    }

    /// Sets the shared time to `now` microseconds since the Unix epoch.
    pub fn set(&self, now: Micros) {
        self.now.store(now, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.now.load(Ordering::SeqCst)
    }
}

/// Converts a [`Duration`] to whole microseconds, saturating at `u64::MAX`.
pub fn duration_to_micros(d: Duration) -> Micros {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now() > 1_577_836_800_000_000);
    }

    #[test]
    fn manual_clock_saturates() {
        let c = ManualClock::new(u64::MAX - 1);
        c.advance_micros(10);
        assert_eq!(c.now(), u64::MAX);
    }
}
