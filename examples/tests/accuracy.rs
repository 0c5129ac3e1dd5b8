//! The accuracy report, on its short trace: the table has its shape, and the
//! numbers keep the properties the algorithms guarantee.

use std::process::Command;

use ratelimit_core::AlgorithmKind;
use ratelimit_examples::accuracy::{self, Length, Shape};

#[test]
fn short_report_keeps_the_guarantees() {
    let report = accuracy::run(Length::Short, accuracy::SEED);
    assert_eq!(report.rows.len(), Shape::ALL.len() * 4);
    let row = |s, k| accuracy::row(&report, s, k).expect("a row per shape and algorithm");

    for shape in Shape::ALL {
        // The reference agrees with itself and keeps the plan exactly.
        let log = row(shape, AlgorithmKind::SlidingLog);
        assert_eq!(
            (log.wrongly_admitted, log.wrongly_denied, log.differs),
            (0, 0, 0),
            "{log:?}"
        );
        assert_eq!(log.mean_rate_difference, 0.0, "{log:?}");
        assert!(log.max_trailing <= accuracy::LIMIT, "{log:?}");
        // Token bucket, burst 20 at 100/min: at most 20 + 100 in any minute.
        let tb = row(shape, AlgorithmKind::TokenBucket);
        assert!(tb.max_trailing <= 120, "{tb:?}");
        for r in report.rows.iter().filter(|r| r.shape == shape) {
            assert_eq!(r.requests, log.requests, "same traffic for all: {r:?}");
            assert!(r.wrongly_admitted + r.wrongly_denied <= r.requests);
            // Anything over the limit in a trailing minute was wrongly admitted.
            if r.max_trailing > accuracy::LIMIT {
                assert!(r.wrongly_admitted > 0, "{r:?}");
            }
        }
    }

    // The boundary burst: the fixed window admits 2L in a trailing minute,
    // all of the second hundred wrongly; the sliding window counter holds.
    let fw = row(Shape::BoundaryBurst, AlgorithmKind::FixedWindow);
    assert_eq!(
        (
            fw.requests,
            fw.admitted,
            fw.max_trailing,
            fw.wrongly_admitted
        ),
        (200, 200, 200, 100)
    );
    let sw = row(Shape::BoundaryBurst, AlgorithmKind::SlidingWindow);
    assert_eq!(
        (sw.admitted, sw.max_trailing, sw.wrongly_admitted),
        (100, 100, 0)
    );

    // Cron jobs at the top of the minute: the sliding window counter, which
    // assumes the previous minute was evenly spread, denies requests the
    // exact log admits.
    let cron = row(Shape::Cron, AlgorithmKind::SlidingWindow);
    assert!(cron.wrongly_denied > 0, "{cron:?}");

    // Poisson callers under the limit: nobody is denied by the exact rule
    // where nobody reaches it, so the approximations agree with it.
    let under = row(Shape::PoissonUnder, AlgorithmKind::SlidingWindow);
    assert!(
        (under.wrongly_admitted + under.wrongly_denied) * 100 <= under.requests,
        "{under:?}"
    );

    let table = accuracy::render(&report);
    let header = table
        .lines()
        .find(|l| l.starts_with("| traffic | algorithm |"))
        .expect("the table header");
    let columns = header.matches('|').count();
    let rows: Vec<&str> = table
        .lines()
        .skip_while(|l| !l.starts_with("| traffic | algorithm |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert_eq!(rows.len(), 20, "{table}");
    for r in rows {
        assert_eq!(r.matches('|').count(), columns, "{r}");
    }
    assert!(table.contains("| boundary burst | fixed window | 200 | 200 | 100 (50.000 %)"));
}

#[test]
fn the_report_is_reproducible_from_its_seed() {
    let a = accuracy::traffic(Shape::PoissonOver, Length::Short, 7);
    let b = accuracy::traffic(Shape::PoissonOver, Length::Short, 7);
    let c = accuracy::traffic(Shape::PoissonOver, Length::Short, 8);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.windows(2).all(|w| w[0].at <= w[1].at), "sorted by time");
}

#[test]
fn the_estimate_error_is_small_when_the_previous_minute_was_even() {
    // One request per second for three minutes: the previous minute really
    // was evenly spread, so the estimate is within one request of exact.
    let arrivals: Vec<accuracy::Arrival> = (0..180)
        .map(|i| accuracy::Arrival {
            at: ratelimit_examples::demo::NOON + i * 1_000_000,
            caller: 0,
        })
        .collect();
    let all = vec![true; arrivals.len()];
    assert!(accuracy::estimate_error(&arrivals, &all) < 0.02);
}

#[test]
fn the_binary_prints_the_table_and_draws_the_picture() {
    let dir = std::env::temp_dir().join(format!("ratelimit-accuracy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("boundary-burst.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_accuracy"))
        .args(["--short", "--svg"])
        .arg(&svg)
        .output()
        .expect("run the accuracy binary");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.contains("| traffic | algorithm | requests |"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("| sliding log | ") && l.ends_with(" | 0 (0.000 %) | 100 |")),
        "{table}"
    );
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(
        picture.starts_with("<svg"),
        "{}",
        &picture[..100.min(picture.len())]
    );
    for text in [
        "fixed window: 200 admitted, at most 200 in a trailing minute",
        "sliding window counter: 100 admitted",
        "sliding log: 100 admitted",
        "token bucket (burst 20, then 1 per 0.6 s): 21 admitted",
        "limit: 100 in any trailing 60 s",
        "12:04:00.0",
    ] {
        assert!(picture.contains(text), "the picture lacks {text:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
