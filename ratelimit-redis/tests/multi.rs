//! Several quotas in one call: one script call per decision, whatever the
//! number of quotas, counted on a real server through `INFO commandstats`
//! (`EVALSHA` and `EVAL` calls), through a `Limiter`, with both clients;
//! and the multi-quota script against `model::decide_all` at the edges.

mod common;

use ratelimit_core::StoreExt;
use std::time::Duration;

use ratelimit_core::{Limiter, Quota, Rate, Store};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_server::RedisServer;

/// Script calls so far: `EVALSHA` and `EVAL`.
fn script_calls(server: &RedisServer) -> u64 {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())
        .expect("INFO commandstats");
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split(',')
                .find_map(|f| f.split("calls=").nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

fn quotas() -> [Quota; 3] {
    let hour = Duration::from_secs(3600);
    [
        Quota::fixed_window(Rate::new(100, hour))
            .unwrap()
            .named("a")
            .unwrap(),
        Quota::sliding_log(Rate::new(3, hour))
            .unwrap()
            .named("b")
            .unwrap(),
        Quota::token_bucket(Rate::new(100, hour), 100)
            .unwrap()
            .named("c")
            .unwrap(),
    ]
}

async fn one_script_call_per_decision(server: &RedisServer, store: RedisStore) {
    assert!(store.capabilities().atomic);
    let [a, b, c] = quotas();
    let limiters = [
        Limiter::builder(store.clone())
            .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
            .quota(a.clone())
            .build()
            .unwrap(),
        Limiter::builder(store.clone())
            .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
            .quota(a.clone())
            .quota(b.clone())
            .build()
            .unwrap(),
        Limiter::builder(store.clone())
            .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
            .quota(a)
            .quota(b)
            .quota(c)
            .build()
            .unwrap(),
    ];
    for (i, limiter) in limiters.iter().enumerate() {
        let n = i + 1;
        let caller = format!("caller-{n}");
        // The first call may load the script (NOSCRIPT, then the source).
        limiter.check_all("warm-up", 1).await.unwrap();
        for call in 0..5 {
            let before = script_calls(server);
            let verdict = limiter.check_all(&caller, 1).await.unwrap();
            assert_eq!(
                script_calls(server) - before,
                1,
                "{n} quotas, call {call}: one script call per decision"
            );
            assert_eq!(verdict.quotas.len(), n);
            // The sliding log "b" admits 3 per hour: the 4th call is denied
            // with 2 or 3 quotas, and counted in none of them.
            let admitted = n == 1 || call < 3;
            assert_eq!(verdict.allowed(), admitted, "{n} quotas, call {call}");
            let counted = if n == 1 { call + 1 } else { call.min(2) + 1 };
            assert_eq!(
                verdict.quotas[0].remaining,
                100 - counted as u64,
                "{n} quotas, call {call}: a denied call is counted in no quota"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_makes_one_script_call_per_decision() {
    // A server of our own: nobody else's calls in the counters.
    let server = RedisServer::start_local();
    let store = common::redis_rs_store(&server.url(), "multi").await;
    one_script_call_per_decision(&server, store).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_makes_one_script_call_per_decision() {
    let server = RedisServer::start_local();
    let store = common::fred_store(&server.url(), "multi").await;
    one_script_call_per_decision(&server, store).await;
}

/// The multi-quota script against `model::decide_all` at the edges the
/// random suite rarely reaches (values near 2^53, awkward units, costs up
/// to the limit, the same microsecond, a clock that jumps back), with
/// random shadow flags; and a sliding log renumbered near 2^52 inside it.
#[tokio::test(flavor = "multi_thread")]
async fn multi_script_agrees_with_the_model_at_the_edges() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use ratelimit_core::ManualClock;
    use ratelimit_core::model::{self, Charge, SlidingLogState, State};

    const T0: u64 = 1_800_000_000_000_000;
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = common::redis_rs_store(
        &server.url(),
        &ratelimit_testkit::redis_server::fresh_prefix(),
    )
    .await
    .with_clock(clock.clone());
    let groups = [
        vec![
            Quota::sliding_window(Rate::per_minute(150_000_000)).unwrap(),
            Quota::fixed_window(Rate::new(1 << 40, Duration::from_secs(400 * 86_400))).unwrap(),
            Quota::sliding_log(Rate::new(100_000, Duration::from_secs(3_600))).unwrap(),
            Quota::token_bucket(
                Rate::new(999_983, Duration::from_micros(1_000_003)),
                4_503_000_000,
            )
            .unwrap(),
        ],
        vec![
            Quota::sliding_window(Rate::new(3, Duration::from_micros(7))).unwrap(),
            Quota::fixed_window(Rate::new(5, Duration::from_micros(13))).unwrap(),
            Quota::sliding_log(Rate::new(7, Duration::from_micros(1_000))).unwrap(),
            Quota::token_bucket(Rate::new(3, Duration::from_secs(7)), 11).unwrap(),
        ],
        vec![
            Quota::sliding_window(Rate::new(1_000_003, Duration::from_secs(8_999))).unwrap(),
            Quota::token_bucket(Rate::new(1_000_000, Duration::from_micros(1)), 8_000_000).unwrap(),
        ],
    ];
    let mut rng = StdRng::seed_from_u64(0x2026_0012);
    for (gi, quotas) in groups.iter().enumerate() {
        let width = quotas
            .iter()
            .map(|q| u64::try_from(q.window().as_micros()).unwrap())
            .max()
            .unwrap();
        let mut states: Vec<Option<State>> = vec![None; quotas.len()];
        let mut now = T0;
        let caller = format!("edge-{gi}");
        for i in 0..300 {
            now = match rng.random_range(0..10) {
                0 => now,
                1 => now.saturating_sub(rng.random_range(0..=width / 2 + 1)),
                2 => now + rng.random_range(0..=width),
                3 => now + 1,
                _ => now + rng.random_range(0..=width / 3 + 1),
            };
            let shadow: Vec<bool> = quotas.iter().map(|_| rng.random_range(0..4) == 0).collect();
            let charges: Vec<Charge<'_>> = quotas
                .iter()
                .zip(&shadow)
                .map(|(q, &shadow)| Charge {
                    quota: q,
                    cost: match rng.random_range(0..4) {
                        0 => q.limit(),
                        1 => 1,
                        _ => rng.random_range(1..=q.limit()),
                    },
                    shadow,
                })
                .collect();
            clock.set(now);
            let want = model::decide_all(&charges, states.clone(), now).unwrap();
            let got = store.decide_all(caller.as_bytes(), &charges).await.unwrap();
            assert_eq!(
                &got[..],
                &want.decisions[..],
                "group #{gi}, call #{i} at {now}"
            );
            for (s, w) in states.iter_mut().zip(want.writes) {
                if let Some((state, _)) = w {
                    *s = Some(state);
                }
            }
        }
    }

    // A sliding log near 2^52, renumbered by an admission through the
    // multi-quota script, next to a fixed window.
    let log = Quota::sliding_log(Rate::new(10, Duration::from_secs(3_600))).unwrap();
    let other = Quota::fixed_window(Rate::new(1_000, Duration::from_secs(3_600))).unwrap();
    let tkey = store.key(b"old-log", &log);
    let ckey = format!("{tkey}:c");
    let base: u64 = (1 << 52) - 5;
    let times = [T0 - 3_000, T0 - 2_000, T0 - 1_000];
    let mut conn = server.connection();
    let _: () = redis::cmd("ZADD")
        .arg(&ckey)
        .arg(&[
            base,
            base,
            base + 1,
            base + 1,
            base + 2,
            base + 2,
            base + 3,
            base + 3,
        ])
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
    let mut states = vec![
        Some(State::SlidingLog(SlidingLogState {
            entries: times.iter().map(|&t| (t, 1)).collect(),
        })),
        None,
    ];
    let mut now = T0;
    for i in 0..200 {
        now = match rng.random_range(0..6) {
            0 => now.saturating_sub(rng.random_range(0..5_000)),
            1 => now + rng.random_range(0..3_600_000_000),
            _ => now + rng.random_range(0..1_000),
        };
        let charges = [
            Charge::new(&log, rng.random_range(1..=10)),
            Charge::new(&other, rng.random_range(1..=10)),
        ];
        clock.set(now);
        let want = model::decide_all(&charges, states.clone(), now).unwrap();
        let got = store.decide_all(b"old-log", &charges).await.unwrap();
        assert_eq!(&got[..], &want.decisions[..], "log call #{i} at {now}");
        for (s, w) in states.iter_mut().zip(want.writes) {
            if let Some((state, _)) = w {
                *s = Some(state);
            }
        }
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
