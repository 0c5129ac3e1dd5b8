//! What a store answers: decisions ready now, or a future of them.

use std::fmt;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::decision::Decision;
use crate::error::Result;

/// One decision per charge of a request, in the request's order. Holds a
/// single decision without a heap allocation.
///
/// Dereferences to `[Decision]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Decisions(Repr);

#[derive(Clone, PartialEq, Eq)]
enum Repr {
    One(Decision),
    Many(Vec<Decision>),
}

impl Default for Decisions {
    fn default() -> Self {
        Self(Repr::Many(Vec::new()))
    }
}

impl Decisions {
    /// No decisions yet, room for `n` without reallocating.
    pub fn with_capacity(n: usize) -> Self {
        Self(Repr::Many(Vec::with_capacity(n)))
    }

    /// One decision (no allocation).
    #[inline]
    pub fn one(decision: Decision) -> Self {
        Self(Repr::One(decision))
    }

    /// Appends a decision.
    pub fn push(&mut self, decision: Decision) {
        match &mut self.0 {
            Repr::Many(v) if v.is_empty() && v.capacity() == 0 => self.0 = Repr::One(decision),
            Repr::Many(v) => v.push(decision),
            Repr::One(_) => {
                let Repr::One(first) = std::mem::replace(&mut self.0, Repr::Many(Vec::new()))
                else {
                    return;
                };
                self.0 = Repr::Many(vec![first, decision]);
            }
        }
    }

    /// The decisions as a `Vec`.
    pub fn into_vec(self) -> Vec<Decision> {
        match self.0 {
            Repr::One(d) => vec![d],
            Repr::Many(v) => v,
        }
    }

    /// The decision, if there is exactly one; else the decisions back.
    #[inline]
    pub fn into_single(self) -> Result<Decision, Self> {
        match self.0 {
            Repr::One(d) => Ok(d),
            Repr::Many(mut v) if v.len() == 1 => v.pop().ok_or(Self::default()),
            repr => Err(Self(repr)),
        }
    }

    /// The first decision (the only one of a single-charge request), if any.
    #[inline]
    pub fn into_first(self) -> Option<Decision> {
        match self.0 {
            Repr::One(d) => Some(d),
            Repr::Many(v) => v.into_iter().next(),
        }
    }
}

impl fmt::Debug for Decisions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Deref for Decisions {
    type Target = [Decision];
    #[inline]
    fn deref(&self) -> &[Decision] {
        match &self.0 {
            Repr::One(d) => std::slice::from_ref(d),
            Repr::Many(v) => v,
        }
    }
}

impl DerefMut for Decisions {
    fn deref_mut(&mut self) -> &mut [Decision] {
        match &mut self.0 {
            Repr::One(d) => std::slice::from_mut(d),
            Repr::Many(v) => v,
        }
    }
}

impl From<Decision> for Decisions {
    fn from(d: Decision) -> Self {
        Self::one(d)
    }
}

impl From<Vec<Decision>> for Decisions {
    fn from(v: Vec<Decision>) -> Self {
        Self(Repr::Many(v))
    }
}

impl FromIterator<Decision> for Decisions {
    fn from_iter<I: IntoIterator<Item = Decision>>(iter: I) -> Self {
        let mut it = iter.into_iter();
        let Some(first) = it.next() else {
            return Self::default();
        };
        match it.next() {
            None => Self::one(first),
            Some(second) => {
                let mut v = Vec::with_capacity(2 + it.size_hint().0);
                v.push(first);
                v.push(second);
                v.extend(it);
                Self(Repr::Many(v))
            }
        }
    }
}

impl IntoIterator for Decisions {
    type Item = Decision;
    type IntoIter = std::vec::IntoIter<Decision>;
    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

impl<'a> IntoIterator for &'a Decisions {
    type Item = &'a Decision;
    type IntoIter = std::slice::Iter<'a, Decision>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
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
    /// One decision, ready (the in-process single-charge case: nothing
    /// wrapped around it).
    One(Decision),
    /// The result.
    Ready(Result<Decisions>),
    Pending(Pending<'a>),
    /// Taken by a poll.
    Done,
}

impl<'a> Answer<'a> {
    /// The decision of an answer made by [`Answer::decided`], in place.
    #[inline]
    pub(crate) fn decided_mut(&mut self) -> Option<&mut Decision> {
        match &mut self.0 {
            Inner::One(d) => Some(d),
            _ => None,
        }
    }

    /// An answer that is ready now.
    #[inline]
    pub fn ready(result: Result<Decisions>) -> Self {
        Self(Inner::Ready(result))
    }

    /// One decision, ready now: the answer to a single-charge request that
    /// an in-process store gives (the same as
    /// `Answer::ready(Ok(Decisions::one(decision)))`, carried without the
    /// wrapping).
    #[inline]
    pub fn decided(decision: Decision) -> Self {
        Self(Inner::One(decision))
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
        matches!(self.0, Inner::One(_) | Inner::Ready(_))
    }

    /// The result if it is ready, else the answer itself, to await.
    #[inline]
    pub fn into_ready(self) -> std::result::Result<Result<Decisions>, Self> {
        match self.0 {
            Inner::One(d) => Ok(Ok(Decisions::one(d))),
            Inner::Ready(r) => Ok(r),
            inner => Err(Self(inner)),
        }
    }

    /// Taken apart for a single-charge request: the one decision if it is
    /// ready (`Ok(Ok(d))`), a ready error or a ready answer without exactly
    /// one decision (`Ok(Err(e))`), or the answer itself, to await.
    #[inline]
    pub fn into_single(self) -> std::result::Result<Result<Decision>, Self> {
        match self.0 {
            Inner::One(d) => Ok(Ok(d)),
            Inner::Ready(Ok(ds)) => Ok(ds.into_single().map_err(|ds| {
                crate::error::StoreError::message(
                    format!("the store answered {} decisions for 1 charge", ds.len()),
                    false,
                )
            })),
            Inner::Ready(Err(e)) => Ok(Err(e)),
            inner => Err(Self(inner)),
        }
    }
}

impl fmt::Debug for Answer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Inner::One(d) => f.debug_tuple("Decided").field(d).finish(),
            Inner::Ready(r) => f.debug_tuple("Ready").field(r).finish(),
            Inner::Pending(_) => f.write_str("Pending"),
            Inner::Done => f.write_str("Done"),
        }
    }
}

impl Future for Answer<'_> {
    type Output = Result<Decisions>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Inner::Pending(f) = &mut self.0 {
            return f.as_mut().poll(cx);
        }
        match std::mem::replace(&mut self.0, Inner::Done) {
            Inner::One(d) => Poll::Ready(Ok(Decisions::one(d))),
            Inner::Ready(r) => Poll::Ready(r),
            // Polled again after completion: the contract of `Future`
            // allows anything but undefined behaviour; never wake.
            _ => Poll::Pending,
        }
    }
}
