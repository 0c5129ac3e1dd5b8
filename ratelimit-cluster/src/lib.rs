#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod builder;
mod connection;
#[cfg(feature = "fred")]
mod fred;
mod nodes;
mod redis_rs;
pub mod retry;
mod slots;
mod stats;
mod store;

pub use builder::{ClusterStoreBuilder, DEFAULT_CONNECTION_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT};
pub use stats::ClusterStats;
pub use store::{ClusterStore, DEFAULT_CALL_TIMEOUT};

/// The redis-rs crate this store is built on, re-exported so callers use the
/// same version for [`ClusterStore::from_cluster_connection`].
pub use redis;

/// The fred crate (feature `fred`), re-exported so callers use the same
/// version for `ClusterStore::from_fred`.
#[cfg(feature = "fred")]
pub use ::fred as fred_client;
