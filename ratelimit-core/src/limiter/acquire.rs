//! Waiting for a shared quota: [`Limiter::acquire`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::decision::Verdict;
use crate::error::CostError;

use super::Limiter;

/// Why [`Limiter::acquire`] gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// The deadline would pass before the call could be admitted.
    #[error(
        "not admitted within the deadline of {deadline:?} (waited {waited:?}; the next chance is \
         in {next:?})"
    )]
    Deadline {
        /// The deadline given.
        deadline: Duration,
        /// How long `acquire` waited.
        waited: Duration,
        /// The wait the last denial asked for (`None`: the store was
        /// unavailable and the failure policy denied).
        next: Option<Duration>,
    },
    /// The cost can never be admitted by some quota.
    #[error(transparent)]
    Cost(#[from] CostError),
}

/// When a denial carries no `retry_after` (the store is down and the policy
/// is fail-closed), wait this long before asking again.
const UNAVAILABLE_BACKOFF: Duration = Duration::from_millis(50);

/// A small, fast generator for jitter (xorshift64*), seeded per limiter.
#[derive(Debug)]
pub(crate) struct Jitter(AtomicU64);

impl Jitter {
    pub(crate) fn new(seed: u64) -> Self {
        Self(AtomicU64::new(seed | 1))
    }

    /// Up to a quarter of `wait` (at most 250 ms) more, uniformly.
    pub(crate) fn add(&self, wait: Duration) -> Duration {
        let mut x = self.0.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0.store(x, Ordering::Relaxed);
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        let span = (wait / 4).min(Duration::from_millis(250));
        let span_us = u64::try_from(span.as_micros()).unwrap_or(u64::MAX);
        wait + Duration::from_micros(if span_us == 0 { 0 } else { r % (span_us + 1) })
    }
}

impl Limiter {
    /// Waits until `caller` may make a call of `cost` under every quota, or
    /// gives up once `deadline` (from now) would pass: for outbound use, a
    /// crawler or a worker pool calling a third-party API whose allowance
    /// all our processes share.
    ///
    /// Each denial's exact `retry_after` is waited, plus jitter (up to a
    /// quarter of it, at most 250 ms) so that waiters woken together do not
    /// stampede; when the store is down and the policy denies, it asks again
    /// every 50 ms. Time is the limiter's clock, sleeping its [`crate::Timer`].
    ///
    /// Cancel-safe: dropping the future at any point leaves nothing behind
    /// (a call is counted only when it is admitted, and then `acquire`
    /// returns at once).
    pub async fn acquire(
        &self,
        caller: impl AsRef<[u8]>,
        cost: u64,
        deadline: Duration,
    ) -> Result<Verdict, AcquireError> {
        let caller = caller.as_ref();
        let clock = &self.inner.clock;
        let start = clock.now();
        loop {
            let verdict = self.check_all(caller, cost).await?;
            if verdict.decision.allowed {
                return Ok(verdict);
            }
            let waited = Duration::from_micros(clock.now().saturating_sub(start));
            let next = verdict.decision.retry_after;
            let wait = self.inner.jitter.add(next.unwrap_or(UNAVAILABLE_BACKOFF));
            if waited + next.unwrap_or(UNAVAILABLE_BACKOFF) > deadline {
                return Err(AcquireError::Deadline {
                    deadline,
                    waited,
                    next,
                });
            }
            // Never sleep past the deadline: the last try happens at it.
            let wait = wait.min(deadline.saturating_sub(waited));
            self.inner.timer.sleep(wait).await;
        }
    }
}
