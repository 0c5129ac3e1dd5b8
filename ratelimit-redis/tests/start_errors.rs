//! Every way a secured connection can be wrong fails at start with an
//! error that names the cause and the fix, and never holds the password:
//! a CA that did not sign the server's certificate, a certificate that
//! does not name the host, no client certificate or one the server does
//! not trust, a wrong password, an ACL user without a command the store
//! needs or without the store's keys, plain text to a TLS port and TLS to
//! a plain-text port; with each client library.

use std::time::Duration;

use ratelimit_redis::{RedisStore, RedisStoreBuilder};
use ratelimit_testkit::redis_server::RedisServer;
use ratelimit_testkit::server_process::ServerOptions;
use ratelimit_testkit::tls::TestCerts;

#[derive(Debug, Clone, Copy)]
enum Lib {
    RedisRs,
    #[cfg(feature = "fred")]
    Fred,
}

const LIBS: &[Lib] = &[
    Lib::RedisRs,
    #[cfg(feature = "fred")]
    Lib::Fred,
];

fn builder(url: &str) -> RedisStoreBuilder {
    RedisStore::builder(url)
        .connection_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
}

/// Builds with `lib`; the error's text, checked to name `fix` and not to
/// hold `password`.
async fn fails(lib: Lib, b: RedisStoreBuilder, fix: &[&str], password: &str, case: &str) {
    let built = match lib {
        Lib::RedisRs => b.build().await,
        #[cfg(feature = "fred")]
        Lib::Fred => b.build_fred().await,
    };
    let e = match built {
        Ok(_) => panic!("{case} ({lib:?}): the store was built"),
        Err(e) => e,
    };
    let text = format!("{e} / {e:?}");
    assert!(
        !text.contains(password),
        "{case} ({lib:?}): the error holds the password: {text}"
    );
    assert!(
        fix.iter().any(|f| text.contains(f)),
        "{case} ({lib:?}): the error should name one of {fix:?}: {e}"
    );
    println!("{case} ({lib:?}): {e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn each_wrong_setting_is_a_clear_error_at_start() {
    let certs = TestCerts::shared();
    let tls = RedisServer::start_tls();
    // The same server certificate, also reached at 127.0.0.2, an address
    // it does not name.
    let also = RedisServer::start_with(
        &ServerOptions::new()
            .tls()
            .args(["--bind", "127.0.0.1 127.0.0.2"]),
    );
    let plain = RedisServer::start_local();
    let prefix = tls.prefix().to_owned();
    let rule = ratelimit_redis::acl::rule(&prefix, false);
    let user = tls.acl_user(&rule);
    let plain_user = plain.acl_user(&rule);
    let pw = user.password().to_owned();
    let good = |url: &str| {
        builder(url)
            .prefix(&prefix)
            .username(user.name())
            .password(user.password())
            .tls_ca_file(certs.ca())
            .tls_client_cert(certs.client_cert(), certs.client_key())
    };
    for &lib in LIBS {
        // The right settings connect.
        let built = match lib {
            Lib::RedisRs => good(&tls.url()).build().await.map(|_| ()),
            #[cfg(feature = "fred")]
            Lib::Fred => good(&tls.url()).build_fred().await.map(|_| ()),
        };
        if let Err(e) = built {
            panic!("{lib:?}: the right settings fail: {e}");
        }
        fails(
            lib,
            good(&tls.url()).tls_ca_file(certs.file("other-ca.pem")),
            &["--redis-ca-file"],
            &pw,
            "wrong CA",
        )
        .await;
        fails(
            lib,
            good(&also.url().replace("127.0.0.1", "127.0.0.2")),
            &["does not name the host"],
            &pw,
            "a certificate for other names",
        )
        .await;
        let no_client_cert = builder(&tls.url())
            .prefix(&prefix)
            .username(user.name())
            .password(user.password())
            .tls_ca_file(certs.ca());
        fails(
            lib,
            no_client_cert,
            &["--redis-cert-file"],
            &pw,
            "no client certificate",
        )
        .await;
        fails(
            lib,
            good(&tls.url()).tls_client_cert(
                certs.file("other-client.pem"),
                certs.file("other-client.key"),
            ),
            &["--redis-cert-file"],
            &pw,
            "a client certificate of another CA",
        )
        .await;
        fails(
            lib,
            good(&tls.url()).password(format!("{pw}x")),
            &["WRONGPASS", "refused the credentials"],
            &pw,
            "wrong password",
        )
        .await;
        let no_zadd = tls.acl_user(&rule.replace(" +zadd", ""));
        fails(
            lib,
            good(&tls.url())
                .username(no_zadd.name())
                .password(no_zadd.password()),
            &[&format!("ACL SETUSER {} +zadd", no_zadd.name())],
            no_zadd.password(),
            "an ACL user without zadd",
        )
        .await;
        let other_keys = tls.acl_user(&ratelimit_redis::acl::rule("elsewhere", false));
        fails(
            lib,
            good(&tls.url())
                .username(other_keys.name())
                .password(other_keys.password()),
            &[&format!("ACL SETUSER {} ~{prefix}:*", other_keys.name())],
            other_keys.password(),
            "an ACL user without the store's keys",
        )
        .await;
        fails(
            lib,
            builder(&tls.url().replace("rediss://", "redis://"))
                .prefix(&prefix)
                .username(user.name())
                .password(user.password()),
            &["use a rediss:// URL"],
            &pw,
            "plain text to a TLS port",
        )
        .await;
        fails(
            lib,
            builder(&plain.url().replace("redis://", "rediss://"))
                .prefix(&prefix)
                .username(plain_user.name())
                .password(plain_user.password())
                .tls_ca_file(certs.ca()),
            &["does not serve TLS", "use a redis:// URL"],
            plain_user.password(),
            "TLS to a plain-text port",
        )
        .await;
    }
}
