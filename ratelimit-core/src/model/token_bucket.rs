use crate::clock::Micros;
use crate::decision::Decision;
use crate::quota::Bucket;

/// Token bucket state: one number, the bucket's *theoretical arrival time*
/// (GCRA): the instant at which the bucket is full again,
/// `tat + rem / refill` microseconds since the epoch, exactly.
///
/// With `refill` units gained per microsecond (see [`crate::Bucket`]), the
/// bucket at time `now` is short of full by `d = (tat - now) * refill + rem`
/// units when that is positive, and full otherwise. `rem < refill`, so when
/// the rate is a whole number of microseconds per token (`refill == 1`, as
/// for 100 per minute, 10 per second, 1000 per second) `rem` is always 0 and
/// the state is the single integer `tat`.
///
/// Keeping the time in whole microseconds and the sub-microsecond part
/// apart is what keeps every value below 2^53: the product `now * refill`
/// (1.8e15 µs times up to 2^53 units per µs) is never formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenBucketState {
    /// Whole microseconds since the epoch of the instant the bucket is full
    /// again.
    pub tat: Micros,
    /// The sub-microsecond part of that instant, in bucket units
    /// (`0 <= rem < refill`; a larger value, written under another rate, is
    /// read as `refill - 1`).
    pub rem: u64,
}

/// `ceil(x / r)` for a signed `x` and `r > 0`.
fn ceil_div(x: i64, r: i64) -> i64 {
    let q = x.div_euclid(r);
    if x.rem_euclid(r) > 0 { q + 1 } else { q }
}

/// GCRA in exact integer units. The bucket is short of full by
/// `d = (tat - now) * refill + rem` units (0 when that is not positive; a
/// fresh caller is full). Admitted iff `d + cost * unit <= full`; then the
/// theoretical arrival time moves `cost * unit` units later. A denial
/// returns the stored state unchanged (a store writes nothing).
///
/// **A clock that steps back** finds the bucket as it was at that earlier
/// instant with everything admitted since still spent: `d` grows by the
/// step times `refill`, so the level can be below empty (then every call is
/// denied, with a `retry_after` that includes the step). Nothing is ever
/// refilled for time that has not passed, and a step back never admits more
/// than the latest instant seen would.
///
/// No value formed exceeds `full + refill <= 2^52` (the stored `tat` is at
/// most `now + full`, below 2^53 for `now` below `MAX_TIME`): `d` is compared
/// through `tat - now <= (full - need - rem) / refill` rather than formed,
/// and the retry is `(tat - now) + ceil((rem + need - full) / refill)`.
///
/// Inlined into callers (the local store's compare-and-swap loop) so the
/// decision is built in place rather than returned through memory.
#[inline(always)]
pub(super) fn step(
    b: &Bucket,
    state: Option<TokenBucketState>,
    now: Micros,
    cost: u64,
) -> (Decision, TokenBucketState, Micros) {
    let (unit, refill, full) = (b.unit(), b.refill(), b.full());
    let need = cost * unit;
    if refill == 1 {
        return whole_micros(b, state, now, need);
    }
    // (delta, rho): the shortfall d = delta * refill + rho, 0 when full.
    let (delta, rho) = match state {
        Some(s) => {
            let rho = s.rem.min(refill - 1);
            if s.tat > now || (s.tat == now && rho > 0) {
                (s.tat - now, rho)
            } else {
                (0, 0)
            }
        }
        None => (0, 0),
    };
    let room = full - need;
    let allowed = rho <= room && delta <= (room - rho) / refill;
    if allowed {
        // d + need <= full: exact.
        let d = delta * refill + rho + need;
        let (whole, rem) = (d / refill, d % refill);
        let reset = whole + u64::from(rem > 0);
        let decision = Decision::from_store(true, b.capacity(), (full - d) / unit, reset, None);
        return (
            decision,
            TokenBucketState {
                tat: now + whole,
                rem,
            },
            reset,
        );
    }
    // Denied: some state exists (a full bucket admits any valid cost).
    let level = if rho <= full && delta <= (full - rho) / refill {
        full - delta * refill - rho
    } else {
        0
    };
    let reset = delta + u64::from(rho > 0);
    // full, need, rho < 2^53: the signed numerator fits an i64.
    let x = rho as i64 + need as i64 - full as i64;
    let retry = (delta as i64 + ceil_div(x, refill as i64)) as u64;
    let decision = Decision::from_store(false, b.capacity(), level / unit, reset, Some(retry));
    (decision, state.unwrap_or_default(), reset)
}

/// [`step`] for `refill == 1` (a whole number of µs per token, the common
/// case): `rem` is always 0 and the shortfall is `tat - now` itself, so the
/// same arithmetic needs no division by `refill`.
#[inline(always)]
fn whole_micros(
    b: &Bucket,
    state: Option<TokenBucketState>,
    now: Micros,
    need: u64,
) -> (Decision, TokenBucketState, Micros) {
    let (unit, full) = (b.unit(), b.full());
    let delta = match state {
        Some(s) if s.tat > now => s.tat - now,
        _ => 0,
    };
    if delta + need <= full {
        let d = delta + need;
        let decision = Decision::from_store(true, b.capacity(), (full - d) / unit, d, None);
        return (
            decision,
            TokenBucketState {
                tat: now + d,
                rem: 0,
            },
            d,
        );
    }
    let level = full.saturating_sub(delta);
    let retry = delta + need - full;
    let decision = Decision::from_store(false, b.capacity(), level / unit, delta, Some(retry));
    (decision, state.unwrap_or_default(), delta)
}
