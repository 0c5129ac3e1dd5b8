//! Section 1, throughput and latency (and `--ratio-only`).

use std::time::Duration;

use ratelimit_benches::clients::Lib;
use ratelimit_core::{AlgorithmKind, Quota};
use ratelimit_redis::{keys, scripts};
use ratelimit_testkit::redis_server::RedisServer;

use crate::book::Book;
use crate::contenders::{
    NAIVE_FIXED_WINDOW, NAIVE_TOKEN_BUCKET, NAMESPACE, PROTOTYPE_TOKEN_BUCKET, bare_evalsha,
    naive_keys, our_keys, ours_limiter, ours_store, prototype_args, prototype_keys,
};
use crate::load::{Call, Measured, drive, evalsha_usec_per_call, phase};
use crate::options::Args;
use crate::quotas::{ALGORITHMS, Quotas, algo_name};
use crate::redis_benchmark::redis_benchmark;
use crate::script_costs::scripts_sha;

/// `--ratio-only`: `RedisStore::decide` and `Limiter::check` over that
/// store against the bare `EVALSHA` of the same script, in slices of
/// 200 ms taken in turn (the order rotating from round to round), for as
/// many rounds as fit in `secs` x 2 per run; prints each round's ratios of
/// decisions/s and their medians. Slices next to each other share the
/// machine's load, which on a shared host moves a contender's throughput
/// by 2x over seconds.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn interleaved_ratio(
    lib: Lib,
    store: &Call,
    limiter: &Call,
    bare: &Call,
    tasks: usize,
    connections: usize,
    callers: usize,
    secs: f64,
) {
    const SLICE: Duration = Duration::from_millis(200);
    let warm = Duration::from_millis(500);
    let contenders = [store, limiter, bare];
    for c in contenders {
        let _ = phase(c, tasks, connections, callers, warm).await;
    }
    let rounds = ((secs * 2.0) / (2.0 * SLICE.as_secs_f64())).max(1.0) as usize;
    let (mut of_store, mut of_limiter) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut per_second = [0.0; 3];
        for k in 0..3 {
            let c = (round + k) % 3;
            per_second[c] = phase(contenders[c], tasks, connections, callers, SLICE)
                .await
                .per_second;
        }
        of_store.push(per_second[0] / per_second[2]);
        of_limiter.push(per_second[1] / per_second[2]);
    }
    for (what, ratios) in [
        ("RedisStore::decide", of_store),
        ("Limiter::check", of_limiter),
    ] {
        let mut sorted = ratios.clone();
        sorted.sort_by(f64::total_cmp);
        let q = |f: f64| sorted[((sorted.len() - 1) as f64 * f).round() as usize];
        println!(
            "  ratio, {what} / bare EVALSHA ({}), {} rounds of 3 x {:?}: median {:.3}, quartiles {:.3}-{:.3}, rounds {}",
            lib.name(),
            rounds,
            SLICE,
            q(0.5),
            q(0.25),
            q(0.75),
            ratios
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
}

/// The bare `EVALSHA` of the token bucket's own script with the arguments
/// the store sends: the reference of the client-side ratio.
pub(crate) async fn bare_token_bucket(
    lib: Lib,
    url: &str,
    tb: &Quota,
    callers: usize,
    conns: usize,
) -> Call {
    bare_evalsha(
        lib,
        url,
        scripts::single(tb).lua(),
        our_keys(tb, callers),
        scripts::single_args(tb, None, 1),
        conns,
    )
    .await
}

pub(crate) async fn throughput_run(a: &Args, q: &Quotas, server: &RedisServer, book: &mut Book) {
    let url = server.url();
    let (n, m, k, s) = (a.tasks, a.connections, a.callers, a.seconds);
    let tb = q.ours(AlgorithmKind::TokenBucket);
    if a.ratio_only {
        for lib in Lib::all() {
            let store = ours_store(lib, &url, &tb, m, k).await;
            let limiter = ours_limiter(lib, &url, &tb, m, k).await;
            let bare = bare_token_bucket(lib, &url, &tb, k, m).await;
            interleaved_ratio(lib, &store, &limiter, &bare, n, m, k, s).await;
        }
        return;
    }
    for lib in Lib::all() {
        for kind in ALGORITHMS {
            let quota = q.ours(kind);
            let call = ours_limiter(lib, &url, &quota, m, k).await;
            book.add(
                &format!("ours {} ({}, Limiter::check)", algo_name(kind), lib.name()),
                drive(&call, n, m, k, s, Some(&url)).await,
            );
        }
        let bare = bare_token_bucket(lib, &url, &tb, k, m).await;
        book.add(
            &format!("ours token_bucket script, bare EVALSHA ({})", lib.name()),
            drive(&bare, n, m, k, s, Some(&url)).await,
        );
    }
    let naive_tb = bare_evalsha(
        Lib::RedisRs,
        &url,
        NAIVE_TOKEN_BUCKET,
        naive_keys("tb", k),
        q.naive_tb_args(),
        m,
    )
    .await;
    book.add(
        "naive hash-of-floats token bucket, bare EVALSHA (redis-rs)",
        drive(&naive_tb, n, m, k, s, Some(&url)).await,
    );
    let naive_fw = bare_evalsha(
        Lib::RedisRs,
        &url,
        NAIVE_FIXED_WINDOW,
        naive_keys("fw", k),
        q.naive_fw_args(),
        m,
    )
    .await;
    let proto = bare_evalsha(
        Lib::RedisRs,
        &url,
        PROTOTYPE_TOKEN_BUCKET,
        prototype_keys(&tb, k),
        prototype_args(&tb),
        m,
    )
    .await;
    book.add(
        "prototype one-integer token bucket, bare EVALSHA (redis-rs)",
        drive(&proto, n, m, k, s, Some(&url)).await,
    );
    book.add(
        "naive INCR+EXPIRE fixed window, bare EVALSHA (redis-rs)",
        drive(&naive_fw, n, m, k, s, Some(&url)).await,
    );

    // redis-benchmark: the same scripts. First N connections with one
    // request in flight each (N concurrent requests, as our N tasks); then,
    // for the token buckets, M connections pipelining N/M requests each (our
    // client's shape: N requests in flight over M multiplexed connections).
    let pipelined = (n / m).max(1);
    let mut bench =
        |label: &str, conns: usize, pipe: usize, lua: &str, key: &str, args: Vec<String>| {
            let sha = scripts_sha(&url, lua);
            if let Some((rps, p50, p99)) = redis_benchmark(
                server.port(),
                (conns, pipe),
                a.bench_requests,
                k,
                &sha,
                key,
                &args,
            ) {
                let shape = if pipe > 1 {
                    format!("-c {conns} -P {pipe}")
                } else {
                    format!("-c {conns}")
                };
                book.add(
                    &format!("redis-benchmark {shape}: {label}"),
                    Measured {
                        decisions: a.bench_requests as u64,
                        allowed: 0,
                        errors: 0,
                        per_second: rps,
                        p50_us: p50,
                        p99_us: p99,
                        p999_us: f64::NAN,
                        server_us: evalsha_usec_per_call(&url),
                    },
                );
            }
        };
    for kind in ALGORITHMS {
        let quota = q.ours(kind);
        // The key a limiter writes (default policy name left out, layout code).
        let key = format!(
            "rl:{{{NAMESPACE}%3Acustomer-__rand_int__}}:{}",
            keys::layout_code(kind)
        );
        bench(
            &format!("ours {}", algo_name(kind)),
            n,
            1,
            scripts::single(&quota).lua(),
            &key,
            scripts::single_args(&quota, None, 1),
        );
    }
    for (conns, pipe) in [(n, 1), (m, pipelined)] {
        bench(
            "naive hash-of-floats token bucket",
            conns,
            pipe,
            NAIVE_TOKEN_BUCKET,
            "naive:tb:customer-__rand_int__",
            q.naive_tb_args(),
        );
        if pipe > 1 {
            bench(
                "ours token_bucket",
                conns,
                pipe,
                scripts::single(&tb).lua(),
                &format!("rl:{{{NAMESPACE}%3Acustomer-__rand_int__}}:tb2"),
                scripts::single_args(&tb, None, 1),
            );
        }
        bench(
            "prototype one-integer token bucket",
            conns,
            pipe,
            PROTOTYPE_TOKEN_BUCKET,
            &format!("rl:{{{NAMESPACE}%3Acustomer-__rand_int__}}:t1"),
            prototype_args(&tb),
        );
    }
    bench(
        "naive INCR+EXPIRE fixed window",
        n,
        1,
        NAIVE_FIXED_WINDOW,
        "naive:fw:customer-__rand_int__",
        q.naive_fw_args(),
    );
}
