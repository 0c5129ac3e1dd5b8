//! gRPC connections served on threads of their own, each thread a
//! single-threaded Tokio runtime (`--grpc-workers`).
//!
//! hyper's HTTP/2 server runs each request as a task and lets the
//! connection's task write what the requests answered. On Tokio's
//! multi-threaded runtime a task woken by the running one runs next (the
//! worker's LIFO slot), so a connection writes each answer as soon as its
//! request is decided: one `writev` per answer. On a single-threaded
//! runtime a woken task waits behind the tasks already ready, so the
//! answers of the requests that arrived together leave together. With 16
//! requests in flight over 4 connections this took the service's CPU per
//! request from 20 to 14 µs (`benches/loadgen.rs`, one core); with 256 in
//! flight, where answers already leave together, it changes nothing.
//!
//! One thread accepts the connections (on the runtime that calls
//! [`Workers::serve`]) and hands each to the next worker in turn; a
//! connection stays on its worker for its life, so one client connection
//! is served by at most one core. Envoy opens a connection to each
//! rate-limit host per worker thread of its own, which spreads its load; a
//! client that sends everything over one connection gets one core
//! (`--grpc-workers 0` serves every connection on the shared multi-threaded
//! runtime instead).

use std::future::Future;
use std::sync::Arc;

use futures_util::StreamExt;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tonic_health::pb::health_server::Health;

use crate::grpc_conn::{GrpcApp, Http2};
use crate::tls::ServerTls;

/// The worker threads, each serving the connections handed to it.
#[derive(Debug)]
pub(crate) struct Workers {
    conns: Vec<mpsc::UnboundedSender<std::net::TcpStream>>,
    done: Vec<oneshot::Receiver<std::io::Result<()>>>,
}

impl Workers {
    /// Starts `n` (at least 1) threads, each serving `app` (over `tls`
    /// when given) until `stop` turns true.
    pub(crate) fn start<H: Health>(
        n: usize,
        app: &GrpcApp<H>,
        http2: Http2,
        tls: Option<Arc<ServerTls>>,
        stop: &watch::Receiver<bool>,
    ) -> std::io::Result<Self> {
        let mut conns = Vec::new();
        let mut done = Vec::new();
        for i in 0..n.max(1) {
            let (tx, rx) = mpsc::unbounded_channel();
            let (done_tx, done_rx) = oneshot::channel();
            let (app, tls, stop) = ((*app).clone(), tls.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("grpc-worker-{i}"))
                .spawn(move || {
                    let _ = done_tx.send(run(rx, app, http2, tls, stop));
                })?;
            conns.push(tx);
            done.push(done_rx);
        }
        Ok(Self { conns, done })
    }

    /// Accepts connections on `listener`, handing them to the workers in
    /// turn, until `stop` completes; then waits for every worker to finish
    /// its connections. The first worker's error, if any.
    pub(crate) async fn serve(
        self,
        listener: TcpListener,
        stop: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let Self { conns, done } = self;
        let mut next = 0usize;
        tokio::pin!(stop);
        let mut incoming = crate::grpc_conn::accepted(listener);
        loop {
            let tcp = tokio::select! {
                () = &mut stop => break,
                tcp = incoming.next() => match tcp {
                    Some(tcp) => tcp,
                    None => break,
                },
            };
            // Handed over as a standard socket, so that the worker's own
            // runtime polls it.
            let peer = tcp.peer_addr().ok();
            match tcp.into_std() {
                Ok(std) => {
                    tracing::debug!(
                        worker = next % conns.len(),
                        ?peer,
                        "gRPC connection handed to a worker"
                    );
                    if conns[next % conns.len()].send(std).is_err() {
                        tracing::error!(
                            worker = next % conns.len(),
                            "a gRPC worker has stopped: its connection is dropped"
                        );
                    }
                    next = next.wrapping_add(1);
                }
                Err(e) => tracing::debug!(error = %e, "a connection could not be handed over"),
            }
        }
        drop(incoming);
        drop(conns);
        let mut first = Ok(());
        for d in done {
            let r = d
                .await
                .unwrap_or_else(|_| Err(std::io::Error::other("a gRPC worker panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// One worker thread: a single-threaded runtime serving `app` on the
/// connections that come through `conns` until `stop` turns true.
fn run<H: Health>(
    conns: mpsc::UnboundedReceiver<std::net::TcpStream>,
    app: GrpcApp<H>,
    http2: Http2,
    tls: Option<Arc<ServerTls>>,
    stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match tls {
            None => {
                let incoming = futures_util::stream::unfold(conns, |mut conns| async move {
                    loop {
                        let std = conns.recv().await?;
                        match TcpStream::from_std(std) {
                            Ok(tcp) => return Some((tcp, conns)),
                            Err(e) => {
                                tracing::debug!(error = %e, "a connection could not be registered");
                            }
                        }
                    }
                });
                crate::grpc_conn::serve(Box::pin(incoming), app, http2, stop).await;
            }
            Some(tls) => {
                let handshaken = crate::tls::handshakes(conns, tls);
                let incoming = crate::grpc_conn::received(handshaken);
                crate::grpc_conn::serve(Box::pin(incoming), app, http2, stop).await;
            }
        }
        Ok(())
    })
}
