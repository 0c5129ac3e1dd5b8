//! The fred configuration and set-up commands of a store built over fred
//! (feature `fred`): [`crate::RedisStoreBuilder::build_fred`] uses them,
//! and the cluster store's builder shares them ([`config`]).

use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::config::{Config, ReconnectPolicy, Server, ServerConfig, TlsConfig, TlsConnector};
use fred::types::{ClusterHash, CustomCommand, Value};
use ratelimit_core::StoreError;
use redis::{ConnectionAddr, IntoConnectionInfo};

use crate::tls::{Security, redacted};

/// Where a fred client connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One node.
    Centralized,
    /// A Redis Cluster (the URLs are seeds).
    Clustered,
    /// The primary of a master name, through the sentinels (the URLs).
    Sentinel,
}

/// A fred client for `urls` (one node, a cluster's seeds, or the
/// sentinels, as `topology` says; for Sentinel `master` is the master
/// name) with `security`'s credentials and TLS files, the timeouts given,
/// one attempt per command, and reconnection every 25 ms to 100 ms.
/// Returns the client (not yet connected: `init()` it), whether it uses
/// TLS, and the ACL user.
pub fn config(
    urls: &[String],
    topology: Topology,
    master: &str,
    security: &Security,
    connection_timeout: Duration,
    response_timeout: Duration,
) -> Result<(Client, bool, String), StoreError> {
    let mut hosts = Vec::new();
    let mut tls = false;
    let mut user = None;
    let mut password = None;
    let mut db = 0;
    for url in urls {
        let info = url.as_str().into_connection_info().map_err(|e| {
            StoreError::message(format!("invalid Redis URL {}: {e}", redacted(url)), false)
        })?;
        match info.addr() {
            ConnectionAddr::Tcp(host, port) => hosts.push(Server::new(host.clone(), *port)),
            ConnectionAddr::TcpTls { host, port, .. } => {
                tls = true;
                hosts.push(Server::new(host.clone(), *port));
            }
            _ => {
                return Err(StoreError::message(
                    format!("{}: only TCP URLs are supported", redacted(url)),
                    false,
                ));
            }
        }
        let settings = info.redis_settings();
        user = user.or(settings.username().map(str::to_owned));
        password = password.or(settings.password().map(str::to_owned));
        db = settings.db();
    }
    if hosts.is_empty() {
        return Err(StoreError::message("no Redis URL given", false));
    }
    if !tls && security.has_tls_files() {
        return Err(StoreError::message(
            "TLS files were given but the URLs are not TLS URLs: use rediss://",
            false,
        ));
    }
    let (node_user, node_password) = match topology {
        // The sentinels' credentials are their URLs'; the nodes' the
        // builder's.
        Topology::Sentinel => (
            security.username.clone(),
            security.password.as_ref().map(|p| p.expose().to_owned()),
        ),
        _ => (
            security.username.clone().or(user.clone()),
            security
                .password
                .as_ref()
                .map(|p| p.expose().to_owned())
                .or(password.clone()),
        ),
    };
    let server = match topology {
        Topology::Centralized => ServerConfig::Centralized {
            server: hosts.swap_remove(0),
        },
        Topology::Clustered => ServerConfig::Clustered {
            hosts,
            policy: Default::default(),
        },
        Topology::Sentinel => ServerConfig::Sentinel {
            hosts,
            service_name: master.to_owned(),
            username: user,
            password,
        },
    };
    let tls_config = if tls {
        let rustls = security.rustls_config()?;
        Some(TlsConfig::from(TlsConnector::from(rustls)))
    } else {
        None
    };
    let config = Config {
        server,
        username: node_user.clone(),
        password: node_password,
        database: (db != 0).then(|| u8::try_from(db).unwrap_or(0)),
        tls: tls_config,
        fail_fast: true,
        ..Config::default()
    };
    let client = fred::types::Builder::from_config(config)
        .with_connection_config(|c| {
            c.connection_timeout = connection_timeout;
            c.internal_command_timeout = connection_timeout.max(Duration::from_millis(500));
            c.max_command_attempts = 1;
        })
        .with_performance_config(|p| {
            p.default_command_timeout = response_timeout;
        })
        .set_policy(ReconnectPolicy::new_exponential(0, 25, 100, 2))
        .build()
        .map_err(|e| StoreError::message(format!("invalid fred settings: {e}"), false))?;
    Ok((
        client,
        tls,
        node_user.unwrap_or_else(|| "default".to_owned()),
    ))
}

/// One set-up command through fred, bounded by `wait`.
pub async fn command(
    client: &Client,
    node: &str,
    wait: Duration,
    name: &'static str,
    args: Vec<Value>,
) -> Result<Value, StoreError> {
    let cmd = CustomCommand::new_static(name, ClusterHash::Random, false);
    match tokio::time::timeout(wait, client.custom::<Value, _>(cmd, args)).await {
        Ok(reply) => reply.map_err(crate::error::from_fred),
        Err(_) => Err(StoreError::message(
            format!("no reply from {node} within {wait:?} (the response timeout)"),
            true,
        )),
    }
}

/// Runs [`crate::acl::PROBE`] (and `EVAL`) and reports the first denial.
pub async fn probe(
    client: &Client,
    node: &str,
    wait: Duration,
    prefix: &str,
) -> Result<(), StoreError> {
    command(
        client,
        node,
        wait,
        "EVAL",
        vec!["return 1".into(), 0_i64.into()],
    )
    .await?;
    let key = crate::acl::probe_key(prefix);
    let slot = fred::util::redis_keyslot(key.as_bytes());
    let cmd = CustomCommand::new_static("EVAL", ClusterHash::Custom(slot), false);
    let args: Vec<Value> = vec![crate::acl::PROBE.into(), 1_i64.into(), key.into()];
    let reply = match tokio::time::timeout(wait, client.custom::<Value, _>(cmd, args)).await {
        Ok(r) => r.map_err(crate::error::from_fred)?,
        Err(_) => {
            return Err(StoreError::message(
                format!("no reply from {node} within {wait:?} (the response timeout)"),
                true,
            ));
        }
    };
    if let Value::Array(denied) = reply
        && let Some(first) = denied.first().and_then(|v| v.as_string())
    {
        return Err(StoreError::message(first, false));
    }
    Ok(())
}
