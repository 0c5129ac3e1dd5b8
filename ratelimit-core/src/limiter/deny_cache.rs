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

use std::time::Duration;

use crate::clock::Micros;

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

#[derive(Debug, Clone, Copy)]
struct Entry {
    cost: u64,
    sent: Micros,
    until: Micros,
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

    /// Until when a call of `cost` is certainly denied, if it is.
    pub(crate) fn denied_until(
        &self,
        key: &[u8],
        fingerprint: u64,
        cost: u64,
        now: Micros,
    ) -> Option<Micros> {
        let e = with_key(key, fingerprint, |k| self.map.get(k))?;
        (cost >= e.cost && e.sent <= now && now < e.until).then_some(e.until)
    }

    /// Remembers that the store denied `cost` with `retry` for a call sent at `sent`.
    pub(crate) fn remember(
        &self,
        key: &[u8],
        fingerprint: u64,
        cost: u64,
        sent: Micros,
        retry: Duration,
    ) {
        let until = sent.saturating_add(u64::try_from(retry.as_micros()).unwrap_or(u64::MAX));
        let new = Entry { cost, sent, until };
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
