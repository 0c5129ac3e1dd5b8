//! Shared by the integration tests: the real binary on loopback ports, a
//! tiny HTTP client, and request builders.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// The binary under test, started with `args` on free loopback ports;
/// killed (by its pid) on drop.
pub struct Server {
    pub child: Child,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Server {
    pub fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[("RUST_LOG", "info")])
    }

    /// The binary on envoyproxy/ratelimit's example configuration (domain
    /// `rl`), with nothing else set.
    pub fn start_on_example() -> Self {
        Self::start(&["--config", &fixture(EXAMPLE_CONFIG)])
    }

    /// As [`Server::start`], with environment variables.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ratelimit-server");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut l) = log2.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
        });
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let (mut grpc, mut http) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(60);
        while grpc.is_none() || http.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(a) = line.strip_prefix("ratelimit-server: gRPC on ") {
                        grpc = a.trim().parse().ok();
                    } else if let Some(a) = line.strip_prefix("ratelimit-server: HTTP on ") {
                        http = a.trim().parse().ok();
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "ratelimit-server did not start: {}",
                        log.lock().map(|l| l.clone()).unwrap_or_default()
                    );
                }
            }
        }
        Self {
            child,
            grpc: grpc.expect("grpc address"),
            http: http.expect("http address"),
            stderr: log,
        }
    }

    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    pub fn log(&self) -> String {
        self.stderr.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Sends SIGTERM (by pid).
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Sends SIGHUP (by pid).
    pub fn hangup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits (bounded) for the process to exit; its exit code.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary with `args` and `env` until it exits (at most 60 s):
/// its exit code and everything it wrote.
pub fn run_to_exit(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ratelimit-server");
    let deadline = Instant::now() + Duration::from_secs(60);
    let code = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut out);
    }
    (code, out)
}

/// A response of [`http`].
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// One HTTP/1.1 request (`Connection: close`) over loopback.
pub fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> HttpResponse {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    HttpResponse {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// Polls `f` every 20 ms until it returns `Some`, at most `within`.
pub fn eventually<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A descriptor of `(key, value)` entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A request for `domain` with `descriptors`.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

/// envoyproxy/ratelimit's example configuration, as a fixture name.
pub const EXAMPLE_CONFIG: &str = "examples__ratelimit__config__example.yaml";

/// A fixture of envoyproxy/ratelimit's files.
pub fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/envoyproxy-ratelimit")
        .join(name)
        .display()
        .to_string()
}

/// A fresh directory under the target directory.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ratelimit-server-{name}-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Writes `edge.yaml` in `dir`: one descriptor (`remote_address`) of
/// `rpu` requests an hour, written whole (see [`write_whole`]).
pub fn config_file(dir: &std::path::Path, rpu: u32) -> std::path::PathBuf {
    write_whole(
        dir,
        &format!(
            "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: hour\n      requests_per_unit: {rpu}\n"
        ),
    )
}

/// Replaces `edge.yaml` in `dir` with `text` at once (written beside it,
/// then renamed over it, as editors and ConfigMaps do), so that the
/// watching server never reads a half-written file.
pub fn write_whole(dir: &std::path::Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("edge.yaml");
    let part = dir.join(".edge.yaml.part");
    std::fs::write(&part, text).expect("write config");
    std::fs::rename(&part, &path).expect("rename config");
    path
}

/// A gRPC call framed by hand on an HTTP/2 connection (no gRPC client
/// between the test and the server: what a client would refuse to send,
/// or enforce itself, reaches the server as written).
pub struct RawCall {
    /// The answer's `grpc-status`.
    pub status: String,
    /// Its `grpc-message`, if any.
    pub message: Option<String>,
    /// The bytes of the answer's body.
    pub body: Vec<u8>,
}

/// A gRPC frame: the compressed flag, the length, the bytes.
pub fn grpc_frame(compressed: u8, message: &[u8]) -> Vec<u8> {
    let mut f = vec![compressed];
    f.extend_from_slice(&u32::try_from(message.len()).expect("len").to_be_bytes());
    f.extend_from_slice(message);
    f
}

/// Sends `body` in one data frame to `path` with `headers` (beside the
/// content type and `te`), and reads the answer's status, from its
/// headers (trailers-only) or its trailers.
pub async fn raw_grpc_call(
    send: &mut h2::client::SendRequest<bytes::Bytes>,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> RawCall {
    let mut req = http::Request::post(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(()).expect("request");
    let (answer, mut out) = send.send_request(req, false).expect("send");
    out.send_data(body.into(), true).expect("data");
    let answer = answer.await.expect("answer");
    let text =
        |h: &http::HeaderMap, k: &str| h.get(k).map(|v| v.to_str().expect("ascii").to_owned());
    if let Some(status) = text(answer.headers(), "grpc-status") {
        return RawCall {
            status,
            message: text(answer.headers(), "grpc-message"),
            body: Vec::new(),
        };
    }
    let mut stream = answer.into_body();
    let mut body = Vec::new();
    while let Some(chunk) = stream.data().await {
        let chunk = chunk.expect("chunk");
        let _ = stream.flow_control().release_capacity(chunk.len());
        body.extend_from_slice(&chunk);
    }
    let trailers = stream
        .trailers()
        .await
        .expect("trailers")
        .expect("some trailers");
    RawCall {
        status: text(&trailers, "grpc-status").expect("grpc-status"),
        message: text(&trailers, "grpc-message"),
        body,
    }
}

/// An HTTP/2 connection to `addr` for [`raw_grpc_call`] (driven by a task
/// of the current runtime).
pub async fn raw_grpc_connection(addr: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (send, conn) = h2::client::handshake(tcp).await.expect("HTTP/2");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}

/// `ShouldRateLimit`'s path.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
