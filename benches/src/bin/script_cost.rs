//! The server's time per script call, measured through the store's real
//! calls (its keys, its arguments, its deadlines), side by side with the
//! naive hash-of-floats token bucket (`benches/lua/naive_token_bucket.lua`)
//! sent over the same client, on one `redis-server` this program starts on a
//! free loopback port.
//!
//! Every row checks its replies: an "admitting" row whose calls were not all
//! admitted, or a "denying" row whose calls were not all denied, stops the
//! program with the count. Rows:
//!
//! - token bucket, admitting (1 per second, burst 10^9: never full again)
//!   and denying (1 per hour, burst 20, spent first): ours against the
//!   naive script;
//! - sliding log of 10 and of 100,000 entries: admitting (a log one entry
//!   short of its limit; after each call the entry it added is removed
//!   again, by a separate `EVAL` that `INFO commandstats` counts apart, so
//!   every measured call sees a log of exactly that size) and denying (a log
//!   as long as its limit);
//! - the batch script per decision: 256 concurrent callers through one
//!   store, the server's `EVALSHA` time over the decisions it carried.
//!
//! Server time is `INFO commandstats` (`usec` of `evalsha` over its calls,
//! reset before each row); the rows repeat `--rounds` times (default 3),
//! interleaved, and the table gives every round and the median.
//!
//! ```text
//! cargo run --release -p ratelimit-benches --bin script_cost -- --rounds 3
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratelimit_core::{Quota, Rate, StoreExt};
use ratelimit_redis::RedisStore;
use ratelimit_testkit::redis_server::RedisServer;
use redis::aio::ConnectionManager;

const NAIVE_TOKEN_BUCKET: &str = include_str!("../../lua/naive_token_bucket.lua");
const GENEROUS: Duration = Duration::from_secs(5);
/// Calls per token-bucket row and per sliding-log row.
const TB_CALLS: u64 = 20_000;
const LOG_CALLS: u64 = 4_000;
const CALLER: &[u8] = b"api~customer-0000042";

/// Writes a sliding log of `n` entries (one unit each, over the last half
/// hour) in the store's layout at `key` (and `key:c`).
const SEED_LOG: &str = "
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local n = tonumber(ARGV[1])
redis.call('DEL', KEYS[1], KEYS[1] .. ':c')
redis.call('ZADD', KEYS[1] .. ':c', 0, 0)
local i = 1
while i <= n do
  local tz, cz = {}, {}
  for j = 1, 1000 do
    if i > n then break end
    tz[#tz + 1] = string.format('%d', now - 1800000000 + math.floor(i * 1800000000 / (n + 1)))
    tz[#tz + 1] = i
    cz[#cz + 1] = i
    cz[#cz + 1] = i
    i = i + 1
  end
  redis.call('ZADD', KEYS[1], unpack(tz))
  redis.call('ZADD', KEYS[1] .. ':c', unpack(cz))
end
return redis.call('ZCARD', KEYS[1])";
/// Removes the newest entry of a sliding log (the one a call just added).
const TRIM_LOG: &str = "
redis.call('ZREMRANGEBYRANK', KEYS[1], -1, -1)
redis.call('ZREMRANGEBYRANK', KEYS[1] .. ':c', -1, -1)
return redis.call('ZCARD', KEYS[1])";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Admit,
    Deny,
}

async fn connect(url: &str) -> ConnectionManager {
    // Seeding a 100,000-entry log takes longer than the default timeout.
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(60)));
    ConnectionManager::new_with_config(redis::Client::open(url).expect("valid URL"), config)
        .await
        .expect("connect")
}

async fn store(url: &str) -> RedisStore {
    RedisStore::builder(url)
        .response_timeout(GENEROUS)
        .connection_timeout(GENEROUS)
        .timeout(GENEROUS)
        .max_in_flight(1 << 20)
        .build()
        .await
        .expect("connect the store")
}

async fn reset(m: &mut ConnectionManager) {
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(m)
        .await
        .expect("CONFIG RESETSTAT");
}

/// (`usec`, `calls`) of `evalsha` since the last reset.
async fn evalsha_stats(m: &mut ConnectionManager) -> (f64, f64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(m)
        .await
        .expect("INFO commandstats");
    let line = info
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .expect("EVALSHA in INFO commandstats");
    let field = |name: &str| -> f64 {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {line}"))
    };
    (field("usec="), field("calls="))
}

fn check(row: &str, expect: Expect, admitted: u64, calls: u64) {
    let want = if expect == Expect::Admit { calls } else { 0 };
    assert_eq!(
        admitted, want,
        "{row}: {admitted} of {calls} calls admitted, the row is labelled {expect:?}"
    );
}

/// µs per call of our store on `quota` for `calls` sequential calls,
/// `between` run after each.
async fn ours(
    url: &str,
    row: &str,
    quota: &Quota,
    calls: u64,
    expect: Expect,
    trim: Option<&str>,
) -> f64 {
    let s = store(url).await;
    let mut m = connect(url).await;
    let key = s.key(CALLER, quota);
    reset(&mut m).await;
    let mut admitted = 0;
    for _ in 0..calls {
        let d = s.decide_one(CALLER, quota, 1).await.expect("a decision");
        admitted += u64::from(d.allowed);
        if let Some(trim) = trim {
            let _: i64 = redis::cmd("EVAL")
                .arg(trim)
                .arg(1)
                .arg(&key)
                .query_async(&mut m)
                .await
                .expect("trim the log");
        }
    }
    check(row, expect, admitted, calls);
    let (usec, n) = evalsha_stats(&mut m).await;
    usec / n
}

/// µs per call of the naive token bucket with `args`.
async fn naive(url: &str, row: &str, args: &[&str], calls: u64, expect: Expect) -> f64 {
    let mut m = connect(url).await;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(NAIVE_TOKEN_BUCKET)
        .query_async(&mut m)
        .await
        .expect("SCRIPT LOAD");
    reset(&mut m).await;
    let mut admitted = 0;
    for _ in 0..calls {
        let reply: Vec<i64> = redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(1)
            .arg("rl:{api~customer-0000042}:naive")
            .arg(args)
            .query_async(&mut m)
            .await
            .expect("naive script");
        admitted += u64::from(reply.first() == Some(&1));
    }
    check(row, expect, admitted, calls);
    let (usec, n) = evalsha_stats(&mut m).await;
    usec / n
}

/// The batch script's server time per decision: `callers` concurrent
/// callers (distinct keys) through one store, `per_caller` decisions each.
/// Returns (µs per decision, decisions per call).
async fn batched(url: &str, callers: usize, per_caller: u64) -> (f64, f64) {
    let s = Arc::new(store(url).await);
    let mut m = connect(url).await;
    let quota = Arc::new(Quota::token_bucket(Rate::per_second(1), 1_000_000_000).expect("quota"));
    reset(&mut m).await;
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..callers {
        let (s, quota, admitted) = (s.clone(), quota.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            let caller = format!("api~customer-{c:07}");
            for _ in 0..per_caller {
                let d = s
                    .decide_one(caller.as_bytes(), &quota, 1)
                    .await
                    .expect("a decision");
                admitted.fetch_add(u64::from(d.allowed), Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("caller");
    }
    let decisions = callers as u64 * per_caller;
    check(
        "batch",
        Expect::Admit,
        admitted.load(Ordering::Relaxed),
        decisions,
    );
    let (usec, calls) = evalsha_stats(&mut m).await;
    (usec / decisions as f64, decisions as f64 / calls)
}

async fn seed_log(url: &str, quota: &Quota, n: u64) {
    let s = store(url).await;
    let key = s.key(CALLER, quota);
    let mut m = connect(url).await;
    let size: u64 = redis::cmd("EVAL")
        .arg(SEED_LOG)
        .arg(1)
        .arg(&key)
        .arg(n)
        .query_async(&mut m)
        .await
        .expect("seed the log");
    assert_eq!(size, n, "the seeded log");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[tokio::main]
async fn main() {
    let mut rounds = 3;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--rounds N")
            }
            "--bench" => {}
            other => ratelimit_benches::not_an_option(other, "usage: script_cost [--rounds N]"),
        }
    }
    let server = RedisServer::start_local();
    let url = server.url();

    let admit_tb = Quota::token_bucket(Rate::per_second(1), 1_000_000_000).expect("quota");
    let deny_tb = Quota::token_bucket(Rate::per_hour(1), 20).expect("quota");
    let rows = [
        "token bucket, admitting: ours",
        "token bucket, admitting: naive",
        "token bucket, denying: ours",
        "token bucket, denying: naive",
        "sliding log, 10 entries, admitting",
        "sliding log, 100,000 entries, admitting",
        "sliding log, 10 entries, denying",
        "sliding log, 100,000 entries, denying",
        "batch script per decision, 256 callers",
    ];
    let mut book: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut per_call = Vec::new();
    for round in 0..rounds {
        let mut m = connect(&url).await;
        let () = redis::cmd("FLUSHALL")
            .query_async(&mut m)
            .await
            .expect("FLUSHALL");
        book[0].push(ours(&url, rows[0], &admit_tb, TB_CALLS, Expect::Admit, None).await);
        book[1].push(
            naive(
                &url,
                rows[1],
                &["1", "1000000000", "1"],
                TB_CALLS,
                Expect::Admit,
            )
            .await,
        );
        // Spend the burst (20) first: every measured call is denied.
        {
            let s = store(&url).await;
            for _ in 0..20 {
                let _ = s.decide_one(CALLER, &deny_tb, 1).await.expect("spend");
            }
        }
        book[2].push(ours(&url, rows[2], &deny_tb, TB_CALLS, Expect::Deny, None).await);
        let naive_deny = ["0.0002777777777777778", "20", "1"];
        naive(&url, "spend", &naive_deny, 20, Expect::Admit).await;
        book[3].push(naive(&url, rows[3], &naive_deny, TB_CALLS, Expect::Deny).await);
        for (i, n) in [(4, 10u64), (5, 100_000)] {
            // Admitting: one entry fewer than the limit (a sliding log's
            // limit is at most 100,000), the added entry trimmed each time.
            let admit = Quota::sliding_log(Rate::per_hour(n)).expect("quota");
            seed_log(&url, &admit, n - 1).await;
            book[i].push(
                ours(
                    &url,
                    rows[i],
                    &admit,
                    LOG_CALLS,
                    Expect::Admit,
                    Some(TRIM_LOG),
                )
                .await,
            );
            let deny = Quota::sliding_log(Rate::per_hour(n)).expect("quota");
            seed_log(&url, &deny, n).await;
            book[i + 2].push(ours(&url, rows[i + 2], &deny, LOG_CALLS, Expect::Deny, None).await);
        }
        let (us, carried) = batched(&url, 256, 200).await;
        book[8].push(us);
        per_call.push(carried);
        eprintln!("round {round} done");
    }
    println!(
        "server µs per call (`INFO commandstats`, evalsha), {rounds} rounds; redis-server on loopback"
    );
    println!("| row | per round | median |");
    println!("|---|---|---:|");
    for (row, v) in rows.iter().zip(&book) {
        let each: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
        println!("| {row} | {} | {:.2} |", each.join(" "), median(v.clone()));
    }
    let ratio =
        |a: usize, b: usize| median(book[a].iter().zip(&book[b]).map(|(x, y)| x / y).collect());
    println!();
    println!("| ratio (median of the per-round ratios) | value |");
    println!("|---|---:|");
    println!(
        "| token bucket, ours / naive, admitting | {:.2} |",
        ratio(0, 1)
    );
    println!(
        "| token bucket, ours / naive, denying | {:.2} |",
        ratio(2, 3)
    );
    println!(
        "| sliding log, 100,000 / 10 entries, admitting | {:.2} |",
        ratio(5, 4)
    );
    println!(
        "| sliding log, 100,000 / 10 entries, denying | {:.2} |",
        ratio(7, 6)
    );
    println!(
        "| batch per decision / naive, admitting | {:.2} |",
        ratio(8, 1)
    );
    println!(
        "| decisions per batch call (256 callers) | {:.1} |",
        median(per_call)
    );
}
