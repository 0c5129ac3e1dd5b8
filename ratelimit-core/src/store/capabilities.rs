//! What a store can promise, reported as data.

use std::sync::Arc;

use crate::clock::Clock;

/// What a [`Store`](super::Store) promises about its answers: reported by
/// [`Store::capabilities`](super::Store::capabilities), read once when a
/// [`crate::Limiter`] is built, and checked by `ratelimit-testkit`.
///
/// The default promises nothing: not atomic across charges, not in
/// process, no clock of its own, no failure domains, no bound of its own
/// on a call, no bound reported on the callers it keeps.
///
/// ```
/// use ratelimit_core::store::Capabilities;
/// use ratelimit_core::ManualClock;
///
/// let caps = Capabilities::default()
///     .atomic(true)
///     .in_process(true)
///     .clock(ManualClock::new(0));
/// assert!(caps.is_atomic() && caps.is_in_process());
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Capabilities {
    /// Every request is decided in one atomic step, all or nothing across
    /// its charges, with respect to every other request on the same key
    /// (contract 11). A store that reports `false` still answers one
    /// decision per charge, but a denied request may have been counted by
    /// some of its quotas; the limiter warns when given several quotas.
    pub atomic: bool,
    /// The store decides in this process and its answers are always ready
    /// ([`Answer::ready`](super::Answer::ready)): the limiter then decides
    /// without a future and without an allocation. A store that reports it
    /// and still answers pending is handled (the pending answer is dropped
    /// unpolled and the request asked again on the async path), at a cost.
    pub in_process: bool,
    /// The clock the store decides by, when the application can read it
    /// (an in-process clock, or an injected one). `None`: the store's own
    /// clock, such as Redis `TIME`. The limiter stamps `X-RateLimit-Reset`
    /// with it unless given a clock explicitly.
    pub clock: Option<Arc<dyn Clock>>,
    /// The store judges the health of each of its failure domains (a Redis
    /// node, a cluster master) itself and fails fast, with
    /// [`StoreError::Unavailable`](crate::StoreError::Unavailable), for
    /// requests routed to an unhealthy one. The limiter then keeps no
    /// circuit breaker of its own, so one dead node never switches off the
    /// store for callers whose state lives on healthy ones.
    pub failure_domains: bool,
    /// Every pending answer settles by the request's
    /// [`Deadline`](super::Deadline) on its own: the store races its calls
    /// against the deadline and answers
    /// [`StoreError::Timeout`](crate::StoreError::Timeout) (or
    /// [`StoreError::Expired`](crate::StoreError::Expired)) when it passes,
    /// as the Redis stores do. The limiter then arms no timer of its own
    /// for the call. A store that reports it and lets a call hang past the
    /// deadline hangs its caller: leave it `false` unless every path is
    /// bounded.
    pub bounded: bool,
    /// The most callers the store keeps state for at once, when it keeps
    /// a bound (`None`: no bound reported). A caller under one quota counts
    /// once; a store may count a caller once per quota it has state under
    /// (`ratelimit-local`'s `LocalStore::max_callers`) or once across its
    /// quotas (the limiter's [`FallbackStore`](crate::FallbackStore)).
    ///
    /// A store that reports it promises what it does when full: a request
    /// that would track a new caller is refused with an error (the limiter
    /// answers it by its failure policy), and a tracked caller is **never
    /// forgotten to make room** (a caller over its limit would be let in
    /// again); room comes back only as tracked callers' state expires.
    /// `ratelimit-testkit` checks this for a store that reports it.
    pub max_callers: Option<usize>,
}

impl Capabilities {
    /// Sets [`Capabilities::atomic`].
    pub fn atomic(mut self, atomic: bool) -> Self {
        self.atomic = atomic;
        self
    }

    /// Sets [`Capabilities::in_process`].
    pub fn in_process(mut self, in_process: bool) -> Self {
        self.in_process = in_process;
        self
    }

    /// Sets [`Capabilities::clock`].
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Sets [`Capabilities::clock`] from a shared clock (or none).
    pub fn shared_clock(mut self, clock: Option<Arc<dyn Clock>>) -> Self {
        self.clock = clock;
        self
    }

    /// Sets [`Capabilities::failure_domains`].
    pub fn failure_domains(mut self, failure_domains: bool) -> Self {
        self.failure_domains = failure_domains;
        self
    }

    /// Sets [`Capabilities::bounded`].
    pub fn bounded(mut self, bounded: bool) -> Self {
        self.bounded = bounded;
        self
    }

    /// Sets [`Capabilities::max_callers`].
    pub fn max_callers(mut self, max_callers: Option<usize>) -> Self {
        self.max_callers = max_callers;
        self
    }

    /// Whether every pending answer settles by the request's deadline.
    pub fn is_bounded(&self) -> bool {
        self.bounded
    }

    /// Whether requests are decided atomically across their charges.
    pub fn is_atomic(&self) -> bool {
        self.atomic
    }

    /// Whether answers are always ready.
    pub fn is_in_process(&self) -> bool {
        self.in_process
    }
}
