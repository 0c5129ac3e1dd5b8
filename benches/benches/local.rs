//! In-process benchmarks: the core model's step per algorithm, and the local
//! store (`LocalStore`, through the `Store` trait and through
//! `Limiter::check`) side by side with governor 0.10's keyed DashMap limiter
//! and throttlecrab 0.4's GCRA limiter on the same scenario, in the same run.
//! (throttlecrab's `RateLimiter` takes `&mut self` and the current time from
//! its caller: one instance behind a mutex, `SystemTime::now()` per call, as
//! a multi-threaded service would use it.)
//!
//! `cargo bench -p ratelimit-benches --bench local`; see `BENCHMARKS.md`.
//! With `LOCAL_INTERLEAVED=1` the local-store scenarios run interleaved
//! instead (every contender in turn, in short slices: see [`interleaved`]).
#![allow(missing_docs)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group};
use governor::{DefaultKeyedRateLimiter, RateLimiter};
use ratelimit_benches::{Cursor, caller_ids, decide_in_place, run_split};
use ratelimit_core::model::{self, State};
use ratelimit_core::{Limiter, Quota, Rate, Store};
use ratelimit_local::LocalStore;
use tokio::runtime::Runtime;

/// All cores of the benchmark machine (2); see BENCHMARKS.md.
const ALL_CORES: usize = 2;

fn configure(group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
}

// ---------------------------------------------------------------------------
// The model's step
// ---------------------------------------------------------------------------

/// One caller sending a request every 375 ms (160 per minute) against a
/// 100-per-minute quota: 1.6x over the rate, so both the admit and the deny
/// paths run (the bucket or window fills, then about 5 in 8 calls pass).
fn model_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("model_step");
    configure(&mut group);
    let quotas = [
        ("fixed_window", Quota::fixed_window(Rate::per_minute(100))),
        (
            "sliding_window",
            Quota::sliding_window(Rate::per_minute(100)),
        ),
        ("sliding_log", Quota::sliding_log(Rate::per_minute(100))),
        (
            "token_bucket",
            Quota::token_bucket(Rate::per_minute(100), 20),
        ),
    ];
    for (name, quota) in quotas {
        let quota = quota.expect("valid quota");
        let admitted = AtomicU64::new(0);
        let total = AtomicU64::new(0);
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut now: u64 = 1_800_000_000_000_000;
                let mut state: Option<State> = None;
                let mut ok = 0u64;
                let start = std::time::Instant::now();
                for _ in 0..iters {
                    let step = model::decide(black_box(&quota), state, black_box(now), 1)
                        .expect("cost 1 is valid");
                    ok += u64::from(step.decision.allowed);
                    state = Some(step.state);
                    now += 375_000;
                }
                let elapsed = start.elapsed();
                black_box(state);
                admitted.fetch_add(ok, Ordering::Relaxed);
                total.fetch_add(iters, Ordering::Relaxed);
                elapsed
            })
        });
        report_admitted(name, &admitted, &total);
    }
    group.finish();
}

fn report_admitted(name: &str, admitted: &AtomicU64, total: &AtomicU64) {
    let (a, t) = (
        admitted.load(Ordering::Relaxed),
        total.load(Ordering::Relaxed),
    );
    if t > 0 {
        println!(
            "{name:>16}: admitted {:.1}% of {t} decisions",
            100.0 * a as f64 / t as f64
        );
    }
}

// ---------------------------------------------------------------------------
// The local store against governor
// ---------------------------------------------------------------------------

/// A quota both limiters can express with the same admissions: a token
/// bucket of `burst` refilled at `per_second` is GCRA with emission interval
/// 1/rate and burst tolerance `burst`.
struct SameQuota {
    name: &'static str,
    ours: Quota,
    governor: governor::Quota,
    /// throttlecrab's `(max_burst, count_per_period, period_seconds)`.
    throttlecrab: (i64, i64, i64),
}

fn quotas() -> Vec<SameQuota> {
    vec![
        // The plan from the problem statement: almost every call is denied
        // once a key's burst is spent (the deny path).
        SameQuota {
            name: "100_per_min_burst_20",
            ours: Quota::token_bucket(Rate::per_minute(100), 20).expect("valid"),
            governor: governor::Quota::per_minute(NonZeroU32::new(100).expect("non-zero"))
                .allow_burst(NonZeroU32::new(20).expect("non-zero")),
            throttlecrab: (20, 100, 60),
        },
        // A rate no benchmark loop can reach: every call is admitted (the
        // admit path).
        SameQuota {
            name: "1e9_per_s_burst_1000",
            ours: Quota::token_bucket(Rate::per_second(1_000_000_000), 1000).expect("valid"),
            governor: governor::Quota::per_second(
                NonZeroU32::new(1_000_000_000).expect("non-zero"),
            )
            .allow_burst(NonZeroU32::new(1000).expect("non-zero")),
            throttlecrab: (1000, 1_000_000_000, 1),
        },
    ]
}

struct Contenders {
    store: Arc<LocalStore>,
    /// The same store as a trait object: what a caller through the one
    /// door gets.
    dyn_store: Arc<dyn Store>,
    limiter: Limiter,
    governor: DefaultKeyedRateLimiter<String>,
    throttlecrab: Mutex<throttlecrab::RateLimiter<throttlecrab::AdaptiveStore>>,
}

/// One throttlecrab decision for `key`: admitted?
fn throttlecrab_check(
    limiter: &Mutex<throttlecrab::RateLimiter<throttlecrab::AdaptiveStore>>,
    key: &str,
    (burst, count, period): (i64, i64, i64),
) -> bool {
    limiter
        .lock()
        .rate_limit(key, burst, count, period, 1, SystemTime::now())
        .map(|(allowed, _)| allowed)
        .expect("valid throttlecrab parameters")
}

impl Contenders {
    /// Fresh limiters with every key of `keys` seen once, so the measured
    /// calls find existing state (as a steady stream of callers does).
    ///
    /// Each contender is filled in a loop of its own, and in an order
    /// unrelated to the order the measured runs walk the keys in. Filled in
    /// the walking order, a contender's per-key allocations (the stored
    /// keys) would lie in memory in the order they are then visited, which
    /// the hardware prefetcher turns into a sequential scan; filled in one
    /// loop with the others, its allocations would lie interleaved with
    /// theirs. With a million keys either decides more than the code does
    /// (BENCHMARKS.md, "keys walked fairly"). Real callers come back in no
    /// relation to when they were first seen.
    fn prefilled(q: &SameQuota, keys: &[String], rt: &Runtime) -> Self {
        let store = Arc::new(LocalStore::new());
        let c = Self {
            dyn_store: store.clone(),
            store,
            limiter: Limiter::builder(LocalStore::new())
                .quota(q.ours.clone())
                .build()
                .expect("valid limiter"),
            governor: RateLimiter::keyed(q.governor),
            throttlecrab: Mutex::new(throttlecrab::RateLimiter::new(
                throttlecrab::AdaptiveStore::builder()
                    .capacity(keys.len().max(1024))
                    .build(),
            )),
        };
        let filling = || filling_order(keys);
        for k in filling() {
            let _ = c.store.decide_now(k.as_bytes(), &q.ours, 1);
        }
        for k in filling() {
            let _ = c.governor.check_key(k);
        }
        for k in filling() {
            let _ = throttlecrab_check(&c.throttlecrab, k, q.throttlecrab);
        }
        rt.block_on(async {
            for k in filling() {
                c.limiter.check(k).await;
            }
        });
        c
    }
}

/// The keys in the order the contenders are filled in: a stride through
/// the walking order by a prime that divides no key count used here, so
/// keys next to each other in one order are far apart in the other.
fn filling_order(keys: &[String]) -> impl Iterator<Item = &String> {
    const STRIDE: usize = 7919;
    let n = keys.len();
    (0..n).map(move |i| &keys[(i * STRIDE) % n])
}

fn runtimes(n: usize) -> Vec<Runtime> {
    (0..n)
        .map(|_| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime")
        })
        .collect()
}

fn local_store(c: &mut Criterion) {
    let rts = runtimes(ALL_CORES);
    let key_sets: [(&str, usize); 3] =
        [("hot_key", 1), ("10k_keys", 10_000), ("1m_keys", 1_000_000)];
    for (set_name, n) in key_sets {
        let keys = caller_ids(n);
        for q in quotas() {
            let contenders = Contenders::prefilled(&q, &keys, &rts[0]);
            for threads in [1, ALL_CORES] {
                let mut group =
                    c.benchmark_group(format!("local/{set_name}/{}/{threads}t", q.name));
                configure(&mut group);
                bench_contenders(&mut group, &contenders, &q, &keys, threads, &rts);
                group.finish();
            }
        }
    }
}

/// The contenders of one scenario, by the names the benches use.
const CONTENDERS: [&str; 5] = [
    "ours_store",
    "ours_sync",
    "ours_limiter",
    "governor",
    "throttlecrab",
];

/// Decisions `calls.start..calls.end` of contender `which` (one per
/// call, split over `threads` threads): the count is `calls.len()`, and
/// the keys go on from `calls.start`, the calls this contender's earlier
/// runs made, so each run walks keys that no run has touched lately and a
/// contender never finds its keys warm from the run before it (at a
/// million keys that decides more than the code does). Returns the wall
/// time and how many were admitted.
fn run_contender(
    which: &str,
    c: &Contenders,
    q: &SameQuota,
    keys: &[String],
    threads: usize,
    rts: &[Runtime],
    calls: std::ops::Range<u64>,
) -> (Duration, u64) {
    let (iters, walked) = (calls.end - calls.start, calls.start);
    let admitted = AtomicU64::new(0);
    let count = |ok: u64| {
        admitted.fetch_add(ok, Ordering::Relaxed);
    };
    let elapsed = run_split(threads, iters, |t, n| {
        let mut cur = Cursor::going_on(keys.len(), walked as usize, t, threads);
        let mut ok = 0u64;
        match which {
            "ours_store" => {
                for _ in 0..n {
                    let k = keys[cur.next_index()].as_bytes();
                    let d = decide_in_place(&*c.dyn_store, k, &q.ours, 1).expect("valid cost");
                    ok += u64::from(d.allowed);
                }
            }
            "ours_sync" => {
                for _ in 0..n {
                    let k = keys[cur.next_index()].as_bytes();
                    let d = c.store.decide_now(k, &q.ours, 1).expect("valid cost");
                    ok += u64::from(d.allowed);
                }
            }
            "ours_limiter" => rts[t].block_on(async {
                for _ in 0..n {
                    let d = c.limiter.check(&keys[cur.next_index()]).await;
                    ok += u64::from(d.allowed);
                }
            }),
            "governor" => {
                for _ in 0..n {
                    ok += u64::from(c.governor.check_key(&keys[cur.next_index()]).is_ok());
                }
            }
            "throttlecrab" => {
                for _ in 0..n {
                    let k = &keys[cur.next_index()];
                    ok += u64::from(throttlecrab_check(&c.throttlecrab, k, q.throttlecrab));
                }
            }
            other => panic!("unknown contender {other}"),
        }
        count(ok);
    });
    (elapsed, admitted.load(Ordering::Relaxed))
}

fn bench_contenders(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    c: &Contenders,
    q: &SameQuota,
    keys: &[String],
    threads: usize,
    rts: &[Runtime],
) {
    for which in CONTENDERS {
        let admitted = AtomicU64::new(0);
        let total = AtomicU64::new(0);
        group.bench_function(which, |b| {
            b.iter_custom(|iters| {
                let walked = total.fetch_add(iters, Ordering::Relaxed);
                let calls = walked..walked + iters;
                let (elapsed, ok) = run_contender(which, c, q, keys, threads, rts, calls);
                admitted.fetch_add(ok, Ordering::Relaxed);
                elapsed
            })
        });
        report_admitted(which, &admitted, &total);
    }
}

// ---------------------------------------------------------------------------
// Interleaved: every contender in turn, in short slices, many rounds
// ---------------------------------------------------------------------------

/// Wall time of one slice of one contender (on one thread).
const SLICE: Duration = Duration::from_millis(40);
/// Rounds per scenario; each round runs every contender once, in an order
/// rotated from round to round.
const ROUNDS: usize = 15;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `LOCAL_INTERLEAVED=1 cargo bench -p ratelimit-benches --bench local`:
/// the local-store scenarios with every contender run in turn, in slices
/// of about 40 ms, for 15 rounds, so that the contenders of a scenario share the
/// machine's load (other builds on a shared host move criterion's
/// back-to-back groups by up to 2x). Prints, per scenario, the median
/// nanoseconds per decision of each contender and the median of the
/// per-round ratios to governor (each ratio taken from slices run next to
/// each other). `LOCAL_INTERLEAVED` may name key sets to run
/// (`hot_key,10k_keys,1m_keys`).
fn interleaved(sets: &str) {
    let rts = runtimes(ALL_CORES);
    let key_sets: [(&str, usize); 3] =
        [("hot_key", 1), ("10k_keys", 10_000), ("1m_keys", 1_000_000)];
    println!(
        "| keys | quota | threads | fastest path (`decide_now`) | `dyn Store` decide | `Limiter::check` | governor | throttlecrab | fastest/gov | store/gov | limiter/gov | throttlecrab/gov |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (set_name, n) in key_sets {
        if !sets.is_empty() && sets != "1" && !sets.split(',').any(|s| s == set_name) {
            continue;
        }
        let keys = caller_ids(n);
        for q in quotas() {
            let c = Contenders::prefilled(&q, &keys, &rts[0]);
            for threads in [1, ALL_CORES] {
                // Decisions per slice, from a first run of each on one
                // thread (on several, the timing thread may start its clock
                // late on a loaded host), times the threads.
                let per_slice: Vec<u64> = CONTENDERS
                    .iter()
                    .map(|w| {
                        let (d, _) = run_contender(w, &c, &q, &keys, 1, &rts, 0..100_000);
                        let ns = d.as_nanos().max(1) as f64 / 100_000.0;
                        ((SLICE.as_nanos() as f64 / ns) as u64).clamp(10_000, 10_000_000)
                            * threads as u64
                    })
                    .collect();
                // Keys each contender has walked (the calibration above
                // walked the first 100,000).
                let mut walked = [100_000u64; CONTENDERS.len()];
                let mut ns: Vec<Vec<f64>> = vec![Vec::new(); CONTENDERS.len()];
                let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); CONTENDERS.len()];
                for round in 0..ROUNDS {
                    let mut this = [0.0; CONTENDERS.len()];
                    for k in 0..CONTENDERS.len() {
                        let i = (k + round) % CONTENDERS.len();
                        let iters = per_slice[i];
                        let (d, _) = run_contender(
                            CONTENDERS[i],
                            &c,
                            &q,
                            &keys,
                            threads,
                            &rts,
                            walked[i]..walked[i] + iters,
                        );
                        walked[i] += iters;
                        this[i] = d.as_nanos() as f64 / iters as f64;
                    }
                    for i in 0..CONTENDERS.len() {
                        ns[i].push(this[i]);
                        ratios[i].push(this[i] / this[3]);
                    }
                }
                let m: Vec<f64> = ns.into_iter().map(median).collect();
                let r: Vec<f64> = ratios.into_iter().map(median).collect();
                println!(
                    "| {set_name} | {} | {threads} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} |",
                    q.name, m[1], m[0], m[2], m[3], m[4], r[1], r[0], r[2], r[4]
                );
            }
        }
    }
}

criterion_group!(benches, model_step, local_store);

fn main() {
    if let Some(sets) = std::env::var_os("LOCAL_INTERLEAVED") {
        interleaved(&sets.to_string_lossy());
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
