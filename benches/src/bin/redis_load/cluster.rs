//! `--cluster`: the cluster store on a local 6-node cluster.

use std::time::Duration;

use ratelimit_benches::clients::Lib;
use ratelimit_cluster::ClusterStore;
use ratelimit_testkit::redis_cluster::RedisCluster;

use crate::book::Book;
use crate::contenders::{GENEROUS, limiter_call};
use crate::load::drive;
use crate::options::Args;
use crate::quotas::{ALGORITHMS, Quotas, algo_name};

pub(crate) async fn cluster_store(lib: Lib, cluster: &RedisCluster) -> ClusterStore {
    match lib {
        Lib::RedisRs => ClusterStore::builder(cluster.urls())
            .response_timeout(GENEROUS)
            .connection_timeout(Duration::from_secs(1))
            .timeout(2 * GENEROUS)
            .build()
            .await
            .expect("connect to the cluster"),
        #[cfg(feature = "fred")]
        Lib::Fred => {
            use ratelimit_cluster::fred_client::prelude::*;
            let config = Config {
                server: ServerConfig::new_clustered(cluster.addrs()),
                ..Config::default()
            };
            let client = Builder::from_config(config)
                .with_performance_config(|p| p.default_command_timeout = GENEROUS)
                .with_connection_config(|c| {
                    c.connection_timeout = Duration::from_secs(1);
                    c.max_command_attempts = 1;
                })
                .build()
                .expect("fred cluster client");
            client.init().await.expect("fred connects to the cluster");
            ClusterStore::from_fred(client).with_timeout(2 * GENEROUS)
        }
    }
}

/// `Limiter::check` over `ClusterStore` on a local 3-master + 3-replica
/// cluster, each algorithm and client library, `runs` times.
pub(crate) async fn cluster_section(a: &Args, q: &Quotas) {
    eprintln!("starting a local 6-node Redis Cluster");
    let cluster = RedisCluster::start_local();
    let (n, m, k, s) = (a.tasks, a.connections, a.callers, a.seconds);
    let mut book = Book::default();
    for run in 1..=a.runs {
        eprintln!("cluster run {run} of {}", a.runs);
        for lib in Lib::all() {
            for kind in ALGORITHMS {
                let mut stores = Vec::new();
                for _ in 0..m {
                    stores.push(cluster_store(lib, &cluster).await);
                }
                let call = limiter_call(stores, &q.ours(kind), k);
                book.add(
                    &format!(
                        "cluster: ours {} ({}, Limiter::check)",
                        algo_name(kind),
                        lib.name()
                    ),
                    drive(&call, n, m, k, s, None).await,
                );
            }
        }
    }
    book.print_table(
        &format!(
            "### Redis Cluster (3 masters + 3 replicas, all on this machine): {n} tasks over {m} cluster clients"
        ),
        &book.order,
    );
}
