//! The sections on overload (`overload`, the service's `bursts`) and on
//! TLS (`tls_cost`): their readers and their text.

use crate::markdown::{Table, median, plain};
use crate::results::Results;
use crate::writer::Page;

/// What `overload` printed: its open-loop and closed-loop medians.
#[derive(Debug, Clone)]
pub(crate) struct Overload {
    /// The run's description line (`Machine: ...`): the host, the load
    /// beside it, the timeout.
    pub(crate) machine: String,
    /// The open loop's medians, as printed.
    pub(crate) open: Table,
    /// The closed loop's medians, as printed.
    pub(crate) closed: Table,
}

/// `name` (`overload.md`, or `overload_busy.md` for the run beside busy
/// processes).
pub(crate) fn overload(r: &mut Results, name: &str) -> Option<Overload> {
    r.with(name, |doc| {
        // The medians (the per-run tables have the same columns and more).
        let medians = |columns: &[&str], heading: &str| -> Result<Table, String> {
            doc.tables(columns)
                .into_iter()
                .find(|t| t.heading.as_deref().is_some_and(|h| h.starts_with(heading)))
                .cloned()
                .ok_or_else(|| format!("{}: no table under a heading `{heading} ...`", doc.name))
        };
        let open = medians(
            &["client", "× μ", "μ", "by the store", "goodput / μ"],
            "Open loop, medians",
        )?;
        let closed = medians(
            &[
                "client",
                "callers",
                "store decisions/s",
                "over the first count's rate",
            ],
            "Closed loop, medians",
        )?;
        let machine = doc
            .text
            .lines()
            .find_map(|l| l.strip_prefix("Machine: "))
            .map(str::to_owned)
            .ok_or_else(|| format!("{}: no `Machine:` line", doc.name))?;
        Ok(Overload {
            machine,
            open,
            closed,
        })
    })
}

/// What the service's `bursts` bench printed: its rounds and its summary.
#[derive(Debug, Clone)]
pub(crate) struct Bursts {
    /// The heading (the setting).
    pub(crate) setting: String,
    /// The rounds, as printed.
    pub(crate) rounds: Table,
    /// `Exactly 20 admitted in ...`.
    pub(crate) summary: String,
}

/// `bursts.md`.
pub(crate) fn bursts(r: &mut Results) -> Option<Bursts> {
    r.with("bursts.md", |doc| {
        let rounds = doc
            .table(&["round", "admitted", "by the store", "from leases"])?
            .clone();
        let summary = doc
            .text
            .lines()
            .find(|l| l.starts_with("Exactly "))
            .ok_or_else(|| format!("{}: no `Exactly ...` summary line", doc.name))?
            .to_owned();
        let setting = rounds
            .heading
            .clone()
            .ok_or_else(|| format!("{}: no heading above the table", doc.name))?;
        Ok(Bursts {
            setting,
            rounds,
            summary,
        })
    })
}

/// `tls_cost.md`: its table, as printed.
pub(crate) fn tls_cost(r: &mut Results) -> Option<Table> {
    r.with("tls_cost.md", |doc| {
        Ok(doc
            .table(&["measure", "plain text", "TLS", "TLS / plain"])?
            .clone())
    })
}

/// The host of a `Machine:` line (its text up to the first `;`).
fn first_part(line: &str) -> &str {
    line.split(';').next().unwrap_or(line).trim()
}

/// A table as printed, its first column left-aligned.
fn as_printed(p: &mut Page, t: &Table) {
    let header: Vec<&str> = t.header.iter().map(String::as_str).collect();
    let align: String = (0..t.header.len())
        .map(|i| if i == 0 { 'l' } else { 'r' })
        .collect();
    p.table(&header, &align, &t.rows);
}

/// The overload section.
pub(crate) fn overload_section(
    p: &mut Page,
    quiet: Option<&Overload>,
    pinned: Option<&Overload>,
    busy: Option<&Overload>,
    bursts: Option<&Bursts>,
) {
    p.h2("Under overload: arrival rates, thousands of callers, bursts");
    match quiet {
        Some(q) => p.para(&format!("{OVERLOAD} Host: {}.", first_part(&q.machine))),
        None => p.para(OVERLOAD),
    }
    // Whether a run's open loop is shown: with the load on one CPU (the
    // server on the other) it measures the generator's lag, not the store.
    for (title, run, file, open) in [
        (
            "No other load on the machine: the server and the load on both CPUs",
            quiet,
            "overload.md",
            true,
        ),
        (
            "No other load: the server on a CPU of its own, the load on the other",
            pinned,
            "overload_pinned.md",
            false,
        ),
        (
            "A busy host: two processes spinning beside it",
            busy,
            "overload_busy.md",
            true,
        ),
    ] {
        p.h3(title);
        match run {
            Some(o) => {
                if open {
                    as_printed(p, &o.open);
                }
                as_printed(p, &o.closed);
            }
            None => p.missing(file),
        }
    }
    p.h3("Two service instances, bursts on a busy host");
    p.para(BURSTS);
    match bursts {
        Some(b) => {
            burst_rounds(p, &b.rounds);
            p.para(&format!("{}. {}", plain(&b.setting), b.summary));
        }
        None => p.missing("bursts.md"),
    }
}

/// The bursts' rounds in one row: each column's fewest and most over the
/// rounds (one figure where every round gave the same), the time a round
/// took as its median and range.
fn burst_rounds(p: &mut Page, t: &Table) {
    let column = |name: &str| -> Vec<f64> {
        let Some(i) = t.header.iter().position(|h| h == name) else {
            return Vec::new();
        };
        t.rows
            .iter()
            .filter_map(|r| r.get(i))
            .filter_map(|c| c.trim_end_matches(" ms").parse().ok())
            .collect()
    };
    let span = |v: &[f64]| -> String {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        match (v.is_empty(), lo == hi) {
            (true, _) => "–".to_owned(),
            (false, true) => format!("{lo}"),
            (false, false) => format!("{lo}-{hi}"),
        }
    };
    let took = column("took");
    let took = match median(&took) {
        Some(m) => format!("{m:.0} ms ({} ms)", span(&took)),
        None => "–".to_owned(),
    };
    let mut row = vec![t.rows.len().to_string()];
    for name in [
        "admitted",
        "by the store",
        "from leases",
        "by the failure policy",
    ] {
        row.push(span(&column(name)));
    }
    row.push(took);
    p.table(
        &[
            "rounds",
            "admitted a round",
            "by the store",
            "from leases",
            "by the failure policy",
            "took a round (median, range)",
        ],
        "rrrrrr",
        &[row],
    );
}

/// The TLS section.
pub(crate) fn tls_section(p: &mut Page, table: Option<&Table>) {
    p.h2("TLS: the handshake and the cost per decision");
    p.para(TLS);
    match table {
        Some(t) => as_printed(p, t),
        None => p.missing("tls_cost.md"),
    }
}

/// The overload section's introduction.
const OVERLOAD: &str = "`overload` (`benches/src/bin/overload.rs`) starts its own \
`redis-server` and, per client, measures the store's capacity μ through the open loop's own \
path (1,024 callers calling `Limiter::check` back to back, each call a task of its own as an \
arrival is, a quota every call passes: the generator, the client and the server share the two \
cores), then offers Poisson arrivals at multiples of μ for 3 s each, every arrival its own \
task, latency counted from its scheduled instant; then 256 and 4,096 closed-loop callers. \
Every load draws on the same 100,000 callers, each written once before the section is measured \
(a keyspace of steady size: Redis rehashes a growing one at each power of two, at the cost of \
its rate). \
Limiters have the library's defaults (20 ms, `.instances(2)`, the store's own I/O thread). \
`goodput / μ`: the store's decisions per second over its capacity; `not by the store answered \
≤ 1 ms`: of the decisions the store did not make, the share answered within 1 ms of the call \
(refused at once by the node's admission, decided from a lease); `tracked`: one arrival in a \
hundred goes to 100 callers limited to 20 a day, whose every admission, whatever decided it, \
is counted against the limit (two instances' leases may admit up to 18 beyond it: the stated \
bound). Targets: at ≤ 0.9 μ, 99.9 % by the store; at 1.5 μ and 3 μ, goodput ≥ 0.9 μ; 4,096 \
callers at ≥ 0.9 of 256 callers' rate. On two cores the generator, the client and the \
server share the CPUs: every arrival past μ still costs the generator a task and the limiter a \
decision, and callers answered at once ask again at once, so goodput at 3 μ and 4,096 callers \
beside busy processes measure what is left of the machine as much as the store. With 4,096 \
callers on both CPUs, the callers refused at once keep the application's threads runnable, and \
the kernel shares the CPUs evenly among runnable threads: `redis-server`, single-threaded, gets \
about half a CPU, and its rate falls with it. With the server on a CPU of its own \
(`--server-cpu 1`, as a Redis on a host of its own is), nothing the load does takes its CPU (its \
closed loop only: with one CPU left, the open loop's generator falls behind its schedule).";

/// The bursts section's introduction.
const BURSTS: &str = "`cargo bench -p ratelimit-server --bench bursts`: two release builds \
of the service on one `redis-server` with the service's defaults (`--instances 2`, 20 ms \
`--timeout`) beside one spinning process per CPU, ten rounds of 2,000 gRPC calls, 64 in flight \
over both instances, on one descriptor limited to 20 a minute (a sliding log, exact in every \
trailing minute), each round a caller of its own.";

/// The TLS section's introduction.
const TLS: &str = "`tls_cost` (`benches/src/bin/tls_cost.rs`) starts a plain-text \
`redis-server` and one serving TLS only with client certificates required, and alternates \
them: a new connection and its first `PING` with the store's client settings, 200 times; then \
`Limiter::check` over `RedisStore` for 3 s with 1 caller and with 256. Medians of the rounds. \
The handshake is paid when a store connects and reconnects, not per decision.";
