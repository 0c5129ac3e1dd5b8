#![doc = include_str!("../README.md")]

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
#[cfg(feature = "redis")]
pub mod tls;
#[cfg(feature = "redis")]
pub mod acl;
pub mod stall;
pub mod wrong;

pub use conformance::{Contract, StoreFactory, SuiteConfig, Violation, run_all};
