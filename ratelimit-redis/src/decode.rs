//! Decoding a script's reply into a [`Decision`].

use ratelimit_core::model::Charge;
use ratelimit_core::{Decision, StoreError};

/// Builds the decision from a script reply
/// `[allowed, remaining, reset_after_us, retry_after_us or -1]` (see
/// [`crate::scripts`]). `limit` is the quota's [`ratelimit_core::Quota::limit`].
///
/// A reply of another shape is a non-transient error: the key holds
/// something else, or the server ran another script.
///
/// ```
/// let d = ratelimit_redis::decode::decision(&[0, 0, 5_000, 1_000], 10).unwrap();
/// assert!(!d.allowed);
/// assert_eq!(d.retry_after, Some(std::time::Duration::from_millis(1)));
/// ```
pub fn decision(reply: &[i64], limit: u64) -> Result<Decision, StoreError> {
    let bad = || {
        StoreError::message(
            format!("unexpected rate-limit script reply {reply:?}"),
            false,
        )
    };
    let &[allowed, remaining, reset, retry] = reply else {
        return Err(bad());
    };
    let allowed = match allowed {
        0 => false,
        1 => true,
        _ => return Err(bad()),
    };
    let remaining = u64::try_from(remaining).map_err(|_| bad())?;
    let reset = u64::try_from(reset).map_err(|_| bad())?;
    let retry = match (allowed, retry) {
        (true, -1) => None,
        (false, r) if r > 0 => Some(r.unsigned_abs()),
        _ => return Err(bad()),
    };
    if remaining > limit {
        return Err(bad());
    }
    Ok(Decision::from_store(
        allowed, limit, remaining, reset, retry,
    ))
}

/// Builds the decisions from a [`crate::scripts::MULTI`] reply: 4
/// integers per charge, in order, each group as [`decision`] takes it.
///
/// A reply of another length is a non-transient error.
///
/// ```
/// use ratelimit_core::model::Charge;
/// use ratelimit_core::{Quota, Rate};
/// let q = Quota::fixed_window(Rate::per_second(10)).unwrap();
/// let charges = [Charge::new(&q, 1), Charge::new(&q, 2)];
/// let d = ratelimit_redis::decode::decisions(&[1, 9, 5, -1, 0, 8, 5, 5], &charges).unwrap();
/// assert!(d[0].allowed && !d[1].allowed);
/// ```
pub fn decisions(reply: &[i64], charges: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
    if reply.len() != 4 * charges.len() {
        return Err(StoreError::message(
            format!(
                "unexpected rate-limit script reply: {} integers for {} quotas",
                reply.len(),
                charges.len()
            ),
            false,
        ));
    }
    reply
        .chunks_exact(4)
        .zip(charges)
        .map(|(r, c)| decision(r, c.quota.limit()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_malformed_replies() {
        assert!(decision(&[1, 2, 3], 5).is_err());
        assert!(decision(&[2, 0, 0, -1], 5).is_err());
        assert!(decision(&[1, 0, 0, 7], 5).is_err());
        assert!(decision(&[0, 0, 0, -1], 5).is_err());
        assert!(decision(&[1, 6, 0, -1], 5).is_err());
        assert!(decision(&[1, -1, 0, -1], 5).is_err());
        let d = decision(&[1, 4, 100, -1], 5).unwrap();
        assert!(d.allowed && d.retry_after.is_none() && d.remaining == 4);
    }
}
