//! The results: every run's figures, and their medians.

use std::collections::BTreeMap;

use crate::load::Measured;

#[derive(Debug, Default)]
pub(crate) struct Book {
    /// name -> one measurement per run.
    pub(crate) rows: BTreeMap<String, Vec<Measured>>,
    /// Insertion order of names, for printing.
    pub(crate) order: Vec<String>,
}

impl Book {
    pub(crate) fn add(&mut self, name: &str, m: Measured) {
        if !self.rows.contains_key(name) {
            self.order.push(name.to_owned());
        }
        eprintln!(
            "  {name}: {:.0}/s, p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs, server {:.2} µs/EVALSHA, admitted {:.1}%, errors {}",
            m.per_second,
            m.p50_us,
            m.p99_us,
            m.p999_us,
            m.server_us,
            100.0 * m.allowed as f64 / m.decisions.max(1) as f64,
            m.errors
        );
        self.rows.entry(name.to_owned()).or_default().push(m);
    }

    pub(crate) fn median_of(&self, name: &str, f: impl Fn(&Measured) -> f64) -> Option<f64> {
        median(self.rows.get(name)?.iter().map(f).collect())
    }

    /// Median over runs of `a / b` within each run.
    pub(crate) fn ratio(&self, a: &str, b: &str, f: impl Fn(&Measured) -> f64) -> Option<f64> {
        let (a, b) = (self.rows.get(a)?, self.rows.get(b)?);
        median(a.iter().zip(b).map(|(x, y)| f(x) / f(y)).collect())
    }

    pub(crate) fn print_table(&self, title: &str, names: &[String]) {
        println!("{title}\n");
        println!(
            "| contender | decisions/s | p50 µs | p99 µs | p99.9 µs | server µs per EVALSHA | admitted | errors | runs |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for name in names {
            let Some(rows) = self.rows.get(name) else {
                continue;
            };
            let g = |f: fn(&Measured) -> f64| self.median_of(name, f).unwrap_or(f64::NAN);
            // redis-benchmark does not report what the scripts answered.
            let admitted = if name.starts_with("redis-benchmark") {
                "–".to_owned()
            } else {
                format!(
                    "{:.1}%",
                    100.0 * g(|m| m.allowed as f64 / m.decisions.max(1) as f64)
                )
            };
            let errors: u64 = rows.iter().map(|m| m.errors).sum();
            println!(
                "| {name} | {:.0} | {:.0} | {:.0} | {} | {} | {admitted} | {errors} | {} |",
                g(|m| m.per_second),
                g(|m| m.p50_us),
                g(|m| m.p99_us),
                fmt_opt(self.median_of(name, |m| m.p999_us), 0),
                fmt_opt(self.median_of(name, |m| m.server_us), 2),
                rows.len()
            );
        }
        println!();
    }
}

pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

pub(crate) fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_owned(), |x| format!("{x:.digits$}"))
}
