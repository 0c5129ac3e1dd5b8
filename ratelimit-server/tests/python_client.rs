//! A gRPC client this project did not write drives the service: Python's
//! `grpcio`, with Envoy's own `.proto` files (the envoy-types crate's
//! copies) compiled at test time by `grpcio-tools`, and
//! `grpcio-health-checking`'s health stub.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use common::{EXAMPLE_CONFIG, Server, fixture};

const INSTALL: &str = "pip install grpcio grpcio-tools grpcio-health-checking";

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// Fails with the install command when Python or the packages are missing.
fn require_grpcio() {
    let out = Command::new(python())
        .args([
            "-c",
            "import grpc, grpc_tools.protoc, grpc_health.v1.health_pb2",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "this test drives the service with Python's grpcio, which is missing: {}\n\
             install it with: {INSTALL}\n(or set PYTHON to an interpreter that has it)",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => {
            panic!("this test needs python3 with grpcio ({e}); install Python 3, then: {INSTALL}")
        }
    }
}

/// The `proto` directory of the envoy-types crate's sources, found through
/// `cargo metadata`.
fn envoy_protos() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let run = |offline: bool| {
        let mut c = Command::new(&cargo);
        c.args([
            "metadata",
            "--format-version",
            "1",
            "--manifest-path",
            manifest,
        ]);
        if offline {
            c.arg("--offline");
        }
        c.output().ok().filter(|o| o.status.success())
    };
    let out = run(true)
        .or_else(|| run(false))
        .expect("cargo metadata (to find the envoy-types crate's .proto files)");
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata JSON");
    let manifest_path = meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "envoy-types"))
        .and_then(|p| p["manifest_path"].as_str())
        .expect("envoy-types among the dependencies");
    let root = PathBuf::from(manifest_path)
        .parent()
        .expect("crate dir")
        .join("proto");
    assert!(
        root.join("data-plane-api/envoy/service/ratelimit/v3/rls.proto")
            .is_file(),
        "no rls.proto under {}",
        root.display()
    );
    root
}

fn run_client(server: &Server, scenario: &Value) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/rls_client.py");
    let mut child = Command::new(python())
        .arg(script)
        .arg(envoy_protos())
        .arg(server.grpc.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the Python client");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(scenario.to_string().as_bytes())
        .expect("write the scenario");
    let out = child.wait_with_output().expect("the Python client");
    assert!(
        out.status.success(),
        "the Python client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
    })
}

#[test]
fn python_grpcio_with_envoys_protos_drives_should_rate_limit_and_health() {
    require_grpcio();
    let server = Server::start(&["--config", &fixture(EXAMPLE_CONFIG), "--response-headers"]);
    let pair = json!({"domain": "rl", "descriptors": [
        {"entries": [{"key": "foo", "value": "x"}, {"key": "bar", "value": "bkthomps"}]},
        {"entries": [{"key": "foo", "value": "x"}]}
    ]});
    let shady = json!({"domain": "rl", "descriptors": [
        {"entries": [{"key": "foo", "value": "a"}, {"key": "baz", "value": "shady"}]}
    ]});
    let overridden = json!({"domain": "rl", "descriptors": [
        {"entries": [{"key": "foo", "value": "z"}], "limit": {"requestsPerUnit": 1, "unit": "HOUR"}}
    ]});
    let weighted = json!({"domain": "rl", "hitsAddend": 3, "descriptors": [
        {"entries": [{"key": "category", "value": "account"}]}
    ]});
    let scenario = json!({
        "calls": [
            pair, pair,
            shady, shady, shady, shady,
            overridden, overridden,
            weighted, weighted,
            {"domain": "", "descriptors": [{"entries": [{"key": "foo", "value": "x"}]}]},
        ],
        "health": ["", "envoy.service.ratelimit.v3.RateLimitService", "nope"],
    });
    let out = run_client(&server, &scenario);
    let r = &out["responses"];

    // The pair: admitted, then denied by bkthomps (1/min) with foo not
    // charged; the client decodes every field.
    assert_eq!(r[0]["overallCode"], "OK", "{r}");
    assert_eq!(r[0]["statuses"][1]["limitRemaining"], 1);
    assert_eq!(r[0]["statuses"][1]["currentLimit"]["unit"], "MINUTE");
    assert_eq!(r[0]["statuses"][1]["currentLimit"]["requestsPerUnit"], 2);
    assert_eq!(r[1]["overallCode"], "OVER_LIMIT");
    assert_eq!(r[1]["statuses"][0]["code"], "OVER_LIMIT");
    assert_eq!(r[1]["statuses"][0]["currentLimit"]["name"], "bkthomps");
    assert_eq!(r[1]["statuses"][1]["code"], "OK");
    assert_eq!(
        r[1]["statuses"][1]["limitRemaining"], 1,
        "foo was not charged"
    );
    let reset = r[1]["statuses"][0]["durationUntilReset"]
        .as_str()
        .expect("duration");
    assert!(reset.ends_with('s'), "{reset}");
    // The IETF fields travel in response_headers_to_add.
    let headers = r[1]["responseHeadersToAdd"].as_array().expect("headers");
    let get = |name: &str| {
        headers
            .iter()
            .find(|h| h["key"] == name)
            .and_then(|h| h["value"].as_str())
            .map(str::to_owned)
    };
    assert_eq!(
        get("RateLimit-Policy").as_deref(),
        Some("\"bkthomps\";q=1;w=60, \"rl.foo\";q=2;w=60")
    );
    assert!(get("Retry-After").is_some());

    // shadow_mode: 3/min, the fourth call is over but answered OK.
    for i in 2..6 {
        assert_eq!(r[i]["overallCode"], "OK", "call {i}: {}", r[i]);
        assert_eq!(r[i]["statuses"][0]["code"], "OK");
    }
    // A limit Envoy sends with the descriptor applies.
    assert_eq!(r[6]["overallCode"], "OK");
    assert_eq!(r[6]["statuses"][0]["currentLimit"]["unit"], "HOUR");
    assert_eq!(r[7]["overallCode"], "OVER_LIMIT");
    // hits_addend 3 against 4/min: then 3 more is over, and counts nothing.
    assert_eq!(r[8]["overallCode"], "OK");
    assert_eq!(r[8]["statuses"][0]["limitRemaining"], 1);
    assert_eq!(r[9]["overallCode"], "OVER_LIMIT");
    assert_eq!(r[9]["statuses"][0]["limitRemaining"], 1);
    // An empty domain is refused with a status the client understands.
    assert_eq!(r[10]["error"]["code"], "INVALID_ARGUMENT", "{}", r[10]);
    assert!(
        r[10]["error"]["details"]
            .as_str()
            .unwrap_or("")
            .contains("domain")
    );

    let h = &out["health"];
    assert_eq!(h[""], "SERVING");
    assert_eq!(h["envoy.service.ratelimit.v3.RateLimitService"], "SERVING");
    assert_eq!(h["nope"], "NOT_FOUND");
}
