#![doc = include_str!("../README.md")]

mod clock;
mod multi;
mod shards;
mod store;

pub use clock::FastClock;
pub use store::DashMapStore;
