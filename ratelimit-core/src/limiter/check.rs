//! [`Check`], the future of [`super::Limiter::check`], and the store key a
//! decision is asked under.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::decision::Decision;

use super::NAMESPACE_SEPARATOR;

/// Store keys up to this many bytes are built without an allocation.
pub(crate) const INLINE_KEY: usize = 128;

/// The future of [`super::Limiter::check`]: a decision that was ready when
/// `check` was called (an in-process store: no allocation, nothing left to
/// do but hand it over), or one still waiting for the store.
///
/// For an in-process store the decision is made when `check` is called,
/// not when the future is first polled (as tower's `Service::call` does its
/// work eagerly); awaiting the future hands the decision over. The future
/// is small (its size does not grow with the limiter's configuration), so
/// a layer can hold it without boxing it.
#[must_use = "a Check holds the decision: await it"]
pub struct Check<'a>(Repr<'a>);

enum Repr<'a> {
    Ready(Option<Decision>),
    Pending(Pin<Box<dyn Future<Output = Decision> + Send + 'a>>),
}

impl<'a> Check<'a> {
    #[inline]
    pub(crate) fn ready(decision: Decision) -> Self {
        Self(Repr::Ready(Some(decision)))
    }

    pub(crate) fn pending(future: impl Future<Output = Decision> + Send + 'a) -> Self {
        Self(Repr::Pending(Box::pin(future)))
    }

    /// The decision, if it was made already (an in-process store), without
    /// polling.
    #[inline]
    pub fn into_ready(self) -> Result<Decision, Self> {
        match self.0 {
            Repr::Ready(Some(d)) => Ok(d),
            repr => Err(Self(repr)),
        }
    }
}

impl fmt::Debug for Check<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Ready(Some(d)) => f.debug_tuple("Check::Ready").field(d).finish(),
            Repr::Ready(None) => f.write_str("Check::Done"),
            Repr::Pending(_) => f.write_str("Check::Pending"),
        }
    }
}

impl Future for Check<'_> {
    type Output = Decision;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Decision> {
        match &mut self.0 {
            Repr::Ready(d) => match d.take() {
                Some(d) => Poll::Ready(d),
                None => Poll::Pending,
            },
            Repr::Pending(f) => f.as_mut().poll(cx),
        }
    }
}

/// `namespace ~ caller`: inline for the common short key, else on the heap.
pub(crate) enum KeyBuf {
    Inline { buf: [u8; INLINE_KEY], len: usize },
    Heap(Vec<u8>),
}

impl KeyBuf {
    #[inline]
    pub(crate) fn new(namespace: &str, caller: &[u8]) -> Self {
        let ns = namespace.as_bytes();
        let len = ns.len() + 1 + caller.len();
        if len <= INLINE_KEY {
            let mut buf = [0u8; INLINE_KEY];
            buf[..ns.len()].copy_from_slice(ns);
            buf[ns.len()] = NAMESPACE_SEPARATOR;
            buf[ns.len() + 1..len].copy_from_slice(caller);
            Self::Inline { buf, len }
        } else {
            Self::Heap([ns, &[NAMESPACE_SEPARATOR], caller].concat())
        }
    }

    /// The key on the heap (for a future that outlives the caller's bytes).
    pub(crate) fn owned(namespace: &str, caller: &[u8]) -> Vec<u8> {
        [namespace.as_bytes(), &[NAMESPACE_SEPARATOR], caller].concat()
    }

    #[inline]
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Self::Inline { buf, len } => &buf[..*len],
            Self::Heap(v) => v,
        }
    }
}
