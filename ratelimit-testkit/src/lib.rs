#![doc = include_str!("../README.md")]

#[cfg(feature = "redis")]
pub mod acl;
pub mod conformance;
pub mod controls;
#[cfg(feature = "redis")]
pub mod proxy;
#[cfg(feature = "redis-cluster")]
pub mod redis_cluster;
#[cfg(feature = "redis")]
pub mod redis_server;
#[cfg(feature = "redis")]
pub mod sentinel;
#[cfg(feature = "redis")]
pub mod server_process;
pub mod stall;
#[cfg(feature = "redis")]
pub mod tls;
pub mod wrong;

pub use conformance::{Contract, StoreFactory, SuiteConfig, Violation, run_all};
