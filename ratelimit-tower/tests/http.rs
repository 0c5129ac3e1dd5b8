//! The layer in a real axum server on loopback, driven by a real HTTP/1.1
//! client, with time moved only by a shared `ManualClock`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use common::*;
use http::{HeaderName, HeaderValue, StatusCode};
use ratelimit_core::{ManualClock, Store};
use ratelimit_local::LocalStore;
use ratelimit_tower::{
    AMBIGUOUS_KEY_TYPE, COST_TOO_HIGH_TYPE, Cost, FailurePolicy, INVALID_KEY_TYPE,
    KEY_TOO_LONG_TYPE, KeyExtractor, Limiter, MAX_KEY_LEN, MISSING_KEY_TYPE, MissingKey, Policies,
    QUOTA_EXCEEDED_TYPE, Quota, Rate, RateLimitInfo, RateLimitLayer, UNAVAILABLE_TYPE,
};

const API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// "100 per minute, burst 20".
fn plan() -> Quota {
    Quota::token_bucket(Rate::per_minute(100), 20)
        .unwrap()
        .named("api")
        .unwrap()
}

fn limiter(
    store: impl Store + 'static,
    clock: &ManualClock,
    quota: Quota,
    policy: FailurePolicy,
) -> Limiter {
    Limiter::builder(store)
        .quota(quota)
        .namespace("http-test")
        .unwrap()
        .failure_policy(policy)
        .timeout(Duration::from_millis(20))
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// A router whose every path answers 200 with the caller key the layer
/// saw, counting calls.
fn app(layer: RateLimitLayer) -> (Router, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = Arc::clone(&hits);
    let router = Router::new()
        .fallback(move |req: Request| {
            let h = Arc::clone(&h);
            async move {
                h.fetch_add(1, Ordering::SeqCst);
                req.extensions()
                    .get::<RateLimitInfo>()
                    .map(|i| format!("{} {}", i.policy, i.key))
                    .unwrap_or_else(|| "unlimited".to_owned())
            }
        })
        .layer(layer);
    (router, hits)
}

async fn api_server(clock: &ManualClock) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let store = LocalStore::with_clock(clock.clone());
    let layer = RateLimitLayer::new(limiter(store, clock, plan(), FailurePolicy::FailOpen))
        .key(KeyExtractor::header(API_KEY))
        .on_missing_key(MissingKey::unauthorized_api_key(&API_KEY));
    let (router, hits) = app(layer);
    (serve(router).await, hits)
}

#[tokio::test]
async fn allowed_responses_carry_every_header() {
    let clock = ManualClock::new(T0);
    let (addr, hits) = api_server(&clock).await;

    let r = get(addr, "/things", &[("x-api-key", "alice")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "api key:alice");
    assert_eq!(
        r.rate_limit_fields(),
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "ratelimit-policy",
            "ratelimit"
        ]
    );
    assert_eq!(r.int("x-ratelimit-limit"), Some(20));
    assert_eq!(r.int("x-ratelimit-remaining"), Some(19));
    // One token used: full again 0.6 s from now, which rounds up to T0 + 1.
    assert_eq!(r.int("x-ratelimit-reset"), Some(T0_SECS as i64 + 1));
    // 20 tokens refill in 12 s.
    assert_eq!(
        sf_policies(r.header("ratelimit-policy").unwrap()),
        policy("api", &[("q", 20), ("w", 12)])
    );
    assert_eq!(
        sf_policies(r.header("ratelimit").unwrap()),
        policy("api", &[("r", 19), ("t", 1)])
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);

    // The reset follows the clock, not the wall.
    clock.advance(Duration::from_secs(1000));
    let r = get(addr, "/things", &[("x-api-key", "alice")]).await;
    assert_eq!(r.int("x-ratelimit-remaining"), Some(19));
    assert_eq!(r.int("x-ratelimit-reset"), Some(T0_SECS as i64 + 1001));
}

#[tokio::test]
async fn burst_then_429_with_every_header_and_body_and_no_inner_call() {
    let clock = ManualClock::new(T0);
    let (addr, hits) = api_server(&clock).await;

    for i in 0..20 {
        let r = get(addr, "/", &[("x-api-key", "bob")]).await;
        assert_eq!(r.status, StatusCode::OK, "request {i} of the burst");
        assert_eq!(r.int("x-ratelimit-remaining"), Some(19 - i));
    }
    assert_eq!(hits.load(Ordering::SeqCst), 20);

    let r = get(addr, "/", &[("x-api-key", "bob")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        hits.load(Ordering::SeqCst),
        20,
        "the inner service was called"
    );
    assert_eq!(
        r.rate_limit_fields(),
        [
            "retry-after",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "ratelimit-policy",
            "ratelimit"
        ]
    );
    // The next token comes in exactly 0.6 s: delay-seconds rounded up.
    assert_eq!(r.int("retry-after"), Some(1));
    assert_eq!(r.int("x-ratelimit-limit"), Some(20));
    assert_eq!(r.int("x-ratelimit-remaining"), Some(0));
    assert_eq!(r.int("x-ratelimit-reset"), Some(T0_SECS as i64 + 12));
    assert_eq!(
        sf_policies(r.header("ratelimit-policy").unwrap()),
        policy("api", &[("q", 20), ("w", 12)])
    );
    assert_eq!(
        sf_policies(r.header("ratelimit").unwrap()),
        policy("api", &[("r", 0), ("t", 12)])
    );
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(
        r.json(),
        serde_json::json!({
            "type": QUOTA_EXCEEDED_TYPE,
            "title": "Too Many Requests",
            "status": 429,
            "detail": "quota \"api\" of 20 is exhausted for this caller; retry after 1 s",
            "violated-policies": ["api"],
        })
    );

    // Another caller is untouched.
    let r = get(addr, "/", &[("x-api-key", "carol")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.int("x-ratelimit-remaining"), Some(19));

    // Exactly 0.6 s later (not a microsecond earlier) bob has a token again.
    clock.advance(Duration::from_micros(599_999));
    let r = get(addr, "/", &[("x-api-key", "bob")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.int("retry-after"), Some(1));
    clock.advance(Duration::from_micros(1));
    let r = get(addr, "/", &[("x-api-key", "bob")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.int("x-ratelimit-remaining"), Some(0));
    assert_eq!(hits.load(Ordering::SeqCst), 22);
}

/// A login guarded by a sliding log per client IP: `Retry-After` is
/// honoured to the second, and one second earlier is still too early.
#[tokio::test]
async fn retry_after_is_exact_to_the_second_on_a_sliding_log() {
    let clock = ManualClock::new(T0);
    let login = Quota::sliding_log(Rate::new(5, Duration::from_secs(900)))
        .unwrap()
        .named("login")
        .unwrap();
    let store = LocalStore::with_clock(clock.clone());
    let layer = RateLimitLayer::new(limiter(store, &clock, login, FailurePolicy::FailClosed))
        .key(KeyExtractor::client_ip());
    let (router, hits) = app(layer);
    let addr = serve(router).await;

    // Five attempts 1.5 s apart; the first leaves the window at T0 + 900 s.
    for i in 0..5 {
        let r = send(addr, "POST", "/login", &[]).await;
        assert_eq!(r.status, StatusCode::OK, "attempt {i}");
        assert_eq!(r.text(), "login ip:127.0.0.1");
        clock.advance(Duration::from_millis(1500));
    }
    // Now T0 + 7.5 s: the oldest entry leaves in 892.5 s -> Retry-After 893.
    let r = send(addr, "POST", "/login", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.int("retry-after"), Some(893));
    assert_eq!(r.int("x-ratelimit-limit"), Some(5));
    assert_eq!(r.int("x-ratelimit-remaining"), Some(0));
    // The newest entry (T0 + 6 s) leaves at T0 + 906 s.
    assert_eq!(r.int("x-ratelimit-reset"), Some(T0_SECS as i64 + 906));
    assert_eq!(
        sf_policies(r.header("ratelimit-policy").unwrap()),
        policy("login", &[("q", 5), ("w", 900)])
    );
    assert_eq!(
        sf_policies(r.header("ratelimit").unwrap()),
        policy("login", &[("r", 0), ("t", 899)])
    );
    assert_eq!(r.json()["violated-policies"], serde_json::json!(["login"]));
    assert_eq!(hits.load(Ordering::SeqCst), 5);

    // One second before Retry-After: still denied.
    clock.advance(Duration::from_secs(892));
    let r = send(addr, "POST", "/login", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.int("retry-after"), Some(1));
    // At Retry-After: admitted.
    clock.advance(Duration::from_secs(1));
    let r = send(addr, "POST", "/login", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.int("x-ratelimit-remaining"), Some(0));
    assert_eq!(hits.load(Ordering::SeqCst), 6);
}

#[tokio::test]
async fn missing_key_is_401_with_a_challenge_and_never_reaches_the_service() {
    let clock = ManualClock::new(T0);
    let (addr, hits) = api_server(&clock).await;

    for headers in [&[][..], &[("x-api-key", "")][..]] {
        let r = get(addr, "/", headers).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            r.header("www-authenticate"),
            Some("ApiKey header=\"x-api-key\"")
        );
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert!(r.rate_limit_fields().is_empty());
        let body = r.json();
        assert_eq!(body["type"], MISSING_KEY_TYPE);
        assert_eq!(body["status"], 401);
        assert_eq!(body["title"], "Unauthorized");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("header(x-api-key)")
        );
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

/// Asserts a problem+json answer of `status` and `type` that counted
/// nothing and carries no rate-limit field; returns its detail.
fn assert_key_rejected(r: &Reply, status: StatusCode, problem: &str) -> String {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(r.rate_limit_fields().is_empty(), "{:?}", r.headers);
    assert!(r.header("www-authenticate").is_none());
    let body = r.json();
    assert_eq!(body["type"], problem);
    assert_eq!(body["status"], status.as_u16());
    assert_eq!(body["title"], status.canonical_reason().unwrap());
    body["detail"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_key_longer_than_the_maximum_is_431_not_a_missing_key() {
    let clock = ManualClock::new(T0);
    let (addr, hits) = api_server(&clock).await;

    let too_long = "k".repeat(MAX_KEY_LEN + 1);
    let r = get(addr, "/", &[("x-api-key", &too_long)]).await;
    let detail = assert_key_rejected(
        &r,
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        KEY_TOO_LONG_TYPE,
    );
    assert_eq!(
        detail,
        "the caller key in header x-api-key is 257 bytes long; at most 256 bytes are accepted \
         (rate-limit caller key, looked for: header(x-api-key))"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 0);

    // The longest accepted key is a fresh caller, like any other.
    let longest = "k".repeat(MAX_KEY_LEN);
    let r = get(addr, "/", &[("x-api-key", &longest)]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.int("x-ratelimit-remaining"), Some(19));
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn two_key_headers_are_400_ambiguous_never_the_first() {
    let clock = ManualClock::new(T0);
    let (addr, hits) = api_server(&clock).await;

    for (a, b) in [("alice", "bob"), ("alice", "alice"), ("alice", "")] {
        let headers = [
            ("x-api-key", HeaderValue::from_static(a)),
            ("x-api-key", HeaderValue::from_static(b)),
        ];
        let r = send_raw(addr, "GET", "/", &headers).await;
        let detail = assert_key_rejected(&r, StatusCode::BAD_REQUEST, AMBIGUOUS_KEY_TYPE);
        assert!(
            detail.starts_with("ambiguous caller key: header x-api-key is sent more than once"),
            "{detail}"
        );
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    // None of them was counted against alice.
    let r = get(addr, "/", &[("x-api-key", "alice")]).await;
    assert_eq!(r.int("x-ratelimit-remaining"), Some(19));
}

#[tokio::test]
async fn a_key_with_bytes_outside_visible_ascii_is_400_invalid() {
    let clock = ManualClock::new(T0);
    let (addr, hits) = api_server(&clock).await;

    let headers = [("x-api-key", HeaderValue::from_bytes(b"caf\xe9").unwrap())];
    let r = send_raw(addr, "GET", "/", &headers).await;
    let detail = assert_key_rejected(&r, StatusCode::BAD_REQUEST, INVALID_KEY_TYPE);
    assert!(
        detail.starts_with(
            "the caller key in header x-api-key contains bytes other than visible ASCII"
        ),
        "{detail}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn missing_too_long_ambiguous_and_invalid_keys_answer_differently() {
    let clock = ManualClock::new(T0);
    let (addr, _) = api_server(&clock).await;
    let missing = get(addr, "/", &[]).await;
    let too_long = get(addr, "/", &[("x-api-key", &"k".repeat(MAX_KEY_LEN + 1))]).await;
    let twice = [
        ("x-api-key", HeaderValue::from_static("a")),
        ("x-api-key", HeaderValue::from_static("b")),
    ];
    let ambiguous = send_raw(addr, "GET", "/", &twice).await;
    let bytes = [("x-api-key", HeaderValue::from_bytes(b"\xff").unwrap())];
    let invalid = send_raw(addr, "GET", "/", &bytes).await;
    let answers: Vec<(u16, String)> = [missing, too_long, ambiguous, invalid]
        .iter()
        .map(|r| {
            (
                r.status.as_u16(),
                r.json()["type"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        answers,
        [
            (401, MISSING_KEY_TYPE.to_owned()),
            (431, KEY_TOO_LONG_TYPE.to_owned()),
            (400, AMBIGUOUS_KEY_TYPE.to_owned()),
            (400, INVALID_KEY_TYPE.to_owned()),
        ]
    );
}

#[tokio::test]
async fn an_unusable_key_never_falls_back_to_the_client_ip_or_the_anonymous_bucket() {
    for missing in [MissingKey::BadRequest, MissingKey::anonymous()] {
        let clock = ManualClock::new(T0);
        let store = LocalStore::with_clock(clock.clone());
        let layer = RateLimitLayer::new(limiter(store, &clock, plan(), FailurePolicy::FailOpen))
            .key(KeyExtractor::header(API_KEY).or(KeyExtractor::client_ip()))
            .on_missing_key(missing.clone());
        let (router, hits) = app(layer);
        let addr = serve(router).await;

        let too_long = get(addr, "/", &[("x-api-key", &"k".repeat(MAX_KEY_LEN + 1))]).await;
        assert_key_rejected(
            &too_long,
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            KEY_TOO_LONG_TYPE,
        );
        let twice = [
            ("x-api-key", HeaderValue::from_static("a")),
            ("x-api-key", HeaderValue::from_static("b")),
        ];
        let r = send_raw(addr, "GET", "/", &twice).await;
        assert_key_rejected(&r, StatusCode::BAD_REQUEST, AMBIGUOUS_KEY_TYPE);
        assert_eq!(hits.load(Ordering::SeqCst), 0, "{missing:?}");

        // Without a key the caller is its address, whose bucket is untouched.
        let r = get(addr, "/", &[]).await;
        assert_eq!(r.status, StatusCode::OK, "{missing:?}");
        assert_eq!(r.text(), "api ip:127.0.0.1");
        assert_eq!(r.int("x-ratelimit-remaining"), Some(19), "{missing:?}");
    }
}

#[tokio::test]
async fn missing_key_default_is_400() {
    let clock = ManualClock::new(T0);
    let store = LocalStore::with_clock(clock.clone());
    let layer = RateLimitLayer::new(limiter(store, &clock, plan(), FailurePolicy::FailOpen))
        .key(KeyExtractor::header(API_KEY));
    let (router, hits) = app(layer);
    let addr = serve(router).await;
    let r = get(addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["type"], MISSING_KEY_TYPE);
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn missing_key_can_share_an_anonymous_bucket() {
    let clock = ManualClock::new(T0);
    let store = LocalStore::with_clock(clock.clone());
    let tiny = Quota::fixed_window(Rate::per_minute(2))
        .unwrap()
        .named("anon")
        .unwrap();
    let layer = RateLimitLayer::new(limiter(store, &clock, tiny, FailurePolicy::FailOpen))
        .key(KeyExtractor::header(API_KEY))
        .on_missing_key(MissingKey::anonymous());
    let (router, hits) = app(layer);
    let addr = serve(router).await;

    let r = get(addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "anon anonymous");
    assert_eq!(get(addr, "/", &[]).await.status, StatusCode::OK);
    let r = get(addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json()["violated-policies"], serde_json::json!(["anon"]));
    // A caller with a key has its own bucket.
    assert_eq!(
        get(addr, "/", &[("x-api-key", "k")]).await.status,
        StatusCode::OK
    );
    assert_eq!(hits.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn plans_and_routes_have_their_own_quotas() {
    let clock = ManualClock::new(T0);
    let free = Quota::token_bucket(Rate::per_minute(10), 1)
        .unwrap()
        .named("free")
        .unwrap();
    let pro = Quota::token_bucket(Rate::per_minute(100), 3)
        .unwrap()
        .named("pro")
        .unwrap();
    let search = Quota::sliding_window(Rate::per_minute(2))
        .unwrap()
        .named("search")
        .unwrap();
    let policies = Policies::new()
        .select(move |parts| (parts.headers.get("x-plan")? == "pro").then(|| pro.clone()))
        .route("/search", search)
        .route(
            "/health",
            Quota::fixed_window(Rate::per_second(1000)).unwrap(),
        )
        .default_quota(free.clone());
    let store = LocalStore::with_clock(clock.clone());
    let layer = RateLimitLayer::new(limiter(store, &clock, free, FailurePolicy::FailOpen))
        .key(KeyExtractor::header(API_KEY))
        .policies(policies);
    let (router, _hits) = app(layer);
    let addr = serve(router).await;

    // Free plan: burst 1.
    let r = get(addr, "/items", &[("x-api-key", "u1")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "free key:u1");
    assert_eq!(
        sf_policies(r.header("ratelimit-policy").unwrap()),
        policy("free", &[("q", 1), ("w", 6)])
    );
    let r = get(addr, "/items", &[("x-api-key", "u1")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json()["violated-policies"], serde_json::json!(["free"]));
    assert_eq!(r.int("retry-after"), Some(6));

    // The search route has its own quota and state for the same caller.
    for remaining in [1, 0] {
        let r = get(addr, "/search/q", &[("x-api-key", "u1")]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.text(), "search key:u1");
        assert_eq!(r.int("x-ratelimit-remaining"), Some(remaining));
        assert_eq!(
            sf_policies(r.header("ratelimit-policy").unwrap()),
            policy("search", &[("q", 2), ("w", 60)])
        );
    }
    let r = get(addr, "/search", &[("x-api-key", "u1")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json()["violated-policies"], serde_json::json!(["search"]));

    // The pro plan (chosen by the selector, before routes): burst 3.
    for remaining in [2, 1, 0] {
        let r = get(addr, "/search", &[("x-api-key", "u2"), ("x-plan", "pro")]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.text(), "pro key:u2");
        assert_eq!(r.int("x-ratelimit-limit"), Some(3));
        assert_eq!(r.int("x-ratelimit-remaining"), Some(remaining));
    }
    let r = get(addr, "/items", &[("x-api-key", "u2"), ("x-plan", "pro")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json()["violated-policies"], serde_json::json!(["pro"]));
}

#[tokio::test]
async fn cost_is_weighed_and_impossible_or_free_costs_are_handled() {
    let clock = ManualClock::new(T0);
    let store = LocalStore::with_clock(clock.clone());
    let layer = RateLimitLayer::new(limiter(store, &clock, plan(), FailurePolicy::FailOpen))
        .key(KeyExtractor::header(API_KEY))
        .cost(Cost::from_fn(|parts| {
            parts
                .headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        }));
    let (router, hits) = app(layer);
    let addr = serve(router).await;

    let r = get(addr, "/", &[("x-api-key", "w"), ("x-cost", "5")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.int("x-ratelimit-remaining"), Some(15));

    let r = get(addr, "/", &[("x-api-key", "w"), ("x-cost", "21")]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["type"], COST_TOO_HIGH_TYPE);
    assert!(r.header("retry-after").is_none());

    let r = get(addr, "/", &[("x-api-key", "w"), ("x-cost", "0")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.rate_limit_fields().is_empty());
    assert_eq!(r.text(), "unlimited");
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}

/// Fail-open: the request goes through, and the response carries only what
/// configuration knows (the limit and the policy), nothing about a state the
/// store never reported.
#[tokio::test]
async fn failing_store_fail_open_admits_and_invents_nothing() {
    for store in [
        Box::new(FailingStore) as Box<dyn Store>,
        Box::new(HangingStore),
    ] {
        let clock = ManualClock::new(T0);
        let lim = limiter(store, &clock, plan(), FailurePolicy::FailOpen);
        let layer = RateLimitLayer::new(lim.clone()).key(KeyExtractor::header(API_KEY));
        let (router, hits) = app(layer);
        let addr = serve(router).await;
        for _ in 0..25 {
            let r = get(addr, "/", &[("x-api-key", "k")]).await;
            assert_eq!(r.status, StatusCode::OK);
            assert_eq!(
                r.rate_limit_fields(),
                ["x-ratelimit-limit", "ratelimit-policy"]
            );
            assert_eq!(r.int("x-ratelimit-limit"), Some(20));
            assert_eq!(
                sf_policies(r.header("ratelimit-policy").unwrap()),
                policy("api", &[("q", 20), ("w", 12)])
            );
        }
        assert_eq!(hits.load(Ordering::SeqCst), 25);
        assert_eq!(lim.stats().fail_open, 25);
    }
}

/// Fail-closed: 503 (the client exceeded nothing), no invented Retry-After
/// or Remaining, and the inner service is not called.
#[tokio::test]
async fn failing_store_fail_closed_is_503_and_invents_nothing() {
    for store in [
        Box::new(FailingStore) as Box<dyn Store>,
        Box::new(HangingStore),
    ] {
        let clock = ManualClock::new(T0);
        let lim = limiter(store, &clock, plan(), FailurePolicy::FailClosed);
        let layer = RateLimitLayer::new(lim.clone()).key(KeyExtractor::header(API_KEY));
        let (router, hits) = app(layer);
        let addr = serve(router).await;
        let r = get(addr, "/", &[("x-api-key", "k")]).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            r.rate_limit_fields(),
            ["x-ratelimit-limit", "ratelimit-policy"]
        );
        assert_eq!(r.int("x-ratelimit-limit"), Some(20));
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        let body = r.json();
        assert_eq!(body["type"], UNAVAILABLE_TYPE);
        assert_eq!(body["status"], 503);
        assert_eq!(body["title"], "Service Unavailable");
        assert!(body.get("violated-policies").is_none());
        assert_eq!(hits.load(Ordering::SeqCst), 0);
        assert_eq!(lim.stats().fail_closed, 1);
    }
}

#[tokio::test]
async fn unmatched_requests_pass_untouched() {
    let clock = ManualClock::new(T0);
    let store = LocalStore::with_clock(clock.clone());
    let only_api = Policies::new().route("/api", plan());
    let layer = RateLimitLayer::new(limiter(store, &clock, plan(), FailurePolicy::FailOpen))
        .key(KeyExtractor::header(API_KEY))
        .on_missing_key(MissingKey::BadRequest)
        .policies(only_api);
    let (router, hits) = app(layer);
    let addr = serve(router).await;
    // No quota applies: no key needed, no headers.
    let r = get(addr, "/static/app.js", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.rate_limit_fields().is_empty());
    let r = get(addr, "/api/x", &[("x-api-key", "a")]).await;
    assert_eq!(r.int("x-ratelimit-remaining"), Some(19));
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}
