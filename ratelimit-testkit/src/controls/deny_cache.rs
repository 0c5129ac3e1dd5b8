//! The deny cache never changes what is admitted (feature `deny-cache`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratelimit_core::store::{Answer, Capabilities, Decisions, Request};
use ratelimit_core::{
    Clock, Decision, DenyCache, Limiter, LimiterBuilder, ManualClock, Micros, Quota, Rate, Source,
    Store, Verdict,
};

use super::{Control, ControlViolation, T0, build, configure, namespace, one_store};
use crate::{StoreFactory, SuiteConfig};

/// How the cached side of [`deny_cache_equivalence_of`] is built: from the
/// store (already counting its calls) and the check's clock, a builder
/// with the cache under test. The check adds the quotas, the namespace, the
/// clock and the timeout.
pub type CachedLimiter = dyn Fn(Arc<dyn Store>, &ManualClock) -> LimiterBuilder + Send + Sync;

/// The real deny cache: `Limiter::builder_arc(store).deny_cache(DenyCache::new(1_000))`.
pub fn real_cache() -> Box<CachedLimiter> {
    Box::new(|store, _clock| Limiter::builder_arc(store).deny_cache(DenyCache::new(1_000)))
}

/// A limiter over a [`FlawedDenyCache`] with `flaw` in front of the store
/// (and no real deny cache).
pub fn flawed_cache(flaw: Flaw) -> Box<CachedLimiter> {
    Box::new(move |store, clock| {
        Limiter::builder_arc(Arc::new(FlawedDenyCache::new(store, clock.clone(), flaw)))
    })
}

/// What [`deny_cache_equivalence`] replayed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DenyCacheReport {
    /// Replays run (each with its own quotas, clock and keyspace).
    pub replays: u64,
    /// Calls made through each of the two limiters.
    pub calls: u64,
    /// Calls admitted (the same by both limiters).
    pub admitted: u64,
    /// Calls denied (the same by both limiters).
    pub denied: u64,
    /// Denials the cached limiter answered from its cache: the store calls
    /// it saved.
    pub cache_hits: u64,
}

/// Calls per replay.
const CALLS: usize = 600;

/// The window of every quota in the replays.
const WINDOW: Duration = Duration::from_secs(10);

/// Replays per algorithm: a sixteenth of the suite's cases, at least 2
/// (the network preset: 4, the in-process one: 64).
fn seeds(config: &SuiteConfig) -> u64 {
    u64::from(config.cases / 16).max(2)
}

fn all_algorithms(limit: u64, burst: u64) -> [Quota; 4] {
    let rate = Rate::new(limit, WINDOW);
    let named = |q: Result<Quota, _>, name: &str| {
        q.and_then(|q: Quota| q.named(name))
            .expect("valid replay quota")
    };
    [
        named(Quota::fixed_window(rate), "fw"),
        named(Quota::sliding_window(rate), "sw"),
        named(Quota::sliding_log(rate), "sl"),
        named(Quota::token_bucket(rate, burst), "tb"),
    ]
}

/// The deny cache never changes what is admitted, on this store: the real
/// [`DenyCache`] (`deny_cache_equivalence_of(factory, config, &*real_cache())`).
///
/// Per seed (a sixteenth of `config.cases`, at least 2; seeds follow
/// `config.seed`): each algorithm alone (limit 5-11 per 10 s, bucket burst
/// 3-7), two quotas of different algorithms, and all four (the last one in
/// shadow mode for odd seeds), each replay 600 calls over 3 callers, the
/// clock standing still for 60 % of the calls and moving up to 0.2 s or
/// 5 s otherwise, a third of the costs drawn from 1 to the quota's limit
/// (each quota its own cost, through `check_costs`). See
/// [`deny_cache_equivalence_of`] for what is compared. Also fails when the
/// cache answered fewer than a quarter of the denials over the whole run
/// (it would be checking nothing).
pub async fn deny_cache_equivalence(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<DenyCacheReport, ControlViolation> {
    let report = deny_cache_equivalence_of(factory, config, &*real_cache()).await?;
    if report.cache_hits * 4 < report.denied {
        return Err(ControlViolation::new(
            Control::DenyCache,
            format!(
                "the cache answered only {} of {} denials: the replays checked too little \
                 ({report:?})",
                report.cache_hits, report.denied
            ),
        ));
    }
    Ok(report)
}

/// The equivalence check of [`deny_cache_equivalence`] for any cache:
/// `cached` builds the cached limiter (see [`real_cache`], [`flawed_cache`]).
///
/// Each replay takes one store from the factory on a fresh [`ManualClock`]
/// (from [`T0`]) and puts two limiters in front of it, each counting its
/// store calls and each in its own namespace (so its own keys): one plain,
/// one built by `cached`. Every call goes to both, at the same instant.
/// Fails on the first call where
///
/// - the two admit differently (the cache denied a call the store admits);
/// - a decision is not the store's (a failure-policy answer: the store
///   failed), or the plain limiter answers from a cache;
/// - the cached limiter's verdict came from the store but differs from the
///   plain one in any field of any quota (the two keyspaces saw different
///   traffic);
/// - a cached denial has no `retry_after` or a longer one than the store's
///   exact answer;
///
/// and after a replay when the store calls the cache saved differ from its
/// cache hits, or the traffic was all admitted or all denied.
pub async fn deny_cache_equivalence_of(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
    cached: &CachedLimiter,
) -> Result<DenyCacheReport, ControlViolation> {
    let mut report = DenyCacheReport::default();
    for i in 0..seeds(config) {
        let seed = config.seed.wrapping_add(i);
        let qs = all_algorithms(5 + seed % 7, 3 + seed % 5);
        for q in &qs {
            replay(
                factory,
                cached,
                std::slice::from_ref(q),
                &[false],
                seed,
                &mut report,
            )
            .await?;
        }
        let qs = all_algorithms(8, 4);
        let pair = [
            qs[(seed % 4) as usize].clone(),
            qs[((seed + 1) % 4) as usize].clone(),
        ];
        replay(factory, cached, &pair, &[false, false], seed, &mut report).await?;
        let shadow = [false, false, false, seed % 2 == 1];
        replay(factory, cached, &qs, &shadow, seed, &mut report).await?;
    }
    Ok(report)
}

fn describe(quotas: &[Quota], shadow: &[bool], seed: u64) -> String {
    let qs: Vec<String> = quotas
        .iter()
        .zip(shadow)
        .map(|(q, s)| {
            format!(
                "{} {} {} per {:?}{}",
                q.name(),
                q.kind(),
                q.limit(),
                q.window(),
                if *s { " (shadow)" } else { "" }
            )
        })
        .collect();
    format!("seed {seed}, quotas [{}]", qs.join(", "))
}

async fn replay(
    factory: &dyn StoreFactory,
    cached: &CachedLimiter,
    quotas: &[Quota],
    shadow: &[bool],
    seed: u64,
    report: &mut DenyCacheReport,
) -> Result<(), ControlViolation> {
    let fail = |msg: String| {
        ControlViolation::new(
            Control::DenyCache,
            format!("{msg}\n  ({})", describe(quotas, shadow, seed)),
        )
    };
    let clock = ManualClock::new(T0);
    let store = one_store(factory, &clock, Control::DenyCache).await?;
    let plain_store = Arc::new(Counted::new(Arc::clone(&store)));
    let cached_store = Arc::new(Counted::new(store));
    let plain = build(
        configure(
            Limiter::builder_arc(plain_store.clone()),
            quotas,
            shadow,
            &namespace("plain"),
            &clock,
        ),
        Control::DenyCache,
    )?;
    let with_cache = build(
        configure(
            cached(cached_store.clone(), &clock),
            quotas,
            shadow,
            &namespace("cached"),
            &clock,
        ),
        Control::DenyCache,
    )?;
    let mut rng = Rng::new(seed);
    let (mut admitted, mut denied) = (0u64, 0u64);
    for i in 0..CALLS {
        clock.advance(Duration::from_micros(match rng.below(10) {
            0..=5 => 0,
            6..=8 => rng.below(200_000),
            _ => rng.below(5_000_000),
        }));
        let caller = format!("c{}", rng.below(3));
        let costs: Vec<u64> = quotas
            .iter()
            .map(|q| {
                if rng.below(3) == 0 {
                    1 + rng.below(q.limit())
                } else {
                    1
                }
            })
            .collect();
        let at = clock.now() - T0;
        let call = format!("call #{i} at T0 + {at} µs, caller {caller}, costs {costs:?}");
        let a = plain
            .check_costs(&caller, &costs)
            .await
            .map_err(|e| fail(format!("{call}: the plain limiter refused the costs: {e}")))?;
        let b = with_cache
            .check_costs(&caller, &costs)
            .await
            .map_err(|e| fail(format!("{call}: the cached limiter refused the costs: {e}")))?;
        check_call(&a, &b).map_err(|m| {
            fail(format!(
                "{call}: {m}\n  without the cache: {a:?}\n  with the cache:    {b:?}"
            ))
        })?;
        if a.allowed() {
            admitted += 1;
        } else {
            denied += 1;
        }
    }
    let hits = with_cache.stats().cache_hits;
    let saved = plain_store.calls().saturating_sub(cached_store.calls());
    if plain_store.calls() < cached_store.calls() || saved != hits {
        return Err(fail(format!(
            "store calls saved by the cache ({} without it, {} with it) differ from its cache \
             hits ({hits})",
            plain_store.calls(),
            cached_store.calls()
        )));
    }
    if plain.stats().cache_hits != 0 {
        return Err(fail(
            "the limiter without a cache reported cache hits".into(),
        ));
    }
    if admitted == 0 || denied == 0 {
        return Err(fail(format!(
            "the traffic did not reach the limits: {admitted} admitted, {denied} denied"
        )));
    }
    report.replays += 1;
    report.calls += CALLS as u64;
    report.admitted += admitted;
    report.denied += denied;
    report.cache_hits += hits;
    Ok(())
}

/// Compares one call's verdicts: `a` without the cache, `b` with it.
fn check_call(a: &Verdict, b: &Verdict) -> Result<(), String> {
    let from_store = |s: Source| matches!(s, Source::Store | Source::Shadow);
    if !from_store(a.decision.source) {
        return Err(format!(
            "the limiter without a cache answered with source {:?}: the store failed or the \
             limiter has a cache",
            a.decision.source
        ));
    }
    if !from_store(b.decision.source) && b.decision.source != Source::Cache {
        return Err(format!(
            "the cached limiter answered with source {:?}: the store failed",
            b.decision.source
        ));
    }
    if a.allowed() != b.allowed() {
        return Err(format!(
            "admitted differently: {} without the cache, {} with it",
            verb(a.allowed()),
            verb(b.allowed())
        ));
    }
    if b.decision.source == Source::Cache {
        match (b.decision.retry_after, a.decision.retry_after) {
            (Some(cached), Some(exact)) if cached <= exact => {}
            (cached, exact) => {
                return Err(format!(
                    "a cached denial's retry_after ({cached:?}) is missing or longer than the \
                     store's exact one ({exact:?})"
                ));
            }
        }
    } else if a != b {
        return Err("the store's decisions differ between the two keyspaces".into());
    }
    Ok(())
}

fn verb(allowed: bool) -> &'static str {
    if allowed { "admitted" } else { "denied" }
}

/// A deliberately wrong deny cache, for [`deny_cache_check_can_fail`]: one
/// flaw per part of the equivalence check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flaw {
    /// Keeps denying for twice the store's `retry_after` (reporting the
    /// exact wait, then zero): denies calls the store would admit. Caught as
    /// "admitted differently".
    RemembersTooLong,
    /// Answers calls of any cost from a denial, smaller costs included (a
    /// bucket short of 5 tokens may still have 1). Caught as "admitted
    /// differently", or by the `retry_after` of a smaller cost.
    IgnoresCost,
    /// Denies exactly the right calls, but reports a `retry_after` 1 ms
    /// longer than the exact wait. Caught by the `retry_after` comparison.
    LongerRetryAfter,
    /// Answers exactly right, but still sends each call it answers to the
    /// store (which denies it and writes nothing): saves no round trip.
    /// Caught by "store calls saved differ from its cache hits".
    StillCallsTheStore,
}

impl Flaw {
    /// Every flaw.
    pub const ALL: [Flaw; 4] = [
        Self::RemembersTooLong,
        Self::IgnoresCost,
        Self::LongerRetryAfter,
        Self::StillCallsTheStore,
    ];

    /// The parts of the check that may reject this flaw (as the violation
    /// says them).
    fn caught_by(self) -> &'static [&'static str] {
        match self {
            Self::RemembersTooLong => &["admitted differently"],
            Self::IgnoresCost => &["admitted differently", "retry_after"],
            Self::LongerRetryAfter => &["retry_after"],
            Self::StillCallsTheStore => &["store calls saved"],
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    cost: u64,
    /// When the store's denial ends.
    exact: Micros,
    /// Until when this cache denies.
    until: Micros,
}

/// A store wrapper that acts as a deny cache with one [`Flaw`]: it answers
/// calls from the denials it has seen (with [`Source::Cache`], which the
/// limiter counts as cache hits), and passes the rest to the store.
#[derive(Debug)]
pub struct FlawedDenyCache {
    inner: Arc<dyn Store>,
    clock: ManualClock,
    flaw: Flaw,
    entries: Mutex<HashMap<(Vec<u8>, Quota), Entry>>,
}

impl FlawedDenyCache {
    /// A cache with `flaw` in front of `inner`, reading "now" from `clock`.
    pub fn new(inner: Arc<dyn Store>, clock: ManualClock, flaw: Flaw) -> Self {
        Self {
            inner,
            clock,
            flaw,
            entries: Mutex::default(),
        }
    }

    fn cached(&self, key: &[u8], quota: &Quota, cost: u64, now: Micros) -> Option<Decision> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let e = entries.get(&(key.to_vec(), quota.clone()))?;
        let covers = cost >= e.cost || self.flaw == Flaw::IgnoresCost;
        if !covers || now >= e.until {
            return None;
        }
        let retry = match self.flaw {
            Flaw::LongerRetryAfter => e.until - now + 1_000,
            _ => e.exact.saturating_sub(now),
        };
        Some(Decision {
            allowed: false,
            limit: quota.limit(),
            remaining: 0,
            reset_after: Duration::ZERO,
            retry_after: Some(Duration::from_micros(retry)),
            source: Source::Cache,
        })
    }

    fn remember(&self, key: &[u8], quota: &Quota, cost: u64, d: &Decision, now: Micros) {
        let Some(retry) = d.retry_after.filter(|_| !d.allowed) else {
            return;
        };
        let retry = u64::try_from(retry.as_micros()).unwrap_or(u64::MAX);
        let held = if self.flaw == Flaw::RemembersTooLong {
            retry.saturating_mul(2)
        } else {
            retry
        };
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.insert(
            (key.to_vec(), quota.clone()),
            Entry {
                cost,
                exact: now.saturating_add(retry),
                until: now.saturating_add(held),
            },
        );
    }
}

impl FlawedDenyCache {
    async fn answer(&self, request: Request<'_>) -> ratelimit_core::Result<Decisions> {
        let now = self.clock.now();
        let (key, charges) = (request.key, request.charges);
        let hit = charges.iter().enumerate().find_map(|(i, c)| {
            (!c.shadow)
                .then(|| self.cached(key, c.quota, c.cost, now))
                .flatten()
                .map(|d| (i, d))
        });
        if let Some((i, d)) = hit {
            if self.flaw == Flaw::StillCallsTheStore {
                self.inner.decide(request).await?;
            }
            return Ok(charges
                .iter()
                .enumerate()
                .map(|(j, c)| {
                    if j == i {
                        d.clone()
                    } else {
                        Decision {
                            source: Source::Cache,
                            ..Decision::from_policy(true, c.quota.limit())
                        }
                    }
                })
                .collect());
        }
        let ds = self.inner.decide(request).await?;
        for (c, d) in charges.iter().zip(ds.iter()) {
            if !c.shadow {
                self.remember(key, c.quota, c.cost, d, now);
            }
        }
        Ok(ds)
    }
}

impl Store for FlawedDenyCache {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        Answer::pending(self.answer(request))
    }

    fn capabilities(&self) -> Capabilities {
        // It answers through a future, whatever the inner store does.
        self.inner.capabilities().in_process(false)
    }
}

/// The equivalence check can fail on this store: it rejects a limiter over
/// a [`FlawedDenyCache`] for each [`Flaw`] (each run stops at its first
/// violation, so this costs a few hundred calls), each by the part of the
/// check meant to catch it. Returns each flaw with the violation that
/// rejected it; the error is the first flaw that was accepted (a
/// [`Control::SelfTest`] violation) or rejected for another reason.
pub async fn deny_cache_check_can_fail(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<Vec<(Flaw, ControlViolation)>, ControlViolation> {
    let mut rejected = Vec::new();
    for flaw in Flaw::ALL {
        match deny_cache_equivalence_of(factory, config, &*flawed_cache(flaw)).await {
            Err(v)
                if v.control == Control::DenyCache
                    && flaw.caught_by().iter().any(|m| v.message.contains(m)) =>
            {
                rejected.push((flaw, v));
            }
            Err(v) => {
                return Err(ControlViolation::new(
                    Control::SelfTest,
                    format!(
                        "the deny-cache check rejected the flaw {flaw:?}, but not by the part \
                         meant to catch it ({:?}): {v}",
                        flaw.caught_by()
                    ),
                ));
            }
            Ok(report) => {
                return Err(ControlViolation::new(
                    Control::SelfTest,
                    format!(
                        "the deny-cache check accepted a cache with the flaw {flaw:?}: {report:?}"
                    ),
                ));
            }
        }
    }
    Ok(rejected)
}

/// A store that counts the calls that reach it (one per decision, whatever
/// the number of quotas), forwarding every call, the caller's deadline
/// included.
#[derive(Debug)]
pub(crate) struct Counted {
    inner: Arc<dyn Store>,
    calls: AtomicU64,
}

impl Counted {
    pub(crate) fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            calls: AtomicU64::new(0),
        }
    }

    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

/// A wrapper forwards the one door, and so everything (keys, charges,
/// deadline).
impl Store for Counted {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.decide(request)
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

/// A tiny deterministic generator (xorshift64) for replayed traffic.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        // Spread small seeds, never zero.
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
