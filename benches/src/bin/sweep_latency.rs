//! Decision latency of the local store while 200,000 callers expire (and,
//! for comparison, while they stay live): the store's automatic sweep
//! beside a full [`LocalStore::sweep`] run inline by the first decision
//! of every interval, which is what the store's automatic sweep did before
//! it became incremental (the call that found the sweep due walked every
//! map).
//!
//! ```text
//! cargo run --release -p ratelimit-benches --bin sweep_latency
//! cargo run --release -p ratelimit-benches --bin sweep_latency -- --rounds 5 --rate 20000
//! ```
//!
//! On the system clock (the store's default `FastClock`), for each scenario
//! and round, and for each of the two ways in turn (so a busy neighbour
//! slows both alike):
//!
//! 1. a fresh store gets `--callers` callers (default 200,000) making one
//!    call each: a fixed window of 10 per second, so every one of them
//!    expires at the next whole second (scenario `expiring`), or of 10 per
//!    hour, so none does (`live`);
//! 2. 1,000 other callers (a token bucket each, never idle) then make
//!    `--rate` decisions per second (default 10,000) for `--seconds`
//!    seconds (default 4), open loop: decision k is due at
//!    `start + k / rate`, and the thread waits for that time if it is
//!    ahead. A decision's **service time** is the decision alone (for the
//!    full inline sweep, the first decision of each second includes the
//!    sweep). Its **response time** is what a server handling the decisions
//!    one after another on one thread would see: it waits for the
//!    decisions due before it to finish, then takes its service time, so a
//!    decision stuck behind a sweep also delays the ones due meanwhile. It
//!    is computed from the service times (`start = max(due, previous
//!    finish)`), so that the time this thread spends descheduled while it
//!    *waits* for the next decision's due time, which on a shared machine
//!    is most of the noise, does not count; a descheduling in the middle of
//!    a decision does.
//!
//! Prints, per scenario and way, the median over the rounds of p50, p99,
//! p99.9 and max, the ratios of the full inline sweep's figures to the
//! automatic sweep's, and the callers left at the end. The goal is a p99.9
//! response time under 1 ms with the automatic sweep; the program exits
//! with status 1 if it is missed in a scenario.
//!
//! Options: `--rounds N` (default 3), `--callers N`, `--rate N`,
//! `--seconds S`.

use std::time::{Duration, Instant};

use ratelimit_core::{Quota, Rate};
use ratelimit_local::LocalStore;

/// The goal for the automatic sweep's p99.9 response time.
const GOAL: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// The store's own automatic sweep.
    Automatic,
    /// Automatic sweeps off; `sweep()` called inline once per second.
    FullInline,
}

impl Way {
    fn label(self) -> &'static str {
        match self {
            Way::Automatic => "automatic sweep",
            Way::FullInline => "full `sweep()` inline, once a second",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Expiring,
    Live,
}

impl Scenario {
    fn label(self) -> &'static str {
        match self {
            Scenario::Expiring => "expiring",
            Scenario::Live => "live",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Args {
    rounds: usize,
    callers: usize,
    rate: u64,
    seconds: f64,
}

fn parse_args() -> Args {
    let mut a = Args {
        rounds: 3,
        callers: 200_000,
        rate: 10_000,
        seconds: 4.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_default();
        let bad = || -> ! {
            eprintln!("usage: sweep_latency [--rounds N] [--callers N] [--rate N] [--seconds S]");
            std::process::exit(2)
        };
        match flag.as_str() {
            "--rounds" => a.rounds = value.parse().unwrap_or_else(|_| bad()),
            "--callers" => a.callers = value.parse().unwrap_or_else(|_| bad()),
            "--rate" => a.rate = value.parse().unwrap_or_else(|_| bad()),
            "--seconds" => a.seconds = value.parse().unwrap_or_else(|_| bad()),
            _ => bad(),
        }
    }
    a.rounds = a.rounds.max(1);
    a.rate = a.rate.max(1);
    a
}

/// p50, p99, p99.9, max of one run, for response and service times, and
/// the callers left at the end.
#[derive(Debug, Clone, Copy)]
struct Run {
    response: [Duration; 4],
    service: [Duration; 4],
    over_goal: usize,
    left: usize,
}

fn quantiles(mut v: Vec<Duration>) -> [Duration; 4] {
    v.sort_unstable();
    let q = |q: f64| v[(((v.len() - 1) as f64) * q).round() as usize];
    [q(0.5), q(0.99), q(0.999), v[v.len() - 1]]
}

fn run(scenario: Scenario, way: Way, args: &Args, ids: &[String]) -> Run {
    let interval = Duration::from_secs(1);
    let store = match way {
        Way::Automatic => LocalStore::new(),
        Way::FullInline => LocalStore::new().sweep_interval(Duration::MAX),
    };
    let mut sweep_due = Instant::now() + interval;
    let idle = match scenario {
        Scenario::Expiring => Quota::fixed_window(Rate::per_second(10)).unwrap(),
        Scenario::Live => Quota::fixed_window(Rate::per_hour(10)).unwrap(),
    };
    for id in ids {
        store.decide_now(id.as_bytes(), &idle, 1).unwrap();
    }
    let active: Vec<String> = (0..1_000).map(|i| format!("active-{i}")).collect();
    // One token an hour from a burst of a million: every call is admitted
    // and no active caller ever becomes idle.
    let busy = Quota::token_bucket(Rate::per_hour(1), 1_000_000).unwrap();
    for id in &active {
        store.decide_now(id.as_bytes(), &busy, 1).unwrap();
    }

    let n = (args.seconds * args.rate as f64) as u64;
    let mut response = Vec::with_capacity(n as usize);
    let mut service = Vec::with_capacity(n as usize);
    // The simulated server's time, from `start`, at which it is free.
    let mut free_at = Duration::ZERO;
    let start = Instant::now();
    for k in 0..n {
        let due = Duration::from_nanos(k * 1_000_000_000 / args.rate);
        while start.elapsed() < due {
            std::hint::spin_loop();
        }
        let t0 = Instant::now();
        if way == Way::FullInline && t0 >= sweep_due {
            store.sweep();
            sweep_due = t0 + interval;
        }
        let id = &active[(k % active.len() as u64) as usize];
        let d = store.decide_now(id.as_bytes(), &busy, 1).unwrap();
        std::hint::black_box(d);
        let took = t0.elapsed();
        free_at = free_at.max(due) + took;
        response.push(free_at - due);
        service.push(took);
    }
    let over_goal = response.iter().filter(|&&d| d >= GOAL).count();
    Run {
        response: quantiles(response),
        service: quantiles(service),
        over_goal,
        left: store.len().saturating_sub(active.len()),
    }
}

fn show(d: Duration) -> String {
    if d >= Duration::from_millis(1) {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    }
}

fn median<T: Copy + PartialOrd>(mut v: Vec<T>) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

fn main() {
    let args = parse_args();
    let ids = ratelimit_benches::caller_ids(args.callers);
    let ways = [Way::FullInline, Way::Automatic];
    let scenarios = [Scenario::Expiring, Scenario::Live];
    let mut missed = false;
    println!(
        "{} callers, {} decisions per second for {} s by 1,000 other callers, {} round(s), median of rounds\n",
        args.callers, args.rate, args.seconds, args.rounds
    );
    for scenario in scenarios {
        let mut runs: Vec<Vec<Run>> = vec![Vec::new(); ways.len()];
        for round in 0..args.rounds {
            for (w, way) in ways.iter().enumerate() {
                let r = run(scenario, *way, &args, &ids);
                eprintln!(
                    "{} round {}: {:<40} response p99.9 {} max {}; service max {}; left {}",
                    scenario.label(),
                    round + 1,
                    way.label(),
                    show(r.response[2]),
                    show(r.response[3]),
                    show(r.service[3]),
                    r.left
                );
                runs[w].push(r);
            }
        }
        println!("### Callers {}\n", scenario.label());
        println!(
            "| way | response p50 | p99 | p99.9 | max | ≥ 1 ms | service p99.9 | service max | callers left |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        let mut med = Vec::new();
        for (w, way) in ways.iter().enumerate() {
            let rs = &runs[w];
            let resp: Vec<Duration> = (0..4)
                .map(|i| median(rs.iter().map(|r| r.response[i]).collect()))
                .collect();
            let serv: Vec<Duration> = (0..4)
                .map(|i| median(rs.iter().map(|r| r.service[i]).collect()))
                .collect();
            let over = median(rs.iter().map(|r| r.over_goal).collect());
            let left = median(rs.iter().map(|r| r.left).collect());
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                way.label(),
                show(resp[0]),
                show(resp[1]),
                show(resp[2]),
                show(resp[3]),
                over,
                show(serv[2]),
                show(serv[3]),
                left
            );
            med.push((resp, serv));
        }
        // Ratios of the full inline sweep's figures to the automatic one's,
        // per round, then their median.
        let ratio = |f: &dyn Fn(&Run) -> Duration| {
            median(
                runs[0]
                    .iter()
                    .zip(&runs[1])
                    .map(|(a, b)| f(a).as_secs_f64() / f(b).as_secs_f64().max(1e-9))
                    .collect(),
            )
        };
        println!(
            "\nfull inline / automatic (median of per-round ratios): response p99 {:.1}x, p99.9 {:.1}x, max {:.1}x; service max {:.1}x",
            ratio(&|r| r.response[1]),
            ratio(&|r| r.response[2]),
            ratio(&|r| r.response[3]),
            ratio(&|r| r.service[3]),
        );
        let auto_p999 = med[1].0[2];
        let met = auto_p999 < GOAL;
        missed |= !met;
        println!(
            "goal: automatic sweep p99.9 response < 1 ms: {} ({})\n",
            if met { "met" } else { "MISSED" },
            show(auto_p999)
        );
    }
    if missed {
        std::process::exit(1);
    }
}
