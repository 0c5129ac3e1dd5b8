//! What a store is asked: a caller's key, one or more charges, a deadline.

use std::time::{Duration, Instant};

use crate::error::StoreError;
use crate::model::Charge;

/// When the caller stops waiting for an answer.
///
/// A store must not count a request it carries out after its deadline: it
/// answers [`StoreError::Expired`] instead and writes nothing. A store that
/// cannot take a request back once sent (a network store) carries the
/// deadline with the request (the shipped Redis stores send it in the
/// server's clock, and their scripts return "expired" without writing once
/// it has passed).
///
/// Three forms: no deadline; a deadline relative to the moment the store
/// receives the request ([`Deadline::within`]: what the
/// [`crate::Limiter`] passes, its timeout, read only by stores that need
/// an instant, so an in-process store pays no clock read for it); and an
/// absolute instant ([`Deadline::at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Deadline(Repr);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
enum Repr {
    #[default]
    None,
    Within(Duration),
    At(Instant),
}

impl Deadline {
    /// No deadline: the caller waits as long as the store takes.
    pub const NONE: Self = Self(Repr::None);

    /// `timeout` after the store receives the request.
    pub const fn within(timeout: Duration) -> Self {
        Self(Repr::Within(timeout))
    }

    /// At `instant`.
    pub const fn at(instant: Instant) -> Self {
        Self(Repr::At(instant))
    }

    /// Whether there is no deadline.
    pub const fn is_none(&self) -> bool {
        matches!(self.0, Repr::None)
    }

    /// The deadline as an instant, reading the clock for a relative one
    /// (call it once, when the request is received). `None`: no deadline.
    pub fn instant(&self) -> Option<Instant> {
        match self.0 {
            Repr::None => None,
            Repr::Within(d) => Some(Instant::now() + d),
            Repr::At(i) => Some(i),
        }
    }

    /// The deadline as an instant, a relative one counted from `now` (the
    /// instant the request was received, read once by the caller for this
    /// and its own use). `None`: no deadline.
    pub fn instant_from(&self, now: Instant) -> Option<Instant> {
        match self.0 {
            Repr::None => None,
            Repr::Within(d) => Some(now + d),
            Repr::At(i) => Some(i),
        }
    }

    /// Whether the deadline has passed already, as the store receives the
    /// request (a relative deadline has passed only if it is zero; no clock
    /// is read for it).
    #[inline]
    pub fn has_passed(&self) -> bool {
        match self.0 {
            Repr::None => false,
            // `d.is_zero()`, in one test.
            Repr::Within(d) => d.as_secs() | u64::from(d.subsec_nanos()) == 0,
            Repr::At(i) => i <= Instant::now(),
        }
    }
}

/// One request to a store: decide for `key` under every charge, all or
/// nothing, before `deadline`.
///
/// A single-quota check is a request with one charge.
///
/// ```
/// use ratelimit_core::store::{Deadline, Request};
/// use ratelimit_core::{Charge, Quota, Rate};
/// use std::time::Duration;
///
/// let quota = Quota::token_bucket(Rate::per_minute(100), 20)?;
/// let charges = [Charge::new(&quota, 1)];
/// let request = Request::new(b"api~customer-42", &charges)
///     .with_deadline(Deadline::within(Duration::from_millis(20)));
/// assert_eq!(request.charges.len(), 1);
/// # Ok::<(), ratelimit_core::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Request<'a> {
    /// The caller's key (arbitrary bytes; the limiter prefixes its
    /// namespace).
    pub key: &'a [u8],
    /// What the call costs under each quota, in order; at least one. No two
    /// charges may name the same quota (name and algorithm).
    pub charges: &'a [Charge<'a>],
    /// When the caller stops waiting.
    pub deadline: Deadline,
}

impl<'a> Request<'a> {
    /// A request for `key` under `charges`, with no deadline.
    pub const fn new(key: &'a [u8], charges: &'a [Charge<'a>]) -> Self {
        Self {
            key,
            charges,
            deadline: Deadline::NONE,
        }
    }

    /// The same request with `deadline`.
    pub const fn with_deadline(mut self, deadline: Deadline) -> Self {
        self.deadline = deadline;
        self
    }

    /// Checks what every store must refuse before deciding anything: no
    /// charge, a cost that can never be admitted ([`StoreError::Cost`]),
    /// or two charges for the same quota name and algorithm (they would
    /// share one state). Stores call it first; it reads no clock.
    pub fn check(&self) -> Result<(), StoreError> {
        match self.charges {
            [] => Err(StoreError::InvalidRequest(
                "a request needs at least one charge".to_owned(),
            )),
            [c] => c.quota.check_cost(c.cost).map_err(StoreError::from),
            charges => {
                for (i, c) in charges.iter().enumerate() {
                    c.quota.check_cost(c.cost)?;
                    if charges[..i].iter().any(|b| {
                        b.quota.name() == c.quota.name() && b.quota.kind() == c.quota.kind()
                    }) {
                        return Err(StoreError::InvalidRequest(format!(
                            "two charges for policy {:?} ({}) in one request: they would share one \
                             state; give each quota its own name",
                            c.quota.name(),
                            c.quota.kind()
                        )));
                    }
                }
                Ok(())
            }
        }
    }

    /// [`Request::check`], then [`StoreError::Expired`] if the deadline has
    /// already passed: what an in-process store checks before it decides.
    #[inline]
    pub fn check_in_time(&self) -> Result<(), StoreError> {
        self.check()?;
        if self.deadline.has_passed() {
            return Err(StoreError::Expired);
        }
        Ok(())
    }
}
