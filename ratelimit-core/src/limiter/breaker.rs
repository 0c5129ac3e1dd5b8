//! The circuit breaker: after repeated store failures, stop calling the
//! store for a cool-down, then let single probes through until one answers.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::{Micros, duration_to_micros};

/// Circuit breaker settings (see [`crate::LimiterBuilder::circuit_breaker`]).
///
/// - **closed**: every call goes to the store; `failures` consecutive
///   failures (errors, timeouts, panics) open it.
/// - **open**: no call goes to the store for `cool_down`; decisions come
///   from the fallback store or the failure policy at once, costing no
///   network time.
/// - **half-open**: after the cool-down one call at a time probes the store
///   (the others are answered as when open); a probe that succeeds closes the
///   breaker, one that fails opens it for another cool-down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitBreaker {
    failures: u32,
    cool_down: Duration,
}

impl CircuitBreaker {
    /// The default: open after 5 consecutive failures, for 1 s.
    pub const DEFAULT: Self = Self {
        failures: 5,
        cool_down: Duration::from_secs(1),
    };

    /// Opens after `failures` consecutive failures (at least 1) for `cool_down`.
    pub fn new(failures: u32, cool_down: Duration) -> Self {
        Self {
            failures: failures.max(1),
            cool_down,
        }
    }

    /// Consecutive failures that open the breaker.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// How long the breaker stays open before probing.
    pub fn cool_down(&self) -> Duration {
        self.cool_down
    }
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The state a breaker is in, as [`crate::Limiter::breaker_state`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls go to the store.
    Closed,
    /// Calls are answered without the store until the cool-down ends.
    Open,
    /// The cool-down has ended: the next call probes the store.
    HalfOpen,
}

/// What the breaker lets a call do.
pub(crate) enum Permit<'a> {
    /// Call the store.
    Call,
    /// Call the store as the one probe; dropping it unfinished frees the slot.
    Probe(#[allow(dead_code)] ProbeSlot<'a>),
    /// Do not call the store.
    Open,
}

/// Frees the probe slot when dropped (a cancelled probe must not leave the
/// breaker open for good).
pub(crate) struct ProbeSlot<'a>(&'a Breaker);

impl Drop for ProbeSlot<'_> {
    fn drop(&mut self) {
        self.0.probing.store(false, Ordering::Release);
    }
}

/// A breaker's live state.
#[derive(Debug)]
pub(crate) struct Breaker {
    config: CircuitBreaker,
    failures: AtomicU32,
    /// When it opened (µs by the limiter's clock); 0 when closed.
    opened_at: AtomicU64,
    probing: AtomicBool,
}

impl Breaker {
    pub(crate) fn new(config: CircuitBreaker) -> Self {
        Self {
            config,
            failures: AtomicU32::new(0),
            opened_at: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    pub(crate) fn state(&self, now: Micros) -> BreakerState {
        match self.opened_at.load(Ordering::Acquire) {
            0 => BreakerState::Closed,
            at if now < at.saturating_add(duration_to_micros(self.config.cool_down)) => {
                BreakerState::Open
            }
            _ => BreakerState::HalfOpen,
        }
    }

    pub(crate) fn permit(&self, now: Micros) -> Permit<'_> {
        match self.state(now) {
            BreakerState::Closed => Permit::Call,
            BreakerState::Open => Permit::Open,
            BreakerState::HalfOpen => {
                if self
                    .probing
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    Permit::Probe(ProbeSlot(self))
                } else {
                    Permit::Open
                }
            }
        }
    }

    /// A store call answered: close. Returns whether the breaker was open.
    pub(crate) fn success(&self) -> bool {
        self.failures.store(0, Ordering::Relaxed);
        self.opened_at.swap(0, Ordering::AcqRel) != 0
    }

    /// A store call failed. Returns whether this failure opened the breaker.
    pub(crate) fn failure(&self, now: Micros, probe: bool) -> bool {
        let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        let now = now.max(1);
        if probe {
            self.opened_at.store(now, Ordering::Release);
            return true;
        }
        n >= self.config.failures
            && self
                .opened_at
                .compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }
}
