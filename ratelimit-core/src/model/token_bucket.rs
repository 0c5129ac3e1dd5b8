use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::Bucket;

/// Token bucket state in exact integer units (see [`crate::Bucket`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenBucketState {
    /// Bucket level in units (`tokens * unit`), at time `updated`.
    pub level: u64,
    /// When `level` was measured, in µs since the epoch.
    pub updated: Micros,
}

/// Refill `refill` units per microsecond since `updated`, up to `full`; admit
/// iff the level covers `cost * unit`. A fresh caller has a full bucket. The
/// refill is computed as "full once `elapsed >= ceil(missing / refill)`",
/// else `level + elapsed * refill`, so no product exceeds `full + refill`.
pub(super) fn step(
    b: &Bucket,
    state: Option<TokenBucketState>,
    now: Micros,
    cost: u64,
) -> (Decision, TokenBucketState, Micros) {
    let (unit, refill, full) = (b.unit(), b.refill(), b.full());
    let (mut level, updated) = match state {
        Some(s) => {
            let elapsed = now.saturating_sub(s.updated);
            let missing = full - s.level.min(full);
            let level = if elapsed >= missing.div_ceil(refill) {
                full
            } else {
                s.level + elapsed * refill
            };
            (level, s.updated.max(now))
        }
        None => (full, now),
    };
    let need = cost * unit;
    let allowed = level >= need;
    let retry = if allowed {
        level -= need;
        None
    } else {
        Some((updated - now) + (need - level).div_ceil(refill))
    };
    let reset = (updated - now) + (full - level).div_ceil(refill);
    (
        Decision::from_store(allowed, b.capacity(), level / unit, reset, retry),
        TokenBucketState { level, updated },
        reset,
    )
}
