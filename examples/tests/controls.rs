//! The production-control programs, run against a real Redis started by
//! the testkit: worker pools in two processes sharing one allowance through
//! `acquire`, and a retry storm with and without the deny cache.

use std::process::Command;

use ratelimit_testkit::redis_server::RedisServer;

fn run(bin: &str, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(args)
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{bin} {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn workers_in_two_processes_share_one_allowance() {
    let server = RedisServer::start();
    let url = server.url();
    let out = run(
        env!("CARGO_BIN_EXE_workers"),
        &[
            "--redis",
            &url,
            "--processes",
            "2",
            "--workers",
            "3",
            "--rate",
            "20",
            "--burst",
            "2",
            "--seconds",
            "1.5",
        ],
    );
    println!("{out}");
    // The program itself fails if more than burst + rate × span passed.
    let counts = out
        .lines()
        .find_map(|l| l.strip_prefix("admitted per process: "))
        .expect("per-process counts");
    let counts: Vec<u64> = counts
        .trim_matches(|c| c == '[' || c == ']')
        .split(", ")
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(counts.len(), 2);
    assert!(
        counts.iter().all(|&n| n > 0),
        "both processes got a share: {counts:?}"
    );
    assert!(out.contains("quota 20 per second"), "{out}");
}

#[test]
fn the_deny_cache_saves_round_trips_in_a_retry_storm_and_admits_the_same() {
    let server = RedisServer::start();
    let url = server.url();
    let out = run(
        env!("CARGO_BIN_EXE_retry_storm"),
        &["--redis", &url, "--callers", "10", "--seconds", "5"],
    );
    println!("{out}");
    // The program fails if the admitted calls differ; here: the savings.
    let rows: Vec<&str> = out.lines().filter(|l| l.ends_with(" % |")).collect();
    assert_eq!(rows.len(), 4, "one row per algorithm:\n{out}");
    for row in rows {
        let fewer: f64 = row
            .rsplit('|')
            .nth(1)
            .and_then(|c| c.trim().trim_end_matches(" %").parse().ok())
            .unwrap_or_else(|| panic!("no percentage in {row}"));
        assert!(fewer >= 90.0, "fewer than 90 % round trips saved: {row}");
    }
}
