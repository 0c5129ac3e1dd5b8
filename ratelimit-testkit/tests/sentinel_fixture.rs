//! The Sentinel fixture: a replica the sentinel knows, and a failover
//! after the primary is killed.

#![cfg(feature = "redis")]

use std::time::Duration;

use ratelimit_testkit::sentinel::RedisSentinel;

#[test]
fn the_sentinel_promotes_the_replica_when_the_primary_dies() {
    let fixture = RedisSentinel::start();
    assert_eq!(
        fixture.sentinel_primary(),
        Some(("127.0.0.1".to_owned(), fixture.primary_port()))
    );
    fixture.kill_primary();
    let promoted = fixture.wait_for_promotion(Duration::from_secs(8));
    assert!(
        promoted.is_some(),
        "no promotion within 30 s; the sentinel names {:?}; the replica's ROLE {:?}; the sentinel's log:\n{}",
        fixture.sentinel_primary(),
        redis::cmd("ROLE").query::<redis::Value>(&mut fixture.replica_connection()),
        fixture.sentinel_log()
    );
}
