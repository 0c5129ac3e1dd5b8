//! Section 3, memory: `used_memory` over many callers, per layout.

use std::future::Future;
use std::sync::Arc;

use ratelimit_benches::clients::Lib;
use ratelimit_core::{AlgorithmKind, Quota};
use ratelimit_redis::keys;
use ratelimit_testkit::redis_server::RedisServer;

use crate::book::fmt_opt;
use crate::contenders::{
    NAIVE_FIXED_WINDOW, NAIVE_TOKEN_BUCKET, NAMESPACE, PROTOTYPE_TOKEN_BUCKET, bare_evalsha,
    caller_id, naive_keys, our_keys, ours_limiter, prototype_args, prototype_keys,
};
use crate::load::Call;
use crate::options::Args;
use crate::quotas::{ALGORITHMS, Mode, Quotas, algo_name};

/// `used_memory` per caller for one layout, on a fresh server: `populate`
/// makes one decision for each of `callers` callers.
pub(crate) async fn memory_row<F, Fut>(callers: usize, populate: F) -> f64
where
    F: Fn(String, usize) -> Fut,
    Fut: Future<Output = ()>,
{
    let server = RedisServer::start_local();
    let url = server.url();
    // Warm-up: a connection, the script cache, one key of another caller.
    populate(url.clone(), 0).await;
    let before = server.info_memory_used();
    populate(url, callers).await;
    let after = server.info_memory_used();
    after.saturating_sub(before) as f64 / callers as f64
}

pub(crate) async fn run_all(call: Call, callers: usize) {
    let tasks = 32;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let call = call.clone();
        handles.push(tokio::spawn(async move {
            for i in (t..callers).step_by(tasks) {
                call(0, i).await.expect("decision");
            }
        }));
    }
    for h in handles {
        h.await.expect("populate task");
    }
}

pub(crate) async fn memory_section(a: &Args) {
    let q = &Quotas { mode: Mode::Memory };
    let c = a.memory_callers;
    // Callers are numbered from 1 so that the warm-up caller (index 0 of a
    // zero-length population) never counts; populate(url, 0) runs caller 0.
    let mut rows: Vec<(String, f64)> = Vec::new();
    for kind in ALGORITHMS {
        let quota = q.ours(kind);
        let per = memory_row(c, |url, n| {
            let quota = quota.clone();
            async move {
                let call = ours_limiter(Lib::RedisRs, &url, &quota, 1, n.max(1) + 1).await;
                if n == 0 {
                    call(0, 0).await.expect("warm-up");
                } else {
                    let shifted: Call = Arc::new(move |c, i| call(c, i + 1));
                    run_all(shifted, n).await;
                }
            }
        })
        .await;
        let key = keys::key(
            "rl",
            format!("{NAMESPACE}:{}", caller_id(42)).as_bytes(),
            &quota,
        );
        rows.push((format!("ours {} (`{key}`)", algo_name(kind)), per));
    }
    let tb = q.ours(AlgorithmKind::TokenBucket);
    let naive = |lua: &'static str,
                 keys: fn(&Quota, usize) -> Arc<Vec<String>>,
                 args: Vec<String>| {
        let tb = tb.clone();
        move |url: String, n: usize| {
            let (tb, args) = (tb.clone(), args.clone());
            async move {
                let call =
                    bare_evalsha(Lib::RedisRs, &url, lua, keys(&tb, n.max(1) + 1), args, 1).await;
                if n == 0 {
                    call(0, 0).await.expect("warm-up");
                } else {
                    let shifted: Call = Arc::new(move |c, i| call(c, i + 1));
                    run_all(shifted, n).await;
                }
            }
        }
    };
    let same_key: fn(&Quota, usize) -> Arc<Vec<String>> = |q, n| our_keys(q, n);
    let natural_tb: fn(&Quota, usize) -> Arc<Vec<String>> = |_, n| naive_keys("tb", n);
    let natural_fw: fn(&Quota, usize) -> Arc<Vec<String>> = |_, n| naive_keys("fw", n);
    let per = memory_row(c, naive(NAIVE_TOKEN_BUCKET, same_key, q.naive_tb_args())).await;
    rows.push((
        "naive hash-of-floats token bucket, same key as ours".to_owned(),
        per,
    ));
    let proto_key: fn(&Quota, usize) -> Arc<Vec<String>> = |q, n| prototype_keys(q, n);
    let per = memory_row(
        c,
        naive(PROTOTYPE_TOKEN_BUCKET, proto_key, prototype_args(&tb)),
    )
    .await;
    rows.push((
        "prototype one-integer token bucket (`rl:{api%3Acustomer-0000042}:t1`)".to_owned(),
        per,
    ));
    let per = memory_row(c, naive(NAIVE_TOKEN_BUCKET, natural_tb, q.naive_tb_args())).await;
    rows.push((
        "naive hash-of-floats token bucket (`naive:tb:customer-0000042`)".to_owned(),
        per,
    ));
    let per = memory_row(c, naive(NAIVE_FIXED_WINDOW, natural_fw, q.naive_fw_args())).await;
    rows.push((
        "naive INCR+EXPIRE fixed window (`naive:fw:customer-0000042:<window>`)".to_owned(),
        per,
    ));

    println!(
        "### Memory per active caller ({c} callers, one decision each, fresh server per row; quotas {})\n",
        q.describe()
    );
    println!("| layout | bytes per caller |");
    println!("|---|---:|");
    for (name, per) in &rows {
        println!("| {name} | {per:.1} |");
    }
    let find = |s: &str| rows.iter().find(|(n, _)| n.starts_with(s)).map(|r| r.1);
    println!(
        "\nRatio prototype one-integer token bucket / naive hash (same key length): {}\n",
        fmt_opt(
            find("prototype one-integer")
                .zip(find("naive hash-of-floats token bucket, same key"))
                .map(|(a, b)| a / b),
            2
        )
    );
    println!(
        "\nRatio ours token_bucket / naive hash (same key): **{}** (target <= 0.75)\n",
        fmt_opt(
            find("ours token_bucket")
                .zip(find("naive hash-of-floats token bucket, same key"))
                .map(|(a, b)| a / b),
            2
        )
    );
}
