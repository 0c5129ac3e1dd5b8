//! A quota's own script (its numbers compiled in, the cost its one
//! argument) against its algorithm's script (the numbers as arguments), on
//! a real server: the same requests at the same instants, each script on
//! its own keys, give the same replies, admissions, denials and the
//! token bucket's sub-µs remainders alike.

mod common;

use ratelimit_core::{Charge, Quota, Rate};
use ratelimit_redis::scripts::{self, Arg, Call, Request};
use ratelimit_testkit::redis_server::RedisServer;

use common::run_call as run;

/// A fixed walk of `steps` instants (µs since the epoch, for an injected
/// clock), less than `gap` apart: `(step, now, r)`, `r` a pseudo-random
/// number (xorshift from `seed`) for the step's choices.
fn walk(mut seed: u64, steps: usize, gap: u64) -> impl Iterator<Item = (usize, u64, u64)> {
    let mut now: u64 = 1_700_000_000_000_000;
    (0..steps).map(move |step| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        now += seed % gap;
        (step, now, seed)
    })
}

/// The token buckets the one-integer tests walk: whole µs per token, a
/// refill of several units a µs (states with a remainder), one an hour.
fn buckets() -> [Quota; 3] {
    [
        Quota::token_bucket(Rate::per_minute(100), 20).unwrap(),
        Quota::token_bucket(Rate::per_second(3_000_000), 7).unwrap(),
        Quota::token_bucket(Rate::per_hour(1), 1).unwrap(),
    ]
}

/// A step's cost on those buckets: 1 to 4, and now and then one above
/// every capacity (denied, never full).
fn bucket_cost(seed: u64) -> u64 {
    if seed.is_multiple_of(17) {
        30
    } else {
        1 + seed % 4
    }
}

/// A lone call of `request` that also asks for the server's `TIME`
/// (`-(deadline + 1)` with no deadline), so that it answers with the four.
fn asking_time(request: &Request) -> Call {
    let mut call = Call::alone(request, 0);
    call.args[0] = Arg::Int(-1);
    call
}

#[test]
fn a_quotas_own_script_decides_as_its_algorithms_script() {
    let server = RedisServer::start_local();
    let quotas = [
        Quota::token_bucket(Rate::per_minute(100), 20).unwrap(),
        // A refill of several units a µs: states with a remainder.
        Quota::token_bucket(Rate::per_second(3_000_000), 7).unwrap(),
        Quota::fixed_window(Rate::per_second(10)).unwrap(),
        Quota::sliding_window(Rate::per_second(10)).unwrap(),
        Quota::sliding_log(Rate::per_second(10)).unwrap(),
    ];
    // A fixed walk of instants (µs, injected clock) and costs.
    let (mut admitted, mut denied) = (0, 0);
    for (step, now, seed) in walk(0x9e37_79b9_7f4a_7c15, 400, 150_000) {
        for (i, q) in quotas.iter().enumerate() {
            let cost = 1 + seed % 3;
            let charge = [Charge::new(q, cost)];
            let own = Request::new(
                server.prefix(),
                format!("own{i}").as_bytes(),
                &charge,
                Some(now),
            );
            let call = Call::alone(&own, 0);
            assert!(call.script.is_compiled(), "{q:?}");
            let generic = Request::new(
                server.prefix(),
                format!("gen{i}").as_bytes(),
                &charge,
                Some(now),
            );
            let mut args = scripts::args(q, Some(now), cost);
            args[0] = "0".to_owned();
            let reference = Call {
                script: scripts::for_quota(q),
                keys: generic.keys.clone(),
                args: args.into_iter().map(Arg::Text).collect(),
                requests: 1,
            };
            let (a, b) = (run(&server, &call), run(&server, &reference));
            assert_eq!(a, b, "step {step}, quota {q:?}, cost {cost}, now {now}");
            let a = match a[..] {
                [packed] => own.unpack(packed).unwrap().to_vec(),
                _ => a,
            };
            if a[0] == 1 {
                admitted += 1;
            } else {
                denied += 1;
            }
        }
    }
    assert!(
        admitted > 200 && denied > 200,
        "{admitted} admitted, {denied} denied"
    );
}

/// `NOSCRIPT` errors the server has answered.
fn noscript_errors(server: &RedisServer) -> u64 {
    common::info_count(server, "errorstats", "errorstat_NOSCRIPT:count=")
}

/// Many callers of a quota the store has never seen: the first calls
/// carry the quota's own script's source, so none meets `NOSCRIPT` (each
/// would pay two more round trips); after the server loses its scripts,
/// the store sends the source again and decides on.
async fn first_calls_and_a_flushed_cache(
    store: ratelimit_redis::RedisStore,
    server: &RedisServer,
    per_second: u64,
) {
    use ratelimit_core::store::StoreExt;
    use std::sync::Arc;
    let store = Arc::new(store);
    // The algorithms' scripts are on the server, as the builder leaves
    // them (a store made from a fred client loads them on first use).
    for script in scripts::all() {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script.lua())
            .query(&mut server.connection())
            .unwrap();
    }
    // A quota no other test of this process uses: its script is new.
    let q = Arc::new(Quota::fixed_window(Rate::per_second(per_second)).unwrap());
    let mut tasks = Vec::new();
    for t in 0..50u32 {
        let (store, q) = (store.clone(), q.clone());
        tasks.push(tokio::spawn(async move {
            store
                .decide_one(format!("c{t}").as_bytes(), &q, 1)
                .await
                .expect("decided")
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap().allowed);
    }
    assert_eq!(noscript_errors(server), 0, "a first call met NOSCRIPT");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.connection())
        .unwrap();
    let d = store.decide_one(b"after", &q, 1).await.expect("decided");
    assert!(d.allowed);
    assert_eq!(
        noscript_errors(server),
        1,
        "the flushed script went by SHA first"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_rs_first_calls_carry_the_source() {
    let server = RedisServer::start_local();
    let store = ratelimit_redis::RedisStore::builder(server.url())
        .prefix(server.prefix())
        .timeout(std::time::Duration::from_secs(5))
        .build()
        .await
        .expect("connect");
    first_calls_and_a_flushed_cache(store, &server, 987_654_321).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fred_first_calls_carry_the_source() {
    let server = RedisServer::start_local();
    let store = common::fred_store(&server.url(), server.prefix()).await;
    first_calls_and_a_flushed_cache(store, &server, 987_654_322).await;
}

/// A token bucket's single call that admits returns one integer unless
/// asked for the server's `TIME`, when it returns the four (and `TIME`):
/// on twin keys, the same requests at the same instants, the one integer
/// unpacked is the four, and a denial is the four, through admissions from
/// full and from partly spent buckets, denials, costs above the capacity
/// and sub-µs remainders.
#[test]
fn a_token_buckets_one_integer_unpacks_to_its_four() {
    let server = RedisServer::start_local();
    let quotas = buckets();
    let (mut admitted, mut denied) = (0, 0);
    for (step, now, seed) in walk(0x2545_f491_4f6c_dd1d, 600, 400_000) {
        for (i, q) in quotas.iter().enumerate() {
            let cost = bucket_cost(seed);
            let charge = [Charge::new(q, cost)];
            let calls = ["packed", "four"].map(|twin| {
                let request = Request::new(
                    server.prefix(),
                    format!("{twin}{i}").as_bytes(),
                    &charge,
                    Some(now),
                );
                let call = if twin == "four" {
                    asking_time(&request)
                } else {
                    Call::alone(&request, 0)
                };
                (request, call)
            });
            let packed = run(&server, &calls[0].1);
            let four = run(&server, &calls[1].1);
            assert_eq!(four.len(), 5, "step {step}: four and TIME: {four:?}");
            let unpacked = match packed[..] {
                [p] => {
                    admitted += 1;
                    calls[0].0.unpack(p).unwrap().to_vec()
                }
                // A denial comes as the four.
                _ => {
                    denied += 1;
                    packed
                }
            };
            assert_eq!(
                unpacked[..],
                four[..4],
                "step {step}, quota {q:?}, cost {cost}, now {now}"
            );
        }
    }
    assert!(
        admitted > 300 && denied > 300,
        "{admitted} admitted, {denied} denied"
    );
}

/// The batch script answers an admitting token bucket with one integer
/// too (`-2 - d`): on twin keys, the same requests at the same instants,
/// three requests in each batch call (one per quota), each answer expanded
/// is the four a lone call asked for with `TIME` returns, admissions and
/// denials alike.
#[test]
fn a_batched_token_buckets_one_integer_expands_to_its_four() {
    let server = RedisServer::start_local();
    let quotas = buckets();
    let (mut one, mut four_of_them) = (0, 0);
    for (step, now, seed) in walk(0x6a09_e667_f3bc_c908, 600, 400_000) {
        let cost = bucket_cost(seed);
        let requests: Vec<[Request; 2]> = quotas
            .iter()
            .enumerate()
            .map(|(i, q)| {
                ["batched", "four"].map(|twin| {
                    Request::new(
                        server.prefix(),
                        format!("{twin}{i}").as_bytes(),
                        &[Charge::new(q, cost)],
                        Some(now),
                    )
                })
            })
            .collect();
        let batch: Vec<(&Request, i64)> = requests.iter().map(|[b, _]| (b, 0)).collect();
        let reply = run(&server, &Call::batch(&batch));
        let (outcomes, _) =
            ratelimit_redis::decode::batch(&reply, &[1, 1, 1]).expect("a batch reply");
        for ((outcome, [batched, alone]), q) in outcomes.iter().zip(&requests).zip(&quotas) {
            let ratelimit_redis::decode::Outcome::Decided(answer) = outcome else {
                panic!("step {step}: nothing expires here")
            };
            match answer.len() {
                1 => one += 1,
                _ => four_of_them += 1,
            }
            let four = run(&server, &asking_time(alone));
            let ratelimit_core::Algorithm::TokenBucket(b) = q.algorithm() else {
                unreachable!("buckets only")
            };
            let mut rest = &answer[..];
            assert_eq!(
                ratelimit_redis::decode::take_four(&mut rest, Some((b.refill(), b.full())))
                    .expect("expanded")[..],
                four[..4],
                "step {step}, quota {q:?}, cost {cost}, now {now}, answer {answer:?}"
            );
            assert!(rest.is_empty(), "step {step}, answer {answer:?}");
            // The store's path decodes the answer where it stands.
            let limit = ratelimit_redis::decode::Limit::of(q);
            assert_eq!(
                batched.decisions(answer).expect("decoded")[0],
                ratelimit_redis::decode::decision(&four[..4], limit).expect("decoded"),
                "step {step}, answer {answer:?}"
            );
        }
    }
    assert!(
        one > 300 && four_of_them > 300,
        "{one} answered with one integer, {four_of_them} with four"
    );
}
