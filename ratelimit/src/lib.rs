#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use ratelimit_core::*;

/// The in-process store crate, `ratelimit-local` (feature `local`).
#[cfg(feature = "local")]
#[cfg_attr(docsrs, doc(cfg(feature = "local")))]
pub use ratelimit_local as local;
#[cfg(feature = "local")]
#[allow(deprecated)]
#[doc(hidden)]
pub use ratelimit_local::DashMapStore;
#[cfg(feature = "local")]
#[cfg_attr(docsrs, doc(cfg(feature = "local")))]
pub use ratelimit_local::LocalStore;

/// The single-node Redis store crate, `ratelimit-redis` (feature `redis`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use ratelimit_redis as redis;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use ratelimit_redis::{RedisStore, RedisStoreBuilder};

/// The Redis Cluster store crate, `ratelimit-cluster` (feature `cluster`).
#[cfg(feature = "cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
pub use ratelimit_cluster as cluster;
#[cfg(feature = "cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
pub use ratelimit_cluster::{ClusterStore, ClusterStoreBuilder};

/// The tower middleware crate, `ratelimit-tower` (feature `tower`).
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub use ratelimit_tower as tower;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub use ratelimit_tower::{KeyExtractor, MissingKey, RateLimitLayer};

/// Policies from TOML, YAML or JSON, `ratelimit-config` (feature `config`).
#[cfg(feature = "config")]
#[cfg_attr(docsrs, doc(cfg(feature = "config")))]
pub use ratelimit_config as config;
