//! The HTTP endpoints: `POST /json` (a `RateLimitRequest` in JSON, answered
//! 200 or 429 with the `RateLimitResponse` in JSON), `GET /healthcheck`,
//! `GET /metrics` (Prometheus) and `GET /rlconfig` (the limits in force).

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::config::algorithm_name;
use crate::json;
use crate::service::{RateLimitService, ServiceError};

/// The router of the HTTP endpoints.
pub fn router(service: Arc<RateLimitService>) -> Router {
    Router::new()
        .route("/json", post(json_endpoint))
        .route("/healthcheck", get(healthcheck))
        .route("/metrics", get(metrics_endpoint))
        .route("/rlconfig", get(rlconfig))
        .with_state(service)
}

async fn json_endpoint(State(service): State<Arc<RateLimitService>>, body: Bytes) -> Response {
    let request = match json::request_from_json(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, e).into_response(),
    };
    match service.should_rate_limit(&request).await {
        Ok(response) => {
            let status = if response.overall_code == 2 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let mut r = (status, axum::Json(json::response_to_json(&response))).into_response();
            for h in &response.response_headers_to_add {
                if let (Ok(name), Ok(value)) = (
                    axum::http::HeaderName::from_bytes(h.key.as_bytes()),
                    axum::http::HeaderValue::from_str(&h.value),
                ) {
                    r.headers_mut().insert(name, value);
                }
            }
            r
        }
        Err(ServiceError::Invalid(e)) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn healthcheck(State(service): State<Arc<RateLimitService>>) -> Response {
    if service.is_serving() {
        (StatusCode::OK, "OK").into_response()
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "NOT SERVING").into_response()
    }
}

async fn metrics_endpoint() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::metrics::render(),
    )
        .into_response()
}

async fn rlconfig(State(service): State<Arc<RateLimitService>>) -> Response {
    let config = service.config();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# backend: {}; files: {}",
        service.backend(),
        config
            .files()
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (key, l) in config.dump() {
        if l.unlimited {
            let _ = writeln!(out, "{key}: unlimited");
            continue;
        }
        let _ = writeln!(
            out,
            "{key}: unit={} requests_per_unit={}, algorithm: {}{}, shadow_mode: {}, quota_mode: {}{}",
            l.unit.map_or("UNKNOWN", |u| u.name()),
            l.requests_per_unit,
            algorithm_name(l.algorithm),
            l.burst.map(|b| format!(" (burst {b})")).unwrap_or_default(),
            l.shadow_mode,
            l.quota_mode,
            if l.name.is_empty() {
                String::new()
            } else {
                format!(", name: {}", l.name)
            }
        );
    }
    ([(header::CONTENT_TYPE, "text/plain")], out).into_response()
}
