//! Admission: each node takes what it completes in time, and the rest is
//! answered at once.
//!
//! A burst is not a failure. A node that answers, however slowly, is
//! busy; the store keeps it busy at its capacity and never queues more than
//! it completes within the requests' deadlines:
//!
//! - **The limit in flight, from what the node completes.** While a node is
//!   saturated (every call it may have in flight is out, or a full batch
//!   waits, and requests are still waiting after each take), the rate at
//!   which its calls take requests, less the requests their callers'
//!   deadlines overtook meanwhile (taken, but answered too late to count),
//!   is a sample of its capacity `μ`: what it completes in time, the
//!   client's own work and a busy host's scheduling included. Samples only
//!   ever fall short (a span in which this process was descheduled reads
//!   low), so `μ` is the best sample of the last [`WINDOW`] or two, and
//!   falls below it only when admitted requests are overtaken by their
//!   deadlines. Requests held back only to make a larger call (the node
//!   not saturated) give a floor: it may raise `μ`, never lower or set it.
//!   A request
//!   that arrives with `n` requests ahead of it on the node is answered,
//!   at that rate, about `n / μ` plus one call's time later; it is
//!   admitted only if that is within [`HEADROOM`] of the time its caller
//!   gives it: the node's limit in flight is `μ × (HEADROOM × left - one
//!   call's time)`, at least [`MIN_LIMIT`]. What is not admitted is
//!   answered at once with [`StoreError::Overloaded`] (nothing sent,
//!   nothing counted): no caller waits out its timeout for an answer the
//!   node could not give in time. (The same arithmetic as an adaptive
//!   concurrency limit by Little's law; `μ` and one call's time are
//!   measured on the node, so a slower host or a heavier script lowers the
//!   limit by itself.)
//! - **Probing up.** `μ` is measured only while the node is saturated. A
//!   node whose limit sheds requests while its queue is empty at its
//!   calls is faster than its estimate: the estimate grows by a tenth
//!   every [`PROBE_EVERY`] until the node is saturated again (and measured)
//!   — unless admitted requests were overtaken by their deadlines since the
//!   last probe: then the calls in flight are what is late (a host that
//!   reads their replies late, not a queue), and the estimate falls by a
//!   tenth instead.
//!   An estimate no backlog has confirmed for [`FORGET_AFTER`] is
//!   forgotten: until it is measured again, the node admits every request
//!   (a node that was slow on a busy host is not held to it once the host is
//!   quiet).
//! - **Nothing sent that cannot make its deadline.** When a call takes its
//!   requests from the queue, those with less time left than one call takes
//!   are answered `Overloaded` instead of being sent (the server would
//!   only refuse them as expired); under overload the queue serves its
//!   newest requests first (see the batch module's docs).
//!
//! The node's breaker ([`crate::domains`]) never counts any of this: a busy
//! node is not a failed one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratelimit_core::StoreError;

/// The share of a request's time its wait on the node is planned for: a
/// request is admitted when the node should answer it within 3/4 of the
/// time its caller gives it (the rest absorbs the estimate's error and a
/// late reader).
pub const HEADROOM: f64 = 0.75;

/// The fewest requests in flight a node is always given, however slow it
/// was measured: 8.
pub const MIN_LIMIT: u64 = 8;

/// How often an estimate that sheds an idle queue's requests grows: every
/// 10 ms, by a tenth.
pub const PROBE_EVERY: Duration = Duration::from_millis(10);

/// How long a capacity estimate lasts without a new measurement: 1 s.
pub const FORGET_AFTER: Duration = Duration::from_secs(1);

/// The weight of a new measurement in the running estimates.
const WEIGHT: f64 = 0.25;

/// How long a capacity sample counts towards the estimate: it is the
/// highest sample of the current window of 100 ms and the one before.
pub const WINDOW: Duration = Duration::from_millis(100);

/// One node's admission state (see the module docs). Lock-free: read by
/// every request, written by the node's calls.
#[derive(Debug)]
pub struct Admission {
    /// The node, for its metrics.
    node: Arc<str>,
    base: Instant,
    /// The node's capacity, requests a second (f64 bits; 0: unknown).
    capacity: AtomicU64,
    /// When it was last measured or probed (µs since `base`).
    measured_at: AtomicU64,
    /// One call's time, from taking its requests to its reply, as the
    /// node gives it when this process reads its reply promptly: a running
    /// minimum that falls at once and rises by 1/64 of the gap a call (f64
    /// µs bits; 0: unknown). A mean would carry this process's own delays
    /// in reading replies under load, and shed requests a call would still
    /// have answered in time.
    call_us: AtomicU64,
    /// Whether the queue was empty after the node's latest take.
    idle_queue: std::sync::atomic::AtomicBool,
    /// The window of recent capacity samples ([`Admission::measured`]):
    /// when the current one started (µs since `base`), its highest sample
    /// and the previous window's (f64 bits).
    window_start: AtomicU64,
    window_current: AtomicU64,
    window_previous: AtomicU64,
    /// The limit in flight last computed (for metrics; 0: none).
    limit: AtomicU64,
    /// Admitted requests whose callers' deadlines overtook them (timed
    /// out waiting) since the latest measurement or probe.
    overtaken: AtomicU64,
    /// Requests shed at the door and in the queue.
    shed_at_door: AtomicU64,
    shed_in_queue: AtomicU64,
}

impl Default for Admission {
    fn default() -> Self {
        Self::new(Arc::from("node"))
    }
}

impl Admission {
    /// The admission of the node named `node` (its metrics' label), which
    /// admits everything until it is measured.
    pub fn new(node: Arc<str>) -> Self {
        crate::telemetry::node(&node);
        Self {
            node,
            base: Instant::now(),
            capacity: AtomicU64::new(0),
            measured_at: AtomicU64::new(0),
            call_us: AtomicU64::new(0),
            idle_queue: std::sync::atomic::AtomicBool::new(true),
            window_start: AtomicU64::new(0),
            window_current: AtomicU64::new(0),
            window_previous: AtomicU64::new(0),
            limit: AtomicU64::new(0),
            overtaken: AtomicU64::new(0),
            shed_at_door: AtomicU64::new(0),
            shed_in_queue: AtomicU64::new(0),
        }
    }
}

fn load_f64(a: &AtomicU64) -> f64 {
    f64::from_bits(a.load(Ordering::Relaxed))
}

fn store_f64(a: &AtomicU64, v: f64) {
    a.store(v.to_bits(), Ordering::Relaxed);
}

impl Admission {
    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_micros()).unwrap_or(u64::MAX)
    }

    /// The node's capacity in requests a second, if measured and not
    /// forgotten at `now`.
    pub fn capacity(&self, now: Instant) -> Option<f64> {
        let c = load_f64(&self.capacity);
        let age = self
            .micros(now)
            .saturating_sub(self.measured_at.load(Ordering::Relaxed));
        (c > 0.0 && Duration::from_micros(age) < FORGET_AFTER).then_some(c)
    }

    /// One call's time as measured: what the node takes when this process
    /// reads its reply promptly (zero before the first call).
    pub fn call_time(&self) -> Duration {
        Duration::from_secs_f64(load_f64(&self.call_us).max(0.0) / 1e6)
    }

    /// The node's limit in flight as last computed (`None`: it admits
    /// everything, its capacity unmeasured).
    pub fn limit(&self) -> Option<u64> {
        match self.limit.load(Ordering::Relaxed) {
            0 => None,
            l => Some(l),
        }
    }

    /// Requests shed so far: at the door, and in the queue.
    pub fn shed(&self) -> (u64, u64) {
        (
            self.shed_at_door.load(Ordering::Relaxed),
            self.shed_in_queue.load(Ordering::Relaxed),
        )
    }

    /// Whether a request arriving at `now` with `ahead` requests in flight
    /// on the node, due at `deadline`, is admitted; if not, the limit it
    /// met (see the module docs).
    pub fn admit(&self, ahead: u64, now: Instant, deadline: Instant) -> Result<(), u64> {
        self.admit_at(ahead, now, deadline)
            .inspect_err(|_| crate::telemetry::shed(&self.node, "door"))
    }

    fn admit_at(&self, ahead: u64, now: Instant, deadline: Instant) -> Result<(), u64> {
        let Some(capacity) = self.capacity(now) else {
            if self.limit.load(Ordering::Relaxed) != 0 {
                // The estimate was forgotten: the gauges say so.
                self.limit.store(0, Ordering::Relaxed);
                crate::telemetry::measured(&self.node, 0.0, 0);
            }
            return Ok(());
        };
        let left = deadline.saturating_duration_since(now).as_secs_f64();
        let planned = (HEADROOM * left - self.call_time().as_secs_f64()).max(0.0);
        let limit = ((capacity * planned).round() as u64).max(MIN_LIMIT);
        self.limit.store(limit, Ordering::Relaxed);
        if ahead < limit {
            return Ok(());
        }
        self.shed_at_door.fetch_add(1, Ordering::Relaxed);
        if self.idle_queue.load(Ordering::Relaxed) {
            self.probe(now, capacity);
        }
        Err(limit)
    }

    /// The estimate shed requests while the node's queue was empty: it
    /// grows by a tenth, at most once per [`PROBE_EVERY`]; or falls by a
    /// tenth if admitted requests were overtaken meanwhile.
    fn probe(&self, now: Instant, capacity: f64) {
        let at = self.micros(now);
        let last = self.measured_at.load(Ordering::Relaxed);
        let every = u64::try_from(PROBE_EVERY.as_micros()).unwrap_or(u64::MAX);
        if at.saturating_sub(last) >= every
            && self
                .measured_at
                .compare_exchange(last, at, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let late = self.overtaken.swap(0, Ordering::Relaxed) > 0;
            store_f64(&self.capacity, capacity * if late { 0.9 } else { 1.1 });
        }
    }

    /// A measurement of the node's capacity taken while it was saturated:
    /// `requests` taken by its calls over `over`, ending at `now`.
    ///
    /// Such samples only ever fall short of what the node completes: a span
    /// is saturated more often because this process was descheduled in it
    /// (its replies read late, a queue building meanwhile) than because
    /// the node was slow. The estimate is therefore the highest sample of
    /// the last [`WINDOW`] to [`WINDOW`] × 2 (as a congestion controller
    /// takes a path's bandwidth as the highest delivery rate it saw
    /// recently), and falls below it only on evidence that it is too high:
    /// admitted requests overtaken by their deadlines, which pull the
    /// estimate a quarter of the way down to what was completed in time.
    pub(crate) fn measured(&self, requests: u64, over: Duration, now: Instant) {
        if over.is_zero() || requests == 0 {
            return;
        }
        // What the node completed in time: its calls' takes, less the
        // requests their callers' deadlines overtook meanwhile.
        let overtaken = self.overtaken.swap(0, Ordering::Relaxed);
        let useful = requests.saturating_sub(overtaken).max(1);
        let sample = useful as f64 / over.as_secs_f64();
        let old = self.capacity(now).unwrap_or(0.0);
        let new = if old <= 0.0 {
            self.restart_window(sample, now)
        } else if overtaken > 0 {
            self.restart_window(old + WEIGHT * (sample - old), now)
        } else {
            self.window_max(sample, now)
        };
        self.set_capacity(new, now);
    }

    /// A floor under the node's capacity: `requests` taken by its calls
    /// over `over`, ending at `now`, while requests waited only to make a
    /// larger call, not because every call was busy. It raises a known
    /// estimate it beats (and then confirms it); it never lowers one, nor
    /// sets an unknown one (the node took what came: what it completes
    /// may be far more).
    pub(crate) fn at_least(&self, requests: u64, over: Duration, now: Instant) {
        if over.is_zero() || requests == 0 {
            return;
        }
        let Some(old) = self.capacity(now) else {
            return;
        };
        let overtaken = self.overtaken.load(Ordering::Relaxed);
        let sample = requests.saturating_sub(overtaken) as f64 / over.as_secs_f64();
        if sample <= old {
            return;
        }
        self.overtaken.store(0, Ordering::Relaxed);
        let new = self.window_max(sample, now);
        self.set_capacity(new, now);
    }

    fn set_capacity(&self, new: f64, now: Instant) {
        store_f64(&self.capacity, new);
        self.measured_at.store(self.micros(now), Ordering::Relaxed);
        crate::telemetry::measured(&self.node, new, self.limit.load(Ordering::Relaxed));
    }

    /// Adds `sample` to the window of recent samples (it starts a new
    /// window every [`WINDOW`]); returns the highest sample of the current
    /// window and the one before.
    fn window_max(&self, sample: f64, now: Instant) -> f64 {
        let at = self.micros(now);
        let started = self.window_start.load(Ordering::Relaxed);
        let window = u64::try_from(WINDOW.as_micros()).unwrap_or(u64::MAX);
        let mut current = load_f64(&self.window_current);
        let mut previous = load_f64(&self.window_previous);
        let gone = at.saturating_sub(started) / window;
        if gone >= 1 {
            previous = if gone == 1 { current } else { 0.0 };
            current = 0.0;
            self.window_start
                .store(started + gone * window, Ordering::Relaxed);
        }
        current = current.max(sample);
        store_f64(&self.window_current, current);
        store_f64(&self.window_previous, previous);
        current.max(previous)
    }

    /// Starts the window afresh at `value`; returns it.
    fn restart_window(&self, value: f64, now: Instant) -> f64 {
        self.window_start.store(self.micros(now), Ordering::Relaxed);
        store_f64(&self.window_current, value);
        store_f64(&self.window_previous, 0.0);
        value
    }

    /// A call took `took` from taking its requests to its reply.
    pub(crate) fn call_took(&self, took: Duration) {
        let sample = took.as_secs_f64() * 1e6;
        let old = load_f64(&self.call_us);
        let new = if old <= 0.0 || sample < old {
            sample
        } else {
            old + (sample - old) / 64.0
        };
        store_f64(&self.call_us, new);
    }

    /// Whether the queue was left empty by the latest take.
    pub(crate) fn set_idle_queue(&self, idle: bool) {
        self.idle_queue.store(idle, Ordering::Relaxed);
    }

    /// An admitted request's deadline passed before its answer came: not
    /// counted in what the node completes ([`Admission::measured`]), and a
    /// sign against probing up ([`Admission::admit`]).
    pub(crate) fn overtaken(&self) {
        self.overtaken.fetch_add(1, Ordering::Relaxed);
    }

    /// A request was taken out of the queue unsent: it could not make its
    /// deadline.
    pub(crate) fn shed_queued(&self) {
        self.shed_in_queue.fetch_add(1, Ordering::Relaxed);
        crate::telemetry::shed(&self.node, "queue");
    }

    /// Whether a request due at `deadline` can still be answered if sent at
    /// `now`: more than one call's time is left.
    pub(crate) fn can_make(&self, now: Instant, deadline: Instant) -> bool {
        deadline.saturating_duration_since(now) > self.call_time()
    }
}

/// The error of a request the node's admission refused (or took out of the
/// queue unsent).
pub(crate) fn overloaded(domain: &Arc<str>, in_flight: u64, limit: Option<u64>) -> StoreError {
    StoreError::Overloaded {
        domain: Arc::clone(domain),
        in_flight,
        limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn an_unmeasured_node_admits_everything() {
        let a = Admission::default();
        let now = Instant::now();
        assert_eq!(a.admit(1_000_000, now, now + 20 * MS), Ok(()));
        assert_eq!(a.limit(), None);
    }

    #[test]
    fn the_limit_is_what_the_node_completes_in_the_planned_time() {
        let a = Admission::default();
        let now = Instant::now();
        // 100,000 requests a second, calls of 1 ms.
        a.measured(1_000, 10 * MS, now);
        a.call_took(MS);
        // 20 ms left: 3/4 of it is 15 ms, less one call: 14 ms, 1,400.
        assert_eq!(a.admit(1_399, now, now + 20 * MS), Ok(()));
        assert_eq!(a.admit(1_400, now, now + 20 * MS), Err(1_400));
        assert_eq!(a.limit(), Some(1_400));
        // A caller giving 200 ms gets ten times the room (less the call).
        assert_eq!(a.admit(14_000, now, now + 200 * MS), Ok(()));
        // Whatever the estimate, a few are always admitted.
        assert_eq!(a.admit(MIN_LIMIT - 1, now, now), Ok(()));
        assert_eq!(a.shed(), (1, 0));
    }

    #[test]
    fn measurements_are_forgotten() {
        let a = Admission::default();
        let now = Instant::now();
        a.measured(1_000, 10 * MS, now);
        a.measured(2_000, 10 * MS, now);
        let c = a.capacity(now).unwrap();
        assert!((c - 200_000.0).abs() < 1.0, "{c}");
        assert_eq!(a.capacity(now + FORGET_AFTER), None);
    }

    #[test]
    fn the_estimate_is_the_best_recent_sample_until_its_window_passes() {
        let a = Admission::default();
        let t0 = Instant::now();
        a.measured(1_000, 10 * MS, t0);
        // A span in which this process was descheduled: far fewer taken.
        // Not the node's capacity: the estimate holds.
        a.measured(200, 10 * MS, t0 + 10 * MS);
        assert_eq!(a.capacity(t0 + 10 * MS), Some(100_000.0));
        // A better sample raises it at once.
        a.measured(1_200, 10 * MS, t0 + 20 * MS);
        assert_eq!(a.capacity(t0 + 20 * MS), Some(120_000.0));
        // Two windows later only what was seen since counts.
        let later = t0 + WINDOW * 2 + 30 * MS;
        a.measured(900, 10 * MS, later);
        assert_eq!(a.capacity(later), Some(90_000.0));
    }

    #[test]
    fn a_floor_raises_a_known_estimate_and_sets_no_unknown_one() {
        let a = Admission::default();
        let t0 = Instant::now();
        a.at_least(1_000, 10 * MS, t0);
        assert_eq!(a.capacity(t0), None);
        a.measured(500, 10 * MS, t0);
        a.at_least(100, 10 * MS, t0);
        assert_eq!(a.capacity(t0), Some(50_000.0));
        a.at_least(1_000, 10 * MS, t0);
        assert_eq!(a.capacity(t0), Some(100_000.0));
    }

    #[test]
    fn requests_overtaken_by_their_deadlines_are_not_capacity() {
        let a = Admission::default();
        let now = Instant::now();
        // 1,000 taken in 10 ms, of which 600 timed out: 40,000 a second.
        for _ in 0..600 {
            a.overtaken();
        }
        a.measured(1_000, 10 * MS, now);
        assert!((a.capacity(now).unwrap() - 40_000.0).abs() < 1.0);
        // Counted once: the next measurement is whole.
        a.measured(1_000, 10 * MS, now);
        assert!((a.capacity(now).unwrap() - 100_000.0).abs() < 1.0);
        // Everything overtaken: the estimate falls a quarter of the way
        // (the window restarts from there) but stays known.
        for _ in 0..1_000 {
            a.overtaken();
        }
        a.measured(1_000, 10 * MS, now);
        let c = a.capacity(now).unwrap();
        assert!((c - 75_025.0).abs() < 1.0, "{c}");
        a.measured(500, 10 * MS, now);
        assert!((a.capacity(now).unwrap() - 75_025.0).abs() < 1.0);
    }

    #[test]
    fn late_replies_turn_the_probe_down() {
        let a = Admission::default();
        let t0 = Instant::now();
        a.measured(100, 10 * MS, t0);
        a.set_idle_queue(true);
        // Shedding with an empty queue, but a request in flight timed out:
        // down by a tenth, not up.
        a.overtaken();
        let t1 = t0 + PROBE_EVERY;
        assert!(a.admit(1_000, t1, t1 + 20 * MS).is_err());
        assert!((a.capacity(t1).unwrap() - 9_000.0).abs() < 1.0);
        // Nothing overtaken since: up again.
        let t2 = t1 + PROBE_EVERY;
        assert!(a.admit(1_000, t2, t2 + 20 * MS).is_err());
        assert!((a.capacity(t2).unwrap() - 9_900.0).abs() < 1.0);
    }

    #[test]
    fn shedding_while_the_queue_is_empty_probes_the_estimate_up() {
        let a = Admission::default();
        let t0 = Instant::now();
        a.measured(100, 10 * MS, t0);
        // A backlog: no probe.
        a.set_idle_queue(false);
        assert!(a.admit(1_000, t0 + PROBE_EVERY, t0 + 30 * MS).is_err());
        assert!((a.capacity(t0 + PROBE_EVERY).unwrap() - 10_000.0).abs() < 1.0);
        // An empty queue: up by a tenth, once per interval.
        a.set_idle_queue(true);
        let t1 = t0 + PROBE_EVERY;
        assert!(a.admit(1_000, t1, t1 + 20 * MS).is_err());
        assert!(a.admit(1_000, t1, t1 + 20 * MS).is_err());
        assert!((a.capacity(t1).unwrap() - 11_000.0).abs() < 1.0);
    }

    #[test]
    fn a_request_with_less_than_a_call_left_cannot_make_it() {
        let a = Admission::default();
        let now = Instant::now();
        assert!(a.can_make(now, now + MS));
        a.call_took(2 * MS);
        assert!(!a.can_make(now, now + MS));
        assert!(a.can_make(now, now + 3 * MS));
    }

    #[test]
    fn a_calls_time_falls_at_once_and_rises_slowly() {
        let a = Admission::default();
        a.call_took(2 * MS);
        a.call_took(MS);
        assert_eq!(a.call_time(), MS);
        // A call read 65 ms late moves it by a 64th of the gap.
        a.call_took(65 * MS);
        assert_eq!(a.call_time(), 2 * MS);
    }
}
