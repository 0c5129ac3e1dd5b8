//! Every master of a cluster paused (SIGSTOP) under load: no call the
//! limiter answered by its failure policy is counted once they resume, with
//! either client and either policy (see `ratelimit_testkit::stall`). The
//! pause is 1 s, below the cluster's node timeout (1.5 s), so it tests the
//! deadlines and not a failover.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Lib;
use ratelimit_core::ManualClock;
use ratelimit_testkit::redis_cluster::RedisCluster;
use ratelimit_testkit::stall::answered_by_policy_counts_nothing;

const T0: u64 = 1_800_000_000_000_000;

const PAUSE: Duration = Duration::from_secs(1);

async fn check(lib: Lib) {
    let cluster = RedisCluster::start_local();
    let store = common::store(
        lib,
        &cluster,
        cluster.prefix(),
        Duration::from_millis(30),
        Duration::from_millis(200),
    )
    .await
    .with_clock(ManualClock::new(T0));
    let masters: Vec<u16> = cluster.masters().iter().map(|n| n.port).collect();
    let report = answered_by_policy_counts_nothing(
        Arc::new(store),
        PAUSE,
        || masters.iter().for_each(|&p| cluster.pause(p)),
        || masters.iter().for_each(|&p| cluster.resume(p)),
    )
    .await;
    println!("{report:?}");
    report.open.check("fail open").unwrap();
    report.closed.check("fail closed").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_rs_calls_answered_by_policy_during_a_pause_are_never_counted() {
    check(Lib::RedisRs).await;
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fred_calls_answered_by_policy_during_a_pause_are_never_counted() {
    check(Lib::Fred).await;
}

/// The builder reads every master's `TIME` once: a built store's first call
/// on any slot already carries a deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_built_store_knows_every_slots_clock_before_its_first_call() {
    let cluster = RedisCluster::shared();
    let store = common::store(
        Lib::RedisRs,
        &cluster,
        cluster.prefix(),
        Duration::from_millis(500),
        Duration::from_secs(2),
    )
    .await;
    let clock = store.engine().server_clock();
    let offsets: Vec<i64> = (0..ratelimit_redis::keys::SLOTS)
        .map(|slot| {
            clock
                .offset(slot)
                .unwrap_or_else(|| panic!("slot {slot}: no clock offset after build"))
        })
        .collect();
    // The nodes run on one machine: one clock, give or take the time the
    // replies took.
    let (min, max) = (offsets.iter().min().unwrap(), offsets.iter().max().unwrap());
    assert!(max - min < 1_000_000, "offsets spread {min}..{max} µs");
}

/// Every slot's clock offset made stale, as after the masters' clocks
/// stepped forward by two minutes: the first call on a slot is refused by
/// the server as expired (its deadline, in server time, was already past
/// there) while its caller still waits, so the store sends it once more by
/// the offset the refusal taught, and counts it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_refused_by_a_stale_clock_offset_is_sent_again_and_counted_once() {
    use ratelimit_core::{Quota, Rate, StoreExt};
    const STEP: i64 = 120_000_000;
    let cluster = RedisCluster::shared();
    let store = common::store(
        Lib::RedisRs,
        &cluster,
        &ratelimit_testkit::redis_server::fresh_prefix(),
        Duration::from_millis(500),
        Duration::from_secs(2),
    )
    .await;
    let clock = store.engine().server_clock();
    for slot in 0..ratelimit_redis::keys::SLOTS {
        let offset = clock.offset(slot).expect("learnt at build");
        clock.set_offset(slot, offset - STEP);
    }
    let q = Quota::fixed_window(Rate::per_hour(2)).unwrap();
    for caller in ["a", "b", "c"] {
        let d = store
            .decide_one(caller.as_bytes(), &q, 1)
            .await
            .unwrap_or_else(|e| panic!("caller {caller}: {e}"));
        assert_eq!((d.allowed, d.remaining), (true, 1), "caller {caller}");
        let again = store.decide_one(caller.as_bytes(), &q, 1).await.unwrap();
        assert_eq!((again.allowed, again.remaining), (true, 0), "counted once");
    }
}
