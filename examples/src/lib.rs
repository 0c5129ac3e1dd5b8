#![doc = include_str!("../../README.md")]
//!
//! ## This crate
//!
//! Runnable programs for the workspace: the `demo` (traffic shapes of the
//! problem replayed against the four algorithms) and the HTTP `server`. The
//! demo's logic lives in [`demo`] so that it is tested, not just run.

pub mod accuracy;
pub mod demo;
pub mod picture;
