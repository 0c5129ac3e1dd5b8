//! A token bucket's state in one 64-bit word, for the map whose entries
//! are updated by compare-and-swap ([`crate::cas`]): the theoretical
//! arrival time and its sub-µs remainder, `tat << 10 | rem`, and which
//! buckets and clock times fit.

use ratelimit_core::model::TokenBucketState;
use ratelimit_core::{Bucket, Micros};

/// Bits of a packed bucket word that hold the sub-µs remainder.
pub(crate) const REM_BITS: u32 = 10;
/// Rates of at most this many bucket units per µs keep their remainder in
/// the packed word (1e9 per second is 1,000; whole µs per token is 1).
pub(crate) const PACK_MAX_REFILL: u64 = 1 << REM_BITS;
/// Clock times below this pack: `tat` then stays below 2^54 (the model adds
/// at most `full < 2^53` to `now`), which leaves the word's low
/// [`REM_BITS`] bits to the remainder.
pub(crate) const PACK_BEFORE: Micros = 1 << 53;

/// A token bucket's state as one word: `tat << REM_BITS | rem`.
#[inline]
pub(crate) fn pack(s: TokenBucketState) -> u64 {
    (s.tat << REM_BITS) | s.rem
}

/// The state a packed word holds.
#[inline]
pub(crate) fn unpack(word: u64) -> TokenBucketState {
    TokenBucketState {
        tat: word >> REM_BITS,
        rem: word & (PACK_MAX_REFILL - 1),
    }
}

/// Whether a token bucket's state packs into one word at `now`: its rate
/// keeps the sub-µs remainder in [`REM_BITS`] bits and `now` is below
/// [`PACK_BEFORE`].
#[inline]
pub(crate) fn packs(b: &Bucket, now: Micros) -> bool {
    b.refill() <= PACK_MAX_REFILL && now < PACK_BEFORE
}
