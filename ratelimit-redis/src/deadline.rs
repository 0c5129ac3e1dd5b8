//! Deadlines in server time: a script call the caller has stopped waiting
//! for counts nothing.
//!
//! A request on a Redis connection cannot be taken back: once written to
//! the socket, a server that was paused (or slow, or behind a congested
//! link) runs it when it gets to it, long after the limiter has answered the
//! caller by its failure policy. So every script call carries the instant,
//! in the server's own clock (`TIME`), after which its caller no longer
//! waits; a script that finds `TIME` past it returns "expired" and writes
//! nothing (see [`crate::scripts`]).
//!
//! # Learning the server's clock
//!
//! The store never compares its clock with the server's directly: every
//! script reply carries the server's `TIME` as the script read it, `S`. The
//! script ran somewhere between the request being sent and the reply being
//! received (local monotonic instant `r`), so `S - r` is a **lower bound**
//! of the offset between the two clocks. The deadline sent is the local
//! deadline plus the highest such bound learnt within [`REFRESH`] (the
//! first reply after that replaces it), minus [`SKEW_ALLOWANCE`]: never
//! later than the true one, earlier by the travel time of the reply the
//! bound came from plus the allowance. Under load a reply waits
//! milliseconds to be read, so the latest bound alone would send
//! deadlines that much early, and the server would refuse calls whose
//! callers still wait (with 4,096 callers and a 20 ms timeout, keeping the
//! highest bound took the share of decisions made by the store from a
//! median of 46 % to 52 % with redis-rs and from 41 % to 46 % with fred,
//! BENCHMARKS.md). The local side is a monotonic clock, so a
//! step of the application host's wall clock changes nothing.
//!
//! What the allowance covers: drift between two replies (NTP-disciplined
//! clocks drift by well under 1 ms per second) and the server's clock
//! stepping backwards by up to that much. A server clock stepped back by
//! more lets calls that arrive up to the step late still count, until the
//! first reply after [`REFRESH`] corrects the offset (about a second). A
//! server clock stepped forward makes the deadline sent already past
//! there: the server refuses the call as expired (writing nothing) with
//! its `TIME`, the offset is learnt again, and
//! [`crate::engine::Engine::decide`] sends that request once more if its
//! caller still waits. Until a store has seen a reply there is
//! no offset: `RedisStoreBuilder::build` reads the server's `TIME` once, so
//! a built store's first decision carries a deadline; a store made from a
//! client you hold (`from_connection_manager`, `from_fred`) learns it from
//! its first reply, and that first call carries none.
//!
//! A cluster's nodes each have their own clock: the store keeps one offset
//! per hash slot, learnt from the node that answered for that slot.
//! `ClusterStoreBuilder::build` reads every master's `TIME` once (one call
//! per slot range), so a built cluster store's first call on any slot
//! carries a deadline; one made from a client you hold learns each slot's
//! offset from its first reply on that slot.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

/// Taken off every deadline sent to the server: drift and backward steps of
/// the server's clock up to this much are covered (see the module docs).
pub const SKEW_ALLOWANCE: Duration = Duration::from_millis(1);

/// The value sent when there is no deadline yet: the script reads and
/// returns the server's `TIME` (so the offset can be learnt) but enforces
/// nothing.
pub const NO_DEADLINE_YET: i64 = -1;

/// How often a server clock's offset is refreshed: a call whose clock was
/// last observed longer ago asks the script to return `TIME` (one integer
/// more in the reply); the others do not.
pub const REFRESH: Duration = Duration::from_secs(1);

/// No offset learnt yet.
const UNKNOWN: i64 = i64::MIN;

/// The offsets between a store's monotonic clock and its server's (or, for
/// a cluster, each hash slot's server's) `TIME`, learnt from replies.
#[derive(Debug)]
pub struct ServerClock {
    base: Instant,
    offsets: Box<[AtomicI64]>,
    /// When each offset was last learnt, in µs since `base`.
    observed: Box<[AtomicI64]>,
}

impl ServerClock {
    /// Offsets for `clocks` server clocks (1 for a single node,
    /// [`crate::keys::SLOTS`] for a cluster, one per hash slot).
    pub fn new(clocks: usize) -> Self {
        Self {
            base: Instant::now(),
            offsets: (0..clocks.max(1))
                .map(|_| AtomicI64::new(UNKNOWN))
                .collect(),
            observed: (0..clocks.max(1)).map(|_| AtomicI64::new(0)).collect(),
        }
    }

    /// A copy of the offsets learnt so far.
    pub fn copy(&self) -> Self {
        Self {
            base: self.base,
            offsets: self
                .offsets
                .iter()
                .map(|o| AtomicI64::new(o.load(Ordering::Relaxed)))
                .collect(),
            observed: self
                .observed
                .iter()
                .map(|o| AtomicI64::new(o.load(Ordering::Relaxed)))
                .collect(),
        }
    }

    /// The local instant offsets are counted from.
    pub fn base(&self) -> Instant {
        self.base
    }

    /// How many server clocks are tracked.
    pub fn clocks(&self) -> usize {
        self.offsets.len()
    }

    fn local_micros(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.base).as_micros()).unwrap_or(i64::MAX)
    }

    fn slot(&self, index: usize) -> &AtomicI64 {
        &self.offsets[index % self.offsets.len()]
    }

    /// `ARGV[1]` of a single-quota script for a call to server clock
    /// `index` whose caller waits until `deadline` (see
    /// [`crate::scripts`]): the deadline in the server's µs (the local one
    /// translated by the offset kept, see [`ServerClock::observe`], less
    /// [`SKEW_ALLOWANCE`]), negated as `-(deadline + 1)` when the offset is
    /// due for a refresh ([`REFRESH`]) so the reply carries `TIME`;
    /// [`NO_DEADLINE_YET`] before the first reply. `None` when `deadline`
    /// has already passed here: nothing should be sent.
    pub fn server_deadline(&self, index: usize, deadline: Instant) -> Option<i64> {
        self.server_deadline_at(index, deadline, Instant::now())
    }

    /// As [`ServerClock::server_deadline`], with the local clock read
    /// `now` (one reading for every request of a batch).
    pub fn server_deadline_at(&self, index: usize, deadline: Instant, now: Instant) -> Option<i64> {
        if deadline <= now {
            return None;
        }
        let offset = self.slot(index).load(Ordering::Relaxed);
        if offset == UNKNOWN {
            return Some(NO_DEADLINE_YET);
        }
        let allowance = i64::try_from(SKEW_ALLOWANCE.as_micros()).unwrap_or(0);
        let at = self
            .local_micros(deadline)
            .saturating_add(offset)
            .saturating_sub(allowance);
        // A server whose clock reads before the Unix epoch plus the
        // allowance is not one this arithmetic serves: send no deadline.
        let at = at.max(0);
        let refresh = i64::try_from(REFRESH.as_micros()).unwrap_or(i64::MAX);
        let seen = self.seen(index).load(Ordering::Relaxed);
        Some(if self.local_micros(now) - seen >= refresh {
            -1 - at
        } else {
            at
        })
    }

    /// Learns from a reply: server clock `index` read `server_now` µs, and
    /// the reply was received at `received`.
    ///
    /// Each reply gives a lower bound of the offset, low by the time the
    /// reply took to be read (under load, while thousands of callers'
    /// tasks wait their turn, milliseconds: a deadline sent that much
    /// early is refused by the server while its caller still waits). So
    /// the highest bound learnt within [`REFRESH`] is kept; the first reply
    /// after that replaces it (so a server clock stepped back is followed
    /// within [`REFRESH`]), and a higher one (stepped forward) at once.
    pub fn observe(&self, index: usize, server_now: i64, received: Instant) {
        if server_now <= 0 {
            return;
        }
        let local = self.local_micros(received);
        let offset = server_now.saturating_sub(local);
        let refresh = i64::try_from(REFRESH.as_micros()).unwrap_or(i64::MAX);
        if offset > self.slot(index).load(Ordering::Relaxed)
            || local - self.seen(index).load(Ordering::Relaxed) >= refresh
        {
            self.keep(index, offset, local);
        }
    }

    /// Sets server clock `index`'s offset (server µs minus this store's
    /// monotonic µs, as [`ServerClock::offset`] reads it), whatever was
    /// learnt before, as learnt now: for an application that knows its
    /// server's clock was stepped, and for tests.
    pub fn set_offset(&self, index: usize, offset: i64) {
        self.keep(index, offset, self.local_micros(Instant::now()));
    }

    /// Keeps `offset` for server clock `index`, learnt at `local` µs.
    fn keep(&self, index: usize, offset: i64, local: i64) {
        self.slot(index).store(offset, Ordering::Relaxed);
        self.seen(index).store(local, Ordering::Relaxed);
    }

    /// When server clock `index`'s offset was last kept, in µs since
    /// `base`.
    fn seen(&self, index: usize) -> &AtomicI64 {
        &self.observed[index % self.observed.len()]
    }

    /// The latest offset learnt for server clock `index` (server µs minus
    /// this store's monotonic µs), if any.
    pub fn offset(&self, index: usize) -> Option<i64> {
        let o = self.slot(index).load(Ordering::Relaxed);
        (o != UNKNOWN).then_some(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_deadline_before_the_first_reply_and_none_once_passed() {
        let c = ServerClock::new(1);
        let later = Instant::now() + Duration::from_secs(1);
        assert_eq!(c.server_deadline(0, later), Some(NO_DEADLINE_YET));
        assert_eq!(c.server_deadline(0, Instant::now()), None);
    }

    #[test]
    fn the_deadline_is_the_local_one_in_server_time_less_the_allowance() {
        let c = ServerClock::new(1);
        let server = 1_700_000_000_000_000i64;
        let received = Instant::now();
        c.observe(0, server, received);
        let deadline = received + Duration::from_millis(20);
        let sent = c.server_deadline(0, deadline).unwrap();
        // Exactly 20 ms after the observed server time, less 1 ms; the
        // offset is fresh, so TIME is not asked for.
        assert_eq!(sent, server + 20_000 - 1_000);
        // Observed over a second ago: TIME is asked for (negated).
        let old = Instant::now();
        c.set_offset(0, server - c.local_micros(old));
        c.observed[0].store(c.local_micros(old) - 2_000_000, Ordering::Relaxed);
        let sent = c
            .server_deadline(0, old + Duration::from_millis(20))
            .unwrap();
        assert_eq!(sent, -1 - (server + 20_000 - 1_000));
    }

    #[test]
    fn the_highest_bound_within_a_refresh_is_kept_then_replaced() {
        let c = ServerClock::new(1);
        let at = c.base() + Duration::from_secs(10);
        c.observe(0, 5_000_000, at);
        let first = c.offset(0).unwrap();
        // A reply read 3 ms late: a lower bound, not kept.
        c.observe(0, 5_000_000, at + Duration::from_millis(3));
        assert_eq!(c.offset(0), Some(first));
        // A tighter one (read sooner after the server's TIME): kept.
        c.observe(0, 5_002_000, at + Duration::from_millis(1));
        assert_eq!(c.offset(0), Some(first + 1_000));
        // Over a second later, a lower one replaces it (a clock stepped
        // back is followed).
        c.observe(0, 6_000_000, at + Duration::from_millis(1_002));
        assert_eq!(c.offset(0), Some(first - 2_000));
    }

    #[test]
    fn each_slot_learns_its_own_offset() {
        let c = ServerClock::new(16_384);
        let now = Instant::now();
        c.observe(5, 2_000_000, now);
        c.observe(6, 9_000_000, now);
        assert_eq!(c.offset(6).unwrap() - c.offset(5).unwrap(), 7_000_000);
        assert_eq!(c.offset(7), None);
    }
}
