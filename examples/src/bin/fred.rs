//! A limiter over a `fred` client the application already holds:
//! `RedisStore::from_fred` (feature `fred`).
//!
//! ```text
//! cargo run -p ratelimit-examples --bin fred -- --redis redis://127.0.0.1:6379/
//! ```
//!
//! It builds one fred client (with a command timeout and a reconnect
//! policy, as an application would), hands a clone to the store, sends
//! eight calls of one caller against "5 per second, burst 5" and prints
//! each decision and the headers of the last one. The same client keeps
//! serving the application's own commands: the store sends its scripts
//! with fred's per-command `max_attempts = 1`, so a script whose reply was
//! lost is never sent twice; the client's own retry settings stay as they
//! are for everything else.
//!
//! The fred types come from the facade (`exactlimit::redis::fred_client`,
//! fred 10), so the client is of the version the store was built against;
//! an application with its own `fred` dependency uses the same major version.

use std::process::ExitCode;
use std::time::Duration;

use exactlimit::limiter::NAMESPACE_SEPARATOR;
use exactlimit::redis::fred_client::prelude::{Builder, ClientLike, Config, ReconnectPolicy};
use exactlimit::redis::fred_client::types::{ClusterHash, CustomCommand};
use exactlimit::redis::keys;
use exactlimit::{FailurePolicy, Limiter, Quota, Rate, RedisStore};

const USAGE: &str = "usage: fred --redis <URL>\n\
    \n  --redis  the Redis server, e.g. redis://127.0.0.1:6379/";

fn parse_args() -> Result<Option<String>, String> {
    let mut url = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--redis" => url = Some(it.next().ok_or("--redis needs a URL")?),
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    url.map(Some)
        .ok_or_else(|| "--redis is required".to_owned())
}

async fn run(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    // The application's client: a bound on every command and reconnection
    // with backoff (the store relies on both).
    let client = Builder::from_config(Config::from_url(url)?)
        .with_performance_config(|p| p.default_command_timeout = Duration::from_millis(200))
        .set_policy(ReconnectPolicy::new_exponential(0, 25, 1_000, 2))
        .build()?;
    client.init().await?;

    // The store shares the client (a clone shares its connection).
    let store = RedisStore::from_fred(client.clone()).with_prefix("fred-example")?;
    let quota = Quota::token_bucket(Rate::per_second(5), 5)?.named("calls")?;
    let limiter = Limiter::builder(store)
        .quota(quota.clone())
        .namespace("fred")?
        .failure_policy(FailurePolicy::FailOpen)
        .timeout(Duration::from_millis(200))
        .build()?;

    let mut last = None;
    for i in 1..=8 {
        let d = limiter.check("customer-42").await;
        let retry = d
            .retry_after
            .map_or_else(String::new, |r| format!(", retry after {r:?}"));
        println!(
            "call {i}: {} ({:?}), {} left{retry}",
            if d.allowed { "admitted" } else { "denied" },
            d.source,
            d.remaining
        );
        last = Some(d);
    }
    if let Some(d) = last {
        for (name, value) in limiter.headers(&d).iter() {
            println!("{name}: {value}");
        }
    }
    // The application's own commands go through the same client: here,
    // whether the caller's state is in Redis, under the store's key.
    let caller = format!("fred{}customer-42", char::from(NAMESPACE_SEPARATOR));
    let key = keys::key("fred-example", caller.as_bytes(), &quota);
    let exists = CustomCommand::new_static("EXISTS", ClusterHash::FirstKey, false);
    let stored: u64 = client.custom(exists, vec![key.as_str()]).await?;
    println!("{key} in Redis: {}", stored == 1);
    client.quit().await?;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let url = match ratelimit_examples::args_or_exit(parse_args(), USAGE) {
        Ok(args) => args,
        Err(code) => return code,
    };
    match run(&url).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fred example against {url}: {e}");
            ExitCode::FAILURE
        }
    }
}
