//! Reading what the benchmarks print: markdown tables, the headings above
//! them, numbers with their units; and writing numbers back the way the
//! page shows them.

use std::path::Path;

/// One markdown table of a result file.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    /// The last `#` heading above the table, without its `#`s.
    pub(crate) heading: Option<String>,
    /// The header cells, trimmed.
    pub(crate) header: Vec<String>,
    /// Every row after the separator line, its cells trimmed.
    pub(crate) rows: Vec<Vec<String>>,
}

/// A cell's text without markdown emphasis and code marks, trimmed.
pub(crate) fn plain(cell: &str) -> String {
    cell.replace("**", "").replace('`', "").trim().to_owned()
}

impl Table {
    /// The index of the first column whose header, in plain text and
    /// ignoring case, starts with `name`.
    pub(crate) fn col(&self, name: &str) -> Option<usize> {
        let name = name.to_lowercase();
        self.header
            .iter()
            .position(|h| plain(h).to_lowercase().starts_with(&name))
    }

    /// The index of the `n`th (from 0) column whose header starts with
    /// `name` (a table may have two columns of one name, such as peers'
    /// two `× naive`).
    pub(crate) fn nth_col(&self, name: &str, n: usize) -> Option<usize> {
        let name = name.to_lowercase();
        self.header
            .iter()
            .enumerate()
            .filter(|(_, h)| plain(h).to_lowercase().starts_with(&name))
            .map(|(i, _)| i)
            .nth(n)
    }

    /// Whether the table has a column starting with each of `names`.
    pub(crate) fn has(&self, names: &[&str]) -> bool {
        names.iter().all(|n| self.col(n).is_some())
    }
}

/// One result file: its text and its tables.
#[derive(Debug, Clone)]
pub(crate) struct Doc {
    /// The file's name, for messages.
    pub(crate) name: String,
    /// The whole text.
    pub(crate) text: String,
    /// Its tables, in order.
    pub(crate) tables: Vec<Table>,
}

impl Doc {
    /// Reads `path`; `Ok(None)` when it does not exist.
    pub(crate) fn read(path: &Path) -> Result<Option<Self>, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(Some(Self::parse(
                &path.file_name().map_or_else(
                    || path.display().to_string(),
                    |n| n.to_string_lossy().into(),
                ),
                &text,
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    }

    /// Parses `text` (the contents of the file `name`).
    pub(crate) fn parse(name: &str, text: &str) -> Self {
        // Colour codes, should a program have written them to a terminal
        // that was then captured.
        let text = strip_ansi(text);
        let mut tables = Vec::new();
        let mut heading = None;
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let line = lines[i].trim();
            if line.starts_with('#') {
                heading = Some(line.trim_start_matches('#').trim().to_owned());
            }
            let separator = lines.get(i + 1).is_some_and(|l| is_separator(l));
            if line.starts_with('|') && separator {
                let header = cells(line);
                let mut rows = Vec::new();
                i += 2;
                while i < lines.len() && lines[i].trim().starts_with('|') {
                    if !is_separator(lines[i]) {
                        rows.push(cells(lines[i].trim()));
                    }
                    i += 1;
                }
                tables.push(Table {
                    heading: heading.clone(),
                    header,
                    rows,
                });
                continue;
            }
            i += 1;
        }
        Self {
            name: name.to_owned(),
            text,
            tables,
        }
    }

    /// The first table with a column starting with each of `names`.
    pub(crate) fn table(&self, names: &[&str]) -> Result<&Table, String> {
        self.tables.iter().find(|t| t.has(names)).ok_or_else(|| {
            format!(
                "{}: no table with the columns {}",
                self.name,
                names
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    }

    /// Every table with a column starting with each of `names`.
    pub(crate) fn tables(&self, names: &[&str]) -> Vec<&Table> {
        self.tables.iter().filter(|t| t.has(names)).collect()
    }
}

/// Whether `line` is a table's separator line (`|---|---:|`).
fn is_separator(line: &str) -> bool {
    let line = line.trim();
    line.starts_with('|')
        && line.contains('-')
        && line.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '))
}

/// The cells of a table line, trimmed.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    inner.split('|').map(|c| c.trim().to_owned()).collect()
}

/// `text` without ANSI escape sequences (`ESC [ ... letter`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The number a cell starts with (`**1,234.5** %` is 1234.5); `None` for
/// `–`, `-`, `NaN` or text.
pub(crate) fn number(cell: &str) -> Option<f64> {
    let s = plain(cell).replace(',', "");
    let s = s.trim();
    let end = s
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || (i == 0 && (c == '-' || c == '+'))))
        .map_or(s.len(), |(i, _)| i);
    s[..end].parse::<f64>().ok().filter(|x| x.is_finite())
}

/// A duration cell in microseconds: `9.7 ms`, `73.0 µs`, `2 s`, `120 ns`.
pub(crate) fn micros(cell: &str) -> Option<f64> {
    let v = number(cell)?;
    let s = plain(cell);
    let unit = s
        .trim_start_matches(|c: char| c.is_ascii_digit() || matches!(c, '.' | ',' | '-' | '+'))
        .trim_start();
    let scale = if unit.starts_with("ns") {
        1e-3
    } else if unit.starts_with("µs") || unit.starts_with("us") {
        1.0
    } else if unit.starts_with("ms") {
        1e3
    } else if unit.starts_with('s') {
        1e6
    } else {
        return None;
    };
    Some(v * scale)
}

/// The median of `values` (the mean of the two middle ones for an even
/// count); `None` when empty.
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
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

/// `1,234,567` for 1234567.4.
pub(crate) fn int(x: f64) -> String {
    let n = x.round().abs() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    if x.round() < 0.0 {
        format!("-{out}")
    } else {
        out
    }
}

/// A ratio as the page shows it: two decimals, three below 0.1.
pub(crate) fn ratio(x: f64) -> String {
    if x.abs() < 0.1 {
        format!("{x:.3}")
    } else {
        format!("{x:.2}")
    }
}

/// A duration in µs as the page shows it: `9.7 ms`, `73.0 µs`.
pub(crate) fn duration(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.1} ms", us / 1e3)
    } else {
        format!("{us:.1} µs")
    }
}

/// The median of `values` shown with `show`, and their range in brackets
/// when they differ: `0.63 (0.61-0.64)`; `–` when there are none.
pub(crate) fn spread(values: &[f64], show: impl Fn(f64) -> String) -> String {
    let Some(m) = median(values) else {
        return "–".to_owned();
    };
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if values.len() > 1 && show(lo) != show(hi) {
        format!("{} ({}-{})", show(m), show(lo), show(hi))
    } else {
        show(m)
    }
}

/// `x` shown with `show`, or `–`.
pub(crate) fn or_dash(x: Option<f64>, show: impl Fn(f64) -> String) -> String {
    x.map_or_else(|| "–".to_owned(), show)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_with_units_and_marks() {
        assert_eq!(number("**1,234.5** %"), Some(1234.5));
        assert_eq!(number("0.98"), Some(0.98));
        assert_eq!(number("-3.1"), Some(-3.1));
        assert_eq!(number("–"), None);
        assert_eq!(number("NaN"), None);
        assert_eq!(number("yes"), None);
        assert_eq!(micros("9.7 ms"), Some(9700.0));
        assert_eq!(micros("73.0 µs"), Some(73.0));
        assert_eq!(micros("**89.4 ms** (worst 142.6 ms)"), Some(89400.0));
        assert_eq!(micros("354.33 ns"), Some(0.35433));
        assert_eq!(micros("never"), None);
        assert_eq!(micros("12"), None);
    }

    #[test]
    fn tables_and_their_headings() {
        let doc = Doc::parse(
            "x.md",
            "# Top\n\ntext\n\n### Callers live\n\n| way | p99 |\n|---|---:|\n| a | 1 µs |\n| b | 2 µs |\n\nafter\n| not | a table |\n",
        );
        assert_eq!(doc.tables.len(), 1);
        let t = &doc.tables[0];
        assert_eq!(t.heading.as_deref(), Some("Callers live"));
        assert_eq!(t.header, ["way", "p99"]);
        assert_eq!(t.rows.len(), 2);
        assert_eq!(t.col("P99"), Some(1));
        assert!(doc.table(&["way", "p99.9"]).is_err());
    }

    #[test]
    fn escape_codes_are_dropped() {
        let doc = Doc::parse("x", "\u{1b}[32mgreen\u{1b}[0m text");
        assert_eq!(doc.text, "green text");
    }

    #[test]
    fn shown_numbers() {
        assert_eq!(int(1234567.4), "1,234,567");
        assert_eq!(int(999.0), "999");
        assert_eq!(ratio(2.468), "2.47");
        assert_eq!(ratio(0.0096), "0.010");
        assert_eq!(duration(9700.0), "9.7 ms");
        assert_eq!(duration(73.0), "73.0 µs");
        assert_eq!(spread(&[0.61, 0.64, 0.63], ratio), "0.63 (0.61-0.64)");
        assert_eq!(spread(&[1.0], ratio), "1.00");
        assert_eq!(spread(&[], ratio), "–");
        assert_eq!(median(&[1.0, 2.0, 3.0, 4.0]), Some(2.5));
    }
}
