//! What operators run the service with: the Grafana dashboard shipped in
//! `dashboards/` queries only series the service exports, and
//! `--log-format json` writes one JSON object per log line.
//!
//! The dashboard test runs the service over a real Redis (it needs
//! `redis-server`: `apt-get install redis-server`; the fixture fails with
//! that message when it is missing), drives requests within and over the
//! limit and a few that time out on a paused Redis (a store failure), and
//! then finds every series the dashboard queries at `/metrics`. The node's
//! admission series (capacity, limit in flight, shed requests) are
//! exported from the moment the store knows the node, at 0 until it is
//! saturated; that they follow the admission is `ratelimit-redis`'s own
//! test (its telemetry module).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_testkit::redis_server::RedisServer;

use common::{Server, descriptor, http, request, temp_dir};

const DASHBOARD: &str = include_str!("../dashboards/ratelimit-server.json");

const CONFIG: &str = "domain: ops
descriptors:
  - key: client
    rate_limit:
      unit: minute
      requests_per_unit: 5
";

/// Every `ratelimit_*` series name in the dashboard's queries (its
/// panels' expressions and its variables' queries).
fn queried() -> BTreeSet<String> {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboard JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            queries.push(target["expr"].as_str().expect("expr").to_owned());
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if variable["type"] == "query" {
            queries.push(variable["query"].as_str().expect("query").to_owned());
        }
    }
    let mut names = BTreeSet::new();
    for q in queries {
        let mut rest = q.as_str();
        while let Some(at) = rest.find("ratelimit_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    names
}

/// The series names in a Prometheus text scrape.
fn exported(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_dashboard_queries_series_names() {
    let names = queried();
    // The parser finds what the panels are about (a broken parser that
    // found nothing would pass the test below).
    for expected in [
        "ratelimit_server_requests_total",
        "ratelimit_server_request_duration_seconds_bucket",
        "ratelimit_server_decisions_total",
        "ratelimit_store_failures_total",
        "ratelimit_node_shed_total",
        "ratelimit_node_capacity",
    ] {
        assert!(names.contains(expected), "{expected} not in {names:?}");
    }
    assert!(
        exported("# HELP a b\nratelimit_x{a=\"1\"} 2\nratelimit_y 3\n")
            == BTreeSet::from(["ratelimit_x".to_owned(), "ratelimit_y".to_owned()])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_queries_only_series_the_service_exports() {
    let redis = RedisServer::start();
    let dir = temp_dir("operations");
    let config = dir.join("ops.yaml");
    std::fs::write(&config, CONFIG).expect("config");
    let args = [
        "--config",
        config.to_str().expect("path"),
        "--backend",
        "redis",
        "--redis-url",
        &redis.url(),
        "--redis-prefix",
        redis.prefix(),
        "--instances",
        "2",
        "--timeout",
        "1s",
    ];
    let server = Server::start(&args);
    let wanted = queried();
    let missing = |scrape: &str| -> Vec<String> {
        let have = exported(scrape);
        wanted.difference(&have).cloned().collect()
    };
    let mut client = RateLimitServiceClient::connect(server.grpc_url())
        .await
        .expect("connect");
    // Within and over the limit (5 a minute for one caller).
    for _ in 0..8 {
        client
            .should_rate_limit(request("ops", vec![descriptor(&[("client", "one")])]))
            .await
            .expect("rpc");
    }
    // The node paused past the callers' second: requests time out, a
    // store failure (answered by the failure mode).
    redis.pause();
    let calls: Vec<_> = (0..4)
        .map(|i| {
            let mut c = client.clone();
            tokio::spawn(async move {
                let caller = format!("paused-{i}");
                let _ = c
                    .should_rate_limit(request("ops", vec![descriptor(&[("client", &caller)])]))
                    .await;
            })
        })
        .collect();
    for c in calls {
        let _ = c.await;
    }
    redis.resume();
    let scrape = http(server.http, "GET", "/metrics", "").body;
    let left = missing(&scrape);
    // The node's series (its admission: capacity, limit in flight, shed
    // requests) are there from the start, at 0 until the node is
    // saturated, labelled with the node the service uses.
    let node = format!("node=\"127.0.0.1:{}\"", redis.port());
    assert!(
        scrape
            .lines()
            .any(|l| l.starts_with("ratelimit_node_shed_total{") && l.contains(&node)),
        "no shed counter for {node} in:\n{scrape}"
    );
    assert!(
        left.is_empty(),
        "the dashboard queries series the service never exported: {left:?}"
    );
}

#[test]
fn json_logs_are_one_object_per_line() {
    let dir = temp_dir("json-logs");
    let config = dir.join("ops.yaml");
    std::fs::write(&config, CONFIG).expect("config");
    let server = Server::start(&[
        "--config",
        config.to_str().expect("path"),
        "--log-format",
        "json",
    ]);
    // A request, so that more than the start is logged at debug level.
    let r = http(server.http, "GET", "/healthcheck", "");
    assert_eq!(r.status, 200);
    server.terminate();
    let log = common::eventually(Duration::from_secs(10), || {
        let log = server.log();
        log.lines().count().ge(&2).then_some(log)
    })
    .expect("log lines");
    let mut levels = BTreeSet::new();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {line}"));
        assert!(v["timestamp"].is_string(), "{line}");
        assert!(v["message"].is_string(), "{line}");
        levels.insert(v["level"].as_str().expect("level").to_owned());
    }
    assert!(levels.contains("INFO"), "{levels:?}");
}
