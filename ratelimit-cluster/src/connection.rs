//! How the store reaches the cluster: one redis-rs connection per node
//! ([`crate::nodes`], the default), redis-rs' cluster connection (a
//! `ClusterConnection` the application brings), or one fred client per
//! node made from a clustered client the application brings
//! ([`crate::fred`]). Scripts, keys and decoding are shared; only the call
//! and its routing differ.

use std::sync::Arc;

use ratelimit_redis::decode::Integers;
use ratelimit_redis::error;
use ratelimit_redis::scripts::Call;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;

use crate::nodes::Nodes;
use crate::redis_rs::{decode_value, failure, parse_slots, script_cmd};
use crate::retry::{Addr, Failure, Next, Route};
use crate::slots::SlotMap;

/// A cluster client.
#[derive(Clone)]
pub(crate) enum Backend {
    /// redis-rs, one connection per node, routed by the store's slot map.
    Nodes(Arc<Nodes>),
    /// redis-rs `cluster-async`, routed by its own slot map.
    Redis(ClusterConnection),
    /// fred: a centralized client per node, routed by the store's slot
    /// map (the application's clustered client reads the map).
    #[cfg(feature = "fred")]
    Fred(Arc<crate::fred::FredNodes>),
}

impl Backend {
    /// One attempt: `EVALSHA` (or `EVAL` with the source when `source`) of
    /// `call` (its keys share one slot), sent where `route` says (the
    /// master of its slot: `slots` for [`Backend::Nodes`], the client's own
    /// map for the others).
    pub(crate) async fn eval(
        &self,
        call: &Call,
        route: &Route,
        source: bool,
        slots: &SlotMap,
    ) -> Result<Vec<i64>, Failure> {
        match self {
            Self::Nodes(nodes) => nodes.eval(call, route, source, slots).await,
            Self::Redis(conn) => redis_eval(conn.clone(), call, route, source).await,
            #[cfg(feature = "fred")]
            Self::Fred(nodes) => nodes.eval(call, route, source, slots).await,
        }
    }

    /// `SCRIPT LOAD` of every script on every master.
    pub(crate) async fn load_scripts(
        &self,
        slots: &SlotMap,
    ) -> Result<(), ratelimit_core::StoreError> {
        match self {
            Self::Nodes(nodes) => nodes.load_scripts(slots).await,
            Self::Redis(conn) => {
                use redis::cluster_routing::{
                    MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo,
                };
                let mut conn = conn.clone();
                for script in ratelimit_redis::scripts::all() {
                    let mut cmd = redis::cmd("SCRIPT");
                    cmd.arg("LOAD").arg(script.lua());
                    conn.route_command(
                        cmd,
                        RoutingInfo::MultiNode((
                            MultipleNodeRoutingInfo::AllMasters,
                            Some(ResponsePolicy::AllSucceeded),
                        )),
                    )
                    .await
                    .map_err(error::from_redis)?;
                }
                Ok(())
            }
            #[cfg(feature = "fred")]
            Self::Fred(nodes) => nodes.load_scripts(slots).await,
        }
    }

    /// Each slot range and its master (`host:port`), as the cluster says
    /// now (`None` when it cannot be read).
    pub(crate) async fn slot_ranges(&self, slots: &SlotMap) -> Option<Vec<(u16, u16, String)>> {
        match self {
            Self::Nodes(nodes) => nodes.slot_ranges(slots).await.ok(),
            Self::Redis(conn) => redis_slot_ranges(conn).await,
            #[cfg(feature = "fred")]
            Self::Fred(nodes) => nodes.slot_ranges().await,
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Nodes(_) => "redis-rs, one connection per node",
            Self::Redis(_) => "redis-rs cluster connection",
            #[cfg(feature = "fred")]
            Self::Fred(_) => "fred, one client per node",
        }
    }
}

/// Each slot range and its master (`host:port`), from `CLUSTER SLOTS` on
/// any node (`None` when it cannot be read).
async fn redis_slot_ranges(conn: &ClusterConnection) -> Option<Vec<(u16, u16, String)>> {
    let slots = conn
        .clone()
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            redis::cluster_routing::RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .ok()?;
    parse_slots(slots, "")
}

fn by_address(addr: &Addr) -> SingleNodeRoutingInfo {
    SingleNodeRoutingInfo::ByAddress {
        host: addr.host.clone(),
        port: addr.port,
    }
}

async fn redis_eval(
    mut conn: ClusterConnection,
    call: &Call,
    route: &Route,
    source: bool,
) -> Result<Vec<i64>, Failure> {
    use redis::cluster_routing::RoutingInfo;
    let cmd = script_cmd(call, source);
    match route {
        // Routed by the first key (EVAL/EVALSHA name the keys after
        // numkeys; every key of one call shares its slot) to the slot's
        // master.
        Route::Key => cmd
            .query_async::<Integers>(&mut conn)
            .await
            .map(|Integers(v)| v)
            .map_err(failure),
        Route::Moved(addr) => {
            let value = conn
                .route_command(cmd, RoutingInfo::SingleNode(by_address(addr)))
                .await
                .map_err(failure)?;
            decode_value(value)
        }
        Route::Ask(addr) => {
            // ASKING applies to the next command on the same connection: a
            // pipeline writes both at once, so nothing else can come between.
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").add_command(cmd);
            let mut values = conn
                .route_pipeline(pipe, 1, 1, by_address(addr))
                .await
                .map_err(failure)?;
            match values.pop() {
                Some(value) => decode_value(value),
                None => Err(Failure {
                    error: ratelimit_core::StoreError::message(
                        "empty reply to ASKING + script",
                        true,
                    ),
                    next: Next::Fail,
                }),
            }
        }
    }
}
