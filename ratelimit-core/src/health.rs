//! Judging a failure domain (a Redis node, a cluster master, a whole store)
//! on evidence: a circuit breaker that opens on a failure **rate** over a
//! sliding window with a minimum number of calls, and probes its way back.
//!
//! One [`Health`] per failure domain. The shipped Redis stores keep one per
//! node (so one dead cluster master affects only the callers of its slots);
//! the [`crate::Limiter`] keeps one for a store that reports no failure
//! domains of its own. A store of your own can use it the same way:
//! [`Health::permit`] before a call, [`Health::success`] or
//! [`Health::failure`] after it.
//!
//! What counts as a failure is the caller's judgement, and the shipped
//! callers are careful: a call that timed out while the domain kept
//! answering other calls (a busy server, replies still flowing) is slow,
//! not failed; a call that timed out because this process was late (its
//! runtime starved: the timer fired well after its deadline) is neither.
//! Errors that prove the server is unreachable (connection refused, reset),
//! and timeouts with no reply at all from the domain, are failures.
//!
//! ```
//! use ratelimit_core::health::{Health, Permit};
//! use ratelimit_core::CircuitBreaker;
//!
//! let h = Health::new(CircuitBreaker::DEFAULT);
//! let mut now = 1_000_000;
//! // 20 calls in the window, all failing: the rate is 100 %, over the minimum.
//! for _ in 0..20 {
//!     assert!(matches!(h.permit(now), Permit::Call));
//!     h.failure(now, false);
//!     now += 1_000;
//! }
//! assert!(matches!(h.permit(now), Permit::Open));
//! // After the probe interval one call probes; its success closes it.
//! now += 100_000;
//! let p = h.permit(now);
//! assert!(matches!(p, Permit::Probe(_)));
//! h.success(now);
//! drop(p);
//! assert!(matches!(h.permit(now), Permit::Call));
//! ```

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::{Micros, duration_to_micros};

/// Circuit breaker settings: when a failure domain is judged failing, and
/// how it is probed back.
///
/// - **closed**: every call goes through. Outcomes are counted in a
///   sliding window of `window` (ten buckets); once the window holds at
///   least `min_calls` calls of which at least `failure_rate` percent
///   failed, the breaker opens.
/// - **open**: no call goes through; callers fail fast (the limiter decides
///   by its fallback store or failure policy, at no network cost).
/// - **half-open**: `probe_every` after it opened (or after the last failed
///   probe), one call at a time goes through as a probe: its success closes
///   the breaker (and empties the window), its failure keeps it open for
///   another `probe_every`.
///
/// The default: a 1 s window, at least 20 calls, 50 % failed, a probe every
/// 100 ms (so a domain that answers again is back within about 100 ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitBreaker {
    window: Duration,
    min_calls: u32,
    failure_rate: u8,
    probe_every: Duration,
}

impl CircuitBreaker {
    /// A 1 s window, at least 20 calls, 50 % failed, a probe every 100 ms.
    pub const DEFAULT: Self = Self {
        window: Duration::from_secs(1),
        min_calls: 20,
        failure_rate: 50,
        probe_every: Duration::from_millis(100),
    };

    /// Opens once a `window` holds at least `min_calls` calls (at least 1)
    /// of which at least `failure_rate` percent (1 to 100) failed; probes
    /// every `probe_every` while open.
    pub fn new(window: Duration, min_calls: u32, failure_rate: u8, probe_every: Duration) -> Self {
        Self {
            window: window.max(Duration::from_micros(BUCKETS as u64)),
            min_calls: min_calls.max(1),
            failure_rate: failure_rate.clamp(1, 100),
            probe_every,
        }
    }

    /// The sliding window outcomes are counted in.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The fewest calls in the window for the breaker to judge.
    pub fn min_calls(&self) -> u32 {
        self.min_calls
    }

    /// The failure rate, in percent, that opens the breaker.
    pub fn failure_rate(&self) -> u8 {
        self.failure_rate
    }

    /// How often an open breaker lets one probe through.
    pub fn probe_every(&self) -> Duration {
        self.probe_every
    }
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The state a breaker is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Calls fail fast until the next probe is due.
    Open,
    /// A probe is due (or under way): the next call probes.
    HalfOpen,
}

/// What the breaker lets a call do ([`Health::permit`]).
#[derive(Debug)]
pub enum Permit<'a> {
    /// Go.
    Call,
    /// Go, as the one probe; dropping it unfinished frees the slot for the
    /// next probe (a cancelled probe never keeps the breaker open for good).
    Probe(ProbeSlot<'a>),
    /// Do not call: the domain is judged failing.
    Open,
}

impl Permit<'_> {
    /// Whether the call may go.
    pub fn is_go(&self) -> bool {
        !matches!(self, Self::Open)
    }

    /// Whether this call is the probe.
    pub fn is_probe(&self) -> bool {
        matches!(self, Self::Probe(_))
    }
}

/// The probe's slot: freed when dropped.
#[derive(Debug)]
pub struct ProbeSlot<'a>(&'a Health);

impl Drop for ProbeSlot<'_> {
    fn drop(&mut self) {
        self.0.probing.store(false, Ordering::Release);
    }
}

/// Buckets in the sliding window.
const BUCKETS: usize = 10;

/// One bucket of the window: the calls and failures of one tenth of it.
#[derive(Debug, Default)]
struct Bucket {
    /// Which tenth of time it counts (`now / bucket length`).
    epoch: AtomicU64,
    calls: AtomicU32,
    failures: AtomicU32,
}

/// The live health of one failure domain. Thread-safe; lock-free.
///
/// Times are µs on any monotonic or wall clock the caller keeps to (the
/// same one for every call).
#[derive(Debug)]
pub struct Health {
    config: CircuitBreaker,
    bucket_micros: u64,
    buckets: [Bucket; BUCKETS],
    /// When it opened or last failed a probe (µs); 0 when closed.
    opened_at: AtomicU64,
    probing: AtomicBool,
}

impl Health {
    /// A closed breaker with these settings.
    pub fn new(config: CircuitBreaker) -> Self {
        Self {
            bucket_micros: (duration_to_micros(config.window) / BUCKETS as u64).max(1),
            config,
            buckets: Default::default(),
            opened_at: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    /// The settings.
    pub fn config(&self) -> &CircuitBreaker {
        &self.config
    }

    /// The state at `now`.
    pub fn state(&self, now: Micros) -> BreakerState {
        match self.opened_at.load(Ordering::Acquire) {
            0 => BreakerState::Closed,
            at if now < at.saturating_add(duration_to_micros(self.config.probe_every)) => {
                BreakerState::Open
            }
            _ => BreakerState::HalfOpen,
        }
    }

    /// Whether a call may go at `now`: always while closed; while open, one
    /// probe per `probe_every`.
    #[inline]
    pub fn permit(&self, now: Micros) -> Permit<'_> {
        if self.opened_at.load(Ordering::Acquire) == 0 {
            return Permit::Call;
        }
        self.permit_open(now)
    }

    #[cold]
    fn permit_open(&self, now: Micros) -> Permit<'_> {
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

    /// A call answered. Returns whether this closed an open breaker.
    #[inline]
    pub fn success(&self, now: Micros) -> bool {
        self.record(now, false);
        if self.opened_at.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.close()
    }

    #[cold]
    fn close(&self) -> bool {
        let was_open = self.opened_at.swap(0, Ordering::AcqRel) != 0;
        if was_open {
            // A fresh window: the failures that opened it are history.
            for b in &self.buckets {
                b.calls.store(0, Ordering::Relaxed);
                b.failures.store(0, Ordering::Relaxed);
            }
        }
        was_open
    }

    /// A call failed (`probe`: it was the probe). Returns whether this
    /// opened the breaker (or kept it open after a failed probe).
    pub fn failure(&self, now: Micros, probe: bool) -> bool {
        let now = now.max(1);
        if probe {
            self.opened_at.store(now, Ordering::Release);
            return true;
        }
        self.record(now, true);
        if self.opened_at.load(Ordering::Acquire) != 0 {
            return false;
        }
        let (calls, failures) = self.window_counts(now);
        calls >= u64::from(self.config.min_calls)
            && failures * 100 >= calls * u64::from(self.config.failure_rate)
            && self
                .opened_at
                .compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// Opens the breaker now, whatever the window says (a caller that has
    /// other proof the domain is down, such as a stalled connection).
    pub fn trip(&self, now: Micros) -> bool {
        self.opened_at
            .compare_exchange(0, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Calls and failures in the window ending at `now`.
    pub fn window_counts(&self, now: Micros) -> (u64, u64) {
        let epoch = now / self.bucket_micros;
        let oldest = epoch.saturating_sub(BUCKETS as u64 - 1);
        self.buckets
            .iter()
            .filter(|b| {
                let e = b.epoch.load(Ordering::Acquire);
                e >= oldest && e <= epoch
            })
            .fold((0, 0), |(c, f), b| {
                (
                    c + u64::from(b.calls.load(Ordering::Relaxed)),
                    f + u64::from(b.failures.load(Ordering::Relaxed)),
                )
            })
    }

    #[inline]
    fn record(&self, now: Micros, failed: bool) {
        let epoch = now / self.bucket_micros;
        let b = &self.buckets[(epoch % BUCKETS as u64) as usize];
        let seen = b.epoch.load(Ordering::Acquire);
        if seen != epoch {
            // A new tenth of the window: the first call to see it resets
            // the bucket (a call racing with the reset may be lost: the
            // breaker judges a rate, not an exact count).
            if seen < epoch
                && b.epoch
                    .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                b.calls.store(0, Ordering::Relaxed);
                b.failures.store(0, Ordering::Relaxed);
            } else if seen > epoch {
                // A clock that went back: count in the newer bucket.
            }
        }
        b.calls.fetch_add(1, Ordering::Relaxed);
        if failed {
            b.failures.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// How late a timer may fire, past its deadline, before the lateness is
/// the process's own (a starved runtime) rather than the store's: 5 ms, or
/// a quarter of the wait, whichever is longer. A timeout that fired later
/// than that is not evidence against the store.
pub fn late_after(wait: Duration) -> Duration {
    (wait / 4).max(Duration::from_millis(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Micros = 1_000;

    #[test]
    fn a_few_failures_among_many_successes_do_not_open_it() {
        let h = Health::new(CircuitBreaker::DEFAULT);
        let mut now = 10_000 * MS;
        for i in 0..1_000 {
            now += MS / 10;
            if i % 5 == 0 {
                assert!(!h.failure(now, false), "call {i}");
            } else {
                h.success(now);
            }
        }
        assert_eq!(h.state(now), BreakerState::Closed);
    }

    #[test]
    fn too_few_calls_are_no_evidence() {
        let h = Health::new(CircuitBreaker::DEFAULT);
        for i in 0..19 {
            assert!(!h.failure(10_000 * MS + i, false));
        }
        assert_eq!(h.state(10_000 * MS + 20), BreakerState::Closed);
        assert!(h.failure(10_000 * MS + 20, false));
    }

    #[test]
    fn old_failures_leave_the_window() {
        let h = Health::new(CircuitBreaker::DEFAULT);
        let now = 10_000 * MS;
        for i in 0..15 {
            h.failure(now + i, false);
        }
        // A second later they are out of the window: 15 more do not open.
        for i in 0..15 {
            assert!(!h.failure(now + 1_100 * MS + i, false));
        }
        assert_eq!(h.window_counts(now + 1_100 * MS + 20), (15, 15));
    }

    #[test]
    fn it_probes_every_interval_and_closes_on_success() {
        let h = Health::new(CircuitBreaker::DEFAULT);
        let mut now = 10_000 * MS;
        for _ in 0..20 {
            h.failure(now, false);
        }
        assert!(matches!(h.permit(now + 99 * MS), Permit::Open));
        now += 100 * MS;
        let probe = h.permit(now);
        assert!(probe.is_probe());
        // One probe at a time.
        assert!(matches!(h.permit(now), Permit::Open));
        assert!(h.failure(now, true));
        drop(probe);
        assert!(matches!(h.permit(now + 50 * MS), Permit::Open));
        let probe = h.permit(now + 100 * MS);
        assert!(probe.is_probe());
        assert!(h.success(now + 100 * MS));
        drop(probe);
        assert_eq!(h.state(now + 100 * MS), BreakerState::Closed);
        assert_eq!(h.window_counts(now + 100 * MS).1, 0);
    }

    #[test]
    fn a_dropped_probe_frees_its_slot() {
        let h = Health::new(CircuitBreaker::DEFAULT);
        h.trip(MS);
        let now = 200 * MS;
        drop(h.permit(now));
        assert!(h.permit(now).is_probe());
    }
}
