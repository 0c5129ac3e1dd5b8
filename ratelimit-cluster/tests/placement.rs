//! Where keys land: the fixture is a healthy 3 + 3 cluster; many callers'
//! keys spread over all three masters (asked of the servers, not assumed);
//! every key of one caller, whatever bytes it holds, maps to one slot.

mod common;

use ratelimit_core::StoreExt;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use common::{Lib, SLOW};
use ratelimit_core::{Quota, Rate};
use ratelimit_testkit::redis_cluster::{RedisCluster, Role, SLOTS};
use ratelimit_testkit::redis_server::fresh_prefix;

fn quotas() -> Vec<Quota> {
    let r = Rate::per_minute(100);
    let mut qs = Vec::new();
    for name in ["default", "plan", "login"] {
        qs.push(Quota::fixed_window(r).unwrap().named(name).unwrap());
        qs.push(Quota::sliding_window(r).unwrap().named(name).unwrap());
        qs.push(
            Quota::sliding_log(Rate::new(5, Duration::from_secs(60)))
                .unwrap()
                .named(name)
                .unwrap(),
        );
        qs.push(Quota::token_bucket(r, 20).unwrap().named(name).unwrap());
    }
    qs
}

#[test]
fn fixture_is_a_healthy_six_node_cluster() {
    let cluster = RedisCluster::shared();
    let nodes = cluster.nodes();
    assert_eq!(nodes.len(), 6, "{nodes:#?}");
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    assert_eq!(nodes.iter().filter(|n| n.role == Role::Replica).count(), 3);
    for m in &masters {
        assert_eq!(cluster.replicas_of(m).len(), 1, "one replica per master");
    }
    let served: u32 = masters
        .iter()
        .flat_map(|m| m.slots.iter())
        .map(|&(a, b)| u32::from(b - a) + 1)
        .sum();
    assert_eq!(served, u32::from(SLOTS));
    // The well-known slot of "foo", from the server.
    assert_eq!(cluster.key_slot(b"foo"), 12182);
}

#[tokio::test(flavor = "multi_thread")]
async fn many_callers_land_on_all_three_masters() {
    let cluster = RedisCluster::shared();
    let prefix = fresh_prefix();
    let store = common::store(Lib::RedisRs, &cluster, &prefix, SLOW, 2 * SLOW).await;
    let quota = Quota::token_bucket(Rate::per_minute(100), 20).unwrap();
    let masters = cluster.masters();
    let mut per_master: BTreeMap<u16, usize> = BTreeMap::new();
    for i in 0..200 {
        let caller = format!("caller-{i}");
        let d = store
            .decide_one(caller.as_bytes(), &quota, 1)
            .await
            .expect("decision");
        assert!(d.allowed);
        let key = store.key(caller.as_bytes(), &quota);
        let slot = cluster.key_slot(key.as_bytes());
        let owner = masters.iter().find(|m| m.serves(slot)).expect("an owner");
        // The key is really there, on the master the slot map names.
        let exists: u32 = cluster
            .query(owner.port, redis::cmd("EXISTS").arg(&key))
            .expect("EXISTS");
        assert_eq!(exists, 1, "{key} not found on master {}", owner.port);
        *per_master.entry(owner.port).or_default() += 1;
    }
    println!("keys per master: {per_master:?}");
    assert_eq!(
        per_master.len(),
        3,
        "every master holds callers: {per_master:?}"
    );
    assert!(per_master.values().all(|&n| n >= 20), "{per_master:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_key_of_an_adversarial_caller_maps_to_one_slot() {
    let cluster = RedisCluster::shared();
    let prefix = fresh_prefix();
    let store = common::store(Lib::RedisRs, &cluster, &prefix, SLOW, 2 * SLOW).await;
    let mut callers: Vec<Vec<u8>> = [
        &b""[..],
        b"{",
        b"}",
        b"{}",
        b"}{",
        b"{a}",
        b"a{b}c",
        b"{user1}",
        b"user1",
        b"x:{y}:z",
        b"%7B",
        b"%",
        b"\xff\x00\n ",
        b"{{}}",
        b"::",
        b"rl:{x}:default:tb",
    ]
    .iter()
    .map(|c| c.to_vec())
    .collect();
    callers.push(vec![b'{'; 10_000]);
    callers.push((0..=255).collect());
    for i in 0..32u64 {
        let len = 1 + (rand::random::<u64>() % 40) as usize;
        let mut c: Vec<u8> = (0..len).map(|_| rand::random::<u8>()).collect();
        c.push((i % 256) as u8);
        callers.push(c);
    }
    let quotas = quotas();
    let mut all_keys = HashSet::new();
    let mut slots_seen = HashSet::new();
    for caller in &callers {
        let mut slots = HashSet::new();
        for q in &quotas {
            let key = store.key(caller, q);
            assert!(all_keys.insert(key.clone()), "two callers share key {key}");
            slots.insert(cluster.key_slot(key.as_bytes()));
            // And the store can decide on it: no CROSSSLOT, no error.
            store.decide_one(caller, q, 1).await.expect("decision");
        }
        assert_eq!(slots.len(), 1, "caller {caller:?} spans slots {slots:?}");
        let slot = *slots.iter().next().unwrap();
        // The slot is that of the tag alone (the escaped caller, or the
        // hash of a long one): input cannot move it.
        let tag = ratelimit_redis::keys::tag(caller);
        assert_eq!(slot, cluster.key_slot(tag.as_bytes()), "caller {caller:?}");
        slots_seen.insert(slot);
    }
    assert!(
        slots_seen.len() > callers.len() / 2,
        "callers spread over slots"
    );
    assert_eq!(store.stats().errors, 0);
}
