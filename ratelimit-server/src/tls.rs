//! The service over TLS: gRPC and HTTP with a certificate and key
//! (`--grpc-tls-cert`, `--grpc-tls-key`), and mutual TLS with a CA for
//! client certificates (`--grpc-client-ca`: a client without a
//! certificate it signed is refused at the handshake).
//!
//! The files are read at start (a missing or malformed file stops the
//! server with an error naming it) and **again when they change**: every
//! [`RELOAD_EVERY`] the server compares their contents with what it
//! loaded, and on a change builds a new configuration for the
//! connections accepted from then on (connections already open keep
//! theirs). A change that does not load (a key that does not match the
//! certificate, a half-written file) is logged and the previous
//! certificates stay in force, as with the configuration.
//!
//! Handshakes run apart from the accept loop, each bounded by
//! [`HANDSHAKE_TIMEOUT`]: a client that stalls its handshake holds one
//! task, not the listener.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How often the certificate files are compared with what was loaded.
pub const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// How long a client has to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The service's certificate files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM).
    pub cert: PathBuf,
    /// The certificate's private key (PEM).
    pub key: PathBuf,
    /// The CA(s) that sign client certificates (PEM): mutual TLS.
    pub client_ca: Option<PathBuf>,
}

/// The service's TLS configuration, reloaded when its files change.
pub struct ServerTls {
    files: TlsFiles,
    config: ArcSwap<rustls::ServerConfig>,
    loaded: Mutex<Vec<Vec<u8>>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
}

fn certs(pem: &[u8], path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the {what} {} is not PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "the {what} {} holds no certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

/// Makes rustls' ring provider the process default, unless one is set.
pub fn install_crypto_provider() {
    ratelimit_redis::tls::install_crypto_provider();
}

impl ServerTls {
    /// Reads the files and builds the configuration; the error names the
    /// file and what is wrong with it.
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, String> {
        install_crypto_provider();
        let (config, contents) = build(&files)?;
        Ok(Arc::new(Self {
            files,
            config: ArcSwap::from_pointee(config),
            loaded: Mutex::new(contents),
        }))
    }

    /// The files.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Whether clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// An acceptor with the configuration in force.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.load_full())
    }

    /// Reloads when the files' contents changed: `Ok(true)` when a new
    /// configuration is in force, `Ok(false)` when nothing changed, the
    /// error (the old configuration stays) when the new files do not load.
    pub fn reload_if_changed(&self) -> Result<bool, String> {
        let now = contents(&self.files);
        {
            let loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
            if now.as_ref() == Some(&*loaded) {
                return Ok(false);
            }
        }
        let (config, contents) = build(&self.files)?;
        self.config.store(Arc::new(config));
        *self.loaded.lock().unwrap_or_else(|p| p.into_inner()) = contents;
        Ok(true)
    }

    /// Reloads every [`RELOAD_EVERY`] when the files changed, until the
    /// returned task is aborted (or the `ServerTls` dropped).
    pub fn watch(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut failed = false;
            loop {
                tokio::time::sleep(RELOAD_EVERY).await;
                let Some(tls) = weak.upgrade() else {
                    return;
                };
                match tls.reload_if_changed() {
                    Ok(true) => {
                        failed = false;
                        tracing::info!(cert = %tls.files.cert.display(), "TLS certificates reloaded");
                    }
                    Ok(false) => {}
                    Err(e) => {
                        if !failed {
                            tracing::error!(
                                "TLS certificates not reloaded, the previous ones stay in force: {e}"
                            );
                        }
                        failed = true;
                    }
                }
            }
        })
    }
}

/// The files' contents, `None` when one cannot be read.
fn contents(files: &TlsFiles) -> Option<Vec<Vec<u8>>> {
    let mut out = vec![
        std::fs::read(&files.cert).ok()?,
        std::fs::read(&files.key).ok()?,
    ];
    if let Some(ca) = &files.client_ca {
        out.push(std::fs::read(ca).ok()?);
    }
    Some(out)
}

fn build(files: &TlsFiles) -> Result<(rustls::ServerConfig, Vec<Vec<u8>>), String> {
    let cert_pem = read(&files.cert, "TLS certificate (--grpc-tls-cert)")?;
    let key_pem = read(&files.key, "TLS key (--grpc-tls-key)")?;
    let chain = certs(&cert_pem, &files.cert, "TLS certificate (--grpc-tls-cert)")?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        format!(
            "the TLS key (--grpc-tls-key) {} holds no usable private key ({e}): give the PEM \
             key (PKCS#8, PKCS#1 or SEC1) of the certificate",
            files.key.display()
        )
    })?;
    let mut contents = vec![cert_pem, key_pem];
    let builder = rustls::ServerConfig::builder();
    let builder = match &files.client_ca {
        Some(ca) => {
            let what = "client CA (--grpc-client-ca)";
            let pem = read(ca, what)?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in certs(&pem, ca, what)? {
                roots
                    .add(cert)
                    .map_err(|e| format!("the {what} {}: {e}", ca.display()))?;
            }
            contents.push(pem);
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .map_err(|e| format!("the {what} {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        format!(
            "the TLS certificate {} and key {} cannot be used together: {e}",
            files.cert.display(),
            files.key.display()
        )
    })?;
    // gRPC needs HTTP/2 negotiated by ALPN; the HTTP endpoints speak both.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((config, contents))
}

/// Accepts TCP connections on `listener` and completes their TLS
/// handshakes apart (each bounded by [`HANDSHAKE_TIMEOUT`]); the
/// connections whose handshake succeeded come out of the returned
/// channel. A refused handshake (no client certificate, one of another
/// CA, plain text) is logged at debug level and dropped.
pub fn accept(
    listener: TcpListener,
    tls: Arc<ServerTls>,
) -> tokio::sync::mpsc::Receiver<std::io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            let _ = tcp.set_nodelay(true);
            tokio::spawn(handshake(tcp, peer, tls.acceptor(), tx.clone()));
        }
    });
    rx
}

/// As [`accept`], for connections accepted elsewhere (and handed over as
/// the standard library's sockets, so that they are registered with the
/// runtime this runs on): the gRPC worker threads' TLS.
pub(crate) fn handshakes(
    mut conns: tokio::sync::mpsc::UnboundedReceiver<std::net::TcpStream>,
    tls: Arc<ServerTls>,
) -> tokio::sync::mpsc::Receiver<std::io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        while let Some(std) = conns.recv().await {
            let tcp = match TcpStream::from_std(std) {
                Ok(tcp) => tcp,
                Err(e) => {
                    tracing::debug!(error = %e, "a connection could not be registered");
                    continue;
                }
            };
            let peer = tcp
                .peer_addr()
                .unwrap_or_else(|_| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
            tokio::spawn(handshake(tcp, peer, tls.acceptor(), tx.clone()));
        }
    });
    rx
}

/// One connection's TLS handshake, bounded by [`HANDSHAKE_TIMEOUT`]: the
/// stream goes to `tx` when it succeeds; a refusal is logged at debug
/// level.
async fn handshake(
    tcp: TcpStream,
    peer: std::net::SocketAddr,
    acceptor: TlsAcceptor,
    tx: tokio::sync::mpsc::Sender<std::io::Result<TlsStream<TcpStream>>>,
) {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => {
            let _ = tx.send(Ok(stream)).await;
        }
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake refused");
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake not completed in time");
        }
    }
}

/// An axum listener over [`accept`]'s connections.
#[derive(Debug)]
pub struct TlsListener {
    rx: tokio::sync::mpsc::Receiver<std::io::Result<TlsStream<TcpStream>>>,
    addr: std::net::SocketAddr,
}

impl TlsListener {
    /// Serves TLS on `listener` with `tls`.
    pub fn new(listener: TcpListener, tls: Arc<ServerTls>) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        Ok(Self {
            rx: accept(listener, tls),
            addr,
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.rx.recv().await {
                Some(Ok(stream)) => {
                    let peer = stream.get_ref().0.peer_addr().unwrap_or(self.addr);
                    return (stream, peer);
                }
                Some(Err(_)) => continue,
                // The accept loop never ends while a receiver lives.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
