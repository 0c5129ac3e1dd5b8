//! The binary on loopback ports: gRPC, the JSON endpoint, health, metrics,
//! reload on change, graceful shutdown.

mod common;

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use common::{
    EXAMPLE_CONFIG, SHOULD_RATE_LIMIT, Server, config_file, descriptor, eventually, fixture,
    grpc_frame, http, raw_grpc_call, raw_grpc_connection, request, temp_dir, write_whole,
};

const RLS: &str = "envoy.service.ratelimit.v3.RateLimitService";

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// `limitRemaining` of a descriptor status in the JSON mapping, which leaves
/// a value of 0 out.
fn remaining(status: &serde_json::Value) -> u64 {
    match status.get("limitRemaining") {
        None => 0,
        Some(v) => v
            .as_u64()
            .unwrap_or_else(|| panic!("limitRemaining is not a count: {status}")),
    }
}

#[test]
fn grpc_should_rate_limit_decides_all_descriptors_of_envoyproxys_example() {
    let server = Server::start_on_example();
    rt().block_on(async {
        let mut client = RateLimitServiceClient::connect(server.grpc_url())
            .await
            .expect("connect");
        // foo (2/min) and foo+bar=bkthomps (1/min): the second request is
        // over the limit on bkthomps, and foo is not charged for it.
        let req = request(
            "rl",
            vec![
                descriptor(&[("foo", "x"), ("bar", "bkthomps")]),
                descriptor(&[("foo", "x")]),
            ],
        );
        let first = client
            .should_rate_limit(req.clone())
            .await
            .expect("rpc")
            .into_inner();
        assert_eq!(first.overall_code, Code::Ok as i32);
        assert_eq!(first.statuses[1].limit_remaining, 1);
        let second = client
            .should_rate_limit(req.clone())
            .await
            .expect("rpc")
            .into_inner();
        assert_eq!(second.overall_code, Code::OverLimit as i32);
        assert_eq!(second.statuses[0].code, Code::OverLimit as i32);
        let limit = second.statuses[0].current_limit.as_ref().expect("limit");
        assert_eq!(
            (limit.requests_per_unit, limit.name.as_str()),
            (1, "bkthomps")
        );
        assert!(
            second.statuses[0]
                .duration_until_reset
                .as_ref()
                .expect("reset")
                .seconds
                >= 1
        );
        // foo alone still has 1: the denied request counted nothing.
        let foo = client
            .should_rate_limit(request("rl", vec![descriptor(&[("foo", "x")])]))
            .await
            .expect("rpc")
            .into_inner();
        assert_eq!(foo.overall_code, Code::Ok as i32);
        assert_eq!(foo.statuses[0].limit_remaining, 0);
        // Unlimited and banned descriptors.
        let r = client
            .should_rate_limit(request("rl", vec![descriptor(&[("qux", "any")])]))
            .await
            .expect("rpc")
            .into_inner();
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
        let r = client
            .should_rate_limit(request(
                "rl",
                vec![descriptor(&[("foo", "y"), ("bar", "banned")])],
            ))
            .await
            .expect("rpc")
            .into_inner();
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        // An empty domain is refused.
        let e = client
            .should_rate_limit(request("", vec![descriptor(&[("foo", "x")])]))
            .await
            .expect_err("refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    });
}

/// A call to a method or a service the server does not have is answered
/// `UNIMPLEMENTED` on the same connection, which goes on serving; a
/// malformed `grpc-timeout` is ignored and the longest one is harmless.
#[test]
fn unknown_methods_are_unimplemented_and_the_connection_serves_on() {
    let server = Server::start_on_example();
    rt().block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(server.grpc_url())
            .expect("url")
            .connect()
            .await
            .expect("connect");
        let mut raw = tonic::client::Grpc::new(channel.clone());
        let ask = request("rl", vec![descriptor(&[("foo", "x")])]);
        for path in [
            "/envoy.service.ratelimit.v3.RateLimitService/NoSuchMethod",
            "/no.such.Service/ShouldRateLimit",
            "/",
            "/envoy.service.ratelimit.v3.RateLimitService",
        ] {
            raw.ready().await.expect("ready");
            let e = raw
                .unary::<_, envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse, _>(
                    tonic::Request::new(ask.clone()),
                    http::uri::PathAndQuery::from_static(path),
                    tonic_prost::ProstCodec::default(),
                )
                .await
                .expect_err(path);
            assert_eq!(e.code(), tonic::Code::Unimplemented, "{path}: {e:?}");
        }
        // A malformed grpc-timeout is ignored; the longest one gRPC allows
        // (about 11,000 years) is decided as any other.
        let mut client = RateLimitServiceClient::new(channel);
        for timeout in ["soon", "99999999H"] {
            let mut req = tonic::Request::new(ask.clone());
            req.metadata_mut()
                .insert("grpc-timeout", timeout.parse().expect("ascii"));
            let r = client
                .should_rate_limit(req)
                .await
                .expect("rpc")
                .into_inner();
            assert_eq!(r.overall_code, Code::Ok as i32, "{timeout}");
        }
    });
}

/// `ShouldRateLimit` framed by hand, good and bad: one message in one
/// frame is decided (and so is one split over several data frames); a
/// body that is not exactly one uncompressed message of at most the
/// decoding limit gets the status gRPC's servers give it, and the
/// connection serves on.
#[test]
fn should_rate_limit_answers_malformed_grpc_frames_with_their_status() {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use prost::Message;
    let server = Server::start_on_example();
    rt().block_on(async {
        let mut send = raw_grpc_connection(server.grpc).await;
        let message = request("rl", vec![descriptor(&[("foo", "x")])]).encode_to_vec();
        let ok = raw_grpc_call(&mut send, SHOULD_RATE_LIMIT, &[], grpc_frame(0, &message)).await;
        assert_eq!(ok.status, "0", "{:?}", ok.message);
        let answer = RateLimitResponse::decode(&ok.body[5..]).expect("one framed answer");
        assert_eq!(&ok.body[..5], &grpc_frame(0, &answer.encode_to_vec())[..5]);
        assert_eq!(answer.overall_code, Code::Ok as i32);
        assert_eq!(answer.statuses[0].limit_remaining, 1);
        // foo's second of 2 per minute, from a message in three data frames.
        let framed = grpc_frame(0, &message);
        let split = {
            let mut req = http::Request::post(SHOULD_RATE_LIMIT)
                .header("content-type", "application/grpc")
                .body(())
                .expect("request");
            req.headers_mut()
                .insert("te", http::HeaderValue::from_static("trailers"));
            let (answer, mut out) = send.send_request(req, false).expect("send");
            out.send_data(framed[..3].to_vec().into(), false)
                .expect("data");
            out.send_data(framed[3..9].to_vec().into(), false)
                .expect("data");
            out.send_data(framed[9..].to_vec().into(), true)
                .expect("data");
            let mut body = answer.await.expect("answer").into_body();
            let mut bytes = Vec::new();
            while let Some(c) = body.data().await {
                bytes.extend_from_slice(&c.expect("chunk"));
            }
            RateLimitResponse::decode(&bytes[5..]).expect("answer")
        };
        assert_eq!(split.overall_code, Code::Ok as i32);
        assert_eq!(split.statuses[0].limit_remaining, 0);

        let mut two = grpc_frame(0, &message);
        two.extend(grpc_frame(0, &message));
        let mut long = grpc_frame(0, &message);
        long[1..5].copy_from_slice(&(64u32 << 20).to_be_bytes());
        // (what, headers, body, grpc-status)
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], Vec<u8>, &'a str);
        let cases: Vec<Case<'_>> = vec![
            (
                "gzip",
                &[("grpc-encoding", "gzip")],
                grpc_frame(1, &message),
                "12",
            ),
            (
                "compressed flag, no encoding",
                &[],
                grpc_frame(1, &message),
                "13",
            ),
            ("flag 2", &[], grpc_frame(2, &message), "13"),
            ("empty body", &[], Vec::new(), "13"),
            ("half a prefix", &[], vec![0, 0, 0], "13"),
            (
                "cut short",
                &[],
                grpc_frame(0, &message)[..8].to_vec(),
                "13",
            ),
            ("two messages", &[], two, "13"),
            ("over the limit", &[], long, "11"),
            ("not protobuf", &[], grpc_frame(0, &[0xff; 7]), "13"),
        ];
        for (what, headers, body, want) in cases {
            let r = raw_grpc_call(&mut send, SHOULD_RATE_LIMIT, headers, body).await;
            assert_eq!(r.status, want, "{what}: {:?}", r.message);
        }
        // An invalid request (empty domain) is the caller's error.
        let empty = request("", vec![descriptor(&[("foo", "x")])]).encode_to_vec();
        let r = raw_grpc_call(&mut send, SHOULD_RATE_LIMIT, &[], grpc_frame(0, &empty)).await;
        assert_eq!(r.status, "3", "{:?}", r.message);
        // The connection still decides.
        let bar = request("rl", vec![descriptor(&[("foo", "y")])]).encode_to_vec();
        let r = raw_grpc_call(&mut send, SHOULD_RATE_LIMIT, &[], grpc_frame(0, &bar)).await;
        assert_eq!(r.status, "0", "{:?}", r.message);
    });
}

/// The threads of process `pid` named `grpc-worker-*`, with the CPU time
/// each has run, in microseconds (`/proc/<pid>/task/<tid>/schedstat`).
#[cfg(target_os = "linux")]
fn worker_cpu_us(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks") {
        let dir = task.expect("task").path();
        let Ok(name) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        let name = name.trim().to_owned();
        if !name.starts_with("grpc-worker-") {
            continue;
        }
        let ns: u64 = std::fs::read_to_string(dir.join("schedstat"))
            .expect("schedstat")
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .expect("CPU time in ns");
        out.insert(name, ns / 1000);
    }
    out
}

#[cfg(target_os = "linux")]
#[test]
fn grpc_connections_are_handed_to_the_worker_threads_in_turn() {
    let config = fixture(EXAMPLE_CONFIG);
    let server = Server::start_with_env(
        &["--config", &config, "--grpc-workers", "3"],
        &[("RUST_LOG", "ratelimit_server=debug")],
    );
    let pid = server.child.id();
    // A new thread names itself once it runs: up to 10 s.
    let before = eventually(Duration::from_secs(10), || {
        Some(worker_cpu_us(pid)).filter(|w| w.len() == 3)
    })
    .unwrap_or_else(|| {
        panic!(
            "--grpc-workers 3 starts three worker threads, found {:?}",
            worker_cpu_us(pid)
        )
    });
    rt().block_on(async {
        // Three connections, one after the other: one per worker, which
        // runs their requests (an idle worker runs nothing).
        for c in 0..3 {
            let mut client = RateLimitServiceClient::connect(server.grpc_url())
                .await
                .expect("connect");
            for i in 0..40 {
                let r = client
                    .should_rate_limit(request(
                        "rl",
                        vec![descriptor(&[("foo", &format!("c{c}-{i}"))])],
                    ))
                    .await
                    .expect("rpc")
                    .into_inner();
                assert_eq!(r.overall_code, Code::Ok as i32);
            }
        }
    });
    let after = worker_cpu_us(pid);
    for (name, b) in &before {
        let ran = after[name] - b;
        assert!(
            ran >= 300,
            "{name} ran {ran} us for 40 requests on its connection: connections are not \
             spread over the workers ({before:?} -> {after:?}); the server's log:\n{}",
            server.stderr.lock().expect("log")
        );
    }

    // 0: every connection on the shared runtime, no worker threads.
    let server = Server::start(&["--config", &config, "--grpc-workers", "0"]);
    rt().block_on(async {
        let mut client = RateLimitServiceClient::connect(server.grpc_url())
            .await
            .expect("connect");
        let r = client
            .should_rate_limit(request("rl", vec![descriptor(&[("foo", "x")])]))
            .await
            .expect("rpc")
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32);
    });
    assert!(worker_cpu_us(server.child.id()).is_empty());
}

#[test]
fn a_grpc_connection_is_told_the_most_requests_it_may_have_in_flight() {
    let config = fixture(EXAMPLE_CONFIG);
    // The peer's SETTINGS_MAX_CONCURRENT_STREAMS, as an HTTP/2 client sees
    // it once a request has been answered.
    let advertised = |server: &Server| -> Option<usize> {
        rt().block_on(async {
            let tcp = tokio::net::TcpStream::connect(server.grpc)
                .await
                .expect("connect");
            let (send, conn) = h2::client::handshake(tcp).await.expect("handshake");
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let mut send = send.ready().await.expect("ready");
            let request = http::Request::post(format!(
                "http://{}/grpc.health.v1.Health/Check",
                server.grpc
            ))
            .header("content-type", "application/grpc")
            .body(())
            .expect("request");
            // An empty HealthCheckRequest: a 5-byte gRPC frame of length 0.
            let (response, mut body) = send.send_request(request, false).expect("send");
            body.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
                .expect("data");
            let response = response.await.expect("response");
            assert_eq!(response.status(), http::StatusCode::OK);
            Some(send.current_max_send_streams())
        })
    };
    let server = Server::start(&["--config", &config]);
    assert_eq!(
        advertised(&server),
        Some(ratelimit_server::server::DEFAULT_GRPC_MAX_STREAMS as usize)
    );
    let server = Server::start(&["--config", &config, "--grpc-max-streams", "7"]);
    assert_eq!(advertised(&server), Some(7));

    // Zero would let no request through: refused, naming the option.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
        .args(["--config", &config, "--grpc-max-streams", "0", "--check"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--grpc-max-streams"), "{err}");
}

#[test]
fn the_json_endpoint_answers_200_or_429_with_headers() {
    let dir = temp_dir("json");
    let path = config_file(&dir, 2);
    let server = Server::start(&[
        "--config",
        path.to_str().expect("path"),
        "--response-headers",
    ]);
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.1.1.1"}]}]}"#;
    let a = http(server.http, "POST", "/json", body);
    assert_eq!(a.status, 200, "{a:?}");
    let j = a.json();
    assert_eq!(j["overallCode"], "OK");
    assert_eq!(j["statuses"][0]["limitRemaining"], 1);
    assert_eq!(j["statuses"][0]["currentLimit"]["unit"], "HOUR");
    assert_eq!(
        a.header("ratelimit-policy"),
        Some("\"edge.remote_address\";q=2;w=3600")
    );
    // The second call spends the last unit: admitted, nothing left (the
    // JSON mapping leaves a remaining of 0 out).
    let b = http(server.http, "POST", "/json", body);
    assert_eq!(b.status, 200, "{b:?}");
    let j = b.json();
    assert_eq!(j["overallCode"], "OK", "{b:?}");
    assert_eq!(j["statuses"][0]["code"], "OK", "{b:?}");
    assert_eq!(remaining(&j["statuses"][0]), 0, "{b:?}");
    assert_eq!(j["statuses"][0]["currentLimit"]["requestsPerUnit"], 2);
    let c = http(server.http, "POST", "/json", body);
    assert_eq!(c.status, 429, "{c:?}");
    let j = c.json();
    assert_eq!(j["overallCode"], "OVER_LIMIT", "{c:?}");
    assert_eq!(j["statuses"][0]["code"], "OVER_LIMIT", "{c:?}");
    let retry: u64 = c
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("seconds");
    assert!((1..=3600).contains(&retry));
    // Bad input is a 400 that says why.
    let bad = http(
        server.http,
        "POST",
        "/json",
        r#"{"domain":"edge","descriptors":[{"entries":[{"kee":"x"}]}]}"#,
    );
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("kee"), "{}", bad.body);
    // Metrics and the configuration in force.
    let m = http(server.http, "GET", "/metrics", "");
    assert_eq!(m.status, 200);
    assert!(
        m.body
            .contains("ratelimit_server_requests_total{domain=\"edge\",code=\"over_limit\"} 1"),
        "{}",
        m.body
    );
    assert!(
        m.body
            .contains("ratelimit_server_over_limit{key=\"edge.remote_address\"} 1"),
        "{}",
        m.body
    );
    let c = http(server.http, "GET", "/rlconfig", "");
    assert!(
        c.body
            .contains("edge.remote_address: unit=HOUR requests_per_unit=2"),
        "{}",
        c.body
    );
}

#[test]
fn a_changed_file_is_reloaded_and_a_bad_one_is_kept_out() {
    let dir = temp_dir("reload");
    // A limit per year: the fixed window's count is carried over below,
    // and a year (365 days from the Unix epoch) does not turn during the
    // test (an hour could).
    let yearly = |rpu: u32| {
        write_whole(
            &dir,
            &format!(
                "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: year\n      requests_per_unit: {rpu}\n"
            ),
        )
    };
    let path = yearly(2);
    let server = Server::start(&["--config", path.to_str().expect("path")]);
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.2.2.2"}]}]}"#;
    let limit = || -> Option<u64> {
        let r = http(server.http, "POST", "/json", body);
        r.json()["statuses"][0]["currentLimit"]["requestsPerUnit"].as_u64()
    };
    // Which limit is in force, read from /rlconfig: it spends nothing.
    let in_force = |rpu: u32| {
        http(server.http, "GET", "/rlconfig", "")
            .body
            .contains(&format!(
                "edge.remote_address: unit=YEAR requests_per_unit={rpu},"
            ))
    };
    assert!(in_force(2), "{}", server.log());

    // Spend the limit of 2: admitted with 1 left, admitted with 0 left,
    // then denied (a denied call counts nothing).
    for (call, (status, code, left)) in [(200, "OK", 1), (200, "OK", 0), (429, "OVER_LIMIT", 0)]
        .into_iter()
        .enumerate()
    {
        let r = http(server.http, "POST", "/json", body);
        assert_eq!(r.status, status, "call {call}: {r:?}");
        let j = r.json();
        assert_eq!(j["statuses"][0]["code"], code, "call {call}: {r:?}");
        assert_eq!(remaining(&j["statuses"][0]), left, "call {call}: {r:?}");
        assert_eq!(j["statuses"][0]["currentLimit"]["requestsPerUnit"], 2);
    }

    // Raise the limit to 50: the 2 calls counted under the old limit carry
    // over (service.rs: stored state is kept per descriptor, not per
    // limit). The reload is awaited on /rlconfig, so no call but the next
    // one is counted under the new limit: it leaves 50 - 2 - 1 = 47. A
    // reload that reset the counts would leave 49.
    yearly(50);
    let reloaded = eventually(Duration::from_secs(20), || in_force(50).then_some(()));
    assert!(reloaded.is_some(), "not reloaded: {}", server.log());
    let r = http(server.http, "POST", "/json", body);
    assert_eq!(r.status, 200, "{r:?}");
    let j = r.json();
    assert_eq!(j["statuses"][0]["code"], "OK", "{r:?}");
    assert_eq!(j["statuses"][0]["currentLimit"]["requestsPerUnit"], 50);
    assert_eq!(
        remaining(&j["statuses"][0]),
        47,
        "the 2 calls counted before the reload did not carry over: {r:?}"
    );
    assert_eq!(limit(), Some(50));

    // A file with a mistake: the service keeps the previous configuration
    // and says why.
    write_whole(
        &dir,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
    );
    let logged = eventually(Duration::from_secs(20), || {
        server
            .log()
            .contains("invalid rate limit unit 'fortnight'")
            .then_some(())
    });
    assert!(logged.is_some(), "no error logged: {}", server.log());
    assert_eq!(limit(), Some(50));
    let m = http(server.http, "GET", "/metrics", "");
    assert!(
        m.body
            .contains("ratelimit_server_config_load_error_total 1"),
        "{}",
        m.body
    );

    // SIGHUP reloads too (after the file is fixed).
    config_file(&dir, 7);
    server.hangup();
    let reloaded = eventually(Duration::from_secs(20), || {
        (limit() == Some(7)).then_some(())
    });
    assert!(reloaded.is_some(), "not reloaded: {}", server.log());
}

#[test]
fn health_is_served_and_sigterm_drains_then_exits_cleanly() {
    let mut server = Server::start(&[
        "--config",
        &fixture("examples__ratelimit__config__config.yaml"),
        "--drain-delay",
        "6s",
    ]);
    let url = server.grpc_url();
    // A runtime with a worker thread: the clients' connections keep being
    // driven between checks, so they answer the server's goodbye (HTTP/2
    // GOAWAY and PING) as a live client such as Envoy does.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let status = |service: &str| {
        let url = url.clone();
        let service = service.to_owned();
        rt.block_on(async move {
            let channel = tonic::transport::Endpoint::from_shared(url)
                .ok()?
                .connect()
                .await
                .ok()?;
            let mut client = HealthClient::new(channel);
            let r = client
                .check(HealthCheckRequest { service })
                .await
                .ok()?
                .into_inner();
            Some(r.status)
        })
    };
    assert_eq!(status(""), Some(ServingStatus::Serving as i32));
    assert_eq!(status(RLS), Some(ServingStatus::Serving as i32));
    assert_eq!(http(server.http, "GET", "/healthcheck", "").status, 200);
    // An unknown service is NOT_FOUND.
    let unknown = rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(url.clone())
            .expect("url")
            .connect()
            .await
            .expect("connect");
        let mut client = HealthClient::new(channel);
        client
            .check(HealthCheckRequest {
                service: "nope".into(),
            })
            .await
    });
    assert_eq!(
        unknown.expect_err("not found").code(),
        tonic::Code::NotFound
    );

    server.terminate();
    // During the drain delay: NOT_SERVING, and requests are still answered.
    let draining = eventually(Duration::from_secs(4), || {
        (status(RLS) == Some(ServingStatus::NotServing as i32)).then_some(())
    });
    assert!(
        draining.is_some(),
        "health did not turn NOT_SERVING: {}",
        server.log()
    );
    assert_eq!(http(server.http, "GET", "/healthcheck", "").status, 500);
    let r = http(
        server.http,
        "POST",
        "/json",
        r#"{"domain":"mongo_cps","descriptors":[{"entries":[{"key":"database","value":"users"}]}]}"#,
    );
    assert_eq!(r.status, 200);
    // Then it exits by itself, with 0.
    assert_eq!(
        server.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        server.log()
    );
    assert!(
        server
            .log()
            .contains("every request in flight was answered"),
        "{}",
        server.log()
    );
}
