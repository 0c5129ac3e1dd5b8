#![doc = include_str!("../../README.md")]
//!
//! ## This crate
//!
//! Runnable programs for the workspace: the `demo` (traffic shapes of the
//! problem replayed against the four algorithms), the HTTP `server` (policies
//! from `--config FILE`), and the `accuracy` report (generated traffic judged
//! by the exact sliding log, and the boundary-burst picture). Their logic
//! lives in [`demo`], [`accuracy`] and [`picture`] so that it is tested, not
//! just run.

pub mod accuracy;
pub mod demo;
pub mod picture;
