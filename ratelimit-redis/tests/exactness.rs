//! Model agreement at the edges the random suite rarely reaches: values near
//! 2^53 (limit x window for the sliding window counter, a bucket's full level),
//! awkward token-bucket units, costs up to the limit, calls in the same
//! microsecond, and a clock that jumps back. Every decision must equal
//! `ratelimit_core::model::decide`'s, field for field.

mod common;

use ratelimit_core::StoreExt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ratelimit_core::model;
use ratelimit_core::{MAX_TIME, ManualClock, Quota, Rate};
use ratelimit_testkit::redis_server::{RedisServer, fresh_prefix};

const T0: u64 = 1_800_000_000_000_000;

fn quotas() -> Vec<Quota> {
    vec![
        // limit x window just below 2^53 - 1.
        Quota::sliding_window(Rate::per_minute(150_000_000)).unwrap(),
        Quota::sliding_window(Rate::new(3, Duration::from_micros(7))).unwrap(),
        Quota::sliding_window(Rate::new(1_000_003, Duration::from_secs(8_999))).unwrap(),
        Quota::fixed_window(Rate::new(1 << 40, Duration::from_secs(400 * 86_400))).unwrap(),
        Quota::fixed_window(Rate::new(5, Duration::from_micros(13))).unwrap(),
        // The largest sliding log accepted.
        Quota::sliding_log(Rate::new(100_000, Duration::from_secs(3_600))).unwrap(),
        Quota::sliding_log(Rate::new(7, Duration::from_micros(1_000))).unwrap(),
        // unit 1_000_003, refill 999_983: full = burst x unit close to 2^52
        // (MAX_BUCKET).
        Quota::token_bucket(
            Rate::new(999_983, Duration::from_micros(1_000_003)),
            4_503_000_000,
        )
        .unwrap(),
        Quota::token_bucket(Rate::new(3, Duration::from_secs(7)), 11).unwrap(),
        Quota::token_bucket(Rate::new(1_000_000, Duration::from_micros(1)), 8_000_000).unwrap(),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn scripts_agree_with_the_model_at_the_edges() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = common::redis_rs_store(&server.url(), &fresh_prefix())
        .await
        .with_clock(clock.clone());
    let mut rng = StdRng::seed_from_u64(0x2026_0053);
    for (qi, quota) in quotas().iter().enumerate() {
        let width = u64::try_from(quota.window().as_micros()).unwrap();
        let mut state = None;
        let mut now = T0 + rng.random_range(0..width.min(1 << 40));
        let caller = format!("edge-{qi}");
        for i in 0..400 {
            now = match rng.random_range(0..10) {
                0 => now,                                                     // same µs
                1 => now.saturating_sub(rng.random_range(0..=width / 2 + 1)), // clock back
                2 => now + width + rng.random_range(0..=width), // a window or more later
                3 => now + 1,
                _ => now + rng.random_range(0..=width / 3 + 1),
            }
            // Stores handle times up to MAX_TIME (2^52 µs) exactly.
            .min(MAX_TIME);
            let cost = match rng.random_range(0..4) {
                0 => quota.limit(),
                1 => 1,
                _ => rng.random_range(1..=quota.limit()),
            };
            clock.set(now);
            let want = model::decide(quota, state.take(), now, cost).unwrap();
            let got = store
                .decide_one(caller.as_bytes(), quota, cost)
                .await
                .unwrap();
            assert_eq!(
                got, want.decision,
                "quota #{qi} {quota:?}, call #{i} at {now} cost {cost}"
            );
            state = Some(want.state);
        }
    }
}

/// A sliding log whose cumulative cost has reached 2^52 (years of traffic
/// on one key) is renumbered from its base by the next admission and keeps
/// agreeing with the model, clock steps back included. The state is written
/// directly in the script's layout (times; cumulative costs with the base).
#[tokio::test(flavor = "multi_thread")]
async fn sliding_log_renumbers_its_cumulative_costs_before_2_pow_52() {
    use ratelimit_core::model::{SlidingLogState, State};
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = common::redis_rs_store(&server.url(), &fresh_prefix())
        .await
        .with_clock(clock.clone());
    let quota = Quota::sliding_log(Rate::new(10, Duration::from_secs(3_600))).unwrap();
    let tkey = store.key(b"old-log", &quota);
    let ckey = format!("{tkey}:c");
    let base: u64 = (1 << 52) - 5;
    let times = [T0 - 3_000, T0 - 2_000, T0 - 1_000];
    let mut conn = server.connection();
    let _: () = redis::cmd("ZADD")
        .arg(&ckey)
        .arg(base)
        .arg(base)
        .arg(base + 1)
        .arg(base + 1)
        .arg(base + 2)
        .arg(base + 2)
        .arg(base + 3)
        .arg(base + 3)
        .query(&mut conn)
        .unwrap();
    for (i, t) in times.iter().enumerate() {
        let _: () = redis::cmd("ZADD")
            .arg(&tkey)
            .arg(t)
            .arg(base + 1 + i as u64)
            .query(&mut conn)
            .unwrap();
    }
    let mut state = Some(State::SlidingLog(SlidingLogState {
        entries: times.iter().map(|&t| (t, 1)).collect(),
    }));
    let mut rng = StdRng::seed_from_u64(52);
    let mut now = T0;
    for i in 0..200 {
        now = match rng.random_range(0..6) {
            0 => now.saturating_sub(rng.random_range(0..5_000)),
            1 => now + rng.random_range(0..3_600_000_000),
            _ => now + rng.random_range(0..1_000),
        };
        let cost = rng.random_range(1..=10);
        clock.set(now);
        let want = model::decide(&quota, state.take(), now, cost).unwrap();
        let got = store.decide_one(b"old-log", &quota, cost).await.unwrap();
        assert_eq!(got, want.decision, "call #{i} at {now} cost {cost}");
        state = Some(want.state);
    }
    let top: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(&ckey)
        .arg(-1)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut conn)
        .unwrap();
    assert!(top[0].1 < 1e6, "renumbered from the base: {top:?}");
}
