#![doc = include_str!("../README.md")]

mod build;
mod depth;
mod error;
mod raw;
mod tree;
mod units;

use std::fmt;
use std::path::Path;

use ratelimit_core::{LimiterBuilder, Quota};
use serde_path_to_error::Segment;

pub use depth::MAX_DEPTH;
pub use error::{Error, Result};

use raw::RawFile;
use tree::Tree;

/// One policy of a file: its quota, and whether it is a shadow (dry-run)
/// quota.
///
/// A file marks a shadow policy with `shadow = true` (the default is
/// `false`). Add policies to a limiter with [`add_policies`] or
/// [`Policy::add_to`], which call
/// [`LimiterBuilder::quota`] or [`LimiterBuilder::shadow_quota`] as the flag
/// says.
///
/// ```
/// use ratelimit_config::Policy;
/// let policies = ratelimit_config::policies_from_toml_str(r#"
///     [[policies]]
///     name = "api"
///     algorithm = "token_bucket"
///     rate = "100/min"
///     burst = 20
///
///     [[policies]]
///     name = "api-trial"
///     algorithm = "token_bucket"
///     rate = "50/min"
///     burst = 10
///     shadow = true
/// "#)?;
/// for Policy { quota, shadow, .. } in &policies {
///     println!("{}: {}", quota.name(), if *shadow { "shadow" } else { "enforced" });
/// }
/// assert!(!policies[0].shadow && policies[1].shadow);
/// # Ok::<(), ratelimit_config::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Policy {
    /// The quota, built by `ratelimit-core`'s constructors and named.
    pub quota: Quota,
    /// Whether the quota is a shadow (dry-run) quota: decided and counted,
    /// but its denial never denies a call (see
    /// [`LimiterBuilder::shadow_quota`]).
    pub shadow: bool,
}

impl Policy {
    /// A policy: an enforced quota when `shadow` is `false`, a shadow
    /// (dry-run) one when it is `true`.
    pub fn new(quota: Quota, shadow: bool) -> Self {
        Self { quota, shadow }
    }

    /// Adds the quota to `builder`: with [`LimiterBuilder::shadow_quota`]
    /// for a shadow policy, [`LimiterBuilder::quota`] otherwise.
    pub fn add_to(self, builder: LimiterBuilder) -> LimiterBuilder {
        if self.shadow {
            builder.shadow_quota(self.quota)
        } else {
            builder.quota(self.quota)
        }
    }
}

/// Adds every policy to `builder`, in order, each with
/// [`LimiterBuilder::quota`] or, for a shadow policy,
/// [`LimiterBuilder::shadow_quota`]. See the crate's documentation for an
/// example.
pub fn add_policies(
    builder: LimiterBuilder,
    policies: impl IntoIterator<Item = Policy>,
) -> LimiterBuilder {
    policies
        .into_iter()
        .fold(builder, |builder, policy| policy.add_to(builder))
}

/// The three formats a policy file may be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// TOML (`*.toml`).
    Toml,
    /// YAML (`*.yaml`, `*.yml`).
    Yaml,
    /// JSON (`*.json`).
    Json,
}

impl Format {
    /// The format a file name's extension says, if any (case-insensitive).
    ///
    /// ```
    /// use ratelimit_config::Format;
    /// assert_eq!(Format::from_path("conf/policies.yml"), Some(Format::Yaml));
    /// assert_eq!(Format::from_path("policies.txt"), None);
    /// ```
    pub fn from_path(path: impl AsRef<Path>) -> Option<Self> {
        let ext = path.as_ref().extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "toml" => Some(Self::Toml),
            "yaml" | "yml" => Some(Self::Yaml),
            "json" => Some(Self::Json),
            _ => None,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Toml => "TOML",
            Self::Yaml => "YAML",
            Self::Json => "JSON",
        })
    }
}

/// Reads a policy file, choosing the format by its extension (`.toml`,
/// `.yaml`/`.yml`, `.json`), as enforced quotas.
///
/// A file with a shadow policy (`shadow = true`) is refused, with an error
/// that says to read it with [`policies_from_path`]: returned as a plain
/// `Quota`, a dry-run limit would be enforced. The other functions that
/// return quotas (`from_str`, `from_toml_str`, ...) refuse it the same way.
pub fn from_path(path: impl AsRef<Path>) -> Result<Vec<Quota>> {
    enforced_only(policies_from_path(path)?)
}

/// Reads a policy file, choosing the format by its extension (`.toml`,
/// `.yaml`/`.yml`, `.json`), as policies with their shadow flag.
pub fn policies_from_path(path: impl AsRef<Path>) -> Result<Vec<Policy>> {
    let path = path.as_ref();
    let format = Format::from_path(path).ok_or_else(|| Error::UnknownFormat {
        path: path.to_owned(),
    })?;
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    policies_from_str(&text, format)
}

/// Reads policies from TOML text.
///
/// ```
/// let quotas = ratelimit_config::from_toml_str(r#"
///     [[policies]]
///     name = "api"
///     algorithm = "token_bucket"
///     rate = "100/min"
///     burst = 20
/// "#)?;
/// assert_eq!(quotas[0].name(), "api");
/// # Ok::<(), ratelimit_config::Error>(())
/// ```
pub fn from_toml_str(text: &str) -> Result<Vec<Quota>> {
    from_str(text, Format::Toml)
}

/// Reads policies, with their shadow flag, from TOML text.
pub fn policies_from_toml_str(text: &str) -> Result<Vec<Policy>> {
    policies_from_str(text, Format::Toml)
}

/// Reads policies from YAML text.
///
/// ```
/// let quotas = ratelimit_config::from_yaml_str("
/// policies:
///   - name: login
///     algorithm: sliding_log
///     limit: 5
///     window: 15m
/// ")?;
/// assert_eq!(quotas[0].window(), std::time::Duration::from_secs(900));
/// # Ok::<(), ratelimit_config::Error>(())
/// ```
pub fn from_yaml_str(text: &str) -> Result<Vec<Quota>> {
    from_str(text, Format::Yaml)
}

/// Reads policies, with their shadow flag, from YAML text.
pub fn policies_from_yaml_str(text: &str) -> Result<Vec<Policy>> {
    policies_from_str(text, Format::Yaml)
}

/// Reads policies from JSON text.
///
/// ```
/// let quotas = ratelimit_config::from_json_str(r#"{"policies": [
///     {"name": "search", "algorithm": "sliding_window", "limit": 100, "window": "1m"}
/// ]}"#)?;
/// assert_eq!(quotas[0].limit(), 100);
/// # Ok::<(), ratelimit_config::Error>(())
/// ```
pub fn from_json_str(text: &str) -> Result<Vec<Quota>> {
    from_str(text, Format::Json)
}

/// Reads policies, with their shadow flag, from JSON text.
pub fn policies_from_json_str(text: &str) -> Result<Vec<Policy>> {
    policies_from_str(text, Format::Json)
}

/// Reads policies from text in the given format, as enforced quotas (a
/// shadow policy is refused: see [`from_path`]).
pub fn from_str(text: &str, format: Format) -> Result<Vec<Quota>> {
    enforced_only(policies_from_str(text, format)?)
}

/// The quotas of policies that are all enforced; the first shadow policy,
/// if any, as an error saying which function reads it.
fn enforced_only(policies: Vec<Policy>) -> Result<Vec<Quota>> {
    if let Some((index, policy)) = policies.iter().enumerate().find(|(_, p)| p.shadow) {
        return Err(Error::Invalid {
            location: format!("policies[{index}].shadow"),
            policy: Some(policy.quota.name().to_owned()),
            problem: "a shadow (dry-run) policy, which this function cannot return: it returns \
                      plain quotas, which a limiter would enforce"
                .to_owned(),
            fix: "read the file with ratelimit_config::policies_from_path (or \
                  policies_from_str) and add the policies with \
                  ratelimit_config::add_policies, which adds a shadow policy with \
                  LimiterBuilder::shadow_quota; or remove `shadow = true` to enforce it"
                .to_owned(),
        });
    }
    Ok(policies.into_iter().map(|p| p.quota).collect())
}

/// Reads policies, with their shadow flag, from text in the given format.
///
/// Text nesting deeper than [`MAX_DEPTH`] maps and lists is refused
/// ([`Error::TooDeep`]) before any parser reads it.
pub fn policies_from_str(text: &str, format: Format) -> Result<Vec<Policy>> {
    if let Some(offset) = depth::too_deep(text, format, MAX_DEPTH) {
        let (line, column) = line_column(text, offset);
        return Err(Error::TooDeep {
            format,
            limit: MAX_DEPTH,
            line,
            column,
        });
    }
    // First as a plain tree: syntax errors, keys written twice, and the
    // policy names that make later messages easier to place.
    let tree = tree::read(text, format)?;
    check_shape(&tree)?;
    // Then as policies, through the format's own deserializer so that
    // messages keep their line and column.
    let raw: Result<RawFile, Error> = match format {
        Format::Toml => match toml::de::Deserializer::parse(text) {
            Ok(de) => serde_path_to_error::deserialize(de)
                .map_err(|e| located(&e, toml_message(e.inner(), text), &tree)),
            Err(e) => Err(Error::Syntax {
                format,
                message: toml_message(&e, text),
            }),
        },
        Format::Yaml => serde_path_to_error::deserialize(serde_norway::Deserializer::from_str(
            text,
        ))
        .map_err(|e| {
            // serde_norway puts the path in front of its message; ours
            // is already there.
            let message = e.inner().to_string();
            let prefix = format!("{}: ", e.path());
            let problem = message.strip_prefix(&prefix).unwrap_or(&message).to_owned();
            located(&e, problem, &tree)
        }),
        Format::Json => {
            let mut de = serde_json::Deserializer::from_str(text);
            serde_path_to_error::deserialize(&mut de)
                .map_err(|e| located(&e, e.inner().to_string(), &tree))
        }
    };
    build::build(raw?)
}

/// Maps where maps belong: serde would also read a struct from a list of
/// its values, which no one writes on purpose.
fn check_shape(tree: &Tree) -> Result<()> {
    if !matches!(tree, Tree::Map(_) | Tree::Null) {
        return Err(Error::Invalid {
            location: "(top level)".into(),
            policy: None,
            problem: format!("the file is {}, not a map", tree.kind()),
            fix: build::fix_for("policies"),
        });
    }
    if let Some(Tree::Seq(list)) = tree.get("policies")
        && let Some((index, item)) = list
            .iter()
            .enumerate()
            .find(|(_, p)| !matches!(p, Tree::Map(_)))
    {
        return Err(Error::Invalid {
            location: format!("policies[{index}]"),
            policy: None,
            problem: format!("the policy is {}, not a map", item.kind()),
            fix: build::FIELDS.to_owned(),
        });
    }
    Ok(())
}

/// A deserialization error, placed at `policies[i].field` with the policy's
/// name when the tree has one.
fn located<E>(e: &serde_path_to_error::Error<E>, problem: String, tree: &Tree) -> Error {
    let mut index = None;
    let mut field = None;
    for segment in e.path().iter() {
        match segment {
            Segment::Seq { index: i } if index.is_none() => index = Some(*i),
            Segment::Map { key } => field = Some(key.clone()),
            _ => {}
        }
    }
    let policy = index
        .and_then(|i| tree.get("policies")?.at(i)?.get("name")?.as_str())
        .map(str::to_owned);
    let location = match e.path().to_string() {
        root if root == "." => "(top level)".to_owned(),
        path => path,
    };
    let fix = if problem.contains("unknown field") {
        if index.is_some() {
            build::FIELDS.to_owned()
        } else {
            "the file has one top-level key, `policies`".to_owned()
        }
    } else {
        build::fix_for(field.as_deref().unwrap_or("policies"))
    };
    Error::Invalid {
        location,
        policy,
        problem: problem.trim_end().to_owned(),
        fix,
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, column)
}

/// A TOML error on one line, placed like the other formats' errors.
pub(crate) fn toml_message(e: &toml::de::Error, text: &str) -> String {
    match e.span() {
        Some(span) => {
            let (line, column) = line_column(text, span.start);
            format!("{} at line {line} column {column}", e.message().trim_end())
        }
        None => e.message().trim_end().to_owned(),
    }
}
