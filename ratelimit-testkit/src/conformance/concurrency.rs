//! Contract 9: shared state (deterministic, round-robin) and concurrency
//! (OS threads over several instances, released together).

use std::fmt;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use ratelimit_core::model::Charge;
use ratelimit_core::{AlgorithmKind, Clock, ManualClock, Quota, Rate, Store, SystemClock};
use tokio::runtime::Handle;

use super::checks::{compare, play};
use super::door;
use super::scenario::{Shape, T0, case_prefix, describe, run_cases, scenarios};
use super::{Contract, StoreFactory, SuiteConfig, Violation};

/// The limit of the deterministic shared-state check.
const SHARED_LIMIT: u64 = 50;

/// A quota of `limit` per `window` of `kind`; a token bucket holds `limit`
/// and refills one token per `window`.
pub(crate) fn quota(kind: AlgorithmKind, window: Duration, limit: u64) -> Quota {
    let rate = Rate::new(limit, window);
    match kind {
        AlgorithmKind::FixedWindow => Quota::fixed_window(rate),
        AlgorithmKind::SlidingWindow => Quota::sliding_window(rate),
        AlgorithmKind::SlidingLog => Quota::sliding_log(rate),
        // Capacity L, refilling one token per window: nothing refills during a run.
        _ => Quota::token_bucket(Rate::new(1, window), limit),
    }
    .expect("valid quota")
}

/// A violation of `contract` on `quota`, with the run's setup as its sequence.
pub(crate) fn violation(
    contract: Contract,
    quota: &Quota,
    setup: String,
    message: String,
) -> Violation {
    Violation {
        contract,
        message,
        sequence: format!("  quota: {}\n  {setup}", describe(quota)),
    }
}

/// Contract 9, shared state: the store instances a factory hands out (as
/// separate app servers would hold them) share one state.
///
/// First, deterministically: for each algorithm, `instances` stores (at
/// least 2) are called round-robin, one call at a time, under a frozen
/// clock, three times the limit of 50 calls on one key: they must admit
/// exactly 50, as one instance would. Then proptest scenarios as for
/// contract 1 are played round-robin over the instances and must agree
/// with the model call for call. A store whose instances keep separate
/// counters, or cache state per instance, fails with "instances do not
/// share state".
pub async fn shared_state(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    let n = config.instances.max(2);
    for kind in AlgorithmKind::ALL {
        let q = quota(kind, Duration::from_secs(60), SHARED_LIMIT);
        let clock = ManualClock::new(T0 + 17);
        let stores = factory.stores(n, Some(clock)).await;
        let setup = format!(
            "{n} store instances called round-robin, one call at a time, at one instant, one key, \
             cost 1"
        );
        if stores.len() != n {
            return Err(violation(
                Contract::SharedState,
                &q,
                setup,
                format!(
                    "the factory returned {} stores, {n} were asked for",
                    stores.len()
                ),
            ));
        }
        let key = case_prefix();
        let mut per = vec![0u64; n];
        for i in 0..3 * SHARED_LIMIT as usize {
            let d = door::ask_one(&*stores[i % n], &key, &q, 1)
                .await
                .map_err(|e| violation(Contract::SharedState, &q, setup.clone(), e))?;
            per[i % n] += u64::from(d.allowed);
        }
        let total: u64 = per.iter().sum();
        if total != SHARED_LIMIT {
            return Err(violation(
                Contract::SharedState,
                &q,
                setup,
                format!(
                    "instances do not share state: {n} instances admitted {total} of {} calls at \
                     one instant (per instance {per:?}); one instance admits exactly \
                     {SHARED_LIMIT}",
                    3 * SHARED_LIMIT
                ),
            ));
        }
    }
    let h = Handle::current();
    let shape = Shape {
        kinds: &AlgorithmKind::ALL,
        max_calls: 60,
        back: true,
        switch: false,
    };
    run_cases(
        config,
        Contract::SharedState,
        config.fewer_cases(),
        scenarios(shape),
        |sc| {
            h.block_on(async {
                let p = play(factory, &sc, n).await?;
                compare(&sc, &p.got).map_err(|e| {
                    format!(
                        "instances do not share state: calls made round-robin over {n} \
                         instances (call #i on instance i mod {n}) disagree with the model: {e}"
                    )
                })
            })
        },
    )
}

/// How calls and admissions spread over the threads and instances of a
/// concurrency run (summed over its rounds and algorithms).
#[derive(Debug, Clone, Default)]
pub struct ConcurrencyReport {
    /// Store instances.
    pub instances: usize,
    /// OS threads (thread `i` calls instance `i % instances`).
    pub threads: usize,
    /// Rounds run (per algorithm, each on a fresh key), summed over algorithms.
    pub rounds: u32,
    /// Calls made by each thread.
    pub calls_per_thread: Vec<u64>,
    /// Calls admitted to each thread.
    pub admitted_per_thread: Vec<u64>,
    /// Calls admitted through each instance.
    pub admitted_per_instance: Vec<u64>,
    /// In the order the calls started, how often the next call came from
    /// another thread than the one before: `threads - 1` per round means
    /// the threads ran one after another; real interleaving gives many more.
    pub switches: u64,
}

impl fmt::Display for ConcurrencyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} threads over {} instances, {} rounds: calls per thread {:?}, admitted per thread \
             {:?}, admitted per instance {:?}, {} thread switches between consecutive calls",
            self.threads,
            self.instances,
            self.rounds,
            self.calls_per_thread,
            self.admitted_per_thread,
            self.admitted_per_instance,
            self.switches
        )
    }
}

struct Run {
    calls: Vec<u64>,
    admitted: Vec<u64>,
    /// Requests admitted, per shape of request.
    by_shape: Vec<u64>,
    switches: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Run {
    fn admitted(&self) -> u64 {
        self.admitted.iter().sum()
    }
    fn calls(&self) -> u64 {
        self.calls.iter().sum()
    }
}

/// Runs `threads` OS threads, thread `i` on `stores[i % len]`, released
/// together by a barrier, each making up to `per_thread` requests on `key`
/// (yielding between them, so threads sharing a core interleave too), until
/// `deadline` if given. Thread `i`'s request `j` charges
/// `shapes[(i + j) % shapes.len()]`; a request is admitted when every
/// charge's decision admits it.
fn run_threads(
    handle: &Handle,
    stores: &[Arc<dyn Store>],
    threads: usize,
    shapes: &[&[Charge<'_>]],
    key: &[u8],
    per_thread: u64,
    deadline: Option<Duration>,
) -> Run {
    let barrier = Barrier::new(threads);
    let seq = AtomicU64::new(0);
    let total = threads * usize::try_from(per_thread).unwrap_or(usize::MAX);
    let order: Vec<AtomicU16> = (0..total).map(|_| AtomicU16::new(u16::MAX)).collect();
    let by_shape: Vec<AtomicU64> = shapes.iter().map(|_| AtomicU64::new(0)).collect();
    let first_error = Mutex::new(None::<String>);
    let results: Vec<(u64, u64, u64)> = std::thread::scope(|s| {
        let spawned: Vec<_> = (0..threads)
            .map(|i| {
                let (barrier, seq, order, first_error, by_shape) =
                    (&barrier, &seq, &order, &first_error, &by_shape);
                let store = &stores[i % stores.len()];
                s.spawn(move || {
                    barrier.wait();
                    let end = deadline.map(|d| Instant::now() + d);
                    let (mut calls, mut admitted, mut errors) = (0u64, 0u64, 0u64);
                    for j in 0..per_thread {
                        if end.is_some_and(|e| Instant::now() >= e) {
                            break;
                        }
                        let ticket = seq.fetch_add(1, Ordering::SeqCst);
                        if let Some(slot) = usize::try_from(ticket).ok().and_then(|t| order.get(t))
                        {
                            slot.store(u16::try_from(i).unwrap_or(u16::MAX), Ordering::Relaxed);
                        }
                        let shape = (i + usize::try_from(j).unwrap_or(0)) % shapes.len();
                        match handle.block_on(door::ask(&**store, key, shapes[shape])) {
                            Ok(ds) => {
                                let ok = ds.iter().all(|d| d.allowed);
                                admitted += u64::from(ok);
                                by_shape[shape].fetch_add(u64::from(ok), Ordering::Relaxed);
                            }
                            Err(e) => {
                                errors += 1;
                                first_error
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .get_or_insert(e);
                            }
                        }
                        calls += 1;
                        std::thread::yield_now();
                    }
                    (calls, admitted, errors)
                })
            })
            .collect();
        spawned
            .into_iter()
            .map(|h| h.join().unwrap_or((0, 0, 1)))
            .collect()
    });
    let made = usize::try_from(seq.load(Ordering::SeqCst))
        .unwrap_or(usize::MAX)
        .min(total);
    let owners: Vec<u16> = order[..made]
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .collect();
    let switches = owners.windows(2).filter(|w| w[0] != w[1]).count() as u64;
    let first_error = first_error.into_inner().unwrap_or_else(|p| p.into_inner());
    Run {
        calls: results.iter().map(|r| r.0).collect(),
        admitted: results.iter().map(|r| r.1).collect(),
        by_shape: by_shape.iter().map(|a| a.load(Ordering::Relaxed)).collect(),
        errors: results.iter().map(|r| r.2).sum(),
        first_error,
        switches,
    }
}

/// Contract 9, concurrency: see [`concurrency_report`].
pub async fn concurrency(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    concurrency_report(factory, config).await.map(|_| ())
}

/// Contract 9, concurrency, returning how the calls spread.
///
/// For each algorithm, `concurrency_rounds` rounds on fresh keys: under a
/// frozen injected clock, `instances × threads_per_instance` OS threads
/// (thread `i` on instance `i % instances`), released together by a
/// barrier, make `2 × concurrency_limit` calls of cost 1 on one key between
/// them. Every round must admit **exactly** the limit: more is a lost
/// update (a race), fewer a false denial. Network stores are called through
/// `Handle::block_on` from the same OS threads, so their connections carry
/// truly concurrent requests.
///
/// The run fails if it did not interleave: the threads' calls, in the
/// order they started, must switch threads at least `threads` times per
/// round on average (threads running one after another switch `threads - 1`
/// times), so a run that serialised by accident cannot pass vacuously.
pub async fn concurrency_report(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<ConcurrencyReport, Violation> {
    let handle = Handle::current();
    let instances = config.instances.max(1);
    let threads = (instances * config.threads_per_instance).max(2);
    let limit = config.concurrency_limit.max(1);
    let per_thread = (2 * limit).div_ceil(threads as u64);
    let mut report = ConcurrencyReport {
        instances,
        threads,
        calls_per_thread: vec![0; threads],
        admitted_per_thread: vec![0; threads],
        admitted_per_instance: vec![0; instances],
        ..ConcurrencyReport::default()
    };
    let setup = format!(
        "{instances} store instances × {} OS threads each, released together, one key, cost 1 \
         per call, {per_thread} calls per thread, frozen clock",
        threads / instances
    );
    for kind in AlgorithmKind::ALL {
        let q = quota(kind, Duration::from_secs(60), limit);
        for round in 0..config.concurrency_rounds.max(1) {
            let clock = ManualClock::new(T0 + 17);
            let stores = factory.stores(instances, Some(clock)).await;
            let key = case_prefix();
            let one = [Charge::new(&q, 1)];
            let run = tokio::task::block_in_place(|| {
                run_threads(&handle, &stores, threads, &[&one], &key, per_thread, None)
            });
            if run.errors > 0 {
                return Err(violation(
                    Contract::Concurrency,
                    &q,
                    setup,
                    format!(
                        "{} of {} calls failed in round {round}; first error: {}",
                        run.errors,
                        run.calls(),
                        run.first_error.unwrap_or_default()
                    ),
                ));
            }
            let admitted = run.admitted();
            if admitted != limit {
                let what = if admitted > limit {
                    "concurrent calls over-admitted (a lost update: the store is not atomic)"
                } else {
                    "concurrent calls under-admitted (false denials)"
                };
                return Err(violation(
                    Contract::Concurrency,
                    &q,
                    setup,
                    format!(
                        "round {round}: admitted {admitted} of {} calls at one instant, but the \
                         limit is {limit}: {what}; calls per thread {:?}, admitted per thread \
                         {:?}, {} thread switches",
                        run.calls(),
                        run.calls,
                        run.admitted,
                        run.switches
                    ),
                ));
            }
            report.rounds += 1;
            report.switches += run.switches;
            for (i, (c, a)) in run.calls.iter().zip(&run.admitted).enumerate() {
                report.calls_per_thread[i] += c;
                report.admitted_per_thread[i] += a;
                report.admitted_per_instance[i % instances] += a;
            }
        }
    }
    let needed = u64::from(report.rounds) * threads as u64;
    if report.switches < needed {
        return Err(Violation {
            contract: Contract::Concurrency,
            message: format!(
                "no interleaving: the threads ran one after another ({} switches, at least \
                 {needed} needed), so the run proves nothing about concurrency: {report}",
                report.switches
            ),
            sequence: format!("  quota: {limit} per minute, all four algorithms\n  {setup}"),
        });
    }
    Ok(report)
}

/// Contract 9 on the stores' own clock (Redis `TIME`, or the system clock):
/// the same threads, for at most `concurrency_duration`, on windows of one
/// hour (a token bucket refilling one token per hour), so the bound is the
/// limit (plus one refilled token); a fixed or sliding window that crosses a
/// calendar boundary during the run may admit one more window's worth.
pub async fn concurrency_server_clock(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    let handle = Handle::current();
    let hour = Duration::from_secs(3600);
    let instances = config.instances.max(1);
    let threads = (instances * config.threads_per_instance).max(2);
    let limit = config.concurrency_limit.max(1);
    let per_thread = (4 * limit).div_ceil(threads as u64);
    for kind in AlgorithmKind::ALL {
        let q = quota(kind, hour, limit);
        let stores = factory.stores(instances, None).await;
        let key = case_prefix();
        let start = SystemClock.now();
        let one = [Charge::new(&q, 1)];
        let run = tokio::task::block_in_place(|| {
            run_threads(
                &handle,
                &stores,
                threads,
                &[&one],
                &key,
                per_thread,
                Some(config.concurrency_duration),
            )
        });
        let end = SystemClock.now();
        // Allow 5 s of skew between this machine's clock and the store's.
        let slack = 5_000_000;
        let w = 3_600_000_000;
        let crossed = (start.saturating_sub(slack)) / w != (end + slack) / w;
        let bound = match (kind, crossed) {
            (AlgorithmKind::FixedWindow, true) => 2 * limit,
            (AlgorithmKind::SlidingWindow, true) => limit + 1,
            (AlgorithmKind::TokenBucket, _) => limit + 1,
            _ => limit,
        };
        let setup = format!(
            "{instances} store instances × {} OS threads each, one key, cost 1 per call, the \
             store's own clock",
            threads / instances
        );
        if run.errors > 0 {
            return Err(violation(
                Contract::Concurrency,
                &q,
                setup,
                format!(
                    "{} of {} calls failed on the server clock; first error: {}",
                    run.errors,
                    run.calls(),
                    run.first_error.unwrap_or_default()
                ),
            ));
        }
        if run.admitted() > bound {
            return Err(violation(
                Contract::Concurrency,
                &q,
                setup,
                format!(
                    "admitted {} of {} calls within {:?} on the server clock, but at most {bound} \
                     may pass: concurrent calls over-admitted",
                    run.admitted(),
                    run.calls(),
                    Duration::from_micros(end.saturating_sub(start))
                ),
            ));
        }
    }
    Ok(())
}

/// Contract 9 for several quotas (and contract 11 under concurrency): many
/// threads over many instances, on one key, send three shapes of request
/// at once: quotas `a` and `b` together (all or nothing), `a` alone, and
/// `b` alone. Under a frozen clock, with enough requests of each shape to
/// exhaust both quotas, the units counted in `a` (admitted requests
/// charging `a`) must be **exactly** `a`'s limit, and likewise for `b`:
/// more is a lost update (a set read and written under separate locks) or
/// a set kept in a keyspace of its own (a quota checked alone and within a
/// set must be one state); fewer is a false denial.
///
/// Each pair of algorithms (`a` of one, `b` of the next), `concurrency_rounds`
/// / 2 rounds (at least 1) on fresh keys.
pub async fn concurrency_sets(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    let handle = Handle::current();
    let instances = config.instances.max(1);
    let threads = (instances * config.threads_per_instance).max(2);
    let limit = config.concurrency_limit.max(2);
    let per_thread = (6 * limit + 3 * threads as u64).div_ceil(threads as u64);
    for (i, &kind) in AlgorithmKind::ALL.iter().enumerate() {
        let other = AlgorithmKind::ALL[(i + 1) % AlgorithmKind::ALL.len()];
        let a = quota(kind, Duration::from_secs(60), limit)
            .named("a")
            .expect("valid name");
        let b = quota(other, Duration::from_secs(60), limit / 2 + 1)
            .named("b")
            .expect("valid name");
        let setup = format!(
            "{instances} store instances × {} OS threads each, released together, one key, \
             {per_thread} requests per thread cycling through [a, b] together, [a] alone and [b] \
             alone, cost 1 each, frozen clock; quota b: {}",
            threads / instances,
            describe(&b)
        );
        let set = [Charge::new(&a, 1), Charge::new(&b, 1)];
        let only_a = [Charge::new(&a, 1)];
        let only_b = [Charge::new(&b, 1)];
        let shapes: [&[Charge<'_>]; 3] = [&set, &only_a, &only_b];
        let mut switches = 0;
        let rounds = (config.concurrency_rounds / 2).max(1);
        for round in 0..rounds {
            let clock = ManualClock::new(T0 + 17);
            let stores = factory.stores(instances, Some(clock)).await;
            let key = case_prefix();
            let run = tokio::task::block_in_place(|| {
                run_threads(&handle, &stores, threads, &shapes, &key, per_thread, None)
            });
            if run.errors > 0 {
                return Err(violation(
                    Contract::Concurrency,
                    &a,
                    setup,
                    format!(
                        "{} of {} requests failed in round {round}; first error: {}",
                        run.errors,
                        run.calls(),
                        run.first_error.unwrap_or_default()
                    ),
                ));
            }
            let counted_a = run.by_shape[0] + run.by_shape[1];
            let counted_b = run.by_shape[0] + run.by_shape[2];
            for (name, counted, q) in [("a", counted_a, &a), ("b", counted_b, &b)] {
                if counted != q.limit() {
                    let what = if counted > q.limit() {
                        "over-admitted: a lost update, or a quota checked within a set kept apart \
                         from the same quota checked alone (they must be one state)"
                    } else {
                        "under-admitted (false denials)"
                    };
                    return Err(violation(
                        Contract::Concurrency,
                        &a,
                        setup,
                        format!(
                            "round {round}: quota {name} counted {counted} units (admitted sets \
                             {}, admitted [a] alone {}, admitted [b] alone {}), but its limit is \
                             {}: {what}",
                            run.by_shape[0],
                            run.by_shape[1],
                            run.by_shape[2],
                            q.limit()
                        ),
                    ));
                }
            }
            switches += run.switches;
        }
        let needed = u64::from(rounds) * threads as u64;
        if switches < needed {
            return Err(violation(
                Contract::Concurrency,
                &a,
                setup,
                format!(
                    "no interleaving: the threads ran one after another ({switches} switches, at \
                     least {needed} needed), so the run proves nothing about concurrency"
                ),
            ));
        }
    }
    Ok(())
}

/// The costs of [`concurrency_costs`]' requests, cycled through: a third of
/// them cost 1, so that the quota is used up to its last unit.
const COSTS: [u64; 9] = [3, 1, 7, 2, 1, 5, 13, 1, 4];

/// Contract 9 with **costs above 1**: the same threads over the same
/// instances, released together on one key under a frozen clock, send
/// requests whose costs cycle through 3, 1, 7, 2, 1, 5, 13, 1 and 4
/// (thread `i`'s request `j` costs the `(i + j)`-th), three to four times
/// the limit in all. The units of the admitted requests must never exceed the
/// limit (more is a lost update, or a cost taken for less than it is), and
/// no request may be denied while the units admitted leave room for it
/// (a false denial): since requests of cost 1 are denied at the end, every
/// round admits **exactly** the limit.
///
/// Whatever the store answers, ready ([`ratelimit_core::store::Answer::ready`])
/// or pending, each thread waits for its answer; the wrong-store corpus
/// shows the check catching a store that loses the cost of a request on a
/// conflict either way. For each algorithm, `concurrency_rounds / 2` rounds
/// (at least 1) on fresh keys; the limit is `concurrency_limit` (at least
/// 16).
pub async fn concurrency_costs(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    let handle = Handle::current();
    let instances = config.instances.max(1);
    let threads = (instances * config.threads_per_instance).max(2);
    let limit = config.concurrency_limit.max(16);
    let sum: u64 = COSTS.iter().sum();
    let len = COSTS.len() as u64;
    let per_thread = (3 * limit * len).div_ceil(sum).div_ceil(threads as u64) + len;
    let setup = format!(
        "{instances} store instances × {} OS threads each, released together, one key, \
         {per_thread} requests per thread, thread i's request j costing {COSTS:?}[(i + j) % {}], \
         frozen clock",
        threads / instances,
        COSTS.len()
    );
    for kind in AlgorithmKind::ALL {
        let q = quota(kind, Duration::from_secs(60), limit);
        let singles: Vec<[Charge<'_>; 1]> = COSTS.iter().map(|&c| [Charge::new(&q, c)]).collect();
        let shapes: Vec<&[Charge<'_>]> = singles.iter().map(|s| &s[..]).collect();
        let rounds = (config.concurrency_rounds / 2).max(1);
        let mut switches = 0;
        for round in 0..rounds {
            let clock = ManualClock::new(T0 + 17);
            let stores = factory.stores(instances, Some(clock)).await;
            let key = case_prefix();
            let run = tokio::task::block_in_place(|| {
                run_threads(&handle, &stores, threads, &shapes, &key, per_thread, None)
            });
            if run.errors > 0 {
                return Err(violation(
                    Contract::Concurrency,
                    &q,
                    setup,
                    format!(
                        "{} of {} requests failed in round {round}; first error: {}",
                        run.errors,
                        run.calls(),
                        run.first_error.unwrap_or_default()
                    ),
                ));
            }
            // Thread i's request j was of shape (i + j) % len.
            let mut sent = vec![0u64; COSTS.len()];
            for (i, &n) in run.calls.iter().enumerate() {
                for j in 0..usize::try_from(n).unwrap_or(usize::MAX) {
                    sent[(i + j) % COSTS.len()] += 1;
                }
            }
            let units: u64 = run.by_shape.iter().zip(COSTS).map(|(a, c)| a * c).sum();
            let admitted: Vec<(u64, u64, u64)> = COSTS
                .iter()
                .zip(&sent)
                .zip(&run.by_shape)
                .map(|((&c, &n), &a)| (c, a, n))
                .collect();
            if units > limit {
                return Err(violation(
                    Contract::Concurrency,
                    &q,
                    setup,
                    format!(
                        "round {round}: admitted requests worth {units} units at one instant, but \
                         the limit is {limit}: concurrent requests of cost above 1 over-admitted \
                         (a lost update, or a cost taken for less than it is); (cost, admitted, \
                         sent): {admitted:?}"
                    ),
                ));
            }
            let least_denied = admitted
                .iter()
                .filter(|(_, a, n)| n > a)
                .map(|&(c, _, _)| c)
                .min();
            if let Some(c) = least_denied.filter(|&c| units + c <= limit) {
                return Err(violation(
                    Contract::Concurrency,
                    &q,
                    setup,
                    format!(
                        "round {round}: a request of cost {c} was denied, yet the admitted \
                         requests are worth only {units} of the limit {limit}: under-admitted \
                         (a false denial); (cost, admitted, sent): {admitted:?}"
                    ),
                ));
            }
            switches += run.switches;
        }
        let needed = u64::from(rounds) * threads as u64;
        if switches < needed {
            return Err(violation(
                Contract::Concurrency,
                &q,
                setup,
                format!(
                    "no interleaving: the threads ran one after another ({switches} switches, at \
                     least {needed} needed), so the run proves nothing about concurrency"
                ),
            ));
        }
    }
    Ok(())
}
