//! How the store reaches the cluster: redis-rs' cluster connection, or a
//! clustered fred client. Scripts, keys and decoding are shared; only the
//! call and its routing differ.

use ratelimit_redis::error;
use ratelimit_redis::scripts::Call;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{Cmd, FromRedisValue, Value};

use crate::retry::{self, Addr, Failure, Next, Route};

/// A cluster client.
#[derive(Clone)]
pub(crate) enum Backend {
    /// redis-rs `cluster-async`.
    Redis(ClusterConnection),
    /// fred, clustered.
    #[cfg(feature = "fred")]
    Fred(fred::clients::Client),
}

impl Backend {
    /// One attempt: `EVALSHA` (or `EVAL` with the source when `source`) of
    /// `call` (its keys share one slot), sent where `route` says.
    pub(crate) async fn eval(
        &self,
        call: &Call,
        route: &Route,
        source: bool,
    ) -> Result<Vec<i64>, Failure> {
        match self {
            Self::Redis(conn) => redis_eval(conn.clone(), call, route, source).await,
            #[cfg(feature = "fred")]
            Self::Fred(client) => crate::fred::eval(client, call, route, source).await,
        }
    }

    /// `SCRIPT LOAD` of every script on every master.
    pub(crate) async fn load_scripts(&self) -> Result<(), ratelimit_core::StoreError> {
        match self {
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
            Self::Fred(client) => crate::fred::load_scripts(client).await,
        }
    }

    /// Each slot range and its master (`host:port`), as the cluster says
    /// now (`None` when it cannot be read).
    pub(crate) async fn slot_ranges(&self) -> Option<Vec<(u16, u16, String)>> {
        match self {
            Self::Redis(conn) => redis_slot_ranges(conn).await,
            #[cfg(feature = "fred")]
            Self::Fred(client) => {
                use fred::interfaces::ClusterInterface;
                let state = client.cached_cluster_state()?;
                Some(
                    state
                        .slots()
                        .iter()
                        .map(|r| {
                            (
                                r.start,
                                r.end,
                                format!("{}:{}", r.primary.host, r.primary.port),
                            )
                        })
                        .collect(),
                )
            }
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Redis(_) => "redis-rs",
            #[cfg(feature = "fred")]
            Self::Fred(_) => "fred",
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
    let ranges = redis::from_redis_value::<Vec<Vec<Value>>>(slots).ok()?;
    Some(
        ranges
            .iter()
            .filter_map(|r| {
                let (Some(Value::Int(start)), Some(Value::Int(end))) = (r.first(), r.get(1)) else {
                    return None;
                };
                let master = redis::from_redis_value::<Vec<Value>>(r.get(2)?.clone()).ok()?;
                let host = redis::from_redis_value::<String>(master.first()?.clone()).ok()?;
                let port = redis::from_redis_value::<u16>(master.get(1)?.clone()).ok()?;
                Some((
                    u16::try_from(*start).ok()?,
                    u16::try_from(*end).ok()?,
                    format!("{host}:{port}"),
                ))
            })
            .collect(),
    )
}

fn script_cmd(call: &Call, source: bool) -> Cmd {
    let mut cmd = if source {
        let mut c = redis::cmd("EVAL");
        c.arg(call.script.lua());
        c
    } else {
        let mut c = redis::cmd("EVALSHA");
        c.arg(call.script.sha1());
        c
    };
    cmd.arg(call.keys.len()).arg(&call.keys).arg(&call.args);
    cmd
}

fn by_address(addr: &Addr) -> SingleNodeRoutingInfo {
    SingleNodeRoutingInfo::ByAddress {
        host: addr.host.clone(),
        port: addr.port,
    }
}

fn failure(err: redis::RedisError) -> Failure {
    let next = retry::classify_redis(&err);
    Failure {
        error: error::from_redis(err),
        next,
    }
}

fn decode_value(value: Value) -> Result<Vec<i64>, Failure> {
    let value = value.extract_error().map_err(failure)?;
    Vec::<i64>::from_redis_value(value).map_err(|e| Failure {
        error: ratelimit_core::StoreError::message(
            format!("unexpected rate-limit script reply: {e}"),
            false,
        ),
        next: Next::Fail,
    })
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
            .query_async::<Vec<i64>>(&mut conn)
            .await
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

/// Reads every master's `TIME` once (one call per slot range of `CLUSTER
/// SLOTS`, routed to the range's first slot) and teaches `clock` the offset
/// for every slot of the range, so that the first call on each slot
/// carries a deadline too. Best effort: a range that does not answer is
/// learnt from its first reply instead.
pub(crate) async fn learn_clocks(
    conn: &ClusterConnection,
    clock: &ratelimit_redis::deadline::ServerClock,
) {
    use redis::cluster_routing::{Route as SlotRoute, RoutingInfo, SlotAddr};
    let Some(ranges) = redis_slot_ranges(conn).await else {
        return;
    };
    let mut conn = conn.clone();
    for (start, end, _master) in ranges {
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(SlotRoute::new(
            start,
            SlotAddr::Master,
        )));
        let Ok(time) = conn.route_command(redis::cmd("TIME"), routing).await else {
            continue;
        };
        let received = std::time::Instant::now();
        let Ok((secs, micros)) = redis::from_redis_value::<(i64, i64)>(time) else {
            continue;
        };
        let server_now = secs.saturating_mul(1_000_000).saturating_add(micros);
        for slot in start..=end {
            clock.observe(usize::from(slot), server_now, received);
        }
    }
}
