//! The result files `benches/run.sh` writes, read into the figures the page
//! shows. Each reader returns `None` when its file is missing (the page
//! then says so) and records a problem when the file is there but not as
//! its program prints it.

use std::path::{Path, PathBuf};

use crate::markdown::{Doc, Table, micros, number, plain};

/// The results directory, what was missing from it, and what was wrong.
#[derive(Debug)]
pub(crate) struct Results {
    dir: PathBuf,
    /// Files that were not there.
    pub(crate) missing: Vec<String>,
    /// Files that were there but could not be read as their program
    /// prints them, each with what was wrong.
    pub(crate) problems: Vec<String>,
    /// Files that were read.
    pub(crate) found: usize,
}

impl Results {
    /// The results in `dir`.
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            missing: Vec::new(),
            problems: Vec::new(),
            found: 0,
        }
    }

    /// The file `name`, parsed; `None` (recorded as missing) when absent.
    fn doc(&mut self, name: &str) -> Option<Doc> {
        match Doc::read(&self.dir.join(name)) {
            Ok(Some(doc)) => {
                self.found += 1;
                Some(doc)
            }
            Ok(None) => {
                self.missing.push(name.to_owned());
                None
            }
            Err(e) => {
                self.problems.push(e);
                None
            }
        }
    }

    /// The files whose names start with `prefix` and end with `suffix`,
    /// parsed, in name order; recorded as missing when there is none.
    fn docs(&mut self, prefix: &str, suffix: &str) -> Vec<Doc> {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(prefix) && n.ends_with(suffix))
                    .collect()
            })
            .unwrap_or_default();
        names.sort_by_key(|n| {
            // run10 after run9.
            let digits: String = n.chars().filter(char::is_ascii_digit).collect();
            (digits.parse::<u64>().unwrap_or(0), n.clone())
        });
        if names.is_empty() {
            self.missing.push(format!("{prefix}*{suffix}"));
            return Vec::new();
        }
        names.iter().filter_map(|n| self.doc(n)).collect()
    }

    /// Records what is wrong with a file, and gives `None`.
    fn wrong<T>(&mut self, problem: String) -> Option<T> {
        self.problems.push(problem);
        None
    }

    /// Reads what `read` makes of the file `name`: `None` if it is missing
    /// or wrong (recorded either way).
    pub(crate) fn with<T>(
        &mut self,
        name: &str,
        read: impl FnOnce(&Doc) -> Result<T, String>,
    ) -> Option<T> {
        let doc = self.doc(name)?;
        match read(&doc) {
            Ok(v) => Some(v),
            Err(e) => self.wrong(e),
        }
    }
}

/// A cell of `row` under column `col` of `t`, as a number.
fn num_at(t: &Table, row: &[String], col: &str) -> Option<f64> {
    number(row.get(t.col(col)?)?)
}

/// A cell of `row` under column `col` of `t`, as plain text.
fn text_at(t: &Table, row: &[String], col: &str) -> Option<String> {
    Some(plain(row.get(t.col(col)?)?))
}

/// The machine, as `run.sh` describes it (`key: value` lines).
#[derive(Debug, Clone, Default)]
pub(crate) struct Machine {
    /// The `key: value` pairs, in order.
    pub(crate) lines: Vec<(String, String)>,
}

impl Machine {
    /// The value of `key`, if given.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.lines
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// `machine.md`.
pub(crate) fn machine(r: &mut Results) -> Option<Machine> {
    r.with("machine.md", |doc| {
        let lines: Vec<(String, String)> = doc
            .text
            .lines()
            .filter_map(|l| l.split_once(": "))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect();
        if lines.is_empty() {
            return Err(format!("{}: no `key: value` lines", doc.name));
        }
        Ok(Machine { lines })
    })
}

/// One scenario of the interleaved local bench, over its runs.
#[derive(Debug, Clone)]
pub(crate) struct LocalScenario {
    /// `hot_key`, `10k_keys` or `1m_keys`.
    pub(crate) keys: String,
    /// The quota's name in the bench (`100_per_min_burst_20`, ...).
    pub(crate) quota: String,
    /// Threads.
    pub(crate) threads: String,
    /// Per run, each contender's time over governor's: the fastest path,
    /// `dyn Store`, `Limiter::check`, throttlecrab.
    pub(crate) ratios: [Vec<f64>; 4],
    /// Per run, nanoseconds per decision: the fastest path, `dyn Store`,
    /// `Limiter::check`, governor, throttlecrab.
    pub(crate) ns: [Vec<f64>; 5],
}

/// The interleaved local bench's scenarios, over `local-interleaved-run*.md`.
#[derive(Debug, Clone)]
pub(crate) struct LocalWall {
    /// The runs read.
    pub(crate) runs: usize,
    /// The scenarios, in the bench's order.
    pub(crate) scenarios: Vec<LocalScenario>,
}

impl LocalWall {
    /// The scenario of `keys`, `quota` (a prefix of its name), `threads`.
    pub(crate) fn get(&self, keys: &str, quota: &str, threads: &str) -> Option<&LocalScenario> {
        self.scenarios
            .iter()
            .find(|s| s.keys == keys && s.quota.starts_with(quota) && s.threads == threads)
    }
}

/// The interleaved bench's columns of nanoseconds, in the order of
/// [`LocalScenario::ns`].
const NS_COLUMNS: [&str; 5] = [
    "fastest path",
    "dyn store",
    "limiter::check",
    "governor",
    "throttlecrab",
];

/// `local-interleaved-run*.md`.
pub(crate) fn local_wall(r: &mut Results) -> Option<LocalWall> {
    let docs = r.docs("local-interleaved-run", ".md");
    if docs.is_empty() {
        return None;
    }
    let cols = [
        "fastest/gov",
        "store/gov",
        "limiter/gov",
        "throttlecrab/gov",
    ];
    let mut scenarios: Vec<LocalScenario> = Vec::new();
    for doc in &docs {
        let t = match doc.table(&["keys", "quota", "threads", "fastest/gov", "limiter/gov"]) {
            Ok(t) => t,
            Err(e) => return r.wrong(e),
        };
        for row in &t.rows {
            let (Some(keys), Some(quota), Some(threads)) = (
                text_at(t, row, "keys"),
                text_at(t, row, "quota"),
                text_at(t, row, "threads"),
            ) else {
                return r.wrong(format!(
                    "{}: a row without keys, quota or threads",
                    doc.name
                ));
            };
            let i = match scenarios
                .iter()
                .position(|s| s.keys == keys && s.quota == quota && s.threads == threads)
            {
                Some(i) => i,
                None => {
                    scenarios.push(LocalScenario {
                        keys,
                        quota,
                        threads,
                        ratios: Default::default(),
                        ns: Default::default(),
                    });
                    scenarios.len() - 1
                }
            };
            let s = &mut scenarios[i];
            for (k, c) in cols.iter().enumerate() {
                if let Some(v) = num_at(t, row, c) {
                    s.ratios[k].push(v);
                }
            }
            for (k, c) in NS_COLUMNS.iter().enumerate() {
                if let Some(v) = num_at(t, row, c) {
                    s.ns[k].push(v);
                }
            }
        }
    }
    if scenarios.is_empty() {
        return r.wrong("local-interleaved-run*.md: no scenario rows".to_owned());
    }
    Some(LocalWall {
        runs: docs.len(),
        scenarios,
    })
}

/// One client's instructions per decision: (client, bare `EVALSHA`,
/// `RedisStore`, `Limiter::check`).
pub(crate) type ClientInstructions = (String, Option<f64>, Option<f64>, Option<f64>);

/// Instructions per decision: in process on a hot key, and a Redis
/// decision's client side.
#[derive(Debug, Clone, Default)]
pub(crate) struct Instructions {
    /// In process: (contender, sold plan, admit-everything bucket).
    pub(crate) local: Vec<(String, Option<f64>, Option<f64>)>,
    /// Client side: (client, bare `EVALSHA`, `RedisStore`, `Limiter::check`).
    pub(crate) client: Vec<ClientInstructions>,
}

/// `instructions.md` (`benches/instructions.sh`).
pub(crate) fn instructions(r: &mut Results) -> Option<Instructions> {
    r.with("instructions.md", |doc| {
        let local = doc.table(&["contender", "hot key, 100/min", "hot key, 1e9/s"])?;
        let client = doc.table(&["client", "bare", "redisstore", "limiter::check"])?;
        Ok(Instructions {
            local: local
                .rows
                .iter()
                .map(|row| {
                    (
                        row.first().cloned().unwrap_or_default(),
                        num_at(local, row, "hot key, 100/min"),
                        num_at(local, row, "hot key, 1e9/s"),
                    )
                })
                .collect(),
            client: client
                .rows
                .iter()
                .map(|row| {
                    (
                        row.first().cloned().unwrap_or_default(),
                        num_at(client, row, "bare"),
                        num_at(client, row, "redisstore"),
                        num_at(client, row, "limiter::check"),
                    )
                })
                .collect(),
        })
    })
}

/// Live heap bytes per caller in process.
#[derive(Debug, Clone)]
pub(crate) struct LocalMemory {
    /// (store, bytes per active caller, bytes left after idle eviction).
    pub(crate) rows: Vec<(String, Option<f64>, Option<f64>)>,
}

/// `local_memory.md`.
pub(crate) fn local_memory(r: &mut Results) -> Option<LocalMemory> {
    r.with("local_memory.md", |doc| {
        let t = doc.table(&["store", "live heap bytes", "after idle eviction"])?;
        Ok(LocalMemory {
            rows: t
                .rows
                .iter()
                .map(|row| {
                    (
                        row.first().cloned().unwrap_or_default(),
                        num_at(t, row, "live heap bytes"),
                        num_at(t, row, "after idle eviction"),
                    )
                })
                .collect(),
        })
    })
}

/// `multi_quota.txt`: criterion's time per decision for 1, 2 and 3
/// quotas, in nanoseconds.
pub(crate) fn multi_quota(r: &mut Results) -> Option<Vec<(u32, f64)>> {
    r.with("multi_quota.txt", |doc| {
        let mut out = Vec::new();
        let mut current: Option<u32> = None;
        for line in doc.text.lines() {
            if let Some(rest) = line.trim_start().strip_prefix("quotas_per_call/") {
                current = rest.split('_').next().and_then(|n| n.parse().ok());
            }
            if let (Some(n), Some(bracket)) = (current, line.split_once("time:")) {
                // time:   [350.1 ns 354.3 ns 358.9 ns]: the middle estimate.
                let inside = bracket
                    .1
                    .trim()
                    .trim_start_matches('[')
                    .trim_end_matches(']');
                let words: Vec<&str> = inside.split_whitespace().collect();
                if words.len() < 6 {
                    return Err(format!("{}: cannot read `{}`", doc.name, line.trim()));
                }
                let Some(us) = micros(&format!("{} {}", words[2], words[3])) else {
                    return Err(format!("{}: cannot read `{}`", doc.name, line.trim()));
                };
                out.push((n, us * 1e3));
                current = None;
            }
        }
        if out.is_empty() {
            return Err(format!(
                "{}: no `quotas_per_call/..` result with a `time:` line",
                doc.name
            ));
        }
        Ok(out)
    })
}

/// One row of the sweep's tables.
#[derive(Debug, Clone)]
pub(crate) struct SweepRow {
    /// `expiring` or `live`.
    pub(crate) callers: String,
    /// The way of sweeping.
    pub(crate) way: String,
    /// Response p99, p99.9, max in µs; decisions of 1 ms or more; callers left.
    pub(crate) p99: Option<f64>,
    /// See `p99`.
    pub(crate) p999: Option<f64>,
    /// See `p99`.
    pub(crate) max: Option<f64>,
    /// See `p99`.
    pub(crate) over_1ms: Option<f64>,
    /// See `p99`.
    pub(crate) left: Option<f64>,
}

/// `sweep_latency.md`: its rows, and its goal lines (each after the
/// callers of its section: `expiring: automatic sweep p99.9 ...`).
pub(crate) fn sweep(r: &mut Results) -> Option<(Vec<SweepRow>, Vec<String>)> {
    r.with("sweep_latency.md", |doc| {
        let mut rows = Vec::new();
        for t in doc.tables(&["way", "response p50", "p99.9", "max"]) {
            let callers = t
                .heading
                .as_deref()
                .and_then(|h| h.strip_prefix("Callers "))
                .unwrap_or("")
                .to_owned();
            for row in &t.rows {
                let at = |c: &str| t.col(c).and_then(|i| row.get(i)).and_then(|s| micros(s));
                rows.push(SweepRow {
                    callers: callers.clone(),
                    way: row.first().cloned().unwrap_or_default(),
                    p99: t.nth_col("p99", 0).and_then(|i| micros(row.get(i)?)),
                    p999: at("p99.9"),
                    max: at("max"),
                    over_1ms: num_at(t, row, "≥ 1 ms"),
                    left: num_at(t, row, "callers left"),
                });
            }
        }
        if rows.is_empty() {
            return Err(format!(
                "{}: no table with the columns `way`, `response p50`, `p99.9`, `max`",
                doc.name
            ));
        }
        // Each goal line, with the callers of the section it closes.
        let mut goals = Vec::new();
        let mut callers = "";
        for line in doc.text.lines() {
            if let Some(c) = line.strip_prefix("### Callers ") {
                callers = c.trim();
            }
            if let Some(goal) = line.strip_prefix("goal: ") {
                goals.push(format!("{callers}: {goal}"));
            }
        }
        Ok((rows, goals))
    })
}

/// `local.md` (`bench_report`): the model's step, ns per decision.
pub(crate) fn model_step(r: &mut Results) -> Option<Vec<(String, f64)>> {
    r.with("local.md", |doc| {
        let t = doc.table(&["algorithm", "ns per decision"])?;
        Ok(t.rows
            .iter()
            .filter_map(|row| Some((plain(row.first()?), num_at(t, row, "ns per decision")?)))
            .collect())
    })
}

/// `script_instructions.md`: (contender, server instructions per call).
pub(crate) fn script_instructions(r: &mut Results) -> Option<Vec<(String, f64)>> {
    r.with("script_instructions.md", |doc| {
        let t = doc.table(&["contender", "server instructions per call"])?;
        let rows: Vec<(String, f64)> = t
            .rows
            .iter()
            .filter_map(|row| {
                Some((
                    plain(row.first()?),
                    num_at(t, row, "server instructions per call")?,
                ))
            })
            .collect();
        if rows.is_empty() {
            return Err(format!("{}: no counted row", doc.name));
        }
        Ok(rows)
    })
}

/// `script_cost.md`: the ratios (median of the per-round ratios).
pub(crate) fn script_cost(r: &mut Results) -> Option<Vec<(String, f64)>> {
    r.with("script_cost.md", |doc| {
        let t = doc.table(&["ratio", "value"])?;
        Ok(t.rows
            .iter()
            .filter_map(|row| Some((plain(row.first()?), num_at(t, row, "value")?)))
            .collect())
    })
}

/// `multi_cost.md`: the medians of the server's µs per call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MultiCost {
    /// The single token bucket script.
    pub(crate) single: f64,
    /// The batch script with that one quota.
    pub(crate) batch_one: f64,
    /// The batch script with three quotas.
    pub(crate) batch_three: f64,
    /// The same three quotas as three single calls, summed.
    pub(crate) three_singles: f64,
}

/// `multi_cost.md`.
pub(crate) fn multi_cost(r: &mut Results) -> Option<MultiCost> {
    r.with("multi_cost.md", |doc| {
        let line = doc
            .text
            .lines()
            .find(|l| l.starts_with("median:"))
            .ok_or_else(|| format!("{}: no `median:` line", doc.name))?;
        let after = |what: &str| {
            line.split_once(what)
                .and_then(|(_, rest)| number(rest.trim()))
                .ok_or_else(|| format!("{}: no `{what}` figure in `{line}`", doc.name))
        };
        Ok(MultiCost {
            single: after("single tb")?,
            batch_one: after("multi 1 quota")?,
            batch_three: after("multi 3 quotas")?,
            three_singles: after("3 singles")?,
        })
    })
}

/// `redis_memory.md`: (layout, bytes per caller).
pub(crate) fn redis_memory(r: &mut Results) -> Option<Vec<(String, f64)>> {
    r.with("redis_memory.md", |doc| {
        let t = doc.table(&["layout", "bytes per caller"])?;
        Ok(t.rows
            .iter()
            .filter_map(|row| Some((row.first()?.clone(), num_at(t, row, "bytes per caller")?)))
            .collect())
    })
}

/// One client-side ratio of `redis_load --ratio-only`, over runs.
#[derive(Debug, Clone)]
pub(crate) struct ClientRatio {
    /// `RedisStore::decide` or `Limiter::check`.
    pub(crate) what: String,
    /// `redis-rs` or `fred`.
    pub(crate) client: String,
    /// Each run's median ratio.
    pub(crate) runs: Vec<f64>,
}

/// The callers of a `redis_load` run, from its first line (`N tasks`).
fn tasks_of(doc: &Doc) -> Option<u64> {
    let line = doc.text.lines().find(|l| l.starts_with("## redis_load"))?;
    let (before, _) = line.split_once(" tasks")?;
    number(before.rsplit(' ').next()?).map(|x| x as u64)
}

/// `client_side.md` or `client_side_concurrent.md`: the callers and the
/// ratios.
pub(crate) fn client_side(r: &mut Results, name: &str) -> Option<(u64, Vec<ClientRatio>)> {
    r.with(name, |doc| {
        let mut out: Vec<ClientRatio> = Vec::new();
        for line in doc.text.lines() {
            let Some(rest) = line.trim().strip_prefix("ratio, ") else {
                continue;
            };
            let parsed = (|| {
                let (what, rest) = rest.split_once(" / bare EVALSHA (")?;
                let (client, rest) = rest.split_once(')')?;
                let (_, rest) = rest.split_once("median ")?;
                Some((what.to_owned(), client.to_owned(), number(rest)?))
            })();
            let Some((what, client, m)) = parsed else {
                return Err(format!("{}: cannot read `{}`", doc.name, line.trim()));
            };
            match out
                .iter_mut()
                .find(|c| c.what == what && c.client == client)
            {
                Some(c) => c.runs.push(m),
                None => out.push(ClientRatio {
                    what,
                    client,
                    runs: vec![m],
                }),
            }
        }
        if out.is_empty() {
            return Err(format!("{}: no `ratio, ... / bare EVALSHA` line", doc.name));
        }
        let tasks = tasks_of(doc)
            .ok_or_else(|| format!("{}: no `## redis_load: ... N tasks` line", doc.name))?;
        Ok((tasks, out))
    })
}

/// One row of the peers' table.
#[derive(Debug, Clone)]
pub(crate) struct PeerRow {
    /// Concurrent callers.
    pub(crate) callers: u64,
    /// The contender's name.
    pub(crate) contender: String,
    /// Decisions per second (median of the runs).
    pub(crate) per_second: Option<f64>,
    /// Over the naive script's, median of the per-run ratios.
    pub(crate) per_second_x: Option<f64>,
    /// The server's µs of CPU per decision.
    pub(crate) server_us: Option<f64>,
    /// Over the naive script's.
    pub(crate) server_us_x: Option<f64>,
    /// Decisions per script call.
    pub(crate) per_call: Option<f64>,
    /// Latency p50, p99 in µs.
    pub(crate) p50: Option<f64>,
    /// See `p50`.
    pub(crate) p99: Option<f64>,
}

/// One row of the peers' exactness and memory table.
#[derive(Debug, Clone)]
pub(crate) struct PeerLimit {
    /// The contender's name.
    pub(crate) contender: String,
    /// Admitted of 10,000 attempts at a limit of 1,000, as printed.
    pub(crate) admitted: String,
    /// `yes` or `no: N over`.
    pub(crate) within: String,
    /// Bytes per caller.
    pub(crate) bytes: Option<f64>,
}

/// The peers benchmark's output.
#[derive(Debug, Clone)]
pub(crate) struct Peers {
    /// Its first line (the server's version, the machine, the runs).
    pub(crate) title: String,
    /// The throughput rows.
    pub(crate) rows: Vec<PeerRow>,
    /// The exactness and memory rows.
    pub(crate) limits: Vec<PeerLimit>,
}

impl Peers {
    /// The row of `contender` (a prefix of its name) at the most callers
    /// measured.
    pub(crate) fn at_most(&self, contender: &str) -> Option<&PeerRow> {
        let most = self.rows.iter().map(|r| r.callers).max()?;
        self.rows
            .iter()
            .find(|r| r.callers == most && r.contender.starts_with(contender))
    }
}

/// `peers.md` or `peers_pinned.md`.
pub(crate) fn peers(r: &mut Results, name: &str) -> Option<Peers> {
    r.with(name, |doc| {
        let t = doc.table(&["callers", "contender", "decisions/s", "server µs/decision"])?;
        let x = |row: &[String], n: usize| number(row.get(t.nth_col("× naive", n)?)?);
        let rows = t
            .rows
            .iter()
            .filter_map(|row| {
                Some(PeerRow {
                    callers: num_at(t, row, "callers")? as u64,
                    contender: text_at(t, row, "contender")?,
                    per_second: num_at(t, row, "decisions/s"),
                    per_second_x: x(row, 0),
                    server_us: num_at(t, row, "server µs/decision"),
                    server_us_x: x(row, 1),
                    per_call: num_at(t, row, "decisions per call"),
                    p50: num_at(t, row, "p50"),
                    p99: num_at(t, row, "p99"),
                })
            })
            .collect::<Vec<_>>();
        if rows.is_empty() {
            return Err(format!("{}: no throughput row", doc.name));
        }
        let limits = doc
            .table(&[
                "contender",
                "admitted",
                "within its limit",
                "bytes per caller",
            ])
            .map(|t| {
                t.rows
                    .iter()
                    .filter_map(|row| {
                        Some(PeerLimit {
                            contender: text_at(t, row, "contender")?,
                            admitted: text_at(t, row, "admitted")?,
                            within: text_at(t, row, "within its limit")?,
                            bytes: num_at(t, row, "bytes per caller"),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Peers {
            title: doc
                .text
                .lines()
                .find(|l| l.starts_with("peers on one redis-server"))
                .unwrap_or("")
                .to_owned(),
            rows,
            limits,
        })
    })
}

/// The medians of the example servers under `wrk`.
#[derive(Debug, Clone)]
pub(crate) struct Servers {
    /// How many servers.
    pub(crate) servers: u64,
    /// Medians: requests/s, share by the store, share by the store or the
    /// fallback (%), fail-open decisions.
    pub(crate) per_second: Option<f64>,
    /// See `per_second`.
    pub(crate) store: Option<f64>,
    /// See `per_second`.
    pub(crate) store_or_fallback: Option<f64>,
    /// See `per_second`.
    pub(crate) fail_open: Option<f64>,
}

/// The medians of one client and coverage setting of the cluster section.
#[derive(Debug, Clone)]
pub(crate) struct Cluster {
    /// `redis-rs` or `fred`.
    pub(crate) client: String,
    /// `no` or `yes`.
    pub(crate) coverage: String,
    /// Each run's share of the healthy masters' callers decided by the store.
    pub(crate) store_runs: Vec<f64>,
    /// Medians: kill to promotion (µs), the healthy masters' callers'
    /// share by the store (%), their breakers opened, the dead master's
    /// callers back to the store after the promotion (µs).
    pub(crate) failover: Option<f64>,
    /// See `failover`.
    pub(crate) store: Option<f64>,
    /// See `failover`.
    pub(crate) opened: Option<f64>,
    /// See `failover`.
    pub(crate) back: Option<f64>,
}

/// `under_faults`' sections.
#[derive(Debug, Clone, Default)]
pub(crate) struct UnderFaults {
    /// The servers section's medians.
    pub(crate) servers: Vec<Servers>,
    /// The cluster section's medians.
    pub(crate) cluster: Vec<Cluster>,
}

/// Whether a row is a median row (`**name** | median | ...`).
fn is_median(t: &Table, row: &[String], col: &str) -> bool {
    text_at(t, row, col).as_deref() == Some("median")
}

/// `under_faults.md`.
pub(crate) fn under_faults(r: &mut Results, name: &str) -> Option<UnderFaults> {
    r.with(name, |doc| {
        let mut out = UnderFaults::default();
        if let Ok(t) = doc.table(&[
            "servers",
            "run",
            "requests/s",
            "by the store",
            "store or fallback",
        ]) {
            for row in t.rows.iter().filter(|row| is_median(t, row, "run")) {
                out.servers.push(Servers {
                    servers: num_at(t, row, "servers").unwrap_or(0.0) as u64,
                    per_second: num_at(t, row, "requests/s"),
                    store: num_at(t, row, "by the store"),
                    store_or_fallback: num_at(t, row, "store or fallback"),
                    fail_open: num_at(t, row, "fail-open"),
                });
            }
        }
        if let Ok(t) = doc.table(&["client", "full coverage", "run", "kill to promotion"]) {
            let store_col = t.nth_col("by the store", 0);
            for row in &t.rows {
                let (Some(client), Some(coverage)) =
                    (text_at(t, row, "client"), text_at(t, row, "full coverage"))
                else {
                    continue;
                };
                let pct = store_col.and_then(|i| number(row.get(i)?));
                let i = match out
                    .cluster
                    .iter()
                    .position(|c| c.client == client && c.coverage == coverage)
                {
                    Some(i) => i,
                    None => {
                        out.cluster.push(Cluster {
                            client,
                            coverage,
                            store_runs: Vec::new(),
                            failover: None,
                            store: None,
                            opened: None,
                            back: None,
                        });
                        out.cluster.len() - 1
                    }
                };
                let c = &mut out.cluster[i];
                if !is_median(t, row, "run") {
                    c.store_runs.extend(pct);
                    continue;
                }
                c.failover = t.col("kill to promotion").and_then(|i| micros(row.get(i)?));
                c.store = pct;
                c.opened = num_at(t, row, "their breakers opened");
                c.back = t
                    .col("store again after promotion")
                    .and_then(|i| micros(row.get(i)?));
            }
        }
        if out.servers.is_empty() && out.cluster.is_empty() {
            return Err(format!(
                "{}: none of under_faults' tables (servers, cluster)",
                doc.name
            ));
        }
        Ok(out)
    })
}

/// The restart medians of one client.
#[derive(Debug, Clone)]
pub(crate) struct Restart {
    /// `redis-rs` or `fred`.
    pub(crate) client: String,
    /// Runs.
    pub(crate) runs: String,
    /// A check's p50 while Redis is dead (µs).
    pub(crate) dead_p50: Option<f64>,
    /// The store's first decision after the port accepts (µs), median.
    pub(crate) back: Option<f64>,
    /// The worst of the runs (µs).
    pub(crate) worst: Option<f64>,
    /// After the first `PING` answered (µs).
    pub(crate) after_ping: Option<f64>,
}

/// `dead_redis.md`.
pub(crate) fn dead_redis(r: &mut Results) -> Option<Vec<Restart>> {
    r.with("dead_redis.md", |doc| {
        let t = doc.table(&["client", "run", "store again after the port accepts"])?;
        let rows: Vec<Restart> = t
            .rows
            .iter()
            .filter(|row| text_at(t, row, "run").is_some_and(|run| run.starts_with("median")))
            .filter_map(|row| {
                let back = text_at(t, row, "store again after the port accepts")?;
                let worst = back
                    .split_once("worst ")
                    .and_then(|(_, w)| micros(w.trim_end_matches(')')));
                let dead = t
                    .nth_col("decisions from the store while dead", 0)
                    .and_then(|i| row.get(i))
                    .map(|c| plain(c))
                    .unwrap_or_default();
                Some(Restart {
                    client: text_at(t, row, "client")?,
                    runs: text_at(t, row, "run")?
                        .trim_start_matches("median of ")
                        .to_owned(),
                    dead_p50: dead.strip_prefix("dead p50 ").and_then(micros),
                    back: micros(&back),
                    worst,
                    after_ping: t
                        .col("after the first ping")
                        .and_then(|i| micros(row.get(i)?)),
                })
            })
            .collect();
        if rows.is_empty() {
            return Err(format!("{}: no `median of N` row", doc.name));
        }
        Ok(rows)
    })
}

/// `retry_storm.md`: its table, as printed.
pub(crate) fn retry_storm(r: &mut Results) -> Option<Table> {
    r.with("retry_storm.md", |doc| {
        doc.table(&["algorithm", "calls", "admitted", "with cache", "fewer"])
            .cloned()
    })
}

/// `workers.md`: its lines, as printed.
pub(crate) fn workers(r: &mut Results) -> Option<Vec<String>> {
    r.with("workers.md", |doc| {
        let lines: Vec<String> = doc
            .text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect();
        if !lines.iter().any(|l| l.starts_with("achieved")) {
            return Err(format!("{}: no `achieved ... per second` line", doc.name));
        }
        Ok(lines)
    })
}

/// `server.md` (ratelimit-server's `loadgen`): the medians table, and the
/// ratio lines printed under it (`- ...`).
#[derive(Debug)]
pub(crate) struct Server {
    /// The medians over the rounds, as printed.
    pub(crate) table: Table,
    /// The lines comparing the server CPU per request, ours over a peer's.
    pub(crate) against_peers: Vec<String>,
    /// The lines comparing three descriptors per request with one.
    pub(crate) three_over_one: Vec<String>,
    /// The machine's stalls measured before the loads (`- ...` lines; none
    /// when the generator ran unpinned).
    pub(crate) stalls: Vec<String>,
}

/// Reads `server.md`.
pub(crate) fn server(r: &mut Results) -> Option<Server> {
    r.with("server.md", |doc| {
        let table = doc
            .table(&["target", "load", "descriptors", "requests/s", "server cpu"])?
            .clone();
        let after = |heading: &str| -> Vec<String> {
            doc.text
                .lines()
                .skip_while(|l| !l.starts_with(heading))
                .skip(1)
                .skip_while(|l| l.trim().is_empty())
                .take_while(|l| l.starts_with("- "))
                .map(str::to_owned)
                .collect()
        };
        let against_peers = after("Server CPU per request, ours over");
        let three_over_one = after("Three descriptors per request over one");
        let stalls = after("The machine's stalls");
        if three_over_one.is_empty() {
            return Err(format!(
                "{}: no `Three descriptors per request over one` lines",
                doc.name
            ));
        }
        Ok(Server {
            table,
            against_peers,
            three_over_one,
            stalls,
        })
    })
}

/// Column `col` of the first medians row whose target starts with
/// `target`.
pub(crate) fn server_value(s: &Server, target: &str, col: &str) -> Option<f64> {
    let t = &s.table;
    t.rows
        .iter()
        .find(|row| row.first().is_some_and(|c| plain(c).starts_with(target)))
        .and_then(|row| num_at(t, row, col))
}

/// The server CPU per request of `target` under `load` (its label's start)
/// with one descriptor per request, from the medians table.
pub(crate) fn server_cpu(s: &Server, target: &str, load: &str) -> Option<f64> {
    let t = &s.table;
    let (load_col, n_col) = (t.col("load")?, t.col("descriptors")?);
    t.rows
        .iter()
        .find(|row| {
            row.first().is_some_and(|c| plain(c) == target)
                && row
                    .get(load_col)
                    .is_some_and(|c| plain(c).starts_with(load))
                && row.get(n_col).is_some_and(|c| plain(c) == "1")
        })
        .and_then(|row| num_at(t, row, "server cpu"))
}
