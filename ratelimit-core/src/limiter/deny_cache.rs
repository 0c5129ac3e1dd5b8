//! The local deny cache: denials the store made, remembered until their
//! exact `retry_after`, so that calls the store would certainly deny are
//! answered in process.
//!
//! # Why it never denies a call the store would admit
//!
//! The store denied a call of cost `c` under quota `q` with an exact
//! `retry_after = r`. The cache remembers `(c, until = t_send + r)`, where
//! `t_send` is the limiter's clock read **before** the store call was sent.
//! A later call under the same `q` (same name and numbers) of cost `c' >= c`
//! at `now < until` is denied from the cache. That is safe for all four
//! algorithms because of two monotonicities:
//!
//! - **in cost**: a state that denies cost `c` denies every larger cost:
//!   the fixed window's `count + c`, the sliding window's
//!   `prev·(W−e) + (curr + c)·W`, the sliding log's `total + c` all grow with
//!   `c`, and a token bucket with fewer than `c` tokens has fewer than any
//!   larger cost. A smaller cost may pass (a bucket short of 5 tokens may
//!   still have 1), so a smaller cost always goes to the store.
//! - **in time, absent traffic, and under traffic**: a caller's state only
//!   gets better by time passing (windows end, entries leave, tokens refill)
//!   and only worse by admitted calls; a denial writes nothing. So a call
//!   denied at `t` stays denied until `t + r`, whatever other instances do.
//!
//! The store's clock (Redis `TIME`) and the limiter's are never compared:
//! `r` is a duration counted from the moment the store decided, which came
//! after `t_send`, so `t_send + r` on the limiter's clock is no later than
//! the true end of the denial, whatever the offset between the clocks. A
//! limiter clock that steps back before `t_send` voids the entry. With
//! several quotas, each denying quota is remembered on its own, and a call
//! is answered from the cache only if one of its quotas certainly denies it.
//!
//! A cached denial's `retry_after` is `until - now`: never longer than the
//! exact wait, shorter by at most the round trip of the original call.
//!
//! # The numbers a cached denial carries
//!
//! A 429 from the cache carries the same fields as one from the store
//! (`X-RateLimit-Remaining`, `X-RateLimit-Reset`, `RateLimit`), so an entry
//! keeps, besides `until`, the quota's `remaining` and the instant its state
//! is fresh again, `reset_at = t_send + reset_after`, on the limiter's clock
//! (early by at most the round trip, as `until` is). At a later instant
//! `now` the cached decision's `reset_after` is `reset_at - now`, and its
//! `remaining`, absent other traffic:
//!
//! - once `reset_at` has passed, the quota's limit (the state is fresh);
//! - **fixed window**: the store's number until then (exact: nothing leaves
//!   a calendar window before it ends);
//! - **token bucket**: the whole tokens of a bucket that is full at
//!   `reset_at` (exact but for the round trip, which can add a fraction of
//!   a token), never fewer than the store gave;
//! - **sliding window counter, sliding log**: the store's number, a lower
//!   bound (what left the window since is not counted).
//!
//! While the cache denies a call of cost 1, each of these is 0, as the
//! store would say.
//!
//! With several quotas, a denial answered by the store also keeps every
//! quota's numbers from that answer (one shared snapshot per denial), so that
//! a cached verdict lists every policy in `RateLimit` as the store's verdict
//! does, by the same rules; a quota that would have admitted the denied call
//! is given as the store gives it, `remaining` without the call and
//! `reset_after` with it. A cached verdict is given only when every enforced
//! quota's numbers are known; otherwise the call goes to the store.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::{Algorithm, Quota};

/// Deny cache settings (see [`crate::LimiterBuilder::deny_cache`]):
/// at most `capacity` callers × quotas, each entry dropped once its
/// `retry_after` has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenyCache {
    capacity: u64,
}

impl DenyCache {
    /// A cache of at most `capacity` entries (one per denied caller and quota).
    pub fn new(capacity: u64) -> Self {
        Self { capacity }
    }

    /// The most entries kept.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
}

impl Default for DenyCache {
    /// 100,000 entries.
    fn default() -> Self {
        Self::new(100_000)
    }
}

/// One quota's numbers in a store answer: whether it admitted the call,
/// what it had left, and when its state is fresh again (limiter clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Numbers {
    pub(crate) allowed: bool,
    pub(crate) remaining: u64,
    pub(crate) reset_at: Micros,
    /// A cost the quota admitted but did not count (another quota denied
    /// the call): its `reset_after` is that of the state with the cost
    /// counted, its `remaining` that without.
    uncounted: u64,
}

impl Numbers {
    /// The numbers of a store decision for a call sent at `sent`.
    pub(crate) fn of(d: &Decision, sent: Micros) -> Self {
        Self {
            allowed: d.allowed,
            remaining: d.remaining,
            reset_at: sent.saturating_add(micros(d.reset_after)),
            uncounted: 0,
        }
    }

    /// The numbers of one quota's decision in a denied verdict, for a call
    /// of `cost` under it sent at `sent`.
    pub(crate) fn in_denied_verdict(d: &Decision, cost: u64, sent: Micros) -> Self {
        Self {
            uncounted: if d.allowed { cost } else { 0 },
            ..Self::of(d, sent)
        }
    }

    /// `remaining` and `reset_after` at `now` under `quota`, absent other
    /// traffic (see the module docs).
    pub(crate) fn at(&self, now: Micros, quota: &Quota) -> (u64, Duration) {
        if now >= self.reset_at {
            // Fresh again: what the store says of a fresh caller, with an
            // uncounted cost charged in `reset_after` as the store does.
            return match crate::model::decide(quota, None, now, self.uncounted.max(1)) {
                Ok(step) if self.uncounted > 0 => (quota.limit(), step.decision.reset_after),
                _ => (quota.limit(), Duration::ZERO),
            };
        }
        let reset_after = Duration::from_micros(self.reset_at - now);
        match quota.algorithm() {
            Algorithm::TokenBucket(b) => {
                let short = (self.reset_at - now).saturating_mul(b.refill());
                let level = b.full().saturating_sub(short) / b.unit();
                let level = level.saturating_add(self.uncounted).min(b.capacity());
                // The bucket with the uncounted cost charged is full again
                // no sooner than that cost takes to refill.
                let charged = self.uncounted.saturating_mul(b.unit()).div_ceil(b.refill());
                (
                    self.remaining.max(level),
                    reset_after.max(Duration::from_micros(charged)),
                )
            }
            _ => (self.remaining, reset_after),
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Every quota's numbers in one store answer, in the limiter's order.
pub(crate) type Snapshot = Arc<[Numbers]>;

#[derive(Debug, Clone)]
struct Entry {
    cost: u64,
    sent: Micros,
    until: Micros,
    /// The denied quota's numbers.
    numbers: Numbers,
    /// Every quota's numbers, when the denial came from a verdict over
    /// several quotas.
    snapshot: Option<Snapshot>,
}

/// A cached denial that covers a call.
#[derive(Debug, Clone)]
pub(crate) struct Hit {
    /// Until when the call is certainly denied.
    pub(crate) until: Micros,
    /// The denied quota's numbers.
    pub(crate) numbers: Numbers,
    /// Every quota's numbers at the denial, if it was a verdict's.
    pub(crate) snapshot: Option<Snapshot>,
}

/// Expires each entry after its own `retry_after` (memory only: validity is
/// checked against the limiter's clock on every read).
struct UntilExpiry;

impl moka::Expiry<Box<[u8]>, Entry> for UntilExpiry {
    fn expire_after_create(
        &self,
        _: &Box<[u8]>,
        e: &Entry,
        _: std::time::Instant,
    ) -> Option<Duration> {
        Some(Duration::from_micros(e.until.saturating_sub(e.sent)))
    }
    fn expire_after_update(
        &self,
        k: &Box<[u8]>,
        e: &Entry,
        at: std::time::Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        self.expire_after_create(k, e, at)
    }
}

/// The live cache.
pub(crate) struct Cache {
    map: moka::sync::Cache<Box<[u8]>, Entry>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenyCache")
            .field("entries", &self.map.entry_count())
            .finish()
    }
}

/// The cache key: the store key, then the quota's fingerprint.
fn with_key<R>(key: &[u8], fingerprint: u64, f: impl FnOnce(&[u8]) -> R) -> R {
    const INLINE: usize = 136;
    let len = key.len() + 8;
    if len <= INLINE {
        let mut buf = [0u8; INLINE];
        buf[..key.len()].copy_from_slice(key);
        buf[key.len()..len].copy_from_slice(&fingerprint.to_le_bytes());
        f(&buf[..len])
    } else {
        f(&[key, &fingerprint.to_le_bytes()].concat())
    }
}

impl Cache {
    pub(crate) fn new(config: DenyCache) -> Self {
        Self {
            map: moka::sync::Cache::builder()
                .max_capacity(config.capacity)
                .expire_after(UntilExpiry)
                .build(),
        }
    }

    /// The cached denial that certainly denies a call of `cost` at `now`, if any.
    pub(crate) fn denied(
        &self,
        key: &[u8],
        fingerprint: u64,
        cost: u64,
        now: Micros,
    ) -> Option<Hit> {
        let e = with_key(key, fingerprint, |k| self.map.get(k))?;
        (cost >= e.cost && e.sent <= now && now < e.until).then_some(Hit {
            until: e.until,
            numbers: e.numbers,
            snapshot: e.snapshot,
        })
    }

    /// Remembers that the store denied `cost` with decision `d` (denied,
    /// with a `retry_after`) for a call sent at `sent`; `snapshot`: every
    /// quota's numbers, for a verdict over several quotas.
    pub(crate) fn remember(
        &self,
        key: &[u8],
        fingerprint: u64,
        cost: u64,
        sent: Micros,
        d: &Decision,
        snapshot: Option<Snapshot>,
    ) {
        let Some(retry) = d.retry_after.filter(|_| !d.allowed) else {
            return;
        };
        let until = sent.saturating_add(micros(retry));
        let new = Entry {
            cost,
            sent,
            until,
            numbers: Numbers::of(d, sent),
            snapshot,
        };
        with_key(key, fingerprint, |k| {
            if let Some(old) = self.map.get(k) {
                // Keep the entry that covers more calls.
                let better = cost < old.cost || (cost == old.cost && until > old.until);
                if !better && old.until > sent {
                    return;
                }
            }
            self.map.insert(Box::from(k), new);
        });
    }
}
