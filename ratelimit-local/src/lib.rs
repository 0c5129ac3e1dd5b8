#![doc = include_str!("../README.md")]

mod multi;
mod store;

pub use store::DashMapStore;
