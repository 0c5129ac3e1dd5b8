#![doc = include_str!("../README.md")]

pub mod config;
mod error;
mod grpc_conn;
mod grpc_unary;
pub mod http;
pub mod json;
pub mod limits;
pub mod metrics;
pub mod server;
pub mod service;
pub mod tls;
mod workers;

pub use config::{Config, ConfigError, LoadOptions};
pub use service::{Degraded, RateLimitService, Settings};
