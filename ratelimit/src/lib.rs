// The README's examples are complete programs, each for the features its
// `cargo add` lines name: as doctests they compile where all of those are on
// (docs.rs, `--all-features`). With fewer features the crate docs are the
// short text below. Either way `examples/tests/readme_snippets.rs` builds
// each of them in a new project with exactly its features.
#![cfg_attr(
    all(
        feature = "local",
        feature = "tokio",
        feature = "redis",
        feature = "cluster",
        feature = "axum",
        feature = "config"
    ),
    doc = include_str!("../README.md")
)]
#![cfg_attr(
    not(all(
        feature = "local",
        feature = "tokio",
        feature = "redis",
        feature = "cluster",
        feature = "axum",
        feature = "config"
    )),
    doc = "Distributed rate limiting, exact at the boundary: one crate to depend on, \
           the backend chosen by cargo feature (`local`, `redis`, `fred`, `cluster`, \
           `tower`, `axum`, `config`, `metrics`, `deny-cache`). The crate's README, \
           shown here with those features on, has an example for each."
)]
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
