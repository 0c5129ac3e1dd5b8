//! Decoding a script's reply into a [`Decision`].

use ratelimit_core::model::Charge;
use ratelimit_core::store::Decisions;
use ratelimit_core::{Algorithm, Decision, Quota, StoreError};

/// What decoding needs of a quota: its limit, and the units the scripts
/// answer its remaining in (a token bucket's remaining comes in bucket
/// units, [`ratelimit_core::Bucket::unit`] to a token: the script never
/// divides, one argument fewer on every call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// The quota's [`Quota::limit`].
    pub limit: u64,
    /// Reply units per unit of `limit`: 1 for a window, the bucket's unit
    /// for a token bucket.
    pub unit: u64,
}

impl Limit {
    /// The limit of `quota`.
    pub fn of(quota: &Quota) -> Self {
        let unit = match quota.algorithm() {
            Algorithm::TokenBucket(b) => b.unit(),
            _ => 1,
        };
        Self {
            limit: quota.limit(),
            unit,
        }
    }

    /// A limit counted in whole units (a window's).
    pub const fn whole(limit: u64) -> Self {
        Self { limit, unit: 1 }
    }
}

/// Builds the decision from a script reply
/// `[allowed, remaining, reset_after_us, retry_after_us or -1]` (see
/// [`crate::scripts`]) for a quota of `limit` ([`Limit::of`] the quota).
///
/// A reply of another shape is a non-transient error: the key holds
/// something else, or the server ran another script.
///
/// ```
/// use ratelimit_redis::decode::{decision, Limit};
/// let d = decision(&[0, 0, 5_000, 1_000], Limit::whole(10)).unwrap();
/// assert!(!d.allowed);
/// assert_eq!(d.retry_after, Some(std::time::Duration::from_millis(1)));
/// // A token bucket's remaining comes in bucket units.
/// let d = decision(&[1, 2_500, 5_000, -1], Limit { limit: 10, unit: 1_000 }).unwrap();
/// assert_eq!(d.remaining, 2);
/// ```
pub fn decision(reply: &[i64], limit: Limit) -> Result<Decision, StoreError> {
    let Limit { limit, unit } = limit;
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
    let remaining = u64::try_from(remaining).map_err(|_| bad())? / unit.max(1);
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

/// A single token-bucket call's admission as the four integers
/// [`decision`] takes: the script returns one integer instead (see
/// [`crate::scripts`]; a table and its conversion cost the server about
/// 1 µs a call), `d`, the bucket units the bucket is short of full with
/// this request. `refill` is the units a µs, `full` the capacity in units
/// (the quota's single-script arguments). A denial comes as the four
/// (its shortfall need not be exact in Lua's doubles).
///
/// A value no admission of these numbers could give (negative, or more
/// than a full bucket) is a non-transient error.
///
/// ```
/// use ratelimit_redis::decode::token_bucket;
/// // A bucket of 10 tokens of 1,000 units, 2 units a µs (2 tokens a ms).
/// // Admitted, 3,000 units short of full: 7 tokens left, full in 1.5 ms.
/// assert_eq!(token_bucket(3_000, 2, 10_000).unwrap(), [1, 7_000, 1_500, -1]);
/// assert_eq!(token_bucket(3_001, 2, 10_000).unwrap(), [1, 6_999, 1_501, -1]);
/// assert!(token_bucket(-1, 2, 10_000).is_err());
/// assert!(token_bucket(10_001, 2, 10_000).is_err());
/// ```
pub fn token_bucket(packed: i64, refill: u64, full: u64) -> Result<[i64; 4], StoreError> {
    let bad = || {
        StoreError::message(
            format!("unexpected rate-limit script reply {packed} (token bucket)"),
            false,
        )
    };
    let short = u64::try_from(packed).map_err(|_| bad())?;
    if short > full {
        return Err(bad());
    }
    let reset = short.div_ceil(refill.max(1));
    let int = |n: u64| i64::try_from(n).map_err(|_| bad());
    Ok([1, int(full - short)?, int(reset)?, -1])
}

/// A script's reply as redis-rs reads it: an array of integers, or one
/// integer (a single token-bucket call's, see [`token_bucket`]) as an
/// array of one. (fred reads one integer as an array of one itself.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Integers(pub Vec<i64>);

impl redis::FromRedisValue for Integers {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        match v {
            redis::Value::Int(n) => Ok(Self(vec![n])),
            v => Vec::<i64>::from_redis_value(v).map(Self),
        }
    }
}

/// Builds the decisions of one request of a [`crate::scripts::BATCH`]
/// reply: 4 integers per charge, in order, each group as [`decision`]
/// takes it.
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
    let limits: Vec<Limit> = charges.iter().map(|c| Limit::of(c.quota)).collect();
    for_limits(reply, &limits).map(|d| d.to_vec())
}

/// As [`decisions`], from each quota's [`Limit`]: one request's decisions,
/// held inline for one quota.
///
/// ```
/// use ratelimit_redis::decode::{for_limits, Limit};
/// let d = for_limits(&[1, 9, 5, -1], &[Limit::whole(10)]).unwrap();
/// assert!(d[0].allowed);
/// assert!(for_limits(&[1, 9, 5, -1], &[Limit::whole(10); 2]).is_err());
/// ```
pub fn for_limits(reply: &[i64], limits: &[Limit]) -> Result<Decisions, StoreError> {
    match limits {
        [limit] => decision(reply, *limit).map(Decisions::one),
        _ if reply.len() != 4 * limits.len() => Err(StoreError::message(
            format!(
                "unexpected rate-limit script reply: {} integers for {} quotas",
                reply.len(),
                limits.len()
            ),
            false,
        )),
        _ => reply
            .chunks_exact(4)
            .zip(limits)
            .map(|(r, &limit)| decision(r, limit))
            .collect(),
    }
}

/// One request's outcome in a batch reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome<'a> {
    /// Decided: per quota, its 4 integers, or one (an admitting token
    /// bucket of an admitted request, see [`batch`]); for
    /// [`crate::scripts::Request::decisions`].
    Decided(&'a [i64]),
    /// Past its deadline: nothing written.
    Expired,
}

/// How many integers a quota's answer in a batch reply takes, from its
/// first: 4 (allowed first: 0 or 1), or 1 (`-2 - d`: an admitting token
/// bucket, `d` the units it is short of full).
fn width(first: i64) -> Option<usize> {
    match first {
        0 | 1 => Some(4),
        i64::MIN..=-2 => Some(1),
        _ => None,
    }
}

/// Splits a [`crate::scripts::BATCH`] reply into each request's outcome
/// (`quotas[i]` quotas for request `i`) and the server's `TIME`.
///
/// A reply of another shape is a non-transient error.
///
/// Each request's outcome is `-1` alone (expired) or, per quota, its 4
/// integers (allowed first: 0 or 1) or, for a token bucket that admits a
/// request that is admitted, one: `-2 - d`, where `d` is the units the
/// bucket is short of full ([`crate::scripts::Request::decisions`] decodes the
/// four of it; most batched decisions are admissions, and a fourth of the
/// integers costs the server and the client less).
///
/// ```
/// use ratelimit_redis::decode::{Outcome, batch};
/// let reply = [1, 9, 5, -1, -1, 0, 0, 7, 40, -3_002, 77];
/// let (outcomes, now) = batch(&reply, &[1, 1, 1, 1]).unwrap();
/// assert_eq!(
///     outcomes,
///     vec![
///         Outcome::Decided(&[1, 9, 5, -1]),
///         Outcome::Expired,
///         Outcome::Decided(&[0, 0, 7, 40]),
///         Outcome::Decided(&[-3_002]),
///     ]
/// );
/// assert_eq!(now, 77);
/// ```
pub fn batch<'a>(
    reply: &'a [i64],
    quotas: &[usize],
) -> Result<(Vec<Outcome<'a>>, i64), StoreError> {
    let bad = || {
        StoreError::message(
            format!(
                "unexpected rate-limit batch reply of {} integers for {} requests",
                reply.len(),
                quotas.len()
            ),
            false,
        )
    };
    let (&server_now, mut rest) = reply.split_last().ok_or_else(bad)?;
    let mut out = Vec::with_capacity(quotas.len());
    for &n in quotas {
        if rest.first() == Some(&-1) {
            out.push(Outcome::Expired);
            rest = &rest[1..];
            continue;
        }
        if n == 0 {
            return Err(bad());
        }
        let mut len = 0;
        for _ in 0..n {
            let w = rest.get(len).copied().and_then(width).ok_or_else(bad)?;
            len += w;
        }
        let (this, after) = rest.split_at_checked(len).ok_or_else(bad)?;
        out.push(Outcome::Decided(this));
        rest = after;
    }
    if !rest.is_empty() {
        return Err(bad());
    }
    Ok((out, server_now))
}

/// Takes one quota's answer off the front of `rest` (a request's answer in
/// a batch reply, see [`batch`]) as the four integers [`decision`] takes:
/// the four as they came, or the four of a token bucket's one integer
/// (`-2 - d`) from `bucket`, its `(refill, full)` in units (`None` for a
/// window, which never answers with one).
///
/// An answer of another shape is a non-transient error.
///
/// ```
/// use ratelimit_redis::decode::take_four;
/// // A window's four, then a bucket of 10,000 units refilling 2 a µs,
/// // admitted 3,000 units short of full.
/// let mut rest = &[1, 9, 5, -1, -3_002][..];
/// assert_eq!(take_four(&mut rest, None).unwrap(), [1, 9, 5, -1]);
/// assert_eq!(take_four(&mut rest, Some((2, 10_000))).unwrap(), [1, 7_000, 1_500, -1]);
/// assert!(rest.is_empty());
/// assert!(take_four(&mut &[-3_002][..], None).is_err());
/// ```
pub fn take_four(rest: &mut &[i64], bucket: Option<(u64, u64)>) -> Result<[i64; 4], StoreError> {
    let first = *rest.first().ok_or_else(|| bad_batch_answer(rest))?;
    match (width(first), bucket) {
        (Some(1), Some((refill, full))) => {
            let four = token_bucket(-2 - first, refill, full)?;
            *rest = &rest[1..];
            Ok(four)
        }
        (Some(4), _) => {
            let (&four, after) = rest
                .split_first_chunk::<4>()
                .ok_or_else(|| bad_batch_answer(rest))?;
            *rest = after;
            Ok(four)
        }
        _ => Err(bad_batch_answer(rest)),
    }
}

/// The error for a batch answer of another shape than [`batch`] describes:
/// not transient (the script and the client disagree).
pub(crate) fn bad_batch_answer(answer: &[i64]) -> StoreError {
    StoreError::message(
        format!("unexpected rate-limit batch answer {answer:?}"),
        false,
    )
}

/// A script's reply, split (see [`crate::scripts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    /// The script decided: 4 integers per quota, for [`decision`] or
    /// [`decisions`], and the server's `TIME` in µs if the script read it.
    Decided {
        /// 4 integers per quota.
        decisions: &'a [i64],
        /// The server's `TIME` in µs, as the script read it.
        server_now: Option<i64>,
    },
    /// The server's `TIME` was past the call's deadline: the script read and
    /// wrote nothing.
    Expired {
        /// The server's `TIME` in µs.
        server_now: i64,
    },
}

/// Splits a raw script reply: `{-1, server µs}` (expired), or a multiple
/// of 4 integers, followed by the server's µs when the call asked for it.
///
/// ```
/// use ratelimit_redis::decode::{Reply, split};
/// assert_eq!(split(&[-1, 7]).unwrap(), Reply::Expired { server_now: 7 });
/// let Reply::Decided { decisions, server_now } = split(&[1, 4, 100, -1, 7]).unwrap() else {
///     panic!()
/// };
/// assert_eq!((decisions, server_now), (&[1, 4, 100, -1][..], Some(7)));
/// assert!(matches!(split(&[1, 4, 100, -1]).unwrap(), Reply::Decided { server_now: None, .. }));
/// ```
pub fn split(reply: &[i64]) -> Result<Reply<'_>, StoreError> {
    match reply {
        &[-1, server_now] => Ok(Reply::Expired { server_now }),
        decisions if !decisions.is_empty() && decisions.len() % 4 == 0 => Ok(Reply::Decided {
            decisions,
            server_now: None,
        }),
        [decisions @ .., last] if !decisions.is_empty() && decisions.len() % 4 == 0 => {
            Ok(Reply::Decided {
                decisions,
                server_now: (*last > 0).then_some(*last),
            })
        }
        _ => Err(StoreError::message(
            format!("unexpected rate-limit script reply {reply:?}"),
            false,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_malformed_replies() {
        assert!(decision(&[1, 2, 3], Limit::whole(5)).is_err());
        assert!(decision(&[2, 0, 0, -1], Limit::whole(5)).is_err());
        assert!(decision(&[1, 0, 0, 7], Limit::whole(5)).is_err());
        assert!(decision(&[0, 0, 0, -1], Limit::whole(5)).is_err());
        assert!(decision(&[1, 6, 0, -1], Limit::whole(5)).is_err());
        assert!(decision(&[1, -1, 0, -1], Limit::whole(5)).is_err());
        let d = decision(&[1, 4, 100, -1], Limit::whole(5)).unwrap();
        assert!(d.allowed && d.retry_after.is_none() && d.remaining == 4);
    }

    #[test]
    fn splits_replies() {
        assert!(split(&[]).is_err());
        assert!(split(&[1, 2, 3]).is_err());
        assert!(split(&[1, 2, 3, 4, 5, 6]).is_err());
        assert!(split(&[-1]).is_err());
        assert_eq!(
            split(&[1, 2, 3, -1, -1]).unwrap(),
            Reply::Decided {
                decisions: &[1, 2, 3, -1],
                server_now: None
            }
        );
        assert!(matches!(
            split(&[1, 2, 3, -1, 0, 2, 3, 4, 9]).unwrap(),
            Reply::Decided { decisions, server_now: Some(9) } if decisions.len() == 8
        ));
    }
}
