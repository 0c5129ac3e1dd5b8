//! The service over mutual TLS in front of a TLS-only Redis that requires
//! client certificates, reached as an ACL user confined to the service's
//! prefix: decisions over gRPC (mutual TLS) and HTTP (TLS); a client
//! without a certificate refused at the handshake; certificates reloaded
//! when their files change; every wrong Redis setting a clear error at
//! start; the password in no line the server writes, even at debug level.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{Server, descriptor, eventually, request, run_to_exit, temp_dir, write_whole};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_testkit::acl::AclUser;
use ratelimit_testkit::redis_server::RedisServer;
use ratelimit_testkit::tls::{TestCerts, install_crypto_provider};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn path(p: std::path::PathBuf) -> String {
    p.display().to_string()
}

/// A gRPC channel over TLS trusting `ca`, with the client certificate
/// `identity` if any.
async fn channel(
    addr: SocketAddr,
    ca: &[u8],
    identity: Option<(&[u8], &[u8])>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://{addr}"))
        .expect("uri")
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

/// `GET path` over TLS (trusting `ca`, presenting the test client
/// certificate): the status line.
fn https_get(addr: SocketAddr, certs: &TestCerts, path: &str) -> std::io::Result<String> {
    install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(certs.ca()).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let chain: Vec<_> = rustls_pki_types::CertificateDer::pem_file_iter(certs.client_cert())
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(certs.client_key()).unwrap();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = std::net::TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    let _ = tls.read_to_string(&mut out);
    Ok(out.lines().next().unwrap_or("").to_owned())
}

use rustls_pki_types::pem::PemObject;

struct Setup {
    redis: RedisServer,
    user: AclUser,
    prefix: String,
    certs: Arc<TestCerts>,
}

fn setup() -> Setup {
    let redis = RedisServer::start_tls();
    let prefix = redis.prefix().to_owned();
    let user = redis.acl_user(&ratelimit_redis::acl::rule(&prefix, false));
    Setup {
        redis,
        user,
        prefix,
        certs: TestCerts::shared(),
    }
}

impl Setup {
    /// The Redis arguments: the TLS URL, the user, the CA and client
    /// certificate (the password goes by environment).
    fn redis_args(&self) -> Vec<String> {
        let c = &self.certs;
        vec![
            "--backend".into(),
            "redis".into(),
            "--redis-url".into(),
            self.redis.url(),
            "--redis-username".into(),
            self.user.name().into(),
            "--redis-ca-file".into(),
            path(c.ca()),
            "--redis-cert-file".into(),
            path(c.client_cert()),
            "--redis-key-file".into(),
            path(c.client_key()),
            "--redis-prefix".into(),
            self.prefix.clone(),
            "--failure-policy".into(),
            "closed".into(),
            "--timeout".into(),
            "2s".into(),
        ]
    }
}

#[test]
fn decisions_over_mutual_tls_through_a_tls_redis_as_a_confined_acl_user() {
    let s = setup();
    let dir = temp_dir("tls");
    write_whole(
        &dir,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: hour\n      requests_per_unit: 2\n",
    );
    let certs = &s.certs;
    let mut args = s.redis_args();
    args.extend([
        "--config".into(),
        dir.display().to_string(),
        "--grpc-tls-cert".into(),
        path(certs.server_cert()),
        "--grpc-tls-key".into(),
        path(certs.server_key()),
        "--grpc-client-ca".into(),
        path(certs.ca()),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start_with_env(
        &args,
        &[
            ("RLS_REDIS_PASSWORD", s.user.password()),
            ("RUST_LOG", "debug"),
        ],
    );
    let ca = certs.read("ca.pem");
    let (cert, key) = (certs.read("client.pem"), certs.read("client.key"));
    rt().block_on(async {
        let mut client = RateLimitServiceClient::new(
            channel(server.grpc, &ca, Some((&cert, &key)))
                .await
                .expect("a client with a certificate connects"),
        );
        let req = request("edge", vec![descriptor(&[("remote_address", "10.0.0.1")])]);
        for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
            let r = client
                .should_rate_limit(req.clone())
                .await
                .expect("rpc")
                .into_inner();
            assert_eq!(r.overall_code, expected as i32, "{r:?}");
        }
        // No client certificate: refused at the handshake.
        let refused = match channel(server.grpc, &ca, None).await {
            Err(_) => true,
            Ok(ch) => RateLimitServiceClient::new(ch)
                .should_rate_limit(req.clone())
                .await
                .is_err(),
        };
        assert!(refused, "a client without a certificate was served");
        // A certificate of another CA: refused too.
        let other = (
            certs.read("other-client.pem"),
            certs.read("other-client.key"),
        );
        let refused = match channel(server.grpc, &ca, Some((&other.0, &other.1))).await {
            Err(_) => true,
            Ok(ch) => RateLimitServiceClient::new(ch)
                .should_rate_limit(req.clone())
                .await
                .is_err(),
        };
        assert!(refused, "a client certificate of another CA was accepted");
    });
    // HTTP over (mutual) TLS.
    let status = https_get(server.http, certs, "/healthcheck").expect("https");
    assert!(status.contains("200"), "{status}");
    // Every key the service wrote is under its prefix.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut s.redis.connection())
        .unwrap();
    assert!(!keys.is_empty());
    assert!(
        keys.iter()
            .all(|k| k.starts_with(&format!("{}:", s.prefix))),
        "{keys:?}"
    );
    let log = server.stderr.lock().unwrap().clone();
    assert!(
        !log.contains(s.user.password()),
        "the password is in the server's log"
    );
}

#[test]
fn the_service_certificate_is_reloaded_when_its_files_change() {
    let old = TestCerts::shared();
    let fresh = TestCerts::generate();
    let dir = temp_dir("tls-reload");
    write_whole(
        &dir,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: hour\n      requests_per_unit: 100\n",
    );
    let (cert, key) = (dir.join("tls.pem"), dir.join("tls.key"));
    std::fs::copy(old.server_cert(), &cert).unwrap();
    std::fs::copy(old.server_key(), &key).unwrap();
    let server = Server::start(&[
        "--config",
        &dir.join("edge.yaml").display().to_string(),
        "--grpc-tls-cert",
        &cert.display().to_string(),
        "--grpc-tls-key",
        &key.display().to_string(),
    ]);
    let req = request("edge", vec![descriptor(&[("remote_address", "10.0.0.1")])]);
    let works = |ca: Vec<u8>| {
        let req = req.clone();
        rt().block_on(async move {
            match channel(server.grpc, &ca, None).await {
                Ok(ch) => RateLimitServiceClient::new(ch)
                    .should_rate_limit(req)
                    .await
                    .is_ok(),
                Err(_) => false,
            }
        })
    };
    assert!(works(old.read("ca.pem")));
    assert!(!works(fresh.read("ca.pem")));
    // The new pair, each file replaced whole.
    for (from, to) in [(fresh.server_key(), &key), (fresh.server_cert(), &cert)] {
        let part = to.with_extension("part");
        std::fs::copy(from, &part).unwrap();
        std::fs::rename(&part, to).unwrap();
    }
    let reloaded = eventually(Duration::from_secs(10), || {
        works(fresh.read("ca.pem")).then_some(())
    });
    assert!(
        reloaded.is_some(),
        "the new certificate is not served: {}",
        server.stderr.lock().unwrap()
    );
    assert!(!works(old.read("ca.pem")));
}

#[test]
fn wrong_redis_settings_stop_the_server_with_the_cause_and_no_password() {
    let s = setup();
    let plain = RedisServer::start_local();
    let certs = &s.certs;
    let dir = temp_dir("tls-errors");
    let config = write_whole(
        &dir,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: hour\n      requests_per_unit: 2\n",
    );
    let pw = s.user.password().to_owned();
    let wrong_pw = format!("{pw}-wrong");
    let base = {
        let mut a = s.redis_args();
        a.extend(["--config".into(), config.display().to_string()]);
        a
    };
    let with = |replace: &[(&str, String)]| {
        let mut a = base.clone();
        for (flag, value) in replace {
            match a.iter().position(|x| x == flag) {
                Some(i) => a[i + 1] = value.clone(),
                None => a.extend([(*flag).to_owned(), value.clone()]),
            }
        }
        a
    };
    let cases: Vec<(&str, Vec<String>, &str, &str)> = vec![
        (
            "wrong CA",
            with(&[("--redis-ca-file", path(certs.file("other-ca.pem")))]),
            &pw,
            "--redis-ca-file",
        ),
        (
            "a client certificate of another CA",
            with(&[
                ("--redis-cert-file", path(certs.file("other-client.pem"))),
                ("--redis-key-file", path(certs.file("other-client.key"))),
            ]),
            &pw,
            "refused the client certificate",
        ),
        (
            "wrong password",
            base.clone(),
            &wrong_pw,
            "refused the credentials",
        ),
        (
            "plain text to a TLS port",
            with(&[(
                "--redis-url",
                s.redis.url().replace("rediss://", "redis://"),
            )]),
            &pw,
            "rediss://",
        ),
        (
            "TLS to a plain-text port",
            with(&[("--redis-url", plain.url().replace("redis://", "rediss://"))]),
            &pw,
            "use a redis:// URL",
        ),
    ];
    for (case, args, password, fix) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out) = run_to_exit(
            &args,
            &[("RLS_REDIS_PASSWORD", password), ("RUST_LOG", "debug")],
        );
        assert_ne!(code, Some(0), "{case}: the server started:\n{out}");
        assert!(out.contains(fix), "{case}: no {fix:?} in:\n{out}");
        assert!(
            !out.contains(&pw) && !out.contains(password),
            "{case}: the password is in the output:\n{out}"
        );
    }
    // A user without a command the store needs: the missing permission and
    // the rule to add.
    let no_zadd = s
        .redis
        .acl_user(&ratelimit_redis::acl::rule(&s.prefix, false).replace(" +zadd", ""));
    let args = with(&[("--redis-username", no_zadd.name().to_owned())]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out) = run_to_exit(
        &args,
        &[
            ("RLS_REDIS_PASSWORD", no_zadd.password()),
            ("RUST_LOG", "debug"),
        ],
    );
    assert_ne!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("ACL SETUSER {} +zadd", no_zadd.name())),
        "{out}"
    );
    assert!(!out.contains(no_zadd.password()), "{out}");
    // The password in the URL is redacted too.
    let args = with(&[(
        "--redis-url",
        s.user.url(&s.redis.url()).replace(&pw, &wrong_pw),
    )]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out) = run_to_exit(&args, &[("RUST_LOG", "debug")]);
    assert_ne!(code, Some(0), "{out}");
    assert!(
        !out.contains(&wrong_pw),
        "the URL's password is shown:\n{out}"
    );
}

#[test]
fn input_limits_refuse_with_invalid_argument_and_the_server_keeps_serving() {
    let dir = temp_dir("limits");
    let config = write_whole(
        &dir,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: hour\n      requests_per_unit: 100\n",
    );
    let server = Server::start(&[
        "--config",
        &config.display().to_string(),
        "--max-descriptors",
        "2",
    ]);
    rt().block_on(async {
        let mut client = RateLimitServiceClient::connect(server.grpc_url())
            .await
            .expect("connect");
        let one = descriptor(&[("remote_address", "10.0.0.1")]);
        let three = request("edge", vec![one.clone(), one.clone(), one.clone()]);
        let e = client.should_rate_limit(three).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(
            e.message().contains("--max-descriptors") && e.message().contains(" 3,"),
            "{}",
            e.message()
        );
        let long = request(
            "edge",
            vec![descriptor(&[("remote_address", &"x".repeat(1 << 20))])],
        );
        let e = client.should_rate_limit(long).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("--max-value-len"), "{}", e.message());
        let mut heavy = request("edge", vec![one.clone()]);
        heavy.hits_addend = 5_000_000;
        let e = client.should_rate_limit(heavy).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("--max-hits-addend"), "{}", e.message());
        // Still serving.
        let ok = client
            .should_rate_limit(request("edge", vec![one]))
            .await
            .expect("rpc")
            .into_inner();
        assert_eq!(ok.overall_code, Code::Ok as i32);
    });
    let r = common::http(
        server.http,
        "POST",
        "/json",
        &format!(
            r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"remote_address","value":"{}"}}]}}]}}"#,
            "y".repeat(5000)
        ),
    );
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body.contains("--max-value-len"), "{r:?}");
}

#[test]
fn the_sentinel_backend_decides_through_the_primary_and_follows_a_failover() {
    let fixture = ratelimit_testkit::sentinel::RedisSentinel::start();
    let dir = temp_dir("sentinel");
    let config = write_whole(
        &dir,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1000\n",
    );
    let server = Server::start(&[
        "--config",
        &config.display().to_string(),
        "--backend",
        "sentinel",
        "--sentinel-url",
        &fixture.sentinel_url(),
        "--sentinel-master",
        fixture.master_name(),
        "--redis-prefix",
        fixture.prefix(),
        "--failure-policy",
        "closed",
    ]);
    let req = request("edge", vec![descriptor(&[("remote_address", "10.0.0.9")])]);
    let ok = |server: &Server| {
        let req = req.clone();
        rt().block_on(async move {
            let mut client = RateLimitServiceClient::connect(server.grpc_url())
                .await
                .ok()?;
            let r = client.should_rate_limit(req).await.ok()?.into_inner();
            (r.overall_code == Code::Ok as i32).then_some(())
        })
    };
    assert!(ok(&server).is_some());
    fixture.kill_primary();
    assert!(
        fixture
            .wait_for_promotion(Duration::from_secs(30))
            .is_some()
    );
    assert!(
        eventually(Duration::from_secs(10), || ok(&server)).is_some(),
        "no decision after the failover: {}",
        server.stderr.lock().unwrap()
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:*", fixture.prefix()))
        .query(&mut fixture.replica_connection())
        .unwrap();
    assert!(!keys.is_empty(), "no key on the new primary");
}
