//! The page: the headline ratios, then one section per measured area, each
//! with the command that measured it, its table and its line to meet.

use crate::markdown::{Table, duration, int, median, or_dash, plain, ratio, spread};
use crate::results::{self, Results};
use crate::writer::Page;

/// Which way a ratio is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Better {
    /// A time or a cost: below 1, ours is cheaper.
    Lower,
    /// A rate: above 1, ours is faster.
    Higher,
}

/// One headline: ours against a peer, and where the picture draws it.
#[derive(Debug, Clone)]
pub(crate) struct Headline {
    /// The peer.
    pub(crate) against: &'static str,
    /// What is compared.
    pub(crate) what: &'static str,
    /// Ours, as shown.
    pub(crate) ours: String,
    /// Theirs, as shown.
    pub(crate) theirs: String,
    /// Ours over theirs.
    pub(crate) ratio: Option<f64>,
    /// Which way is better.
    pub(crate) better: Better,
    /// The bar's label in the picture.
    pub(crate) bar: &'static str,
}

/// Every figure the page shows, read from the results.
#[derive(Debug)]
pub(crate) struct Figures {
    machine: Option<results::Machine>,
    local_wall: Option<results::LocalWall>,
    instructions: Option<results::Instructions>,
    local_memory: Option<results::LocalMemory>,
    multi_quota: Option<Vec<(u32, f64)>>,
    sweep: Option<(Vec<results::SweepRow>, Vec<String>)>,
    model_step: Option<Vec<(String, f64)>>,
    peers: Option<results::Peers>,
    peers_pinned: Option<results::Peers>,
    script_instructions: Option<Vec<(String, f64)>>,
    script_cost: Option<Vec<(String, f64)>>,
    multi_cost: Option<results::MultiCost>,
    redis_memory: Option<Vec<(String, f64)>>,
    client_side: Option<(u64, Vec<results::ClientRatio>)>,
    client_side_concurrent: Option<(u64, Vec<results::ClientRatio>)>,
    under_faults: Option<results::UnderFaults>,
    dead_redis: Option<Vec<results::Restart>>,
    retry_storm: Option<Table>,
    workers: Option<Vec<String>>,
    server: Option<results::Server>,
    overload: Option<crate::load::Overload>,
    overload_busy: Option<crate::load::Overload>,
    overload_pinned: Option<crate::load::Overload>,
    bursts: Option<crate::load::Bursts>,
    tls_cost: Option<Table>,
}

impl Figures {
    /// Reads every result file `benches/run.sh` writes.
    pub(crate) fn read(r: &mut Results) -> Self {
        Self {
            machine: results::machine(r),
            local_wall: results::local_wall(r),
            instructions: results::instructions(r),
            local_memory: results::local_memory(r),
            multi_quota: results::multi_quota(r),
            sweep: results::sweep(r),
            model_step: results::model_step(r),
            peers: results::peers(r, "peers.md"),
            peers_pinned: results::peers(r, "peers_pinned.md"),
            script_instructions: results::script_instructions(r),
            script_cost: results::script_cost(r),
            multi_cost: results::multi_cost(r),
            redis_memory: results::redis_memory(r),
            client_side: results::client_side(r, "client_side.md"),
            client_side_concurrent: results::client_side(r, "client_side_concurrent.md"),
            under_faults: results::under_faults(r, "under_faults.md"),
            dead_redis: results::dead_redis(r),
            retry_storm: results::retry_storm(r),
            workers: results::workers(r),
            server: results::server(r),
            overload: crate::load::overload(r, "overload.md"),
            overload_busy: crate::load::overload(r, "overload_busy.md"),
            overload_pinned: crate::load::overload(r, "overload_pinned.md"),
            bursts: crate::load::bursts(r),
            tls_cost: crate::load::tls_cost(r),
        }
    }

    /// The headline ratios: ours against each peer.
    pub(crate) fn headlines(&self) -> Vec<Headline> {
        let mut out = Vec::new();
        let none = || "–".to_owned();
        // In process, against governor and throttlecrab.
        let hot = self
            .local_wall
            .as_ref()
            .and_then(|w| w.get("hot_key", "100_per_min", "1"));
        let ns_of = |k: usize| hot.and_then(|s| median(&s.ns[k]));
        let ns = |x: f64| format!("{x:.1} ns");
        out.push(Headline {
            against: "governor 0.10",
            what: "`Limiter::check` on a hot key, one thread, 100/min burst 20: time per decision",
            ours: or_dash(ns_of(2), ns),
            theirs: or_dash(ns_of(3), ns),
            ratio: hot.and_then(|s| median(&s.ratios[2])),
            better: Better::Lower,
            bar: "governor: Limiter::check (hot key)",
        });
        out.push(Headline {
            against: "governor 0.10",
            what: "the fastest path (`decide_now`), the same: time per decision",
            ours: or_dash(ns_of(0), ns),
            theirs: or_dash(ns_of(3), ns),
            ratio: hot.and_then(|s| median(&s.ratios[0])),
            better: Better::Lower,
            bar: "governor: fastest path (hot key)",
        });
        let crab = hot.and_then(|s| {
            let per_run: Vec<f64> = s.ratios[2]
                .iter()
                .zip(&s.ratios[3])
                .map(|(l, t)| l / t)
                .collect();
            median(&per_run)
        });
        out.push(Headline {
            against: "throttlecrab 0.4",
            what: "`Limiter::check` against its limiter behind a mutex, the same: time per decision",
            ours: or_dash(ns_of(2), ns),
            theirs: or_dash(ns_of(4), ns),
            ratio: crab,
            better: Better::Lower,
            bar: "throttlecrab: Limiter::check (hot key)",
        });
        // On one Redis, against the naive script, redis-cell, Limitador.
        let peers = self.peers.as_ref();
        let ours = peers.and_then(|p| p.at_most("ours (batched)"));
        let callers = ours.map_or(0, |o| o.callers);
        let rate = |x: Option<f64>| or_dash(x, |v| format!("{}/s", int(v)));
        let cpu = |x: Option<f64>| or_dash(x, |v| format!("{v:.2} µs"));
        let vs = |name: &str| peers.and_then(|p| p.at_most(name));
        let over = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
        let naive = vs("naive script");
        out.push(Headline {
            against: "the naive Lua script",
            what: rate_what(callers, "decisions per second"),
            ours: rate(ours.and_then(|o| o.per_second)),
            theirs: rate(naive.and_then(|o| o.per_second)),
            ratio: ours.and_then(|o| o.per_second_x),
            better: Better::Higher,
            bar: "naive Lua script",
        });
        out.push(Headline {
            against: "the naive Lua script",
            what: rate_what(callers, "the server's CPU per decision"),
            ours: cpu(ours.and_then(|o| o.server_us)),
            theirs: cpu(naive.and_then(|o| o.server_us)),
            ratio: ours.and_then(|o| o.server_us_x),
            better: Better::Lower,
            bar: "naive Lua script: server CPU",
        });
        let cell = vs("redis-cell");
        out.push(Headline {
            against: "redis-cell 0.2.2 (`CL.THROTTLE`)",
            what: rate_what(callers, "decisions per second"),
            ours: rate(ours.and_then(|o| o.per_second)),
            theirs: rate(cell.and_then(|o| o.per_second)),
            ratio: over(
                ours.and_then(|o| o.per_second),
                cell.and_then(|o| o.per_second),
            ),
            better: Better::Higher,
            bar: "redis-cell",
        });
        out.push(Headline {
            against: "redis-cell 0.2.2 (`CL.THROTTLE`)",
            what: rate_what(callers, "the server's CPU per decision"),
            ours: cpu(ours.and_then(|o| o.server_us)),
            theirs: cpu(cell.and_then(|o| o.server_us)),
            ratio: over(
                ours.and_then(|o| o.server_us),
                cell.and_then(|o| o.server_us),
            ),
            better: Better::Lower,
            bar: "redis-cell: server CPU",
        });
        for (name, label, bar) in [
            (
                "Limitador (Redis)",
                "Limitador 0.14, Redis storage",
                "Limitador (Redis)",
            ),
            (
                "Limitador (cached)",
                "Limitador 0.14, cached storage (approximate)",
                "Limitador (cached)",
            ),
        ] {
            let l = vs(name);
            out.push(Headline {
                against: label,
                what: rate_what(callers, "decisions per second"),
                ours: rate(ours.and_then(|o| o.per_second)),
                theirs: rate(l.and_then(|o| o.per_second)),
                ratio: over(
                    ours.and_then(|o| o.per_second),
                    l.and_then(|o| o.per_second),
                ),
                better: Better::Higher,
                bar,
            });
        }
        // The bare call of the same script: one caller.
        for (client, bar) in [
            ("redis-rs", "bare EVALSHA, one caller (redis-rs)"),
            ("fred", "bare EVALSHA, one caller (fred)"),
        ] {
            let m = self.client_side.as_ref().and_then(|(_, c)| {
                c.iter()
                    .find(|c| c.what == "RedisStore::decide" && c.client == client)
                    .and_then(|c| median(&c.runs))
            });
            out.push(Headline {
                against: if client == "fred" {
                    "the bare `EVALSHA` (fred)"
                } else {
                    "the bare `EVALSHA` (redis-rs)"
                },
                what: "one caller: `RedisStore`'s decisions per second over the bare call of the same script",
                ours: none(),
                theirs: none(),
                ratio: m,
                better: Better::Higher,
                bar,
            });
        }
        // The service against throttlecrab-server and Limitador.
        let cpu = |target: &str| {
            self.server
                .as_ref()
                .and_then(|s| results::server_cpu(s, target, "closed, 16 in flight"))
        };
        let (local, crab) = (
            cpu("ratelimit-server, local store"),
            cpu("throttlecrab-server (in process)"),
        );
        out.push(Headline {
            against: "throttlecrab-server 0.4",
            what: "the server's CPU per request over gRPC, 16 in flight (ours on the local store)",
            ours: or_dash(local, |v| format!("{v:.1} µs")),
            theirs: or_dash(crab, |v| format!("{v:.1} µs")),
            ratio: over(local, crab),
            better: Better::Lower,
            bar: "throttlecrab-server: server CPU",
        });
        let (redis, limitador) = (cpu("ratelimit-server, Redis"), cpu("Limitador, Redis"));
        out.push(Headline {
            against: "Limitador (server)",
            what: "the server's CPU per request over gRPC, 16 in flight, both on one Redis",
            ours: or_dash(redis, |v| format!("{v:.1} µs")),
            theirs: or_dash(limitador, |v| format!("{v:.1} µs")),
            ratio: over(redis, limitador),
            better: Better::Lower,
            bar: "Limitador: server CPU (Redis)",
        });
        out
    }

    /// The page's markdown; `picture` is the picture's path from the page.
    pub(crate) fn page(&self, picture: &str) -> String {
        let mut p = Page::default();
        self.intro(&mut p, picture);
        self.machine(&mut p);
        reproduce(&mut p);
        self.in_process(&mut p);
        self.redis(&mut p);
        self.under_faults(&mut p);
        crate::load::overload_section(
            &mut p,
            self.overload.as_ref(),
            self.overload_pinned.as_ref(),
            self.overload_busy.as_ref(),
            self.bursts.as_ref(),
        );
        self.controls(&mut p);
        self.service(&mut p);
        crate::load::tls_section(&mut p, self.tls_cost.as_ref());
        p.finish()
    }

    fn intro(&self, p: &mut Page, picture: &str) {
        p.para("# Benchmarks");
        p.para(
            "What the limiter costs, measured beside the alternatives in the same run: \
             the current figures only, for each area against each peer and, where there \
             is one, against the physical limit. The machine and the method are stated \
             once ([Machine and method](#machine-and-method)), and the whole page and its \
             picture are written by one command from the benchmarks' own output \
             ([Reproduce](#reproduce)). Earlier figures, and how each was reached, are in \
             the repository's history.",
        );
        p.para(&format!(
            "![Ours against each peer: time or CPU per decision on the left (below 1, ours \
             is cheaper), decisions per second on the right (above 1, ours is faster)]({picture})"
        ));
        p.h2("At a glance");
        p.para(
            "Ours over theirs, measured side by side (the sections below give each \
             table and its command):",
        );
        let rows: Vec<Vec<String>> = self
            .headlines()
            .into_iter()
            .map(|h| {
                vec![
                    h.against.to_owned(),
                    h.what.to_owned(),
                    h.ours,
                    h.theirs,
                    or_dash(h.ratio, |r| format!("**{}**", ratio(r))),
                    match h.better {
                        Better::Lower => "lower".to_owned(),
                        Better::Higher => "higher".to_owned(),
                    },
                ]
            })
            .collect();
        p.table(
            &[
                "against",
                "what is compared",
                "ours",
                "theirs",
                "ours ÷ theirs",
                "better",
            ],
            "llrrrl",
            &rows,
        );
        p.para("And against the limits that bound them:");
        let mut limits = Vec::new();
        // 4,096 closed-loop callers against 256, redis-rs, the quiet host:
        // the server sharing the load's CPUs, then on one of its own.
        // A figure of redis-rs' row for `callers` in a run's closed loop.
        let closed = |run: Option<&crate::load::Overload>, callers: &str, col: &str| {
            let t = &run?.closed;
            let (client, count, value) = (t.col("client")?, t.col("callers")?, t.col(col)?);
            t.rows
                .iter()
                .find(|r| {
                    r.get(client).is_some_and(|c| c == "redis-rs")
                        && r.get(count).is_some_and(|c| c == callers)
                })
                .and_then(|r| crate::markdown::number(r.get(value)?))
        };
        for (run, setting) in [
            (
                self.overload.as_ref(),
                "quiet host, server and load on both CPUs",
            ),
            (
                self.overload_pinned.as_ref(),
                "quiet host, the server on a CPU of its own",
            ),
        ] {
            let rate = "store decisions/s";
            let (many, few) = (closed(run, "4096", rate), closed(run, "256", rate));
            // The ratio as the run's table gives it: the median of the
            // runs' ratios (the method's), not the ratio of the medians.
            let over = closed(run, "4096", "over the first count's rate")
                .or_else(|| many.zip(few).map(|(a, b)| a / b));
            limits.push(vec![
                format!("4,096 callers against 256, closed loop, {setting} (target: 0.9)"),
                "the store's decisions per second on one Redis (redis-rs)".to_owned(),
                or_dash(many, |v| format!("{}/s", int(v))),
                or_dash(few, |v| format!("{}/s", int(v))),
                or_dash(over, ratio),
            ]);
        }
        let alone = self
            .peers
            .as_ref()
            .and_then(|p| p.at_most("load generator alone"));
        let ours = self
            .peers
            .as_ref()
            .and_then(|p| p.at_most("ours (batched)"));
        limits.push(vec![
            "the load generator alone (the harness's own ceiling)".to_owned(),
            rate_what(ours.map_or(0, |o| o.callers), "decisions per second").to_owned(),
            or_dash(ours.and_then(|o| o.per_second), |v| format!("{}/s", int(v))),
            or_dash(alone.and_then(|o| o.per_second), |v| {
                format!("{}/s", int(v))
            }),
            or_dash(
                ours.and_then(|o| Some(o.per_second? / alone?.per_second?)),
                ratio,
            ),
        ]);
        let (svc, lib) = self.server.as_ref().map_or((None, None), |s| {
            (
                results::server_value(s, "service in process", "requests/s"),
                results::server_value(s, "library", "requests/s"),
            )
        });
        limits.push(vec![
            "the library call the service makes (`Limiter::check`, in process)".to_owned(),
            "requests per second, the service in process".to_owned(),
            or_dash(svc, |v| format!("{}/s", int(v))),
            or_dash(lib, |v| format!("{}/s", int(v))),
            or_dash(svc.zip(lib).map(|(a, b)| a / b), ratio),
        ]);
        p.table(
            &[
                "limit",
                "what is compared",
                "ours",
                "the limit",
                "ours ÷ limit",
            ],
            "llrrr",
            &limits,
        );
    }

    fn machine(&self, p: &mut Page) {
        p.h2("Machine and method");
        match &self.machine {
            Some(m) => {
                let get = |k: &str| m.get(k).unwrap_or("–").to_owned();
                let load = match (m.get("load at the start"), m.get("load at the end")) {
                    (Some(a), Some(b)) => format!("{a} at the start, {b} at the end"),
                    (Some(a), None) => format!("{a} at the start"),
                    _ => "–".to_owned(),
                };
                // Tables kept from a run on another host (`elsewhere`: which;
                // `elsewhere cpu`: its CPU) are named apart.
                let elsewhere = m.get("elsewhere");
                let mut rows = vec![vec![
                    if elsewhere.is_some() {
                        "every other table"
                    } else {
                        "every table"
                    }
                    .to_owned(),
                    get("cpu"),
                    get("memory"),
                    get("software"),
                    load,
                ]];
                if let Some(tables) = elsewhere {
                    rows.push(vec![
                        tables.to_owned(),
                        get("elsewhere cpu"),
                        "–".to_owned(),
                        get("software"),
                        "–".to_owned(),
                    ]);
                }
                p.table(
                    &["", "CPU", "memory", "software", "load average"],
                    "lllll",
                    &rows,
                );
            }
            None => p.missing("machine.md"),
        }
        p.para(METHOD);
    }

    fn in_process(&self, p: &mut Page) {
        p.h2("In process: the local store against governor and throttlecrab");
        p.para(IN_PROCESS);
        p.h3("Wall time, side by side");
        match &self.local_wall {
            Some(w) => {
                p.para(&format!(
                    "Time per decision over governor's in the same slices (below 1: faster \
                     than governor); the median of {} run(s), the range in brackets. The \
                     lines: the fastest path 1.0x (1.3x at 1,000,000 keys), the others 1.3x.",
                    w.runs
                ));
                let rows: Vec<Vec<String>> = w
                    .scenarios
                    .iter()
                    .map(|s| {
                        let mut row = vec![
                            keys_label(&s.keys),
                            quota_label(&s.quota),
                            s.threads.clone(),
                        ];
                        row.extend(s.ratios.iter().map(|v| spread(v, ratio)));
                        row
                    })
                    .collect();
                p.table(
                    &[
                        "keys",
                        "quota",
                        "threads",
                        "fastest path",
                        "`dyn Store`",
                        "`Limiter::check`",
                        "throttlecrab",
                    ],
                    "llrrrrr",
                    &rows,
                );
                let gov: Vec<f64> = w
                    .scenarios
                    .iter()
                    .filter(|s| s.keys == "hot_key")
                    .flat_map(|s| s.ns[3].iter().copied())
                    .collect();
                if !gov.is_empty() {
                    let lo = gov.iter().copied().fold(f64::INFINITY, f64::min);
                    let hi = gov.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let took = if format!("{lo:.1}") == format!("{hi:.1}") {
                        format!("{lo:.1}")
                    } else {
                        format!("{lo:.1}-{hi:.1}")
                    };
                    p.para(&format!(
                        "Governor took {took} ns a decision on the hot key in these runs."
                    ));
                }
            }
            None => p.missing("local-interleaved-run*.md"),
        }
        p.h3("Instructions per decision");
        p.para(
            "`benches/instructions.sh`: callgrind over `benches/examples/local_profile.rs` on \
             one hot key, the counts of runs of 200,000 and 1,200,000 decisions differenced; \
             deterministic where wall time is not.",
        );
        match &self.instructions {
            Some(i) => {
                let gov = i.local.iter().find(|(n, _, _)| n.contains("governor"));
                let rows: Vec<Vec<String>> = i
                    .local
                    .iter()
                    .map(|(name, plan, admit)| {
                        let per = |v: Option<f64>, g: Option<f64>| Some(v? / g?);
                        vec![
                            name.clone(),
                            or_dash(*plan, int),
                            or_dash(per(*plan, gov.and_then(|g| g.1)), ratio),
                            or_dash(*admit, int),
                            or_dash(per(*admit, gov.and_then(|g| g.2)), ratio),
                        ]
                    })
                    .collect();
                p.table(
                    &[
                        "contender",
                        "hot key, 100/min burst 20",
                        "÷ governor",
                        "hot key, 1e9/s burst 1000",
                        "÷ governor",
                    ],
                    "lrrrr",
                    &rows,
                );
            }
            None => p.missing("instructions.md"),
        }
        p.h3("Memory per caller");
        p.para(
            "`benches/benches/local_memory.rs`: a counting allocator around 1,000,000 callers \
             (deterministic); live heap bytes per active caller, and what is left above an \
             empty store once every caller has gone idle and been swept.",
        );
        match &self.local_memory {
            Some(m) => {
                let rows: Vec<Vec<String>> = m
                    .rows
                    .iter()
                    .map(|(name, per, after)| {
                        vec![
                            name.replace("ours: LocalStore, ", "ours, "),
                            or_dash(*per, |v| format!("{v:.1}")),
                            or_dash(*after, int),
                        ]
                    })
                    .collect();
                p.table(
                    &["store", "bytes per active caller", "after idle eviction"],
                    "lrr",
                    &rows,
                );
            }
            None => p.missing("local_memory.md"),
        }
        p.h3("Several quotas per call");
        p.para(
            "`benches/benches/multi_quota.rs`: `Limiter::check_all` on the local store over \
             1,000 callers, every call admitted, so every quota is read, decided and written \
             (criterion). The line: 3 quotas at most 2.5x one.",
        );
        match &self.multi_quota {
            Some(m) => {
                let one = m.iter().find(|(n, _)| *n == 1).map(|(_, t)| *t);
                let rows: Vec<Vec<String>> = m
                    .iter()
                    .map(|(n, ns)| {
                        vec![
                            n.to_string(),
                            format!("{ns:.0}"),
                            or_dash(one.map(|o| ns / o), |r| format!("{}x", ratio(r))),
                        ]
                    })
                    .collect();
                p.table(
                    &["quotas per call", "ns per decision", "÷ 1 quota"],
                    "rrr",
                    &rows,
                );
            }
            None => p.missing("multi_quota.txt"),
        }
        p.h3("The local store's sweep");
        p.para(SWEEP);
        match &self.sweep {
            Some((rows, goals)) => {
                let d = |v: Option<f64>| or_dash(v, duration);
                let table: Vec<Vec<String>> = rows
                    .iter()
                    .map(|r| {
                        vec![
                            r.callers.clone(),
                            r.way.clone(),
                            d(r.p99),
                            d(r.p999),
                            d(r.max),
                            or_dash(r.over_1ms, int),
                            or_dash(r.left, int),
                        ]
                    })
                    .collect();
                p.table(
                    &[
                        "callers",
                        "way",
                        "p99",
                        "p99.9",
                        "max",
                        "decisions ≥ 1 ms",
                        "callers left",
                    ],
                    "llrrrrr",
                    &table,
                );
                if !goals.is_empty() {
                    p.para(&format!("The goal, callers {}.", goals.join("; callers ")));
                }
            }
            None => p.missing("sweep_latency.md"),
        }
        p.h3("The core model's step");
        let intro = "`benches/benches/local.rs`, `model_step` (criterion, the medians of the \
                     runs): `ratelimit_core::model::decide` for one caller calling every 375 ms \
                     against 100 per minute, its state carried from call to call";
        match &self.model_step {
            Some(m) => {
                let steps: Vec<String> = m
                    .iter()
                    .map(|(a, ns)| format!("{} {ns:.0} ns", algorithm_label(a)))
                    .collect();
                p.para(&format!("{intro}: {}.", steps.join(", ")));
            }
            None => {
                p.para(&format!("{intro}."));
                p.missing("local.md");
            }
        }
    }

    fn redis(&self, p: &mut Page) {
        p.h2("Redis: batched calls, one Lua source, and the peers");
        p.para(REDIS);
        p.h3("Peers on one redis-server");
        p.para(PEERS);
        match &self.peers {
            Some(peers) => {
                if !peers.title.is_empty() {
                    p.para(&format!("This run: {}.", peers.title.trim_end_matches('.')));
                }
                let f = |v: Option<f64>, digits: usize| or_dash(v, |x| format!("{x:.digits$}"));
                let rows: Vec<Vec<String>> = peers
                    .rows
                    .iter()
                    .map(|r| {
                        vec![
                            r.callers.to_string(),
                            r.contender.clone(),
                            or_dash(r.per_second, int),
                            f(r.per_second_x, 2),
                            f(r.server_us, 2),
                            f(r.server_us_x, 2),
                            f(r.per_call, 1),
                            f(r.p50, 1),
                            f(r.p99, 1),
                        ]
                    })
                    .collect();
                p.table(
                    &[
                        "callers",
                        "contender",
                        "decisions/s",
                        "× naive",
                        "server µs/decision",
                        "× naive",
                        "decisions per call",
                        "p50 µs",
                        "p99 µs",
                    ],
                    "rlrrrrrrr",
                    &rows,
                );
                p.para(
                    "Within its limit under concurrency (two instances, 256 callers, one key \
                     allowed 1,000 with almost no refill, 10,000 attempts), and bytes per caller \
                     (`used_memory` over 10,000 callers):",
                );
                let rows: Vec<Vec<String>> = peers
                    .limits
                    .iter()
                    .map(|l| {
                        vec![
                            l.contender.clone(),
                            l.admitted.clone(),
                            l.within.clone(),
                            or_dash(l.bytes, int),
                        ]
                    })
                    .collect();
                p.table(
                    &[
                        "contender",
                        "admitted of 10,000 (limit 1,000)",
                        "within its limit?",
                        "bytes per caller",
                    ],
                    "lrlr",
                    &rows,
                );
            }
            None => p.missing("peers.md"),
        }
        match self.peers_pinned.as_ref() {
            Some(pinned) => {
                let ours = pinned.at_most("ours (batched)");
                let cell = pinned.at_most("redis-cell");
                p.para(&format!(
                    "With the server pinned to one CPU and the load generator to the other \
                     (`--pin`), at {} callers: ours (batched) {} decisions/s, {}x the naive \
                     script's and {}x redis-cell's; the server's CPU per decision {}x the naive \
                     script's.",
                    ours.map_or(0, |o| o.callers),
                    or_dash(ours.and_then(|o| o.per_second), int),
                    or_dash(ours.and_then(|o| o.per_second_x), ratio),
                    or_dash(
                        ours.and_then(|o| Some(o.per_second? / cell?.per_second?)),
                        ratio
                    ),
                    or_dash(ours.and_then(|o| o.server_us_x), ratio),
                ));
            }
            None => p.para(
                "With the server pinned to one CPU and the load generator to the other \
                 (`--pin`): not measured in this run (`target/bench-results/peers_pinned.md` \
                 is missing).",
            ),
        }
        p.h3("The server's work per call");
        p.para(SCRIPT_INSTRUCTIONS);
        match &self.script_instructions {
            Some(rows) => {
                let find = |s: &str| rows.iter().find(|(n, _)| n.starts_with(s)).map(|r| r.1);
                let naive_admit = find("naive hash-of-floats token bucket, admitting");
                let naive_deny = find("naive hash-of-floats token bucket, denying");
                let table: Vec<Vec<String>> = rows
                    .iter()
                    .filter(|(n, _)| !is_multi_quota_row(n))
                    .map(|(n, v)| {
                        let base = if !(n.starts_with("ours token bucket")
                            || n.starts_with("prototype")
                            || n.starts_with("batch script"))
                        {
                            None
                        } else if n.contains("denying") {
                            naive_deny
                        } else {
                            naive_admit
                        };
                        vec![n.clone(), int(*v), or_dash(base.map(|b| v / b), ratio)]
                    })
                    .collect();
                p.table(
                    &["call", "server instructions per call", "÷ naive script"],
                    "lrr",
                    &table,
                );
                let log = |size: &str, what: &str| {
                    rows.iter()
                        .find(|(n, _)| {
                            n.starts_with("ours sliding log")
                                && n.contains(size)
                                && n.contains(what)
                        })
                        .map(|r| r.1)
                };
                let deny = log("100,000 entries", "denying").zip(log("10 entries", "denying"));
                let admit = log("100,000", "admitting").zip(log("10 entries", "admitting"));
                if deny.is_some() || admit.is_some() {
                    p.para(&format!(
                        "A sliding log of 100,000 entries costs the server {}x the instructions of \
                         one of 10 when it denies and {}x when it admits.",
                        or_dash(deny.map(|(a, b)| a / b), ratio),
                        or_dash(admit.map(|(a, b)| a / b), ratio),
                    ));
                }
            }
            None => p.missing("script_instructions.md"),
        }
        p.para(
            "The server's time per call through the store's own calls (`script_cost`: \
             `INFO commandstats`, every row checking that its calls were admitted or denied \
             as labelled; the median of the per-round ratios):",
        );
        match &self.script_cost {
            Some(rows) => {
                let table: Vec<Vec<String>> = rows
                    .iter()
                    .map(|(n, v)| {
                        vec![
                            n.clone(),
                            if n.starts_with("decisions per") {
                                format!("{v:.1}")
                            } else {
                                ratio(*v)
                            },
                        ]
                    })
                    .collect();
                p.table(&["ratio", "median"], "lr", &table);
            }
            None => p.missing("script_cost.md"),
        }
        p.h3("Several quotas in one call");
        p.para(
            "`benches/multi_cost.sh` (the server's µs per call, `INFO commandstats` over \
             `redis-benchmark -c 1`, medians of the rounds) and the instruction counts of \
             `benches/script_instructions.sh`; every call admitted. The line: a 3-quota call \
             at most 2x a 1-quota call.",
        );
        let instr = |s: &str| {
            self.script_instructions
                .as_ref()
                .and_then(|rows| rows.iter().find(|(n, _)| n.starts_with(s)).map(|r| r.1))
        };
        let three_singles = [
            "single token bucket script",
            "single fixed window script",
            "single sliding window script",
        ]
        .iter()
        .map(|s| instr(s))
        .sum::<Option<f64>>();
        match &self.multi_cost {
            Some(m) => {
                let us = |v: f64| format!("{v:.2}");
                let rows = vec![
                    vec![
                        "1 quota: the token bucket's single script".to_owned(),
                        us(m.single),
                        or_dash(instr("single token bucket script"), int),
                    ],
                    vec![
                        "1 quota through the batch script".to_owned(),
                        us(m.batch_one),
                        or_dash(instr("batch script, the token bucket alone"), int),
                    ],
                    vec![
                        "3 quotas in one call (fixed window, sliding window counter, token bucket)"
                            .to_owned(),
                        us(m.batch_three),
                        or_dash(instr("batch script, 3 quotas"), int),
                    ],
                    vec![
                        "the same 3 quotas as 3 single calls".to_owned(),
                        us(m.three_singles),
                        or_dash(three_singles, int),
                    ],
                ];
                p.table(
                    &["call", "server µs per call", "server instructions per call"],
                    "lrr",
                    &rows,
                );
                p.para(&format!(
                    "A 3-quota call costs the server {}x a 1-quota call and {}x the same quotas \
                     as three single calls (in one round trip instead of three).",
                    ratio(m.batch_three / m.single),
                    ratio(m.batch_three / m.three_singles)
                ));
            }
            None => p.missing("multi_cost.md"),
        }
        p.h3("Bytes per caller");
        let intro = "`redis_load` (its memory section): `used_memory` over 100,000 callers, one \
                     decision each, a fresh `redis-server` per layout, quotas of 100 per hour so \
                     that no key expires while counted. The line: 0.75x the naive script's, same \
                     key";
        match &self.redis_memory {
            Some(rows) => {
                let naive = rows
                    .iter()
                    .find(|(n, _)| n.starts_with("naive hash-of-floats token bucket, same key"))
                    .map(|r| r.1);
                let each: Vec<String> = rows
                    .iter()
                    .map(|(n, v)| {
                        format!(
                            "{n}: {v:.1} bytes ({} the naive script's)",
                            or_dash(naive.map(|b| v / b), ratio)
                        )
                    })
                    .collect();
                p.para(&format!("{intro}. {}.", each.join("; ")));
            }
            None => {
                p.para(&format!("{intro}."));
                p.missing("redis_memory.md");
            }
        }
        p.h3("A Redis decision's client side");
        p.para(CLIENT_SIDE);
        let mut rows = Vec::new();
        for c in [&self.client_side, &self.client_side_concurrent]
            .into_iter()
            .flatten()
        {
            let (tasks, ratios) = c;
            for r in ratios {
                rows.push(vec![
                    tasks.to_string(),
                    r.client.clone(),
                    format!("`{}`", r.what),
                    r.runs
                        .iter()
                        .map(|v| format!("{v:.3}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    or_dash(median(&r.runs), |v| format!("**{v:.3}**")),
                ]);
            }
        }
        if rows.is_empty() {
            p.missing("client_side.md");
        } else {
            p.table(
                &["callers", "client", "contender", "per run", "median"],
                "rllll",
                &rows,
            );
        }
        p.para(
            "The client's instructions per decision (`benches/instructions.sh`: callgrind over \
             `benches/examples/redis_profile.rs`, sequential calls on one connection, runs of \
             2,000 and 6,000 differenced; the client process only):",
        );
        match &self.instructions {
            Some(i) => {
                let rows: Vec<Vec<String>> = i
                    .client
                    .iter()
                    .map(|(c, bare, store, limiter)| {
                        let per = |v: Option<f64>| Some(v? / (*bare)?);
                        vec![
                            c.clone(),
                            or_dash(*bare, int),
                            or_dash(*store, int),
                            or_dash(per(*store), ratio),
                            or_dash(*limiter, int),
                            or_dash(per(*limiter), ratio),
                        ]
                    })
                    .collect();
                p.table(
                    &[
                        "client",
                        "bare `EVALSHA`",
                        "`RedisStore`",
                        "÷ bare",
                        "`Limiter::check`",
                        "÷ bare",
                    ],
                    "lrrrrr",
                    &rows,
                );
            }
            None => p.missing("instructions.md"),
        }
    }

    fn under_faults(&self, p: &mut Page) {
        p.h2("Under load and under faults");
        p.para(UNDER_FAULTS);
        p.h3("Two example servers sharing one Redis under `wrk`");
        p.para(SERVERS);
        match self.under_faults.as_ref().map(|u| &u.servers) {
            Some(s) if !s.is_empty() => {
                let pct = |v: Option<f64>| or_dash(v, |x| format!("{x:.3} %"));
                let rows: Vec<Vec<String>> = s
                    .iter()
                    .map(|s| {
                        vec![
                            s.servers.to_string(),
                            or_dash(s.per_second, int),
                            pct(s.store),
                            pct(s.store_or_fallback),
                            or_dash(s.fail_open, int),
                        ]
                    })
                    .collect();
                p.table(
                    &[
                        "servers",
                        "requests/s",
                        "by the store",
                        "store or fallback",
                        "fail-open (uncounted)",
                    ],
                    "rrrrr",
                    &rows,
                );
            }
            _ => p.missing("under_faults.md"),
        }
        p.h3("Redis Cluster: a master SIGKILLed under load");
        p.para(CLUSTER);
        match self.under_faults.as_ref().map(|u| &u.cluster) {
            Some(c) if !c.is_empty() => {
                let rows: Vec<Vec<String>> = c
                    .iter()
                    .map(|c| {
                        vec![
                            c.client.clone(),
                            c.coverage.clone(),
                            or_dash(c.failover, duration),
                            or_dash(c.store, |v| format!("**{v:.3} %**")),
                            c.store_runs
                                .iter()
                                .map(|v| format!("{v:.3}"))
                                .collect::<Vec<_>>()
                                .join(", "),
                            or_dash(c.opened, int),
                            or_dash(c.back, |v| format!("{:.0} ms", v / 1e3)),
                        ]
                    })
                    .collect();
                p.table(
                    &[
                        "client",
                        "full coverage",
                        "kill to promotion",
                        "healthy masters' callers by the store",
                        "per run, %",
                        "their breakers opened",
                        "dead master's callers back to the store",
                    ],
                    "llrrlrr",
                    &rows,
                );
            }
            _ => p.missing("under_faults.md"),
        }
        p.h3("Redis restart: back to the store");
        p.para(RESTART);
        match &self.dead_redis {
            Some(rows) => {
                let table: Vec<Vec<String>> = rows
                    .iter()
                    .map(|r| {
                        vec![
                            r.client.clone(),
                            r.runs.clone(),
                            or_dash(r.back, |v| format!("**{}**", duration(v))),
                            or_dash(r.worst, duration),
                            or_dash(r.after_ping, duration),
                            or_dash(r.dead_p50, duration),
                        ]
                    })
                    .collect();
                p.table(
                    &[
                        "client",
                        "runs",
                        "store again after the port accepts (median)",
                        "worst",
                        "after the first `PING` answered",
                        "a check while Redis is dead (p50)",
                    ],
                    "lrrrrr",
                    &table,
                );
            }
            None => p.missing("dead_redis.md"),
        }
    }

    fn controls(&self, p: &mut Page) {
        p.h2("The failure path and the production controls");
        p.para(
            "On a `redis-server` of their own; the deny cache's and `acquire`'s figures are \
             counts, not timings, and do not depend on the machine's load.",
        );
        p.h3("A retry storm, with and without the deny cache");
        p.para(RETRY_STORM);
        match &self.retry_storm {
            Some(t) => {
                let header: Vec<&str> = t.header.iter().map(String::as_str).collect();
                let align: String = (0..t.header.len())
                    .map(|i| if i == 0 { 'l' } else { 'r' })
                    .collect();
                p.table(&header, &align, &t.rows);
            }
            None => p.missing("retry_storm.md"),
        }
        p.h3("Waiting for a shared quota: `Limiter::acquire` across processes");
        p.para(WORKERS);
        match &self.workers {
            Some(lines) => {
                p.line("```text");
                for l in lines {
                    p.line(l);
                }
                p.para("```");
            }
            None => p.missing("workers.md"),
        }
    }

    fn service(&self, p: &mut Page) {
        p.h2("ratelimit-server against throttlecrab-server and Limitador");
        p.para(SERVICE);
        match &self.server {
            Some(s) => {
                let t = &s.table;
                let header: Vec<&str> = t.header.iter().map(String::as_str).collect();
                let align: String = (0..t.header.len())
                    .map(|i| if i < 2 { 'l' } else { 'r' })
                    .collect();
                // The servers' rows with one descriptor (the floor's rows feed
                // the limits table above; three descriptors are the ratios
                // below).
                let n = t.col("descriptors");
                let cell = |r: &[String], c: Option<usize>| {
                    c.and_then(|c| r.get(c))
                        .map(|c| plain(c))
                        .unwrap_or_default()
                };
                let rows: Vec<Vec<String>> = t
                    .rows
                    .iter()
                    .filter(|r| {
                        r.first().is_some_and(|c| {
                            let c = plain(c);
                            !c.starts_with("library") && !c.starts_with("service in process")
                        }) && cell(r, n) == "1"
                    })
                    .cloned()
                    .collect();
                p.table(&header, &align, &rows);
                let joined = |lines: &[String]| {
                    lines
                        .iter()
                        .map(|l| l.trim_start_matches("- ").to_owned())
                        .collect::<Vec<_>>()
                        .join("; ")
                };
                let mut ratios = String::new();
                if !s.against_peers.is_empty() {
                    ratios = format!(
                        "The server's CPU per request, ours over the peer's (below 1: ours costs \
                         less): {}. ",
                        joined(&s.against_peers)
                    );
                }
                p.para(&format!(
                    "{ratios}Three descriptors per request over one, the server's CPU per \
                     request: {}.",
                    joined(&s.three_over_one)
                ));
                if !s.stalls.is_empty() {
                    p.para(&format!(
                        "The machine's own stalls, measured before the loads (a thread spinning \
                         on each CPU for 5 s; a stall is a gap over 0.5 ms in which it did not \
                         run): {}. A latency tail cannot be shorter than the stalls of the CPUs \
                         it runs on.",
                        joined(&s.stalls)
                    ));
                }
            }
            None => p.missing("server.md"),
        }
    }
}

/// `decisions per second, 256 callers on one Redis`.
fn rate_what(callers: u64, what: &str) -> &'static str {
    // The page's few phrasings, as static text for the headline table.
    match (what, callers) {
        ("decisions per second", 256) => "decisions per second, 256 callers on one Redis",
        ("the server's CPU per decision", 256) => "the server's CPU per decision, 256 callers",
        ("decisions per second", _) => {
            "decisions per second, the most callers measured, on one Redis"
        }
        _ => "the server's CPU per decision, the most callers measured",
    }
}

/// Whether a row of `script_instructions` belongs to the several-quotas table.
fn is_multi_quota_row(name: &str) -> bool {
    name.starts_with("single ")
        || name.starts_with("batch script, the token bucket alone")
        || name.starts_with("batch script, 3 quotas")
}

/// `sliding window counter` for `sliding_window`, and the like.
fn algorithm_label(name: &str) -> String {
    match name {
        "sliding_window" => "sliding window counter".to_owned(),
        other => other.replace('_', " "),
    }
}

/// `hot key`, `10,000`, `1,000,000` for the bench's key sets.
fn keys_label(keys: &str) -> String {
    match keys {
        "hot_key" => "hot key".to_owned(),
        "10k_keys" => "10,000".to_owned(),
        "1m_keys" => "1,000,000".to_owned(),
        other => plain(other),
    }
}

/// `100/min, burst 20` for the bench's quota names.
fn quota_label(quota: &str) -> String {
    match quota {
        "100_per_min_burst_20" => "100/min, burst 20".to_owned(),
        "1e9_per_s_burst_1000" => "1e9/s, burst 1000".to_owned(),
        other => plain(other),
    }
}

/// The page's Reproduce section.
fn reproduce(p: &mut Page) {
    p.h2("Reproduce");
    p.para("From the repository root, on a quiet machine:");
    p.line("```sh");
    p.line("bash benches/run.sh              # every benchmark, 3 runs of each, then this page and its picture");
    p.line("RUNS=1 bash benches/run.sh       # one run of each");
    p.para("```");
    p.para(REPRODUCE);
}

/// How every figure is taken (the page's fixed text).
const METHOD: &str = "Every comparison is a ratio of contenders measured side by side, in one \
run, on one machine: in process, every contender of a scenario in turn in slices of about \
40 ms for 15 rounds (the order rotated each round), each ratio taken from slices run next to \
each other, so that a busy neighbour slows both sides; on Redis, every contender in turn on \
one `redis-server` started for the purpose on a free loopback port, the runs interleaved. A \
table gives the median of the runs and, for a ratio, the median of the per-run ratios, with \
the range in brackets where the runs differ. Instruction counts (callgrind) stand beside wall \
time where they exist: they do not depend on what else the machine runs. Absolute times are \
indicative only; the ratios are the figures to compare. The load generator, the servers and \
Redis share the machine's CPUs unless a table says otherwise (`--pin`, `--server-cpu`).";

/// The Reproduce section's text after the commands.
const REPRODUCE: &str = "`benches/run.sh` says what it needs (redis-server and redis-tools, \
valgrind, wrk, taskset) and writes each benchmark's output to `target/bench-results/`, as the \
program prints it; then `cargo run --release -p ratelimit-benches --bin bench_page` writes \
this page and `docs/benchmarks.svg` from those files (it can be run again on its own: \
`--results DIR`, `--page FILE`, `--svg FILE`). A section whose file is missing says so. Each \
program's options are in its doc comment (`benches/src/bin/`, `benches/benches/`, \
`benches/peers/`, `ratelimit-server/benches/loadgen.rs`).";

/// The in-process section's introduction.
const IN_PROCESS: &str = "`benches/benches/local.rs` with `LOCAL_INTERLEAVED=1`: the local \
store through its fastest path (`LocalStore::decide_now`, what `Limiter::check` reaches), \
through the one door (`Store::decide` on a `dyn Store`) and through `Limiter::check`, beside \
governor 0.10's keyed limiter and throttlecrab 0.4's GCRA (behind a mutex, as a \
multi-threaded service would hold it), on the same quotas: the sold plan (100 per minute, \
burst 20: a hot key is then mostly denied) and a bucket no loop empties (1e9 per second, \
burst 1000: every call admitted). Keys are `customer-<i>`, each seen once before measuring.";

/// The sweep section's introduction.
const SWEEP: &str = "`sweep_latency`: 200,000 callers make one call each and then expire at \
once (*expiring*; or stay, *live*) while 1,000 other callers make 10,000 decisions a second \
for 4 s; the response time a server thread taking the decisions in order would see, medians \
of the rounds. The incremental automatic sweep against a full `sweep()` inline once a second. \
The goal: p99.9 under 1 ms while the callers expire.";

/// The Redis section's introduction.
const REDIS: &str = "Every Redis figure comes from a `redis-server` started for the purpose on \
a free loopback port. The store decides with one Lua script per decision; decisions waiting \
for a connection go out together as one call of the batch script (group commit: no timer, \
no added delay when idle).";

/// The peers' introduction.
const PEERS: &str = "`benches/peers/run.sh` (a workspace of its own; see its README): on one \
`redis-server`, ours (batched, and `ours (single)`: one call per decision), the naive \
hash-of-floats token bucket (`benches/lua/`, one `EVALSHA` per decision on the same client \
and connections), redis-cell's `CL.THROTTLE` (GCRA in a native module) and Limitador 0.14 \
(fixed windows) over Redis and with its cached storage; every contender once per run, the \
runs interleaved; × naive is the median of the per-run ratios to the naive script. The \
server's µs per decision is its CPU (`INFO cpu`) over the decisions; *load generator alone* \
is the harness's own ceiling.";

/// The server's work's introduction.
const SCRIPT_INSTRUCTIONS: &str = "`benches/script_instructions.sh`: `redis-server` under \
callgrind, 5,000 calls of each contender by `redis-benchmark -c 1`: the instructions a call \
costs the server (event loop, parsing, the script, the reply), whatever else the machine \
runs. `PING` and the `EVALSHA` of a script that returns a constant are the floors of any \
command and of any script call.";

/// The client side's introduction.
const CLIENT_SIDE: &str = "`redis_load --ratio-only`: `RedisStore::decide`, and \
`Limiter::check` over it, against the bare `EVALSHA` of the same script with the same \
arguments on the same client and connections, in slices of 200 ms taken in turn; each run's \
median ratio of decisions per second. 1.00 is the bare call, the limit; the line is 0.95. One \
caller with the client and its `redis-server` on one CPU (`taskset -c 0`, so no wake-up \
crosses CPUs), then 32 callers over 4 connections.";

/// The under-faults section's introduction.
const UNDER_FAULTS: &str = "`under_faults` (`benches/src/bin/under_faults.rs`) and \
`dead_redis` start their own servers on loopback. Does the limiter keep limiting where \
nothing has failed (two example servers on one Redis), and where something has (a dead \
cluster master, a restart)? Thousands of callers and bursts: the next section.";

/// The example servers' introduction.
const SERVERS: &str = "Two example servers (`examples/src/bin/server.rs`, `--redis URL \
--instances 2`, policies no caller reaches, so every request is a store round trip) share one \
Redis, each under its own `wrk` with 64 connections for 5 s: more connections than cores, \
servers, Redis and `wrk` on the same machine. Decisions by source from each server's \
`/metrics`, medians. Target: at least 99 % by the store or the fallback, none fail-open.";

/// The cluster's introduction.
const CLUSTER: &str = "A local cluster of 3 masters and 3 replicas (`cluster-node-timeout` \
1,500 ms), 256 tasks on `Limiter::check`; one master SIGKILLed after 2 s. Full coverage \
`no` is what ratelimit-cluster's README recommends; `yes` is Redis' default, under which every \
node refuses every key from the failure's agreement to the promotion. Target: the healthy \
masters' callers at least 99 % by the store between the kill and the promotion; the dead \
master's callers are decided by the fallback (L / 3) meanwhile.";

/// The restart's introduction.
const RESTART: &str = "`dead_redis`: Redis killed under checks (the default degraded mode, a \
20 ms timeout), dead for 2 s, restarted on the same port while a check runs every \
millisecond; the time from the port accepting connections to the store's first decision. \
Target: at most 200 ms.";

/// The retry storm's introduction.
const RETRY_STORM: &str = "`retry_storm` (`examples/`): 50 callers exhaust a quota of 10 per \
minute and retry every 20 ms for 10 s, on a simulated clock injected into the Redis store, \
through a limiter without the deny cache and one with it, each on its own keys; the program \
fails if the admitted calls differ. Goal: at least 90 % fewer round trips.";

/// The workers' introduction.
const WORKERS: &str = "`workers` (`examples/`): two processes of four workers share a \
third-party allowance of 50 per second (burst 5) through Redis, every worker calling `acquire` \
in a loop for 5 s; the program fails if more than `burst + rate × T` pass.";

/// The service's introduction.
const SERVICE: &str = "`cargo bench -p ratelimit-server --bench loadgen` (the peers run when \
`THROTTLECRAB_SERVER` and `LIMITADOR_SERVER` name their binaries; how to build them is in the \
program's doc comment): ratelimit-server, throttlecrab-server (its own gRPC `Throttle`, GCRA, \
in process) and Limitador's server (built from its repository's source; `memory` and `redis` \
storages) take the same requests from one Rust load generator over 4 HTTP/2 connections: Envoy's \
`ShouldRateLimit` for ours and Limitador, one of 100,000 keys at random, 100 per minute per key \
(a fixed window; GCRA, burst 100, for throttlecrab-server). Closed loops at 16 and 256 requests \
in flight (and at 16 with three descriptors per request); the open loop sends at 0.5 and 0.8 \
times the target's closed-loop rate at 256 in flight, on schedule, each latency counted from \
its scheduled send time (at 0.8, which an open loop's smaller batches barely reach with one \
core, every server queues). The generator frames gRPC itself on `h2`, with `grpc-timeout: 1S` \
on every call as Envoy sends its filter's timeout. 4 s per load after a 1 s warm-up, \
targets alternated over 3 rounds, medians shown. Each server runs pinned to one core, the \
generator and Redis on the other; ours over Redis with `--timeout 1s`, so that every decision \
is Redis'. The server CPU per request is the process's user + system time over the measured \
window (`/proc/<pid>/stat`), the Redis CPU the Redis servers' (the cluster's three masters). \
Requests per second and latencies measure the generator's core as much as the server; CPU \
per request does not. \"generator lag p99\" is how late the open loop's generator sent its \
requests: where it reaches milliseconds, the generator, not the server, set the latencies. The \
library call and the service in process (no network), the floor, are in the limits table \
above.";
