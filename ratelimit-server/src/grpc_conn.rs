//! The gRPC connections: each served by hyper's HTTP/2 server straight
//! into the service, without tonic's transport stack.
//!
//! tonic's `Server` puts several layers between a connection and a
//! method: a boxed request body, error recovery, the `grpc-timeout`
//! layer, an axum router matching the path, and a boxed response future
//! at each. For a method whose own work is about a microsecond, those
//! layers cost more than the method (`benches/loadgen.rs`: `memmove` of
//! their futures alone was a tenth of the service's CPU). Here a request
//! goes from hyper to `ShouldRateLimit` ([`crate::grpc_unary`]) or to the
//! health service by its path; any other path is answered
//! `UNIMPLEMENTED`. The `grpc-timeout` header is honoured as tonic does:
//! past it, the call is dropped and answered `CANCELLED` (its timer is set
//! only if the call waits: Envoy sends the header with every call, and
//! most are decided in their first poll).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tonic::server::NamedService;
use tonic_health::pb::health_server::{Health, HealthServer};
use tower_service::Service;

use crate::grpc_unary::{Reply, status};
use crate::server::RLS_SERVICE_NAME;
use crate::service::RateLimitService;

/// A response to a gRPC call.
type Response = http::Response<Reply>;
/// A call's answer, to come.
type Call = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send + 'static>>;

/// The services one gRPC listener serves, by path.
pub(crate) struct GrpcApp<H> {
    service: Arc<RateLimitService>,
    /// The decoding limit of a request's message, in bytes.
    max_message_bytes: usize,
    health: HealthServer<H>,
}

// (Derived, it would ask `H: Clone`; the health server shares its service.)
impl<H> Clone for GrpcApp<H> {
    fn clone(&self) -> Self {
        Self {
            service: self.service.clone(),
            max_message_bytes: self.max_message_bytes,
            health: self.health.clone(),
        }
    }
}

/// The one method of Envoy's rate limit service.
const SHOULD_RATE_LIMIT: &str = "ShouldRateLimit";

impl<H: Health> GrpcApp<H> {
    /// Envoy's rate limit service, its messages decoded up to
    /// `max_message_bytes`, and the health service.
    pub(crate) fn new(
        service: Arc<RateLimitService>,
        max_message_bytes: usize,
        health: HealthServer<H>,
    ) -> Self {
        Self {
            service,
            max_message_bytes,
            health,
        }
    }

    /// Routes a request by its path: `/{service}/{method}`.
    fn route(&self, req: http::Request<Incoming>) -> Call {
        let (service, method) = req
            .uri()
            .path()
            .strip_prefix('/')
            .and_then(|p| p.split_once('/'))
            .unwrap_or_default();
        if service == RLS_SERVICE_NAME && method == SHOULD_RATE_LIMIT {
            let (svc, max) = (self.service.clone(), self.max_message_bytes);
            Box::pin(async move { Ok(crate::grpc_unary::should_rate_limit(svc, max, req).await) })
        } else if service == HealthServer::<H>::NAME {
            let answer = self.health.clone().call(req);
            Box::pin(async move { answer.await.map(|r| r.map(Reply::Tonic)) })
        } else {
            Box::pin(std::future::ready(Ok(unimplemented())))
        }
    }
}

impl<H: Health> hyper::service::Service<http::Request<Incoming>> for GrpcApp<H> {
    type Response = Response;
    type Error = Infallible;
    type Future = Deadlined;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        // The caller's time runs from the request's arrival (a deadline
        // past the clock's range is none).
        let deadline =
            grpc_timeout(req.headers()).and_then(|d| tokio::time::Instant::now().checked_add(d));
        Deadlined {
            call: self.route(req),
            expiry: match deadline {
                Some(d) => Expiry::Unarmed(d),
                None => Expiry::Never,
            },
        }
    }
}

/// A call raced against the client's `grpc-timeout`, if it sent one.
pub(crate) struct Deadlined {
    call: Call,
    expiry: Expiry,
}

/// A call's deadline: its timer is set only once the call has waited, so
/// that a call decided in its first poll (the local store, a lease)
/// costs no timer.
enum Expiry {
    /// The caller sent no `grpc-timeout`.
    Never,
    /// The deadline, its timer not set yet.
    Unarmed(tokio::time::Instant),
    /// The timer, set.
    Armed(Pin<Box<tokio::time::Sleep>>),
}

impl Future for Deadlined {
    type Output = Result<Response, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(r) = self.call.as_mut().poll(cx) {
            return Poll::Ready(r);
        }
        if let Expiry::Unarmed(at) = self.expiry {
            self.expiry = Expiry::Armed(Box::pin(tokio::time::sleep_until(at)));
        }
        match &mut self.expiry {
            Expiry::Armed(timer) => match timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    Poll::Ready(Ok(status(tonic::Status::cancelled("Timeout expired"))))
                }
                Poll::Pending => Poll::Pending,
            },
            Expiry::Never | Expiry::Unarmed(_) => Poll::Pending,
        }
    }
}

/// A trailers-only `UNIMPLEMENTED` answer, for a path no service serves.
fn unimplemented() -> Response {
    status(tonic::Status::unimplemented(""))
}

/// The `grpc-timeout` header's duration (gRPC over HTTP/2: at most eight
/// digits and a unit, `H M S m u n`); absent or malformed: none, as tonic
/// reads it.
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let v = headers.get("grpc-timeout")?.to_str().ok()?;
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// How each gRPC connection speaks HTTP/2.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Http2 {
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`.
    pub(crate) max_streams: u32,
}

/// Serves the connections that come out of `conns` with `app` until
/// `stop` turns true; then lets each finish the requests it has (HTTP/2's
/// graceful shutdown: `GOAWAY`, then the streams already open) and
/// returns once every connection has closed.
pub(crate) async fn serve<H, I, S>(
    mut conns: S,
    app: GrpcApp<H>,
    http2: Http2,
    mut stop: watch::Receiver<bool>,
) where
    H: Health,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: futures_util::Stream<Item = I> + Unpin,
{
    use futures_util::StreamExt;
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(http2.max_streams);
    let builder = Arc::new(builder);
    // Each connection holds a sender: when the last is gone, every
    // connection has closed.
    let (open_tx, mut open_rx) = mpsc::channel::<()>(1);
    loop {
        let io = tokio::select! {
            () = stopped(&mut stop) => break,
            io = conns.next() => match io {
                Some(io) => io,
                None => break,
            },
        };
        let (app, builder, mut stop, open) =
            (app.clone(), builder.clone(), stop.clone(), open_tx.clone());
        tokio::spawn(async move {
            let conn = builder.serve_connection(TokioIo::new(io), app);
            tokio::pin!(conn);
            let served = tokio::select! {
                r = conn.as_mut() => r,
                () = stopped(&mut stop) => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, "gRPC connection ended with an error");
            }
            drop(open);
        });
    }
    drop(conns);
    drop(open_tx);
    let _ = open_rx.recv().await;
}

/// The connections `listener` accepts, with `TCP_NODELAY` set (a failed
/// accept, out of descriptors and the like, is logged and tried again
/// 10 ms later: the listener stays).
pub(crate) fn accepted(
    listener: TcpListener,
) -> impl futures_util::Stream<Item = TcpStream> + Unpin + Send {
    Box::pin(futures_util::stream::unfold(
        listener,
        |listener| async move {
            loop {
                match listener.accept().await {
                    Ok((tcp, _)) => {
                        let _ = tcp.set_nodelay(true);
                        return Some((tcp, listener));
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        },
    ))
}

/// The connections out of a channel of handshaken ones (an error is
/// logged and skipped).
pub(crate) fn received<I: Send + 'static>(
    rx: mpsc::Receiver<std::io::Result<I>>,
) -> impl futures_util::Stream<Item = I> + Unpin + Send {
    Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await? {
                Ok(conn) => return Some((conn, rx)),
                Err(e) => tracing::debug!(error = %e, "a connection failed before serving"),
            }
        }
    }))
}

/// Completes once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(v: &str) -> Option<Duration> {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-timeout", v.parse().expect("ascii"));
        grpc_timeout(&h)
    }

    #[test]
    fn grpc_timeouts_read_in_every_unit() {
        assert_eq!(timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(timeout("4S"), Some(Duration::from_secs(4)));
        assert_eq!(timeout("20m"), Some(Duration::from_millis(20)));
        assert_eq!(timeout("500u"), Some(Duration::from_micros(500)));
        assert_eq!(timeout("99999999n"), Some(Duration::from_nanos(99_999_999)));
        assert_eq!(timeout("0m"), Some(Duration::ZERO));
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
    }

    #[test]
    fn malformed_grpc_timeouts_are_none() {
        // Nine digits, no digits, no unit, an unknown unit, a sign, spaces.
        for v in [
            "123456789m",
            "m",
            "20",
            "20x",
            "-1m",
            "+1m",
            " 1m",
            "1 m",
            "1.5S",
        ] {
            assert_eq!(timeout(v), None, "{v:?}");
        }
    }
}
