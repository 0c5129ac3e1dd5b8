//! Certificates for TLS tests (feature `redis`), made by the tests
//! themselves with rcgen: no openssl, nothing from outside.
//!
//! [`TestCerts::shared`] makes, once per test process, in a temporary
//! directory of its own:
//!
//! - a test CA (`ca.pem`), and a server certificate it signs for
//!   `127.0.0.1`, `::1` and `localhost` (`server.pem`, `server.key`);
//! - a client certificate it signs (`client.pem`, `client.key`), for
//!   servers that require one (`tls-auth-clients yes`);
//! - **wrong ones**, for the failure tests: another CA (`other-ca.pem`)
//!   and a client certificate it signs (`other-client.pem`,
//!   `other-client.key`), and a server certificate of the test CA that
//!   names only `redis.invalid` (`wrong-name.pem`, `wrong-name.key`).
//!
//! The fixtures ([`crate::server_process::ServerOptions::tls`]) start
//! `redis-server` with `--tls-port`, these files and `--port 0` (TLS
//! only), and their own connections use the test CA and client
//! certificate for every `rediss://` URL.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// The files of a test CA and the certificates it signs. See the module
/// docs.
#[derive(Debug)]
pub struct TestCerts {
    dir: PathBuf,
}

static SHARED: OnceLock<Arc<TestCerts>> = OnceLock::new();

fn ca(name: &str) -> (CertificateParams, KeyPair, String) {
    let key = KeyPair::generate().expect("generating a CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).expect("self-signing the CA");
    (params, key, cert.pem())
}

fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    names: &[&str],
    ips: &[std::net::IpAddr],
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let key = KeyPair::generate().expect("generating a key");
    let mut params =
        CertificateParams::new(names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
            .expect("certificate parameters");
    for ip in ips {
        params.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    params
        .distinguished_name
        .push(DnType::CommonName, names.first().copied().unwrap_or("test"));
    params.extended_key_usages = vec![usage];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let cert = params
        .signed_by(&key, issuer)
        .expect("signing a certificate");
    (cert.pem(), key.serialize_pem())
}

impl TestCerts {
    /// The process's certificates, made on first use.
    ///
    /// # Panics
    ///
    /// When the temporary directory cannot be written.
    pub fn shared() -> Arc<Self> {
        Arc::clone(SHARED.get_or_init(|| Arc::new(Self::generate())))
    }

    /// Makes a new set in a new temporary directory.
    ///
    /// # Panics
    ///
    /// When the temporary directory cannot be written.
    pub fn generate() -> Self {
        let dir = std::env::temp_dir().join(format!("rl-tls-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let loopback: [std::net::IpAddr; 2] = [
            std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::Ipv6Addr::LOCALHOST.into(),
        ];
        let (ca_params, ca_key, ca_pem) = ca("ratelimit test CA");
        let issuer = Issuer::new(ca_params, ca_key);
        // Redis' own connections (replication, the cluster bus) present
        // the server certificate as a client too: allow both.
        let (node, node_key) = {
            let key = KeyPair::generate().expect("generating a key");
            let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
            for ip in loopback {
                params.subject_alt_names.push(SanType::IpAddress(ip));
            }
            params
                .distinguished_name
                .push(DnType::CommonName, "redis node");
            params.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let cert = params.signed_by(&key, &issuer).expect("signing");
            (cert.pem(), key.serialize_pem())
        };
        let (client, client_key) = leaf(
            &issuer,
            &["ratelimit test client"],
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        let (wrong_name, wrong_name_key) = leaf(
            &issuer,
            &["redis.invalid"],
            &[],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (other_params, other_key, other_pem) = ca("another CA");
        let other = Issuer::new(other_params, other_key);
        let (other_client, other_client_key) = leaf(
            &other,
            &["a client of another CA"],
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        for (name, body) in [
            ("ca.pem", ca_pem),
            ("server.pem", node),
            ("server.key", node_key),
            ("client.pem", client),
            ("client.key", client_key),
            ("wrong-name.pem", wrong_name),
            ("wrong-name.key", wrong_name_key),
            ("other-ca.pem", other_pem),
            ("other-client.pem", other_client),
            ("other-client.key", other_client_key),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, body)
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        }
        Self { dir }
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A file of the set by name (`ca.pem`, `client.key`, ...).
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The test CA.
    pub fn ca(&self) -> PathBuf {
        self.file("ca.pem")
    }

    /// The server certificate (for `127.0.0.1`, `::1`, `localhost`).
    pub fn server_cert(&self) -> PathBuf {
        self.file("server.pem")
    }

    /// The server certificate's key.
    pub fn server_key(&self) -> PathBuf {
        self.file("server.key")
    }

    /// The client certificate the test CA signs.
    pub fn client_cert(&self) -> PathBuf {
        self.file("client.pem")
    }

    /// The client certificate's key.
    pub fn client_key(&self) -> PathBuf {
        self.file("client.key")
    }

    /// The file's contents.
    ///
    /// # Panics
    ///
    /// When it cannot be read.
    pub fn read(&self, name: &str) -> Vec<u8> {
        let path = self.file(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    }

    /// redis-rs' TLS settings with the test CA and client certificate.
    pub fn redis_certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: self.read("client.pem"),
                client_key: self.read("client.key"),
            }),
            root_cert: Some(self.read("ca.pem")),
        }
    }
}

/// Makes rustls' ring provider the process default, unless one is set
/// (the clients build their TLS configurations with the default).
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        #[allow(deprecated)]
        let provider = rustls::crypto::ring::default_provider();
        let _ = provider.install_default();
    }
}

/// A redis-rs client for `url`: for a `rediss://` URL with the shared
/// test CA and client certificate ([`TestCerts::shared`]).
///
/// # Panics
///
/// When the URL is invalid.
pub fn client(url: &str) -> redis::Client {
    if url.starts_with("rediss://") {
        install_crypto_provider();
        redis::Client::build_with_tls(url, TestCerts::shared().redis_certificates())
            .unwrap_or_else(|e| panic!("a TLS client for {url}: {e}"))
    } else {
        redis::Client::open(url).unwrap_or_else(|e| panic!("a client for {url}: {e}"))
    }
}
