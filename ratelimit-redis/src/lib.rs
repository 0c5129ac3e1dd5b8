#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The setters `options` writes once link to this crate by name, from here
// and from `ratelimit-cluster` alike.
extern crate self as ratelimit_redis;

pub mod acl;
pub mod admission;
pub mod arg;
mod batch;
pub mod deadline;
mod decide;
pub mod decode;
pub mod domains;
pub mod engine;
pub mod error;
#[cfg(feature = "fred")]
pub mod fred;
#[cfg(feature = "fred")]
pub mod fred_build;
#[cfg(feature = "fred")]
mod fred_sentinel;
#[cfg(feature = "fred")]
mod fred_store;
pub mod io;
pub mod keys;
pub mod options;
pub mod scripts;
pub mod sentinel;
mod store;
pub mod telemetry;
pub mod tls;

pub use options::{DEFAULT_CONNECTION_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT};
pub use store::{DEFAULT_CALL_TIMEOUT, RedisStore, RedisStoreBuilder};

/// The redis-rs crate this store is built on, re-exported so callers use the
/// same version for [`RedisStore::from_connection_manager`].
pub use redis;

/// The fred crate (feature `fred`), re-exported so callers use the same
/// version for `RedisStore::from_fred`.
#[cfg(feature = "fred")]
pub use ::fred as fred_client;
