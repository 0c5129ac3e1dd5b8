//! The token bucket's lock-free step: read one word, decide with the model,
//! publish the new state with one compare-and-swap.
//!
//! Generic over the atomic word so that `loom` can run it: under
//! `--cfg loom` the tests below explore every interleaving of concurrent
//! steps on a `loom` atomic and prove that no update is lost (and that a
//! step which loads and stores instead of swapping is caught, every time).
//! Run them with
//! `RUSTFLAGS="--cfg loom" cargo test -p ratelimit-local --release --lib cas`.

use std::sync::atomic::Ordering;

use ratelimit_core::{Bucket, Decision, Micros, model};

use crate::packed::{pack, unpack};

/// An atomic 64-bit word: `std`'s, or `loom`'s under `cfg(loom)`.
pub(crate) trait Word {
    fn load(&self, order: Ordering) -> u64;
    fn compare_exchange_weak(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64>;
}

impl Word for std::sync::atomic::AtomicU64 {
    #[inline(always)]
    fn load(&self, order: Ordering) -> u64 {
        std::sync::atomic::AtomicU64::load(self, order)
    }
    #[inline(always)]
    fn compare_exchange_weak(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        std::sync::atomic::AtomicU64::compare_exchange_weak(self, current, new, success, failure)
    }
}

#[cfg(loom)]
impl Word for loom::sync::atomic::AtomicU64 {
    fn load(&self, order: Ordering) -> u64 {
        loom::sync::atomic::AtomicU64::load(self, order)
    }
    fn compare_exchange_weak(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        loom::sync::atomic::AtomicU64::compare_exchange_weak(self, current, new, success, failure)
    }
}

/// One token bucket step on a one-word state: read, decide with the model,
/// and on admission publish the new state with one compare-and-swap
/// (retried from the value found if another call got there first). A
/// denial writes nothing.
///
/// The caller has checked that the bucket's rate and `now` pack
/// (`crate::packed::packs`); the model keeps `rem < refill` and
/// `tat < 2^54`, so the new state packs too.
#[inline]
pub(crate) fn bucket_step<W: Word>(word: &W, b: &Bucket, now: Micros, cost: u64) -> Decision {
    match bucket_try(word, b, now, cost) {
        Ok(decision) => decision,
        Err(read) => denied(read, b, now, cost),
    }
}

/// [`bucket_step`], leaving the decision of a denial to the caller: `Err`
/// with the word read, which the caller turns into its decision with
/// [`denied`] once it has released the lock it holds on the word's map, so
/// that the lock is held for a load and the admission test, not for
/// building a denial's decision (the model is inlined: what only the
/// denial's decision needs is not computed here).
#[inline(always)]
pub(crate) fn bucket_try<W: Word>(
    word: &W,
    b: &Bucket,
    now: Micros,
    cost: u64,
) -> Result<Decision, u64> {
    let mut current = word.load(Ordering::Acquire);
    loop {
        let (decision, next, _) = model::token_bucket_step(b, Some(unpack(current)), now, cost);
        if !decision.allowed {
            return Err(current);
        }
        match word.compare_exchange_weak(current, pack(next), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(decision),
            Err(actual) => current = actual,
        }
    }
}

/// The decision of a denial found by [`bucket_try`] on the word `read`.
#[inline(always)]
pub(crate) fn denied(read: u64, b: &Bucket, now: Micros, cost: u64) -> Decision {
    model::token_bucket_step(b, Some(unpack(read)), now, cost).0
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicU64;
    use ratelimit_core::model::TokenBucketState;
    use ratelimit_core::{Algorithm, Quota, Rate};

    const NOW: Micros = 1_800_000_000_000_000;

    /// A bucket of 2 tokens refilling one per minute: nothing refills
    /// while the model runs (the clock is frozen).
    fn bucket() -> Bucket {
        let q = Quota::token_bucket(Rate::per_minute(1), 2).unwrap();
        match q.algorithm() {
            Algorithm::TokenBucket(b) => *b,
            _ => unreachable!(),
        }
    }

    /// A full bucket's word (a fresh caller's state).
    fn full() -> u64 {
        pack(TokenBucketState { tat: NOW, rem: 0 })
    }

    /// Three callers race for the two tokens: in every interleaving loom
    /// can produce, exactly two are admitted and the word ends holding two
    /// tokens' worth spent.
    #[test]
    fn racing_steps_never_lose_an_update() {
        loom::model(|| {
            let b = bucket();
            let word = Arc::new(AtomicU64::new(full()));
            let spawn = |word: Arc<AtomicU64>| {
                loom::thread::spawn(move || u64::from(bucket_step(&*word, &b, NOW, 1).allowed))
            };
            let t1 = spawn(word.clone());
            let t2 = spawn(word.clone());
            let mine = u64::from(bucket_step(&*word, &b, NOW, 1).allowed);
            let admitted = mine + t1.join().unwrap() + t2.join().unwrap();
            assert_eq!(
                admitted, 2,
                "a lost update admitted more than the bucket holds"
            );
            let end = unpack(word.load(Ordering::SeqCst));
            assert_eq!(end.tat, NOW + 2 * b.unit() / b.refill());
        });
    }

    /// A step that loads, decides and stores (no compare-and-swap): the
    /// same model finds the interleaving that loses an update.
    fn racy_step(word: &AtomicU64, b: &Bucket, now: Micros, cost: u64) -> Decision {
        let current = word.load(Ordering::Acquire);
        let (decision, next, _) = model::token_bucket_step(b, Some(unpack(current)), now, cost);
        if decision.allowed {
            word.store(pack(next), Ordering::Release);
        }
        decision
    }

    #[test]
    #[should_panic(expected = "a lost update")]
    fn a_lost_update_is_found() {
        loom::model(|| {
            let b = bucket();
            let word = Arc::new(AtomicU64::new(full()));
            let spawn = |word: Arc<AtomicU64>| {
                loom::thread::spawn(move || u64::from(racy_step(&word, &b, NOW, 1).allowed))
            };
            let t1 = spawn(word.clone());
            let t2 = spawn(word.clone());
            let mine = u64::from(racy_step(&word, &b, NOW, 1).allowed);
            let admitted = mine + t1.join().unwrap() + t2.join().unwrap();
            assert_eq!(
                admitted, 2,
                "a lost update admitted more than the bucket holds"
            );
        });
    }
}
