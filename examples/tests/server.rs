//! The example server behaves as `ratelimit-tower/README.md` says: started
//! as a process, spoken to over loopback with raw HTTP/1.1.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};

struct Server {
    child: Child,
    addr: String,
    /// The lines printed before the "listening on" banner.
    preamble: Vec<String>,
    /// Kept open so that the server never writes to a closed pipe.
    _stdout: BufReader<std::process::ChildStdout>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_addr() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    format!("127.0.0.1:{port}")
}

fn start() -> Server {
    start_with(&[])
}

fn start_with(extra: &[&str]) -> Server {
    let addr = free_addr();
    let mut child = Command::new(env!("CARGO_BIN_EXE_server"))
        .args(["--addr", &addr])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server binary");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut preamble = Vec::new();
    loop {
        let mut line = String::new();
        let n = stdout.read_line(&mut line).expect("read the banner");
        assert!(n > 0, "the server exited before listening: {preamble:?}");
        if line.starts_with("listening on") {
            assert!(
                line.starts_with(&format!("listening on http://{addr}")),
                "{line}"
            );
            break;
        }
        preamble.push(line.trim_end().to_owned());
    }
    Server {
        child,
        addr,
        preamble,
        _stdout: stdout,
    }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn request(server: &Server, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut stream = TcpStream::connect(&server.addr).expect("connect");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
        server.addr
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Content-Length: 0\r\n\r\n");
    stream.write_all(req.as_bytes()).expect("send");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a full response");
    let mut lines = head.lines();
    let status = lines.next().expect("status line")[9..12]
        .parse()
        .expect("status");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

#[test]
fn api_key_plan_missing_key_and_login() {
    let server = start();
    let key = [("x-api-key", "demo-key")];

    let r = request(&server, "GET", "/api/hello", &key);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-ratelimit-limit"), Some("20"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("19"));
    // Both quotas of the plan are listed; the per-minute one binds.
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"api\";q=20;w=12, \"daily\";q=1000;w=86400")
    );
    let state = r.header("ratelimit").unwrap();
    assert!(
        state.starts_with("\"api\";r=19;t=1, \"daily\";r=999;t="),
        "{state}"
    );

    // Burst 20; the bucket refills one token per 0.6 s of wall time, so
    // within a few more requests the burst is spent.
    let denied = (0..40)
        .map(|_| request(&server, "GET", "/api/hello", &key))
        .find(|r| r.status == 429)
        .expect("a 429 after the burst");
    assert_eq!(denied.header("retry-after"), Some("1"));
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        denied.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        denied.body.contains("\"violated-policies\":[\"api\"]"),
        "{}",
        denied.body
    );

    // No key, or a key the server does not know: limited by client IP,
    // one budget for both, apart from demo-key's.
    let r = request(&server, "GET", "/api/hello", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("19"));
    assert!(r.body.contains("hello, ip:127.0.0.1"), "{}", r.body);
    let r = request(&server, "GET", "/api/hello", &[("x-api-key", "invented")]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("18"));

    for i in 0..5 {
        let r = request(&server, "POST", "/login", &[]);
        assert_eq!(r.status, 200, "login attempt {i}");
    }
    let r = request(&server, "POST", "/login", &[]);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("ratelimit-policy"), Some("\"login\";q=5;w=900"));
    let retry: u64 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((899..=900).contains(&retry), "Retry-After {retry}");

    let r = request(&server, "GET", "/", &[]);
    assert_eq!(r.status, 200);
    assert!(r.header("x-ratelimit-limit").is_none());
}

fn examples_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

#[test]
fn the_committed_policy_file_loads() {
    let file = examples_dir().join("policies.toml");
    let server = start_with(&["--config", file.to_str().unwrap()]);
    assert_eq!(
        server.preamble,
        [
            format!(
                "policy \"api\" (from {}): token bucket, 100 per 60s, burst 20",
                file.display()
            ),
            format!(
                "policy \"daily\" (from {}): sliding window counter, 1000 per 86400s",
                file.display()
            ),
            format!(
                "policy \"login\" (from {}): sliding log, 5 per 900s",
                file.display()
            ),
            "API keys known: 1 (demo-key); other requests to /api/* are limited per client IP"
                .to_owned(),
        ]
    );
    let r = request(&server, "GET", "/api/hello", &[("x-api-key", "k")]);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"api\";q=20;w=12, \"daily\";q=1000;w=86400")
    );
}

#[test]
fn policies_from_a_yaml_file_replace_the_defaults() {
    let dir = std::env::temp_dir().join(format!("ratelimit-server-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("policies.yaml");
    std::fs::write(
        &file,
        "policies:\n  - name: api\n    algorithm: sliding_window\n    limit: 3\n    window: 1h\n",
    )
    .unwrap();
    let server = start_with(&["--config", file.to_str().unwrap()]);
    assert!(
        server.preamble[0].ends_with("sliding window counter, 3 per 3600s"),
        "{:?}",
        server.preamble
    );
    // `daily` and `login` were left out: they keep their defaults.
    assert!(
        server.preamble[2].ends_with("sliding log, 5 per 900s"),
        "{:?}",
        server.preamble
    );
    let key = [("x-api-key", "yaml-key")];
    for i in 0..3 {
        let r = request(&server, "GET", "/api/hello", &key);
        assert_eq!(r.status, 200, "request {i}");
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("\"api\";q=3;w=3600, \"daily\";q=1000;w=86400")
        );
    }
    let r = request(&server, "GET", "/api/hello", &key);
    assert_eq!(r.status, 429);
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_invalid_policy_file_stops_the_server_with_the_field_named() {
    let dir = std::env::temp_dir().join(format!("ratelimit-server-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text, says) in [
        (
            "zero.json",
            r#"{"policies": [{"name": "api", "algorithm": "token_bucket", "rate": "100/min", "burst": 0}]}"#,
            "policies[0].burst (policy \"api\"): burst must be greater than zero",
        ),
        (
            "other.toml",
            "[[policies]]\nname = \"search\"\nalgorithm = \"sliding_log\"\nlimit = 1\nwindow = \"1s\"\n",
            "policy \"search\": this server has the policies \"api\", \"daily\" and \"login\"",
        ),
    ] {
        let file = dir.join(name);
        std::fs::write(&file, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_server"))
            .args(["--addr", &free_addr(), "--config", file.to_str().unwrap()])
            .output()
            .expect("run the server binary");
        assert!(!out.status.success(), "{name} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}: it should not listen");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The names of the rate-limit fields a reply carries.
fn rate_limit_fields(r: &Reply) -> Vec<&'static str> {
    [
        "retry-after",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit-policy",
        "ratelimit",
    ]
    .into_iter()
    .filter(|n| r.header(n).is_some())
    .collect()
}

#[test]
fn unknown_urls_and_wrong_methods_are_never_limited() {
    let server = start();
    let not_limited = |method: &str, path: &str, status: u16| {
        let r = request(&server, method, path, &[]);
        assert_eq!(r.status, status, "{method} {path}: {}", r.body);
        assert!(
            rate_limit_fields(&r).is_empty(),
            "{method} {path} carries {:?}",
            rate_limit_fields(&r)
        );
    };
    let login = |remaining: &str| {
        let r = request(&server, "POST", "/login", &[]);
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.header("x-ratelimit-remaining"), Some(remaining));
    };

    // Before exhaustion: a 404 or a 405 costs no login attempt.
    login("4");
    not_limited("GET", "/nope", 404);
    not_limited("GET", "/favicon.ico", 404);
    not_limited("POST", "/nope", 404);
    not_limited("GET", "/login", 405);
    not_limited("GET", "/api/orders", 405);
    login("3");
    login("2");
    login("1");
    login("0");
    assert_eq!(request(&server, "POST", "/login", &[]).status, 429);

    // After exhaustion: unknown URLs are still plain 404s.
    not_limited("GET", "/nope", 404);
    not_limited("GET", "/favicon.ico", 404);
    not_limited("GET", "/login", 405);
    // And so is an unknown URL with an API key, whose plan is untouched.
    let key = [("x-api-key", "demo-key")];
    let r = request(&server, "GET", "/api/nope", &key);
    assert_eq!(r.status, 404);
    assert!(rate_limit_fields(&r).is_empty(), "{:?}", r.headers);
    let r = request(&server, "GET", "/api/hello", &key);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("19"));
}

#[test]
fn unusable_api_keys_have_their_own_answers_and_cost_nothing() {
    let server = start();
    let problem = |r: &Reply, status: u16, kind: &str| {
        assert_eq!(r.status, status, "{}", r.body);
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert!(rate_limit_fields(r).is_empty(), "{:?}", r.headers);
        assert!(
            r.body
                .contains(&format!("\"type\":\"urn:ratelimit:problem:{kind}\"")),
            "{}",
            r.body
        );
    };

    let long = "k".repeat(257);
    let r = request(&server, "GET", "/api/hello", &[("x-api-key", &long)]);
    problem(&r, 431, "key-too-long");
    assert!(r.body.contains("at most 256 bytes"), "{}", r.body);
    let twice = [("x-api-key", "demo-key"), ("x-api-key", "other-key")];
    let r = request(&server, "GET", "/api/hello", &twice);
    problem(&r, 400, "ambiguous-key");

    // None of them touched demo-key's plan.
    let r = request(&server, "GET", "/api/hello", &[("x-api-key", "demo-key")]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("19"));
}

#[test]
fn only_known_api_keys_have_budgets_of_their_own() {
    let keys = temp_file("keys.txt", "# issued keys\nalpha\n\n  beta  \n");
    let server = start_with(&["--keys", keys.to_str().unwrap()]);
    assert!(
        server
            .preamble
            .iter()
            .any(|l| l.starts_with("API keys known: 2 (from ")),
        "{:?}",
        server.preamble
    );
    let remaining = |key: &str| {
        let r = request(&server, "GET", "/api/hello", &[("x-api-key", key)]);
        assert_eq!(r.status, 200, "{key}: {}", r.body);
        r.header("x-ratelimit-remaining").unwrap().to_owned()
    };
    assert_eq!(remaining("alpha"), "19");
    assert_eq!(remaining("beta"), "19");
    // demo-key is known only without --keys: here it is the client
    // address's budget, which every invented key draws on too. A fresh key
    // per request does not escape the limit: the burst (20, one token back
    // per 0.6 s) is soon spent.
    assert_eq!(remaining("demo-key"), "19");
    let denied = (0..60)
        .map(|i| {
            let key = format!("invented-{i}");
            request(&server, "GET", "/api/hello", &[("x-api-key", key.as_str())])
        })
        .find(|r| r.status == 429);
    assert!(denied.is_some(), "invented keys were never denied");
    // The known keys' budgets are untouched (one more token, if refilled).
    assert!(["18", "19"].contains(&remaining("alpha").as_str()));
}

#[test]
fn an_unreadable_key_file_stops_the_server() {
    let out = Command::new(env!("CARGO_BIN_EXE_server"))
        .args(["--addr", &free_addr(), "--keys", "/nonexistent/keys.txt"])
        .output()
        .expect("run the server binary");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read the API keys: /nonexistent/keys.txt"),
        "{err}"
    );
}

/// Writes `text` to a fresh file under the temporary directory.
fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ratelimit-server-{}-{}",
        std::process::id(),
        name.replace('.', "-")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(name);
    std::fs::write(&file, text).unwrap();
    file
}

#[test]
fn a_caller_over_its_daily_quota_keeps_its_per_minute_tokens() {
    let file = temp_file(
        "daily.toml",
        "[[policies]]\nname = \"daily\"\nalgorithm = \"sliding_window\"\nlimit = 3\nwindow = \"1d\"\n",
    );
    let server = start_with(&["--config", file.to_str().unwrap()]);
    let key = [("x-api-key", "daily-key")];
    for i in 0..3 {
        assert_eq!(
            request(&server, "GET", "/api/hello", &key).status,
            200,
            "#{i}"
        );
    }
    let mut first_reset = None;
    for i in 0..10 {
        let r = request(&server, "GET", "/api/hello", &key);
        assert_eq!(r.status, 429);
        // The 429 names the daily policy: its limit, its Retry-After.
        assert!(
            r.body.contains("\"violated-policies\":[\"daily\"]"),
            "{}",
            r.body
        );
        assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!(retry > 60, "the daily quota's wait, not a token's: {retry}");
        // The first denial is the store's, the rest come from the deny
        // cache: every one carries every field, as the store's does.
        assert_eq!(
            rate_limit_fields(&r),
            [
                "retry-after",
                "x-ratelimit-limit",
                "x-ratelimit-remaining",
                "x-ratelimit-reset",
                "ratelimit-policy",
                "ratelimit",
            ],
            "429 #{i}: {:?}",
            r.headers
        );
        assert_eq!(r.header("x-ratelimit-remaining"), Some("0"), "#{i}");
        // The same reset instant each time (to the second it is rounded to).
        let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
        let first = *first_reset.get_or_insert(reset);
        assert!(
            first.abs_diff(reset) <= 1,
            "#{i}: reset {reset}, first {first}"
        );
        // The per-minute tokens were not spent on the denials: 17 left
        // after three admitted (more if one refilled), on every 429.
        let state = r.header("ratelimit").unwrap();
        let api_left: u64 = state
            .strip_prefix("\"api\";r=")
            .and_then(|rest| rest.split(';').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{state}"));
        assert!(api_left >= 17, "#{i}: {state}");
        assert!(state.contains(", \"daily\";r=0;t="), "#{i}: {state}");
    }
}

/// One sample of the Prometheus text format: name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// Parses the Prometheus text format.
fn prometheus_samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("a value");
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').expect("label=value");
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            (name.to_owned(), labels, value.parse().expect("a number"))
        })
        .collect()
}

#[test]
fn metrics_count_the_decisions_of_a_scripted_run() {
    let file = temp_file(
        "metrics.toml",
        "[[policies]]\nname = \"daily\"\nalgorithm = \"fixed_window\"\nlimit = 3\nwindow = \"1d\"\n",
    );
    let server = start_with(&["--config", file.to_str().unwrap()]);
    let key = [("x-api-key", "metrics-key")];
    // 3 admitted, then 4 denied: the first by the store, the rest from the
    // deny cache (the store denied that cost until tomorrow).
    for _ in 0..7 {
        request(&server, "GET", "/api/hello", &key);
    }
    request(&server, "POST", "/login", &[]);
    let r = request(&server, "GET", "/metrics", &[]);
    assert_eq!(r.status, 200);
    assert!(r.header("x-ratelimit-limit").is_none(), "not limited");
    let samples = prometheus_samples(&r.body);
    let decisions = |ns: &str, outcome: &str, source: &str| -> f64 {
        samples
            .iter()
            .filter(|(n, labels, _)| {
                let has = |k: &str, v: &str| labels.iter().any(|(a, b)| a == k && b == v);
                n == "ratelimit_decisions_total"
                    && has("namespace", ns)
                    && has("outcome", outcome)
                    && has("source", source)
            })
            .map(|(_, _, v)| v)
            .sum()
    };
    assert_eq!(decisions("api", "allowed", "store"), 3.0, "{}", r.body);
    assert_eq!(decisions("api", "denied", "store"), 1.0, "{}", r.body);
    assert_eq!(decisions("api", "denied", "cache"), 3.0, "{}", r.body);
    assert_eq!(decisions("login", "allowed", "store"), 1.0, "{}", r.body);
    // The denials name the daily policy; no caller key is ever a label.
    assert!(
        samples
            .iter()
            .any(|(n, labels, _)| n == "ratelimit_decisions_total"
                && labels.iter().any(|(k, v)| k == "policy" && v == "daily"))
    );
    assert!(
        !r.body.contains("metrics-key"),
        "a caller key leaked into the metrics"
    );
    assert!(
        samples
            .iter()
            .any(|(n, _, _)| n.starts_with("ratelimit_store_duration_seconds")),
        "{}",
        r.body
    );
    assert!(
        samples
            .iter()
            .any(|(n, _, v)| n == "ratelimit_deny_cache_hits_total" && *v == 3.0),
        "{}",
        r.body
    );
}

/// The metric names of the limiters, each to be described.
const METRICS: [&str; 4] = [
    "ratelimit_decisions_total",
    "ratelimit_policy_decisions_total",
    "ratelimit_store_duration_seconds",
    "ratelimit_deny_cache_hits_total",
];

#[test]
fn metrics_are_described_latency_is_a_histogram_and_every_policy_is_labelled() {
    let file = temp_file(
        "metrics-help.toml",
        "[[policies]]\nname = \"daily\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1d\"\n",
    );
    // The server builds its limiters before it installs the recorder.
    let server = start_with(&["--config", file.to_str().unwrap()]);
    let key = [("x-api-key", "help-key")];
    // One admitted: `daily` has not bound yet, and yet has its series.
    assert_eq!(request(&server, "GET", "/api/hello", &key).status, 200);
    let text = request(&server, "GET", "/metrics", &[]).body;
    let samples = prometheus_samples(&text);
    let has = |labels: &[(String, String)], k: &str, v: &str| {
        labels.iter().any(|(a, b)| a == k && b == v)
    };
    for policy in ["api", "daily"] {
        let n: f64 = samples
            .iter()
            .filter(|(n, l, _)| {
                n == "ratelimit_policy_decisions_total"
                    && has(l, "policy", policy)
                    && has(l, "outcome", "allowed")
            })
            .map(|(_, _, v)| v)
            .sum();
        assert_eq!(n, 1.0, "policy {policy:?} checked once:\n{text}");
    }
    // Three more: the second admitted, the third denied by `daily`, the
    // fourth from the deny cache.
    for status in [200, 429, 429] {
        assert_eq!(request(&server, "GET", "/api/hello", &key).status, status);
    }
    let text = request(&server, "GET", "/metrics", &[]).body;
    for name in METRICS {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("# HELP {name} ")) && l.len() > name.len() + 10),
            "no description of {name}:\n{text}"
        );
    }
    assert!(
        text.contains("# TYPE ratelimit_store_duration_seconds histogram"),
        "store latency is not a histogram:\n{text}"
    );
    // The documented buckets, in seconds, as `le` labels of the api limiter.
    let samples = prometheus_samples(&text);
    let buckets: Vec<f64> = samples
        .iter()
        .filter(|(n, l, _)| {
            n == "ratelimit_store_duration_seconds_bucket" && has(l, "namespace", "api")
        })
        .filter_map(|(_, l, _)| l.iter().find(|(k, _)| k == "le"))
        .filter(|(_, v)| v != "+Inf")
        .map(|(_, v)| v.parse().unwrap())
        .collect();
    assert_eq!(
        buckets,
        [
            0.00001, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25
        ],
        "{text}"
    );
    // `daily`'s own denials: the store's and the cache's.
    let daily = |outcome: &str, source: &str| -> f64 {
        samples
            .iter()
            .filter(|(n, l, _)| {
                n == "ratelimit_policy_decisions_total"
                    && has(l, "policy", "daily")
                    && has(l, "outcome", outcome)
                    && has(l, "source", source)
            })
            .map(|(_, _, v)| v)
            .sum()
    };
    assert_eq!(daily("allowed", "store"), 2.0, "{text}");
    assert_eq!(daily("denied", "store"), 1.0, "{text}");
    assert_eq!(daily("denied", "cache"), 1.0, "{text}");
}
