//! Turns criterion's saved results into the markdown tables of `BENCHMARKS.md`.
//!
//! ```text
//! bench_report [--dir target/criterion] [BASELINE ...]
//! ```
//!
//! Reads the median time per iteration of every benchmark for each named
//! baseline (criterion's `--save-baseline NAME`; default: `new`, the last
//! run), and prints, per group, the median over the baselines of each time,
//! and the median over the baselines of the same-run ratio of each of our
//! contenders to governor. Ratios are taken within one run before the median
//! across runs, so a slow run (a noisy neighbour) moves both sides together.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// group id -> function id -> one median per baseline (ns per iteration).
type Results = BTreeMap<String, BTreeMap<String, Vec<f64>>>;

fn main() {
    let mut dir = PathBuf::from("target/criterion");
    let mut baselines = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--dir" {
            dir = PathBuf::from(args.next().expect("--dir needs a path"));
        } else {
            baselines.push(a);
        }
    }
    if baselines.is_empty() {
        baselines.push("new".to_owned());
    }
    let mut results = Results::new();
    collect(&dir, &baselines, &mut results);
    if results.is_empty() {
        eprintln!(
            "no criterion results for baselines {baselines:?} under {}: run `cargo bench -p ratelimit-benches --bench local` first",
            dir.display()
        );
        std::process::exit(1);
    }
    println!(
        "Medians over {} run(s) ({}), nanoseconds per decision; ratios are per run, then the median.\n",
        baselines.len(),
        baselines.join(", ")
    );
    print_model(&results);
    print_local(&results);
}

fn collect(dir: &Path, baselines: &[String], out: &mut Results) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if !path.is_dir() {
            continue;
        }
        // A benchmark directory holds one subdirectory per baseline, each
        // with benchmark.json (ids) and estimates.json (statistics).
        let mut found = false;
        let mut times = Vec::new();
        let mut ids = None;
        for b in baselines {
            let base = path.join(b);
            let (Some(bench), Some(est)) = (
                read_json(&base.join("benchmark.json")),
                read_json(&base.join("estimates.json")),
            ) else {
                continue;
            };
            found = true;
            ids = Some((
                bench["group_id"].as_str().unwrap_or("").to_owned(),
                bench["function_id"].as_str().unwrap_or("").to_owned(),
            ));
            if let Some(m) = est["median"]["point_estimate"].as_f64() {
                times.push(m);
            }
        }
        match ids {
            Some((group, function)) if found => {
                out.entry(group).or_default().insert(function, times);
            }
            _ => collect(&path, baselines, out),
        }
    }
}

fn read_json(p: &Path) -> Option<Value> {
    serde_json::from_str(&fs::read_to_string(p).ok()?).ok()
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

fn fmt_ns(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |x| format!("{x:.0}"))
}

fn fmt_ratio(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |x| format!("{x:.2}"))
}

/// Per-run ratios `a[i] / b[i]`, then their median.
fn ratio(a: Option<&Vec<f64>>, b: Option<&Vec<f64>>) -> Option<f64> {
    let (a, b) = (a?, b?);
    let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    median(&r)
}

fn print_model(results: &Results) {
    let Some(g) = results.get("model_step") else {
        return;
    };
    println!("### Core model step\n");
    println!("| algorithm | ns per decision | runs |");
    println!("|---|---:|---:|");
    for algo in [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
    ] {
        if let Some(t) = g.get(algo) {
            println!("| {algo} | {} | {} |", fmt_ns(median(t)), t.len());
        }
    }
    println!();
}

fn print_local(results: &Results) {
    let groups: Vec<(&String, &BTreeMap<String, Vec<f64>>)> = results
        .iter()
        .filter(|(k, _)| k.starts_with("local/"))
        .collect();
    if groups.is_empty() {
        return;
    }
    println!("### Local store against governor 0.10 (keyed DashMap, GCRA)\n");
    println!(
        "| keys | quota | threads | ours: Store::decide | ours: Limiter::check | governor check_key | ratio store/governor | ratio limiter/governor |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    // Order: key set as in the bench, then quota, then threads.
    let order = |k: &str| {
        let set = ["hot_key", "10k_keys", "1m_keys"]
            .iter()
            .position(|s| k.contains(&format!("/{s}/")))
            .unwrap_or(9);
        (set, k.to_owned())
    };
    let mut groups = groups;
    groups.sort_by_key(|(k, _)| order(k));
    for (group, fns) in groups {
        let parts: Vec<&str> = group.split('/').collect();
        let [_, keys, quota, threads] = parts[..] else {
            continue;
        };
        let store = fns.get("ours_store");
        let limiter = fns.get("ours_limiter");
        let gov = fns.get("governor");
        println!(
            "| {keys} | {quota} | {} | {} | {} | {} | {} | {} |",
            threads.trim_end_matches('t'),
            fmt_ns(store.and_then(|v| median(v))),
            fmt_ns(limiter.and_then(|v| median(v))),
            fmt_ns(gov.and_then(|v| median(v))),
            fmt_ratio(ratio(store, gov)),
            fmt_ratio(ratio(limiter, gov)),
        );
    }
    println!();
}
