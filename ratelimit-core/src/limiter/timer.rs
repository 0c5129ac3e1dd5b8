//! Sleeping without a runtime dependency: the limiter's timeouts and waits.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// A boxed future returned by a [`Timer`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Something that can sleep: the limiter's timeouts and
/// [`crate::Limiter::acquire`] use it, so the core needs no runtime. With
/// the `tokio` feature, [`TokioTimer`] is the default.
pub trait Timer: Send + Sync + fmt::Debug {
    /// A future that completes after `duration`.
    fn sleep(&self, duration: Duration) -> Sleep;

    /// The timer's own notion of now (default `Instant::now()`): how late a
    /// sleep fired is measured with it, so that a timeout caused by this
    /// process being late (a starved runtime) is not held against the
    /// store.
    fn now(&self) -> std::time::Instant {
        std::time::Instant::now()
    }
}

/// The tokio timer (feature `tokio`). Needs a tokio runtime with time enabled.
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioTimer;

#[cfg(feature = "tokio")]
impl Timer for TokioTimer {
    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }

    fn now(&self) -> std::time::Instant {
        tokio::time::Instant::now().into_std()
    }
}

/// How a guarded store call ended.
pub(crate) enum Guard<T> {
    Done(T),
    Panicked,
    /// The timeout fired; `late`: well after it was due (see
    /// [`crate::health::late_after`]), so this process, not the store, was
    /// slow.
    TimedOut {
        late: bool,
    },
}

/// Polls the store call, catching panics, racing it against the timer. The
/// timer is armed only once the call has returned `Pending`, so a store that
/// answers at once (the in-process one) never pays for a sleep, and not at
/// all when `arm` is false (a store that bounds its own calls by the
/// request's deadline: [`crate::store::Capabilities::bounded`]).
pub(crate) struct Guarded<'a, F> {
    pub(crate) call: F,
    pub(crate) sleep: Option<(Sleep, std::time::Instant)>,
    pub(crate) arm: bool,
    pub(crate) timer: &'a dyn Timer,
    pub(crate) timeout: Duration,
}

impl<F: Future + Unpin> Future for Guarded<'_, F> {
    type Output = Guard<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(&mut this.call).poll(cx))) {
            Ok(Poll::Ready(v)) => return Poll::Ready(Guard::Done(v)),
            Ok(Poll::Pending) => {}
            Err(_) => return Poll::Ready(Guard::Panicked),
        }
        if !this.arm {
            return Poll::Pending;
        }
        let (timer, timeout) = (this.timer, this.timeout);
        let (sleep, armed) = this
            .sleep
            .get_or_insert_with(|| (timer.sleep(timeout), timer.now()));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                let due = *armed + timeout;
                let late =
                    timer.now().saturating_duration_since(due) > crate::health::late_after(timeout);
                Poll::Ready(Guard::TimedOut { late })
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
