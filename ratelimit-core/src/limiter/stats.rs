//! How a limiter's decisions were reached: counters striped per thread.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

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
    /// Calls decided from the caller's lease while the store could not
    /// answer ([`crate::Source::Lease`]).
    pub leased: u64,
    /// Store calls the store shed at once because its failure domain was
    /// busy ([`crate::StoreError::Overloaded`]; also counted in `errors`).
    pub shed: u64,
}

/// Stripes a thread may own: a thread that owns one is its only writer,
/// so it counts with a plain load and store (no locked read-modify-write
/// on the decision path). A thread claims one on its first decision and
/// gives it back when it ends.
const OWNED: usize = 16;

/// Stripes shared (with atomic adds) by the threads that found every owned
/// stripe taken.
const SHARED: usize = 4;

/// One stripe of the counters, on a cache-line pair of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Stripe {
    // `denied` before `allowed`: a store decision's counter is then the
    // stripe's word number `allowed as usize`, with no select.
    pub(crate) denied: AtomicU64,
    pub(crate) allowed: AtomicU64,
    pub(crate) fail_open: AtomicU64,
    pub(crate) fail_closed: AtomicU64,
    pub(crate) fallback: AtomicU64,
    pub(crate) cache_hits: AtomicU64,
    pub(crate) shadow_denials: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) short_circuits: AtomicU64,
    pub(crate) leased: AtomicU64,
    pub(crate) shed: AtomicU64,
}

/// The limiter's counters, striped per thread and kept in an allocation of
/// their own (away from the limiter's read-mostly fields).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    owned: Box<[Stripe; OWNED]>,
    shared: Box<[Stripe; SHARED]>,
}

impl Counters {
    /// Adds one to the counter `pick` chooses, in the calling thread's
    /// stripe.
    #[inline(always)]
    pub(crate) fn bump(&self, pick: impl FnOnce(&Stripe) -> &AtomicU64) {
        // An owned stripe: one test of the thread's stripe index.
        if let Some(stripe) = self.owned.get(STRIPE.with(Cell::get)) {
            // The only writer of this stripe: no read-modify-write.
            let c = pick(stripe);
            c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
            return;
        }
        self.bump_claimed(pick);
    }

    /// [`Counters::bump`] in a thread that has not claimed its stripe yet,
    /// or shares one.
    #[inline(never)]
    fn bump_claimed(&self, pick: impl FnOnce(&Stripe) -> &AtomicU64) {
        match claim() {
            Claim::Owned(i) => {
                let c = pick(&self.owned[i % OWNED]);
                c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
            }
            Claim::Shared(i) => {
                pick(&self.shared[i % SHARED]).fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// One counter summed over the stripes.
    pub(crate) fn sum(&self, counter: impl Fn(&Stripe) -> &AtomicU64) -> u64 {
        self.owned
            .iter()
            .chain(self.shared.iter())
            .map(|s| counter(s).load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

/// Which stripe the calling thread writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// A stripe the thread owns (the same index in every limiter).
    Owned(usize),
    /// A shared stripe.
    Shared(usize),
}

/// Whether each owned stripe index has an owner (a live thread).
static OWNERS: [AtomicBool; OWNED] = [const { AtomicBool::new(false) }; OWNED];

thread_local! {
    /// The thread's stripe: `usize::MAX` until its first decision; then an
    /// owned index (below [`OWNED`]) or [`OWNED`] plus a shared index. No
    /// destructor, so reading it costs no more than a load.
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    /// Gives an owned stripe back when the thread ends (touched once, when
    /// the stripe is claimed).
    static RELEASE: Release = const { Release(Cell::new(usize::MAX)) };
}

/// The owned stripe a thread gives back when it ends.
struct Release(Cell<usize>);

impl Drop for Release {
    /// The thread ends: it counts in a shared stripe from now on (other
    /// destructors may still decide), and its owned stripe goes back for
    /// another thread (which, acquiring it, sees every count this one made).
    fn drop(&mut self) {
        if let Some(owner) = OWNERS.get(self.0.get()) {
            let _ = STRIPE.try_with(|s| s.set(OWNED));
            owner.store(false, Ordering::Release);
        }
    }
}

/// The calling thread's stripe, claimed on its first decision.
#[inline(always)]
fn claim() -> Claim {
    let v = STRIPE.with(Cell::get);
    let v = if v == usize::MAX { claim_first() } else { v };
    if v < OWNED {
        Claim::Owned(v)
    } else {
        Claim::Shared(v - OWNED)
    }
}

/// A free owned stripe, else a shared one (in turn); remembered for the
/// thread.
#[cold]
#[inline(never)]
fn claim_first() -> usize {
    let owned = OWNERS.iter().position(|owner| {
        owner
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    });
    let v = match owned {
        // Given back when the thread ends; a thread already being torn
        // down (whose destructors have run) gives it back at once and
        // shares.
        Some(i) => match RELEASE.try_with(|r| r.0.set(i)) {
            Ok(()) => i,
            Err(_) => {
                if let Some(owner) = OWNERS.get(i) {
                    owner.store(false, Ordering::Release);
                }
                OWNED
            }
        },
        None => {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            OWNED + NEXT.fetch_add(1, Ordering::Relaxed) % SHARED
        }
    };
    STRIPE.with(|s| s.set(v));
    v
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
            leased: self.sum(|s| &s.leased),
            shed: self.sum(|s| &s.shed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More threads than owned stripes, in waves (threads end and give
    /// their stripes to the next), all counting at once: not one count is
    /// lost, on owned stripes and shared ones alike.
    #[test]
    fn concurrent_counts_are_exact_across_owned_and_shared_stripes() {
        let counters = Counters::default();
        let (threads, per_thread, waves) = (3 * OWNED, 2_000u64, 3);
        for _ in 0..waves {
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        for i in 0..per_thread {
                            counters.bump(|c| if i % 2 == 0 { &c.allowed } else { &c.denied });
                        }
                    });
                }
            });
        }
        let stats = counters.snapshot();
        let total = threads as u64 * per_thread * waves;
        assert_eq!(stats.allowed, total / 2);
        assert_eq!(stats.denied, total / 2);
    }
}
