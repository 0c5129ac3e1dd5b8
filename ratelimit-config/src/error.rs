//! What went wrong with a policy file, where, and what to change.

use std::fmt;
use std::path::PathBuf;

use crate::Format;

/// The error of reading a policy file, distinct from [`ratelimit_core::ConfigError`].
///
/// The file could not be read, parsed or turned into quotas.
///
/// `ratelimit_core::ConfigError` (re-exported as `exactlimit::ConfigError`)
/// is what a quota constructor or a limiter builder returns for values that
/// cannot be used, whoever wrote them. This `Error` (re-exported as
/// `exactlimit::config::Error`) is about a file: it says where in the file
/// the problem is and what to write instead. When a constructor refuses a
/// file's values, its `ConfigError` message becomes the
/// [`Error::Invalid`] problem, placed at the field it is about.
///
/// [`Error::Invalid`] names the place (`policies[2].burst`), the policy when
/// it has a name, the problem, and what to write instead:
///
/// ```text
/// policies[1].burst (policy "api"): burst must be greater than zero; fix: burst is the most tokens the bucket holds, a whole number of at least 1, e.g. 20
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file name does not say which format it is in.
    #[error(
        "cannot tell the format of {}: name it *.toml, *.yaml, *.yml or *.json, \
         or parse the text with from_toml_str, from_yaml_str or from_json_str",
        path.display()
    )]
    UnknownFormat {
        /// The file.
        path: PathBuf,
    },
    /// The text is not valid TOML, YAML or JSON at all.
    #[error("not valid {format}: {message}")]
    Syntax {
        /// The format the text was read as.
        format: Format,
        /// The parser's message, with its line and column.
        message: String,
    },
    /// The text nests deeper than [`MAX_DEPTH`](crate::MAX_DEPTH) maps and
    /// lists, found by a scan of the text before any parser reads it (a
    /// policy file nests 3 levels; the YAML parser's time grows with the
    /// square of the depth).
    #[error(
        "not read: the {format} text nests deeper than {limit} levels of maps and lists at \
         line {line} column {column}; a policy file nests 3 (the file, the list of policies, \
         a policy)"
    )]
    TooDeep {
        /// The format the text was read as.
        format: Format,
        /// The deepest nesting accepted, [`MAX_DEPTH`](crate::MAX_DEPTH).
        limit: usize,
        /// Line (from 1) of the first map or list past the limit.
        line: usize,
        /// Column (from 1, in characters) of that map or list.
        column: usize,
    },
    /// The text is well formed, but a value is missing, unknown, written
    /// twice or unusable.
    #[error("{}", Located(.location, .policy.as_deref(), .problem, .fix))]
    Invalid {
        /// Where: `policies[2].burst`, `policies[0]`, or `policies`.
        location: String,
        /// The name of the policy, when it has one.
        policy: Option<String>,
        /// What is wrong.
        problem: String,
        /// What to change.
        fix: String,
    },
}

struct Located<'a>(&'a str, Option<&'a str>, &'a str, &'a str);

impl fmt::Display for Located<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Located(location, policy, problem, fix) = *self;
        f.write_str(location)?;
        if let Some(name) = policy {
            write!(f, " (policy {name:?})")?;
        }
        write!(f, ": {problem}")?;
        if !fix.is_empty() {
            write!(f, "; fix: {fix}")?;
        }
        Ok(())
    }
}

impl Error {
    /// Where the problem is (`policies[2].burst`), for [`Error::Invalid`].
    pub fn location(&self) -> Option<&str> {
        match self {
            Self::Invalid { location, .. } => Some(location),
            _ => None,
        }
    }

    /// The name of the policy at fault, when known.
    pub fn policy(&self) -> Option<&str> {
        match self {
            Self::Invalid { policy, .. } => policy.as_deref(),
            _ => None,
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
