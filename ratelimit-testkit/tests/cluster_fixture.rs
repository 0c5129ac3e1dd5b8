//! The cluster fixture on real processes: six nodes, one `ServerProcess`
//! each; pausing, killing and restarting one of them; and a cluster whose
//! nodes are reached through proxies. Every wait is bounded.

#![cfg(feature = "redis-cluster")]

use std::time::Duration;

use ratelimit_testkit::redis_cluster::{RedisCluster, Role};

#[test]
fn starts_six_nodes_and_controls_each() {
    let cluster = RedisCluster::start_local();
    assert_eq!(cluster.ports().len(), 6);
    assert_eq!(cluster.masters().len(), 3);
    let nodes = cluster.nodes();
    assert_eq!(nodes.iter().filter(|n| n.role == Role::Replica).count(), 3);
    for port in cluster.ports() {
        assert!(nodes.iter().any(|n| n.port == port), "node {port} listed");
    }

    let master = cluster.masters()[0].clone();
    let mut paused = cluster.connection(master.port);
    cluster.pause(master.port);
    paused
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let r: redis::RedisResult<String> = redis::cmd("PING").query(&mut paused);
    assert!(r.is_err(), "a paused node does not answer");
    cluster.resume(master.port);
    let pong: String = cluster
        .query(master.port, &redis::cmd("PING"))
        .expect("resumed");
    assert_eq!(pong, "PONG");

    let replica = cluster.replicas_of(&master)[0].clone();
    cluster.kill(replica.port);
    assert!(
        cluster
            .query::<String>(replica.port, &redis::cmd("PING"))
            .is_err()
    );
    // Back under the same node id, and the cluster healthy again (bounded).
    cluster.restart(replica.port);
    cluster.wait_ok();
    assert!(
        cluster
            .nodes()
            .iter()
            .any(|n| n.port == replica.port && n.id == replica.id && !n.failed)
    );
}

#[test]
fn a_proxied_cluster_is_reached_through_its_proxies() {
    let cluster = RedisCluster::start_local_proxied();
    assert!(cluster.is_proxied());
    let ports = cluster.ports();
    let proxy_ports: Vec<u16> = ports.iter().map(|&p| cluster.proxy(p).port()).collect();
    // Nodes keep their own names; the seeds are the proxies.
    let nodes = cluster.nodes();
    for &port in &ports {
        assert!(nodes.iter().any(|n| n.port == port), "node {port} listed");
    }
    let seeds: Vec<String> = proxy_ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}/"))
        .collect();
    assert_eq!(cluster.urls(), seeds);

    // Every address a client is told to follow is a proxy's: the masters in
    // CLUSTER SLOTS (replicas appear there once they have replicated
    // something), all six nodes in CLUSTER NODES.
    let slots: redis::Value = cluster
        .query(ports[0], redis::cmd("CLUSTER").arg("SLOTS"))
        .expect("CLUSTER SLOTS");
    let mut announced = Vec::new();
    collect_ports(&slots, &mut announced);
    assert!(announced.len() >= 3, "3 masters at least: {slots:?}");
    assert!(
        announced.iter().all(|p| proxy_ports.contains(p)),
        "announced {announced:?}, proxies {proxy_ports:?}"
    );
    let text: String = cluster
        .query(ports[0], redis::cmd("CLUSTER").arg("NODES"))
        .expect("CLUSTER NODES");
    for &p in &proxy_ports {
        assert!(
            text.contains(&format!("127.0.0.1:{p}@")),
            "node behind proxy {p} announced:\n{text}"
        );
    }

    // A key written through the master's proxy; its reply lost once.
    let key = format!("{{{}}}:n", cluster.prefix());
    let slot = cluster.key_slot(key.as_bytes());
    let master = cluster.master_for_slot(slot);
    let proxy = cluster.proxy(master.port);
    let mut through = redis::Client::open(proxy.url())
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap();
    through
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let n: i64 = redis::cmd("INCR").arg(&key).query(&mut through).unwrap();
    assert_eq!(n, 1);
    proxy.drop_replies_to(b"INCR", 1);
    let lost: redis::RedisResult<i64> = redis::cmd("INCR").arg(&key).query(&mut through);
    assert!(lost.is_err());
    assert!(proxy.wait_replies_lost(1, Duration::from_secs(5)));
    let direct: i64 = cluster
        .query(master.port, redis::cmd("GET").arg(&key))
        .unwrap();
    assert_eq!(direct, 2, "executed once, reply lost");

    // A MOVED redirect from another master names the owner's proxy.
    let other = cluster
        .masters()
        .into_iter()
        .find(|m| m.port != master.port)
        .expect("another master");
    let moved: redis::RedisResult<i64> = cluster.query(other.port, redis::cmd("GET").arg(&key));
    let err = moved.expect_err("MOVED");
    assert!(
        err.to_string().contains(&proxy.port().to_string()),
        "MOVED to the proxy {}: {err}",
        proxy.port()
    );
}

/// The ports in a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id], ...], ...]`.
fn collect_ports(v: &redis::Value, out: &mut Vec<u16>) {
    let redis::Value::Array(ranges) = v else {
        return;
    };
    for range in ranges {
        let redis::Value::Array(fields) = range else {
            continue;
        };
        for node in fields.iter().skip(2) {
            if let redis::Value::Array(n) = node
                && let Some(redis::Value::Int(p)) = n.get(1)
            {
                out.push(*p as u16);
            }
        }
    }
}
