//! Outbound use: worker pools in several processes share one allowance of
//! a third-party API through Redis, each worker waiting with
//! `Limiter::acquire` for its turn.
//!
//! ```text
//! cargo run -p ratelimit-examples --bin workers -- --redis redis://127.0.0.1:6379/
//! cargo run -p ratelimit-examples --bin workers -- --redis URL --processes 2 --workers 4 --rate 50 --burst 5 --seconds 5
//! ```
//!
//! The parent starts `--processes` copies of itself; each runs `--workers`
//! tasks that call `acquire("third-party-api", 1, ...)` in a loop for
//! `--seconds`, counting what they were granted. The parent prints each
//! process's count and the achieved rate next to the quota: together they
//! may never exceed `burst + rate × T` in a span of T.

use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratelimit_core::{FailurePolicy, Limiter, Quota, Rate};
use ratelimit_redis::RedisStore;

const USAGE: &str = "usage: workers --redis <URL> [--processes N] [--workers N] [--rate PER_SECOND] [--burst N] [--seconds S]\n\
    \n  --redis      the Redis shared by every process (required)\
    \n  --processes  how many processes share the allowance (default 2)\
    \n  --workers    tasks per process (default 4)\
    \n  --rate       the allowance, calls per second (default 50)\
    \n  --burst      the bucket's capacity (default 5)\
    \n  --seconds    how long to run (default 5)";

#[derive(Debug, Clone)]
struct Args {
    redis: String,
    processes: u32,
    workers: u32,
    rate: u64,
    burst: u64,
    seconds: f64,
    /// Set in the children: the shared key prefix.
    child: Option<String>,
}

fn parse() -> Result<Option<Args>, String> {
    let mut a = Args {
        redis: String::new(),
        processes: 2,
        workers: 4,
        rate: 50,
        burst: 5,
        seconds: 5.0,
        child: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let num = |v: String| v.parse::<u64>().map_err(|e| format!("{v:?}: {e}"));
        match flag.as_str() {
            "--redis" => a.redis = value()?,
            "--processes" => {
                a.processes = u32::try_from(num(value()?)?).map_err(|e| e.to_string())?
            }
            "--workers" => a.workers = u32::try_from(num(value()?)?).map_err(|e| e.to_string())?,
            "--rate" => a.rate = num(value()?)?,
            "--burst" => a.burst = num(value()?)?,
            "--seconds" => {
                let v = value()?;
                a.seconds = v.parse().map_err(|e| format!("--seconds {v:?}: {e}"))?;
            }
            "--child" => a.child = Some(value()?),
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.redis.is_empty() {
        return Err("--redis is required: the processes share the allowance through it".into());
    }
    if a.processes == 0 || a.workers == 0 || !(a.seconds > 0.0 && a.seconds <= 3600.0) {
        return Err("--processes and --workers must be at least 1, --seconds in (0, 3600]".into());
    }
    Ok(Some(a))
}

/// One process: `workers` tasks acquiring from the shared quota until the
/// time is up. Prints `admitted <n>`.
async fn child(a: &Args, prefix: &str) -> Result<u64, Box<dyn std::error::Error>> {
    let store = RedisStore::builder(&a.redis).prefix(prefix).build().await?;
    let limiter = Limiter::builder(store)
        .quota(Quota::token_bucket(Rate::per_second(a.rate), a.burst)?.named("partner-api")?)
        // Outbound: never exceed a third party's allowance when Redis is down.
        .failure_policy(FailurePolicy::FailClosed)
        .timeout(Duration::from_millis(100))
        .build()?;
    let end = Instant::now() + Duration::from_secs_f64(a.seconds);
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..a.workers {
        let (limiter, admitted) = (limiter.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match limiter.acquire("third-party-api", 1, left).await {
                    // Here a real worker would make its call to the partner.
                    Ok(_) => {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => break,
                }
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    Ok(admitted.load(Ordering::Relaxed))
}

fn parent(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let prefix = format!("workers-{:x}", std::process::id() ^ 0x5EED);
    let exe = std::env::current_exe()?;
    let start = Instant::now();
    let mut children = Vec::new();
    for _ in 0..a.processes {
        children.push(
            Command::new(&exe)
                .args(["--redis", &a.redis])
                .args(["--workers", &a.workers.to_string()])
                .args(["--rate", &a.rate.to_string()])
                .args(["--burst", &a.burst.to_string()])
                .args(["--seconds", &a.seconds.to_string()])
                .args(["--child", &prefix])
                .stdout(Stdio::piped())
                .spawn()?,
        );
    }
    let mut counts = Vec::new();
    for c in children {
        let out = c.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let n = text
            .lines()
            .find_map(|l| l.strip_prefix("admitted "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .ok_or_else(|| format!("a worker process failed ({}): {text}", out.status))?;
        counts.push(n);
    }
    let span = start.elapsed().as_secs_f64();
    let total: u64 = counts.iter().sum();
    let bound = a.burst as f64 + a.rate as f64 * span;
    println!(
        "{} processes × {} workers sharing {} per second (burst {}) through Redis",
        a.processes, a.workers, a.rate, a.burst
    );
    println!("admitted per process: {counts:?}");
    println!("total {total} in {span:.2} s");
    println!(
        "achieved {:.1} per second; quota {} per second; at most {bound:.0} may pass in {span:.2} s",
        total as f64 / span,
        a.rate
    );
    if total as f64 > bound {
        return Err(format!("admitted {total}, more than the {bound:.0} the quota allows").into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match ratelimit_examples::args_or_exit(parse(), USAGE) {
        Ok(args) => args,
        Err(code) => return code,
    };
    if let Some(prefix) = args.child.clone() {
        return match child(&args, &prefix).await {
            Ok(n) => {
                println!("admitted {n}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("worker process: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let a = args.clone();
    match tokio::task::spawn_blocking(move || parent(&a).map_err(|e| e.to_string())).await {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
