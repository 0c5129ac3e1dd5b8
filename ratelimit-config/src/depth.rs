//! How deeply a file nests, measured on the text before any parser sees it.
//!
//! A policy file nests three levels (the file's map, the list of policies,
//! a policy's map). The YAML parser takes time that grows with the square of
//! the nesting of flow collections (`[[[[...` or `{a: {a: ...`): a document
//! nested 100,000 deep took it 24 s (release build) to reject. Each scan here
//! is one pass over the text, and stops at the first place deeper than the
//! limit.
//!
//! The JSON and TOML scans are exact (strings and comments are recognised
//! as their grammars define them). The YAML scan follows the YAML grammar
//! where it decides what is structure: quoted scalars only where a token
//! starts, comments only after white space, block scalars (`|`, `>`) by
//! their indentation, continuation lines of plain scalars, tags and anchors.
//! Block nesting is counted by indentation plus the indicators (`- `, `? `,
//! `: `) on each line, which may count a level or two more than the parser
//! builds; a limit of 64 leaves ample room for that.

use crate::Format;

/// The deepest nesting accepted, in collections (maps and lists) one inside
/// another. A policy file needs 3.
pub const MAX_DEPTH: usize = 64;

/// The byte offset at which `text` first nests deeper than `limit`, if it
/// does.
pub(crate) fn too_deep(text: &str, format: Format, limit: usize) -> Option<usize> {
    match format {
        Format::Json => json(text.as_bytes(), limit),
        Format::Toml => toml(text.as_bytes(), limit),
        Format::Yaml => Yaml::new(text.as_bytes(), limit).scan(),
    }
}

fn json(b: &[u8], limit: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => i = skip_escaped(b, i + 1, b"\""),
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return Some(i);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

fn toml(b: &[u8], limit: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' if b[i..].starts_with(b"\"\"\"") => i = skip_escaped(b, i + 3, b"\"\"\"") + 2,
            b'\'' if b[i..].starts_with(b"'''") => i = find(b, i + 3, b"'''") + 2,
            b'"' => i = skip_escaped(b, i + 1, b"\""),
            b'\'' => i = find(b, i + 1, b"'"),
            b'#' => i = find(b, i, b"\n"),
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return Some(i);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

/// The offset of `end` at or after `from`, skipping backslash escapes; the
/// text's length when there is none. A single-line string also ends at a
/// new line (the parser reports it); a multi-line one does not.
fn skip_escaped(b: &[u8], mut i: usize, end: &[u8]) -> usize {
    while i < b.len() {
        if b[i] == b'\\' {
            i += 2;
            continue;
        }
        if b[i..].starts_with(end) || (end.len() == 1 && b[i] == b'\n') {
            return i;
        }
        i += 1;
    }
    b.len()
}

/// The offset of `end` at or after `from`, or the text's length. A
/// single-character `end` other than a new line also stops at a new line.
fn find(b: &[u8], mut i: usize, end: &[u8]) -> usize {
    while i < b.len() {
        if b[i..].starts_with(end) || (end.len() == 1 && end != b"\n" && b[i] == b'\n') {
            return i;
        }
        i += 1;
    }
    b.len()
}

/// One pass over YAML text; see the module's documentation.
struct Yaml<'a> {
    b: &'a [u8],
    limit: usize,
    /// Open flow collections (`[`, `{`).
    flow: usize,
    /// Indentation of the open block levels.
    blocks: Vec<usize>,
    /// Block indicators (`- `, `? `, `: `) seen on the current line.
    indicators: usize,
    /// Whether a token starts here: a quote opens a quoted scalar, `[` a
    /// flow collection.
    token_start: bool,
    /// While a plain scalar may continue on the next line: the indentation
    /// of the line it started on.
    plain: Option<usize>,
    /// Indentation of the current line.
    indent: usize,
    /// Column at which the current line's last block node began: a block
    /// scalar's lines are those indented more.
    node_column: usize,
    /// Set by `|` or `>`: the lines indented more than this are its text.
    block_scalar: Option<usize>,
    /// Offset of the current line's first byte.
    line_start: usize,
}

impl<'a> Yaml<'a> {
    fn new(b: &'a [u8], limit: usize) -> Self {
        Self {
            b,
            limit,
            flow: 0,
            blocks: Vec::new(),
            indicators: 0,
            token_start: true,
            plain: None,
            indent: 0,
            node_column: 0,
            block_scalar: None,
            line_start: 0,
        }
    }

    fn depth(&self) -> usize {
        self.flow + self.blocks.len() + self.indicators
    }

    fn is_space(&self, i: usize) -> bool {
        matches!(self.b.get(i), None | Some(b' ' | b'\t' | b'\r' | b'\n'))
    }

    fn is_flow_indicator(&self, i: usize) -> bool {
        matches!(self.b.get(i), Some(b',' | b'[' | b']' | b'{' | b'}'))
    }

    /// The offset just past the end of the line holding `i`.
    fn next_line(&self, i: usize) -> usize {
        (find(self.b, i, b"\n") + 1).min(self.b.len())
    }

    /// Reads a line's indentation and decides what the line is, passing
    /// over blank lines, comment lines and the text of block scalars.
    /// Returns the offset to go on from.
    fn start_line(&mut self, mut start: usize) -> usize {
        let b = self.b;
        loop {
            if start >= b.len() {
                return b.len();
            }
            let mut i = start;
            while i < b.len() && b[i] == b' ' {
                i += 1;
            }
            let indent = i - start;
            let blank = matches!(b.get(i), None | Some(b'\n' | b'\r'));
            if let Some(parent) = self.block_scalar {
                if blank || indent > parent {
                    start = self.next_line(i);
                    continue;
                }
                self.block_scalar = None;
            }
            if blank {
                start = self.next_line(i);
                continue;
            }
            if b[i] == b'#' {
                // A comment line ends a plain scalar.
                self.plain = None;
                start = self.next_line(i);
                continue;
            }
            if indent == 0 && b[i] == b'%' && self.flow == 0 {
                // A directive.
                start = self.next_line(i);
                continue;
            }
            self.line_start = start;
            if self.flow > 0 {
                self.token_start = self.plain.is_none();
                return i;
            }
            if self.plain.is_some_and(|p| indent > p) {
                // The plain scalar goes on: a quote here is part of it.
                self.token_start = false;
                return i;
            }
            self.plain = None;
            self.token_start = true;
            self.indent = indent;
            self.node_column = indent;
            self.indicators = 0;
            while self.blocks.last().is_some_and(|&top| top > indent) {
                self.blocks.pop();
            }
            if self.blocks.last() != Some(&indent) {
                self.blocks.push(indent);
            }
            // A document marker; what follows it on the line starts a token.
            if indent == 0
                && (b[i..].starts_with(b"---") || b[i..].starts_with(b"..."))
                && self.is_space(i + 3)
            {
                return i + 3;
            }
            return i;
        }
    }

    fn scan(mut self) -> Option<usize> {
        let b = self.b;
        let mut i = self.start_line(0);
        if self.depth() > self.limit {
            return Some(i);
        }
        while i < b.len() {
            let c = b[i];
            if c == b'\n' {
                i = self.start_line(i + 1);
                if self.depth() > self.limit {
                    return Some(i);
                }
                continue;
            }
            if c == b'#' && (i == 0 || self.is_space(i - 1)) {
                self.plain = None;
                i = find(b, i, b"\n");
                continue;
            }
            if matches!(c, b' ' | b'\t' | b'\r') {
                i += 1;
                continue;
            }
            let column = i - self.line_start;
            if self.token_start {
                match c {
                    b'"' => {
                        i = skip_escaped_multiline(b, i + 1) + 1;
                        self.token_start = false;
                        continue;
                    }
                    b'\'' => {
                        i = skip_single_quoted(b, i + 1) + 1;
                        self.token_start = false;
                        continue;
                    }
                    b'|' | b'>' if self.flow == 0 => {
                        self.block_scalar = Some(self.node_column);
                        i = find(b, i, b"\n");
                        continue;
                    }
                    b'!' | b'&' => {
                        // A tag or an anchor: the node follows.
                        while i < b.len() && !self.is_space(i) && !self.is_flow_indicator(i) {
                            i += 1;
                        }
                        continue;
                    }
                    b'-' | b'?' if self.is_space(i + 1) => {
                        if self.flow == 0 {
                            self.indicators += 1;
                            self.node_column = column;
                            if self.depth() > self.limit {
                                return Some(i);
                            }
                        }
                        i += 1;
                        continue;
                    }
                    _ => {}
                }
            }
            match c {
                b'[' | b'{' if self.token_start || self.flow > 0 => {
                    self.flow += 1;
                    self.plain = None;
                    self.token_start = true;
                    if self.depth() > self.limit {
                        return Some(i);
                    }
                }
                b']' | b'}' if self.flow > 0 => {
                    self.flow -= 1;
                    self.plain = None;
                    self.token_start = false;
                }
                b',' if self.flow > 0 => {
                    self.plain = None;
                    self.token_start = true;
                }
                b':' if self.is_space(i + 1)
                    || (self.flow > 0
                        && (self.is_flow_indicator(i + 1)
                            || matches!(b[i - 1], b'"' | b'\'' | b']' | b'}'))) =>
                {
                    self.plain = None;
                    self.token_start = true;
                    if self.flow == 0 {
                        self.indicators += 1;
                        if self.depth() > self.limit {
                            return Some(i);
                        }
                    }
                }
                _ => {
                    if self.token_start {
                        if self.flow == 0 {
                            self.node_column = column;
                        }
                        self.plain = Some(if self.flow == 0 { self.indent } else { 0 });
                        self.token_start = false;
                    }
                }
            }
            i += 1;
        }
        None
    }
}

/// The offset of the closing `"` of a double-quoted scalar (which may span
/// lines), or the text's length.
fn skip_escaped_multiline(b: &[u8], mut i: usize) -> usize {
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i,
            _ => i += 1,
        }
    }
    b.len()
}

/// The offset of the closing `'` of a single-quoted scalar (`''` is a quote
/// inside it), or the text's length.
fn skip_single_quoted(b: &[u8], mut i: usize) -> usize {
    while i < b.len() {
        if b[i] == b'\'' {
            if b.get(i + 1) == Some(&b'\'') {
                i += 2;
                continue;
            }
            return i;
        }
        i += 1;
    }
    b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deepest(text: &str, format: Format) -> usize {
        (0..=MAX_DEPTH)
            .find(|&limit| too_deep(text, format, limit).is_none())
            .unwrap_or(usize::MAX)
    }

    #[test]
    fn policy_files_nest_a_few_levels() {
        let yaml = "# comment [[[\npolicies:\n  - name: api # [[[\n    algorithm: token_bucket\n    rate: '100/min [[['\n    burst: 20\n  - {name: \"x[[[\", limit: 5, window: 15m}\n";
        assert!(
            deepest(yaml, Format::Yaml) <= 5,
            "{}",
            deepest(yaml, Format::Yaml)
        );
        let toml = "# [[[\n[[policies]]\nname = \"a[[[\" # [[[\nrate = '''\n[[[\n'''\nburst = 20\n";
        assert_eq!(deepest(toml, Format::Toml), 2);
        let json = r#"{"policies": [{"name": "a[[[\"[[", "burst": 20}]}"#;
        assert_eq!(deepest(json, Format::Json), 3);
    }

    #[test]
    fn deep_nesting_is_found_where_it_passes_the_limit() {
        let deep =
            |open: &str, close: &str, n: usize| format!("{}{}", open.repeat(n), close.repeat(n));
        for (text, format) in [
            (deep("[", "]", 100), Format::Json),
            (format!("a = {}", deep("[", "]", 100)), Format::Toml),
            (
                format!("a = {}1{}", "{b = ".repeat(100), "}".repeat(100)),
                Format::Toml,
            ),
            (format!("policies: {}", deep("[", "]", 100)), Format::Yaml),
            (
                format!("policies: {}1{}", "{a: ".repeat(100), "}".repeat(100)),
                Format::Yaml,
            ),
            (format!("policies:\n{}x\n", "- ".repeat(100)), Format::Yaml),
            // Behind a tag, an anchor, a document marker, a plain scalar
            // ended by a comment, a closed quoted scalar.
            (format!("a: !t &x {}", deep("[", "]", 100)), Format::Yaml),
            (format!("--- {}", deep("[", "]", 100)), Format::Yaml),
            (
                format!("a: it's # x\nb: {}", deep("[", "]", 100)),
                Format::Yaml,
            ),
            (
                format!("a: 'it''s'\nb: \"\\\"\"\nc: {}", deep("[", "]", 100)),
                Format::Yaml,
            ),
            // After a block scalar, and inside flow after quoted keys.
            (
                format!("a: |\n  \"\nb: {}", deep("[", "]", 100)),
                Format::Yaml,
            ),
            (
                format!("{{\"a\":\"b\", \"c\":{}}}", deep("[", "]", 100)),
                Format::Yaml,
            ),
            // A plain scalar continued on the next line holds the quote.
            (
                format!("a: x\n  'y\nb: {}", deep("[", "]", 100)),
                Format::Yaml,
            ),
            (format!("[x\n'y, {}]", deep("[", "]", 100)), Format::Yaml),
        ] {
            let at = too_deep(&text, format, MAX_DEPTH);
            assert!(at.is_some(), "{format}: {text:.60}");
        }
        // The offset is the first bracket past the limit.
        assert_eq!(too_deep(&deep("[", "]", 100), Format::Json, 64), Some(64));
    }
}
