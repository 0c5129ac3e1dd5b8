//! The store under overload, as bursts meet it: an arrival rate (open loop)
//! and many callers (closed loop), on one real `redis-server`, with each
//! client.
//!
//! ```text
//! cargo run --release -p ratelimit-benches --features fred --bin overload -- --runs 3
//! cargo run --release -p ratelimit-benches --features fred --bin overload -- --busy 2
//! ```
//!
//! Each run starts its own `redis-server` on a free loopback port and, per
//! client (redis-rs; fred with `--features fred`):
//!
//! 1. **Capacity μ**: `--capacity-tasks` (1,024) closed-loop tasks call
//!    `Limiter::check` for `--seconds` with a quota every call passes
//!    (every decision a write), each call a task of its own with its
//!    latency recorded as the open loop's arrivals are: μ is the store's
//!    decisions per second through the generator's own path (the load,
//!    the client and the server share the machine's cores, so a μ measured
//!    without the generator's cost would put 0.9 μ beyond what the machine
//!    completes).
//! 2. **Open loop**: arrivals at `m × μ` for each `--multiples` `m` (0.5,
//!    0.9, 1.5, 3), spaced as a Poisson process, each arrival its own task
//!    (so that nothing waits for an earlier answer), for `--seconds`, each
//!    one of the 100,000 callers the capacity was measured on. Per
//!    multiple: the share decided by the store, its goodput (store
//!    decisions per second and as a share of μ), the latency from the
//!    arrival's scheduled instant (no coordinated omission) at p50 and p99
//!    (every decision, and the store's), how many decisions the store did
//!    not make, and how many of those were answered within 1 ms of the
//!    call.
//!    One arrival in a hundred goes to one of 100 **tracked callers**
//!    under a second limiter whose quota binds (`--limit`, default 20, per
//!    day): every admission of theirs is counted, whatever decided it, and
//!    compared with the limit: what a degraded path admitted beyond it.
//! 3. **Closed loop**: for each `--closed` count (256, 4,096), that many
//!    tasks call `Limiter::check` back to back for `--seconds`: the store's
//!    decisions per second, and the ratio of each count's rate to the
//!    first's.
//!
//! Before each client's open loop and closed loop, the server's keyspace
//! is emptied and the load's 100,000 callers written once, unmeasured: a
//! keyspace of steady size, as a store at steady load has (one that grows
//! while it is measured is rehashed by Redis as it crosses each power of
//! two, and the node's rate halves meanwhile).
//!
//! Every limiter has the library's defaults (timeout 20 ms, or
//! `--timeout-ms`) and `.instances(2)`: the degraded mode of two
//! instances.
//!
//! With `OVERLOAD_DIAGNOSE` set, each setting also prints (stderr) the
//! store's answers by kind and the node's admission state at its end; with
//! `OVERLOAD_TRACE` set as well, every 50 ms of each open-loop setting:
//! how a collapse or a run of sheds starts (the node's measured capacity,
//! its limit in flight, one call's time and the sheds, beside what the
//! store answered).
//!
//! Options: `--client redis-rs|fred` (repeatable; default every client
//! built), `--runs R` (1), `--seconds S` (3), `--timeout-ms T`,
//! `--multiples a,b,..`, `--closed a,b,..`, `--capacity-tasks N`,
//! `--only open|closed` (repeatable), `--limit L`, `--busy N`: N processes
//! that spin on the CPUs for the whole run, at the load's own priority
//! (a host kept busy by other work), `--server-cpu N`: the server alone on
//! CPU N, the load on the others (`taskset`).

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratelimit_benches::SplitMix64;
use ratelimit_benches::clients::{Lib, redis_store_io};
use ratelimit_core::{Limiter, Quota, Rate, Source};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_server::RedisServer;

const USAGE: &str = "usage: overload [--client redis-rs|fred]... [--runs R] [--seconds S] \
[--timeout-ms T] [--multiples a,b,..] [--closed a,b,..] [--capacity-tasks N] \
[--only open|closed]... [--limit L] [--busy N] [--server-cpu N] [--no-io-thread]";

#[derive(Debug, Clone)]
struct Args {
    clients: Vec<String>,
    runs: usize,
    seconds: f64,
    timeout: Option<Duration>,
    multiples: Vec<f64>,
    closed: Vec<usize>,
    capacity_tasks: usize,
    sections: Vec<String>,
    limit: u64,
    busy: usize,
    server_cpu: Option<usize>,
    io_thread: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        clients: Vec::new(),
        runs: 1,
        seconds: 3.0,
        timeout: None,
        multiples: vec![0.5, 0.9, 1.5, 3.0],
        closed: vec![256, 4_096],
        capacity_tasks: 1_024,
        sections: Vec::new(),
        limit: 20,
        busy: 0,
        server_cpu: None,
        io_thread: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        if arg == "--spin" {
            spin();
        }
        let mut value = || {
            it.next().unwrap_or_else(|| {
                eprintln!("{arg} needs a value\n{USAGE}");
                std::process::exit(2)
            })
        };
        let number = |v: String| -> f64 {
            v.parse().unwrap_or_else(|_| {
                eprintln!("not a number: {v:?}\n{USAGE}");
                std::process::exit(2)
            })
        };
        match arg.as_str() {
            "--client" => a.clients.push(value()),
            "--runs" => a.runs = number(value()) as usize,
            "--seconds" => a.seconds = number(value()),
            "--timeout-ms" => a.timeout = Some(Duration::from_millis(number(value()) as u64)),
            "--multiples" => a.multiples = value().split(',').map(|v| number(v.into())).collect(),
            "--closed" => {
                a.closed = value()
                    .split(',')
                    .map(|v| number(v.into()) as usize)
                    .collect()
            }
            "--capacity-tasks" => a.capacity_tasks = number(value()) as usize,
            "--only" => a.sections.push(value()),
            "--limit" => a.limit = number(value()) as u64,
            "--busy" => a.busy = number(value()) as usize,
            "--server-cpu" => a.server_cpu = Some(number(value()) as usize),
            "--no-io-thread" => a.io_thread = false,
            _ => ratelimit_benches::not_an_option(&arg, USAGE),
        }
    }
    if a.sections.is_empty() {
        a.sections = vec!["open".into(), "closed".into()];
    }
    a.runs = a.runs.max(1);
    a.capacity_tasks = a.capacity_tasks.max(1);
    a
}

/// A busy process: spins until its parent is gone (the `--busy` load).
fn spin() -> ! {
    let parent = std::os::unix::process::parent_id();
    let mut x = 0u64;
    loop {
        for _ in 0..10_000_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        if std::os::unix::process::parent_id() != parent {
            std::process::exit(0);
        }
    }
}

/// The `--busy` processes, killed when dropped.
struct Busy(Vec<Child>);

impl Busy {
    fn start(n: usize) -> Self {
        let exe = std::env::current_exe().expect("this program's path");
        Self(
            (0..n)
                .map(|_| {
                    Command::new(&exe)
                        .arg("--spin")
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("start a busy process")
                })
                .collect(),
        )
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The callers of the load (`c0` .. `c99999`), in every section: a
/// keyspace each limiter has written in full before it is measured
/// ([`steady_keyspace`]), so that Redis never grows its table of keys
/// while a figure is taken.
const CALLERS: usize = 100_000;

/// Empties the server's keyspace and has `limiter` write every one of the
/// [`CALLERS`] once, unmeasured, so that what is measured next runs on a
/// keyspace of steady size. A keyspace that grows while it is measured
/// is rehashed by Redis as it crosses each power of two (about 40 % of the
/// server's CPU for a few hundred ms at 130,000 and 260,000 keys, when the
/// open loop drew its callers from a million): the node's rate halves
/// meanwhile, a passing state of the server's memory that a store at
/// steady load does not meet.
async fn steady_keyspace(server: &RedisServer, limiter: &Limiter) {
    let mut conn = server.connection();
    redis::cmd("FLUSHDB")
        .query::<()>(&mut conn)
        .expect("FLUSHDB");
    let tasks = 256;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                for i in CALLERS * t / tasks..CALLERS * (t + 1) / tasks {
                    limiter.check(format!("c{i}")).await;
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("warm-up task");
    }
}

/// A quota every call passes.
fn admit_all() -> Quota {
    Quota::fixed_window(Rate::per_day(1_000_000_000_000)).expect("quota")
}

/// Latencies in µs, one bucket per µs up to 1 s (the rest in the last).
struct Histogram(Vec<AtomicU32>);

impl Histogram {
    const SPAN: usize = 1_000_000;

    fn new() -> Self {
        Self((0..Self::SPAN).map(|_| AtomicU32::new(0)).collect())
    }

    fn record(&self, d: Duration) {
        let us = usize::try_from(d.as_micros()).unwrap_or(usize::MAX);
        self.0[us.min(Self::SPAN - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// The `p` quantile in ms (NaN when empty).
    fn quantile_ms(&self, p: f64) -> f64 {
        let counts: Vec<u64> = self
            .0
            .iter()
            .map(|c| u64::from(c.load(Ordering::Relaxed)))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return f64::NAN;
        }
        let rank = ((total as f64 * p).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (us, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return us as f64 / 1e3;
            }
        }
        f64::NAN
    }
}

/// What the decisions of one open-loop setting came to.
struct Tally {
    store: AtomicU64,
    other: AtomicU64,
    /// Decisions the store did not make, answered within 1 ms of the call.
    quick: AtomicU64,
    by_source: [AtomicU64; 8],
    all: Histogram,
    by_store: Histogram,
    /// From an arrival's scheduled instant to its call: the generator's
    /// and the scheduler's lag, in the latency but not the store's doing.
    lag: Histogram,
    /// Admissions per tracked caller.
    tracked: Vec<AtomicU64>,
}

impl Tally {
    fn new(tracked: usize) -> Self {
        Self {
            store: AtomicU64::new(0),
            other: AtomicU64::new(0),
            quick: AtomicU64::new(0),
            by_source: Default::default(),
            all: Histogram::new(),
            by_store: Histogram::new(),
            lag: Histogram::new(),
            tracked: (0..tracked).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn add(&self, source: Source, since_arrival: Duration, call: Duration) {
        self.all.record(since_arrival);
        self.lag.record(since_arrival.saturating_sub(call));
        self.by_source[source_index(source)].fetch_add(1, Ordering::Relaxed);
        if source == Source::Store {
            self.store.fetch_add(1, Ordering::Relaxed);
            self.by_store.record(since_arrival);
        } else {
            self.other.fetch_add(1, Ordering::Relaxed);
            if call <= Duration::from_millis(1) {
                self.quick.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn source_index(s: Source) -> usize {
    match s {
        Source::Store => 0,
        Source::FailOpen => 1,
        Source::FailClosed => 2,
        Source::Fallback => 3,
        Source::Cache => 4,
        Source::Shadow => 5,
        #[allow(unreachable_patterns)]
        _ => 6,
    }
}

const SOURCE_NAMES: [&str; 7] = [
    "store",
    "fail_open",
    "fail_closed",
    "fallback",
    "cache",
    "shadow",
    "other",
];

/// The clients to run.
fn libs(a: &Args) -> Vec<Lib> {
    Lib::all()
        .into_iter()
        .filter(|l| a.clients.is_empty() || a.clients.iter().any(|c| c == l.name()))
        .collect()
}

/// A limiter over `store` under `quota`, in `namespace`, with the run's
/// timeout and the degraded mode of two instances.
/// With `OVERLOAD_DIAGNOSE` set: the store's errors by kind, for reading a
/// collapse (what the store answered besides decisions).
#[derive(Debug)]
struct Counting {
    inner: RedisStore,
    /// Ok, Overloaded, Expired, Timeout, Unavailable, other.
    counts: [AtomicU64; 6],
}

impl Counting {
    fn count(&self, r: &ratelimit_core::Result<ratelimit_core::store::Decisions>) {
        use ratelimit_core::StoreError as E;
        let i = match r {
            Ok(_) => 0,
            Err(E::Overloaded { .. }) => 1,
            Err(E::Expired) => 2,
            Err(E::Timeout(_)) => 3,
            Err(E::Unavailable { .. }) => 4,
            Err(_) => 5,
        };
        self.counts[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    fn read(&self) -> [u64; 6] {
        std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed))
    }

    fn take(&self) -> [u64; 6] {
        std::array::from_fn(|i| self.counts[i].swap(0, Ordering::Relaxed))
    }
}

impl ratelimit_core::Store for Counting {
    fn decide<'a>(
        &'a self,
        request: ratelimit_core::store::Request<'a>,
    ) -> ratelimit_core::store::Answer<'a> {
        use ratelimit_core::store::Answer;
        match self.inner.decide(request).into_ready() {
            Ok(r) => {
                self.count(&r);
                Answer::ready(r)
            }
            Err(pending) => Answer::pending(async move {
                let r = pending.await;
                self.count(&r);
                r
            }),
        }
    }

    fn capabilities(&self) -> ratelimit_core::store::Capabilities {
        self.inner.capabilities()
    }
}

/// A limiter like [`limiter`]'s over the store's [`Counting`] wrapper.
fn counting_limiter(counting: &Arc<Counting>, namespace: &str, a: &Args) -> Limiter {
    let mut b = Limiter::builder_arc(Arc::clone(counting) as Arc<dyn ratelimit_core::Store>)
        .quota(admit_all())
        .namespace(namespace)
        .expect("namespace")
        .instances(2);
    if let Some(t) = a.timeout {
        b = b.timeout(t);
    }
    b.build().expect("limiter")
}

/// Prints (stderr) the store's answers by kind since the last call, and
/// its node's admission state.
fn diagnosis(counting: &Counting, store: &RedisStore) {
    let node = store.engine().domains().get(store.node());
    let adm = node.admission();
    eprintln!(
        "  store answers (ok, overloaded, expired, timeout, unavailable, other): {:?}\n  admission: capacity {:?}/s, call {:?}, limit {:?}, shed (door, queue) {:?}",
        counting.take(),
        adm.capacity(Instant::now()),
        adm.call_time(),
        adm.limit(),
        adm.shed()
    );
}

/// With `OVERLOAD_TRACE` also set: every 50 ms of an open-loop setting,
/// the store's answers by kind and the node's admission state (stderr).
async fn trace(counting: Arc<Counting>, store: RedisStore, seconds: f64) {
    let node = store.engine().domains().get(store.node());
    let adm = node.admission();
    let start = Instant::now();
    let mut seen = counting.read();
    let mut shed = adm.shed();
    while start.elapsed().as_secs_f64() < seconds {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (now, s) = (counting.read(), adm.shed());
        eprintln!(
            "  t {:>5.0} ms: ok {:>6} overloaded {:>5} timeout {:>5} | capacity {:>7.0}/s limit {:>5} call {:>5.0} µs shed at the door {:>5} in the queue {:>4}",
            start.elapsed().as_secs_f64() * 1e3,
            now[0] - seen[0],
            now[1] - seen[1],
            now[3] - seen[3],
            adm.capacity(Instant::now()).unwrap_or(0.0),
            adm.limit().unwrap_or(0),
            adm.call_time().as_secs_f64() * 1e6,
            s.0 - shed.0,
            s.1 - shed.1,
        );
        (seen, shed) = (now, s);
    }
}

fn limiter(store: &RedisStore, quota: Quota, namespace: &str, a: &Args) -> Limiter {
    let mut b = Limiter::builder(store.clone())
        .quota(quota)
        .namespace(namespace)
        .expect("namespace")
        .instances(2);
    if let Some(t) = a.timeout {
        b = b.timeout(t);
    }
    b.build().expect("limiter")
}

/// `tasks` closed-loop callers for `seconds`: store decisions per second.
async fn closed_loop(limiter: &Limiter, tasks: usize, seconds: f64) -> (f64, f64) {
    closed(limiter, tasks, seconds, false).await
}

/// The store's capacity μ as the open loop drives it: a closed loop whose
/// every call, like an arrival of the open loop, is a task of its own with
/// its latency recorded (the generator's cost per call counted in, so
/// that 0.9 μ is below what this machine completes through the open loop,
/// generator included).
async fn capacity_loop(limiter: &Limiter, tasks: usize, seconds: f64) -> f64 {
    closed(limiter, tasks, seconds, true).await.0
}

async fn closed(limiter: &Limiter, tasks: usize, seconds: f64, spawned: bool) -> (f64, f64) {
    let latency = Arc::new(Histogram::new());
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let callers = CALLERS;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let limiter = limiter.clone();
            let latency = Arc::clone(&latency);
            tokio::spawn(async move {
                let (mut store, mut all) = (0u64, 0u64);
                let mut i = callers * t / tasks;
                let mut key = String::with_capacity(16);
                while Instant::now() < end {
                    use std::fmt::Write;
                    key.clear();
                    let _ = write!(key, "c{i}");
                    let d = if spawned {
                        let (limiter, latency, key) =
                            (limiter.clone(), Arc::clone(&latency), key.clone());
                        tokio::spawn(async move {
                            let called = Instant::now();
                            let d = limiter.check(key.as_bytes()).await;
                            latency.record(called.elapsed());
                            d
                        })
                        .await
                        .expect("call task")
                    } else {
                        limiter.check(key.as_bytes()).await
                    };
                    all += 1;
                    if d.source == Source::Store {
                        store += 1;
                    }
                    i = (i + 1) % callers;
                }
                (store, all)
            })
        })
        .collect();
    let (mut store, mut all) = (0, 0);
    for h in handles {
        let (s, n) = h.await.expect("load task");
        store += s;
        all += n;
    }
    let secs = start.elapsed().as_secs_f64();
    (store as f64 / secs, pct(store, all))
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// One open-loop setting: arrivals at `rate` a second for `seconds`.
async fn open_loop(
    load: &Limiter,
    tracked: &Limiter,
    rate: f64,
    seconds: f64,
    tracked_callers: usize,
) -> (Arc<Tally>, f64) {
    let tally = Arc::new(Tally::new(tracked_callers));
    let generators = 2;
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let per = rate / generators as f64;
    let handles: Vec<_> = (0..generators)
        .map(|g| {
            let (load, tracked, tally) = (load.clone(), tracked.clone(), Arc::clone(&tally));
            tokio::spawn(async move {
                let mut rng = SplitMix64(0x0a11_0c47 + g as u64);
                let mut next = start;
                let mut n = 0u64;
                loop {
                    let now = Instant::now();
                    if now >= end {
                        break;
                    }
                    while next <= now {
                        let arrival = next;
                        // Exponential gaps: a Poisson process at `per`.
                        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                        next += Duration::from_secs_f64(-(1.0 - u).ln() / per);
                        n += 1;
                        let tally = Arc::clone(&tally);
                        if n.is_multiple_of(100) {
                            let who = (rng.next_u64() % tracked_callers as u64) as usize;
                            let limiter = tracked.clone();
                            tokio::spawn(async move {
                                let called = Instant::now();
                                let d = limiter.check(format!("t{who}")).await;
                                let done = Instant::now();
                                if d.allowed {
                                    tally.tracked[who].fetch_add(1, Ordering::Relaxed);
                                }
                                tally.add(d.source, done - arrival, done - called);
                            });
                        } else {
                            let key = rng.next_u64() % CALLERS as u64;
                            let limiter = load.clone();
                            tokio::spawn(async move {
                                let called = Instant::now();
                                let d = limiter.check(format!("c{key}")).await;
                                let done = Instant::now();
                                tally.add(d.source, done - arrival, done - called);
                            });
                        }
                    }
                    tokio::time::sleep_until(next.into()).await;
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("generator");
    }
    // Let the last arrivals finish (each is bounded by its timeout).
    let drain = Instant::now() + Duration::from_secs(2);
    let expected = |t: &Tally| t.store.load(Ordering::Relaxed) + t.other.load(Ordering::Relaxed);
    let mut last = expected(&tally);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = expected(&tally);
        if now == last || Instant::now() > drain {
            break;
        }
        last = now;
    }
    (tally, start.elapsed().as_secs_f64().min(seconds))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

struct OpenRow {
    lib: Lib,
    run: usize,
    multiple: f64,
    capacity: f64,
    offered: f64,
    decisions: u64,
    store_share: f64,
    goodput: f64,
    p50: f64,
    p99: f64,
    store_p99: f64,
    lag_p99: f64,
    not_by_store: u64,
    quick: u64,
    sources: String,
    over_limit: u64,
    worst_over: u64,
}

async fn open_section(a: &Args, server: &RedisServer) {
    let mut rows = Vec::new();
    let tracked_callers = 100;
    for run in 1..=a.runs {
        for lib in libs(a) {
            let store = redis_store_io(lib, server, a.io_thread).await;
            let ns = |what: &str| format!("o{run}{}{what}", lib.name().replace('-', ""));
            let diagnose = std::env::var_os("OVERLOAD_DIAGNOSE").is_some();
            let counting = Arc::new(Counting {
                inner: store.clone(),
                counts: Default::default(),
            });
            let load = if diagnose {
                counting_limiter(&counting, &ns("load"), a)
            } else {
                limiter(&store, admit_all(), &ns("load"), a)
            };
            steady_keyspace(server, &load).await;
            let _ = counting.take();
            eprintln!("open loop: run {run}, {}: capacity", lib.name());
            let capacity = capacity_loop(&load, a.capacity_tasks, a.seconds).await;
            for (m, &multiple) in a.multiples.iter().enumerate() {
                let quota = Quota::fixed_window(Rate::per_day(a.limit)).expect("tracked quota");
                let tracked = limiter(&store, quota, &ns(&format!("t{m}")), a);
                let offered = capacity * multiple;
                eprintln!(
                    "open loop: run {run}, {}: {multiple} x capacity = {offered:.0}/s",
                    lib.name()
                );
                let trace = (diagnose && std::env::var_os("OVERLOAD_TRACE").is_some())
                    .then(|| tokio::spawn(trace(Arc::clone(&counting), store.clone(), a.seconds)));
                let (t, secs) =
                    open_loop(&load, &tracked, offered, a.seconds, tracked_callers).await;
                if let Some(trace) = trace {
                    // It stops by itself after the setting's seconds.
                    let _ = trace.await;
                }
                if diagnose {
                    diagnosis(&counting, &store);
                }
                let store_n = t.store.load(Ordering::Relaxed);
                let other = t.other.load(Ordering::Relaxed);
                let over: Vec<u64> = t
                    .tracked
                    .iter()
                    .map(|c| c.load(Ordering::Relaxed).saturating_sub(a.limit))
                    .collect();
                let sources = SOURCE_NAMES
                    .iter()
                    .zip(&t.by_source)
                    .filter(|(_, c)| c.load(Ordering::Relaxed) > 0)
                    .map(|(n, c)| format!("{n} {}", c.load(Ordering::Relaxed)))
                    .collect::<Vec<_>>()
                    .join(", ");
                rows.push(OpenRow {
                    lib,
                    run,
                    multiple,
                    capacity,
                    offered,
                    decisions: store_n + other,
                    store_share: pct(store_n, store_n + other),
                    goodput: store_n as f64 / secs,
                    p50: t.all.quantile_ms(0.5),
                    p99: t.all.quantile_ms(0.99),
                    store_p99: t.by_store.quantile_ms(0.99),
                    lag_p99: t.lag.quantile_ms(0.99),
                    not_by_store: other,
                    quick: t.quick.load(Ordering::Relaxed),
                    sources,
                    over_limit: over.iter().sum(),
                    worst_over: over.iter().copied().max().unwrap_or(0),
                });
            }
        }
    }
    println!(
        "### Open loop: Poisson arrivals at multiples of the store's capacity μ, {} s each\n",
        a.seconds
    );
    println!(
        "| client | run | μ (decisions/s) | × μ | offered/s | decisions | by the store | goodput | goodput / μ | p50 | p99 | store p99 | start lag p99 | not by the store | of those ≤ 1 ms | sources | tracked: admitted over the limit (sum, worst caller) |"
    );
    println!(
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"
    );
    for r in &rows {
        println!(
            "| {} | {} | {:.0} | {} | {:.0} | {} | {:.3} % | {:.0} | {:.3} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {} | {:.1} % | {} | {}, {} |",
            r.lib.name(),
            r.run,
            r.capacity,
            r.multiple,
            r.offered,
            r.decisions,
            r.store_share,
            r.goodput,
            r.goodput / r.capacity,
            r.p50,
            r.p99,
            r.store_p99,
            r.lag_p99,
            r.not_by_store,
            pct(r.quick, r.not_by_store),
            r.sources,
            r.over_limit,
            r.worst_over,
        );
    }
    println!();
    println!("#### Open loop, medians over {} run(s)\n", a.runs);
    println!(
        "| client | × μ | μ | by the store | goodput / μ | p99 | store p99 | not by the store answered ≤ 1 ms | tracked: most over the limit |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for lib in libs(a) {
        for &m in &a.multiples {
            let mine: Vec<&OpenRow> = rows
                .iter()
                .filter(|r| r.lib == lib && r.multiple == m)
                .collect();
            let med = |f: &dyn Fn(&OpenRow) -> f64| median(mine.iter().map(|r| f(r)).collect());
            println!(
                "| {} | {m} | {:.0} | {:.3} % | {:.3} | {:.2} ms | {:.2} ms | {:.1} % | {} |",
                lib.name(),
                med(&|r| r.capacity),
                med(&|r| r.store_share),
                med(&|r| r.goodput / r.capacity),
                med(&|r| r.p99),
                med(&|r| r.store_p99),
                med(&|r| pct(r.quick, r.not_by_store)),
                mine.iter().map(|r| r.worst_over).max().unwrap_or(0),
            );
        }
    }
    println!();
}

async fn closed_section(a: &Args, server: &RedisServer) {
    let mut rows: Vec<(Lib, usize, usize, f64, f64)> = Vec::new();
    for run in 1..=a.runs {
        for lib in libs(a) {
            let store = redis_store_io(lib, server, a.io_thread).await;
            let ns = format!("c{run}{}", lib.name().replace('-', ""));
            let diagnose = std::env::var_os("OVERLOAD_DIAGNOSE").is_some();
            let counting = Arc::new(Counting {
                inner: store.clone(),
                counts: Default::default(),
            });
            let load = if diagnose {
                counting_limiter(&counting, &ns, a)
            } else {
                limiter(&store, admit_all(), &ns, a)
            };
            steady_keyspace(server, &load).await;
            let _ = counting.take();
            for &tasks in &a.closed {
                eprintln!("closed loop: run {run}, {}: {tasks} callers", lib.name());
                let before = load.stats();
                let (rate, share) = closed_loop(&load, tasks, a.seconds).await;
                if diagnose {
                    eprintln!(
                        "  limiter before {before:?}\n  limiter after  {:?}",
                        load.stats()
                    );
                    diagnosis(&counting, &store);
                }
                rows.push((lib, run, tasks, rate, share));
            }
        }
    }
    println!(
        "### Closed loop: callers calling `Limiter::check` back to back, {} s each\n",
        a.seconds
    );
    println!(
        "| client | run | callers | store decisions/s | by the store | / first count's rate |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for &(lib, run, tasks, rate, share) in &rows {
        let first = rows
            .iter()
            .find(|r| r.0 == lib && r.1 == run)
            .map_or(f64::NAN, |r| r.3);
        println!(
            "| {} | {run} | {tasks} | {rate:.0} | {share:.3} % | {:.3} |",
            lib.name(),
            rate / first
        );
    }
    println!();
    println!("#### Closed loop, medians over {} run(s)\n", a.runs);
    println!(
        "| client | callers | store decisions/s | by the store | over the first count's rate |"
    );
    println!("|---|---:|---:|---:|---:|");
    for lib in libs(a) {
        for &tasks in &a.closed {
            let mine: Vec<&(Lib, usize, usize, f64, f64)> =
                rows.iter().filter(|r| r.0 == lib && r.2 == tasks).collect();
            let ratios: Vec<f64> = mine
                .iter()
                .map(|r| {
                    let first = rows
                        .iter()
                        .find(|f| f.0 == lib && f.1 == r.1)
                        .map_or(f64::NAN, |f| f.3);
                    r.3 / first
                })
                .collect();
            println!(
                "| {} | {tasks} | {:.0} | {:.3} % | {:.3} |",
                lib.name(),
                median(mine.iter().map(|r| r.3).collect()),
                median(mine.iter().map(|r| r.4).collect()),
                median(ratios),
            );
        }
    }
    println!();
}

fn main() {
    let a = parse_args();
    let machine = ratelimit_benches::cpus();
    if let Some(cpu) = a.server_cpu {
        ratelimit_benches::pin_self_beside(cpu);
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(run(a, machine));
}

async fn run(a: Args, machine: String) {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let server = RedisServer::start_local();
    if let Some(cpu) = a.server_cpu {
        let pid = server.process().pid().expect("the server runs");
        ratelimit_benches::pin(pid, &cpu.to_string());
    }
    let _busy = Busy::start(a.busy);
    println!("## overload: {} run(s)\n", a.runs);
    println!(
        "Machine: {machine}; {}; timeout {}; {}\n",
        if a.busy == 0 {
            "no other load".to_owned()
        } else {
            format!("{} busy processes spinning beside it", a.busy)
        },
        a.timeout
            .map_or_else(|| "20 ms (the default)".into(), |t| format!("{t:?}")),
        match a.server_cpu {
            Some(cpu) => format!("the server alone on CPU {cpu}, the load on the others"),
            None => "the server and the load on every CPU".to_owned(),
        }
    );
    let started = Instant::now();
    for section in a.sections.clone() {
        match section.as_str() {
            "open" => open_section(&a, &server).await,
            "closed" => closed_section(&a, &server).await,
            other => {
                eprintln!("unknown section {other:?}: open or closed\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    println!("(took {:.0} s)", started.elapsed().as_secs_f64());
}
