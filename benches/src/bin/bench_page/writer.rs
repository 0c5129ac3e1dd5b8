//! The page's writer: lines, paragraphs, headings and tables, in
//! Markdown.

/// The page, written section by section.
#[derive(Debug, Default)]
pub(crate) struct Page {
    out: String,
}

impl Page {
    /// A line of text (or an empty line).
    pub(crate) fn line(&mut self, text: &str) {
        self.out.push_str(text);
        self.out.push('\n');
    }

    /// A paragraph and the empty line after it.
    pub(crate) fn para(&mut self, text: &str) {
        self.line(text);
        self.line("");
    }

    /// A level-2 heading.
    pub(crate) fn h2(&mut self, text: &str) {
        self.para(&format!("## {text}"));
    }

    /// A level-3 heading.
    pub(crate) fn h3(&mut self, text: &str) {
        self.para(&format!("### {text}"));
    }

    /// A table: the header, its alignment (`l` or `r` per column), rows.
    pub(crate) fn table(&mut self, header: &[&str], align: &str, rows: &[Vec<String>]) {
        self.line(&format!("| {} |", header.join(" | ")));
        let sep: Vec<&str> = align
            .chars()
            .map(|c| if c == 'r' { "--:" } else { "---" })
            .collect();
        self.line(&format!("|{}|", sep.join("|")));
        for row in rows {
            self.line(&format!("| {} |", row.join(" | ")));
        }
        self.line("");
    }

    /// The line a section shows when its result file is missing.
    pub(crate) fn missing(&mut self, file: &str) {
        self.para(&format!(
            "Not measured in this run: `target/bench-results/{file}` is missing."
        ));
    }

    /// The page's text, with one newline at its end.
    pub(crate) fn finish(self) -> String {
        let mut out = self.out;
        while out.ends_with("\n\n") {
            out.pop();
        }
        out
    }
}
