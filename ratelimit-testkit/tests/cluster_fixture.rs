//! The cluster fixture on real processes: six nodes, one `ServerProcess`
//! each; pausing, killing and restarting one of them. Every wait is bounded.

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
