//! Load generator for the Redis store. Starts its own `redis-server` (through
//! `ratelimit_testkit::redis_server`) on a free loopback port and measures,
//! in one run and on that one server:
//!
//! 1. **Throughput and latency**: N concurrent tasks over M connections
//!    calling `Limiter::check` over `RedisStore`, for each algorithm and each
//!    client library (redis-rs; fred with `--features fred`); beside them the
//!    same token bucket script sent as a bare `EVALSHA` (no store, no
//!    limiter) and the two naive reference scripts (`INCR`+`EXPIRE` fixed
//!    window; hash-of-floats token bucket, see `benches/lua/`); and
//!    `redis-benchmark` running each script with `EVALSHA` at the same
//!    concurrency (N connections, one request in flight each).
//! 2. **Limiter overhead**: one task, one connection: latency of `PING`, of
//!    a bare `EVALSHA`, of `RedisStore::decide` and of `Limiter::check`.
//! 3. **Memory**: `used_memory` delta over many callers (one decision each)
//!    on a fresh server per layout.
//!
//! Sections 1 and 2 repeat `--runs` times; the tables give the median of the
//! runs and, for ratios, the median of the per-run ratios.
//!
//! ```text
//! cargo run --release -p ratelimit-benches --features fred --bin redis_load -- --runs 3
//! ```
//!
//! Options (defaults in parentheses): `--runs R` (3), `--tasks N` (32),
//! `--connections M` (4), `--callers K` (10000), `--seconds S` (3),
//! `--bench-requests Q` (per redis-benchmark test) (150000),
//! `--memory-callers C` (100000), `--deny` (use "100/min, burst 20" so most
//! calls are denied, instead of quotas no caller reaches), `--skip-memory`,
//! `--skip-overhead`, `--skip-throughput`, `--ratio-only` (instead of the
//! throughput section, only the token bucket through `RedisStore::decide`
//! and through `Limiter::check` against its bare `EVALSHA`, in interleaved
//! slices of 200 ms: the client-side ratios per round and their medians),
//! `--cluster` (also drive
//! `ClusterStore` on a local 6-node cluster: 3 masters + 3 replicas).

mod book;
mod cluster;
mod contenders;
mod load;
mod memory;
mod options;
mod overhead;
mod quotas;
mod redis_benchmark;
mod script_costs;
mod throughput;

use std::process::Command;
use std::time::SystemTime;

use ratelimit_benches::clients::Lib;
use ratelimit_testkit::redis_server::RedisServer;

use crate::book::{Book, fmt_opt, median};
use crate::cluster::cluster_section;
use crate::load::Measured;
use crate::memory::memory_section;
use crate::options::parse_args;
use crate::overhead::overhead_run_isolated;
use crate::quotas::{Mode, Quotas};
use crate::script_costs::{print_script_costs, script_costs_run};
use crate::throughput::throughput_run;

fn machine() -> String {
    let redis = Command::new("redis-server")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!("{}; {redis}", ratelimit_benches::cpus())
}

#[tokio::main]
async fn main() {
    let a = parse_args();
    let q = Quotas {
        mode: if a.deny { Mode::Deny } else { Mode::Admit },
    };
    let started = SystemTime::now();
    println!(
        "## redis_load: {} run(s), {} tasks over {} connections, {} callers, {} s per contender, quotas: {}\n",
        a.runs,
        a.tasks,
        a.connections,
        a.callers,
        a.seconds,
        q.describe()
    );
    println!("Machine: {}\n", machine());
    let server = RedisServer::start_local();
    let mut load = Book::default();
    let mut seq = Book::default();
    let mut costs = Book::default();
    for run in 1..=a.runs {
        eprintln!("run {run} of {}", a.runs);
        if a.throughput {
            if !a.ratio_only {
                script_costs_run(&a, &q, &server, &mut costs);
            }
            throughput_run(&a, &q, &server, &mut load).await;
        }
        if a.overhead {
            overhead_run_isolated(&a, &q, &server.url(), &mut seq);
        }
    }
    // `--ratio-only` printed its ratios as it went: no tables to print.
    if a.throughput && !a.ratio_only {
        load.print_table(
            &format!(
                "### Throughput and latency: {} concurrent requests ({} tasks over {} connections; redis-benchmark: {} connections)",
                a.tasks, a.tasks, a.connections, a.tasks
            ),
            &load.order,
        );
        print_script_costs(&costs);
        println!("Same-run ratios (median over runs):\n");
        println!("| ratio | value | target |");
        println!("|---|---:|---|");
        let ps = |m: &Measured| m.per_second;
        let naive_rb = format!(
            "redis-benchmark -c {}: naive hash-of-floats token bucket",
            a.tasks
        );
        let ours_rb = format!("redis-benchmark -c {}: ours token_bucket", a.tasks);
        let pipe = (a.tasks / a.connections).max(1);
        let ours_rb_p = format!(
            "redis-benchmark -c {} -P {pipe}: ours token_bucket",
            a.connections
        );
        let naive_rb_p = format!(
            "redis-benchmark -c {} -P {pipe}: naive hash-of-floats token bucket",
            a.connections
        );
        let naive_client = "naive hash-of-floats token bucket, bare EVALSHA (redis-rs)";
        let row = |label: &str, v: Option<f64>, target: &str| {
            println!("| {label} | {} | {target} |", fmt_opt(v, 2));
        };
        row(
            &format!(
                "ours token bucket script / naive hash-of-floats script, redis-benchmark -c {}",
                a.tasks
            ),
            load.ratio(&ours_rb, &naive_rb, ps),
            ">= 1.3",
        );
        row(
            &format!(
                "ours token bucket script / naive hash-of-floats script, redis-benchmark -c {} -P {pipe}",
                a.connections
            ),
            load.ratio(&ours_rb_p, &naive_rb_p, ps),
            ">= 1.3",
        );
        let su = |m: &Measured| m.server_us;
        row(
            "ours token bucket script / naive hash-of-floats script: server time per call, naive / ours (one connection)",
            costs.ratio("naive hash-of-floats token bucket", "ours token_bucket", su),
            ">= 1.3",
        );
        row(
            "(prototype) one-integer token bucket: server time per call, naive / prototype (one connection)",
            costs.ratio(
                "naive hash-of-floats token bucket",
                "prototype one-integer token bucket",
                su,
            ),
            "(what a one-integer layout would give)",
        );
        let proto_rb = format!(
            "redis-benchmark -c {}: prototype one-integer token bucket",
            a.tasks
        );
        let proto_rb_p = format!(
            "redis-benchmark -c {} -P {pipe}: prototype one-integer token bucket",
            a.connections
        );
        row(
            &format!(
                "(prototype) one-integer token bucket / naive hash-of-floats, redis-benchmark -c {}",
                a.tasks
            ),
            load.ratio(&proto_rb, &naive_rb, ps),
            "(what a one-integer layout would give)",
        );
        row(
            &format!(
                "(prototype) one-integer token bucket / naive hash-of-floats, redis-benchmark -c {} -P {pipe}",
                a.connections
            ),
            load.ratio(&proto_rb_p, &naive_rb_p, ps),
            "(what a one-integer layout would give)",
        );
        row(
            "ours token bucket script / naive script, both bare EVALSHA over redis-rs",
            load.ratio(
                "ours token_bucket script, bare EVALSHA (redis-rs)",
                naive_client,
                ps,
            ),
            ">= 1.3",
        );
        for lib in Lib::all() {
            let ours = format!("ours token_bucket ({}, Limiter::check)", lib.name());
            row(
                &format!(
                    "ours token bucket through Limiter ({}) / naive script (bare, redis-rs)",
                    lib.name()
                ),
                load.ratio(&ours, naive_client, ps),
                "(for reference)",
            );
            // Issue 19: the client's overhead over the raw script call, the
            // same script on the same client and connections (>= 0.95:
            // at most 1.05x the raw call's time per decision).
            row(
                &format!(
                    "ours token bucket through Limiter ({0}) / the same script, bare EVALSHA ({0})",
                    lib.name()
                ),
                load.ratio(
                    &ours,
                    &format!("ours token_bucket script, bare EVALSHA ({})", lib.name()),
                    ps,
                ),
                ">= 0.95",
            );
            row(
                &format!(
                    "ours token bucket through Limiter ({}) / redis-benchmark -c {}, same script",
                    lib.name(),
                    a.tasks
                ),
                load.ratio(&ours, &ours_rb, ps),
                ">= 0.9",
            );
            row(
                &format!(
                    "ours token bucket through Limiter ({}) / redis-benchmark -c {} -P {pipe}, same script",
                    lib.name(),
                    a.connections
                ),
                load.ratio(&ours, &ours_rb_p, ps),
                ">= 0.9",
            );
        }
        println!();
    }
    if a.overhead {
        seq.print_table(
            "### Limiter overhead: one task, one connection (sequential round trips)",
            &seq.order,
        );
        println!("| overhead over a bare EVALSHA of the same script | p50 µs | p99 µs | target |");
        println!("|---|---:|---:|---|");
        for lib in Lib::all() {
            let bare = format!("seq: bare EVALSHA token_bucket ({})", lib.name());
            for (what, name) in [
                (
                    "RedisStore::decide",
                    format!("seq: RedisStore::decide token_bucket ({})", lib.name()),
                ),
                (
                    "Limiter::check",
                    format!("seq: Limiter::check token_bucket ({})", lib.name()),
                ),
            ] {
                let d = |f: fn(&Measured) -> f64| {
                    let (x, y) = (seq.rows.get(&name)?, seq.rows.get(&bare)?);
                    median(x.iter().zip(y).map(|(x, y)| f(x) - f(y)).collect())
                };
                println!(
                    "| {what} ({}) | {} | {} | p99 < 50 |",
                    lib.name(),
                    fmt_opt(d(|m| m.p50_us), 1),
                    fmt_opt(d(|m| m.p99_us), 1)
                );
            }
        }
        println!();
    }
    drop(server);
    if a.memory {
        memory_section(&a).await;
    }
    if a.cluster {
        cluster_section(&a, &q).await;
    }
    let took = started.elapsed().unwrap_or_default();
    println!("(took {:.0} s)", took.as_secs_f64());
}
