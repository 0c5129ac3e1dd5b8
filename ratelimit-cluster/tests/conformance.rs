//! The shared conformance suite (contracts 1-14) against a real 6-node Redis
//! Cluster, once per client (redis-rs with one connection per node,
//! redis-rs' `ClusterConnection`, fred), all on one cluster.

mod common;

use common::{Factory, Lib};
use ratelimit_testkit::redis_cluster::RedisCluster;
use ratelimit_testkit::{SuiteConfig, run_all};

#[tokio::test(flavor = "multi_thread")]
async fn redis_rs_cluster_store_meets_every_contract() {
    let factory = Factory::new(Lib::RedisRs, RedisCluster::shared());
    let t = std::time::Instant::now();
    if let Err(v) = run_all(&factory, &SuiteConfig::default()).await {
        panic!("{v}");
    }
    println!("redis-rs conformance on the cluster: {:?}", t.elapsed());
}

/// The store over a `ClusterConnection` the application brings (redis-rs'
/// own routing) meets them too.
#[tokio::test(flavor = "multi_thread")]
async fn cluster_connection_store_meets_every_contract() {
    let factory = Factory::new(Lib::ClusterConnection, RedisCluster::shared());
    let t = std::time::Instant::now();
    if let Err(v) = run_all(&factory, &SuiteConfig::default()).await {
        panic!("{v}");
    }
    println!(
        "redis-rs ClusterConnection conformance on the cluster: {:?}",
        t.elapsed()
    );
}

#[cfg(feature = "fred")]
#[tokio::test(flavor = "multi_thread")]
async fn fred_cluster_store_meets_every_contract() {
    let factory = Factory::new(Lib::Fred, RedisCluster::shared());
    let t = std::time::Instant::now();
    if let Err(v) = run_all(&factory, &SuiteConfig::default()).await {
        panic!("{v}");
    }
    println!("fred conformance on the cluster: {:?}", t.elapsed());
}
