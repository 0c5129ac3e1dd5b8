//! Driving load: concurrent tasks calling a contender for a while, and the server's own counters.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) type CallFuture = Pin<Box<dyn Future<Output = Result<bool, String>> + Send>>;
/// One decision for caller number `idx` on connection `conn`: admitted?
pub(crate) type Call = Arc<dyn Fn(usize, usize) -> CallFuture + Send + Sync>;

#[derive(Debug, Default, Clone)]
pub(crate) struct Measured {
    pub(crate) decisions: u64,
    pub(crate) allowed: u64,
    pub(crate) errors: u64,
    pub(crate) per_second: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    /// Server time per `EVALSHA` (`INFO commandstats`), µs; NaN if unknown.
    pub(crate) server_us: f64,
}

pub(crate) async fn phase(
    call: &Call,
    tasks: usize,
    connections: usize,
    callers: usize,
    duration: Duration,
) -> Measured {
    let start = Instant::now();
    let deadline = start + duration;
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let call = call.clone();
        handles.push(tokio::spawn(async move {
            let conn = t % connections;
            let mut idx = callers * t / tasks;
            let mut lat: Vec<u32> = Vec::with_capacity(1 << 16);
            let (mut n, mut ok, mut err) = (0u64, 0u64, 0u64);
            while Instant::now() < deadline {
                let t0 = Instant::now();
                match call(conn, idx).await {
                    Ok(a) => ok += u64::from(a),
                    Err(_) => err += 1,
                }
                lat.push(u32::try_from(t0.elapsed().as_nanos()).unwrap_or(u32::MAX));
                n += 1;
                idx += 1;
                if idx == callers {
                    idx = 0;
                }
            }
            (n, ok, err, lat)
        }));
    }
    let mut m = Measured::default();
    let mut lat = Vec::new();
    for h in handles {
        let (n, ok, err, l) = h.await.expect("load task");
        m.decisions += n;
        m.allowed += ok;
        m.errors += err;
        lat.extend(l);
    }
    let elapsed = start.elapsed();
    m.per_second = m.decisions as f64 / elapsed.as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| {
        if lat.is_empty() {
            return f64::NAN;
        }
        let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
        f64::from(lat[i]) / 1000.0
    };
    m.p50_us = pct(0.50);
    m.p99_us = pct(0.99);
    m.p999_us = pct(0.999);
    m
}

/// A short unrecorded warm-up (connections, script cache, allocator), then
/// the measured phase. With `url`, the server's command statistics are reset
/// after the warm-up and its time per `EVALSHA` read after the phase.
pub(crate) async fn drive(
    call: &Call,
    tasks: usize,
    connections: usize,
    callers: usize,
    secs: f64,
    url: Option<&str>,
) -> Measured {
    let _ = phase(
        call,
        tasks,
        connections,
        callers,
        Duration::from_millis(500),
    )
    .await;
    if let Some(url) = url {
        reset_server_stats(url);
    }
    let mut m = phase(
        call,
        tasks,
        connections,
        callers,
        Duration::from_secs_f64(secs),
    )
    .await;
    m.server_us = url.map_or(f64::NAN, evalsha_usec_per_call);
    m
}

pub(crate) fn sync_connection(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .expect("valid URL")
        .get_connection()
        .expect("connect")
}

/// `CONFIG RESETSTAT`: zeroes the server's command statistics.
pub(crate) fn reset_server_stats(url: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut sync_connection(url))
        .expect("CONFIG RESETSTAT");
}

/// `usec_per_call` of `EVALSHA` since the last reset: the server's own time
/// per script call (parsing, the script and its commands), without the
/// network or the client.
pub(crate) fn evalsha_usec_per_call(url: &str) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut sync_connection(url))
        .expect("INFO commandstats");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|l| {
            l.split(',')
                .find_map(|kv| kv.strip_prefix("usec_per_call="))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(f64::NAN)
}
