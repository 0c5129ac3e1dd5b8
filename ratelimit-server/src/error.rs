//! The errors of a decision: a request the service refuses, and a failure
//! of the service itself. Re-exported by [`crate::service`].

use std::fmt;

/// A request the service refuses (the gRPC status `INVALID_ARGUMENT`, the
/// HTTP status 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidRequest(pub String);

impl fmt::Display for InvalidRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidRequest {}

/// An error of the service itself (the gRPC status `INTERNAL`).
#[derive(Debug)]
pub enum ServiceError {
    /// The request is invalid.
    Invalid(InvalidRequest),
    /// The limiter could not be built (a bug: the quotas were validated).
    Internal(String),
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid(e) => write!(f, "{e}"),
            Self::Internal(e) => write!(f, "internal error: {e}"),
        }
    }
}

impl std::error::Error for ServiceError {}
