//! Writes `BENCHMARKS.md` and its picture, `docs/benchmarks.svg`, from the
//! result files `benches/run.sh` leaves in `target/bench-results/`: the
//! headline ratios (ours over each peer, and over the limits that bound
//! them), then one section per measured area with its command, its table
//! and its line to meet. The method is fixed text; the machine is what
//! `run.sh` wrote to `machine.md`.
//!
//! ```text
//! cargo run --release -p ratelimit-benches --bin bench_page -- \
//!     [--results target/bench-results] [--page BENCHMARKS.md] [--svg docs/benchmarks.svg]
//! ```
//!
//! A result file that is missing leaves its section saying so (a warning
//! names it); a file that is there but not as its program prints it stops
//! the program with the file and what was wrong, and nothing is written.
//! Exit status: 0 written, 1 a result file could not be read (or there
//! was none), 2 a wrong argument.

mod load;
mod markdown;
mod page;
mod picture;
mod results;
mod writer;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Where to read and where to write.
#[derive(Debug)]
struct Args {
    results: PathBuf,
    page: PathBuf,
    svg: PathBuf,
}

/// The usage line.
const USAGE: &str = "usage: bench_page [--results DIR] [--page FILE] [--svg FILE]\n\
    (defaults: target/bench-results, BENCHMARKS.md, docs/benchmarks.svg)";

/// Parses the arguments after the program's name.
fn parse_args(args: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut a = Args {
        results: PathBuf::from("target/bench-results"),
        page: PathBuf::from("BENCHMARKS.md"),
        svg: PathBuf::from("docs/benchmarks.svg"),
    };
    let mut args = args;
    while let Some(arg) = args.next() {
        let slot = match arg.as_str() {
            "--results" => &mut a.results,
            "--page" => &mut a.page,
            "--svg" => &mut a.svg,
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other:?}")),
        };
        *slot = PathBuf::from(
            args.next()
                .ok_or_else(|| format!("{arg} needs a path after it"))?,
        );
    }
    Ok(Some(a))
}

/// How the page links to the picture: the picture's path from the page's
/// directory when it lies below it, else the path as given.
fn link(page: &Path, svg: &Path) -> String {
    let dir = page.parent().unwrap_or(Path::new(""));
    let shown = if dir.as_os_str().is_empty() {
        svg
    } else {
        svg.strip_prefix(dir).unwrap_or(svg)
    };
    shown.to_string_lossy().replace('\\', "/")
}

/// Reads the results and writes the page and the picture.
fn run(a: &Args) -> Result<(), (u8, String)> {
    if !a.results.is_dir() {
        return Err((
            1,
            format!(
                "{} is not a directory of results: run `bash benches/run.sh` first",
                a.results.display()
            ),
        ));
    }
    let mut r = results::Results::new(&a.results);
    let figures = page::Figures::read(&mut r);
    if !r.problems.is_empty() {
        return Err((
            1,
            format!(
                "cannot read these results (nothing written):\n  {}",
                r.problems.join("\n  ")
            ),
        ));
    }
    if r.found == 0 {
        return Err((
            1,
            format!(
                "no result file in {}: run `bash benches/run.sh` first",
                a.results.display()
            ),
        ));
    }
    if !r.missing.is_empty() {
        eprintln!(
            "bench_page: not in {} (their sections say so): {}",
            a.results.display(),
            r.missing.join(", ")
        );
    }
    let svg = picture::headlines_svg(&figures.headlines())
        .map_err(|e| (1, format!("cannot draw the picture: {e}")))?;
    let text = figures.page(&link(&a.page, &a.svg));
    for (path, contents) in [(&a.svg, svg), (&a.page, text)] {
        std::fs::write(path, contents)
            .map_err(|e| (1, format!("cannot write {}: {e}", path.display())))?;
    }
    eprintln!(
        "bench_page: wrote {} and {} from {}",
        a.page.display(),
        a.svg.display(),
        a.results.display()
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("bench_page: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, e)) => {
            eprintln!("bench_page: {e}");
            ExitCode::from(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Option<Args>, String> {
        parse_args(list.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn arguments() {
        let a = args(&[]).unwrap().unwrap();
        assert_eq!(a.results, Path::new("target/bench-results"));
        let a = args(&["--page", "x/B.md", "--svg", "x/docs/b.svg"])
            .unwrap()
            .unwrap();
        assert_eq!(link(&a.page, &a.svg), "docs/b.svg");
        assert!(args(&["--help"]).unwrap().is_none());
        assert!(args(&["--page"]).unwrap_err().contains("needs a path"));
        assert!(args(&["--pages", "x"]).unwrap_err().contains("unknown"));
        assert_eq!(
            link(Path::new("BENCHMARKS.md"), Path::new("docs/benchmarks.svg")),
            "docs/benchmarks.svg"
        );
    }
}
