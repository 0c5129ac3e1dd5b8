//! The service over a real Redis node and a real Redis Cluster, started by
//! `ratelimit-testkit` (they need `redis-server` and `redis-cli`: `apt-get
//! install redis-server redis-tools`; the fixtures fail with that message
//! when they are missing): all or nothing across descriptors, state shared
//! by two service instances, and the degraded mode when Redis is gone.

mod common;

use std::time::Duration;

use ratelimit_testkit::redis_cluster::RedisCluster;
use ratelimit_testkit::redis_server::RedisServer;

use common::{
    SHOULD_RATE_LIMIT, Server, descriptor, eventually, grpc_frame, http, raw_grpc_call,
    raw_grpc_connection, request, temp_dir,
};

const CONFIG: &str = "domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 4
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 100
      algorithm: sliding_window
";

fn config() -> String {
    let dir = temp_dir("redis");
    let path = dir.join("edge.yaml");
    std::fs::write(&path, CONFIG).expect("config");
    path.display().to_string()
}

fn body(ip: &str, user: Option<&str>) -> String {
    match user {
        Some(u) => format!(
            r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"remote_address","value":"{ip}"}}]}},{{"entries":[{{"key":"user","value":"{u}"}}]}}]}}"#
        ),
        None => format!(
            r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"remote_address","value":"{ip}"}}]}}]}}"#
        ),
    }
}

/// Two instances share the limit; a denied request counts in no descriptor.
fn shared_and_all_or_nothing(a: &Server, b: &Server) {
    for (i, s) in [a, b, a, b].iter().enumerate() {
        let r = http(s.http, "POST", "/json", &body("10.9.9.9", Some("zoe")));
        assert_eq!(r.status, 200, "call {i}: {r:?}");
    }
    // The address has spent its 4 across both instances.
    let r = http(b.http, "POST", "/json", &body("10.9.9.9", Some("zoe")));
    assert_eq!(r.status, 429, "{r:?}");
    let j = r.json();
    assert_eq!(j["statuses"][0]["code"], "OVER_LIMIT");
    // zoe's sliding window: 4 counted, the denied call not (96 left).
    assert_eq!(j["statuses"][1]["code"], "OK");
    assert_eq!(j["statuses"][1]["limitRemaining"], 96, "{j}");
    let r = http(a.http, "POST", "/json", &body("10.9.9.10", Some("zoe")));
    assert_eq!(r.json()["statuses"][1]["limitRemaining"], 95);
}

#[test]
fn two_instances_share_one_redis_all_or_nothing_and_degrade_to_a_divided_limit() {
    let mut redis = RedisServer::start_local();
    let config = config();
    let url = redis.url();
    let args = |instances: &'static str| {
        vec![
            "--config".to_owned(),
            config.clone(),
            "--backend".to_owned(),
            "redis".to_owned(),
            "--redis-url".to_owned(),
            url.clone(),
            "--redis-prefix".to_owned(),
            redis.prefix().to_owned(),
            "--instances".to_owned(),
            instances.to_owned(),
            // Generous: the exact numbers below must come from Redis, not
            // from the fallback after a timeout on a loaded machine.
            "--timeout".to_owned(),
            "1s".to_owned(),
        ]
    };
    let a_args = args("2");
    // The second instance's store calls run on its own runtime, not on the
    // store's I/O thread: the shared counts must not differ.
    let mut b_args = args("2");
    b_args.extend(["--redis-io-thread".to_owned(), "false".to_owned()]);
    let a = Server::start(&a_args.iter().map(String::as_str).collect::<Vec<_>>());
    let b = Server::start(&b_args.iter().map(String::as_str).collect::<Vec<_>>());
    shared_and_all_or_nothing(&a, &b);
    // The state is in Redis, under the prefix and the domain's hash tag.
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", redis.prefix()))
        .query(&mut conn)
        .expect("KEYS");
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| k.contains("{rls~edge}")), "{keys:?}");

    // Redis gone: each instance decides in process at 4 / 2 = 2 per hour.
    redis.kill();
    let fallback = |ip: &str| http(a.http, "POST", "/json", &body(ip, None));
    let first = eventually(Duration::from_secs(20), || {
        let r = fallback("10.7.7.7");
        (r.status == 200).then_some(r)
    })
    .expect("the fallback admits");
    assert_eq!(
        first.json()["statuses"][0]["currentLimit"]["requestsPerUnit"],
        4
    );
    let mut admitted = 1;
    for _ in 0..5 {
        if fallback("10.7.7.7").status == 200 {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 2, "the fallback limit is 4 / 2 instances");
    let m = http(a.http, "GET", "/metrics", "");
    assert!(
        m.body
            .contains("ratelimit_server_decisions_total{source=\"fallback\"}"),
        "{}",
        m.body
    );
}

/// One `ShouldRateLimit` call with `grpc-timeout: {timeout}`: its
/// `grpc-status` (a tonic client would enforce the timeout itself; this
/// one leaves it to the server).
async fn call_with_grpc_timeout(
    send: &mut h2::client::SendRequest<bytes::Bytes>,
    timeout: &str,
) -> String {
    use prost::Message;
    let message = request("edge", vec![descriptor(&[("remote_address", "10.1.2.3")])]);
    raw_grpc_call(
        send,
        SHOULD_RATE_LIMIT,
        &[("grpc-timeout", timeout)],
        grpc_frame(0, &message.encode_to_vec()),
    )
    .await
    .status
}

/// The caller's `grpc-timeout` bounds a call the store cannot answer: with
/// Redis frozen and the service's own timeout far away, the call is
/// answered `CANCELLED` once the caller's time is up, the connection
/// serves on, and calls decide again once Redis is back.
#[test]
fn a_calls_grpc_timeout_bounds_its_wait_for_a_frozen_redis() {
    let redis = RedisServer::start_local();
    let server = Server::start(&[
        "--config",
        &config(),
        "--backend",
        "redis",
        "--redis-url",
        &redis.url(),
        "--redis-prefix",
        redis.prefix(),
        "--instances",
        "1",
        "--timeout",
        "30s",
    ]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut send = raw_grpc_connection(server.grpc).await;
        // 0: OK; 1: CANCELLED.
        assert_eq!(call_with_grpc_timeout(&mut send, "300m").await, "0");
        redis.pause();
        let asked = std::time::Instant::now();
        let frozen = tokio::time::timeout(
            Duration::from_secs(15),
            call_with_grpc_timeout(&mut send, "300m"),
        )
        .await;
        let waited = asked.elapsed();
        redis.resume();
        let status = frozen.unwrap_or_else(|_| {
            panic!("no answer in {waited:?}: the caller's grpc-timeout (300 ms) was not kept")
        });
        assert_eq!(status, "1", "answered after {waited:?}");
        // Back on the same connection once Redis answers again (a bounded
        // wait: the store's reconnection is not instant).
        let mut decided = None;
        for _ in 0..100 {
            let s = call_with_grpc_timeout(&mut send, "1S").await;
            if s == "0" {
                decided = Some(s);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            decided.as_deref(),
            Some("0"),
            "no decision after Redis came back"
        );
    });
}

#[test]
fn a_redis_backend_without_a_degraded_mode_does_not_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
        .args([
            "--config",
            &config(),
            "--backend",
            "redis",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no degraded mode") && err.contains("--instances"),
        "{err}"
    );
}

#[test]
fn two_instances_share_one_redis_cluster_all_or_nothing() {
    let cluster = RedisCluster::start_local();
    let config = config();
    let urls = cluster.urls().join(",");
    let args = [
        "--config",
        &config,
        "--backend",
        "cluster",
        "--cluster-url",
        &urls,
        "--redis-prefix",
        cluster.prefix(),
        "--failure-policy",
        "closed",
        "--timeout",
        "1s",
    ];
    let a = Server::start(&args);
    let b = Server::start(&args);
    shared_and_all_or_nothing(&a, &b);
}
