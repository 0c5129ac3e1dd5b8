//! Shared helpers for the benchmarks and load generators of the workspace.
//!
//! The benches themselves live in `benches/benches/` (criterion, run with
//! `cargo bench -p ratelimit-benches`); see `BENCHMARKS.md` at the repository
//! root for what they measure and the tables they produced.

pub mod clients;

/// Whether a reply of one of the store's single-quota scripts, called bare,
/// admitted: `allowed` first in the four integers, or a token bucket's one
/// integer (an admission; see `ratelimit_redis::decode::token_bucket`).
pub fn admitted(reply: &[i64]) -> bool {
    match reply {
        [packed] => *packed >= 0,
        _ => reply.first() == Some(&1),
    }
}

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use ratelimit_core::model::Charge;
use ratelimit_core::store::Request;
use ratelimit_core::{Decision, Quota, Store, StoreError};

/// One decision through a store's one door, `dyn Store` included, taken
/// in place as the limiter takes it: a one-charge request, no deadline.
///
/// # Panics
/// If the store answers pending (a network store): use `StoreExt::decide_one`.
#[inline]
pub fn decide_in_place(
    store: &dyn Store,
    key: &[u8],
    quota: &Quota,
    cost: u64,
) -> Result<Decision, StoreError> {
    let charges = [Charge::new(quota, cost)];
    match store.decide(Request::new(key, &charges)).into_single() {
        Ok(result) => result,
        Err(_) => panic!("the store answered pending: it does not answer in process"),
    }
}

/// `n` distinct caller ids (`customer-<i>`), in a fixed pseudo-random order.
///
/// The order is a Fisher-Yates shuffle driven by a fixed-seed SplitMix64, so
/// every run and every implementation sees the same sequence, and walking the
/// vector visits the keys in an order unrelated to their hashes or insertion.
pub fn caller_ids(n: usize) -> Vec<String> {
    let mut ids: Vec<String> = (0..n).map(|i| format!("customer-{i}")).collect();
    let mut rng = SplitMix64(0x5eed_1234_abcd_0042);
    for i in (1..ids.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        ids.swap(i, j);
    }
    ids
}

/// SplitMix64: a tiny deterministic generator for shuffles (not for security).
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Polls a future that is known to complete without waiting (such as
/// `Limiter::check` over the local store) once, with a no-op waker.
///
/// # Panics
/// If the future is not ready on its first poll.
pub fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("future was expected to be ready on first poll"),
    }
}

/// Runs `work(thread, count)` on `threads` threads at once, splitting `total`
/// iterations between them, and returns the wall time from the first start
/// to the last finish. With one thread it runs on the calling thread.
///
/// Divided by `total`, the result is the time per decision at the aggregate
/// throughput of all threads (the inverse of decisions per second).
pub fn run_split<W>(threads: usize, total: u64, work: W) -> Duration
where
    W: Fn(usize, u64) + Sync,
{
    let threads = threads.max(1);
    let share = |t: usize| total / threads as u64 + u64::from((t as u64) < total % threads as u64);
    if threads == 1 {
        let start = Instant::now();
        work(0, total);
        return start.elapsed();
    }
    let barrier = std::sync::Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (work, barrier) = (&work, &barrier);
            let n = share(t);
            s.spawn(move || {
                barrier.wait();
                work(t, n);
            });
        }
        barrier.wait();
        let start = Instant::now();
        // Leaving the scope joins every thread.
        start
    })
    .elapsed()
}

/// A cursor over a key set: thread `t` of `threads` starts at its own offset
/// and wraps around, without a division per step.
#[derive(Debug, Clone)]
pub struct Cursor {
    next: usize,
    len: usize,
}

impl Cursor {
    /// A cursor over `len` keys for thread `t` of `threads`.
    pub fn new(len: usize, t: usize, threads: usize) -> Self {
        Self::going_on(len, 0, t, threads)
    }

    /// [`Cursor::new`], with every thread's offset moved on by `start`: a
    /// run that goes on where an earlier run of the same contender stopped
    /// walks keys it has not touched lately, rather than the same first
    /// ones again (with a million keys, a slice of a run visits a tenth of
    /// them, and revisiting them would find them in the cache).
    pub fn going_on(len: usize, start: usize, t: usize, threads: usize) -> Self {
        assert!(len > 0, "empty key set");
        Self {
            next: (start % len + len * t / threads.max(1)) % len,
            len,
        }
    }

    /// The next index.
    #[inline]
    pub fn next_index(&mut self) -> usize {
        let i = self.next;
        self.next += 1;
        if self.next == self.len {
            self.next = 0;
        }
        i
    }
}

/// What a load program does with an argument it does not take: `--help`
/// (or `-h`) prints `usage` and exits 0; anything else prints it with the
/// argument to stderr and exits 2 (no panic, no backtrace).
pub fn not_an_option(arg: &str, usage: &str) -> ! {
    if arg == "--help" || arg == "-h" {
        println!("{usage}");
        std::process::exit(0);
    }
    eprintln!("unknown option {arg:?}\n{usage}");
    std::process::exit(2);
}

/// Sets the CPUs process `pid` and all its threads may run on (`cpus`, as
/// `taskset` takes them: `1`, `0,2-3`).
///
/// # Panics
/// When `taskset` (util-linux) is missing or refuses.
pub fn pin(pid: u32, cpus: &str) {
    let status = std::process::Command::new("taskset")
        .args(["--all-tasks", "--cpu-list", "--pid", cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("pinning needs taskset (util-linux): {e}"));
    assert!(status.success(), "taskset -apc {cpus} {pid}: {status}");
}

/// Pins this process to every CPU but `server_cpu` (before a runtime
/// starts: its threads inherit the CPUs, and it sizes itself by them).
///
/// # Panics
/// When the machine has one CPU, or `server_cpu` is not one of its CPUs.
pub fn pin_self_beside(server_cpu: usize) {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    assert!(
        server_cpu < cores && cores > 1,
        "--server-cpu {server_cpu}: this machine has CPUs 0-{}; the load needs one other",
        cores - 1
    );
    let others: Vec<String> = (0..cores)
        .filter(|&c| c != server_cpu)
        .map(|c| c.to_string())
        .collect();
    pin(std::process::id(), &others.join(","));
}

/// The machine as the load programs' reports name it: `N cores, MODEL`
/// (the CPUs this process may run on, and `/proc/cpuinfo`'s first model
/// name).
pub fn cpus() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {cpu}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn caller_ids_are_distinct_and_deterministic() {
        let a = caller_ids(1000);
        let b = caller_ids(1000);
        assert_eq!(a, b);
        let mut s = a.clone();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), 1000);
        assert_ne!(a[0], "customer-0", "shuffled");
    }

    #[test]
    fn run_split_runs_every_iteration() {
        for threads in 1..4 {
            let done = AtomicU64::new(0);
            run_split(threads, 1001, |_, n| {
                done.fetch_add(n, Ordering::Relaxed);
            });
            assert_eq!(done.load(Ordering::Relaxed), 1001);
        }
    }

    #[test]
    fn cursor_wraps_from_its_offset() {
        let mut c = Cursor::new(4, 1, 2);
        let v: Vec<usize> = (0..5).map(|_| c.next_index()).collect();
        assert_eq!(v, [2, 3, 0, 1, 2]);
        let mut c = Cursor::going_on(4, 7, 1, 2);
        let v: Vec<usize> = (0..3).map(|_| c.next_index()).collect();
        assert_eq!(v, [1, 2, 3]);
    }
}
