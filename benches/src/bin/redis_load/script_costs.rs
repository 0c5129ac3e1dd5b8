//! The server's cost per script call, from `INFO commandstats`.

use ratelimit_core::AlgorithmKind;
use ratelimit_redis::{keys, scripts};
use ratelimit_testkit::redis_server::RedisServer;

use crate::book::{Book, fmt_opt};
use crate::contenders::{
    COMMANDS_ONLY_NAIVE, COMMANDS_ONLY_OURS, NAIVE_FIXED_WINDOW, NAIVE_TOKEN_BUCKET, NAMESPACE,
    PROTOTYPE_TOKEN_BUCKET, TRIVIAL_SCRIPT, prototype_args,
};
use crate::load::{Measured, evalsha_usec_per_call, reset_server_stats, sync_connection};
use crate::options::Args;
use crate::quotas::{ALGORITHMS, Quotas, algo_name};
use crate::redis_benchmark::redis_benchmark;

/// The server's own time per call of each script (`INFO commandstats`
/// `usec_per_call` of `EVALSHA`), from `redis-benchmark` on ONE connection:
/// the benchmark client waits for every reply, so it never competes with
/// the server for a core mid-command and the figure is the script's cost,
/// not CPU contention. Its requests/s (round-trip bound) are not used.
pub(crate) fn script_costs_run(a: &Args, q: &Quotas, server: &RedisServer, book: &mut Book) {
    let url = server.url();
    let tb = q.ours(AlgorithmKind::TokenBucket);
    let requests = (a.bench_requests / 5).max(1000);
    let mut cost = |label: &str, lua: &str, key: &str, args: Vec<String>| {
        let sha = scripts_sha(&url, lua);
        // Warm-up: the keys exist, as in steady state.
        let _ = redis_benchmark(
            server.port(),
            (8, 1),
            a.callers * 2,
            a.callers,
            &sha,
            key,
            &args,
        );
        reset_server_stats(&url);
        if redis_benchmark(server.port(), (1, 1), requests, a.callers, &sha, key, &args).is_some() {
            book.add(
                label,
                Measured {
                    decisions: requests as u64,
                    per_second: f64::NAN,
                    p50_us: f64::NAN,
                    p99_us: f64::NAN,
                    p999_us: f64::NAN,
                    server_us: evalsha_usec_per_call(&url),
                    ..Measured::default()
                },
            );
        }
    };
    let our_key = |code: &str| format!("rl:{{{NAMESPACE}%3Acustomer-__rand_int__}}:{code}");
    for kind in ALGORITHMS {
        let quota = q.ours(kind);
        cost(
            &format!("ours {}", algo_name(kind)),
            scripts::single(&quota).lua(),
            &our_key(keys::layout_code(kind)),
            scripts::single_args(&quota, None, 1),
        );
    }
    cost(
        "naive hash-of-floats token bucket",
        NAIVE_TOKEN_BUCKET,
        "naive:tb:customer-__rand_int__",
        q.naive_tb_args(),
    );
    cost(
        "naive INCR+EXPIRE fixed window",
        NAIVE_FIXED_WINDOW,
        "naive:fw:customer-__rand_int__",
        q.naive_fw_args(),
    );
    cost(
        "prototype one-integer token bucket",
        PROTOTYPE_TOKEN_BUCKET,
        &our_key("t1"),
        prototype_args(&tb),
    );
    cost(
        "floor: script returning {1, 0, 0, -1}",
        TRIVIAL_SCRIPT,
        "floor:customer-__rand_int__",
        Vec::new(),
    );
    cost(
        "floor: TIME + GET + SET only (our token bucket's commands)",
        COMMANDS_ONLY_OURS,
        "floor:ours:customer-__rand_int__",
        Vec::new(),
    );
    cost(
        "floor: TIME + HMGET + HSET + PEXPIRE only (the naive script's commands)",
        COMMANDS_ONLY_NAIVE,
        "floor:naive:customer-__rand_int__",
        Vec::new(),
    );
}

pub(crate) fn print_script_costs(book: &Book) {
    println!(
        "### Script cost: server time per EVALSHA (`usec_per_call`, redis-benchmark on one connection)\n"
    );
    println!(
        "| script | server µs per call | naive hash-of-floats token bucket / this (speed-up) | runs |"
    );
    println!("|---|---:|---:|---:|");
    let naive = "naive hash-of-floats token bucket";
    for name in &book.order {
        println!(
            "| {name} | {} | {} | {} |",
            fmt_opt(book.median_of(name, |m| m.server_us), 2),
            fmt_opt(book.ratio(naive, name, |m| m.server_us), 2),
            book.rows.get(name).map_or(0, Vec::len)
        );
    }
    println!();
}

/// SCRIPT LOAD over a blocking connection (used between async phases).
pub(crate) fn scripts_sha(url: &str, lua: &str) -> String {
    let mut c = sync_connection(url);
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(lua)
        .query(&mut c)
        .expect("SCRIPT LOAD")
}
