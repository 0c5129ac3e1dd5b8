//! The store trait: one door. A store answers one [`Request`] (a caller's
//! key, one or more charges, a deadline) with one decision per charge, all
//! or nothing, ready now or through a future.

mod answer;
mod capabilities;
mod request;

use std::future::Future;
use std::sync::Arc;

pub use answer::{Answer, Decisions, Pending};
pub use capabilities::Capabilities;
pub use request::{Deadline, Request};

use crate::decision::Decision;
use crate::error::{Result, StoreError};
use crate::model::Charge;
use crate::quota::Quota;

/// Where callers' rate-limit state lives: in process, in Redis, in a cluster,
/// or anywhere a user implements it.
///
/// One method decides: [`Store::decide`]. A single-quota check is a
/// [`Request`] with one charge; several quotas are one request with one
/// charge each. What a store can promise is data
/// ([`Store::capabilities`]), not more methods. A store that wraps another
/// (to count, log or route its calls) forwards `decide` (and
/// `capabilities`), and so forwards everything: keys, charges and deadline.
///
/// # Contract
///
/// `decide` answers `request` with one [`Decision`] per charge, in order:
///
/// - **Refusals first.** A request that [`Request::check`] refuses (no
///   charge, a cost of zero or above a quota's limit, two charges for one
///   quota) is an `Err` and counts nothing.
/// - **All or nothing.** The call is admitted only if every enforced
///   charge (not [`Charge::shadow`]) admits it; then every charge that
///   admits it counts it. A denied call is counted in no quota. A
///   charge's own decision says whether its quota admits the call; the
///   decisions equal [`crate::model::decide_all`]'s at the store's "now"
///   (for one charge, [`crate::model::decide`]'s).
/// - **Atomic.** The read, the arithmetic and the write of the caller's
///   states happen as one step with respect to every other request on the
///   same key, from this or any other store instance sharing the backend
///   (reported as [`Capabilities::atomic`]).
/// - **One keyspace per quota.** State is kept per `(key, quota name,
///   algorithm)`: a quota checked alone and within a set of quotas is the
///   same state. Keys are arbitrary bytes, fully isolated from each other,
///   and a key's state expires after the model's derived TTL. Nothing
///   kept per quota name may outlive the states of that name: a caller
///   may name a quota per request (the rate-limit service names one per
///   descriptor value), and a store that remembered every name it saw
///   would grow for the life of the process.
/// - **Deadlines.** A request carried out after its [`Request::deadline`]
///   counts nothing: the store answers [`StoreError::Expired`] (an
///   in-process store checks [`Request::check_in_time`] first; a network
///   store carries the deadline to the server).
/// - **Denial is a value.** A denial is `Ok` with `allowed == false`;
///   `Err` means no decision could be made (the limiter applies its
///   degraded mode).
///
/// `ratelimit-testkit` checks all of this for any store, through this one
/// method, with ready answers and futures alike.
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::Mutex;
/// use ratelimit_core::model::{self, State};
/// use ratelimit_core::store::{Answer, Capabilities, Decisions, Request};
/// use ratelimit_core::{Clock, Micros, Store, SystemClock};
///
/// /// A user's own in-process store: one mutex over a map.
/// #[derive(Debug, Default)]
/// struct MyStore {
///     states: Mutex<HashMap<(Vec<u8>, String, &'static str), (State, Micros)>>,
/// }
///
/// impl Store for MyStore {
///     fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
///         if let Err(e) = request.check_in_time() {
///             return Answer::ready(Err(e));
///         }
///         let now = SystemClock.now();
///         let mut states = self.states.lock().unwrap();
///         let id = |q: &ratelimit_core::Quota| {
///             (request.key.to_vec(), q.name().to_owned(), q.kind().code())
///         };
///         let prior = request
///             .charges
///             .iter()
///             .map(|c| states.get(&id(c.quota)).filter(|(_, exp)| *exp > now).map(|(s, _)| s.clone()))
///             .collect();
///         let step = match model::decide_all(request.charges, prior, now) {
///             Ok(step) => step,
///             Err(e) => return Answer::ready(Err(e.into())),
///         };
///         for (c, write) in request.charges.iter().zip(step.writes) {
///             if let Some((state, ttl)) = write {
///                 states.insert(id(c.quota), (state, now + ttl));
///             }
///         }
///         Answer::ready(Ok(step.decisions.into()))
///     }
///
///     fn capabilities(&self) -> Capabilities {
///         Capabilities::default().atomic(true).in_process(true)
///     }
/// }
/// ```
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Answers `request`: one decision per charge, all or nothing. See the
    /// trait's contract.
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a>;

    /// What the store promises (see [`Capabilities`]). The default
    /// promises nothing.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
}

impl<S: Store + ?Sized> Store for Arc<S> {
    #[inline]
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        (**self).decide(request)
    }
    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }
}

impl<S: Store + ?Sized> Store for Box<S> {
    #[inline]
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        (**self).decide(request)
    }
    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }
}

impl<S: Store + ?Sized> Store for &S {
    #[inline]
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        (**self).decide(request)
    }
    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }
}

/// Shorthands over [`Store::decide`] for tests, tools and direct use; every
/// one of them goes through that one method. Implemented for every store.
pub trait StoreExt: Store {
    /// One decision for `key` under `quota` at `cost`, with no deadline: a
    /// request with one charge.
    fn decide_one<'a>(
        &'a self,
        key: &'a [u8],
        quota: &'a Quota,
        cost: u64,
    ) -> impl Future<Output = Result<Decision>> + Send + 'a {
        async move {
            let charges = [Charge::new(quota, cost)];
            let decisions = self.decide(Request::new(key, &charges)).await?;
            first(decisions)
        }
    }

    /// One all-or-nothing decision for `key` over `charges`, with no
    /// deadline.
    fn decide_all<'a>(
        &'a self,
        key: &'a [u8],
        charges: &'a [Charge<'a>],
    ) -> impl Future<Output = Result<Decisions>> + Send + 'a {
        self.decide(Request::new(key, charges))
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

/// The one decision of a single-charge answer (a store that answered none
/// broke its contract: an error, not a panic).
pub fn first(decisions: Decisions) -> Result<Decision> {
    decisions.into_first().ok_or_else(|| {
        StoreError::message(
            "the store answered no decision for a request with one charge",
            false,
        )
    })
}
