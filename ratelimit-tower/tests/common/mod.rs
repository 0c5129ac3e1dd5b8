//! Shared test helpers: a real axum server on loopback, a real hyper client,
//! structured-field parsing with `sfv`, and stores that fail.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::net::SocketAddr;

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use ratelimit_core::store::{Answer, Request as StoreRequest};
use ratelimit_core::{Store, StoreError};
use tokio::net::{TcpListener, TcpStream};

/// Whole seconds since the epoch where every test clock starts.
pub const T0_SECS: u64 = 1_800_000_000;
/// The same, in microseconds.
pub const T0: u64 = T0_SECS * 1_000_000;

/// Serves `app` on 127.0.0.1 on a free port, with the peer address in
/// `ConnectInfo`. The server task ends with the test's runtime.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("server");
    });
    addr
}

/// One response, fully read.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII header"))
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.body.to_vec()).expect("UTF-8 body")
    }

    /// An integer header, parsed as an RFC 9651 Integer item.
    pub fn int(&self, name: &str) -> Option<i64> {
        self.header(name).map(sf_integer)
    }

    /// The names of the rate-limit fields present, in a stable order.
    pub fn rate_limit_fields(&self) -> Vec<&'static str> {
        [
            "retry-after",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "ratelimit-policy",
            "ratelimit",
        ]
        .into_iter()
        .filter(|n| self.headers.contains_key(*n))
        .collect()
    }
}

/// Sends one request on a fresh HTTP/1.1 connection over loopback TCP.
pub async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let headers = headers
        .iter()
        .map(|(k, v)| (*k, HeaderValue::from_str(v).expect("header value")))
        .collect::<Vec<_>>();
    send_raw(addr, method, path, &headers).await
}

/// [`send`] with header values given as bytes, in order; a name given
/// twice is sent as two header lines.
pub async fn send_raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, HeaderValue)],
) -> Reply {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, v.clone());
    }
    let resp = sender
        .send_request(req.body(Empty::<Bytes>::new()).expect("request"))
        .await
        .expect("response");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    send(addr, "GET", path, headers).await
}

/// An RFC 9651 Integer item.
pub fn sf_integer(value: &str) -> i64 {
    let item: sfv::Item = sfv::Parser::new(value)
        .parse_item()
        .unwrap_or_else(|e| panic!("{value:?} is not a structured-field item: {e}"));
    assert!(item.params.is_empty(), "{value:?} has parameters");
    i64::from(
        item.bare_item
            .as_integer()
            .unwrap_or_else(|| panic!("{value:?} is not an sf-Integer")),
    )
}

/// An RFC 9651 List of sf-String items with Integer parameters, as in
/// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11).
pub fn sf_policies(value: &str) -> Vec<(String, BTreeMap<String, i64>)> {
    let list: sfv::List = sfv::Parser::new(value)
        .parse_list()
        .unwrap_or_else(|e| panic!("{value:?} is not a structured-field list: {e}"));
    list.into_iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => {
                let name = item
                    .bare_item
                    .as_string()
                    .unwrap_or_else(|| panic!("{value:?}: policy name is not an sf-String"))
                    .as_str()
                    .to_owned();
                let params = item
                    .params
                    .iter()
                    .map(|(k, v)| {
                        let n = v
                            .as_integer()
                            .unwrap_or_else(|| panic!("{value:?}: {k} is not an sf-Integer"));
                        (k.as_str().to_owned(), i64::from(n))
                    })
                    .collect();
                (name, params)
            }
            sfv::ListEntry::InnerList(_) => panic!("{value:?}: unexpected inner list"),
        })
        .collect()
}

/// `[(name, {param: value})]` from literals.
pub fn policy(name: &str, params: &[(&str, i64)]) -> Vec<(String, BTreeMap<String, i64>)> {
    vec![(
        name.to_owned(),
        params.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
    )]
}

/// A store whose backend is down: every call errors.
#[derive(Debug)]
pub struct FailingStore;

impl Store for FailingStore {
    fn decide<'a>(&'a self, _: StoreRequest<'a>) -> Answer<'a> {
        Answer::pending(async { Err(StoreError::message("connection refused (test store)", true)) })
    }
}

/// A store that never answers.
#[derive(Debug)]
pub struct HangingStore;

impl Store for HangingStore {
    fn decide<'a>(&'a self, _: StoreRequest<'a>) -> Answer<'a> {
        Answer::pending(std::future::pending())
    }
}
