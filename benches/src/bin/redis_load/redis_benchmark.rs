//! `redis-benchmark` running a script with `EVALSHA` at the same concurrency.

use std::process::Command;

/// `redis-benchmark` sending `EVALSHA sha 1 <key with __rand_int__> args...`
/// from `clients` connections, `pipeline` requests in flight on each.
/// Returns requests/s, p50 and p99 in µs.
pub(crate) fn redis_benchmark(
    port: u16,
    (clients, pipeline): (usize, usize),
    requests: usize,
    keyspace: usize,
    sha: &str,
    key: &str,
    args: &[String],
) -> Option<(f64, f64, f64)> {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &clients.to_string(), "-n", &requests.to_string()])
        .args(["-P", &pipeline.to_string()])
        .args(["-r", &keyspace.to_string(), "--csv"])
        .args(["EVALSHA", sha, "1", key])
        .args(args)
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "redis-benchmark could not run ({e}): install Debian's redis-tools \
                 (`apt-get install -y redis-tools`)"
            );
            return None;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let line = text.lines().rfind(|l| l.starts_with("\"EVALSHA"))?;
    let f: Vec<f64> = line
        .split("\",\"")
        .skip(1)
        .map(|s| s.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    Some((f[0], f[3] * 1000.0, f[5] * 1000.0))
}
