//! `ratelimit-server`: Envoy's rate limit service over gRPC and HTTP, with
//! envoyproxy/ratelimit's configuration files. See the crate's README.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use ratelimit_core::store::Store;
use ratelimit_core::{AlgorithmKind, FailurePolicy};
use ratelimit_server::config::parse_algorithm;
use ratelimit_server::server::{self, ShutdownOptions};
use ratelimit_server::{Config, Degraded, LoadOptions, RateLimitService, Settings};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// In process: per-process protection only (N instances admit N x L).
    Local,
    /// One Redis node.
    Redis,
    /// A Redis Cluster.
    Cluster,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Policy {
    /// Admit what the store cannot decide.
    Open,
    /// Deny what the store cannot decide.
    Closed,
}

/// Envoy's rate limit service (envoy.service.ratelimit.v3) over gRPC and
/// HTTP/JSON, configured with envoyproxy/ratelimit's YAML files.
#[derive(Debug, Parser)]
#[command(name = "ratelimit-server", version)]
struct Cli {
    /// An envoyproxy/ratelimit YAML file, or a directory of them (*.yaml,
    /// *.yml). Repeat for several. Reloaded when changed.
    #[arg(
        long,
        short = 'c',
        required = true,
        env = "RLS_CONFIG",
        value_delimiter = ','
    )]
    config: Vec<PathBuf>,
    /// Where gRPC (ShouldRateLimit, grpc.health.v1) listens.
    #[arg(long, default_value = "0.0.0.0:8081", env = "RLS_GRPC_ADDR")]
    grpc_addr: SocketAddr,
    /// Where HTTP (/json, /healthcheck, /metrics, /rlconfig) listens.
    #[arg(long, default_value = "0.0.0.0:8080", env = "RLS_HTTP_ADDR")]
    http_addr: SocketAddr,
    /// Where the counters live.
    #[arg(long, value_enum, default_value = "local", env = "RLS_BACKEND")]
    backend: Backend,
    /// The Redis node (`--backend redis`).
    #[arg(long, default_value = "redis://127.0.0.1:6379/", env = "RLS_REDIS_URL")]
    redis_url: String,
    /// A Redis Cluster node to start from (`--backend cluster`); repeat or
    /// separate with commas.
    #[arg(long = "cluster-url", env = "RLS_CLUSTER_URLS", value_delimiter = ',')]
    cluster_urls: Vec<String>,
    /// The prefix of every Redis key.
    #[arg(long, default_value = "rl", env = "RLS_REDIS_PREFIX")]
    redis_prefix: String,
    /// The number of service instances sharing the Redis store: while it is
    /// unavailable each instance decides in process at every limit / N.
    #[arg(long, env = "RLS_INSTANCES")]
    instances: Option<u32>,
    /// What to answer when the store cannot decide (and no fallback can):
    /// open admits, closed denies.
    #[arg(long, value_enum, env = "RLS_FAILURE_POLICY")]
    failure_policy: Option<Policy>,
    /// How long a decision waits for the store, e.g. 20ms.
    #[arg(long, default_value = "20ms", value_parser = parse_duration, env = "RLS_TIMEOUT")]
    timeout: Duration,
    /// The namespace of the service's keys in the store.
    #[arg(long, default_value = "rls", env = "RLS_NAMESPACE")]
    namespace: String,
    /// The algorithm of rate limits that do not name one: fixed_window
    /// (envoyproxy/ratelimit's), sliding_window, sliding_log, token_bucket.
    #[arg(long, default_value = "fixed_window", value_parser = parse_algorithm_arg, env = "RLS_ALGORITHM")]
    algorithm: AlgorithmKind,
    /// Add Retry-After, X-RateLimit-* and the IETF RateLimit-Policy /
    /// RateLimit fields to response_headers_to_add.
    #[arg(long, env = "RLS_RESPONSE_HEADERS")]
    response_headers: bool,
    /// Global shadow mode: decide and count as usual, always answer OK.
    #[arg(long, env = "RLS_SHADOW_MODE")]
    shadow_mode: bool,
    /// Let several files configure one domain (MERGE_DOMAIN_CONFIG).
    #[arg(long, env = "RLS_MERGE_DOMAINS")]
    merge_domains: bool,
    /// Do not reload the configuration when its files change (SIGHUP still
    /// reloads).
    #[arg(long)]
    no_watch: bool,
    /// After SIGTERM, how long health checks say NOT_SERVING before the
    /// listeners close, e.g. 5s.
    #[arg(long, default_value = "0s", value_parser = parse_duration, env = "RLS_DRAIN_DELAY")]
    drain_delay: Duration,
    /// How long requests in flight get to finish at shutdown.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    shutdown_grace: Duration,
    /// Check the configuration and exit (0: valid; 2: the error is printed).
    #[arg(long)]
    check: bool,
}

fn parse_algorithm_arg(s: &str) -> Result<AlgorithmKind, String> {
    parse_algorithm(s).ok_or_else(|| {
        format!(
            "unknown algorithm {s:?}: use fixed_window, sliding_window, sliding_log or token_bucket"
        )
    })
}

/// `250ms`, `20ms`, `5s`, `2m`, `1h`, or whole seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 20ms, 5s or 2m"))?;
    let secs = match unit {
        "us" | "µs" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?}; use us, ms, s, m or h"
            ));
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{s:?} is not a duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let options = LoadOptions {
        merge_domains: cli.merge_domains,
        default_algorithm: cli.algorithm,
    };
    let config = match Config::load(&cli.config, options) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ratelimit-server: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.check {
        println!(
            "configuration valid: {} domain(s), {} rate limit(s) in {} file(s)",
            config.domains().len(),
            config.limit_count(),
            config.files().len()
        );
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ratelimit-server: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli, config, options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ratelimit-server: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli, config: Config, options: LoadOptions) -> Result<(), String> {
    let policy = cli.failure_policy.map(|p| match p {
        Policy::Open => FailurePolicy::FailOpen,
        Policy::Closed => FailurePolicy::FailClosed,
    });
    let degraded = match (cli.backend, cli.instances, policy) {
        (Backend::Local, _, _) => Degraded::None,
        (_, Some(n), p) => Degraded::Instances(n, p.unwrap_or(FailurePolicy::FailClosed)),
        (_, None, Some(p)) => Degraded::Policy(p),
        (_, None, None) => {
            return Err(
                "no degraded mode: say what the service decides while Redis is unavailable. \
                 Usually --instances N (N = the service instances sharing Redis): an in-process \
                 fallback at each limit / N, still limiting. Or --failure-policy closed (deny) or \
                 --failure-policy open (admit uncounted requests)"
                    .to_owned(),
            );
        }
    };
    let store: Arc<dyn Store> = match cli.backend {
        Backend::Local => {
            tracing::warn!(
                "backend local: per-process protection only; with N instances behind a load \
                 balancer a limit of L becomes N x L (use --backend redis or cluster to share it)"
            );
            Arc::new(ratelimit_local::LocalStore::new())
        }
        Backend::Redis => Arc::new(
            ratelimit_redis::RedisStore::builder(cli.redis_url.clone())
                .prefix(&cli.redis_prefix)
                .build()
                .await
                .map_err(|e| format!("cannot connect to Redis at {}: {e}", cli.redis_url))?,
        ),
        Backend::Cluster => {
            if cli.cluster_urls.is_empty() {
                return Err("--backend cluster needs at least one --cluster-url".to_owned());
            }
            Arc::new(
                ratelimit_cluster::ClusterStore::builder(cli.cluster_urls.clone())
                    .prefix(&cli.redis_prefix)
                    .build()
                    .await
                    .map_err(|e| {
                        format!(
                            "cannot connect to the Redis Cluster at {}: {e}",
                            cli.cluster_urls.join(", ")
                        )
                    })?,
            )
        }
    };
    let backend = match cli.backend {
        Backend::Local => "local",
        Backend::Redis => "redis",
        Backend::Cluster => "cluster",
    };
    let settings = Settings {
        namespace: cli.namespace.clone(),
        timeout: cli.timeout,
        degraded,
        response_headers: cli.response_headers,
        global_shadow_mode: cli.shadow_mode,
        default_algorithm: cli.algorithm,
        ..Settings::default()
    };
    tracing::info!(
        backend,
        domains = config.domains().len(),
        limits = config.limit_count(),
        "configuration loaded"
    );
    let service = Arc::new(
        RateLimitService::new(store, config, settings, backend)
            .map_err(|e| format!("invalid settings: {e}"))?,
    );
    let grpc = tokio::net::TcpListener::bind(cli.grpc_addr)
        .await
        .map_err(|e| format!("cannot listen for gRPC on {}: {e}", cli.grpc_addr))?;
    let http = tokio::net::TcpListener::bind(cli.http_addr)
        .await
        .map_err(|e| format!("cannot listen for HTTP on {}: {e}", cli.http_addr))?;
    let grpc_addr = grpc.local_addr().map_err(|e| e.to_string())?;
    let http_addr = http.local_addr().map_err(|e| e.to_string())?;
    let _watch = if cli.no_watch {
        None
    } else {
        Some(
            server::watch_config(service.clone(), cli.config.clone(), options)
                .map_err(|e| format!("cannot watch the configuration files: {e}"))?,
        )
    };
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ratelimit-server: gRPC on {grpc_addr}");
        let _ = writeln!(out, "ratelimit-server: HTTP on {http_addr}");
        let _ = out.flush();
    }
    server::serve(
        service,
        grpc,
        http,
        server::shutdown_signal(),
        ShutdownOptions {
            drain_delay: cli.drain_delay,
            grace: cli.shutdown_grace,
        },
    )
    .await
    .map_err(|e| format!("server error: {e}"))
}
