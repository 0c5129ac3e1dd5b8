//! [`Arg`]: one script argument, kept as what it is until a client writes
//! it.
//!
//! Nearly every argument of a script call is an integer (a deadline, a
//! cost, a limit, a window). Kept as numbers, both clients write them
//! straight into the command's buffer: redis-rs formats each with `itoa`
//! in place, fred sends an integer value as a bulk string. Made into
//! `String`s first, each would cost an allocation (and, with fred, two
//! more: a copy, and the shared buffer the copy becomes when the command
//! is framed).

use std::fmt;

/// One argument of a script call (see the module docs). Compares equal to
/// the text it is sent as (`Arg::Int(7) == "7"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    /// An integer, sent in decimal.
    Int(i64),
    /// A fixed text: a code such as the batch script's `"1"`, or `""`.
    Static(&'static str),
    /// A text made for this call (the batch's deadlines, space-separated).
    Text(String),
}

impl Arg {
    /// An upper bound on the bytes this argument is sent as: what a
    /// command's buffer reserves for it.
    pub fn len_hint(&self) -> usize {
        match self {
            // "-9223372036854775808".
            Self::Int(_) => 20,
            Self::Static(s) => s.len(),
            Self::Text(s) => s.len(),
        }
    }

    /// Calls `f` with the bytes this argument is sent as (an integer is
    /// formatted on the stack).
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            Self::Int(n) => f(itoa::Buffer::new().format(*n).as_bytes()),
            Self::Static(s) => f(s.as_bytes()),
            Self::Text(s) => f(s.as_bytes()),
        }
    }
}

impl From<i64> for Arg {
    fn from(n: i64) -> Self {
        Self::Int(n)
    }
}

impl From<u64> for Arg {
    /// An integer; above `i64::MAX` (never a quota's number: they stay
    /// below 2^53), its decimal text.
    fn from(n: u64) -> Self {
        i64::try_from(n).map_or_else(
            |_| Self::Text(itoa::Buffer::new().format(n).to_owned()),
            Self::Int,
        )
    }
}

impl From<usize> for Arg {
    fn from(n: usize) -> Self {
        Self::from(u64::try_from(n).unwrap_or(u64::MAX))
    }
}

impl From<u128> for Arg {
    fn from(n: u128) -> Self {
        i64::try_from(n).map_or_else(
            |_| Self::Text(itoa::Buffer::new().format(n).to_owned()),
            Self::Int,
        )
    }
}

impl fmt::Display for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(n) => f.write_str(itoa::Buffer::new().format(*n)),
            Self::Static(s) => f.write_str(s),
            Self::Text(s) => f.write_str(s),
        }
    }
}

impl PartialEq<str> for Arg {
    fn eq(&self, other: &str) -> bool {
        self.with_bytes(|b| b == other.as_bytes())
    }
}

impl PartialEq<&str> for Arg {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl PartialEq<String> for Arg {
    fn eq(&self, other: &String) -> bool {
        *self == **other
    }
}

impl redis::ToRedisArgs for Arg {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        self.with_bytes(|b| out.write_arg(b));
    }
}

impl redis::ToSingleRedisArg for Arg {}

#[cfg(feature = "fred")]
impl From<&Arg> for fred::types::Value {
    /// An integer as fred's integer value (sent as a bulk string, written
    /// into the frame without a string of its own), a fixed text without a
    /// copy.
    fn from(arg: &Arg) -> Self {
        match arg {
            Arg::Int(n) => Self::Integer(*n),
            Arg::Static(s) => Self::Bytes(fred::bytes::Bytes::from_static(s.as_bytes())),
            Arg::Text(s) => Self::from(s.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_argument_is_sent_as_its_decimal_or_its_text() {
        assert_eq!(Arg::Int(-17), "-17");
        assert_eq!(Arg::from(7_u64), Arg::Int(7));
        assert_eq!(Arg::from(u64::MAX), "18446744073709551615");
        assert_eq!(Arg::Static(""), "");
        assert_eq!(Arg::Text("0 5 7".to_owned()), "0 5 7");
        assert_ne!(Arg::Int(1), "10");
        assert_eq!(Arg::Int(i64::MIN).to_string().len(), Arg::Int(0).len_hint());
        let mut cmd = redis::cmd("X");
        cmd.arg(&[Arg::Int(42), Arg::Static("a")][..]);
        let packed = String::from_utf8(cmd.get_packed_command()).unwrap();
        assert_eq!(packed, "*3\r\n$1\r\nX\r\n$2\r\n42\r\n$1\r\na\r\n");
    }
}
