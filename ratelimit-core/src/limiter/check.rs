//! [`Check`], the future of [`super::Limiter::check`], and the store key a
//! decision is asked under.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::decision::{Decision, Source};
use crate::store::Answer;

use super::NAMESPACE_SEPARATOR;

/// Store keys up to this many bytes are built without an allocation.
pub(crate) const INLINE_KEY: usize = 96;

/// Store keys up to this many bytes (with a namespace of up to 15 bytes)
/// are built in the smaller buffer of a plain limiter's check: caller ids,
/// UUIDs, IP addresses.
pub(crate) const SHORT_KEY: usize = 64;

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
    Ready(Option<Kept>),
    /// A ready decision handed over by [`super::Limiter::check`] (see
    /// [`Check::handed`]).
    Handed(Handed),
    Pending(Pin<Box<dyn Future<Output = Decision> + Send + 'a>>),
}

impl<'a> Check<'a> {
    #[inline]
    pub(crate) fn ready(decision: Decision) -> Self {
        Self(Repr::Ready(Some(Kept::from(&decision))))
    }

    /// The decision of `answer`, which holds one ([`Answer::decided_mut`]
    /// returned it), read into a [`Kept`] in place.
    #[inline(always)]
    pub(crate) fn from_answer(mut answer: Option<Answer<'_>>) -> Self {
        // Read in place, field by field (see `Kept`): moving the answer
        // out would copy it whole.
        let kept = answer
            .as_mut()
            .and_then(Answer::decided_mut)
            .map(|d| Kept::from(&*d));
        if kept.is_some() {
            // A decided answer holds a decision and nothing to release:
            // no call to its drop glue.
            std::mem::forget(answer);
        }
        Self(Repr::Ready(kept))
    }

    /// The check as [`super::Limiter::check`] hands it to its caller: a
    /// ready decision read field by field into a [`Handed`], whose fields
    /// stand at other places than [`Kept`]'s (in neither are two fields of
    /// one type side by side, so the copy is not merged or vectorised into
    /// wide loads). The check came back
    /// from a function that is not inlined, which wrote it field by field;
    /// the caller's `.await` moves what this returns into its own state,
    /// which, for the check as it came back, meant copying it in wide
    /// blocks that each spanned several of those fresh writes (a
    /// store-forwarding stall). Inlined into the caller, the copy here
    /// reads each field as it was written and the move into the caller's
    /// state is made of the same fields.
    #[inline(always)]
    pub(crate) fn handed(self) -> Self {
        match self.0 {
            Repr::Ready(Some(ref k)) => Self(Repr::Handed(Handed::from(k))),
            _ => self,
        }
    }

    /// Inlined into the caller that builds the future, which is then moved
    /// once, into its box.
    #[inline(always)]
    pub(crate) fn pending(future: impl Future<Output = Decision> + Send + 'a) -> Self {
        Self(Repr::Pending(Box::pin(future)))
    }

    /// The decision, if it was made already (an in-process store), without
    /// polling.
    #[inline]
    pub fn into_ready(self) -> Result<Decision, Self> {
        match self.0 {
            Repr::Ready(Some(k)) => Ok(k.decision()),
            Repr::Handed(h) => Ok(h.decision()),
            repr => Err(Self(repr)),
        }
    }
}

/// A ready decision as a check keeps it: the same fields, laid out so
/// that no two fields of one type are next to each other (and apart from
/// [`Decision`]'s order), so that the compiler cannot merge their copies
/// into wide loads, and copied one by one. A check takes its decision from
/// the store's answer right after the store wrote it, field by field;
/// copying the decision whole there reads it in wide blocks that each span
/// several of those fresh writes, which processors cannot forward from the
/// store buffer (on an AMD EPYC host those loads took about 45 % of a
/// plain check's own time; BENCHMARKS.md, "2026-12-03, AMD EPYC: the
/// check's copy of its decision").
#[derive(Clone, Copy)]
#[repr(C)]
struct Kept {
    remaining: u64,
    reset_nanos: u32,
    limit: u64,
    /// `u32::MAX`: no `retry_after`.
    retry_nanos: u32,
    reset_secs: u64,
    source: Source,
    allowed: bool,
    retry_secs: u64,
}

/// The decision held by a [`Kept`] or a [`Handed`] (the same fields, laid
/// out apart).
macro_rules! decision_of {
    ($held:expr) => {{
        let h = $held;
        Decision {
            allowed: h.allowed,
            limit: h.limit,
            remaining: h.remaining,
            reset_after: duration(h.reset_secs, h.reset_nanos),
            retry_after: (h.retry_nanos != u32::MAX).then(|| duration(h.retry_secs, h.retry_nanos)),
            source: h.source,
        }
    }};
}

impl Kept {
    #[inline(always)]
    fn from(d: &Decision) -> Self {
        let (retry_secs, retry_nanos) = match d.retry_after {
            Some(r) => (r.as_secs(), r.subsec_nanos()),
            None => (0, u32::MAX),
        };
        Self {
            source: d.source,
            allowed: d.allowed,
            retry_nanos,
            reset_nanos: d.reset_after.subsec_nanos(),
            remaining: d.remaining,
            reset_secs: d.reset_after.as_secs(),
            limit: d.limit,
            retry_secs,
        }
    }

    #[inline(always)]
    fn decision(&self) -> Decision {
        decision_of!(self)
    }
}

/// A ready decision as [`super::Limiter::check`] hands it over: [`Kept`]'s
/// fields at other places, again no two of one type next to each other
/// (see [`Check::handed`]).
#[derive(Clone, Copy)]
#[repr(C)]
struct Handed {
    limit: u64,
    retry_nanos: u32,
    retry_secs: u64,
    reset_nanos: u32,
    remaining: u64,
    allowed: bool,
    source: Source,
    reset_secs: u64,
}

impl Handed {
    #[inline(always)]
    fn from(k: &Kept) -> Self {
        Self {
            retry_secs: k.retry_secs,
            remaining: k.remaining,
            reset_nanos: k.reset_nanos,
            allowed: k.allowed,
            source: k.source,
            limit: k.limit,
            reset_secs: k.reset_secs,
            retry_nanos: k.retry_nanos,
        }
    }

    #[inline(always)]
    fn decision(&self) -> Decision {
        decision_of!(self)
    }
}

/// `secs` and `nanos` (below a second, as a `Duration` gave them).
#[inline(always)]
fn duration(secs: u64, nanos: u32) -> Duration {
    Duration::from_secs(secs).saturating_add(Duration::from_nanos(u64::from(nanos)))
}

impl fmt::Debug for Check<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Ready(Some(k)) => f.debug_tuple("Check::Ready").field(&k.decision()).finish(),
            Repr::Handed(h) => f.debug_tuple("Check::Ready").field(&h.decision()).finish(),
            Repr::Ready(None) => f.write_str("Check::Done"),
            Repr::Pending(_) => f.write_str("Check::Pending"),
        }
    }
}

impl Future for Check<'_> {
    type Output = Decision;

    /// A ready decision is handed over as a copy (it is a few plain
    /// words), so polling writes nothing; polled again after completion,
    /// the future gives the same decision again.
    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Decision> {
        match &mut self.0 {
            Repr::Ready(Some(k)) => Poll::Ready(k.decision()),
            Repr::Handed(h) => Poll::Ready(h.decision()),
            Repr::Ready(None) => Poll::Pending,
            Repr::Pending(f) => f.as_mut().poll(cx),
        }
    }
}

/// The longest namespace prefix: 64 characters and the separator, rounded
/// up so that it is copied as one fixed-size block.
const PREFIX_MAX: usize = 72;

/// `namespace ~`, kept in a fixed-size block (the limiter builds it once).
#[derive(Clone)]
pub(crate) struct Prefix {
    bytes: [u8; PREFIX_MAX],
    len: usize,
}

impl Prefix {
    /// `namespace ~` (a namespace of at most 64 bytes: checked by the
    /// builder).
    pub(crate) fn new(namespace: &str) -> Self {
        let ns = namespace.as_bytes();
        let len = (ns.len() + 1).min(PREFIX_MAX);
        let mut bytes = [0u8; PREFIX_MAX];
        bytes[..len - 1].copy_from_slice(&ns[..len - 1]);
        bytes[len - 1] = NAMESPACE_SEPARATOR;
        Self { bytes, len }
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl fmt::Debug for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_slice()))
    }
}

/// Copies `src` into `dst` (of the same length): short slices, the usual
/// caller ids, as one or two overlapping machine-word moves rather than a
/// call to `memcpy` (the common lengths, 8 to 16 bytes, tested first).
#[inline(always)]
fn copy_short(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    if n <= 16 {
        if n >= 8 {
            if let (Some(a), Some(b)) = (src.first_chunk::<8>(), src.last_chunk::<8>()) {
                dst[..8].copy_from_slice(a);
                dst[n - 8..].copy_from_slice(b);
            }
        } else if n >= 4 {
            if let (Some(a), Some(b)) = (src.first_chunk::<4>(), src.last_chunk::<4>()) {
                dst[..4].copy_from_slice(a);
                dst[n - 4..].copy_from_slice(b);
            }
        } else if n >= 2 {
            if let (Some(a), Some(b)) = (src.first_chunk::<2>(), src.last_chunk::<2>()) {
                dst[..2].copy_from_slice(a);
                dst[n - 2..].copy_from_slice(b);
            }
        } else if n == 1 {
            dst[0] = src[0];
        }
    } else if n <= 32 {
        if let (Some(a), Some(b)) = (src.first_chunk::<16>(), src.last_chunk::<16>()) {
            dst[..16].copy_from_slice(a);
            dst[n - 16..].copy_from_slice(b);
        }
    } else {
        dst.copy_from_slice(src);
    }
}

/// `namespace ~ caller` written into `buf`, if it fits (a buffer shorter
/// than the longest prefix takes only prefixes of up to 16 bytes).
#[inline(always)]
pub(crate) fn key_in<'b, const N: usize>(
    prefix: &Prefix,
    caller: &[u8],
    buf: &'b mut [u8; N],
) -> Option<&'b [u8]> {
    let (p, n) = (prefix.len, caller.len());
    // The usual short namespace and a caller that fits after 16 bytes:
    // both bounded, so no sum overflows and every slice is seen in bounds.
    // The prefix's 16-byte block is copied whole; the caller's bytes then
    // overwrite its zero tail.
    if p <= 16 && n <= N.saturating_sub(16) {
        if let (Some(dst), Some(src)) = (
            buf.first_chunk_mut::<16>(),
            prefix.bytes.first_chunk::<16>(),
        ) {
            *dst = *src;
        }
        copy_short(buf.get_mut(p..p + n)?, caller);
        return buf.get(..p + n);
    }
    let len = p.checked_add(n)?;
    if len > N {
        return None;
    }
    if p <= 16 {
        if let (Some(dst), Some(src)) = (
            buf.first_chunk_mut::<16>(),
            prefix.bytes.first_chunk::<16>(),
        ) {
            *dst = *src;
        }
    } else if let Some(dst) = buf.first_chunk_mut::<PREFIX_MAX>() {
        *dst = prefix.bytes;
    } else {
        return None;
    }
    copy_short(buf.get_mut(p..len)?, caller);
    buf.get(..len)
}

/// `namespace ~ caller`: inline for the common short key, else on the heap.
pub(crate) enum KeyBuf {
    Inline { buf: [u8; INLINE_KEY], len: usize },
    Heap(Vec<u8>),
}

impl KeyBuf {
    #[inline]
    pub(crate) fn new(prefix: &Prefix, caller: &[u8]) -> Self {
        let len = prefix.len + caller.len();
        if len <= INLINE_KEY {
            let mut buf = [0u8; INLINE_KEY];
            if let Some(head) = buf.first_chunk_mut::<PREFIX_MAX>() {
                *head = prefix.bytes;
            }
            copy_short(&mut buf[prefix.len..len], caller);
            Self::Inline { buf, len }
        } else {
            Self::Heap([prefix.as_slice(), caller].concat())
        }
    }

    /// The key on the heap (for a future that outlives the caller's bytes).
    pub(crate) fn owned(prefix: &Prefix, caller: &[u8]) -> Vec<u8> {
        [prefix.as_slice(), caller].concat()
    }

    #[inline]
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Self::Inline { buf, len } => &buf[..*len],
            Self::Heap(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_the_namespace_the_separator_and_the_caller_whatever_their_lengths() {
        for ns_len in 1..=64u8 {
            let namespace: String = (0..ns_len).map(|i| char::from(b'a' + i % 26)).collect();
            let prefix = Prefix::new(&namespace);
            for n in 0..=70u8 {
                let caller: Vec<u8> = (0..n).map(|i| i.wrapping_mul(37) ^ 0xC3).collect();
                let want = [namespace.as_bytes(), &[NAMESPACE_SEPARATOR], &caller].concat();
                // A buffer shorter than the longest prefix takes prefixes
                // of up to 16 bytes (with the separator) only.
                let mut short = [0u8; SHORT_KEY];
                let fits = want.len() <= SHORT_KEY && ns_len < 16;
                let got = key_in(&prefix, &caller, &mut short);
                assert_eq!(got, fits.then_some(&want[..]), "{ns_len} {n}");
                let mut long = [0u8; INLINE_KEY];
                let got = key_in(&prefix, &caller, &mut long);
                assert_eq!(
                    got,
                    (want.len() <= INLINE_KEY).then_some(&want[..]),
                    "{ns_len} {n}"
                );
                assert_eq!(KeyBuf::new(&prefix, &caller).as_slice(), &want[..]);
                assert_eq!(KeyBuf::owned(&prefix, &caller), want);
            }
        }
    }

    #[test]
    fn a_ready_check_hands_over_the_decision_it_was_given_field_for_field() {
        let durations = [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_nanos(999_999_999),
            Duration::from_micros(1_500_001),
            Duration::new(u64::MAX, 999_999_999),
        ];
        let sources = [
            Source::Store,
            Source::FailOpen,
            Source::FailClosed,
            Source::Fallback,
            Source::Cache,
            Source::Shadow,
        ];
        for (i, &reset_after) in durations.iter().enumerate() {
            for retry_after in [None, Some(durations[(i + 2) % durations.len()])] {
                for (j, &source) in sources.iter().enumerate() {
                    let d = Decision {
                        allowed: j % 2 == 0,
                        limit: u64::MAX - i as u64,
                        remaining: j as u64 * 7,
                        reset_after,
                        retry_after,
                        source,
                    };
                    let got = Check::ready(d.clone()).into_ready().ok();
                    assert_eq!(got.as_ref(), Some(&d));
                    let answer = Answer::decided(d.clone());
                    let got = Check::from_answer(Some(answer)).into_ready().ok();
                    assert_eq!(got.as_ref(), Some(&d));
                    // As `Limiter::check` hands it over: taken at once, and
                    // polled (twice: the same decision again).
                    let handed = Check::from_answer(Some(Answer::decided(d.clone()))).handed();
                    assert!(matches!(handed.0, Repr::Handed(_)));
                    assert_eq!(handed.into_ready().ok().as_ref(), Some(&d));
                    let mut handed = std::pin::pin!(Check::ready(d.clone()).handed());
                    let mut cx = Context::from_waker(std::task::Waker::noop());
                    for _ in 0..2 {
                        match handed.as_mut().poll(&mut cx) {
                            Poll::Ready(got) => assert_eq!(got, d),
                            Poll::Pending => panic!("a ready check was pending"),
                        }
                    }
                }
            }
        }
    }
}
