//! An HTTP API behind `ratelimit-tower`.
//!
//! ```text
//! cargo run -p ratelimit-examples --bin server                                   # in-process store
//! cargo run -p ratelimit-examples --bin server -- --redis redis://127.0.0.1:6379/ # shared Redis
//! cargo run -p ratelimit-examples --bin server -- --addr 127.0.0.1:8080
//! cargo run -p ratelimit-examples --bin server -- --config examples/policies.toml
//! cargo run -p ratelimit-examples --bin server -- --keys known-keys.txt            # the API keys issued
//! ```
//!
//! - `GET /api/hello`, `POST /api/orders`: the per-API-key plan, two quotas
//!   decided all or nothing: "100 per minute, burst 20" (policy `api`, token
//!   bucket) and "1,000 per day" (policy `daily`, sliding window counter),
//!   keyed by `x-api-key` **when the key is one the server knows**
//!   (`--keys FILE`; default: `demo-key` only); a request with an unknown
//!   key or none is limited by client IP, under the same plan. The header is
//!   unauthenticated: limited on as sent, every invented key would be a
//!   fresh budget and a new entry in the store's memory for a day. A caller
//!   over its daily quota gets a 429 naming `daily` and keeps its
//!   per-minute tokens. A key over 256 bytes is a `431`, the header sent
//!   twice a `400`, known or not. While the store is
//!   unavailable it keeps limiting **in process**, at each limit divided by
//!   `--instances N` (the servers sharing the quota; default 1): a store
//!   outage must not become an API outage, nor switch the limit off.
//!   Repeated 429s are answered from the limiter's deny cache without a
//!   store round trip.
//! - `POST /login`: 5 attempts per 15 minutes per client IP (sliding log,
//!   exact in every trailing window). Fails **closed** (`503`): a store
//!   outage must not hand a password guesser unlimited attempts.
//! - `GET /`: a short description, not limited.
//! - `GET /metrics`: the limiters' metrics in the Prometheus text format,
//!   each with its `# HELP` line: decisions by binding policy, outcome and
//!   source; every policy's own decisions (`daily` is there from the first
//!   call, long before it binds); store latency as a histogram with the
//!   buckets [`STORE_DURATION_BUCKETS`]; failures; breaker; deny-cache hits.
//!   Not limited.
//!
//! Any other URL is a plain `404` (and a wrong method a `405`): not counted,
//! no rate-limit headers.
//!
//! `--config FILE` reads the policies `api`, `daily` and `login` from a
//! TOML, YAML or JSON file (see `examples/policies.toml`); a policy the file leaves out
//! keeps its default above, and any other name is an error.
//!
//! `--keys FILE` reads the API keys the server knows, one per line (blank
//! lines and lines starting with `#` ignored, surrounding whitespace
//! trimmed). A real service would check its own key store, or
//! authenticate in a layer before the limiter and key on what that layer
//! found ([`KeyExtractor::extension`]).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::{Extension, Router};
use exactlimit::tower::RateLimitInfo;
use exactlimit::{
    Algorithm, DenyCache, FailurePolicy, KeyExtractor, Limiter, LocalStore, MissingKey, Quota,
    Rate, RateLimitLayer, RedisStore, Store,
};
use http::HeaderName;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// The buckets of `ratelimit_store_duration_seconds`, in seconds: from an
/// in-process store's microseconds, through a Redis round trip's fraction of
/// a millisecond, to past the limiters' 50 ms timeout. A histogram's buckets
/// add up across instances; a summary's quantiles do not.
const STORE_DURATION_BUCKETS: [f64; 12] = [
    0.00001, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25,
];

/// The API keys the server knows without `--keys`.
const DEMO_KEYS: [&str; 1] = ["demo-key"];

const USAGE: &str = "usage: server [--addr <HOST:PORT>] [--redis <URL>] [--instances <N>] [--config <FILE>] [--keys <FILE>]\n\
    \n  --addr       listen address (default 127.0.0.1:3000)\
    \n  --redis      share limits through Redis at URL (default: in-process store)\
    \n  --instances  servers sharing the limits (default 1): while Redis is unavailable each\
    \n               keeps limiting in process at its share, each limit / N\
    \n  --config     read the policies \"api\", \"daily\" and \"login\" from a .toml, .yaml or .json file\
    \n  --keys       the API keys this server knows, one per line (default: demo-key). /api/* is\
    \n               limited per x-api-key only for a known key; an unknown key or none is limited\
    \n               per client IP, so that invented keys buy no budget and no memory";

struct Args {
    addr: SocketAddr,
    redis: Option<String>,
    instances: u32,
    config: Option<PathBuf>,
    keys: Option<PathBuf>,
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut args = Args {
        addr: SocketAddr::from(([127, 0, 0, 1], 3000)),
        redis: None,
        instances: 1,
        config: None,
        keys: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--addr" => {
                let v = it.next().ok_or("--addr needs a value")?;
                args.addr = v.parse().map_err(|e| format!("--addr {v}: {e}"))?;
            }
            "--redis" => args.redis = Some(it.next().ok_or("--redis needs a URL")?),
            "--instances" => {
                let v = it.next().ok_or("--instances needs a number")?;
                args.instances = v.parse().ok().filter(|&n| n > 0).ok_or(format!(
                    "--instances {v}: give the number of servers, at least 1"
                ))?;
            }
            "--config" => args.config = Some(it.next().ok_or("--config needs a file")?.into()),
            "--keys" => args.keys = Some(it.next().ok_or("--keys needs a file")?.into()),
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(args))
}

/// The policies the server enforces.
struct Policies {
    api: Quota,
    daily: Quota,
    login: Quota,
}

impl Policies {
    /// The plan as sold, "100 per minute, burst 20, and 1,000 per day";
    /// logins 5 per 15 minutes.
    fn defaults() -> Result<Self, exactlimit::ConfigError> {
        Ok(Self {
            api: Quota::token_bucket(Rate::per_minute(100), 20)?.named("api")?,
            daily: Quota::sliding_window(Rate::per_day(1_000))?.named("daily")?,
            login: Quota::sliding_log(Rate::new(5, Duration::from_secs(15 * 60)))?
                .named("login")?,
        })
    }

    /// The defaults, with the policies `api`, `daily` and `login` that
    /// `path` gives taken from it.
    fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let mut policies = Self::defaults().map_err(|e| e.to_string())?;
        let quotas = exactlimit::config::from_path(path).map_err(|e| e.to_string())?;
        for quota in quotas {
            match quota.name() {
                "api" => policies.api = quota,
                "daily" => policies.daily = quota,
                "login" => policies.login = quota,
                other => {
                    return Err(format!(
                        "policy {other:?}: this server has the policies \"api\", \"daily\" and \
                         \"login\"; rename or remove {other:?}"
                    ));
                }
            }
        }
        Ok(policies)
    }
}

/// "token bucket, 100 per 60 s, burst 20" or "sliding log, 5 per 900 s".
fn describe(quota: &Quota) -> String {
    match quota.algorithm() {
        Algorithm::TokenBucket(b) => format!(
            "{}, {} per {:?}, burst {}",
            quota.kind(),
            b.rate().count(),
            b.rate().period(),
            b.capacity()
        ),
        _ => format!(
            "{}, {} per {:?}",
            quota.kind(),
            quota.limit(),
            quota.window()
        ),
    }
}

/// The API keys in `path`: one per line; blank lines and `#` comments
/// ignored, surrounding whitespace trimmed.
fn read_keys(path: &std::path::Path) -> Result<HashSet<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect())
}

fn layers(
    store: Arc<dyn Store>,
    policies: Policies,
    instances: u32,
    known_keys: HashSet<String>,
) -> Result<(RateLimitLayer, RateLimitLayer), Box<dyn std::error::Error>> {
    // Degraded: decided in process at each limit / instances (the default
    // degraded mode, made explicit by giving the number of servers once).
    let api = Limiter::builder_arc(Arc::clone(&store))
        .quota(policies.api)
        .quota(policies.daily)
        .deny_cache(DenyCache::default())
        .namespace("api")?
        .instances(instances)
        .timeout(Duration::from_millis(50))
        .build()?;
    let api_key = HeaderName::from_static("x-api-key");
    // A known API key has a budget of its own; an unknown one (or none)
    // shares its client IP's: the header is not authenticated, and keying
    // on whatever a client sends would let it mint unlimited budgets.
    let api = RateLimitLayer::new(api)
        .key(
            KeyExtractor::header(api_key.clone())
                .verified(move |key| known_keys.contains(key))
                .or(KeyExtractor::client_ip()),
        )
        .on_missing_key(MissingKey::unauthorized_api_key(&api_key));

    let login = Limiter::builder_arc(store)
        .quota(policies.login)
        .namespace("login")?
        .failure_policy(FailurePolicy::FailClosed)
        .timeout(Duration::from_millis(50))
        .build()?;
    // Directly exposed: the peer address is the client. Behind a reverse
    // proxy use KeyExtractor::forwarded_ip(x-forwarded-for, <proxies>).
    let login = RateLimitLayer::new(login).key(KeyExtractor::client_ip());
    Ok((api, login))
}

async fn index() -> &'static str {
    "ratelimit example server\n\
     GET  /api/hello   policies \"api\" and \"daily\" per known x-api-key, else per client IP (default: 100/min, burst 20, token bucket; and 1,000/day, sliding window; while the store is unavailable, in process at each limit / --instances)\n\
     POST /api/orders  same policy; send an Idempotency-Key, 429s invite retries\n\
     POST /login       policy \"login\" per client IP (default: 5 per 15 min, sliding log; fails closed)\n\
     GET  /metrics     the limiters' metrics, Prometheus text format\n"
}

async fn hello(Extension(info): Extension<RateLimitInfo>) -> String {
    match info.decision.source {
        exactlimit::Source::Store => format!(
            "hello, {}: {} of {} left in policy {:?}\n",
            info.key, info.decision.remaining, info.decision.limit, info.policy
        ),
        exactlimit::Source::Fallback => format!(
            "hello, {}: the limiter's store is unavailable; admitted in process ({} of this \
             server's share of {} left)\n",
            info.key, info.decision.remaining, info.decision.limit
        ),
        _ => format!(
            "hello, {}: admitted without the store ({:?})\n",
            info.key, info.decision.source
        ),
    }
}

async fn order() -> &'static str {
    "order accepted (a real handler would deduplicate on Idempotency-Key)\n"
}

async fn login() -> &'static str {
    "login attempt recorded (this demo checks no password)\n"
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match ratelimit_examples::args_or_exit(parse_args(), USAGE) {
        Ok(args) => args,
        Err(code) => return code,
    };
    let policies = match &args.config {
        None => Policies::defaults().map_err(|e| e.to_string()),
        Some(path) => Policies::from_file(path),
    };
    let policies = match policies {
        Ok(policies) => policies,
        Err(e) => {
            eprintln!("invalid rate-limit configuration: {e}");
            return ExitCode::FAILURE;
        }
    };
    let source = match &args.config {
        Some(path) => format!("from {}", path.display()),
        None => "default".to_owned(),
    };
    let summary = format!(
        "policy \"api\" ({source}): {}\npolicy \"daily\" ({source}): {}\npolicy \"login\" \
         ({source}): {}",
        describe(&policies.api),
        describe(&policies.daily),
        describe(&policies.login)
    );
    let (store, backend): (Arc<dyn Store>, String) = match &args.redis {
        None => (
            Arc::new(LocalStore::new()),
            "in-process LocalStore (per-process protection only: N instances allow N x the limit)"
                .to_owned(),
        ),
        Some(url) => match RedisStore::connect(url).await {
            Ok(store) => (Arc::new(store), format!("RedisStore at {url}")),
            Err(e) => {
                eprintln!("cannot use Redis at {url}: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let known_keys = match &args.keys {
        None => DEMO_KEYS.iter().map(|k| (*k).to_owned()).collect(),
        Some(path) => match read_keys(path) {
            Ok(keys) => keys,
            Err(e) => {
                eprintln!("cannot read the API keys: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let summary = format!(
        "{summary}\nAPI keys known: {} ({}); other requests to /api/* are limited per client IP",
        known_keys.len(),
        match &args.keys {
            Some(path) => format!("from {}", path.display()),
            None => "demo-key".to_owned(),
        }
    );
    let (api, login_limit) = match layers(store, policies, args.instances, known_keys) {
        Ok(layers) => layers,
        Err(e) => {
            eprintln!("invalid rate-limit configuration: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Each limit wraps only its handlers (`route_layer` on the method
    // router): an unknown URL (404) or a wrong method (405) never reaches a
    // limiter, so it costs no login attempt and is never answered 429 or 503.
    // Metrics through the `metrics` facade, rendered by the Prometheus
    // exporter's recorder (no listener of its own: `/metrics` is a route).
    // Installed after the limiters were built: they describe their metrics
    // to it with the first call it sees.
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("ratelimit_store_duration_seconds".to_owned()),
            &STORE_DURATION_BUCKETS,
        )
        .and_then(PrometheusBuilder::install_recorder);
    let prometheus = match prometheus {
        Ok(handle) => handle,
        Err(e) => {
            eprintln!("cannot install the metrics recorder: {e}");
            return ExitCode::FAILURE;
        }
    };
    let app = Router::new()
        .route("/", get(index))
        .route(
            "/metrics",
            get(move || std::future::ready(prometheus.render())),
        )
        .route("/api/hello", get(hello).route_layer(api.clone()))
        .route("/api/orders", post(order).route_layer(api))
        .route("/login", post(login).route_layer(login_limit));

    let listener = match tokio::net::TcpListener::bind(args.addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", args.addr);
            return ExitCode::FAILURE;
        }
    };
    println!("{summary}");
    println!("listening on http://{} with {backend}", args.addr);
    let served = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("server error: {e}");
            ExitCode::FAILURE
        }
    }
}
