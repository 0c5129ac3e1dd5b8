//! What both redis-rs clients share, the store's connection per node
//! ([`crate::nodes`]) and the cluster connection an application brings:
//! the script command, its reply and its failure, and the slot ranges of a
//! `CLUSTER SLOTS` reply.

use ratelimit_redis::decode::Integers;
use ratelimit_redis::error;
use ratelimit_redis::scripts::Call;
use redis::{Cmd, FromRedisValue, Value};

use crate::retry::{self, Failure, Next};

/// The ranges of a `CLUSTER SLOTS` reply: `(first slot, last slot,
/// master)`, the master as `host:port`. A master whose host is empty or
/// `?` (the node does not know the address it is reached at) is given
/// `asked`, the host of the node that answered.
pub(crate) fn parse_slots(reply: Value, asked: &str) -> Option<Vec<(u16, u16, String)>> {
    let ranges = redis::from_redis_value::<Vec<Vec<Value>>>(reply).ok()?;
    Some(
        ranges
            .iter()
            .filter_map(|r| {
                let (Some(Value::Int(start)), Some(Value::Int(end))) = (r.first(), r.get(1)) else {
                    return None;
                };
                let master = redis::from_redis_value::<Vec<Value>>(r.get(2)?.clone()).ok()?;
                let mut host = redis::from_redis_value::<String>(master.first()?.clone()).ok()?;
                if host.is_empty() || host == "?" {
                    host = asked.to_owned();
                }
                let port = redis::from_redis_value::<u16>(master.get(1)?.clone()).ok()?;
                if host.is_empty() {
                    return None;
                }
                Some((
                    u16::try_from(*start).ok()?,
                    u16::try_from(*end).ok()?,
                    retry::node_name(&host, port),
                ))
            })
            .collect(),
    )
}

pub(crate) fn script_cmd(call: &Call, source: bool) -> Cmd {
    call.script.command(&call.keys, &call.args, source)
}

pub(crate) fn failure(err: redis::RedisError) -> Failure {
    let next = retry::classify_redis(&err);
    Failure {
        error: error::from_redis(err),
        next,
    }
}

pub(crate) fn decode_value(value: Value) -> Result<Vec<i64>, Failure> {
    let value = value.extract_error().map_err(failure)?;
    Integers::from_redis_value(value)
        .map(|Integers(v)| v)
        .map_err(|e| Failure {
            error: ratelimit_core::StoreError::message(
                format!("unexpected rate-limit script reply: {e}"),
                false,
            ),
            next: Next::Fail,
        })
}
