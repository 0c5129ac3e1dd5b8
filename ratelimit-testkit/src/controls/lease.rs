//! Leases over a real store: while the store cannot answer, a caller it
//! answered is decided from that answer by the stated rules, and no window
//! admits more than the stated bound.
//!
//! Two limiters stand for two application instances (`.instances(2)`,
//! fail-closed), each over its own instance of the factory's store behind
//! a switch that makes its store fail (a busy store: a timeout; or an
//! unavailable one) without sending. Random calls (costs 1 to 3) go to
//! either instance while the switches flip at random, so that one instance
//! fails while the other keeps spending through the store (the skew a
//! burst on a busy host makes). The check keeps the documented rules
//! itself, per instance (`ratelimit_core::LimiterBuilder::leases`: the
//! store's remaining divided by the instances, what the lease admitted
//! spent until its reset, renewed by every store answer) and requires,
//! call for call:
//!
//! - a call the store answered: the store's decision (`Source::Store`);
//! - a call it could not answer, for a caller with a live lease: exactly
//!   the rules' decision (`Source::Lease`, admitted or not, its remaining,
//!   its `retry_after` the time to the lease's reset);
//! - for a caller without one: the failure policy when the store is busy
//!   (`Source::FailClosed`), the fallback when it is unavailable
//!   (`Source::Fallback`), never a lease.
//!
//! And, in the replays whose clock stands still (one window for every
//! algorithm): everything admitted, by the store and from leases, is at
//! most `L + (C_end - C_first)` (what the store admitted after the first
//! lease was granted) and at most `L + N × ⌊(L - 1) / N⌋`. Every algorithm,
//! limits of 4 to 30; the other replays move the clock, so leases reset.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ratelimit_core::store::{Answer, Capabilities, Request};
use ratelimit_core::{
    Clock, Decision, FailurePolicy, Limiter, LimiterBuilder, ManualClock, Micros, Quota, Rate,
    Source, Store, StoreError,
};

use super::{Control, ControlViolation, LIMITER_TIMEOUT, T0, namespace};
use crate::{StoreFactory, SuiteConfig};

/// The instances sharing each quota.
const INSTANCES: u32 = 2;

/// Calls per replay.
const CALLS: usize = 400;

/// How a [`Switch`]ed store fails while it is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failing {
    /// Answers: the store is up.
    No,
    /// A timeout: the store is busy.
    Busy,
    /// Unavailable: its node is down.
    Down,
}

/// A store that fails without sending while switched off, and reports that
/// it can fail (not in process), so that the limiter keeps leases for it.
#[derive(Debug)]
pub struct Switch {
    inner: Arc<dyn Store>,
    busy: AtomicBool,
    down: AtomicBool,
}

impl Switch {
    /// `inner`, answering.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            busy: AtomicBool::new(false),
            down: AtomicBool::new(false),
        }
    }

    fn set(&self, failing: Failing) {
        self.busy.store(failing == Failing::Busy, Ordering::SeqCst);
        self.down.store(failing == Failing::Down, Ordering::SeqCst);
    }
}

impl Store for Switch {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        if self.busy.load(Ordering::SeqCst) {
            return Answer::ready(Err(StoreError::Timeout(Duration::from_millis(20))));
        }
        if self.down.load(Ordering::SeqCst) {
            return Answer::ready(Err(StoreError::Unavailable {
                domain: "switch".into(),
                reason: "switched off by the lease check".into(),
            }));
        }
        self.inner.decide(request)
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities().in_process(false)
    }
}

/// Builds the limiter of one instance over its switched store (the real
/// limiter: [`leased_limiter`]; the self-test puts flawed leases in front).
pub type LeasedLimiter = dyn Fn(Arc<Switch>, &ManualClock) -> LimiterBuilder + Send + Sync;

/// The real limiter over `store`.
pub fn leased_limiter() -> Box<LeasedLimiter> {
    Box::new(|store, _clock| Limiter::builder_arc(store))
}

/// What [`leases_follow_their_rules`] replayed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseReport {
    /// Replays run.
    pub replays: u64,
    /// Calls made.
    pub calls: u64,
    /// Calls decided from leases.
    pub leased: u64,
    /// Of those, admitted.
    pub leased_admitted: u64,
    /// The most any still-clock replay admitted beyond its limit.
    pub worst_over: u64,
}

/// The rules' lease of one instance for the one caller of a replay.
#[derive(Debug, Clone, Copy)]
struct RuleLease {
    share: u64,
    spent: u64,
    reset_at: Micros,
}

/// Checks the leases of the real limiter on `factory`'s stores (see the
/// module docs).
pub async fn leases_follow_their_rules(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<LeaseReport, ControlViolation> {
    leases_follow_their_rules_of(factory, config, &*leased_limiter()).await
}

/// [`leases_follow_their_rules`] with each instance's limiter built by
/// `make` (the self-test's flawed leases).
pub async fn leases_follow_their_rules_of(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
    make: &LeasedLimiter,
) -> Result<LeaseReport, ControlViolation> {
    let mut report = LeaseReport::default();
    let mut rng = StdRng::seed_from_u64(config.seed ^ 0x1ea5e);
    let replays = if config.cases >= 256 { 16 } else { 8 };
    for replay in 0..replays {
        let still = replay % 2 == 0;
        let limit = rng.random_range(4..=30u64);
        let window = Duration::from_secs(10);
        let rate = Rate::new(limit, window);
        let quota = match replay / 2 % 4 {
            0 => Quota::fixed_window(rate),
            1 => Quota::sliding_window(rate),
            2 => Quota::sliding_log(rate),
            _ => Quota::token_bucket(rate, limit),
        }
        .map_err(|e| ControlViolation::new(Control::Lease, format!("quota: {e}")))?;
        let what = format!(
            "replay {replay} ({quota:?}, {}, seed {})",
            if still { "clock still" } else { "clock moving" },
            config.seed
        );
        report.replays += 1;
        one_replay(factory, make, &quota, still, &mut rng, &mut report, &what).await?;
    }
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
async fn one_replay(
    factory: &dyn StoreFactory,
    make: &LeasedLimiter,
    quota: &Quota,
    still: bool,
    rng: &mut StdRng,
    report: &mut LeaseReport,
    what: &str,
) -> Result<(), ControlViolation> {
    let fail = |m: String| {
        Err(ControlViolation::new(
            Control::Lease,
            format!("{what}: {m}"),
        ))
    };
    let clock = ManualClock::new(T0);
    let ns = namespace("lease");
    let stores = factory
        .stores(INSTANCES as usize, Some(clock.clone()))
        .await;
    let mut switches = Vec::new();
    let mut limiters = Vec::new();
    for store in stores {
        let switch = Arc::new(Switch::new(store));
        let limiter = make(Arc::clone(&switch), &clock)
            .quota(quota.clone())
            .namespace(&ns)
            .expect("valid namespace")
            .clock(clock.clone())
            .timeout(LIMITER_TIMEOUT)
            .no_circuit_breaker()
            .instances(INSTANCES)
            .failure_policy(FailurePolicy::FailClosed)
            .build()
            .map_err(|e| {
                ControlViolation::new(Control::Lease, format!("the limiter was refused: {e}"))
            })?;
        switches.push(switch);
        limiters.push(limiter);
    }
    if limiters.len() != INSTANCES as usize {
        return fail("the factory returned too few stores".into());
    }
    let limit = quota.limit();
    let mut states: Vec<Failing> = vec![Failing::No; limiters.len()];
    let mut leases: Vec<Option<RuleLease>> = vec![None; limiters.len()];
    // In a still replay: what the store admitted, what leases and the
    // fallback admitted, and what the store had admitted when the first
    // lease was granted.
    let (mut by_store, mut by_lease, mut by_fallback) = (0u64, 0u64, 0u64);
    let mut first = None::<u64>;
    let caller = "leased-caller";
    for call in 0..CALLS {
        let i = rng.random_range(0..limiters.len());
        if rng.random_bool(0.15) {
            states[i] = match rng.random_range(0..4) {
                0 | 1 => Failing::No,
                2 => Failing::Busy,
                _ => Failing::Down,
            };
            switches[i].set(states[i]);
        }
        if !still && rng.random_bool(0.05) {
            clock.advance(Duration::from_millis(rng.random_range(1..=4_000)));
        }
        let cost = rng.random_range(1..=limit.min(3));
        let now = clock.now();
        let d = match limiters[i].check_n(caller, cost).await {
            Ok(d) => d,
            Err(e) => return fail(format!("call {call}: {e}")),
        };
        report.calls += 1;
        let here = format!(
            "call {call} (instance {i}, cost {cost}, store {:?})",
            states[i]
        );
        match states[i] {
            Failing::No => {
                if d.source != Source::Store {
                    return fail(format!(
                        "{here}: an answering store, decided by {:?}",
                        d.source
                    ));
                }
                if d.allowed {
                    by_store += cost;
                }
                let mut renewed = RuleLease {
                    share: d.remaining / u64::from(INSTANCES),
                    spent: 0,
                    reset_at: now + micros(d.reset_after),
                };
                if let Some(old) = leases[i].filter(|l| now < l.reset_at) {
                    renewed.spent = old.spent;
                    renewed.reset_at = renewed.reset_at.max(old.reset_at);
                }
                leases[i] = Some(renewed);
                first.get_or_insert(by_store);
            }
            failing => {
                let live = leases[i].filter(|l| now < l.reset_at);
                let Some(mut lease) = live else {
                    let expected = if failing == Failing::Busy {
                        Source::FailClosed
                    } else {
                        Source::Fallback
                    };
                    if d.source != expected {
                        return fail(format!(
                            "{here}: a caller with no live lease, decided by {:?} (expected {expected:?})",
                            d.source
                        ));
                    }
                    if d.source == Source::Fallback && d.allowed {
                        // The fallback's own admissions (L / N per
                        // instance, checked elsewhere): added to the bound.
                        by_fallback += cost;
                    }
                    continue;
                };
                report.leased += 1;
                let admit = lease.spent + cost <= lease.share;
                if admit {
                    lease.spent += cost;
                }
                let expected = Decision {
                    allowed: admit,
                    limit,
                    remaining: lease.share - lease.spent.min(lease.share),
                    reset_after: Duration::from_micros(lease.reset_at - now),
                    retry_after: (!admit).then(|| Duration::from_micros(lease.reset_at - now)),
                    source: Source::Lease,
                };
                if d != expected {
                    return fail(format!(
                        "{here}: decided {d:?} from a lease where the rules give {expected:?} \
                         (the lease: {lease:?}, at {now})"
                    ));
                }
                leases[i] = Some(lease);
                if admit {
                    report.leased_admitted += 1;
                    by_lease += cost;
                }
            }
        }
    }
    if still && let Some(first) = first {
        let admitted = by_store + by_lease + by_fallback;
        let over = admitted.saturating_sub(limit);
        let n = u64::from(INSTANCES);
        let bound = (by_store - first).min(n * ((limit - 1) / n));
        report.worst_over = report.worst_over.max(over.saturating_sub(by_fallback));
        if over > bound + by_fallback {
            return fail(format!(
                "{admitted} admitted for a limit of {limit} ({by_store} by the store, {by_lease} \
                 from leases, {by_fallback} by the fallback), {over} beyond it: the leases' \
                 bound is {bound} (what the store admitted after the first lease, at most \
                 N x floor((L - 1) / N)), plus the fallback's admissions"
            ));
        }
    }
    Ok(())
}

fn micros(d: Duration) -> Micros {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A way for leases to be wrong, for the check's own self-test
/// ([`lease_check_can_fail`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseFlaw {
    /// A store answer starts the lease afresh, forgetting what it had
    /// admitted: answers between failures hand the same budget out again.
    ForgetsWhatItSpent,
    /// Every instance may spend the whole remaining, not its share.
    IgnoresTheInstances,
    /// A lease outlives its reset by a second.
    OutlivesItsReset,
    /// A caller the store never answered is admitted from a lease made up
    /// of the limit divided by the instances.
    LeasesUnknownCallers,
}

impl LeaseFlaw {
    /// Every flaw.
    pub const ALL: [LeaseFlaw; 4] = [
        Self::ForgetsWhatItSpent,
        Self::IgnoresTheInstances,
        Self::OutlivesItsReset,
        Self::LeasesUnknownCallers,
    ];
}

/// Leases with a flaw, kept in front of the switched store: they answer
/// (marked [`Source::Lease`]) while it fails.
#[derive(Debug)]
pub struct FlawedLeases {
    inner: Arc<Switch>,
    clock: ManualClock,
    flaw: LeaseFlaw,
    leases: std::sync::Mutex<std::collections::HashMap<Vec<u8>, RuleLease>>,
}

impl FlawedLeases {
    /// Flawed leases over `inner`, reading "now" from `clock`.
    pub fn new(inner: Arc<Switch>, clock: ManualClock, flaw: LeaseFlaw) -> Self {
        Self {
            inner,
            clock,
            flaw,
            leases: std::sync::Mutex::default(),
        }
    }
}

impl Store for FlawedLeases {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        Answer::pending(async move {
            let now = self.clock.now();
            let result = self.inner.decide(request).await;
            let Some(charge) = request.charges.first() else {
                return result;
            };
            let key = request.key.to_vec();
            let n = u64::from(INSTANCES);
            let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
            let e = match result {
                Ok(decisions) => {
                    if let Some(d) = decisions.first() {
                        let share = match self.flaw {
                            LeaseFlaw::IgnoresTheInstances => d.remaining,
                            _ => d.remaining / n,
                        };
                        let mut renewed = RuleLease {
                            share,
                            spent: 0,
                            reset_at: now + micros(d.reset_after),
                        };
                        if let Some(old) = leases.get(&key).filter(|l| now < l.reset_at)
                            && self.flaw != LeaseFlaw::ForgetsWhatItSpent
                        {
                            renewed.spent = old.spent;
                            renewed.reset_at = renewed.reset_at.max(old.reset_at);
                        }
                        leases.insert(key, renewed);
                    }
                    return Ok(decisions);
                }
                Err(e) => e,
            };
            let grace = if self.flaw == LeaseFlaw::OutlivesItsReset {
                1_000_000
            } else {
                0
            };
            let unknown = RuleLease {
                share: charge.quota.limit() / n,
                spent: 0,
                reset_at: now + 10_000_000,
            };
            let lease = match leases.get_mut(&key) {
                Some(l) if now < l.reset_at + grace => l,
                None if self.flaw == LeaseFlaw::LeasesUnknownCallers => {
                    leases.entry(key).or_insert(unknown)
                }
                _ => return Err(e),
            };
            let admit = lease.spent + charge.cost <= lease.share;
            if admit {
                lease.spent += charge.cost;
            }
            let left = Duration::from_micros(lease.reset_at.saturating_sub(now));
            Ok(vec![Decision {
                allowed: admit,
                limit: charge.quota.limit(),
                remaining: lease.share - lease.spent.min(lease.share),
                reset_after: left,
                retry_after: (!admit).then_some(left),
                source: Source::Lease,
            }]
            .into())
        })
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

/// Runs [`leases_follow_their_rules_of`] once per [`LeaseFlaw`], with that
/// flaw's leases in front of each instance's store, and returns why each
/// was rejected; a flaw the check accepts is a violation of
/// [`Control::SelfTest`].
pub async fn lease_check_can_fail(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<Vec<(LeaseFlaw, String)>, ControlViolation> {
    let mut rejected = Vec::new();
    for flaw in LeaseFlaw::ALL {
        let make = move |store: Arc<Switch>, clock: &ManualClock| {
            Limiter::builder(FlawedLeases::new(store, clock.clone(), flaw)).no_leases()
        };
        match leases_follow_their_rules_of(factory, config, &make).await {
            Err(v) if v.control == Control::Lease => rejected.push((flaw, v.message)),
            Err(v) => return Err(v),
            Ok(report) => {
                return Err(ControlViolation::new(
                    Control::SelfTest,
                    format!("the lease check accepted leases that {flaw:?}: {report:?}"),
                ));
            }
        }
    }
    Ok(rejected)
}
