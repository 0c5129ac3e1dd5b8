//! A store over fred through Sentinel (feature `fred`): the primary the
//! store's own watcher follows, and one centralized fred client to it.

use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use ratelimit_core::StoreError;

use crate::fred_build::{Topology, config};
use crate::tls::Security;

/// The primary of a master name, for a store over fred: found and
/// followed across promotions by the store's own Sentinel watcher
/// ([`crate::sentinel`]: it asks the sentinels and the replicas they know,
/// every 10 ms while it has none that answers), with one centralized fred
/// client to it, replaced when the watcher names another node. fred's own
/// Sentinel client learns of a promotion only from the sentinels, which
/// may take up to a second after the replica answers as a primary.
pub(crate) struct FredPrimary {
    primary: Arc<crate::sentinel::Primary>,
    security: Security,
    connection_timeout: Duration,
    response_timeout: Duration,
    current: std::sync::Mutex<Option<(Arc<str>, Client)>>,
    connecting: tokio::sync::Mutex<()>,
}

impl FredPrimary {
    /// Follows `primary` (the store's Sentinel watcher), connecting to it
    /// with `security` and the timeouts given.
    pub(crate) fn new(
        primary: Arc<crate::sentinel::Primary>,
        security: Security,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        Self {
            primary,
            security,
            connection_timeout,
            response_timeout,
            current: std::sync::Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    /// The primary now (`host:port`): the calls' failure domain.
    pub(crate) fn node(&self) -> Arc<str> {
        self.primary.node()
    }

    /// A call failed with `err`: the watcher looks for the primary when a
    /// failover explains it.
    pub(crate) fn failed(&self, err: &StoreError) {
        self.primary.failed(err);
    }

    fn cached(&self, node: &str) -> Option<Client> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        match &*current {
            Some((n, c)) if **n == *node => Some(c.clone()),
            _ => None,
        }
    }

    /// The fred client to the primary now, connected first when the
    /// primary moved (the old client is closed in the background).
    pub(crate) async fn client(&self) -> Result<Client, StoreError> {
        let node = self.primary.node();
        if let Some(c) = self.cached(&node) {
            return Ok(c);
        }
        let _one = self.connecting.lock().await;
        let node = self.primary.node();
        if let Some(c) = self.cached(&node) {
            return Ok(c);
        }
        let scheme = if self.primary.tls() {
            "rediss"
        } else {
            "redis"
        };
        let (client, _, _) = config(
            &[format!("{scheme}://{node}/")],
            Topology::Centralized,
            "",
            &self.security,
            self.connection_timeout,
            self.response_timeout,
        )?;
        let wait = self.connection_timeout * 4 + self.response_timeout;
        match tokio::time::timeout(wait, client.init()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(StoreError::backend(
                    format!("cannot reach {node}: {e}"),
                    true,
                    e,
                ));
            }
            Err(_) => {
                let _ = client.quit().await;
                return Err(StoreError::message(
                    format!("cannot reach {node}: no connection within {wait:?}"),
                    true,
                ));
            }
        }
        let old = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace((node, client.clone()));
        if let Some((_, old)) = old {
            tokio::spawn(async move {
                let _ = old.quit().await;
            });
        }
        Ok(client)
    }
}
