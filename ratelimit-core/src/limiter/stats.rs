//! How a limiter's decisions were reached: counters striped per thread.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of how a limiter's decisions were reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LimiterStats {
    /// Decisions made by the store that admitted the call.
    pub allowed: u64,
    /// Decisions made by the store that denied the call.
    pub denied: u64,
    /// Calls admitted by the fail-open policy.
    pub fail_open: u64,
    /// Calls denied by the fail-closed policy.
    pub fail_closed: u64,
    /// Calls decided by the fallback store while the shared store was unavailable.
    pub fallback: u64,
    /// Calls denied from the deny cache, without a round trip.
    pub cache_hits: u64,
    /// Calls admitted only because the quotas that denied are in shadow mode.
    pub shadow_denials: u64,
    /// Store errors (including panics), not counting timeouts.
    pub errors: u64,
    /// Store calls that timed out.
    pub timeouts: u64,
    /// Calls not sent to the store because the circuit breaker was open.
    pub short_circuits: u64,
}

/// How many stripes the counters are split into: each thread bumps one
/// stripe (chosen once per thread), so threads deciding at once do not
/// contend on one cache line; the stats add the stripes up.
const STRIPES: usize = 8;

/// One stripe of the counters, on a cache-line pair of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Stripe {
    pub(crate) allowed: AtomicU64,
    pub(crate) denied: AtomicU64,
    pub(crate) fail_open: AtomicU64,
    pub(crate) fail_closed: AtomicU64,
    pub(crate) fallback: AtomicU64,
    pub(crate) cache_hits: AtomicU64,
    pub(crate) shadow_denials: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) short_circuits: AtomicU64,
}

/// The limiter's counters, striped per thread and kept in an allocation of
/// their own (away from the limiter's read-mostly fields).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    stripes: Box<[Stripe; STRIPES]>,
}

impl Counters {
    /// The calling thread's stripe.
    #[inline]
    pub(crate) fn local(&self) -> &Stripe {
        &self.stripes[stripe_index()]
    }

    /// One counter summed over the stripes.
    pub(crate) fn sum(&self, counter: impl Fn(&Stripe) -> &AtomicU64) -> u64 {
        self.stripes
            .iter()
            .map(|s| counter(s).load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

/// The calling thread's counter stripe: threads take stripes in turn, on
/// their first decision.
#[inline]
fn stripe_index() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX
        .try_with(|i| {
            let mut v = i.get();
            if v >= STRIPES {
                v = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
                i.set(v);
            }
            v
        })
        // A thread being torn down shares the first stripe.
        .unwrap_or(0)
}

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    /// Every counter, summed over the stripes.
    pub(crate) fn snapshot(&self) -> LimiterStats {
        LimiterStats {
            allowed: self.sum(|s| &s.allowed),
            denied: self.sum(|s| &s.denied),
            fail_open: self.sum(|s| &s.fail_open),
            fail_closed: self.sum(|s| &s.fail_closed),
            fallback: self.sum(|s| &s.fallback),
            cache_hits: self.sum(|s| &s.cache_hits),
            shadow_denials: self.sum(|s| &s.shadow_denials),
            errors: self.sum(|s| &s.errors),
            timeouts: self.sum(|s| &s.timeouts),
            short_circuits: self.sum(|s| &s.short_circuits),
        }
    }
}
