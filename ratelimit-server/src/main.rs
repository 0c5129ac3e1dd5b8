//! `ratelimit-server`: Envoy's rate limit service over gRPC and HTTP, with
//! envoyproxy/ratelimit's configuration files. See the crate's README.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use mimalloc::MiMalloc;
use ratelimit_core::store::Store;
use ratelimit_core::{AlgorithmKind, FailurePolicy};
use ratelimit_server::config::parse_algorithm;
use ratelimit_server::limits::InputLimits;
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
    /// The primary that Redis Sentinel names (`--sentinel-url`,
    /// `--sentinel-master`), followed across failovers.
    Sentinel,
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
    /// The Redis node (`--backend redis`): redis://[user:password@]host:port/db,
    /// rediss:// for TLS.
    #[arg(
        long,
        default_value = "redis://127.0.0.1:6379/",
        env = "RLS_REDIS_URL",
        hide_env_values = true
    )]
    redis_url: String,
    /// A Redis Cluster node to start from (`--backend cluster`); repeat or
    /// separate with commas. rediss:// for TLS.
    #[arg(
        long = "cluster-url",
        env = "RLS_CLUSTER_URLS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    cluster_urls: Vec<String>,
    /// A sentinel (`--backend sentinel`): redis://host:26379/ (rediss://
    /// for TLS, which the nodes then use too); repeat or separate with
    /// commas.
    #[arg(
        long = "sentinel-url",
        env = "RLS_SENTINEL_URLS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    sentinel_urls: Vec<String>,
    /// The master name the sentinels monitor (`--backend sentinel`).
    #[arg(long, env = "RLS_SENTINEL_MASTER")]
    sentinel_master: Option<String>,
    /// The Redis ACL user (instead of the URL's).
    #[arg(long, env = "RLS_REDIS_USERNAME")]
    redis_username: Option<String>,
    /// The Redis password (instead of the URL's); prefer the environment
    /// variable to the command line, which other users can read.
    #[arg(long, env = "RLS_REDIS_PASSWORD", hide_env_values = true)]
    redis_password: Option<String>,
    /// A PEM file of the CA that signed the Redis servers' certificates,
    /// instead of the system's roots (rediss:// URLs).
    #[arg(long, env = "RLS_REDIS_CA_FILE")]
    redis_ca_file: Option<PathBuf>,
    /// A PEM client certificate for Redis servers that require one
    /// (tls-auth-clients yes), with --redis-key-file.
    #[arg(long, env = "RLS_REDIS_CERT_FILE", requires = "redis_key_file")]
    redis_cert_file: Option<PathBuf>,
    /// The PEM private key of --redis-cert-file.
    #[arg(long, env = "RLS_REDIS_KEY_FILE", requires = "redis_cert_file")]
    redis_key_file: Option<PathBuf>,
    /// Serve gRPC and HTTP over TLS with this PEM certificate (chain), with
    /// --grpc-tls-key. Reloaded when the file changes.
    #[arg(long, env = "RLS_GRPC_TLS_CERT", requires = "grpc_tls_key")]
    grpc_tls_cert: Option<PathBuf>,
    /// The PEM private key of --grpc-tls-cert.
    #[arg(long, env = "RLS_GRPC_TLS_KEY", requires = "grpc_tls_cert")]
    grpc_tls_key: Option<PathBuf>,
    /// Mutual TLS: require a client certificate signed by a CA in this PEM
    /// file (a client without one is refused at the handshake).
    #[arg(long, env = "RLS_GRPC_CLIENT_CA", requires = "grpc_tls_cert")]
    grpc_client_ca: Option<PathBuf>,
    /// The most descriptors one request may carry.
    #[arg(long, default_value_t = InputLimits::DEFAULT.max_descriptors, env = "RLS_MAX_DESCRIPTORS")]
    max_descriptors: usize,
    /// The most entries one descriptor may carry.
    #[arg(long, default_value_t = InputLimits::DEFAULT.max_entries, env = "RLS_MAX_ENTRIES")]
    max_entries: usize,
    /// The longest descriptor entry key, in bytes.
    #[arg(long, default_value_t = InputLimits::DEFAULT.max_key_len, env = "RLS_MAX_KEY_LEN")]
    max_key_len: usize,
    /// The longest descriptor entry value, in bytes.
    #[arg(long, default_value_t = InputLimits::DEFAULT.max_value_len, env = "RLS_MAX_VALUE_LEN")]
    max_value_len: usize,
    /// The largest request, in bytes (its protobuf encoding).
    #[arg(long, default_value_t = InputLimits::DEFAULT.max_message_bytes, env = "RLS_MAX_MESSAGE_BYTES")]
    max_message_bytes: usize,
    /// The largest hits_addend.
    #[arg(long, default_value_t = InputLimits::DEFAULT.max_hits_addend, env = "RLS_MAX_HITS_ADDEND")]
    max_hits_addend: u64,
    /// The prefix of every Redis key.
    #[arg(long, default_value = "rl", env = "RLS_REDIS_PREFIX")]
    redis_prefix: String,
    /// Whether the Redis store sends and reads its calls on a thread of
    /// its own (the library's `io_thread`; `false`: on the service's
    /// runtime).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "RLS_REDIS_IO_THREAD")]
    redis_io_thread: bool,
    /// The threads that serve gRPC connections, each a single-threaded
    /// runtime that serves the connections handed to it in turn (answers
    /// of requests that arrive together leave in one write); default: one
    /// per CPU. A connection stays on one thread: one client connection
    /// gets at most one core. 0 serves every connection on the shared
    /// multi-threaded runtime.
    #[arg(long, env = "RLS_GRPC_WORKERS")]
    grpc_workers: Option<usize>,
    /// The most requests in flight on one gRPC connection (HTTP/2's
    /// SETTINGS_MAX_CONCURRENT_STREAMS); a client holds the rest until one
    /// is answered.
    #[arg(long, default_value_t = server::DEFAULT_GRPC_MAX_STREAMS, value_parser = clap::value_parser!(u32).range(1..), env = "RLS_GRPC_MAX_STREAMS")]
    grpc_max_streams: u32,
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
    /// The log lines' format on stderr: text (one readable line each) or
    /// json (one JSON object per line: timestamp, level, target, fields).
    #[arg(long, value_enum, default_value = "text", env = "RLS_LOG_FORMAT")]
    log_format: LogFormat,
}

/// How the service writes its log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// One readable line per event.
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// Applies the Redis credentials and TLS files of the command line to a
/// store builder (single node, Sentinel or cluster: the same setters).
macro_rules! secured {
    ($builder:expr, $cli:expr) => {{
        let mut b = $builder;
        if let Some(user) = &$cli.redis_username {
            b = b.username(user.clone());
        }
        if let Some(password) = &$cli.redis_password {
            b = b.password(password.clone());
        }
        if let Some(ca) = &$cli.redis_ca_file {
            b = b.tls_ca_file(ca.clone());
        }
        if let (Some(cert), Some(key)) = (&$cli.redis_cert_file, &$cli.redis_key_file) {
            b = b.tls_client_cert(cert.clone(), key.clone());
        }
        b
    }};
}

use ratelimit_redis::tls::redacted;
use ratelimit_server::tls::{ServerTls, TlsFiles};

/// URLs for a message, each without its credentials.
fn redacted_list(urls: &[String]) -> String {
    urls.iter()
        .map(|u| redacted(u))
        .collect::<Vec<_>>()
        .join(", ")
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

/// The service allocates a little on every request (the decoded request's
/// strings, the response, HTTP/2 buffers); mimalloc serves that with less
/// CPU than the system allocator (measured in `benches/loadgen.rs`).
#[global_allocator]
static ALLOCATOR: MiMalloc = MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
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
            secured!(
                ratelimit_redis::RedisStore::builder(cli.redis_url.clone()),
                cli
            )
            .prefix(&cli.redis_prefix)
            .io_thread(cli.redis_io_thread)
            .build()
            .await
            .map_err(|e| {
                format!(
                    "cannot connect to Redis at {}: {e}",
                    redacted(&cli.redis_url)
                )
            })?,
        ),
        Backend::Cluster => {
            if cli.cluster_urls.is_empty() {
                return Err("--backend cluster needs at least one --cluster-url".to_owned());
            }
            Arc::new(
                secured!(
                    ratelimit_cluster::ClusterStore::builder(cli.cluster_urls.clone()),
                    cli
                )
                .prefix(&cli.redis_prefix)
                .io_thread(cli.redis_io_thread)
                .build()
                .await
                .map_err(|e| {
                    format!(
                        "cannot connect to the Redis Cluster at {}: {e}",
                        redacted_list(&cli.cluster_urls)
                    )
                })?,
            )
        }
        Backend::Sentinel => {
            let Some(master) = cli.sentinel_master.clone() else {
                return Err(
                    "--backend sentinel needs --sentinel-master (the master name the sentinels \
                     monitor) and at least one --sentinel-url"
                        .to_owned(),
                );
            };
            if cli.sentinel_urls.is_empty() {
                return Err("--backend sentinel needs at least one --sentinel-url".to_owned());
            }
            Arc::new(
                secured!(
                    ratelimit_redis::RedisStore::sentinel_builder(
                        cli.sentinel_urls.clone(),
                        master.clone()
                    ),
                    cli
                )
                .prefix(&cli.redis_prefix)
                .io_thread(cli.redis_io_thread)
                .build()
                .await
                .map_err(|e| {
                    format!(
                        "cannot reach the primary of {master:?} through the sentinels {}: {e}",
                        redacted_list(&cli.sentinel_urls)
                    )
                })?,
            )
        }
    };
    let backend = match cli.backend {
        Backend::Local => "local",
        Backend::Redis => "redis",
        Backend::Cluster => "cluster",
        Backend::Sentinel => "sentinel",
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
    let limits = InputLimits {
        max_descriptors: cli.max_descriptors,
        max_entries: cli.max_entries,
        max_key_len: cli.max_key_len,
        max_value_len: cli.max_value_len,
        max_message_bytes: cli.max_message_bytes,
        max_hits_addend: cli.max_hits_addend,
    };
    ratelimit_server::limits::set(limits);
    let tls = match (&cli.grpc_tls_cert, &cli.grpc_tls_key) {
        (Some(cert), Some(key)) => {
            let tls = ServerTls::load(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: cli.grpc_client_ca.clone(),
            })
            .map_err(|e| format!("cannot serve TLS: {e}"))?;
            tracing::info!(
                mutual = tls.mutual(),
                "gRPC and HTTP over TLS{}",
                if tls.mutual() {
                    ": clients need a certificate of --grpc-client-ca"
                } else {
                    ""
                }
            );
            Some(tls)
        }
        _ => None,
    };
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
    server::serve_with(
        service,
        grpc,
        http,
        server::shutdown_signal(),
        ShutdownOptions {
            drain_delay: cli.drain_delay,
            grace: cli.shutdown_grace,
        },
        server::Transport {
            tls,
            max_message_bytes: limits.transport_limit(),
            grpc_workers: cli
                .grpc_workers
                .unwrap_or_else(server::default_grpc_workers),
            grpc_max_streams: cli.grpc_max_streams,
        },
    )
    .await
    .map_err(|e| format!("server error: {e}"))
}
