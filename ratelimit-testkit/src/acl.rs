//! ACL users for tests (feature `redis`): one per test, with a random name
//! and password, created with `ACL SETUSER` on the fixture's servers
//! ([`crate::redis_server::RedisServer::acl_user`],
//! [`crate::redis_cluster::RedisCluster::acl_user`]).
//!
//! The password is random per user and never shown: `Debug` prints
//! `***`, and [`AclUser::password`] is for handing it to a client and for
//! the tests that check no message or log line contains it.

use std::fmt;

/// An ACL user: its name and its random password.
#[derive(Clone)]
pub struct AclUser {
    name: String,
    password: String,
}

impl fmt::Debug for AclUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AclUser")
            .field("name", &self.name)
            .field("password", &"***")
            .finish()
    }
}

impl AclUser {
    /// A new user name (`rltest-<hex>`) and a random 32-hex-digit password
    /// (not created on any server yet).
    pub fn random() -> Self {
        Self {
            name: format!("rltest-{:08x}", rand::random::<u32>()),
            password: format!("{:032x}", rand::random::<u128>()),
        }
    }

    /// The user's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The password: for the client, and for checking that no message
    /// holds it.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// `url` (`redis://host:port/...`) with this user and its password.
    pub fn url(&self, url: &str) -> String {
        match url.split_once("://") {
            Some((scheme, rest)) => format!("{scheme}://{}:{}@{rest}", self.name, self.password),
            None => url.to_owned(),
        }
    }

    /// Creates (or resets) the user on the server behind `conn` with
    /// `rule` (ACL SETUSER's rules after the name, such as
    /// `resetkeys ~rl:* -@all +get`):
    /// `ACL SETUSER <name> reset on ><password> <rule>`.
    ///
    /// # Panics
    ///
    /// When the server refuses it.
    pub fn create(&self, conn: &mut redis::Connection, rule: &str) {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER")
            .arg(&self.name)
            .arg("reset")
            .arg("on")
            .arg(format!(">{}", self.password));
        for part in rule.split_whitespace() {
            cmd.arg(part);
        }
        let _: () = cmd
            .query(conn)
            .unwrap_or_else(|e| panic!("ACL SETUSER {} ... {rule}: {e}", self.name));
    }
}
