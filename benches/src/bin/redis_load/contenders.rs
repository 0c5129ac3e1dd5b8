//! The contenders: our store and limiter (redis-rs or fred), the bare script call, the naive scripts and `PING`, and the keys each uses.

use std::sync::Arc;
use std::time::Duration;

use ratelimit_benches::clients::Lib;
use ratelimit_core::{Limiter, Quota, Store, StoreExt};
use ratelimit_redis::{RedisStore, keys};
use redis::aio::ConnectionManager;

use crate::load::Call;

pub(crate) const NAIVE_TOKEN_BUCKET: &str = include_str!("../../../lua/naive_token_bucket.lua");
pub(crate) const NAIVE_FIXED_WINDOW: &str = include_str!("../../../lua/naive_fixed_window.lua");
pub(crate) const TRIVIAL_SCRIPT: &str = "return {1, 0, 0, -1}";
/// The Redis commands of our token bucket and nothing else: the cost of the
/// calls themselves, without arithmetic.
pub(crate) const COMMANDS_ONLY_OURS: &str = "redis.call('TIME') redis.call('GET', KEYS[1]) \
     redis.call('SET', KEYS[1], '1764538000123456', 'PX', '3600000') return {1, 0, 0, -1}";
/// The Redis commands of the naive hash-of-floats script and nothing else.
pub(crate) const COMMANDS_ONLY_NAIVE: &str = "redis.call('TIME') redis.call('HMGET', KEYS[1], 'tokens', 'ts') \
     redis.call('HSET', KEYS[1], 'tokens', 19.000000000000004, 'ts', 1764538000.123456) \
     redis.call('PEXPIRE', KEYS[1], 3600000) return {1, 0}";
/// The prototype's arguments (`benches/lua/`): the server's clock, no
/// minimum expiry, cost 1, then the bucket's unit, refill and full.
pub(crate) fn prototype_args(tb: &Quota) -> Vec<String> {
    let ratelimit_core::Algorithm::TokenBucket(b) = tb.algorithm() else {
        unreachable!("the prototype is a token bucket")
    };
    vec![
        String::new(),
        "0".to_owned(),
        "1".to_owned(),
        b.unit().to_string(),
        b.refill().to_string(),
        b.full().to_string(),
    ]
}

pub(crate) const PROTOTYPE_TOKEN_BUCKET: &str =
    include_str!("../../../lua/prototype_token_bucket_one_integer.lua");
pub(crate) const GENEROUS: Duration = Duration::from_secs(2);
pub(crate) const NAMESPACE: &str = "api";

pub(crate) fn caller_id(i: usize) -> String {
    format!("customer-{i:07}")
}

pub(crate) async fn store(lib: Lib, url: &str) -> RedisStore {
    match lib {
        Lib::RedisRs => RedisStore::builder(url)
            .response_timeout(GENEROUS)
            .connection_timeout(GENEROUS)
            .timeout(2 * GENEROUS)
            .build()
            .await
            .expect("connect redis-rs store"),
        #[cfg(feature = "fred")]
        Lib::Fred => RedisStore::from_fred(fred_client(url).await).with_timeout(2 * GENEROUS),
    }
}

#[cfg(feature = "fred")]
pub(crate) async fn fred_client(url: &str) -> ratelimit_redis::fred_client::clients::Client {
    ratelimit_benches::clients::fred_client(url, GENEROUS).await
}

pub(crate) async fn manager(url: &str) -> ConnectionManager {
    let client = redis::Client::open(url).expect("valid URL");
    ConnectionManager::new(client).await.expect("connect")
}

/// `Limiter::check` over `RedisStore`, one store (connection) per `conn`.
pub(crate) async fn ours_limiter(
    lib: Lib,
    url: &str,
    quota: &Quota,
    conns: usize,
    callers: usize,
) -> Call {
    let mut stores = Vec::new();
    for _ in 0..conns {
        stores.push(store(lib, url).await);
    }
    limiter_call(stores, quota, callers)
}

/// `Limiter::check` over each of `stores` (one per connection index).
pub(crate) fn limiter_call<S: Store + 'static>(
    stores: Vec<S>,
    quota: &Quota,
    callers: usize,
) -> Call {
    let limiters: Vec<Limiter> = stores
        .into_iter()
        .map(|s| {
            Limiter::builder(s)
                .failure_policy(ratelimit_core::FailurePolicy::FailClosed)
                .quota(quota.clone())
                .namespace(NAMESPACE)
                .expect("valid namespace")
                .timeout(GENEROUS)
                .build()
                .expect("limiter")
        })
        .collect();
    let ids: Arc<Vec<String>> = Arc::new((0..callers).map(caller_id).collect());
    let limiters = Arc::new(limiters);
    Arc::new(move |c, i| {
        let (l, ids) = (limiters[c].clone(), ids.clone());
        Box::pin(async move {
            let d = l.check(&ids[i]).await;
            if d.is_from_store() {
                Ok(d.allowed)
            } else {
                Err("decided by the failure policy".to_owned())
            }
        })
    })
}

/// `RedisStore::decide` alone, with the key a `Limiter` would pass.
pub(crate) async fn ours_store(
    lib: Lib,
    url: &str,
    quota: &Quota,
    conns: usize,
    callers: usize,
) -> Call {
    let mut stores = Vec::new();
    for _ in 0..conns {
        stores.push(Arc::new(store(lib, url).await));
    }
    let ids: Arc<Vec<String>> = Arc::new(
        (0..callers)
            .map(|i| format!("{NAMESPACE}:{}", caller_id(i)))
            .collect(),
    );
    let stores = Arc::new(stores);
    let quota = Arc::new(quota.clone());
    Arc::new(move |c, i| {
        let (s, ids, q) = (stores[c].clone(), ids.clone(), quota.clone());
        Box::pin(async move {
            s.decide_one(ids[i].as_bytes(), &q, 1)
                .await
                .map(|d| d.allowed)
                .map_err(|e| e.to_string())
        })
    })
}

/// A bare `EVALSHA` of `lua` with prebuilt keys and arguments: what the
/// script costs through the client library, without store or limiter.
/// `allowed` is the first element of the reply.
pub(crate) async fn bare_evalsha(
    lib: Lib,
    url: &str,
    lua: &str,
    keys: Arc<Vec<String>>,
    args: Vec<String>,
    conns: usize,
) -> Call {
    let sha = load_script(url, lua).await;
    let args = Arc::new(args);
    match lib {
        Lib::RedisRs => {
            let mut managers = Vec::new();
            for _ in 0..conns {
                managers.push(manager(url).await);
            }
            let managers = Arc::new(managers);
            let sha: Arc<str> = Arc::from(sha);
            Arc::new(move |c, i| {
                let mut m = managers[c].clone();
                let (sha, keys, args) = (sha.clone(), keys.clone(), args.clone());
                Box::pin(async move {
                    let mut cmd = redis::cmd("EVALSHA");
                    cmd.arg(&*sha).arg(1).arg(&keys[i]);
                    for a in args.iter() {
                        cmd.arg(a);
                    }
                    let ratelimit_redis::decode::Integers(reply) =
                        cmd.query_async(&mut m).await.map_err(|e| e.to_string())?;
                    Ok(ratelimit_benches::admitted(&reply))
                })
            })
        }
        #[cfg(feature = "fred")]
        Lib::Fred => {
            use ratelimit_redis::fred_client::interfaces::LuaInterface;
            let mut clients = Vec::new();
            for _ in 0..conns {
                clients.push(fred_client(url).await);
            }
            let clients = Arc::new(clients);
            let sha: Arc<str> = Arc::from(sha);
            Arc::new(move |c, i| {
                let client = clients[c].clone();
                let (sha, keys, args) = (sha.clone(), keys.clone(), args.clone());
                Box::pin(async move {
                    let reply: Vec<i64> = client
                        .evalsha(&*sha, keys[i].as_str(), args.to_vec())
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(ratelimit_benches::admitted(&reply))
                })
            })
        }
    }
}

/// `PING` round trips over redis-rs: the floor under every decision.
pub(crate) async fn ping(url: &str) -> Call {
    let m = manager(url).await;
    Arc::new(move |_, _| {
        let mut m = m.clone();
        Box::pin(async move {
            let _: String = redis::cmd("PING")
                .query_async(&mut m)
                .await
                .map_err(|e| e.to_string())?;
            Ok(true)
        })
    })
}

pub(crate) async fn load_script(url: &str, lua: &str) -> String {
    let mut m = manager(url).await;
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(lua)
        .query_async(&mut m)
        .await
        .expect("SCRIPT LOAD")
}

/// The Redis keys our store writes for the callers under `quota`.
pub(crate) fn our_keys(quota: &Quota, callers: usize) -> Arc<Vec<String>> {
    Arc::new(
        (0..callers)
            .map(|i| {
                keys::key(
                    "rl",
                    format!("{NAMESPACE}:{}", caller_id(i)).as_bytes(),
                    quota,
                )
            })
            .collect(),
    )
}

/// Keys for the one-integer prototype: ours with `:tb` replaced by `:t1`
/// (same length, so memory compares like for like).
pub(crate) fn prototype_keys(quota: &Quota, callers: usize) -> Arc<Vec<String>> {
    Arc::new(
        our_keys(quota, callers)
            .iter()
            .map(|k| format!("{}t1", &k[..k.len() - 2]))
            .collect(),
    )
}

/// Naive keys: `naive:<what>:customer-<i>`.
pub(crate) fn naive_keys(what: &str, callers: usize) -> Arc<Vec<String>> {
    Arc::new(
        (0..callers)
            .map(|i| format!("naive:{what}:{}", caller_id(i)))
            .collect(),
    )
}
