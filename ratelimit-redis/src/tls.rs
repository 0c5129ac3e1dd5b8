//! TLS and credentials for the connections to Redis: what both stores'
//! builders are told ([`Security`]), how a redis-rs client and a rustls
//! configuration (for fred) are made from it, and how a failure to
//! connect is explained (the cause and the fix, never a secret).
//!
//! - **TLS** is always built in (rustls with the ring provider: no system
//!   OpenSSL). A `rediss://` URL connects over TLS; the server's
//!   certificate is checked against the **system's roots**, or against the
//!   CA file given ([`Security::ca_file`]) for a private CA, and must name
//!   the host of the URL (an IP address in the URL must be in the
//!   certificate's IP addresses). A client certificate and its key
//!   ([`Security::cert_file`], [`Security::key_file`]) answer servers
//!   that require one (`tls-auth-clients yes`). There is no option that
//!   skips the checks: give the CA instead.
//! - **Credentials** come from the URL (`redis://user:password@host/`) or
//!   from the builder, which wins. The password is kept in a [`Secret`],
//!   shown as `***` by `Debug`, and no message of this crate contains it
//!   (URLs in messages go through [`redacted`]).

use std::fmt;
use std::path::{Path, PathBuf};

use ratelimit_core::StoreError;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A password: `Debug` and `Display` show `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `secret`.
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    /// The secret itself, to hand to a client.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// TLS files and credentials for the connections to Redis (see the module
/// docs). Every field is optional; the builders set them through
/// `tls_ca_file`, `tls_client_cert`, `username` and `password`.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Security {
    /// A PEM file of the CA certificate(s) that signed the servers'
    /// certificates, used instead of the system's roots.
    pub ca_file: Option<PathBuf>,
    /// A PEM file of the client certificate (its chain), for servers that
    /// require one.
    pub cert_file: Option<PathBuf>,
    /// The PEM file of the client certificate's private key.
    pub key_file: Option<PathBuf>,
    /// The ACL user, instead of the URL's.
    pub username: Option<String>,
    /// The password, instead of the URL's.
    pub password: Option<Secret>,
}

impl Security {
    /// Whether any TLS file was given.
    pub fn has_tls_files(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// The CA file's certificates, and the client certificate with its key,
    /// read and parsed now: a missing, unreadable or malformed file is
    /// reported here, naming the file and the setting, before any
    /// connection is tried.
    pub fn load(&self) -> Result<TlsMaterial, StoreError> {
        let roots = match &self.ca_file {
            Some(path) => {
                let pem = read(path, "CA file (tls_ca_file, --redis-ca-file)")?;
                let certs = certificates(&pem, path, "CA file (tls_ca_file, --redis-ca-file)")?;
                Some((pem, certs))
            }
            None => None,
        };
        let client = match (&self.cert_file, &self.key_file) {
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                return Err(StoreError::message(
                    "a client certificate needs both its certificate file and its key file \
                     (tls_client_cert(cert, key); --redis-cert-file and --redis-key-file)",
                    false,
                ));
            }
            (Some(cert), Some(key)) => {
                let what = "client certificate file (--redis-cert-file)";
                let cert_pem = read(cert, what)?;
                let chain = certificates(&cert_pem, cert, what)?;
                let key_pem = read(key, "client key file (--redis-key-file)")?;
                let parsed = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                    StoreError::message(
                        format!(
                            "the client key file (--redis-key-file) {} holds no usable private \
                             key ({e}): give the PEM key (PKCS#8, PKCS#1 or SEC1) of the client \
                             certificate",
                            key.display()
                        ),
                        false,
                    )
                })?;
                Some(ClientIdentity {
                    cert_pem,
                    key_pem,
                    chain,
                    key: parsed,
                })
            }
        };
        Ok(TlsMaterial { roots, client })
    }

    /// `info` with this security's credentials applied (they take the
    /// place of the URL's).
    pub fn apply_credentials(&self, info: redis::ConnectionInfo) -> redis::ConnectionInfo {
        let mut settings = info.redis_settings().clone();
        if let Some(user) = &self.username {
            settings = settings.set_username(user);
        }
        if let Some(password) = &self.password {
            settings = settings.set_password(password.expose());
        }
        info.set_redis_settings(settings)
    }

    /// A redis-rs client for `url` with these settings: credentials,
    /// `TCP_NODELAY`, and for a `rediss://` URL the CA and client
    /// certificate. Fails, naming the cause and the fix, on an invalid URL,
    /// an unreadable file, or TLS files given for a `redis://` URL.
    pub fn redis_client(&self, url: &str) -> Result<redis::Client, StoreError> {
        let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| {
            StoreError::message(format!("invalid Redis URL {}: {e}", redacted(url)), false)
        })?;
        self.redis_client_for(info, &redacted(url))
    }

    /// As [`Security::redis_client`], for a parsed `info`; `name` names it
    /// in errors.
    pub fn redis_client_for(
        &self,
        info: redis::ConnectionInfo,
        name: &str,
    ) -> Result<redis::Client, StoreError> {
        // TCP_NODELAY: a batch call larger than one write would otherwise
        // wait for the server's delayed ACK (40 ms on Linux) under Nagle's
        // algorithm, which redis-rs leaves on by default.
        let info = self
            .apply_credentials(info)
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        if !tls {
            if self.has_tls_files() {
                return Err(StoreError::message(
                    format!(
                        "TLS files were given but {name} is not a TLS URL: use rediss:// \
                         (redis:// connects in plain text)"
                    ),
                    false,
                ));
            }
            return redis::Client::open(info).map_err(|e| {
                StoreError::message(format!("invalid Redis settings for {name}: {e}"), false)
            });
        }
        install_crypto_provider();
        let material = self.load()?;
        if material.roots.is_none() && material.client.is_none() {
            return redis::Client::open(info).map_err(|e| {
                StoreError::message(format!("invalid Redis settings for {name}: {e}"), false)
            });
        }
        let certificates = redis::TlsCertificates {
            client_tls: material.client.as_ref().map(|c| redis::ClientTlsConfig {
                client_cert: c.cert_pem.clone(),
                client_key: c.key_pem.clone(),
            }),
            root_cert: material.roots.as_ref().map(|(pem, _)| pem.clone()),
        };
        redis::Client::build_with_tls(info, certificates).map_err(|e| {
            StoreError::message(
                format!(
                    "cannot set up TLS for {name}: {e} (check the CA and client certificate files)"
                ),
                false,
            )
        })
    }

    /// A rustls client configuration with these files: the CA file's
    /// roots (else the system's), the client certificate if given. For
    /// fred (`TlsConnector::from`) and for tests.
    pub fn rustls_config(&self) -> Result<rustls::ClientConfig, StoreError> {
        install_crypto_provider();
        let material = self.load()?;
        let mut roots = rustls::RootCertStore::empty();
        match &material.roots {
            Some((_, certs)) => {
                for cert in certs {
                    roots.add(cert.clone()).map_err(|e| {
                        StoreError::message(
                            format!("the CA file (--redis-ca-file) holds an unusable CA certificate: {e}"),
                            false,
                        )
                    })?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                for cert in found.certs {
                    let _ = roots.add(cert);
                }
            }
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        match material.client {
            Some(client) => builder
                .with_client_auth_cert(client.chain, client.key)
                .map_err(|e| {
                    StoreError::message(
                        format!(
                            "the client certificate and key do not go together or cannot be \
                             used: {e} (--redis-cert-file, --redis-key-file)"
                        ),
                        false,
                    )
                }),
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

/// The parsed TLS files of a [`Security`].
pub struct TlsMaterial {
    /// The CA file's PEM and its certificates.
    pub roots: Option<(Vec<u8>, Vec<CertificateDer<'static>>)>,
    /// The client certificate and key.
    pub client: Option<ClientIdentity>,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("roots", &self.roots.as_ref().map(|(_, c)| c.len()))
            .field("client", &self.client.is_some())
            .finish()
    }
}

/// A client certificate chain and its key, as PEM and parsed.
pub struct ClientIdentity {
    /// The certificate file's PEM.
    pub cert_pem: Vec<u8>,
    /// The key file's PEM.
    pub key_pem: Vec<u8>,
    /// The certificate chain.
    pub chain: Vec<CertificateDer<'static>>,
    /// The private key.
    pub key: PrivateKeyDer<'static>,
}

impl fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("chain", &self.chain.len())
            .finish_non_exhaustive()
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| {
        StoreError::message(
            format!("cannot read the Redis TLS {what} {}: {e}", path.display()),
            false,
        )
    })
}

fn certificates(
    pem: &[u8],
    path: &Path,
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, StoreError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            StoreError::message(
                format!("the Redis TLS {what} {} is not PEM: {e}", path.display()),
                false,
            )
        })?;
    if certs.is_empty() {
        return Err(StoreError::message(
            format!(
                "the Redis TLS {what} {} holds no certificate (-----BEGIN CERTIFICATE-----)",
                path.display()
            ),
            false,
        ));
    }
    Ok(certs)
}

/// Makes rustls' ring provider the process default, unless one is set:
/// the clients build their TLS configurations with the default provider.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // ring, not aws-lc-rs: it builds with a C compiler alone (no cmake,
        // no NASM). rustls 0.23.48 marks its constructor deprecated for
        // lacking post-quantum key exchange, which Redis servers do not
        // offer either.
        #[allow(deprecated)]
        let provider = rustls::crypto::ring::default_provider();
        let _ = provider.install_default();
    }
}

/// `url` with its password, if any, replaced by `***`: messages name the
/// node, never its credentials.
///
/// ```
/// use ratelimit_redis::tls::redacted;
/// assert_eq!(redacted("rediss://app:s3cret@10.0.0.1:6380/0"), "rediss://app:***@10.0.0.1:6380/0");
/// ```
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{path}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// What a failure to connect to or talk with `node` means and how to fix
/// it, from the client's error text: wrong or missing credentials, an
/// untrusted or misnamed server certificate, a client certificate missing
/// or refused, plain text to a TLS port or TLS to a plain-text port.
/// `None` when the error is none of these.
pub fn explain(message: &str, node: &str, tls: bool) -> Option<String> {
    let m = message;
    let has = |s: &str| m.contains(s);
    if has("WRONGPASS")
        || has("invalid password")
        || has("invalid username-password")
        || has("AuthenticationFailed")
        || has("authentication failed")
    {
        return Some(format!(
            "{node} refused the credentials (WRONGPASS): check the ACL user and password \
             (in the URL, redis://user:password@host/, or username()/password(); \
             --redis-username, --redis-password)"
        ));
    }
    if has("NOAUTH") || has("Authentication required") {
        return Some(format!(
            "{node} requires authentication (NOAUTH): give the ACL user and password \
             (redis://user:password@host/, or username()/password(); --redis-username, \
             --redis-password)"
        ));
    }
    // (UnknownCA is the server's alert about our certificate: below.)
    if has("UnknownIssuer") || has("unknown issuer") {
        return Some(format!(
            "the certificate of {node} is not signed by a CA this client trusts: give the CA \
             that signed it (tls_ca_file, --redis-ca-file)"
        ));
    }
    if has("NotValidForName") || has("not valid for name") || has("CertNotValidForName") {
        return Some(format!(
            "the certificate of {node} does not name the host it was reached at: connect by a \
             name or IP address in the certificate's subject alternative names, or reissue it \
             with that name"
        ));
    }
    if has("CertificateRequired") || has("certificate required") {
        return Some(format!(
            "{node} requires a client certificate (tls-auth-clients yes): give one signed by a \
             CA it trusts (tls_client_cert, --redis-cert-file and --redis-key-file)"
        ));
    }
    if has("BadCertificate")
        || has("UnknownCA")
        || has("DecryptError")
        || has("bad certificate")
        || has("unknown ca")
    {
        return Some(format!(
            "{node} refused the client certificate: it is not signed by a CA the server trusts \
             (its tls-ca-cert-file), or does not match its key: give a certificate that is \
             (--redis-cert-file, --redis-key-file)"
        ));
    }
    if has("InvalidContentType") || has("corrupt message") || has("InvalidMessage") {
        return Some(format!(
            "{node} answered in plain text: this port does not serve TLS; use a redis:// URL, \
             or the server's tls-port"
        ));
    }
    let closed = has("Connection reset")
        || has("connection reset")
        || has("Broken pipe")
        || has("broken pipe")
        || has("closed")
        || has("EOF")
        || has("end of file")
        || has("UnexpectedEof");
    if closed && !tls {
        return Some(format!(
            "{node} closed the connection at once: if it serves TLS only (tls-port, port 0), \
             use a rediss:// URL"
        ));
    }
    let timed_out = has("timed out") || has("Timeout") || has("timeout");
    if timed_out && tls {
        return Some(format!(
            "{node} did not answer the TLS handshake in time: if this port serves plain text \
             (the server has no tls-port here), use a redis:// URL; else the server is too \
             slow or unreachable (connection_timeout)"
        ));
    }
    if closed && tls {
        return Some(format!(
            "{node} closed the connection during the TLS handshake: it may require a client \
             certificate (--redis-cert-file, --redis-key-file) or refuse the one given"
        ));
    }
    None
}

/// `err` with [`explain`]'s cause and fix added to its message, when it
/// has one.
pub fn explained(err: StoreError, node: &str, tls: bool) -> StoreError {
    let text = format!("{err}");
    let text = match &err {
        StoreError::Backend {
            source: Some(source),
            ..
        } => format!("{text} {source:?}"),
        _ => text,
    };
    match explain(&text, node, tls) {
        Some(why) => match err {
            StoreError::Backend {
                message,
                transient,
                source,
            } => StoreError::Backend {
                message: format!("{message} ({why})"),
                transient,
                source,
            },
            other => StoreError::message(format!("{other} ({why})"), other.is_transient()),
        },
        None => err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_do_not_show() {
        let s = Security {
            password: Some(Secret::new("hunter2")),
            username: Some("app".into()),
            ..Security::default()
        };
        assert!(!format!("{s:?}").contains("hunter2"));
        assert_eq!(format!("{}", Secret::new("x")), "***");
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(redacted("redis://10.0.0.1:6379/"), "redis://10.0.0.1:6379/");
        assert_eq!(
            redacted("redis://:s3cret@10.0.0.1:6379/0"),
            "redis://:***@10.0.0.1:6379/0"
        );
        assert_eq!(
            redacted("rediss://app:p@ss@10.0.0.1:6380"),
            "rediss://app:***@10.0.0.1:6380"
        );
        assert_eq!(redacted("redis://app@10.0.0.1/"), "redis://app@10.0.0.1/");
    }

    #[test]
    fn tls_files_need_rediss() {
        let s = Security {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..Security::default()
        };
        let e = s.redis_client("redis://:pw@127.0.0.1:6379/").unwrap_err();
        assert!(e.to_string().contains("rediss://"), "{e}");
        assert!(!e.to_string().contains("pw@"), "{e}");
        let e = s.redis_client("rediss://127.0.0.1:6379/").unwrap_err();
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
        let half = Security {
            cert_file: Some("/x.pem".into()),
            ..Security::default()
        };
        let e = half.redis_client("rediss://127.0.0.1:6379/").unwrap_err();
        assert!(e.to_string().contains("key file"), "{e}");
    }
}
