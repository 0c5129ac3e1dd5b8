//! The file as a plain tree, read before the policies: syntax errors, keys
//! written twice, and the policy names that make later messages easier to
//! place.
//!
//! Unlike `serde_json::Value`, the tree takes any number (a count too large
//! for `u64` is reported later against its field, with the accepted range),
//! and it refuses a map that names a key twice, saying which key.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_path_to_error::{Path as KeyPath, Segment};

use crate::{Error, Format, line_column, toml_message};

/// The text as a [`Tree`], or its syntax error, or the key it writes twice.
pub(crate) fn read(text: &str, format: Format) -> Result<Tree, Error> {
    let duplicate = RefCell::new(None);
    let seed = TreeSeed {
        duplicate: &duplicate,
    };
    let mut track = serde_path_to_error::Track::new();
    // The parser's message, and where (line, column) it stopped.
    let read: Result<Tree, (String, Option<(usize, usize)>)> = match format {
        Format::Toml => match toml::de::Deserializer::parse(text) {
            Ok(de) => {
                match seed.deserialize(serde_path_to_error::Deserializer::new(de, &mut track)) {
                    Err(e) if e.message().ends_with("number overflowed") => {
                        return Err(toml_overflow(&e, text, &track.path()));
                    }
                    read => read.map_err(|e| (toml_message(&e, text), None)),
                }
            }
            Err(e) if e.message() == "duplicate key" => return Err(toml_duplicate(&e, text)),
            Err(e) => Err((toml_message(&e, text), None)),
        },
        Format::Yaml => seed
            .deserialize(serde_path_to_error::Deserializer::new(
                serde_norway::Deserializer::from_str(text),
                &mut track,
            ))
            .map_err(|e| (e.to_string(), e.location().map(|l| (l.line(), l.column())))),
        Format::Json => {
            let mut de = serde_json::Deserializer::from_str(text);
            seed.deserialize(serde_path_to_error::Deserializer::new(&mut de, &mut track))
                .and_then(|tree| de.end().map(|()| tree))
                .map_err(|e| (e.to_string(), Some((e.line(), e.column()))))
        }
    };
    read.map_err(|(message, at)| match duplicate.into_inner() {
        Some(duplicate) => duplicate_error(&track.path(), duplicate, at),
        None => Error::Syntax {
            format,
            message: message.trim_end().to_owned(),
        },
    })
}

/// A key written twice in one YAML or JSON map, placed by its path.
fn duplicate_error(path: &KeyPath, duplicate: Duplicate, at: Option<(usize, usize)>) -> Error {
    let segments: Vec<&Segment> = path.iter().collect();
    let in_policy = matches!(
        segments.as_slice(),
        [Segment::Map { key: top }, Segment::Seq { .. }, Segment::Map { .. }] if top == "policies"
    );
    let at = at.map_or_else(String::new, |(line, column)| {
        format!(" (the second at line {line} column {column})")
    });
    Error::Invalid {
        location: path.to_string(),
        policy: if in_policy { duplicate.name } else { None },
        problem: format!(
            "`{}` is written twice in {}{at}",
            duplicate.key,
            if in_policy { "this policy" } else { "one map" }
        ),
        fix: format!(
            "keep one `{}` and remove the other: a key is written once in a map",
            duplicate.key
        ),
    }
}

/// Where a TOML line is: the table of the last header above it, how many
/// `[[policies]]` headers came before, and where that table's lines begin.
struct TomlSection<'a> {
    table: Option<&'a str>,
    policies: usize,
    start: usize,
}

impl<'a> TomlSection<'a> {
    fn of(text: &'a str, line_start: usize) -> Self {
        let mut section = Self {
            table: None,
            policies: 0,
            start: 0,
        };
        let mut offset = 0;
        for line in text[..line_start].split_inclusive('\n') {
            offset += line.len();
            let header = line.split('#').next().unwrap_or("").trim();
            let name = match header.strip_prefix("[[").and_then(|h| h.strip_suffix("]]")) {
                Some(name) => {
                    if name.trim() == "policies" {
                        section.policies += 1;
                    }
                    name
                }
                None => match header.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
                    Some(name) => name,
                    None => continue,
                },
            };
            section.table = Some(name.trim());
            section.start = offset;
        }
        section
    }

    /// The name of the policy whose lines run from the section's start to
    /// `line_start`, when they parse on their own and give one.
    fn policy_name(&self, text: &str, line_start: usize) -> Option<String> {
        if self.table != Some("policies") {
            return None;
        }
        let lines = text.get(self.start..line_start)?;
        let table = toml::from_str::<toml::Table>(lines).ok()?;
        table.get("name")?.as_str().map(str::to_owned)
    }
}

/// A TOML key written twice: the parser stops at the second one. Placed
/// at `policies[i].key` when it is in the i-th `[[policies]]` table, with
/// the policy's name when the lines before it give one; otherwise at the
/// key, or the table it is in.
fn toml_duplicate(e: &toml::de::Error, text: &str) -> Error {
    let span = e.span().unwrap_or(0..0);
    let key = text.get(span.clone()).unwrap_or("").trim();
    let key = key.trim_matches(|c| c == '"' || c == '\'');
    let (line, column) = line_column(text, span.start);
    let line_start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
    let before_key = text[line_start..span.start].trim();
    let section = TomlSection::of(text, line_start);
    let in_table = |key: &str| match section.table {
        Some(table) => format!("{table}.{key}"),
        None => key.to_owned(),
    };
    let at = format!(" (the second at line {line} column {column})");
    let (location, policy, problem) = if before_key.starts_with('[') {
        // A table header naming a table already defined.
        (
            key.to_owned(),
            None,
            format!("the table `{key}` is defined twice{at}"),
        )
    } else if !before_key.is_empty() {
        // Inside an inline table: placed at the key the line assigns, if
        // it starts with one.
        let outer = before_key
            .split_once('=')
            .map(|(k, _)| k.trim())
            .filter(|k| !k.is_empty() && !k.contains(['{', '[', ',']));
        (
            outer.map_or_else(
                || section.table.unwrap_or("(top level)").to_owned(),
                in_table,
            ),
            None,
            format!("`{key}` is written twice in one table{at}"),
        )
    } else if section.table == Some("policies") {
        (
            format!("policies[{}].{key}", section.policies.saturating_sub(1)),
            section.policy_name(text, line_start),
            format!("`{key}` is written twice in this policy{at}"),
        )
    } else {
        (
            in_table(key),
            None,
            format!("`{key}` is written twice in one table{at}"),
        )
    };
    Error::Invalid {
        location,
        policy,
        problem,
        fix: format!("keep one `{key}` and remove the other: a key is written once in a table"),
    }
}

/// A TOML number too large for the parser's integers (beyond 2^128), at
/// the field `path` names.
fn toml_overflow(e: &toml::de::Error, text: &str, path: &KeyPath) -> Error {
    let span = e.span().unwrap_or(0..0);
    let (line, column) = line_column(text, span.start);
    let line_start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
    let section = TomlSection::of(text, line_start);
    let field = match path.iter().next_back() {
        Some(Segment::Map { key }) => key.as_str(),
        _ => "policies",
    };
    let literal = text.get(span).unwrap_or("the number").trim();
    Error::Invalid {
        location: path.to_string(),
        policy: section.policy_name(text, line_start),
        problem: format!(
            "{} at line {line} column {column}",
            crate::raw::too_large(literal)
        ),
        fix: crate::build::fix_for(field),
    }
}

/// A value of the file, with only what the early checks need.
#[derive(Debug)]
pub(crate) enum Tree {
    Null,
    Bool,
    Number,
    Str(String),
    Seq(Vec<Tree>),
    Map(BTreeMap<String, Tree>),
}

impl Tree {
    /// The value under `key`, in a map.
    pub(crate) fn get(&self, key: &str) -> Option<&Tree> {
        match self {
            Self::Map(map) => map.get(key),
            _ => None,
        }
    }

    /// The `index`-th value, in a list.
    pub(crate) fn at(&self, index: usize) -> Option<&Tree> {
        match self {
            Self::Seq(items) => items.get(index),
            _ => None,
        }
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    /// What the value is, for messages: "a list", "a map".
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Null => "empty",
            Self::Bool => "a boolean",
            Self::Number => "a number",
            Self::Str(_) => "a string",
            Self::Seq(_) => "a list",
            Self::Map(_) => "a map",
        }
    }
}

/// A key written twice in one map, as found while reading the tree.
#[derive(Debug, Clone)]
pub(crate) struct Duplicate {
    /// The key.
    pub(crate) key: String,
    /// The map's `name`, when it had a string one before the second key.
    pub(crate) name: Option<String>,
}

/// Reads a [`Tree`], recording in `duplicate` the key that stopped it, if
/// one did.
#[derive(Clone, Copy)]
pub(crate) struct TreeSeed<'a> {
    pub(crate) duplicate: &'a RefCell<Option<Duplicate>>,
}

impl<'de> DeserializeSeed<'de> for TreeSeed<'_> {
    type Value = Tree;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Tree, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TreeSeed<'_> {
    type Value = Tree;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Tree, E> {
        Ok(Tree::Bool)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Tree, E> {
        Ok(Tree::Number)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Tree, E> {
        Ok(Tree::Number)
    }
    fn visit_i128<E>(self, _: i128) -> Result<Tree, E> {
        Ok(Tree::Number)
    }
    fn visit_u128<E>(self, _: u128) -> Result<Tree, E> {
        Ok(Tree::Number)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Tree, E> {
        Ok(Tree::Number)
    }
    fn visit_str<E>(self, v: &str) -> Result<Tree, E> {
        Ok(Tree::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Tree, E> {
        Ok(Tree::Str(v))
    }
    fn visit_unit<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }
    fn visit_none<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Tree, D::Error> {
        self.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Tree::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut entries = BTreeMap::new();
        while let Some(key) = map.next_key_seed(KeySeed {
            seen: &entries,
            duplicate: self.duplicate,
        })? {
            let value = map.next_value_seed(self)?;
            entries.insert(key, value);
        }
        Ok(Tree::Map(entries))
    }
}

/// A map key, refused when the map already has it. The error is raised
/// while the key itself is read, so the parser places it at the second key.
struct KeySeed<'a> {
    seen: &'a BTreeMap<String, Tree>,
    duplicate: &'a RefCell<Option<Duplicate>>,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for KeySeed<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        if self.seen.contains_key(v) {
            *self.duplicate.borrow_mut() = Some(Duplicate {
                key: v.to_owned(),
                name: self
                    .seen
                    .get("name")
                    .and_then(Tree::as_str)
                    .map(str::to_owned),
            });
            return Err(E::custom(format_args!("`{v}` is written twice")));
        }
        Ok(v.to_owned())
    }
}
