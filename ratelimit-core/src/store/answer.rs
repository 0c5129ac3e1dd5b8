//! What a store answers: decisions ready now, or a future of them.

use std::fmt;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::task::{Context, Poll};

use smallvec::SmallVec;

use crate::decision::Decision;
use crate::error::Result;

/// One decision per charge of a request, in the request's order. Holds a
/// single decision without a heap allocation.
///
/// Dereferences to `[Decision]`.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Decisions(SmallVec<[Decision; 1]>);

impl Decisions {
    /// No decisions yet, room for `n` without reallocating.
    pub fn with_capacity(n: usize) -> Self {
        Self(SmallVec::with_capacity(n))
    }

    /// One decision (no allocation).
    pub fn one(decision: Decision) -> Self {
        let mut v = SmallVec::new();
        v.push(decision);
        Self(v)
    }

    /// Appends a decision.
    pub fn push(&mut self, decision: Decision) {
        self.0.push(decision);
    }

    /// The decisions as a `Vec`.
    pub fn into_vec(self) -> Vec<Decision> {
        self.0.into_vec()
    }

    /// The first decision (the only one of a single-charge request), if any.
    pub fn into_first(self) -> Option<Decision> {
        self.0.into_iter().next()
    }
}

impl fmt::Debug for Decisions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

impl Deref for Decisions {
    type Target = [Decision];
    fn deref(&self) -> &[Decision] {
        &self.0
    }
}

impl DerefMut for Decisions {
    fn deref_mut(&mut self) -> &mut [Decision] {
        &mut self.0
    }
}

impl From<Decision> for Decisions {
    fn from(d: Decision) -> Self {
        Self::one(d)
    }
}

impl From<Vec<Decision>> for Decisions {
    fn from(v: Vec<Decision>) -> Self {
        Self(SmallVec::from_vec(v))
    }
}

impl FromIterator<Decision> for Decisions {
    fn from_iter<I: IntoIterator<Item = Decision>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl IntoIterator for Decisions {
    type Item = Decision;
    type IntoIter = smallvec::IntoIter<[Decision; 1]>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a Decisions {
    type Item = &'a Decision;
    type IntoIter = std::slice::Iter<'a, Decision>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// The boxed future of a [`Store`](super::Store) that must wait (a network
/// round trip).
pub type Pending<'a> = Pin<Box<dyn Future<Output = Result<Decisions>> + Send + 'a>>;

/// A store's answer to one [`Request`](super::Request): ready now (an
/// in-process store: no future, no allocation for one charge), or a future
/// to await (a network store).
///
/// An `Answer` is itself a future, so `store.decide(request).await` works
/// for both; the [`crate::Limiter`] takes a ready answer without polling
/// ([`Answer::into_ready`]).
///
/// ```
/// use ratelimit_core::store::{Answer, Decisions};
/// use ratelimit_core::Decision;
///
/// let ready = Answer::ready(Ok(Decisions::one(Decision::from_store(true, 10, 9, 6_000, None))));
/// assert!(ready.is_ready());
/// let later = Answer::pending(async { Ok(Decisions::default()) });
/// assert!(!later.is_ready());
/// ```
pub struct Answer<'a>(Inner<'a>);

enum Inner<'a> {
    /// The result, until a poll takes it.
    Ready(Option<Result<Decisions>>),
    Pending(Pending<'a>),
}

impl<'a> Answer<'a> {
    /// An answer that is ready now.
    #[inline]
    pub fn ready(result: Result<Decisions>) -> Self {
        Self(Inner::Ready(Some(result)))
    }

    /// An answer to await: `future` is boxed. It should do nothing before
    /// it is first polled (a caller that finds it pending may drop it
    /// unpolled).
    pub fn pending(future: impl Future<Output = Result<Decisions>> + Send + 'a) -> Self {
        Self(Inner::Pending(Box::pin(future)))
    }

    /// An answer to await, already boxed.
    pub fn from_pending(future: Pending<'a>) -> Self {
        Self(Inner::Pending(future))
    }

    /// Whether the answer is ready without waiting.
    pub fn is_ready(&self) -> bool {
        matches!(self.0, Inner::Ready(Some(_)))
    }

    /// The result if it is ready, else the answer itself, to await.
    #[inline]
    pub fn into_ready(self) -> std::result::Result<Result<Decisions>, Self> {
        match self.0 {
            Inner::Ready(Some(r)) => Ok(r),
            inner => Err(Self(inner)),
        }
    }
}

impl fmt::Debug for Answer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Inner::Ready(Some(r)) => f.debug_tuple("Ready").field(r).finish(),
            Inner::Ready(None) => f.write_str("Taken"),
            Inner::Pending(_) => f.write_str("Pending"),
        }
    }
}

impl Future for Answer<'_> {
    type Output = Result<Decisions>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            Inner::Ready(r) => match r.take() {
                Some(r) => Poll::Ready(r),
                // Polled again after completion: the contract of `Future`
                // allows anything but undefined behaviour; never wake.
                None => Poll::Pending,
            },
            Inner::Pending(f) => f.as_mut().poll(cx),
        }
    }
}
