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

/// A program's parsed arguments, or how it exits: `Ok(None)` (asked for
/// `--help`) prints `usage` and exits 0; an error prints it with `usage` on
/// stderr and exits 2.
pub fn args_or_exit<T, E: std::fmt::Display>(
    parsed: Result<Option<T>, E>,
    usage: &str,
) -> Result<T, std::process::ExitCode> {
    match parsed {
        Ok(Some(args)) => Ok(args),
        Ok(None) => {
            println!("{usage}");
            Err(std::process::ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{e}\n{usage}");
            Err(std::process::ExitCode::from(2))
        }
    }
}
