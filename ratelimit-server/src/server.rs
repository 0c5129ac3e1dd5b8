//! Serving: the gRPC server (`ShouldRateLimit` and `grpc.health.v1`), the
//! HTTP server, graceful shutdown, and reloading the configuration when its
//! files change.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic_health::ServingStatus;

use crate::config::{Config, LoadOptions, config_files};
use crate::grpc_conn::{GrpcApp, Http2};
use crate::service::RateLimitService;

/// The full gRPC name of Envoy's rate limit service, under which health is
/// reported (as well as under the empty name, the whole server).
pub const RLS_SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// How a server shuts down.
#[derive(Debug, Clone, Copy)]
pub struct ShutdownOptions {
    /// After the shutdown signal, how long health checks report
    /// `NOT_SERVING` while requests are still answered, so that load
    /// balancers and Envoy's health checker stop sending (default 0).
    pub drain_delay: Duration,
    /// Then, how long requests in flight are given to finish once the
    /// listeners close (default 10 s).
    pub grace: Duration,
}

impl Default for ShutdownOptions {
    fn default() -> Self {
        Self {
            drain_delay: Duration::ZERO,
            grace: Duration::from_secs(10),
        }
    }
}

/// Serves `service` over gRPC on `grpc` and over HTTP on `http` until
/// `shutdown` completes; then reports `NOT_SERVING`, waits the drain delay,
/// stops accepting connections and lets requests in flight finish (at most
/// the grace period). Plain text, the default input limits' transport
/// bound: see [`serve_with`].
pub async fn serve(
    service: Arc<RateLimitService>,
    grpc: TcpListener,
    http: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
    options: ShutdownOptions,
) -> std::io::Result<()> {
    serve_with(service, grpc, http, shutdown, options, Transport::default()).await
}

/// How the listeners speak: TLS or plain text, and the size beyond which
/// a message is refused before it is decoded.
#[derive(Debug, Clone)]
pub struct Transport {
    /// TLS (and mutual TLS) for both listeners; `None`: plain text.
    pub tls: Option<Arc<crate::tls::ServerTls>>,
    /// gRPC's decoding limit and HTTP's body limit, in bytes (see
    /// [`crate::limits::InputLimits::transport_limit`]).
    pub max_message_bytes: usize,
    /// The threads that serve gRPC connections, each a single-threaded
    /// runtime given connections in turn (default: one per CPU); 0 serves
    /// them on the calling runtime. Why: the `--grpc-workers` option in
    /// the README.
    pub grpc_workers: usize,
    /// The most requests in flight on one gRPC connection (HTTP/2's
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`, default
    /// [`DEFAULT_GRPC_MAX_STREAMS`]); a client holds the rest until one
    /// is answered. Unbounded, an overloaded service held every request a
    /// client sent and spent its time managing them instead of answering.
    pub grpc_max_streams: u32,
}

/// The default [`Transport::grpc_max_streams`] (hyper's own default is
/// 200; tonic's builder leaves it unbounded).
pub const DEFAULT_GRPC_MAX_STREAMS: u32 = 256;

/// One gRPC worker per CPU the process may run on.
pub fn default_grpc_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Default for Transport {
    fn default() -> Self {
        Self {
            tls: None,
            max_message_bytes: crate::limits::InputLimits::DEFAULT.transport_limit(),
            grpc_workers: default_grpc_workers(),
            grpc_max_streams: DEFAULT_GRPC_MAX_STREAMS,
        }
    }
}

/// As [`serve`], with the listeners as `transport` says: over TLS when it
/// has a [`crate::tls::ServerTls`] (its certificates reloaded when their
/// files change, for as long as this runs).
pub async fn serve_with(
    service: Arc<RateLimitService>,
    grpc: TcpListener,
    http: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
    options: ShutdownOptions,
    transport: Transport,
) -> std::io::Result<()> {
    let _reload = transport.tls.as_ref().map(|t| AbortOnDrop(t.watch()));
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(RLS_SERVICE_NAME, ServingStatus::Serving)
        .await;
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    service.set_serving(true);

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let app = GrpcApp::new(service.clone(), transport.max_message_bytes, health);
    let http2 = Http2 {
        max_streams: transport.grpc_max_streams,
    };
    let grpc_task: tokio::task::JoinHandle<std::io::Result<()>> = if transport.grpc_workers > 0 {
        let workers = crate::workers::Workers::start(
            transport.grpc_workers,
            &app,
            http2,
            transport.tls.clone(),
            &stop_rx,
        )?;
        tokio::spawn(workers.serve(grpc, stopped(stop_rx.clone())))
    } else {
        let stop = stop_rx.clone();
        match &transport.tls {
            None => {
                let incoming = crate::grpc_conn::accepted(grpc);
                tokio::spawn(async move {
                    crate::grpc_conn::serve(incoming, app, http2, stop).await;
                    Ok(())
                })
            }
            Some(tls) => {
                let rx = crate::tls::accept(grpc, Arc::clone(tls));
                let incoming = crate::grpc_conn::received(rx);
                tokio::spawn(async move {
                    crate::grpc_conn::serve(incoming, app, http2, stop).await;
                    Ok(())
                })
            }
        }
    };
    let http_app = crate::http::router(service.clone()).layer(
        axum::extract::DefaultBodyLimit::max(transport.max_message_bytes),
    );
    let http_task = match &transport.tls {
        None => tokio::spawn(
            axum::serve(http, http_app)
                .with_graceful_shutdown(stopped(stop_rx.clone()))
                .into_future(),
        ),
        Some(tls) => tokio::spawn(
            axum::serve(
                crate::tls::TlsListener::new(http, Arc::clone(tls))?,
                http_app,
            )
            .with_graceful_shutdown(stopped(stop_rx.clone()))
            .into_future(),
        ),
    };

    shutdown.await;
    tracing::info!(
        drain_delay = ?options.drain_delay,
        "shutting down: health checks report NOT_SERVING"
    );
    service.set_serving(false);
    reporter
        .set_service_status(RLS_SERVICE_NAME, ServingStatus::NotServing)
        .await;
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    tokio::time::sleep(options.drain_delay).await;
    let _ = stop_tx.send(true);
    let both = async {
        let g = grpc_task.await;
        let h = http_task.await;
        (g, h)
    };
    match tokio::time::timeout(options.grace, both).await {
        Ok((g, h)) => {
            if let Ok(Err(e)) = g {
                return Err(e);
            }
            if let Ok(Err(e)) = h {
                return Err(e);
            }
            tracing::info!("stopped: every request in flight was answered");
            Ok(())
        }
        Err(_) => {
            tracing::warn!(grace = ?options.grace, "requests still in flight after the grace period: stopping anyway");
            Ok(())
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Completes on SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// A fingerprint of the configuration files' names and contents, to tell a
/// change from a touch.
fn fingerprint(paths: &[PathBuf]) -> Option<Vec<(PathBuf, Vec<u8>)>> {
    let mut out = Vec::new();
    for p in paths {
        for f in config_files(p).ok()? {
            let bytes = std::fs::read(&f).ok()?;
            out.push((f, bytes));
        }
    }
    Some(out)
}

/// Reloads `service`'s configuration from `paths`: on success the new
/// configuration is in force for every request from now on (requests in
/// flight finish under the old one); on error the old one stays, the error
/// is logged and counted. Returns the error, if any.
pub fn reload(
    service: &RateLimitService,
    paths: &[PathBuf],
    options: LoadOptions,
) -> Result<(), crate::config::ConfigError> {
    match Config::load(paths, options) {
        Ok(config) => {
            tracing::info!(
                domains = config.domains().len(),
                limits = config.limit_count(),
                "configuration reloaded"
            );
            service.replace_config(config);
            Ok(())
        }
        Err(e) => {
            crate::metrics::config_load_failed();
            tracing::error!("configuration not reloaded, the previous one stays in force: {e}");
            Err(e)
        }
    }
}

/// Watches the configuration files (and, for a file, its directory, so that
/// an editor's rename or a Kubernetes ConfigMap's symlink swap is seen) and
/// reloads on every change of their contents; SIGHUP forces a reload. The
/// watch ends when the returned guard is dropped.
pub fn watch_config(
    service: Arc<RateLimitService>,
    paths: Vec<PathBuf>,
    options: LoadOptions,
) -> notify::Result<ConfigWatch> {
    use notify::Watcher;
    // What the files hold now, read before the watch starts: a change made
    // between here and the watch task's first turn is then seen as one
    // (read in the task, it would be taken for the files' old state and
    // the change skipped as no change).
    let mut last = fingerprint(&paths);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<bool>();
    let event_tx = tx.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok() {
            let _ = event_tx.send(false);
        }
    })?;
    for p in &paths {
        let dir = if p.is_dir() {
            p.clone()
        } else {
            match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
                _ => PathBuf::from("."),
            }
        };
        watcher.watch(&dir, notify::RecursiveMode::NonRecursive)?;
    }
    #[cfg(unix)]
    let hup_task = tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut hup) = signal(SignalKind::hangup()) {
            while hup.recv().await.is_some() {
                if tx.send(true).is_err() {
                    break;
                }
            }
        }
    });
    let task = tokio::spawn(async move {
        while let Some(forced) = rx.recv().await {
            // Let a burst of events (an editor's write, rename and chmod)
            // settle, then read once.
            let mut forced = forced;
            tokio::time::sleep(Duration::from_millis(100)).await;
            while let Ok(f) = rx.try_recv() {
                forced |= f;
            }
            let now = fingerprint(&paths);
            if !forced && now.is_some() && now == last {
                continue;
            }
            let _ = reload(&service, &paths, options);
            last = now;
        }
    });
    Ok(ConfigWatch {
        _watcher: watcher,
        task,
        #[cfg(unix)]
        hup_task,
    })
}

/// Keeps the configuration watched; dropping it ends the watch.
#[derive(Debug)]
pub struct ConfigWatch {
    _watcher: notify::RecommendedWatcher,
    task: tokio::task::JoinHandle<()>,
    #[cfg(unix)]
    hup_task: tokio::task::JoinHandle<()>,
}

impl Drop for ConfigWatch {
    fn drop(&mut self) {
        self.task.abort();
        #[cfg(unix)]
        self.hup_task.abort();
    }
}
