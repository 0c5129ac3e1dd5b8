//! Input limits: what one request may carry. Each has a default and a
//! flag; a request beyond one is refused with `INVALID_ARGUMENT` (HTTP
//! 400) naming the limit, its flag and the request's value, and the server
//! keeps serving.
//!
//! | limit | default | flag |
//! |---|---|---|
//! | descriptors per request | 64 | `--max-descriptors` |
//! | entries per descriptor | 32 | `--max-entries` |
//! | length of an entry's key, bytes | 256 | `--max-key-len` |
//! | length of an entry's value, bytes | 1,024 | `--max-value-len` |
//! | size of a request, bytes (protobuf encoding) | 65,536 | `--max-message-bytes` |
//! | `hits_addend` (the request's or a descriptor's) | 1,000,000 | `--max-hits-addend` |
//!
//! A gRPC message larger than 4 MiB (or `--max-message-bytes`, if larger)
//! is refused by gRPC itself before it is decoded (`RESOURCE_EXHAUSTED`),
//! and an HTTP body larger than that with 413: neither is read into
//! memory whole.
//!
//! The keys the store writes stay bounded whatever the values' length: a
//! caller longer than 128 escaped bytes is hashed into its key (see
//! `ratelimit_redis::keys`).
//!
//! The limits are the process's ([`set`]), read by every request
//! ([`check`], called first in `RateLimitService::decide`).

use std::sync::RwLock;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message as _;

use crate::error::InvalidRequest;

/// What one request may carry. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputLimits {
    /// Descriptors per request.
    pub max_descriptors: usize,
    /// Entries per descriptor.
    pub max_entries: usize,
    /// Bytes of an entry's key.
    pub max_key_len: usize,
    /// Bytes of an entry's value.
    pub max_value_len: usize,
    /// Bytes of a whole request (its protobuf encoding).
    pub max_message_bytes: usize,
    /// The largest `hits_addend`.
    pub max_hits_addend: u64,
}

impl InputLimits {
    /// The defaults (see the module docs).
    pub const DEFAULT: Self = Self {
        max_descriptors: 64,
        max_entries: 32,
        max_key_len: 256,
        max_value_len: 1024,
        max_message_bytes: 64 * 1024,
        max_hits_addend: 1_000_000,
    };

    /// The size beyond which gRPC and HTTP refuse a message before
    /// decoding it: 4 MiB, or [`InputLimits::max_message_bytes`] if
    /// larger.
    pub fn transport_limit(&self) -> usize {
        self.max_message_bytes.max(4 * 1024 * 1024)
    }

    /// Checks `request` against these limits: the first one exceeded,
    /// named with its flag and the request's value.
    pub fn check(&self, request: &RateLimitRequest) -> Result<(), InvalidRequest> {
        let over = |what: &str, value: usize, limit: usize, flag: &str| {
            Err(InvalidRequest(format!(
                "{what} is {value}, over the limit of {limit} ({flag})"
            )))
        };
        let n = request.descriptors.len();
        if n > self.max_descriptors {
            return over(
                "the number of descriptors",
                n,
                self.max_descriptors,
                "--max-descriptors",
            );
        }
        if u64::from(request.hits_addend) > self.max_hits_addend {
            return Err(InvalidRequest(format!(
                "hits_addend is {}, over the limit of {} (--max-hits-addend)",
                request.hits_addend, self.max_hits_addend
            )));
        }
        for (i, d) in request.descriptors.iter().enumerate() {
            if d.entries.len() > self.max_entries {
                return over(
                    &format!("descriptor {i}'s number of entries"),
                    d.entries.len(),
                    self.max_entries,
                    "--max-entries",
                );
            }
            if let Some(h) = &d.hits_addend
                && h.value > self.max_hits_addend
            {
                return Err(InvalidRequest(format!(
                    "descriptor {i}'s hits_addend is {}, over the limit of {} (--max-hits-addend)",
                    h.value, self.max_hits_addend
                )));
            }
            for (j, e) in d.entries.iter().enumerate() {
                if e.key.len() > self.max_key_len {
                    return over(
                        &format!("the length of descriptor {i}'s entry {j}'s key"),
                        e.key.len(),
                        self.max_key_len,
                        "--max-key-len",
                    );
                }
                if e.value.len() > self.max_value_len {
                    return over(
                        &format!("the length of descriptor {i}'s entry {j}'s value"),
                        e.value.len(),
                        self.max_value_len,
                        "--max-value-len",
                    );
                }
            }
        }
        let size = request.encoded_len();
        if size > self.max_message_bytes {
            return over(
                "the request's size in bytes",
                size,
                self.max_message_bytes,
                "--max-message-bytes",
            );
        }
        Ok(())
    }
}

impl Default for InputLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

static LIMITS: RwLock<InputLimits> = RwLock::new(InputLimits::DEFAULT);

/// Sets the process's limits (the flags, at start).
pub fn set(limits: InputLimits) {
    *LIMITS.write().unwrap_or_else(|p| p.into_inner()) = limits;
}

/// The process's limits.
pub fn current() -> InputLimits {
    *LIMITS.read().unwrap_or_else(|p| p.into_inner())
}

/// Checks `request` against the process's limits.
pub fn check(request: &RateLimitRequest) -> Result<(), InvalidRequest> {
    current().check(request)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    fn request(descriptors: usize, entries: usize, key: usize, value: usize) -> RateLimitRequest {
        RateLimitRequest {
            domain: "d".into(),
            descriptors: (0..descriptors)
                .map(|_| RateLimitDescriptor {
                    entries: (0..entries)
                        .map(|_| Entry {
                            key: "k".repeat(key),
                            value: "v".repeat(value),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }

    #[test]
    fn each_limit_is_named_with_its_flag_and_the_value() {
        let l = InputLimits::DEFAULT;
        assert!(l.check(&request(64, 2, 256, 16)).is_ok());
        assert!(l.check(&request(1, 32, 256, 1024)).is_ok());
        let e = l.check(&request(65, 1, 1, 1)).unwrap_err().0;
        assert!(e.contains("65") && e.contains("--max-descriptors"), "{e}");
        let e = l.check(&request(1, 33, 1, 1)).unwrap_err().0;
        assert!(e.contains("33") && e.contains("--max-entries"), "{e}");
        let e = l.check(&request(1, 1, 257, 1)).unwrap_err().0;
        assert!(e.contains("257") && e.contains("--max-key-len"), "{e}");
        let e = l.check(&request(1, 1, 1, 1_000_000)).unwrap_err().0;
        assert!(
            e.contains("1000000") && e.contains("--max-value-len"),
            "{e}"
        );
        let mut r = request(1, 1, 1, 1);
        r.hits_addend = 2_000_000;
        let e = l.check(&r).unwrap_err().0;
        assert!(
            e.contains("2000000") && e.contains("--max-hits-addend"),
            "{e}"
        );
        let big = InputLimits {
            max_value_len: usize::MAX,
            ..l
        };
        let e = big.check(&request(2, 1, 1, 40_000)).unwrap_err().0;
        assert!(e.contains("--max-message-bytes"), "{e}");
    }
}
