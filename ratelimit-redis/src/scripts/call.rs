//! One request ready to go, alone or in a batch, and the script call that
//! carries it: built the same way by the single-node store and the
//! cluster store, which differ only in how they send it.

use std::fmt::Write as _;

use ratelimit_core::model::Charge;
use ratelimit_core::store::Decisions;
use ratelimit_core::{Micros, StoreError};
use smallvec::SmallVec;

use super::lua::{BATCH, INJECTED_CLOCK_MIN_EXPIRY, Script, TOKEN_BUCKET, for_quota};
use super::own::COMPILED;
use super::quota_args::{Args, Keys, QuotaArgs, TOKEN_BUCKET_KIND, push_now};
use crate::arg::Arg;
use crate::decode::{self, Limit};

/// One request, ready to go alone or in a batch: the caller's keys and its
/// quotas' arguments. Built the same way by the single-node store and the
/// cluster store.
#[derive(Debug, Clone)]
pub struct Request {
    /// The script for this request alone: its algorithm's single-quota
    /// script for one quota (sent as the quota's own, [`crate::scripts::single`], by
    /// [`Call::alone`]), [`BATCH`] (a batch of one) for several.
    script: &'static Script,
    /// One key per quota, in order; one caller, so one hash slot.
    pub keys: Keys,
    /// The hash slot of the keys.
    slot: u16,
    /// Per quota: its script arguments.
    quota_args: SmallVec<[QuotaArgs; 1]>,
    /// What decoding needs of each quota: its limit and the units its
    /// remaining is answered in.
    pub limits: SmallVec<[Limit; 1]>,
    /// "Now" with an injected clock; `None`: the server's `TIME`.
    pub now: Option<Micros>,
}

impl Request {
    /// A request for `caller` over `charges` (costs already checked).
    pub fn new(prefix: &str, caller: &[u8], charges: &[Charge<'_>], now: Option<Micros>) -> Self {
        Self::build(prefix, caller, charges, now, true)
    }

    /// As [`Request::new`], for a single node, where no call is routed by
    /// hash slot: the slot is not computed ([`Request::slot`] reads 0).
    pub fn on_one_node(
        prefix: &str,
        caller: &[u8],
        charges: &[Charge<'_>],
        now: Option<Micros>,
    ) -> Self {
        Self::build(prefix, caller, charges, now, false)
    }

    fn build(
        prefix: &str,
        caller: &[u8],
        charges: &[Charge<'_>],
        now: Option<Micros>,
        slotted: bool,
    ) -> Self {
        // The algorithm's script for one quota: a request sent alone takes
        // the quota's own ([`Call::alone`]), one in a batch never needs it.
        let script = match charges {
            [c] => for_quota(c.quota),
            _ => &BATCH,
        };
        let keys: Keys = charges
            .iter()
            .map(|c| crate::keys::key(prefix, caller, c.quota))
            .collect();
        Self {
            script,
            slot: match keys.first() {
                Some(k) if slotted => crate::keys::slot(k.as_bytes()),
                _ => 0,
            },
            keys,
            quota_args: charges
                .iter()
                .map(|c| QuotaArgs::new(c.quota, c.cost, c.shadow))
                .collect(),
            limits: charges.iter().map(|c| Limit::of(c.quota)).collect(),
            now,
        }
    }

    /// The same request, sent alone through the batch script (a batch of
    /// one) rather than its single-quota script.
    pub fn through_batch(mut self) -> Self {
        self.script = &BATCH;
        self
    }

    /// The number of quotas.
    pub fn quotas(&self) -> usize {
        self.limits.len()
    }

    /// The hash slot of its keys (they share one; 0 for a request made
    /// [`Request::on_one_node`]).
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// Whether it goes alone through a single-quota script.
    pub fn is_single(&self) -> bool {
        !std::ptr::eq(self.script, &*BATCH)
    }

    /// The four decision integers of the one integer a single token-bucket
    /// call of this request returned (see [`crate::decode::token_bucket`]);
    /// an error for a request of another kind, which never returns one.
    pub fn unpack(&self, packed: i64) -> Result<[i64; 4], StoreError> {
        match self.quota_args.as_slice() {
            [q] if std::ptr::eq(self.script, &*TOKEN_BUCKET) => {
                crate::decode::token_bucket(packed, q.y, q.z)
            }
            _ => Err(StoreError::message(
                format!("unexpected rate-limit script reply {packed}"),
                false,
            )),
        }
    }

    /// Each quota's `(refill, full)` if it is a token bucket: what turns
    /// its one-integer batch answer into the four ([`decode::take_four`]).
    fn buckets(&self) -> impl Iterator<Item = Option<(u64, u64)>> + '_ {
        self.quota_args
            .iter()
            .map(|q| (q.kind == TOKEN_BUCKET_KIND).then_some((q.y, q.z)))
    }

    /// This request's decisions from its answer in a batch reply
    /// ([`decode::Outcome::Decided`]), each quota's answer decoded where it
    /// stands (no copy of the answer, nothing allocated for one quota).
    pub fn decisions(&self, answer: &[i64]) -> Result<Decisions, StoreError> {
        let mut rest = answer;
        let decisions = self
            .buckets()
            .zip(&self.limits)
            .map(|(bucket, &limit)| decode::decision(&decode::take_four(&mut rest, bucket)?, limit))
            .collect::<Result<Decisions, StoreError>>()?;
        if rest.is_empty() {
            Ok(decisions)
        } else {
            Err(decode::bad_batch_answer(answer))
        }
    }
}

/// One script call, ready to send: the script, its keys and its arguments.
/// Built the same way by the single-node store and the cluster store, which
/// differ only in how they send it.
#[derive(Debug)]
pub struct Call {
    /// The script to run.
    pub script: &'static Script,
    /// `KEYS`: every key of every request, in order.
    pub keys: Keys,
    /// `ARGV`.
    pub args: Args,
    /// How many requests the call decides (1 alone, more in a batch). A
    /// cluster node refuses a call of several keys with `TRYAGAIN` while a
    /// slot migration has moved some of them and not others; a batch of
    /// several requests that meets it is sent again request by request
    /// (see [`crate::engine::Straddles`]).
    pub requests: usize,
}

/// `ARGV[2]`/`ARGV[1]`: the minimum expiry, for a request on an injected
/// clock or the server's.
fn min_expiry(now: Option<Micros>) -> Arg {
    match now {
        Some(_) => Arg::from(INJECTED_CLOCK_MIN_EXPIRY.as_millis()),
        None => Arg::Int(0),
    }
}

/// A deadline as the single-quota scripts take it (see
/// [`crate::deadline`]), as the batch script takes it: the instant alone,
/// 0 for none (the batch script always returns `TIME`).
fn batch_deadline(server_micros: i64) -> Arg {
    Arg::Int(batch_deadline_micros(server_micros))
}

/// As [`batch_deadline`], the number.
fn batch_deadline_micros(server_micros: i64) -> i64 {
    if server_micros < 0 {
        -1 - server_micros
    } else {
        server_micros
    }
}

/// Whether no key appears twice (the batch script then keeps none of its
/// writes for later requests: each reads its key's state as the call found
/// it).
fn distinct(keys: &[String]) -> bool {
    match keys {
        [] | [_] => true,
        [a, b] => a != b,
        _ => {
            let mut seen = foldhash::HashSet::with_capacity_and_hasher(
                keys.len(),
                foldhash::fast::RandomState::default(),
            );
            keys.iter().all(|k| seen.insert(k.as_str()))
        }
    }
}

impl Call {
    /// One request alone, with its deadline in the server's µs (as
    /// [`crate::deadline::ServerClock::server_deadline`] gives it): the
    /// single-quota script, or a batch of one for several quotas.
    pub fn alone(request: &Request, server_deadline: i64) -> Self {
        Self::alone_with_keys(request, server_deadline, request.keys.clone())
    }

    /// As [`Call::alone`], moving the keys out of the request rather than
    /// copying them (the request is then only decoded).
    pub fn alone_taking_keys(request: &mut Request, server_deadline: i64) -> Self {
        let keys = std::mem::take(&mut request.keys);
        Self::alone_with_keys(request, server_deadline, keys)
    }

    fn alone_with_keys(request: &Request, server_deadline: i64, keys: Keys) -> Self {
        if request.is_single() {
            let mut args = Args::new();
            args.push(Arg::Int(server_deadline));
            let mut script = request.script;
            if let Some(q) = request.quota_args.first() {
                script = COMPILED.get(script, q);
                q.push_single(script, &mut args);
            }
            push_now(&mut args, request.now);
            Self {
                script,
                keys,
                args,
                requests: 1,
            }
        } else {
            Self::batch_with_keys(&[(request, server_deadline)], keys)
        }
    }

    /// Several requests as one call of [`BATCH`], in order, each with its
    /// deadline in the server's µs. Every request's keys must be in one
    /// hash slot on a cluster.
    pub fn batch(requests: &[(&Request, i64)]) -> Self {
        let keys = requests
            .iter()
            .flat_map(|(r, _)| r.keys.iter().cloned())
            .collect();
        Self::batch_with_keys(requests, keys)
    }

    /// As [`Call::batch`], moving the keys out of the requests rather than
    /// copying them (the requests are then only decoded).
    pub fn batch_taking_keys(requests: &mut [(&mut Request, i64)]) -> Self {
        let keys = requests
            .iter_mut()
            .flat_map(|(r, _)| std::mem::take(&mut r.keys))
            .collect();
        let shared: Vec<(&Request, i64)> = requests.iter().map(|(r, d)| (&**r, *d)).collect();
        Self::batch_with_keys(&shared, keys)
    }

    fn batch_with_keys(requests: &[(&Request, i64)], keys: Keys) -> Self {
        // Requests over the same quotas share one set (most batches hold
        // one): its arguments are sent and parsed once. `set_of[i]` is the
        // set of request i, `sets` the first request of each set.
        let mut sets: Vec<&Request> = Vec::new();
        let mut set_of = Vec::with_capacity(requests.len());
        for (r, _) in requests {
            let found = sets.iter().position(|s| s.quota_args == r.quota_args);
            set_of.push(found.unwrap_or_else(|| {
                sets.push(r);
                sets.len() - 1
            }));
        }
        let mut args = Args::with_capacity(
            5 + sets
                .iter()
                .map(|s| 2 + 5 * s.quota_args.len())
                .sum::<usize>()
                + 3 * requests.len(),
        );
        // One set and the server's clock (the common batch): each request
        // sends its deadline alone, and all go in one argument.
        let compact = sets.len() == 1 && requests.iter().all(|(r, _)| r.now.is_none());
        args.push(min_expiry(requests.first().and_then(|(r, _)| r.now)));
        args.push(Arg::Int(if compact { 1 } else { 3 }));
        // The earliest deadline: while the server's clock is not past it,
        // the script reads no request's own.
        let earliest = requests
            .iter()
            .map(|(_, d)| batch_deadline_micros(*d))
            .filter(|d| *d > 0)
            .min()
            .unwrap_or(0);
        args.push(Arg::Int(earliest));
        args.push(Arg::Int(i64::from(distinct(&keys))));
        args.push(Arg::from(sets.len()));
        for (id, s) in (1..).zip(&sets) {
            args.push(Arg::Int(id));
            args.push(Arg::from(s.quotas()));
            for q in &s.quota_args {
                q.push_batch(&mut args);
            }
        }
        if compact {
            // Every deadline in one argument, in order, space-separated.
            let mut all = String::with_capacity(17 * requests.len());
            for (i, (_, deadline)) in requests.iter().enumerate() {
                if i > 0 {
                    all.push(' ');
                }
                let _ = write!(all, "{}", batch_deadline_micros(*deadline));
            }
            args.push(Arg::Text(all));
        } else {
            for ((r, deadline), set) in requests.iter().zip(set_of) {
                match r.now {
                    Some(now) => args.push(Arg::from(now)),
                    None => args.push(Arg::Static("")),
                }
                args.push(batch_deadline(*deadline));
                args.push(Arg::from(set + 1));
            }
        }
        Self {
            script: &BATCH,
            keys,
            args,
            requests: requests.len(),
        }
    }

    /// The hash slot of the call's keys (one per call).
    pub fn slot(&self) -> u16 {
        crate::keys::slot(self.keys.first().map_or(&b""[..], |k| k.as_bytes()))
    }
}

/// "Now" for a store with an injected clock (`None`: the server's `TIME`),
/// refused beyond [`ratelimit_core::MAX_TIME`] (2^52 µs), past which a
/// token bucket's state could leave the range Lua's doubles hold exactly.
pub fn injected_now(
    clock: Option<&std::sync::Arc<dyn ratelimit_core::Clock>>,
) -> Result<Option<Micros>, ratelimit_core::StoreError> {
    let Some(clock) = clock else { return Ok(None) };
    let now = clock.now();
    if now > ratelimit_core::MAX_TIME {
        return Err(ratelimit_core::StoreError::message(
            format!(
                "injected clock reads {now} µs, beyond 2^52 (ratelimit_core::MAX_TIME): Lua \
                 cannot hold a token bucket's state exactly past it"
            ),
            false,
        ));
    }
    Ok(Some(now))
}

#[cfg(test)]
mod tests {
    use ratelimit_core::Quota;

    use super::*;
    use crate::scripts::{args, single};

    #[test]
    fn a_single_quota_request_goes_alone_with_the_single_script_arguments() {
        let q = Quota::token_bucket(ratelimit_core::Rate::per_minute(100), 20).unwrap();
        let r = Request::new("rl", b"k", &[Charge::new(&q, 2)], None);
        let call = Call::alone(&r, -1);
        // The quota's own script: the deadline and the cost.
        assert!(std::ptr::eq(call.script, single(&q)));
        assert!(call.script.is_compiled());
        assert_eq!(call.args[..], ["-1", "2"]);
        // With an injected clock, now and the minimum expiry after them.
        let r1 = Request::new("rl", b"k", &[Charge::new(&q, 2)], Some(7));
        assert_eq!(Call::alone(&r1, 0).args[..], ["0", "2", "7", "600000"]);
        // The algorithm's script takes the quota's numbers.
        assert_eq!(args(&q, None, 2), ["0", "1200000", "1", "12000000"]);
        let w = Quota::fixed_window(ratelimit_core::Rate::per_minute(100)).unwrap();
        let r2 = Request::new(
            "rl",
            b"k",
            &[Charge::new(&w, 1), Charge::new(&q, 1)],
            Some(7),
        );
        let call = Call::batch(&[(&r, -5), (&r2, 9)]);
        assert!(std::ptr::eq(call.script, &*BATCH));
        assert_eq!(call.keys.len(), 3);
        // Minimum expiry, 3 fields per request, the earliest deadline (of
        // -5, that is 4, and 9), a key repeated (both requests charge the
        // token bucket of caller k), two quota sets (id, number of quotas,
        // 5 arguments per quota), then per request: now, deadline, set.
        assert_eq!(&call.args[..5], ["0", "3", "4", "0", "2"]);
        assert_eq!(&call.args[5..7], ["1", "1"]);
        let mut tb = Args::new();
        r.quota_args[0].push_batch(&mut tb);
        assert_eq!(call.args[7..12], tb[..]);
        // A bucket of 100 per minute: one token is 600,000 units, 1 unit a µs.
        assert_eq!(tb[..], ["4", "0", "1200000", "1", "12000000"]);
        assert_eq!(&call.args[12..14], ["2", "2"]);
        let mut both = Args::new();
        r2.quota_args.iter().for_each(|q| q.push_batch(&mut both));
        assert_eq!(call.args[14..24], both[..]);
        assert_eq!(&both[..5], ["1", "0", "1", "100", "60000000"]);
        assert_eq!(&call.args[24..], ["", "4", "1", "7", "9", "2"]);
        // Requests over the same quotas share one set; on one set and the
        // server's clock the deadlines go in one argument. A key that repeats
        // says so; a request without a deadline (0) is not the earliest.
        let r3 = Request::new("rl", b"other", &[Charge::new(&q, 2)], None);
        let call = Call::batch(&[(&r, 0), (&r3, 5), (&r, -8)]);
        assert_eq!(&call.args[..7], ["0", "1", "5", "0", "1", "1", "1"]);
        assert_eq!(call.args.len(), 5 + 2 + 5 + 1);
        assert_eq!(&call.args[12..], ["0 5 7"]);
        // No deadline at all: 0.
        let call = Call::batch(&[(&r, 0), (&r3, -1)]);
        assert_eq!(&call.args[2..4], ["0", "1"]);
        // On an injected clock, three fields again.
        let r4 = Request::new("rl", b"other", &[Charge::new(&q, 2)], Some(3));
        let call = Call::batch(&[(&r4, 0), (&r4, 4)]);
        assert_eq!(&call.args[..4], ["600000", "3", "4", "0"]);
        assert_eq!(&call.args[12..], ["3", "0", "1", "3", "4", "1"]);
    }

    #[test]
    fn repeated_keys_are_found_in_batches_of_every_size() {
        let k = |s: &str| s.to_owned();
        assert!(distinct(&[]));
        assert!(distinct(&[k("a")]));
        assert!(distinct(&[k("a"), k("b")]));
        assert!(!distinct(&[k("a"), k("a")]));
        let mut many: Vec<String> = (0..200).map(|i| format!("rl:{{c{i}}}:tb2")).collect();
        assert!(distinct(&many));
        many.push(many[117].clone());
        assert!(!distinct(&many));
    }
}
