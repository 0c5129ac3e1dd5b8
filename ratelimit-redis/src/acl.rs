//! Least privilege: the ACL rule that lets a store run, and the check a
//! built store makes at start.
//!
//! A store needs its scripts' commands on its own keys (`<prefix>:*`),
//! the commands that send the scripts (`EVALSHA`, `EVAL` on `NOSCRIPT`,
//! `SCRIPT LOAD`), `TIME` and `PING`, the clients' connection set-up
//! (`CLIENT ID`/`CLIENT SETNAME`, `INFO` from fred (redis-rs' `CLIENT
//! SETINFO` may fail: it goes on without);  `SELECT` for a database other than 0), and on a cluster
//! `CLUSTER SLOTS`, `CLUSTER INFO` and `ASKING`. [`rule`] writes the rule;
//! [`setuser`] the whole `ACL SETUSER` command:
//!
//! ```text
//! ACL SETUSER ratelimit on >PASSWORD resetkeys ~rl:* -@all +evalsha +eval +script|load +time +ping +client|id +client|setname +info +select +get +mget +psetex +pexpire +del +zadd +zcount +zincrby +zrange +zrangebyscore +zremrangebyrank +zremrangebyscore +zscore
//! ```
//!
//! (plus `+cluster|slots +cluster|info +asking` on every node of a
//! cluster, which keeps ACL users per node). Nothing else: no key outside
//! the prefix, no admin command, and no publish or subscribe command (so
//! no channel, without `resetchannels`, which Redis 6.0 lacks).
//!
//! **The check at start.** A built store runs [`PROBE`] once on a key of
//! its own prefix (`<prefix>:{acl-probe}:check`): the script calls every
//! command the scripts use, with arguments that change nothing or write
//! only that key (deleted again, and given a 1 s expiry), and returns the
//! permission errors it met. A store whose user lacks a command, or may
//! not touch its prefix, fails to build with [`StoreError`] naming the
//! missing permission and the rule to add ([`denied`]).

use ratelimit_core::StoreError;

/// The commands the scripts call (`redis.call`), on the caller's keys.
pub const SCRIPT_COMMANDS: &[&str] = &[
    "get",
    "mget",
    "psetex",
    "pexpire",
    "del",
    "zadd",
    "zcount",
    "zincrby",
    "zrange",
    "zrangebyscore",
    "zremrangebyrank",
    "zremrangebyscore",
    "zscore",
];

/// The commands a store sends itself, and its clients' connection set-up.
pub const CLIENT_COMMANDS: &[&str] = &[
    "evalsha",
    "eval",
    "script|load",
    "time",
    "ping",
    "client|id",
    "client|setname",
    "info",
    "select",
];

/// What a cluster store sends besides: the slot map, the cluster's health
/// (fred) and `ASKING` during a slot migration.
pub const CLUSTER_COMMANDS: &[&str] = &["cluster|slots", "cluster|info", "asking"];

/// The ACL rule (after the user's name, `on` and its password) that lets
/// a store with key prefix `prefix` run, and nothing more: its keys and
/// the commands above (no publish or subscribe command: no channel).
/// Accepted by Redis 6.0 and later, and Valkey.
pub fn rule(prefix: &str, cluster: bool) -> String {
    let mut rule = format!("resetkeys ~{prefix}:* -@all");
    let extra: &[&str] = if cluster { CLUSTER_COMMANDS } else { &[] };
    for c in CLIENT_COMMANDS
        .iter()
        .chain(SCRIPT_COMMANDS.iter())
        .chain(extra.iter())
    {
        rule.push_str(" +");
        rule.push_str(c);
    }
    rule
}

/// The whole command that creates (or updates) the ACL user `user` for a
/// store with key prefix `prefix`; the password is written `>PASSWORD`, to
/// be replaced.
pub fn setuser(user: &str, prefix: &str, cluster: bool) -> String {
    format!("ACL SETUSER {user} on >PASSWORD {}", rule(prefix, cluster))
}

/// The script run once at start: every command the scripts call, on
/// `KEYS[1]` (a key of the store's prefix), with arguments that change
/// nothing, or write that key only and delete it again; returns the
/// permission errors met (empty: everything allowed).
pub const PROBE: &str = r#"
local k = KEYS[1]
local denied = {}
local function try(command, ...)
  local r = redis.pcall(command, ...)
  if type(r) == 'table' and r.err and (string.find(r.err, 'NOPERM', 1, true)
      or string.find(r.err, 'permission', 1, true)
      or string.find(r.err, "can't run", 1, true)
      or string.find(r.err, "can't access", 1, true)) then
    denied[#denied + 1] = "the '" .. string.lower(command) .. "' command: " .. r.err
  end
end
try('TIME')
try('GET', k)
try('MGET', k)
try('ZCOUNT', k, 0, 0)
try('ZRANGE', k, 0, 0)
try('ZRANGEBYSCORE', k, 0, 0)
try('ZSCORE', k, 'm')
try('ZREMRANGEBYSCORE', k, 1, 0)
try('ZREMRANGEBYRANK', k, 1, 0)
try('ZADD', k, 'XX', 0, 'm')
try('PSETEX', k, 1000, '0')
try('PEXPIRE', k, 1000)
try('DEL', k)
try('ZINCRBY', k, 0, 'm')
try('PEXPIRE', k, 1000)
try('DEL', k)
return denied
"#;

/// The key the probe runs on: in the store's prefix, its own hash tag.
pub fn probe_key(prefix: &str) -> String {
    format!("{prefix}:{{acl-probe}}:check")
}

/// Whether a server error is a permission error.
pub fn is_denied(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    message.contains("NOPERM")
        || lower.contains("no permissions")
        || lower.contains("can't run this command")
        || lower.contains("can't access")
}

/// The error of a store whose ACL user `user` was refused `what` (a
/// server's permission error): names it and the rule to add.
pub fn denied(what: &str, user: &str, prefix: &str, cluster: bool) -> StoreError {
    let what = what.trim();
    let fix = if what.contains("access") && what.contains("key") {
        format!("let it use the store's keys: ACL SETUSER {user} ~{prefix}:*")
    } else if let Some(command) = command_in(what) {
        format!("add it: ACL SETUSER {user} +{command}")
    } else {
        "add the permission it names".to_owned()
    };
    StoreError::message(
        format!(
            "the Redis ACL user {user:?} is not allowed what the rate-limit store needs: {what}. \
             Fix: {fix}; the store's whole rule is: {}",
            setuser(user, prefix, cluster)
        ),
        false,
    )
}

/// The command a permission error names (`... run the 'zadd' command`).
fn command_in(message: &str) -> Option<String> {
    let start = message.find('\'')? + 1;
    let len = message[start..].find('\'')?;
    let name = message[start..start + len].to_ascii_lowercase();
    (!name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'|' || b == b'-' || b == b'_'))
    .then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_names_the_prefix_and_every_command() {
        let r = rule("myapp:rl", false);
        assert!(r.starts_with("resetkeys ~myapp:rl:* -@all +evalsha"));
        for c in SCRIPT_COMMANDS {
            assert!(r.contains(&format!(" +{c}")), "{c}");
        }
        assert!(!r.contains("cluster"));
        assert!(rule("rl", true).contains("+cluster|slots"));
    }

    #[test]
    fn a_denial_names_the_command_and_the_rule() {
        let e = denied(
            "NOPERM User app has no permissions to run the 'zadd' command",
            "app",
            "rl",
            false,
        );
        let m = e.to_string();
        assert!(m.contains("ACL SETUSER app +zadd"), "{m}");
        assert!(m.contains("~rl:*"), "{m}");
        let e = denied("NOPERM No permissions to access a key", "app", "rl", false);
        assert!(e.to_string().contains("ACL SETUSER app ~rl:*"), "{e}");
    }
}
