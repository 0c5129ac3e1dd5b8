//! A primary found through Redis Sentinel, failed over under load, with
//! each client: the store decides again soon after the promotion (the
//! time is printed; the test fails past `BACK_WITHIN`) and no call is
//! counted twice.
//!
//! 16 callers decide on their own keys through a `Limiter` (fail-closed,
//! 100 ms timeout); the load stops, the replica catches up (`WAIT`), the
//! counts are read from it, the load starts again and the primary is
//! killed (`SIGKILL`). The sentinel (quorum 1, `down-after-milliseconds`
//! 400) promotes the replica; the test polls the replica's `ROLE` every
//! millisecond for the instant of the promotion. Then each caller's count
//! on the new primary must lie between what was counted before the kill
//! plus what the store admitted after the promotion, and what was counted
//! before plus everything the store admitted or may have run since.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratelimit_core::{FailurePolicy, Limiter, Quota, Rate, Source};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::sentinel::RedisSentinel;

const CALLERS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Lib {
    RedisRs,
    #[cfg(feature = "fred")]
    Fred,
}

fn quota() -> Quota {
    Quota::fixed_window(Rate::per_hour(100_000_000)).unwrap()
}

/// Each decision: when it ended and who decided.
type Log = Vec<(Instant, Source, bool)>;

async fn load(limiter: Arc<Limiter>, caller: usize, stop: Arc<AtomicBool>) -> Log {
    let mut log = Vec::new();
    let name = format!("c{caller}");
    while !stop.load(Ordering::Relaxed) {
        let d = limiter.check(&name).await;
        log.push((Instant::now(), d.source, d.allowed));
        tokio::task::yield_now().await;
    }
    log
}

fn counts(conn: &mut redis::Connection, store: &RedisStore) -> Vec<u64> {
    (0..CALLERS)
        .map(|i| {
            let key = store.key(format!("t~c{i}").as_bytes(), &quota());
            let v: Option<String> = redis::cmd("GET").arg(&key).query(conn).unwrap();
            v.and_then(|v| v.split(':').nth(1).and_then(|n| n.parse().ok()))
                .unwrap_or(0)
        })
        .collect()
}

async fn run(lib: Lib) -> Duration {
    let fixture = Arc::new(RedisSentinel::start());
    let builder = RedisStore::sentinel_builder([fixture.sentinel_url()], fixture.master_name())
        .prefix(fixture.prefix())
        .response_timeout(Duration::from_millis(50))
        .connection_timeout(Duration::from_millis(50));
    let store = match lib {
        Lib::RedisRs => builder.build().await,
        #[cfg(feature = "fred")]
        Lib::Fred => builder.build_fred().await,
    }
    .unwrap_or_else(|e| panic!("{lib:?}: a store through the sentinel: {e}"));
    let limiter = Arc::new(
        Limiter::builder(store.clone())
            .quota(quota())
            .namespace("t")
            .unwrap()
            .failure_policy(FailurePolicy::FailClosed)
            .timeout(Duration::from_millis(100))
            .build()
            .unwrap(),
    );
    let start = |stop: &Arc<AtomicBool>| {
        (0..CALLERS)
            .map(|i| tokio::spawn(load(Arc::clone(&limiter), i, Arc::clone(stop))))
            .collect::<Vec<_>>()
    };
    // Warm up, stop, let the replica catch up, read the counts.
    let stop = Arc::new(AtomicBool::new(false));
    let warm = start(&stop);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for t in warm {
        t.await.unwrap();
    }
    let _: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query(&mut fixture.primary_connection())
        .unwrap();
    let before = counts(&mut fixture.replica_connection(), &store);
    assert!(before.iter().all(|&c| c > 0), "{before:?}");
    // The load again, and the primary killed under it.
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = start(&stop);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let killed = Instant::now();
    let first_primary = store.primary();
    let watched = store.clone();
    let switched = tokio::spawn(async move {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if watched.primary() != first_primary {
                return Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        None
    });
    fixture.kill_primary();
    let f = Arc::clone(&fixture);
    let promoted =
        tokio::task::spawn_blocking(move || f.wait_for_promotion(Duration::from_secs(30)))
            .await
            .unwrap()
            .expect("the sentinel promotes the replica within 30 s");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut logs = Vec::new();
    for t in tasks {
        logs.push(t.await.unwrap());
    }
    let back = logs
        .iter()
        .flatten()
        .filter(|(at, source, _)| *at > promoted && *source == Source::Store)
        .map(|(at, _, _)| *at)
        .min()
        .expect("the store decides again after the promotion");
    let after = counts(&mut fixture.replica_connection(), &store);
    for (i, log) in logs.iter().enumerate() {
        let admitted = log
            .iter()
            .filter(|(_, s, allowed)| *s == Source::Store && *allowed)
            .count() as u64;
        let admitted_after = log
            .iter()
            .filter(|(at, s, allowed)| *at > promoted && *s == Source::Store && *allowed)
            .count() as u64;
        let maybe_ran = log.iter().filter(|(_, s, _)| *s != Source::Store).count() as u64;
        assert!(
            after[i] <= before[i] + admitted + maybe_ran,
            "{lib:?} caller {i}: counted {} > {} before + {admitted} admitted + {maybe_ran} that may have run: a call counted twice",
            after[i],
            before[i]
        );
        assert!(
            after[i] >= before[i] + admitted_after,
            "{lib:?} caller {i}: counted {} < {} before + {admitted_after} admitted on the new primary",
            after[i],
            before[i]
        );
    }
    let recovered = back - promoted;
    if let Some(at) = switched.await.unwrap() {
        println!(
            "{lib:?}: the store switched to the new primary {:?} after the promotion",
            at.saturating_duration_since(promoted)
        );
    }
    println!(
        "{lib:?}: promotion {:?} after the kill; the store decided again {recovered:?} after the promotion; primary now {:?}",
        promoted - killed,
        store.primary()
    );
    recovered
}

/// How long after the promotion the store may take to decide again before
/// the test fails: far above what it takes (tens of milliseconds, printed
/// by the test; the figures in the crate README), so that a loaded machine
/// does not fail it, and far below fred's own Sentinel client's (it waits
/// for the sentinels, up to about a second).
const BACK_WITHIN: Duration = Duration::from_millis(750);

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_follows_a_promotion_counting_nothing_twice() {
    let recovered = run(Lib::RedisRs).await;
    assert!(
        recovered <= BACK_WITHIN,
        "redis-rs: back {recovered:?} after the promotion"
    );
}

/// fred: the store's own watcher finds the new primary, as for redis-rs,
/// and the calls go over a fred client to it.
#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_follows_a_promotion_counting_nothing_twice() {
    let recovered = run(Lib::Fred).await;
    assert!(
        recovered <= BACK_WITHIN,
        "fred: back {recovered:?} after the promotion"
    );
}
