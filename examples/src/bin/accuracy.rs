//! The accuracy report: generated traffic shapes against the four
//! algorithms, each measured against the exact sliding log, as a markdown
//! table; optionally the boundary-burst picture as SVG.
//!
//! ```text
//! cargo run -p ratelimit-examples --bin accuracy -- --svg docs/boundary-burst.svg
//! cargo run -p ratelimit-examples --bin accuracy -- --short     # seconds; what the tests run
//! ```

use std::process::ExitCode;

use ratelimit_examples::accuracy::{self, Length};
use ratelimit_examples::picture;

const USAGE: &str = "usage: accuracy [--short] [--seed <N>] [--svg <FILE>]\n\
    \n  --short  3 minutes of traffic and a tenth of the callers (seconds to run)\
    \n  --seed   the traffic's seed (default 2017, the published report)\
    \n  --svg    also draw the boundary burst to FILE";

struct Args {
    length: Length,
    seed: u64,
    svg: Option<String>,
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut args = Args {
        length: Length::Full,
        seed: accuracy::SEED,
        svg: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--short" => args.length = Length::Short,
            "--seed" => {
                let v = it.next().ok_or("--seed needs a number")?;
                args.seed = v.parse().map_err(|e| format!("--seed {v}: {e}"))?;
            }
            "--svg" => args.svg = Some(it.next().ok_or("--svg needs a file name")?),
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(args))
}

fn main() -> ExitCode {
    let args = match ratelimit_examples::args_or_exit(parse_args(), USAGE) {
        Ok(args) => args,
        Err(code) => return code,
    };
    let report = accuracy::run(args.length, args.seed);
    print!("{}", accuracy::render(&report));
    if let Some(path) = args.svg {
        let svg = match picture::boundary_burst_svg() {
            Ok(svg) => svg,
            Err(e) => {
                eprintln!("cannot draw the picture: {e}");
                return ExitCode::FAILURE;
            }
        };
        if let Err(e) = std::fs::write(&path, svg) {
            eprintln!("cannot write {path}: {e}");
            return ExitCode::FAILURE;
        }
        eprintln!("wrote {path}");
    }
    ExitCode::SUCCESS
}
