//! Deliberately wrong stores: the suite must prove it can fail.
//!
//! A [`WrongStore`] is the core model behind the one door with one
//! [`Flaw`]; [`WrongFactory`] hands out its instances (sharing one map, or
//! not, as the flaw says). `ratelimit-testkit`'s own tests run the suite on
//! every flaw and check that it is rejected by the contract that names it;
//! run them against your own suite changes, or use them to see what a
//! violation report looks like.
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread")]
//! # async fn main() {
//! use ratelimit_testkit::conformance::{self, Contract, SuiteConfig};
//! use ratelimit_testkit::wrong::{Flaw, WrongFactory};
//!
//! let config = SuiteConfig { cases: 64, ..SuiteConfig::in_process() };
//! let v = conformance::quotas_atomic(&WrongFactory(Flaw::SetsApart), &config)
//!     .await
//!     .expect_err("sets kept apart from single quotas are rejected");
//! assert_eq!(v.contract, Contract::Atomicity);
//! # }
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use ratelimit_core::model::{self, Charge, State};
use ratelimit_core::store::{Answer, Capabilities, Decisions, Request};
use ratelimit_core::{
    Algorithm, Clock, Decision, ManualClock, Micros, Quota, Rate, Result, Source, Store,
    StoreError, SystemClock,
};

use crate::conformance::StoreFactory;

/// One class of mistake: what a [`WrongStore`] gets wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Flaw {
    /// None: the control.
    None,
    /// Each instance keeps its own map (the factory's instances share nothing).
    PerInstanceState,
    /// Each instance caches the state it read or wrote, and reads its cache first.
    InstanceCache,
    /// One call in 64 reads, waits 100 µs, then writes: a lost update.
    Racy,
    /// The policy name is left out of the key: policies of one algorithm share state.
    PolicyIgnored,
    /// The key joins `caller "." policy`: ("a", "b.c") and ("a.b", "c") meet.
    SeparatorCollision,
    /// For limits above 1,000 every call counts as cost 1.
    CostIgnoredAboveLimit,
    /// Windows longer than a day are taken as one day.
    WrongOverADay,
    /// A fixed window that denies the call that would use the last unit.
    FixedWindowOverDenies,
    /// A sliding window counter that forgets the previous window at `elapsed = 0`.
    SlidingWindowElapsedZero,
    /// A sliding log that drops entries one microsecond before they leave.
    SlidingLogEvictsEarly,
    /// A token bucket refilling 1 % fast.
    TokenBucketFast,
    /// State forgotten one microsecond before its TTL runs out.
    ExpiresEarly,
    /// `retry_after` one microsecond short.
    RetryShort,
    /// Store denials reported as fail-closed policy decisions.
    SourceMisreported,
    /// After 700 calls on one key, decides by a clock 1 µs behind.
    DriftsAfterMany,
    /// A fixed window posing as a sliding log.
    FixedWindowAsLog,
    /// Forgets a key's state every fourth call.
    Forgetful,
    /// Rounds retry_after up to whole milliseconds.
    SloppyRetry,
    /// Keys go through a lossy UTF-8 conversion and are cut at 64 bytes.
    LeakyKeys,
    /// Several quotas one after another, stopping at the first denial: the
    /// quotas before it count the call, and only their decisions come back.
    NonAtomicDefault,
    /// Several quotas: the ones before a denying quota count the denied call.
    ChargesEarlierQuotas,
    /// Right without a deadline, wrong with one (every call counts as cost
    /// 1): a path the limiter takes (it always sends its timeout) and a
    /// suite calling without deadlines would never see.
    WrongWithDeadline,
    /// Several quotas with a deadline: the ones before a denying quota
    /// count the denied call (right without a deadline).
    WrongSetsWithDeadline,
    /// Several quotas kept in a keyspace apart from the same quotas checked
    /// alone: a user checking `api` alone on one route and `api` + `daily`
    /// on another gets two budgets.
    SetsApart,
    /// Several quotas read under one lock and written under another, a
    /// moment later: a lost update when requests on one key race.
    RacySets,
    /// Carries out a request whose deadline has passed, and counts it.
    IgnoresDeadline,
    /// Carries out a request whose deadline has passed, counts it, then
    /// answers `StoreError::Expired`, as if it had counted nothing.
    CountsThenExpires,
    /// Counts nothing for a request whose deadline has passed, but answers
    /// `StoreError::Timeout` (the request may have run) instead of
    /// `StoreError::Expired` (it did not).
    TimeoutPastDeadline,
    /// Reports that it answers in process, then answers through a future.
    PendingDespiteInProcess,
    /// Reports that it bounds its calls by the request's deadline
    /// (`Capabilities::bounded`: the limiter then arms no timer), then
    /// never answers a request whose deadline has passed.
    HangsDespiteBounded,
    /// Right with a deadline, wrong without one (every call counts as cost
    /// 1): what the `StoreExt` shorthands send, and a suite that always
    /// sends a deadline would never see.
    WrongWithoutDeadline,
    /// Refuses a request `Request::check` refuses, but first counts the
    /// charges in it that are valid on their own (each quota once).
    CountsRefused,
    /// Full (at its reported bound on callers), forgets the caller written
    /// longest ago to make room for a new one, instead of refusing the new
    /// caller: a caller over its limit is then let in again.
    ForgetsToMakeRoom,
    /// A request of cost above 1 is decided optimistically (read, decide,
    /// write back if nothing changed in between, as a compare-and-swap);
    /// on a conflict the retry charges cost 1. Answers ready.
    CostLostOnRetry,
    /// [`Flaw::CostLostOnRetry`], answering through a future (pending, as a
    /// network store does).
    PendingCostLostOnRetry,
}

/// The bound on entries (caller and quota) every [`WrongStore`] reports
/// ([`Capabilities::max_callers`]) and keeps: when full, a new entry is
/// refused ([`StoreError::Unavailable`]), except under
/// [`Flaw::ForgetsToMakeRoom`].
pub const WRONG_MAX_CALLERS: usize = 1024;

#[derive(Debug, Clone)]
struct Entry {
    state: State,
    calls: u64,
    written: Micros,
    expires: Micros,
}

type Map = Arc<Mutex<HashMap<Vec<u8>, Entry>>>;

/// The core model behind [`Store::decide`], with one [`Flaw`], keeping at
/// most [`WRONG_MAX_CALLERS`] entries (and reporting it).
#[derive(Debug)]
pub struct WrongStore {
    flaw: Flaw,
    clock: Arc<dyn Clock>,
    map: Map,
    cache: Mutex<HashMap<Vec<u8>, Entry>>,
    calls: AtomicU64,
}

fn lock(map: &Map) -> MutexGuard<'_, HashMap<Vec<u8>, Entry>> {
    map.lock().unwrap_or_else(|p| p.into_inner())
}

impl WrongStore {
    /// A store with `flaw` over its own map, on `clock`.
    pub fn new(flaw: Flaw, clock: Arc<dyn Clock>) -> Self {
        Self::sharing(flaw, clock, Arc::default())
    }

    fn sharing(flaw: Flaw, clock: Arc<dyn Clock>, map: Map) -> Self {
        Self {
            flaw,
            clock,
            map,
            cache: Mutex::default(),
            calls: AtomicU64::new(0),
        }
    }

    /// The flaw.
    pub fn flaw(&self) -> Flaw {
        self.flaw
    }

    fn map_key(&self, key: &[u8], quota: &Quota) -> Vec<u8> {
        let (name, code) = (quota.name().as_bytes(), quota.kind().code().as_bytes());
        match self.flaw {
            Flaw::PolicyIgnored => [code, &[0xFF], key].concat(),
            Flaw::SeparatorCollision => [key, b".", name, b"|", code].concat(),
            Flaw::LeakyKeys => {
                let lossy = String::from_utf8_lossy(key).into_owned().into_bytes();
                [name, &[0xFF], code, &[0xFF], &lossy[..lossy.len().min(64)]].concat()
            }
            _ => [name, &[0xFF], code, &[0xFF], key].concat(),
        }
    }

    /// The quota and cost the flawed store actually decides with.
    fn effective(&self, quota: &Quota, cost: u64) -> (Quota, u64) {
        let window = |q: &Quota| Duration::from_micros(q.window().as_micros() as u64);
        match (self.flaw, quota.algorithm()) {
            (Flaw::FixedWindowAsLog, Algorithm::SlidingLog(w)) => (
                Quota::fixed_window(Rate::new(w.limit(), window(quota)))
                    .unwrap_or_else(|_| quota.clone()),
                cost,
            ),
            (Flaw::TokenBucketFast, Algorithm::TokenBucket(b)) => {
                let r = b.rate();
                let fast = Rate::new(r.count() * 101, r.period() * 100);
                (
                    Quota::token_bucket(fast, b.capacity())
                        .and_then(|q| q.named(quota.name()))
                        .unwrap_or_else(|_| quota.clone()),
                    cost,
                )
            }
            (Flaw::WrongOverADay, Algorithm::FixedWindow(w) | Algorithm::SlidingWindow(w))
                if w.window_micros() > 86_400_000_000 =>
            {
                let rate = Rate::new(w.limit(), Duration::from_secs(86_400));
                let q = if quota.kind() == ratelimit_core::AlgorithmKind::FixedWindow {
                    Quota::fixed_window(rate)
                } else {
                    Quota::sliding_window(rate)
                };
                (q.unwrap_or_else(|_| quota.clone()), cost)
            }
            (Flaw::CostIgnoredAboveLimit, _) if quota.limit() > 1000 => (quota.clone(), 1),
            _ => (quota.clone(), cost),
        }
    }

    /// Room for `new` more entries in `map` at `now`: expired entries are
    /// dropped first; then, if the map is still full, the request is
    /// refused, or (the flaw) the entries written longest ago are
    /// forgotten.
    fn room(&self, map: &mut HashMap<Vec<u8>, Entry>, new: usize, now: Micros) -> Result<()> {
        if new == 0 || map.len() + new <= WRONG_MAX_CALLERS {
            return Ok(());
        }
        map.retain(|_, e| e.expires > now);
        while map.len() + new > WRONG_MAX_CALLERS {
            if self.flaw != Flaw::ForgetsToMakeRoom {
                return Err(StoreError::Unavailable {
                    domain: "the wrong store".to_owned(),
                    reason: format!("full: {} entries", map.len()),
                });
            }
            let oldest = map
                .iter()
                .min_by_key(|(_, e)| e.written)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => map.remove(&k),
                None => break,
            };
        }
        Ok(())
    }

    /// One quota of cost above 1 under [`Flaw::CostLostOnRetry`]: read,
    /// decide and write back if the entry did not change in between; on a
    /// conflict, decide again at cost 1.
    fn decide_optimistic(&self, key: &[u8], quota: &Quota, cost: u64) -> Result<Decision> {
        let k = self.map_key(key, quota);
        let now = self.clock.now();
        let mut cost = cost;
        loop {
            let read = lock(&self.map).get(&k).cloned();
            // The moment between the read and the write (a round trip).
            std::thread::sleep(Duration::from_micros(20));
            let prior = read
                .as_ref()
                .filter(|e| e.expires > now)
                .map(|e| e.state.clone());
            let step = model::decide(quota, prior, now, cost)?;
            let mut map = lock(&self.map);
            let version = |e: Option<&Entry>| e.map(|e| e.calls);
            if version(map.get(&k)) == version(read.as_ref()) {
                self.room(&mut map, usize::from(read.is_none()), now)?;
                let calls = read.map_or(0, |e| e.calls) + 1;
                map.insert(
                    k,
                    Entry {
                        state: step.state,
                        calls,
                        written: now,
                        expires: now + step.ttl,
                    },
                );
                return Ok(step.decision);
            }
            // Changed in between: decide again, and (the flaw) charge 1.
            cost = 1;
        }
    }

    /// One quota: the model, with the flaw.
    fn decide_one(&self, key: &[u8], quota: &Quota, cost: u64, deadline: bool) -> Result<Decision> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let k = self.map_key(key, quota);
        let mut now = self.clock.now();
        let cached = if self.flaw == Flaw::InstanceCache {
            self.cache
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&k)
                .cloned()
        } else {
            None
        };
        // The read-modify-write holds the map's lock throughout (the
        // store is atomic), except in the racy store's one call in 64.
        let mut map = lock(&self.map);
        let entry = cached.or_else(|| map.get(&k).cloned());
        if !map.contains_key(&k) {
            self.room(&mut map, 1, now)?;
        }
        if self.flaw == Flaw::Racy && n.is_multiple_of(64) {
            // A round trip between the read and the write, holding no lock.
            drop(map);
            std::thread::sleep(Duration::from_micros(100));
            map = lock(&self.map);
        }
        let calls = entry.as_ref().map_or(0, |e| e.calls);
        if self.flaw == Flaw::DriftsAfterMany && calls >= 700 {
            now -= 1;
        }
        let horizon = now + u64::from(self.flaw == Flaw::ExpiresEarly);
        let written = entry.as_ref().map(|e| e.written);
        let mut prior = entry.filter(|e| e.expires > horizon).map(|e| e.state);
        if self.flaw == Flaw::Forgetful && calls % 4 == 3 {
            prior = None;
        }
        if let (Flaw::SlidingWindowElapsedZero, Algorithm::SlidingWindow(w)) =
            (self.flaw, quota.algorithm())
        {
            let width = w.window_micros();
            if now.is_multiple_of(width) && written.is_some_and(|t| t / width + 1 == now / width) {
                prior = None;
            }
        }
        if let (Flaw::SlidingLogEvictsEarly, Some(State::SlidingLog(s)), Algorithm::SlidingLog(w)) =
            (self.flaw, prior.as_mut(), quota.algorithm())
        {
            let width = w.window_micros();
            while s
                .entries
                .front()
                .is_some_and(|&(t, _)| t + width <= now + 1)
            {
                s.entries.pop_front();
            }
        }
        let (effective, mut cost) = self.effective(quota, cost);
        if self.flaw == Flaw::WrongWithDeadline && deadline {
            cost = 1;
        }
        if self.flaw == Flaw::WrongWithoutDeadline && !deadline {
            cost = 1;
        }
        let step = model::decide(&effective, prior, now, cost)?;
        let mut d = step.decision;
        if self.flaw == Flaw::FixedWindowOverDenies
            && matches!(quota.algorithm(), Algorithm::FixedWindow(_))
            && d.allowed
            && d.remaining == 0
        {
            return Ok(Decision {
                allowed: false,
                retry_after: Some(d.reset_after),
                ..d
            });
        }
        let entry = Entry {
            state: step.state,
            calls: calls + 1,
            written: now,
            expires: now + step.ttl,
        };
        if self.flaw == Flaw::InstanceCache {
            self.cache
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(k.clone(), entry.clone());
        }
        map.insert(k, entry);
        drop(map);
        match self.flaw {
            Flaw::SloppyRetry => {
                d.retry_after = d.retry_after.map(|r| {
                    Duration::from_millis(u64::try_from(r.as_millis()).unwrap_or(u64::MAX) + 1)
                });
            }
            Flaw::RetryShort => {
                d.retry_after = d.retry_after.map(|r| r - Duration::from_micros(1));
            }
            Flaw::SourceMisreported if !d.allowed => d.source = Source::FailClosed,
            _ => {}
        }
        Ok(d)
    }

    /// Several quotas: all or nothing on the single quotas' states, except
    /// as the flaw says.
    fn decide_set(&self, key: &[u8], charges: &[Charge<'_>], deadline: bool) -> Result<Decisions> {
        if self.flaw == Flaw::NonAtomicDefault {
            // One quota at a time, stopping at a denial.
            let mut out = Decisions::default();
            for c in charges {
                let d = self.decide_one(key, c.quota, c.cost, deadline)?;
                let stop = !d.allowed && !c.shadow;
                out.push(d);
                if stop {
                    break;
                }
            }
            return Ok(out);
        }
        let now = self.clock.now();
        let keys: Vec<Vec<u8>> = charges
            .iter()
            .map(|c| {
                let mut k = self.map_key(key, c.quota);
                if self.flaw == Flaw::SetsApart {
                    k.extend_from_slice(b"\xFFset");
                }
                k
            })
            .collect();
        let mut map = lock(&self.map);
        let new = keys.iter().filter(|k| !map.contains_key(*k)).count();
        self.room(&mut map, new, now)?;
        let states: Vec<Option<State>> = keys
            .iter()
            .map(|k| {
                map.get(k)
                    .filter(|e| e.expires > now)
                    .map(|e| e.state.clone())
            })
            .collect();
        if self.flaw == Flaw::RacySets {
            // Read under one lock, write under another: a lost update.
            drop(map);
            std::thread::sleep(Duration::from_micros(50));
            map = lock(&self.map);
        }
        let write = |map: &mut HashMap<Vec<u8>, Entry>, k: &[u8], state: State, ttl: u64| {
            let calls = map.get(k).map_or(0, |e| e.calls);
            map.insert(
                k.to_vec(),
                Entry {
                    state,
                    calls: calls + 1,
                    written: now,
                    expires: now + ttl,
                },
            );
        };
        if self.flaw == Flaw::ChargesEarlierQuotas
            || (self.flaw == Flaw::WrongSetsWithDeadline && deadline)
        {
            let mut out = Decisions::default();
            let mut denied = false;
            for ((c, k), prior) in charges.iter().zip(&keys).zip(states) {
                let step = model::decide(c.quota, prior, now, c.cost)?;
                denied |= !step.decision.allowed && !c.shadow;
                if step.decision.allowed && !denied {
                    write(&mut map, k, step.state, step.ttl);
                }
                out.push(step.decision);
            }
            return Ok(out);
        }
        let step = model::decide_all(charges, states, now)?;
        for (k, w) in keys.iter().zip(step.writes) {
            if let Some((state, ttl)) = w {
                write(&mut map, k, state, ttl);
            }
        }
        Ok(step.decisions.into())
    }

    fn answer(&self, request: Request<'_>) -> Result<Decisions> {
        if let Err(e) = request.check() {
            if self.flaw == Flaw::CountsRefused {
                // The charges valid on their own, each quota once, counted.
                let mut valid: Vec<Charge<'_>> = Vec::new();
                for c in request.charges {
                    let seen = valid.iter().any(|v| {
                        v.quota.name() == c.quota.name() && v.quota.kind() == c.quota.kind()
                    });
                    if !seen && c.quota.check_cost(c.cost).is_ok() {
                        valid.push(*c);
                    }
                }
                if !valid.is_empty() {
                    let _ = self.carry_out(&Request::new(request.key, &valid));
                }
            }
            return Err(e);
        }
        if request.deadline.has_passed() {
            match self.flaw {
                Flaw::IgnoresDeadline => {}
                Flaw::CountsThenExpires => {
                    self.carry_out(&request)?;
                    return Err(StoreError::Expired);
                }
                Flaw::TimeoutPastDeadline => return Err(StoreError::Timeout(Duration::ZERO)),
                _ => return Err(StoreError::Expired),
            }
        }
        self.carry_out(&request)
    }

    /// The request's decisions, counted.
    fn carry_out(&self, request: &Request<'_>) -> Result<Decisions> {
        let deadline = !request.deadline.is_none();
        match request.charges {
            [c] if c.cost > 1
                && matches!(
                    self.flaw,
                    Flaw::CostLostOnRetry | Flaw::PendingCostLostOnRetry
                ) =>
            {
                self.decide_optimistic(request.key, c.quota, c.cost)
                    .map(Decisions::one)
            }
            [c] => self
                .decide_one(request.key, c.quota, c.cost, deadline)
                .map(Decisions::one),
            charges => self.decide_set(request.key, charges, deadline),
        }
    }
}

impl Store for WrongStore {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        match self.flaw {
            Flaw::PendingDespiteInProcess | Flaw::PendingCostLostOnRetry => {
                Answer::pending(async move { self.answer(request) })
            }
            Flaw::HangsDespiteBounded if request.deadline.has_passed() => {
                Answer::pending(std::future::pending())
            }
            Flaw::HangsDespiteBounded => Answer::pending(async move { self.answer(request) }),
            _ => Answer::ready(self.answer(request)),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .atomic(!matches!(
                self.flaw,
                Flaw::NonAtomicDefault | Flaw::RacySets
            ))
            .in_process(!matches!(
                self.flaw,
                Flaw::HangsDespiteBounded | Flaw::PendingCostLostOnRetry
            ))
            .bounded(self.flaw == Flaw::HangsDespiteBounded)
            .shared_clock(Some(self.clock.clone()))
            .max_callers(Some(WRONG_MAX_CALLERS))
    }
}

/// Hands out [`WrongStore`]s with one flaw: instances share one map, except
/// for [`Flaw::PerInstanceState`] (each its own) and [`Flaw::InstanceCache`]
/// (one map, each with its own cache).
#[derive(Debug, Clone, Copy)]
pub struct WrongFactory(pub Flaw);

#[async_trait]
impl StoreFactory for WrongFactory {
    async fn stores(&self, n: usize, clock: Option<ManualClock>) -> Vec<Arc<dyn Store>> {
        let clock: Arc<dyn Clock> = match clock {
            Some(c) => Arc::new(c),
            None => Arc::new(SystemClock),
        };
        let shared: Map = Arc::default();
        let make = |map: Map| -> Arc<dyn Store> {
            Arc::new(WrongStore::sharing(self.0, clock.clone(), map))
        };
        match self.0 {
            Flaw::PerInstanceState => (0..n).map(|_| make(Arc::default())).collect(),
            Flaw::InstanceCache => (0..n).map(|_| make(shared.clone())).collect(),
            _ => vec![make(shared); n],
        }
    }
}
