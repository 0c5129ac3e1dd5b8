//! Resharding under load: the slot of a busy caller is migrated to another
//! master and back (`MIGRATING`/`IMPORTING`, `MIGRATE`, `SETSLOT NODE`, with
//! the slot held in the migrating state so clients meet `ASK`) while traffic
//! runs through a fail-closed `Limiter`. No error reaches the caller (every
//! decision comes from the store), and contracts 2-5 hold across the moves.
//!
//! The checks are sound with wall-clock stamps: a call's server-side time
//! lies between when it was sent and when its reply arrived (the nodes run
//! on this machine, on its clock), so a set of admitted calls is counted in
//! a window only when all of their `[sent, received]` intervals lie in it.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::Lib;
use ratelimit_core::{FailurePolicy, Limiter, Quota, Rate, Source};
use ratelimit_testkit::redis_cluster::RedisCluster;
use ratelimit_testkit::redis_server::fresh_prefix;

const WINDOW: u64 = 1_000_000; // µs
const LIMIT: u64 = 20;

fn now_us() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros(),
    )
    .unwrap()
}

#[derive(Debug, Clone, Copy)]
struct Call {
    sent: u64,
    received: u64,
    allowed: bool,
    source: Source,
}

/// Fixed window and sliding window counter: at most L admitted per calendar
/// window, counting calls that certainly ran inside it.
fn check_calendar(name: &str, calls: &[Call]) {
    let mut per: std::collections::BTreeMap<u64, u64> = Default::default();
    for c in calls.iter().filter(|c| c.allowed) {
        if c.sent / WINDOW == c.received / WINDOW {
            *per.entry(c.sent / WINDOW).or_default() += 1;
        }
    }
    for (w, n) in per {
        assert!(
            n <= LIMIT,
            "{name}: {n} admitted in calendar window {w}, limit {LIMIT}"
        );
    }
}

/// Sliding log: at most L admitted in any trailing window.
fn check_trailing(name: &str, calls: &[Call]) {
    let admitted: Vec<&Call> = calls.iter().filter(|c| c.allowed).collect();
    for (i, a) in admitted.iter().enumerate() {
        let n = admitted[i..]
            .iter()
            .filter(|c| c.sent >= a.sent && c.received < a.sent + WINDOW)
            .count() as u64;
        assert!(
            n <= LIMIT,
            "{name}: {n} admitted within one window from {}",
            a.sent
        );
    }
}

/// Token bucket (capacity L, L per window): in any span [a, b] at most
/// L + L * (b - a) / W admitted.
fn check_bucket(name: &str, calls: &[Call]) {
    let admitted: Vec<&Call> = calls.iter().filter(|c| c.allowed).collect();
    for (i, a) in admitted.iter().enumerate() {
        let mut n = 0u64;
        for b in &admitted[i..] {
            if b.sent < a.sent {
                continue;
            }
            n += 1;
            let span = b.received - a.sent;
            let bound = LIMIT + LIMIT * span / WINDOW;
            assert!(
                n <= bound,
                "{name}: {n} admitted in {span} µs, bound {bound}"
            );
        }
    }
}

async fn resharding_under_load(lib: Lib, cluster: Arc<RedisCluster>) {
    let prefix = fresh_prefix();
    let store = common::store(
        lib,
        &cluster,
        &prefix,
        Duration::from_secs(2),
        Duration::from_secs(4),
    )
    .await;
    let rate = Rate::new(LIMIT, Duration::from_micros(WINDOW));
    let quotas = vec![
        Quota::fixed_window(rate).unwrap(),
        Quota::sliding_window(rate).unwrap(),
        Quota::sliding_log(rate).unwrap(),
        Quota::token_bucket(rate, LIMIT).unwrap(),
    ];
    let limiter = Limiter::builder(store.clone())
        .quota(quotas[0].clone())
        .namespace("rs")
        .unwrap()
        .failure_policy(FailurePolicy::FailClosed)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let caller = b"busy-caller";
    // One key per quota, and a second for the sliding log (its cumulative
    // costs, under the same hash tag). The fixed window's key lives until
    // its 1 s window ends: when one ends between the checks and the count
    // (a loaded machine), the quotas are checked again (bounded).
    let mut keys = Vec::new();
    for _ in 0..5 {
        for q in &quotas {
            assert_eq!(
                limiter.check_quota(q, caller, 1).await.unwrap().source,
                Source::Store
            );
        }
        keys = common::keys_under(&cluster, &prefix);
        if keys.len() == quotas.len() + 1 {
            break;
        }
    }
    assert_eq!(keys.len(), quotas.len() + 1, "{keys:?}");
    let slot = common::slot_of_keys(&cluster, &keys);
    let from = cluster.master_for_slot(slot);
    let to = cluster
        .masters()
        .into_iter()
        .find(|m| m.port != from.port)
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (qi, q) in quotas.iter().enumerate() {
        for _ in 0..3 {
            let (limiter, stop, q) = (limiter.clone(), stop.clone(), q.clone());
            tasks.push(tokio::spawn(async move {
                let mut calls = Vec::new();
                let t0 = std::time::Instant::now();
                // Bounded: stops by itself after 30 s whatever happens.
                while !stop.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(30) {
                    let sent = now_us();
                    let d = limiter.check_quota(&q, caller, 1).await.unwrap();
                    calls.push(Call {
                        sent,
                        received: now_us(),
                        allowed: d.allowed,
                        source: d.source,
                    });
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                (qi, calls)
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let c = cluster.clone();
    let (fp, tp) = (from.port, to.port);
    tokio::task::spawn_blocking(move || {
        c.migrate_slot_holding(slot, fp, tp, Duration::from_millis(700));
        assert_eq!(c.master_for_slot(slot).port, tp, "slot moved");
        std::thread::sleep(Duration::from_millis(500));
        c.migrate_slot_holding(slot, tp, fp, Duration::from_millis(700));
        assert_eq!(c.master_for_slot(slot).port, fp, "slot moved back");
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);

    let mut by_quota: Vec<Vec<Call>> = vec![Vec::new(); quotas.len()];
    for t in tasks {
        let (qi, calls) = t.await.unwrap();
        by_quota[qi].extend(calls);
    }
    let stats = limiter.stats();
    let total: usize = by_quota.iter().map(Vec::len).sum();
    let admitted: usize = by_quota.iter().flatten().filter(|c| c.allowed).count();
    println!(
        "RESHARD lib={lib:?} calls {total}, admitted {admitted}, limiter {stats:?}, store {:?}",
        store.stats()
    );
    // No error reached the caller: every decision came from the store,
    // with either client (each routes by the store's own slot map and
    // follows redirects itself).
    assert_eq!(
        stats.fail_closed + stats.errors + stats.timeouts,
        0,
        "{lib:?}: {stats:?}"
    );
    assert!(by_quota.iter().flatten().all(|c| c.source == Source::Store));
    assert_eq!(store.stats().errors, 0);
    // The moves were really met.
    let s = store.stats();
    assert!(s.moved > 0 && s.ask > 0, "{lib:?}: no redirect met: {s:?}");
    for calls in &mut by_quota {
        calls.sort_by_key(|c| c.sent);
    }
    check_calendar("fixed window", &by_quota[0]);
    check_calendar("sliding window", &by_quota[1]);
    check_trailing("sliding log", &by_quota[2]);
    check_bucket("token bucket", &by_quota[3]);
    // And the limits bit: the traffic asked for more than they allow.
    assert!(by_quota.iter().all(|c| c.iter().any(|c| !c.allowed)));
}

#[tokio::test(flavor = "multi_thread")]
async fn slot_migration_under_load_keeps_limits_and_surfaces_no_error() {
    let cluster = Arc::new(RedisCluster::start());
    resharding_under_load(Lib::RedisRs, cluster.clone()).await;
    #[cfg(feature = "fred")]
    resharding_under_load(Lib::Fred, cluster.clone()).await;
}
