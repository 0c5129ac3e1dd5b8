//! The command line: the options and their defaults.

/// The options (see the module docs for what each does).
pub(crate) const USAGE: &str = "usage: redis_load [--runs R] [--tasks N] [--connections M] [--callers K] \
[--seconds S] [--bench-requests Q] [--memory-callers C] [--deny] [--skip-memory] \
[--skip-overhead] [--skip-throughput] [--ratio-only] [--cluster]";

#[derive(Debug, Clone)]
pub(crate) struct Args {
    pub(crate) runs: usize,
    pub(crate) tasks: usize,
    pub(crate) connections: usize,
    pub(crate) callers: usize,
    pub(crate) seconds: f64,
    pub(crate) bench_requests: usize,
    pub(crate) memory_callers: usize,
    pub(crate) deny: bool,
    pub(crate) memory: bool,
    pub(crate) overhead: bool,
    pub(crate) throughput: bool,
    /// Only what the client-side ratio needs: the token bucket through
    /// `Limiter::check` and its bare `EVALSHA`, per client.
    pub(crate) ratio_only: bool,
    pub(crate) cluster: bool,
}

pub(crate) fn parse_args() -> Args {
    let mut a = Args {
        runs: 3,
        tasks: 32,
        connections: 4,
        callers: 10_000,
        seconds: 3.0,
        bench_requests: 150_000,
        memory_callers: 100_000,
        deny: false,
        memory: true,
        overhead: true,
        throughput: true,
        ratio_only: false,
        cluster: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| panic!("{flag} needs a value"))
                .parse::<f64>()
                .unwrap_or_else(|e| panic!("{flag}: {e}"))
        };
        match flag.as_str() {
            "--runs" => a.runs = value() as usize,
            "--tasks" => a.tasks = value() as usize,
            "--connections" => a.connections = value() as usize,
            "--callers" => a.callers = value() as usize,
            "--seconds" => a.seconds = value(),
            "--bench-requests" => a.bench_requests = value() as usize,
            "--memory-callers" => a.memory_callers = value() as usize,
            "--deny" => a.deny = true,
            "--skip-memory" => a.memory = false,
            "--skip-overhead" => a.overhead = false,
            "--skip-throughput" => a.throughput = false,
            "--ratio-only" => a.ratio_only = true,
            "--cluster" => a.cluster = true,
            // `cargo bench` passes --bench to every target.
            "--bench" => {}
            other => ratelimit_benches::not_an_option(other, USAGE),
        }
    }
    assert!(a.runs > 0 && a.tasks > 0 && a.connections > 0 && a.callers > 0);
    a
}
