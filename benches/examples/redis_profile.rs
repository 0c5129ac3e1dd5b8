//! A fixed amount of work for a profiler of the client side of a Redis
//! decision: `n` sequential calls on one connection (redis-rs), on a
//! current-thread runtime, against a `redis-server` of its own (a child
//! process, which callgrind does not follow unless asked).
//!
//! ```text
//! cargo build --release -p ratelimit-benches --example redis_profile
//! valgrind --tool=callgrind target/release/examples/redis_profile store 2000
//! valgrind --tool=callgrind target/release/examples/redis_profile store 12000
//! ```
//!
//! The client's instructions per decision are the difference of two runs
//! divided by the difference of their `n` (the set-up, the server's start
//! and the connection's handshake cancel out).
//!
//! `what` is one of `bare` (`EVALSHA` of the quota's own script with the
//! arguments the store sends, through the same `ConnectionManager`),
//! `store` (`RedisStore` through the one door, awaited) and `limiter`
//! (`Limiter::check` over that store, awaited); with `--features fred`,
//! `fred-bare`, `fred-store` and `fred-limiter`, the same over one fred
//! client.
#![allow(missing_docs)]

use std::time::Duration;

use ratelimit_core::{FailurePolicy, Limiter, Quota, Rate, StoreExt};
use ratelimit_redis::{RedisStore, scripts};
use ratelimit_testkit::redis_server::RedisServer;

const GENEROUS: Duration = Duration::from_secs(5);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map_or("store", String::as_str).to_owned();
    let n: usize = args.get(2).map_or(2_000, |s| s.parse().expect("calls"));
    // `REDIS_PROFILE_MT=1`: a multi-thread runtime (two workers), as a
    // server's; the default is a current-thread runtime.
    let rt = if std::env::var_os("REDIS_PROFILE_MT").is_some() {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
    .expect("runtime");
    let server = RedisServer::start_local();
    let url = server.url();
    let quota = Quota::token_bucket(Rate::per_second(1), 1_000_000).expect("quota");
    let keys: Vec<String> = (0..1_000).map(|i| format!("customer-{i}")).collect();
    let admitted = rt.block_on(async {
        match what.as_str() {
            "bare" => bare(&url, &quota, &keys, n).await,
            "store" => {
                let store = store(&url).await;
                decide(&store, &quota, &keys, n).await
            }
            "limiter" => check(&limiter(store(&url).await, &quota), &keys, n).await,
            #[cfg(feature = "fred")]
            "fred-bare" => fred::bare(&url, &quota, &keys, n).await,
            #[cfg(feature = "fred")]
            "fred-store" => {
                let store = fred::store(&url).await;
                decide(&store, &quota, &keys, n).await
            }
            #[cfg(feature = "fred")]
            "fred-limiter" => check(&limiter(fred::store(&url).await, &quota), &keys, n).await,
            other => panic!(
                "unknown contender {other}: bare, store or limiter (fred-bare, fred-store or \
                 fred-limiter with --features fred)"
            ),
        }
    });
    println!("{what}: {admitted} of {n} admitted");
}

/// A limiter over `store` that waits for it (fail closed, a generous
/// timeout): the profile is of its decisions, not of its failures.
fn limiter(store: RedisStore, quota: &Quota) -> Limiter {
    Limiter::builder(store)
        .failure_policy(FailurePolicy::FailClosed)
        .quota(quota.clone())
        .timeout(GENEROUS)
        .build()
        .expect("limiter")
}

async fn store(url: &str) -> RedisStore {
    RedisStore::builder(url)
        .response_timeout(GENEROUS)
        .connection_timeout(GENEROUS)
        .timeout(2 * GENEROUS)
        .build()
        .await
        .expect("connect")
}

async fn bare(url: &str, quota: &Quota, keys: &[String], n: usize) -> usize {
    let client = redis::Client::open(url).expect("valid URL");
    let mut conn = redis::aio::ConnectionManager::new(client)
        .await
        .expect("connect");
    let script = scripts::single(quota);
    let sha = script.sha1().to_owned();
    let _: () = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script.lua())
        .query_async(&mut conn)
        .await
        .expect("load");
    let (keys, args) = bare_inputs(quota, keys);
    let mut ok = 0;
    for i in 0..n {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&sha).arg(1).arg(&keys[i % keys.len()]);
        for a in &args {
            cmd.arg(a);
        }
        let ratelimit_redis::decode::Integers(reply) =
            cmd.query_async(&mut conn).await.expect("EVALSHA");
        ok += usize::from(ratelimit_benches::admitted(&reply));
    }
    ok
}

/// What a bare call sends: the store's keys, built once by its own key
/// builder (so the loop does no work the store's call would not), and the
/// arguments the store sends alone: a deadline far ahead (16 digits, as a
/// real one), then the quota's own script's arguments.
fn bare_inputs(quota: &Quota, callers: &[String]) -> (Vec<String>, Vec<String>) {
    let keys = callers
        .iter()
        .map(|k| ratelimit_redis::keys::key("rl", k.as_bytes(), quota))
        .collect();
    let mut args = scripts::single_args(quota, None, 1);
    args[0] = "9876543210987654".to_owned();
    (keys, args)
}

async fn decide(store: &RedisStore, quota: &Quota, keys: &[String], n: usize) -> usize {
    let mut ok = 0;
    for i in 0..n {
        let d = store
            .decide_one(keys[i % keys.len()].as_bytes(), quota, 1)
            .await
            .expect("decision");
        ok += usize::from(d.allowed);
    }
    ok
}

async fn check(limiter: &Limiter, keys: &[String], n: usize) -> usize {
    let mut ok = 0;
    for i in 0..n {
        ok += usize::from(limiter.check(&keys[i % keys.len()]).await.allowed);
    }
    ok
}

/// The same three contenders over fred (`--features fred`): one client
/// with the settings of `redis_load`'s, its command timeout generous.
#[cfg(feature = "fred")]
mod fred {
    use ratelimit_benches::clients::fred_client;
    use ratelimit_core::Quota;
    use ratelimit_redis::fred_client::interfaces::LuaInterface;
    use ratelimit_redis::{RedisStore, scripts};

    use super::{GENEROUS, bare_inputs};

    pub(crate) async fn store(url: &str) -> RedisStore {
        RedisStore::from_fred(fred_client(url, GENEROUS).await).with_timeout(2 * GENEROUS)
    }

    /// `EVALSHA` through fred's own call, the keys built before the loop.
    pub(crate) async fn bare(url: &str, quota: &Quota, keys: &[String], n: usize) -> usize {
        let client = fred_client(url, GENEROUS).await;
        let script = scripts::single(quota);
        let sha: String = client.script_load(script.lua()).await.expect("load");
        let (keys, args) = bare_inputs(quota, keys);
        let mut ok = 0;
        for i in 0..n {
            let reply: Vec<i64> = client
                .evalsha(&sha, keys[i % keys.len()].as_str(), args.clone())
                .await
                .expect("EVALSHA");
            ok += usize::from(ratelimit_benches::admitted(&reply));
        }
        ok
    }
}
