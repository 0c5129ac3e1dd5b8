//! The batch script called directly, on a real server, with deadlines and
//! keys chosen by the test: the paths group commit takes only under load
//! or faults. A request past its deadline when the script reaches it
//! writes nothing while the others of its call are decided; a key that
//! repeats in one call is read as the requests before it left it; a call
//! of more keys than one read fetches (1,000) reads every key's state.

mod common;

use ratelimit_core::{Charge, Quota, Rate};
use ratelimit_redis::decode::{self, Outcome};
use ratelimit_redis::scripts::{Call, Request};
use ratelimit_testkit::redis_server::RedisServer;

/// Far ahead of any server's clock, in µs.
const FAR: i64 = 9_000_000_000_000_000;

use common::run_call as run;

/// Each request's first quota: admitted (true), denied (false) or expired
/// (None). (An admitting token bucket answers with one integer, -2 or
/// less.)
fn outcomes(reply: &[i64], requests: usize) -> Vec<Option<bool>> {
    let (outcomes, _) = decode::batch(reply, &vec![1; requests]).expect("a batch reply");
    outcomes
        .into_iter()
        .map(|o| match o {
            Outcome::Decided(d) => Some(d[0] == 1 || d[0] <= -2),
            Outcome::Expired => None,
        })
        .collect()
}

fn exists(server: &RedisServer, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<u64>(&mut server.connection())
        .expect("EXISTS")
        == 1
}

/// A request of `caller` on a token bucket of one refilling one an hour.
fn request(server: &RedisServer, caller: &str) -> Request {
    let q = Quota::token_bucket(Rate::per_hour(1), 1).unwrap();
    Request::new(
        server.prefix(),
        caller.as_bytes(),
        &[Charge::new(&q, 1)],
        None,
    )
}

#[test]
fn a_request_past_its_deadline_expires_alone_in_its_call() {
    let server = RedisServer::start_local();
    let [late, none, ahead] = ["late", "none", "ahead"].map(|c| request(&server, c));
    let late_key = late.keys[0].clone();
    // Deadlines in the server's µs: 1 (long past), none, far ahead; and in
    // the other order, so that the earliest is not always the first.
    for order in [[0, 1, 2], [2, 1, 0]] {
        let requests = [(&late, 1), (&none, 0), (&ahead, FAR)];
        let call = Call::batch(&order.map(|i| requests[i]));
        let got = outcomes(&run(&server, &call), 3);
        let by_request: Vec<Option<bool>> = (0..3)
            .map(|r| got[order.iter().position(|&i| i == r).unwrap()])
            .collect();
        assert_eq!(by_request[0], None, "past its deadline: expired");
        assert!(!exists(&server, &late_key), "an expired request wrote");
        assert!(by_request[1].is_some() && by_request[2].is_some());
    }
    // The fresh buckets of "none" and "ahead" were spent by the first call.
    let call = Call::batch(&[(&none, 0), (&ahead, FAR)]);
    assert_eq!(
        outcomes(&run(&server, &call), 2),
        [Some(false), Some(false)]
    );
}

#[test]
fn a_key_repeated_in_a_call_sees_the_writes_before_it() {
    let server = RedisServer::start_local();
    let [a, b] = ["a", "b"].map(|c| request(&server, c));
    // A bucket of one: the first request on a key admits, the next denies.
    let call = Call::batch(&[(&a, FAR), (&b, FAR), (&a, FAR), (&b, FAR), (&a, FAR)]);
    assert_eq!(
        outcomes(&run(&server, &call), 5),
        [
            Some(true),
            Some(true),
            Some(false),
            Some(false),
            Some(false)
        ]
    );
}

#[test]
fn a_call_of_more_keys_than_one_read_takes_reads_every_key() {
    let server = RedisServer::start_local();
    let callers: Vec<Request> = (0..2_345)
        .map(|i| request(&server, &format!("c{i}")))
        .collect();
    // Every other caller spends its bucket of one first.
    let spent: Vec<(&Request, i64)> = callers.iter().step_by(2).map(|r| (r, FAR)).collect();
    let first = outcomes(&run(&server, &Call::batch(&spent)), spent.len());
    assert!(first.iter().all(|o| *o == Some(true)));
    // Then all of them in one call of 2,345 keys (three reads): the spent
    // ones deny, the others admit.
    let all: Vec<(&Request, i64)> = callers.iter().map(|r| (r, FAR)).collect();
    let got = outcomes(&run(&server, &Call::batch(&all)), all.len());
    for (i, o) in got.iter().enumerate() {
        assert_eq!(*o, Some(i % 2 == 1), "caller {i}");
    }
}

fn stored(server: &RedisServer, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut server.connection())
        .expect("GET")
}

/// The script formats a state and an expiry once for the requests of a
/// call that write the same ones (buckets admitted from full at one
/// instant); requests whose buckets differ still write their own.
#[test]
fn each_request_writes_its_own_state() {
    let server = RedisServer::start_local();
    let q = Quota::token_bucket(Rate::per_hour(1), 3).unwrap();
    let on = |caller: &str| {
        Request::new(
            server.prefix(),
            caller.as_bytes(),
            &[Charge::new(&q, 1)],
            None,
        )
    };
    let [a, b, c] = ["a", "b", "c"].map(on);
    // a spends two tokens first, in a call of its own.
    run(&server, &Call::batch(&[(&a, FAR), (&a, FAR)]));
    let reply = run(&server, &Call::batch(&[(&b, FAR), (&a, FAR), (&c, FAR)]));
    let (outcomes, _) = decode::batch(&reply, &[1, 1, 1]).expect("a batch reply");
    let remaining: Vec<u64> = outcomes
        .iter()
        .zip([&b, &a, &c])
        .map(|(o, r)| match o {
            Outcome::Decided(d) => r.decisions(d).expect("decoded")[0].remaining,
            Outcome::Expired => panic!("nothing expires here"),
        })
        .collect();
    assert_eq!(remaining, [2, 0, 2]);
    let [sa, sb, sc] = [&a, &b, &c].map(|r| stored(&server, &r.keys[0]).expect("written"));
    assert_eq!(sb, sc, "two full buckets admitted at one instant");
    assert_ne!(sa, sb, "a's bucket was not full");
    // Each key's expiry is its own: a's bucket is full again two tokens
    // later than b's.
    let ttl = |r: &Request| -> i64 {
        redis::cmd("PTTL")
            .arg(&r.keys[0])
            .query(&mut server.connection())
            .expect("PTTL")
    };
    assert!(ttl(&a) > ttl(&b) + 3_600_000, "{} vs {}", ttl(&a), ttl(&b));
}
