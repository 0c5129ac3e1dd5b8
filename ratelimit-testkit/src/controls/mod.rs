//! The limiter's production controls over a real store: the deny cache,
//! shadow quotas and [`Limiter::acquire`], checked by the same functions
//! for every store.
//!
//! The conformance suite ([`crate::conformance`]) checks the store through
//! the `Store` trait. These checks put a [`Limiter`] in front of the stores
//! a [`StoreFactory`] hands out (each on a [`ManualClock`] the check moves
//! itself) and check what the limiter's controls promise on that store:
//!
//! | function | what it checks |
//! |---|---|
//! | `deny_cache_equivalence` (feature `deny-cache`) | the same random traffic through a limiter with the deny cache and one without, each on its own keyspace of one store on one clock: the same calls admitted, call for call; every decision the cached limiter got from the store equal to the plain one's; a cached denial's `retry_after` never longer than the exact one; store calls saved = cache hits. Every algorithm alone, with costs > 1, then two and four quotas (mixed algorithms, a cost per quota, a shadow quota in half of the four-quota runs) |
//! | `deny_cache_check_can_fail` (feature `deny-cache`) | the equivalence check rejects each `FlawedDenyCache`, each by the part of the check meant for it: one that keeps denying too long, one that ignores the cost, one that reports a longer `retry_after`, one that still calls the store |
//! | [`shadow_quotas`] | shadow quotas count but never deny: sources, no header naming the shadow policy, would-be denials counted; the store's own state shows the shadow quota charged exactly the admitted calls and not the denied ones; a limiter whose only quota is in shadow mode |
//! | [`leases_follow_their_rules`] | two limiters (instances) over stores switched off and on at random (busy, or unavailable): while a store cannot answer, a caller with a live lease is decided exactly as the leases' rules say (share of the store's remaining, spent until the reset, renewed by every answer), one without by the policy (busy) or the fallback (unavailable); with the clock still, everything admitted stays within the stated bound. Every algorithm |
//! | [`lease_check_can_fail`] | the lease check rejects each `LeaseFlaw`: leases that forget what they spent, ignore the instances, outlive their reset, or lease callers the store never answered |
//! | [`acquire_paces_one_worker`] | one worker's `acquire`s are spaced by the exact `retry_after` (plus at most a quarter of jitter); a deadline shorter than the wait is `AcquireError::Deadline` at once, a long enough one is admitted |
//! | [`acquire_shares_one_quota`] | workers, each its own limiter on its own store instance, acquire one quota together: all get what they asked, each from the store, and what they got plus what the store still offers at the end is within what the quota allows over the span of the (injected) clock, for all four algorithms |
//! | [`acquire_cancel_safe`] | acquires cancelled anywhere (before, during or after a store call, while waiting) count nothing: once the quota refills, exactly its limit is admitted |
//!
//! [`run_controls`] runs them all. Time is a [`ManualClock`]: the checks
//! move it themselves, and `acquire` sleeps on a [`ClockTimer`], which moves
//! the clock instead of sleeping. No check asserts a wall-clock duration;
//! the only real waits are the store's own round trips (and, in
//! `acquire_cancel_safe`, a bounded wait for the acquires to start waiting).
//!
//! The functions run under any tokio runtime; `acquire_shares_one_quota`
//! spawns its workers as tasks, which a multi-threaded runtime runs in
//! parallel.

#[cfg(feature = "deny-cache")]
mod deny_cache;

mod acquire;
mod lease;
mod shadow;

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratelimit_core::{
    Clock, Limiter, LimiterBuilder, ManualClock, Micros, Quota, Sleep, Store, Timer,
};

pub use acquire::{
    SharedQuotaRun, acquire_cancel_safe, acquire_paces_one_worker, acquire_shares_one_quota,
};
#[cfg(feature = "deny-cache")]
pub use deny_cache::{
    CachedLimiter, DenyCacheReport, Flaw, FlawedDenyCache, deny_cache_check_can_fail,
    deny_cache_equivalence, deny_cache_equivalence_of, flawed_cache, real_cache,
};
pub use lease::{
    FlawedLeases, LeaseFlaw, LeaseReport, LeasedLimiter, Switch, lease_check_can_fail,
    leased_limiter, leases_follow_their_rules, leases_follow_their_rules_of,
};
pub use shadow::{ShadowReport, shadow_quotas};

use crate::{StoreFactory, SuiteConfig};

/// The start of every check's clock: a whole number of hours since the
/// epoch, so calendar windows of a second, ten seconds or a minute start
/// there.
pub const T0: Micros = 1_800_000_000_000_000;

/// The limiter timeout the checks use: far above any store's own bound, so
/// that a slow machine never turns a store call into a failure-policy
/// decision (the checks treat one as a failure). [`ClockTimer`] sleeps this
/// long, or longer, for real.
pub const LIMITER_TIMEOUT: Duration = Duration::from_secs(60);

/// Which control a [`ControlViolation`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Control {
    /// The deny cache never changes what is admitted.
    DenyCache,
    /// Shadow quotas count but never deny.
    Shadow,
    /// `acquire` waits for a shared quota, within a deadline, cancel-safe.
    Acquire,
    /// While the store cannot answer, leases decide by their rules, within
    /// their bound.
    Lease,
    /// A check's own self-test: it accepted a deliberately wrong control.
    SelfTest,
}

impl fmt::Display for Control {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::DenyCache => "deny cache",
            Self::Shadow => "shadow quotas",
            Self::Acquire => "acquire",
            Self::Lease => "leases",
            Self::SelfTest => "self-test of the checks",
        })
    }
}

/// A control that did not do what it promises on this store: which, and
/// what happened (with the seed, the quotas and the call where it applies).
#[derive(Debug, Clone)]
pub struct ControlViolation {
    /// The control.
    pub control: Control,
    /// What went wrong, and the inputs that show it.
    pub message: String,
}

impl ControlViolation {
    pub(crate) fn new(control: Control, message: impl Into<String>) -> Self {
        Self {
            control,
            message: message.into(),
        }
    }
}

impl fmt::Display for ControlViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} violated: {}", self.control, self.message)
    }
}

impl std::error::Error for ControlViolation {}

/// Runs every check of this module (the deny-cache ones with the feature
/// `deny-cache`) and returns the first violation.
pub async fn run_controls(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), ControlViolation> {
    #[cfg(feature = "deny-cache")]
    {
        deny_cache_check_can_fail(factory, config).await?;
        deny_cache_equivalence(factory, config).await?;
    }
    shadow_quotas(factory).await?;
    lease_check_can_fail(factory, config).await?;
    leases_follow_their_rules(factory, config).await?;
    acquire_paces_one_worker(factory).await?;
    acquire_shares_one_quota(factory, config).await?;
    acquire_cancel_safe(factory).await?;
    Ok(())
}

/// A [`Timer`] for `acquire` on an injected clock: a sleep moves the
/// [`ManualClock`] instead of waiting, in the order real sleeps would end.
///
/// A sleep shorter than [`LIMITER_TIMEOUT`] ends at the instant the clock
/// read when it was asked for, plus its duration (its *target*). The timer
/// runs discrete-event time: a sleep ends (and sets the clock to its
/// target) once it has the earliest target of the sleeps in progress and
/// every live [`Participant`] is asleep; a sleep whose target the clock has
/// already passed ends at once. So workers sharing one clock wake one
/// after another, in order, as they would in real time, and the clock
/// never moves back. Without participants (one worker), each sleep ends at
/// once.
///
/// A sleep of [`LIMITER_TIMEOUT`] or longer is the limiter's store
/// timeout, and is a real tokio sleep: the store's network round trip
/// takes real time.
///
/// [`ClockTimer::hold`] makes the clock's sleeps wait until they are
/// dropped instead, and counts them: a check can then cancel `acquire`s
/// known to be waiting.
#[derive(Debug, Clone)]
pub struct ClockTimer {
    clock: ManualClock,
    state: Arc<TimerState>,
}

#[derive(Debug, Default)]
struct TimerState {
    sched: Mutex<Sched>,
    changed: tokio::sync::Notify,
    hold: AtomicBool,
    held: AtomicU64,
    slept: AtomicU64,
}

#[derive(Debug, Default)]
struct Sched {
    /// Sleeps in progress: (target, id).
    sleeping: BTreeSet<(Micros, u64)>,
    next_id: u64,
    participants: u64,
}

impl TimerState {
    fn sched(&self) -> std::sync::MutexGuard<'_, Sched> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A worker taking part in a [`ClockTimer`]'s discrete-event time (see
/// [`ClockTimer::participant`]): while it lives and is not asleep, no sleep
/// ends. Dropping it (the worker is done) lets the others' sleeps end.
#[derive(Debug)]
pub struct Participant {
    state: Arc<TimerState>,
}

impl Drop for Participant {
    fn drop(&mut self) {
        self.state.sched().participants -= 1;
        self.state.changed.notify_waiters();
    }
}

/// Removes a sleep from the schedule when it ends or is dropped.
struct Registration {
    state: Arc<TimerState>,
    entry: (Micros, u64),
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.state.sched().sleeping.remove(&self.entry);
        self.state.changed.notify_waiters();
    }
}

impl ClockTimer {
    /// A timer over `clock`.
    pub fn new(clock: ManualClock) -> Self {
        Self {
            clock,
            state: Arc::default(),
        }
    }

    /// Registers a worker: until the returned guard is dropped, a sleep
    /// ends only while this worker is asleep too (or its target has passed).
    pub fn participant(&self) -> Participant {
        self.state.sched().participants += 1;
        Participant {
            state: Arc::clone(&self.state),
        }
    }

    /// While `hold` is true, sleeps shorter than [`LIMITER_TIMEOUT`] never
    /// end (they are counted by [`ClockTimer::held`]).
    pub fn hold(&self, hold: bool) {
        self.state.hold.store(hold, Ordering::SeqCst);
    }

    /// How many sleeps have been held so far.
    pub fn held(&self) -> u64 {
        self.state.held.load(Ordering::SeqCst)
    }

    /// How many sleeps have ended so far (each moving the clock to its
    /// target, unless it had passed).
    pub fn slept(&self) -> u64 {
        self.state.slept.load(Ordering::SeqCst)
    }
}

impl Timer for ClockTimer {
    fn sleep(&self, duration: Duration) -> Sleep {
        if duration >= LIMITER_TIMEOUT {
            return Box::pin(tokio::time::sleep(duration));
        }
        let target = self
            .clock
            .now()
            .saturating_add(u64::try_from(duration.as_micros()).unwrap_or(u64::MAX));
        let (clock, state) = (self.clock.clone(), Arc::clone(&self.state));
        Box::pin(async move {
            if state.hold.load(Ordering::SeqCst) {
                state.held.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
            }
            let entry = {
                let mut s = state.sched();
                s.next_id += 1;
                let entry = (target, s.next_id);
                s.sleeping.insert(entry);
                entry
            };
            // One more asleep: the earliest sleeper may now be free to end.
            state.changed.notify_waiters();
            let _registered = Registration {
                state: Arc::clone(&state),
                entry,
            };
            loop {
                let changed = state.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                {
                    let s = state.sched();
                    let first = s.sleeping.first() == Some(&entry);
                    let all_asleep = s.sleeping.len() as u64 >= s.participants;
                    if clock.now() >= target || (first && all_asleep) {
                        if clock.now() < target {
                            clock.set(target);
                        }
                        break;
                    }
                }
                changed.await;
            }
            state.slept.fetch_add(1, Ordering::SeqCst);
        })
    }
}

/// A random namespace, `<base>-<8 hex digits>`, so that a check never meets
/// state another run left on a shared server.
pub(crate) fn namespace(base: &str) -> String {
    format!("{base}-{:08x}", rand::random::<u32>())
}

/// The limiter settings every check uses: `namespace`, the injected clock,
/// [`LIMITER_TIMEOUT`], no circuit breaker, the failure policy fail-open
/// (a failure shows as [`ratelimit_core::Source::FailOpen`], which every
/// check rejects).
pub(crate) fn configure(
    builder: LimiterBuilder,
    quotas: &[Quota],
    shadow: &[bool],
    namespace: &str,
    clock: &ManualClock,
) -> LimiterBuilder {
    let mut b = builder;
    for (i, q) in quotas.iter().enumerate() {
        b = if shadow.get(i).copied().unwrap_or(false) {
            b.shadow_quota(q.clone())
        } else {
            b.quota(q.clone())
        };
    }
    b.namespace(namespace)
        .expect("valid namespace")
        .clock(clock.clone())
        .timeout(LIMITER_TIMEOUT)
        .no_circuit_breaker()
        .failure_policy(ratelimit_core::FailurePolicy::FailOpen)
}

/// One store on `clock` from the factory.
pub(crate) async fn one_store(
    factory: &dyn StoreFactory,
    clock: &ManualClock,
    control: Control,
) -> Result<Arc<dyn Store>, ControlViolation> {
    factory
        .stores(1, Some(clock.clone()))
        .await
        .into_iter()
        .next()
        .ok_or_else(|| ControlViolation::new(control, "the factory returned no store"))
}

/// Builds a limiter, or reports why it could not be built.
pub(crate) fn build(b: LimiterBuilder, control: Control) -> Result<Limiter, ControlViolation> {
    b.build()
        .map_err(|e| ControlViolation::new(control, format!("the limiter was refused: {e}")))
}
