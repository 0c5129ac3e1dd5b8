use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::quota::Rate;

const T0: u64 = 1_800_000_000_000_000; // a minute boundary

fn run(q: &Quota, calls: &[(u64, u64)]) -> Vec<Decision> {
    let mut state = None;
    calls
        .iter()
        .map(|&(t, c)| {
            let s = decide(q, state.take(), t, c).unwrap();
            state = Some(s.state);
            s.decision
        })
        .collect()
}

#[test]
fn fixed_window_boundary_burst_admits_twice_the_limit() {
    let q = Quota::fixed_window(Rate::per_minute(100)).unwrap();
    let mut calls = vec![(T0 - 1_000_000, 1); 101];
    calls.extend(vec![(T0, 1); 101]);
    let d = run(&q, &calls);
    assert_eq!(d.iter().filter(|d| d.allowed).count(), 200);
    assert_eq!(d[100].retry_after, Some(Duration::from_secs(1)));
}

#[test]
fn sliding_window_weighs_the_previous_window() {
    let q = Quota::sliding_window(Rate::per_minute(100)).unwrap();
    let mut calls = vec![(T0 - 1_000_000, 1); 100];
    // 15 s into the next window the previous 100 weigh 75.
    calls.extend(vec![(T0 + 15_000_000, 1); 30]);
    let d = run(&q, &calls);
    assert_eq!(d[100..].iter().filter(|d| d.allowed).count(), 25);
    // The 26th extra call needs prev weight <= 74: e' = 60 - floor(74*60/100) s.
    let denied = &d[125];
    assert!(!denied.allowed);
    assert_eq!(
        denied.retry_after,
        Some(Duration::from_micros(
            60_000_000 - 74 * 60_000_000 / 100 - 15_000_000
        ))
    );
}

#[test]
fn sliding_log_is_exact_in_the_trailing_window() {
    let q = Quota::sliding_log(Rate::per_minute(3)).unwrap();
    let d = run(
        &q,
        &[
            (T0, 1),
            (T0 + 10, 2),
            (T0 + 20, 1),
            (T0 + 60_000_000, 1),
            (T0 + 60_000_009, 1),
            (T0 + 60_000_010, 1),
        ],
    );
    let allowed: Vec<_> = d.iter().map(|d| d.allowed).collect();
    assert_eq!(allowed, [true, true, false, true, false, true]);
    assert_eq!(
        d[2].retry_after,
        Some(Duration::from_micros(60_000_000 - 20))
    );
    assert_eq!(d[4].retry_after, Some(Duration::from_micros(1)));
}

#[test]
fn token_bucket_rate_and_burst() {
    let q = Quota::token_bucket(Rate::per_minute(100), 20).unwrap();
    let d = run(&q, &vec![(T0, 1); 21]);
    assert_eq!(d.iter().filter(|d| d.allowed).count(), 20);
    assert_eq!(d[19].remaining, 0);
    assert_eq!(d[20].retry_after, Some(Duration::from_millis(600)));
    assert_eq!(d[19].reset_after, Duration::from_secs(12));
}

#[test]
fn costs_that_can_never_pass_are_errors() {
    let q = Quota::token_bucket(Rate::per_second(10), 5).unwrap();
    assert!(decide(&q, None, T0, 6).is_err());
    assert!(decide(&q, None, T0, 0).is_err());
}

fn quotas() -> impl Strategy<Value = Quota> {
    (1u64..=12, 1u64..=5_000_000, 1u64..=8, 0..4usize).prop_map(|(limit, window, burst, k)| {
        let rate = Rate::new(limit, Duration::from_micros(window));
        match k {
            0 => Quota::fixed_window(rate),
            1 => Quota::sliding_window(rate),
            2 => Quota::sliding_log(rate),
            _ => Quota::token_bucket(rate, burst),
        }
        .unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Contract 6 on the model itself: the same call at now + retry_after is
    /// admitted and one microsecond earlier it is not; and after the TTL the
    /// state behaves as a fresh caller's.
    #[test]
    fn retry_after_is_exact_and_ttl_is_fresh(
        q in quotas(),
        calls in prop::collection::vec((0u64..3_000_000, 1u64..=12), 1..40),
    ) {
        let mut state = None;
        let mut now = T0;
        for (dt, cost) in calls {
            now += dt;
            let cost = cost.min(q.limit());
            let step = decide(&q, state.clone(), now, cost).unwrap();
            if let Some(retry) = step.decision.retry_after {
                let retry = u64::try_from(retry.as_micros()).unwrap();
                prop_assert!(retry > 0);
                let later = decide(&q, state.clone(), now + retry, cost).unwrap();
                prop_assert!(later.decision.allowed, "not admitted at now + retry_after");
                let earlier = decide(&q, state.clone(), now + retry - 1, cost).unwrap();
                prop_assert!(!earlier.decision.allowed, "admitted one tick early");
            } else {
                prop_assert!(step.decision.allowed);
            }
            let at = now + step.ttl;
            let aged = decide(&q, Some(step.state.clone()), at, cost).unwrap();
            let fresh = decide(&q, None, at, cost).unwrap();
            prop_assert_eq!(aged.decision, fresh.decision, "state not fresh after its TTL");
            state = Some(step.state);
        }
    }
}

/// Regression: a policy whose limit is lowered under the same name finds
/// stored state above the new limit. No underflow, no product past 2^53.
#[test]
fn state_above_a_lowered_limit_is_clamped() {
    let big = Quota::sliding_log(Rate::per_minute(10)).unwrap();
    let small = Quota::sliding_log(Rate::per_minute(3)).unwrap();
    let mut state = None;
    for _ in 0..10 {
        state = Some(decide(&big, state, T0, 1).unwrap().state);
    }
    let d = decide(&small, state, T0 + 1, 1).unwrap().decision;
    assert!(!d.allowed);
    assert_eq!(d.remaining, 0);
    assert_eq!(d.retry_after, Some(Duration::from_micros(60_000_000 - 1)));

    let big = Quota::sliding_window(Rate::per_minute(1_000)).unwrap();
    let edge = Quota::sliding_window(Rate::new(
        crate::MAX_EXACT / 60_000_000,
        Duration::from_secs(60),
    ))
    .unwrap();
    let tiny = Quota::sliding_window(Rate::per_minute(2)).unwrap();
    let s = decide(&big, None, T0, 1_000).unwrap().state;
    let d = decide(&tiny, Some(s.clone()), T0 + 60_000_001, 1)
        .unwrap()
        .decision;
    assert!(!d.allowed);
    assert_eq!(d.remaining, 0);
    // Counted as the limit (2), prev weighs 2 * (W - e) / W: one more call
    // fits once that is 1, half-way through the window.
    assert_eq!(d.retry_after, Some(Duration::from_micros(29_999_999)));
    assert!(decide(&edge, Some(s), T0 + 60_000_001, 1).is_ok());
}

/// A token bucket written the plain way, in u128: level and last update,
/// refilled by `elapsed * refill` up to full. For a clock that never steps
/// back, the one-number state must decide exactly as this does.
fn plain_bucket(q: &Quota, calls: &[(u64, u64)]) -> Vec<Decision> {
    let crate::Algorithm::TokenBucket(b) = q.algorithm() else {
        panic!("not a token bucket")
    };
    let (unit, refill, full) = (
        u128::from(b.unit()),
        u128::from(b.refill()),
        u128::from(b.full()),
    );
    let (mut level, mut updated) = (full, 0u128);
    let mut out = Vec::new();
    for (i, &(t, cost)) in calls.iter().enumerate() {
        let t = u128::from(t);
        if i > 0 {
            level = full.min(level + (t - updated) * refill);
        }
        updated = t;
        let need = u128::from(cost) * unit;
        let allowed = level >= need;
        let retry = if allowed {
            level -= need;
            None
        } else {
            Some(u64::try_from((need - level).div_ceil(refill)).unwrap())
        };
        let reset = u64::try_from((full - level).div_ceil(refill)).unwrap();
        out.push(Decision::from_store(
            allowed,
            b.capacity(),
            u64::try_from(level / unit).unwrap(),
            reset,
            retry,
        ));
    }
    out
}

fn any_bucket() -> impl Strategy<Value = Quota> {
    prop_oneof![
        (1u64..=12, 1u64..=5_000_000, 1u64..=8).prop_map(|(n, p, burst)| {
            Quota::token_bucket(Rate::new(n, Duration::from_micros(p)), burst).unwrap()
        }),
        // The edge of the exact range: huge refills, a full bucket near 2^53.
        (1u64..=1_000_000_000_000, 1u64..=86_400_000_000, 0u64..3).prop_map(|(n, p, slack)| {
            let rate = Rate::new(n, Duration::from_micros(p));
            let probe = Quota::token_bucket(rate, 1).unwrap();
            let crate::Algorithm::TokenBucket(b) = probe.algorithm() else {
                unreachable!()
            };
            let burst = ((crate::MAX_BUCKET - b.refill()) / b.unit())
                .saturating_sub(slack)
                .max(1);
            Quota::token_bucket(rate, burst).unwrap()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The one-number token bucket decides as the plain level-and-time
    /// bucket does, call for call, at every rate and at the edge of 2^53.
    #[test]
    fn token_bucket_matches_the_plain_bucket(
        q in any_bucket(),
        calls in prop::collection::vec((0u64..5_000_000, 0u64..=1000), 1..40),
    ) {
        let window = u64::try_from(q.window().as_micros()).unwrap().max(1);
        let mut now = T0;
        let calls: Vec<(u64, u64)> = calls
            .into_iter()
            .map(|(dt, frac)| {
                // Steps from 0 to a few windows; costs from 1 to the burst.
                now += dt % (3 * window + 1);
                let cost = (u128::from(q.limit()) * u128::from(frac) / 1000) as u64;
                (now, cost.clamp(1, q.limit()))
            })
            .collect();
        prop_assert_eq!(run(&q, &calls), plain_bucket(&q, &calls));
    }

    /// A denial returns the stored state unchanged, for every algorithm and
    /// with a clock that steps back: stores write nothing for it.
    #[test]
    fn a_denial_returns_the_stored_state(
        q in quotas(),
        calls in prop::collection::vec((0u64..3_000_000, any::<bool>(), 1u64..=12), 1..60),
    ) {
        let mut state: Option<State> = None;
        let mut now = T0 + 10_000_000;
        for (dt, back, cost) in calls {
            now = if back { (now - dt).max(T0) } else { now + dt };
            let step = decide(&q, state.clone(), now, cost.min(q.limit())).unwrap();
            if !step.decision.allowed {
                prop_assert_eq!(Some(&step.state), state.as_ref());
            }
            state = Some(step.state);
        }
    }
}

/// A clock that steps back finds the bucket as it was at that instant, with
/// what was admitted since still spent; the retry includes the step.
#[test]
fn token_bucket_clock_stepping_back() {
    // 1 token per second, burst 2.
    let q = Quota::token_bucket(Rate::per_second(1), 2).unwrap();
    let a = decide(&q, None, T0 + 10_000_000, 2).unwrap();
    assert!(a.decision.allowed);
    assert_eq!(a.decision.reset_after, Duration::from_secs(2));
    // Half a second earlier the bucket was 2.5 tokens short: empty, and a
    // token is there once the clock is back at T0 + 11 s.
    let b = decide(&q, Some(a.state.clone()), T0 + 9_500_000, 1).unwrap();
    assert!(!b.decision.allowed);
    assert_eq!(b.decision.remaining, 0);
    assert_eq!(b.decision.retry_after, Some(Duration::from_millis(1500)));
    assert_eq!(b.state, a.state, "a denial keeps the stored state");
    assert!(
        decide(&q, Some(a.state.clone()), T0 + 11_000_000, 1)
            .unwrap()
            .decision
            .allowed
    );
    assert!(
        !decide(&q, Some(a.state), T0 + 10_999_999, 1)
            .unwrap()
            .decision
            .allowed
    );
}

/// 7 per minute does not divide the microsecond: one token is
/// 8,571,428 4/7 µs, carried exactly in `rem`, so waiting for token after
/// token never accumulates rounding.
#[test]
fn token_bucket_sub_microsecond_rates_are_exact() {
    let q = Quota::token_bucket(Rate::per_minute(7), 7).unwrap();
    let a = decide(&q, None, T0, 7).unwrap();
    let State::TokenBucket(s) = a.state else {
        panic!()
    };
    assert_eq!((s.tat, s.rem), (T0 + 60_000_000, 0));
    let b = decide(&q, None, T0, 1).unwrap();
    let State::TokenBucket(s) = b.state else {
        panic!()
    };
    assert_eq!((s.tat, s.rem), (T0 + 8_571_428, 4));
    let mut state = Some(a.state);
    let mut now = T0;
    for k in 1..=6u64 {
        let d = decide(&q, state.clone(), now, 1).unwrap();
        assert!(!d.decision.allowed);
        now += u64::try_from(d.decision.retry_after.unwrap().as_micros()).unwrap();
        // The k-th token is there at ceil(k * 60 s / 7).
        assert_eq!(now, T0 + (k * 60_000_000).div_ceil(7));
        let d = decide(&q, state, now, 1).unwrap();
        assert!(d.decision.allowed);
        state = Some(d.state);
    }
}
