#![doc = include_str!("../README.md")]

mod cas;
mod clock;
mod decide;
mod many;
mod packed;
mod shards;
mod store;
mod stored_key;
mod sweep;

pub use clock::FastClock;
pub use store::LocalStore;

/// The store's name from when its maps were `dashmap::DashMap`s.
#[deprecated(
    since = "0.1.0",
    note = "renamed `LocalStore`: its maps are no longer a `dashmap::DashMap`"
)]
pub type DashMapStore = LocalStore;
