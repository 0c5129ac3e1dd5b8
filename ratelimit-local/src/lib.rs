#![doc = include_str!("../README.md")]

mod store;

pub use store::DashMapStore;
