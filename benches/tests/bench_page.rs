//! `bench_page` on the sample results in `tests/bench_page/` (written by
//! hand in the format each benchmark prints): the page it writes has the
//! layout of the committed `BENCHMARKS.md` (the same headings and the same
//! tables, in order), its picture has a bar per headline, a missing file
//! leaves its section saying so, and a file that is not as its program
//! prints it stops the program with its name, writing nothing.
#![allow(missing_docs)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The benches crate's directory.
fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bench-page-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// Runs `bench_page` on `results`, writing into `out`.
fn bench_page(results: &Path, out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bench_page"))
        .arg("--results")
        .arg(results)
        .arg("--page")
        .arg(out.join("BENCHMARKS.md"))
        .arg("--svg")
        .arg(out.join("docs").join("benchmarks.svg"))
        .output()
        .expect("run bench_page")
}

/// The layout of a page: its headings, and the header line of every
/// table, in order.
fn layout(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    let mut previous_is_table = false;
    for line in page.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if in_code {
            continue;
        }
        let is_table = line.starts_with('|');
        if line.starts_with('#') || (is_table && !previous_is_table) {
            out.push(line.trim().to_owned());
        }
        previous_is_table = is_table;
    }
    out
}

#[test]
fn the_page_has_the_layout_of_the_committed_one() {
    let out = scratch("layout");
    std::fs::create_dir_all(out.join("docs")).unwrap();
    let run = bench_page(&here().join("tests/bench_page"), &out);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "bench_page failed: {stderr}");
    assert!(
        stderr.contains("peers_pinned.md"),
        "the missing sample file is not named: {stderr}"
    );
    let page = std::fs::read_to_string(out.join("BENCHMARKS.md")).unwrap();
    let committed = std::fs::read_to_string(here().join("../BENCHMARKS.md")).unwrap();
    let (made, kept) = (layout(&page), layout(&committed));
    for (i, (m, k)) in made.iter().zip(&kept).enumerate() {
        assert_eq!(
            m, k,
            "line {i} of the layout differs between the generated page and BENCHMARKS.md"
        );
    }
    assert_eq!(
        made.len(),
        kept.len(),
        "the generated page and BENCHMARKS.md have layouts of different lengths:\n{made:#?}\n{kept:#?}"
    );
    // A report, not a diary: what stands now, one table per question.
    assert!(
        committed.lines().count() <= 420,
        "BENCHMARKS.md is a report of at most 420 lines"
    );
    assert!(
        page.contains("](docs/benchmarks.svg)"),
        "the picture is not linked"
    );
    assert!(page.contains("`target/bench-results/peers_pinned.md` is missing"));
    // The headline figures of the samples made it to the page.
    for figure in [
        "**2.47**",
        "**0.39**",
        "**0.63**",
        "**0.960**",
        // overload's closed loop, the service's bursts, TLS.
        "| redis-rs | 4096 |",
        "Exactly 20 admitted in 10 of 10 rounds",
        "| 35.79 |",
    ] {
        assert!(page.contains(figure), "{figure} is not on the page");
    }
    let svg = std::fs::read_to_string(out.join("docs/benchmarks.svg")).unwrap();
    for label in [
        "naive Lua script",
        "redis-cell",
        "Limitador (Redis)",
        "governor: Limiter::check",
    ] {
        assert!(svg.contains(label), "no bar for {label}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_malformed_result_is_named_and_nothing_is_written() {
    let results = scratch("malformed-in");
    let out = scratch("malformed-out");
    std::fs::create_dir_all(out.join("docs")).unwrap();
    for f in ["machine.md", "retry_storm.md"] {
        std::fs::copy(here().join("tests/bench_page").join(f), results.join(f)).unwrap();
    }
    std::fs::write(
        results.join("peers.md"),
        "peers: the run stopped half-way\n",
    )
    .unwrap();
    let run = bench_page(&results, &out);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("peers.md: no table with the columns"),
        "{stderr}"
    );
    assert!(!out.join("BENCHMARKS.md").exists(), "a page was written");
    let _ = std::fs::remove_dir_all(&results);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn no_results_at_all_is_an_error_not_an_empty_page() {
    let results = scratch("empty-in");
    let out = scratch("empty-out");
    let run = bench_page(&results, &out);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("run `bash benches/run.sh` first"),
        "{stderr}"
    );
    let run = bench_page(&results.join("nowhere"), &out);
    assert_eq!(run.status.code(), Some(1));
    let run = Command::new(env!("CARGO_BIN_EXE_bench_page"))
        .arg("--colour")
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(2), "a wrong argument");
    let _ = std::fs::remove_dir_all(&results);
    let _ = std::fs::remove_dir_all(&out);
}
