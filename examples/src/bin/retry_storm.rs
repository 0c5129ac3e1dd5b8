//! A retry storm against Redis, with and without the limiter's deny cache.
//!
//! ```text
//! cargo run -p ratelimit-examples --bin retry_storm -- --redis redis://127.0.0.1:6379/
//! ```
//!
//! Many callers exhaust their quota and then retry hard (every 20 ms) for a
//! while. The same traffic, on a simulated clock injected into the Redis
//! store so both runs see identical times, goes through a limiter without
//! the deny cache and one with it, each on its own keys. The program prints,
//! per algorithm, the calls admitted by each (they must be identical: the
//! cache never denies a call the store would admit) and the Redis round
//! trips each made.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratelimit_core::store::{Answer, Capabilities, Request};
use ratelimit_core::{DenyCache, Limiter, ManualClock, Quota, Rate, Source, Store, StoreExt};
use ratelimit_redis::RedisStore;

const USAGE: &str = "usage: retry_storm --redis <URL> [--callers N] [--seconds S] [--every-ms MS]\n\
    \n  --callers   callers retrying at once (default 50)\
    \n  --seconds   simulated duration of the storm (default 10)\
    \n  --every-ms  each caller's retry interval, simulated (default 20)";

/// Counts the round trips the limiter makes.
#[derive(Debug)]
struct Counting {
    inner: RedisStore,
    calls: AtomicU64,
}

/// A wrapper forwards the one door, and so everything (keys, charges,
/// deadline).
impl Store for Counting {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.decide(request)
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

/// What one run measured.
#[derive(Debug, PartialEq, Eq)]
struct Run {
    admitted: Vec<bool>,
    round_trips: u64,
    cache_hits: u64,
}

async fn run(
    url: &str,
    quota: &Quota,
    cache: bool,
    callers: usize,
    steps: u64,
    every: Duration,
) -> Result<Run, Box<dyn std::error::Error>> {
    let clock = ManualClock::new(1_800_000_000_000_000);
    let prefix = format!("storm-{:016x}", rand_seed());
    // Generous timeouts: a stray timeout on a loaded machine would make the
    // two runs differ for a reason that has nothing to do with the cache.
    let store = RedisStore::builder(url)
        .prefix(&prefix)
        .clock(clock.clone())
        .response_timeout(Duration::from_secs(1))
        .connection_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(3))
        .build()
        .await?;
    let store = Arc::new(Counting {
        inner: store,
        calls: AtomicU64::new(0),
    });
    // A failure is reported (below) rather than hidden: fail closed.
    let mut b = Limiter::builder_arc(store.clone())
        .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
        .quota(quota.clone())
        .timeout(Duration::from_secs(3));
    if cache {
        b = b.deny_cache(DenyCache::new(100_000));
    }
    let limiter = b.build()?;
    let mut admitted = Vec::new();
    for _ in 0..steps {
        for c in 0..callers {
            let d = limiter.check(format!("caller-{c}")).await;
            if matches!(d.source, Source::FailOpen | Source::FailClosed) {
                let why = match store
                    .inner
                    .decide_one(format!("caller-{c}").as_bytes(), quota, 1)
                    .await
                {
                    Err(e) => e.to_string(),
                    Ok(_) => "it answers again".to_owned(),
                };
                return Err(format!(
                    "the store failed ({} errors, {} timeouts so far; now: {why})",
                    limiter.stats().errors,
                    limiter.stats().timeouts
                )
                .into());
            }
            admitted.push(d.allowed);
        }
        clock.advance(every);
    }
    Ok(Run {
        admitted,
        round_trips: store.calls.load(Ordering::Relaxed),
        cache_hits: limiter.stats().cache_hits,
    })
}

fn rand_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ u64::from(std::process::id()).rotate_left(32)
}

/// The quotas of the storm: 10 per minute, per caller.
fn quotas() -> Result<Vec<Quota>, ratelimit_core::ConfigError> {
    let r = Rate::per_minute(10);
    Ok(vec![
        Quota::fixed_window(r)?,
        Quota::sliding_window(r)?,
        Quota::sliding_log(r)?,
        Quota::token_bucket(r, 10)?,
    ])
}

async fn main_inner(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let mut url = None;
    let (mut callers, mut seconds, mut every_ms) = (50usize, 10u64, 20u64);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--redis" => url = Some(value()?.clone()),
            "--callers" => callers = value()?.parse()?,
            "--seconds" => seconds = value()?.parse()?,
            "--every-ms" => every_ms = value()?.parse()?,
            other => return Err(format!("unknown argument {other:?}\n{USAGE}").into()),
        }
    }
    let url = url.ok_or(USAGE)?;
    let every = Duration::from_millis(every_ms.max(1));
    let steps = seconds * 1000 / every_ms.max(1);
    println!(
        "{callers} callers, each retrying every {every_ms} ms for {seconds} s (simulated), \
         quota 10 per minute per caller\n"
    );
    println!(
        "| algorithm | calls | admitted (no cache / cache) | Redis round trips without cache | with cache | fewer |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for q in quotas()? {
        let plain = run(&url, &q, false, callers, steps, every).await?;
        let cached = run(&url, &q, true, callers, steps, every).await?;
        if plain.admitted != cached.admitted {
            let first = plain
                .admitted
                .iter()
                .zip(&cached.admitted)
                .position(|(a, b)| a != b);
            return Err(format!(
                "{}: the deny cache changed what was admitted (first difference at call {first:?})",
                q.kind()
            )
            .into());
        }
        let n = plain.admitted.iter().filter(|a| **a).count();
        let fewer = 100.0 * (1.0 - cached.round_trips as f64 / plain.round_trips as f64);
        println!(
            "| {} | {} | {n} / {n} | {} | {} | {fewer:.1} % |",
            q.kind(),
            plain.admitted.len(),
            plain.round_trips,
            cached.round_trips
        );
        debug_assert_eq!(cached.round_trips + cached.cache_hits, plain.round_trips);
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    match main_inner(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
