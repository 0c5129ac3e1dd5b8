//! A cluster store that cannot be built says which seed node it could not
//! use, by its URL, without the URL's password. No server is needed: the
//! seeds are a closed loopback port and URLs that do not parse.

use std::net::TcpListener;

use ratelimit_cluster::ClusterStore;

/// A loopback port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

async fn connect_error(urls: &[&str]) -> String {
    match ClusterStore::connect(urls.iter().copied()).await {
        Ok(_) => panic!("connected to {urls:?}"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn an_unreachable_seed_is_named_by_its_url() {
    let url = format!("redis://127.0.0.1:{}/", closed_port());
    let message = connect_error(&[&url]).await;
    assert!(
        message.contains(&format!("seed nodes {url}")),
        "the error does not name {url}: {message}"
    );
}

#[tokio::test]
async fn an_invalid_seed_url_is_named() {
    let good = format!("redis://127.0.0.1:{}/", closed_port());
    let message = connect_error(&[&good, "redis://cache-1:sixty/"]).await;
    assert!(
        message.contains("invalid Redis Cluster seed node URL redis://cache-1:sixty/"),
        "{message}"
    );
}

#[tokio::test]
async fn a_password_in_a_seed_url_is_never_shown() {
    let port = closed_port();
    let url = format!("redis://app:s3cret@127.0.0.1:{port}/");
    let message = connect_error(&[&url]).await;
    assert!(
        message.contains(&format!("redis://app:***@127.0.0.1:{port}/")),
        "{message}"
    );
    assert!(
        !message.contains("s3cret"),
        "the password leaked: {message}"
    );
}
