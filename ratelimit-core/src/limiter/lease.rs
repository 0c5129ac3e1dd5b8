//! Leases: the store's last answer for each caller, kept so that while the
//! store cannot answer (busy, or unavailable) a caller it answered recently
//! is decided from that answer, and never past it.
//!
//! # The rules
//!
//! Every decision the store makes for a caller under a quota (admitted or
//! denied) renews that caller's lease for the quota: the store's
//! `remaining` divided by the number of instances sharing the quota `N`
//! ([`crate::LimiterBuilder::instances`]; 1 when not given), its **share**,
//! and the instant the caller's state is fresh again, `reset_at = t_sent +
//! reset_after` on the limiter's clock (`t_sent` read before the store was
//! asked, so `reset_at` is never later than the store's own reset). What
//! the lease has admitted (the store never counted it) stays **spent**
//! across renewals until the reset of the lease it was spent from: a
//! store answer that comes between two failures does not hand the same
//! budget out again. While the store cannot answer, a call of cost `c`
//! under a live lease (`now < reset_at`) is:
//!
//! - **admitted** if what the lease has spent plus `c` stays within the
//!   share (and it is spent);
//! - **denied** otherwise, with `retry_after = reset_at - now`: an
//!   exhausted caller stays denied until its reset, or until a store
//!   answer renews the lease with more room.
//!
//! A caller whose lease has passed its reset, or whom the store never
//! answered, has none: the limiter's fallback store decides it if the store
//! is unavailable, its failure policy if the store is busy.
//!
//! # The bound
//!
//! For one caller and quota within one of the quota's windows (one
//! lease's life, up to its reset), let `C(t)` be what the store had
//! admitted by `t`, and `t_i` the instant of instance `i`'s first store
//! answer in it. Every share instance `i` is given there is at most
//! `(L - C(t_i)) / N`, and what it admits from leases stays spent, so it
//! admits at most that much from leases in all; all `N` instances
//! together at most `L - C(t_first)`, and the window's total is at most
//! `L + (C(t_end) - C(t_first))`: **beyond the limit, leases admit at
//! most what the store itself admitted after the first lease in use was
//! granted**, and never more than `N × ⌊(L - 1) / N⌋` (a lease comes from
//! an answer, and the first answer of a window admitted at least one
//! call). An instance that is the only one deciding for a caller (`N =
//! 1`, or sticky routing) admits nothing beyond the limit, and neither do
//! instances whose store fails for all of them at once with fresh leases:
//! what a burst can push past the limit comes from **skew**, one instance
//! failing while another keeps spending through the store. Leases never
//! add budget the store did not state: a token bucket's refill and a
//! sliding window's decay while degraded are not counted (a degraded
//! instance may deny what the store would admit, never the reverse).
//!
//! # Cost and memory
//!
//! A lease is kept per caller **and quota**: one lock of one of [`SHARDS`]
//! shards and one hash lookup per quota of a store decision (an allocation
//! only for a lease not held before), whatever number of quotas a caller
//! has (a rate-limit service names a quota per descriptor state under one
//! caller, its domain). At most `capacity` leases are kept; a full shard
//! first drops the leases whose reset has passed (only when one has), and
//! a lease that still finds no room is not kept (its caller is decided,
//! while the store cannot answer, as a caller the store never answered).

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use smallvec::SmallVec;

use crate::clock::{Micros, duration_to_micros};
use crate::decision::{Decision, Source};
use crate::quota::Quota;

/// Shards of the lease table: leases spread over this many locks.
pub(crate) const SHARDS: usize = 64;

/// The default most leases (callers and quotas) a limiter keeps: 100,000.
pub const DEFAULT_LEASE_CALLERS: usize = 100_000;

/// One caller's lease under one quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lease {
    /// What may be admitted from the lease: the store's `remaining` / N.
    share: u64,
    /// What has been admitted from it since the store's answer.
    spent: u64,
    /// When the caller's state is fresh again (limiter clock, µs).
    reset_at: Micros,
}

/// One shard: leases by [`LeaseId`].
#[derive(Debug, Default)]
struct Shard {
    map: foldhash::HashMap<Box<[u8]>, Lease>,
    /// The earliest `reset_at` in the shard (0: empty): nothing can be
    /// dropped before it.
    earliest: Micros,
}

/// What one quota of a request asks of the leases: its fingerprint, its
/// quota, the cost, and whether it is in shadow mode (a shadow quota's
/// lease is reported, never enforced).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask<'a> {
    pub(crate) fingerprint: u64,
    pub(crate) quota: &'a Quota,
    pub(crate) cost: u64,
    pub(crate) shadow: bool,
}

/// A lease's name in the table: the caller's store key and the quota's
/// fingerprint (8 bytes, at the end, so no two pairs share a name).
type LeaseId = SmallVec<[u8; 72]>;

fn lease_id(key: &[u8], fingerprint: u64) -> LeaseId {
    let mut id = LeaseId::with_capacity(key.len() + 8);
    id.extend_from_slice(key);
    id.extend_from_slice(&fingerprint.to_le_bytes());
    id
}

/// The leases of one limiter (see the module docs).
#[derive(Debug)]
pub(crate) struct Leases {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    instances: u64,
}

impl Leases {
    /// At most `capacity` leases (at least one a shard), each the store's
    /// remaining divided by `instances`.
    pub(crate) fn new(capacity: usize, instances: u32) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            instances: u64::from(instances.max(1)),
        }
    }

    /// The shard of lease `id`.
    fn shard_of(id: &[u8]) -> usize {
        // FNV-1a: cheap, and the map hashes the name again with its own
        // (keyed) hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in id {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        usize::try_from(h % SHARDS as u64).unwrap_or(0)
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.shards[shard].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store decided `d` for `key` under the quota of `fingerprint`, for
    /// a request sent at `sent` (limiter clock): the caller's lease for the
    /// quota is replaced.
    pub(crate) fn record(&self, key: &[u8], fingerprint: u64, d: &Decision, sent: Micros) {
        let mut lease = Lease {
            share: d.remaining / self.instances,
            spent: 0,
            reset_at: sent.saturating_add(duration_to_micros(d.reset_after)),
        };
        let id = lease_id(key, fingerprint);
        let mut shard = self.lock(Self::shard_of(&id));
        if let Some(l) = shard.map.get_mut(&id[..]) {
            // What the previous lease admitted, the store never counted:
            // it stays spent until that lease's reset, so that answers
            // coming between failures do not hand the same budget out
            // again.
            if sent < l.reset_at {
                lease.spent = l.spent;
                lease.reset_at = lease.reset_at.max(l.reset_at);
            }
            *l = lease;
        } else {
            if shard.map.len() >= self.per_shard && !shard.make_room(sent, self.per_shard) {
                return;
            }
            shard.map.insert(id[..].into(), lease);
        }
        if shard.earliest == 0 || lease.reset_at < shard.earliest {
            shard.earliest = lease.reset_at;
        }
    }

    /// The decision of `key`'s live lease for one quota at `now`, spending
    /// it when it admits (see the module docs); `None`: no live lease.
    pub(crate) fn decide(&self, key: &[u8], ask: Ask<'_>, now: Micros) -> Option<Decision> {
        Some(self.decide_all(key, &[ask], now)?.remove(0))
    }

    /// The decisions of `key`'s live leases for every quota of `asks`, all
    /// or nothing: spent only if every enforced quota's lease admits the
    /// call. `None`: some quota has no live lease.
    pub(crate) fn decide_all(
        &self,
        key: &[u8],
        asks: &[Ask<'_>],
        now: Micros,
    ) -> Option<Vec<Decision>> {
        let ids: SmallVec<[(usize, LeaseId); 4]> = asks
            .iter()
            .map(|a| {
                let id = lease_id(key, a.fingerprint);
                (Self::shard_of(&id), id)
            })
            .collect();
        // Every shard involved, locked in ascending order (no two callers
        // can wait for each other), so that the answer is all or nothing.
        let mut order: SmallVec<[usize; 4]> = ids.iter().map(|(s, _)| *s).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: SmallVec<[MutexGuard<'_, Shard>; 4]> =
            order.iter().map(|&s| self.lock(s)).collect();
        let at = |shard: usize| order.binary_search(&shard).unwrap_or(0);
        let mut found: SmallVec<[Lease; 4]> = SmallVec::new();
        for (shard, id) in &ids {
            let l = guards[at(*shard)].map.get(&id[..])?;
            if now >= l.reset_at {
                return None;
            }
            found.push(*l);
        }
        let admits = |l: &Lease, cost: u64| l.spent.saturating_add(cost) <= l.share;
        let admitted = asks
            .iter()
            .zip(&found)
            .all(|(ask, l)| ask.shadow || admits(l, ask.cost));
        let mut decisions = Vec::with_capacity(asks.len());
        for ((ask, l), (shard, id)) in asks.iter().zip(&found).zip(&ids) {
            let own = admits(l, ask.cost);
            let mut spent = l.spent;
            if admitted && own {
                spent += ask.cost;
                if let Some(held) = guards[at(*shard)].map.get_mut(&id[..]) {
                    held.spent = spent;
                }
            }
            let reset_after = Duration::from_micros(l.reset_at - now);
            decisions.push(Decision {
                allowed: own,
                limit: ask.quota.limit(),
                remaining: l.share - spent.min(l.share),
                reset_after,
                retry_after: (!own).then_some(reset_after),
                source: Source::Lease,
            });
        }
        Some(decisions)
    }

    /// How many leases are held (live or not yet dropped).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).map.len())
            .sum()
    }
}

impl Shard {
    /// Drops the leases whose reset has passed at `now`, if any can have;
    /// whether there is room now.
    fn make_room(&mut self, now: Micros, per_shard: usize) -> bool {
        if self.earliest != 0 && self.earliest <= now {
            self.map.retain(|_, l| l.reset_at > now);
            self.earliest = self.map.values().map(|l| l.reset_at).min().unwrap_or(0);
        }
        self.map.len() < per_shard
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Rate;

    fn quota() -> Quota {
        Quota::fixed_window(Rate::per_minute(20)).unwrap()
    }

    fn store_decision(allowed: bool, remaining: u64, reset_s: u64) -> Decision {
        Decision {
            allowed,
            limit: 20,
            remaining,
            reset_after: Duration::from_secs(reset_s),
            retry_after: (!allowed).then(|| Duration::from_secs(reset_s)),
            source: Source::Store,
        }
    }

    fn ask(q: &Quota, cost: u64) -> Ask<'_> {
        Ask {
            fingerprint: 7,
            quota: q,
            cost,
            shadow: false,
        }
    }

    #[test]
    fn a_caller_with_k_left_is_admitted_at_most_k_times_then_denied_until_its_reset() {
        let (q, leases) = (quota(), Leases::new(100, 1));
        leases.record(b"a", 7, &store_decision(true, 3, 30), 1_000_000);
        for left in (0..3).rev() {
            let d = leases.decide(b"a", ask(&q, 1), 2_000_000).unwrap();
            assert!(d.allowed);
            assert_eq!((d.remaining, d.source), (left, Source::Lease));
        }
        let d = leases.decide(b"a", ask(&q, 1), 2_000_000).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Duration::from_secs(29)));
        assert_eq!(d.reset_after, Duration::from_secs(29));
        // Past the reset, no lease: the caller is unknown again.
        assert!(leases.decide(b"a", ask(&q, 1), 31_000_000).is_none());
    }

    #[test]
    fn an_exhausted_caller_stays_denied_and_the_share_is_divided_among_instances() {
        let (q, leases) = (quota(), Leases::new(100, 2));
        leases.record(b"d", 7, &store_decision(false, 0, 10), 0);
        assert!(!leases.decide(b"d", ask(&q, 1), 9_999_999).unwrap().allowed);
        // 5 left, two instances: this one may admit 2.
        leases.record(b"h", 7, &store_decision(true, 5, 10), 0);
        assert!(leases.decide(b"h", ask(&q, 1), 1).unwrap().allowed);
        assert!(leases.decide(b"h", ask(&q, 1), 1).unwrap().allowed);
        assert!(!leases.decide(b"h", ask(&q, 1), 1).unwrap().allowed);
        // A cost larger than the share is denied without spending it.
        leases.record(b"j", 7, &store_decision(true, 6, 10), 2);
        assert!(!leases.decide(b"j", ask(&q, 4), 3).unwrap().allowed);
        assert!(leases.decide(b"j", ask(&q, 3), 3).unwrap().allowed);
    }

    #[test]
    fn a_new_store_answer_renews_the_lease_and_what_it_spent_stays_spent() {
        let (q, leases) = (quota(), Leases::new(100, 1));
        leases.record(b"a", 7, &store_decision(true, 1, 30), 0);
        assert!(leases.decide(b"a", ask(&q, 1), 1).unwrap().allowed);
        assert!(!leases.decide(b"a", ask(&q, 1), 1).unwrap().allowed);
        // The store, which never counted that admission, says 2 left: one
        // more, not two.
        leases.record(b"a", 7, &store_decision(true, 2, 30), 2);
        assert!(leases.decide(b"a", ask(&q, 1), 3).unwrap().allowed);
        assert!(!leases.decide(b"a", ask(&q, 1), 3).unwrap().allowed);
        // Answers between failures never hand out more than the largest
        // share: 5 answers saying 3 left admit 3 in all.
        let leases = Leases::new(100, 1);
        let mut admitted = 0;
        for t in 0..5 {
            leases.record(b"b", 7, &store_decision(true, 3, 30), t * 10);
            while leases.decide(b"b", ask(&q, 1), t * 10 + 1).unwrap().allowed {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 3);
        // Once the lease's reset has passed, the next answer starts afresh.
        leases.record(b"b", 7, &store_decision(true, 3, 30), 31_000_000);
        assert!(leases.decide(b"b", ask(&q, 1), 31_000_001).unwrap().allowed);
        // Another quota of the same caller has no lease.
        let other = Ask {
            fingerprint: 8,
            ..ask(&q, 1)
        };
        assert!(leases.decide(b"a", other, 3).is_none());
    }

    #[test]
    fn several_quotas_are_all_or_nothing() {
        let (q, leases) = (quota(), Leases::new(100, 1));
        leases.record(b"a", 1, &store_decision(true, 5, 30), 0);
        leases.record(b"a", 2, &store_decision(true, 0, 30), 0);
        let asks = [
            Ask {
                fingerprint: 1,
                ..ask(&q, 1)
            },
            Ask {
                fingerprint: 2,
                ..ask(&q, 1)
            },
        ];
        let ds = leases.decide_all(b"a", &asks, 1).unwrap();
        assert!(ds[0].allowed && !ds[1].allowed);
        // Denied as a whole: the first quota's lease was not spent.
        assert_eq!(ds[0].remaining, 5);
        // With the second in shadow, the call is admitted and spends the first.
        let shadowed = [
            asks[0],
            Ask {
                shadow: true,
                ..asks[1]
            },
        ];
        let ds = leases.decide_all(b"a", &shadowed, 1).unwrap();
        assert_eq!(ds[0].remaining, 4);
        // Without a lease for every quota, there is no answer.
        let missing = [
            asks[0],
            Ask {
                fingerprint: 3,
                ..asks[1]
            },
        ];
        assert!(leases.decide_all(b"a", &missing, 1).is_none());
    }

    /// A rate-limit service asks for one caller (its domain) under a quota
    /// per descriptor state: the table holds at most its capacity in leases
    /// however many quotas one caller has, and each quota's lease is found
    /// by itself (not by a scan of the caller's others).
    #[test]
    fn one_caller_with_many_quotas_holds_at_most_the_capacity_in_leases() {
        let (q, leases) = (quota(), Leases::new(1_000, 1));
        for fp in 0..5_000u64 {
            leases.record(b"domain", fp, &store_decision(true, 2, 30), 0);
        }
        assert!(
            leases.held() <= 1_000 + SHARDS,
            "{} leases held",
            leases.held()
        );
        let kept: Vec<u64> = (0..5_000u64)
            .filter(|&fp| {
                let a = Ask {
                    fingerprint: fp,
                    ..ask(&q, 1)
                };
                leases.decide(b"domain", a, 1).is_some()
            })
            .collect();
        assert!(!kept.is_empty() && kept.len() <= 1_000 + SHARDS);
        // Each kept lease is its quota's own: a share of 2, one spent
        // above, one more admitted, then denied; another caller under the
        // same quota has none.
        let a = Ask {
            fingerprint: kept[0],
            ..ask(&q, 1)
        };
        assert!(leases.decide(b"domain", a, 2).unwrap().allowed);
        assert!(!leases.decide(b"domain", a, 3).unwrap().allowed);
        assert!(leases.decide(b"other", a, 3).is_none());
    }

    #[test]
    fn a_full_table_drops_expired_leases_and_else_keeps_what_it_has() {
        let leases = Leases::new(SHARDS, 1);
        // One caller per shard at most: fill some shards with leases that
        // reset at 10 s.
        for i in 0..1_000u32 {
            leases.record(&i.to_be_bytes(), 7, &store_decision(true, 1, 10), 0);
        }
        let full = leases.held();
        assert!(full <= SHARDS);
        // Before the reset a new caller finds no room; after it, it does.
        for i in 1_000..2_000u32 {
            leases.record(&i.to_be_bytes(), 7, &store_decision(true, 1, 10), 1);
        }
        assert_eq!(leases.held(), full);
        for i in 2_000..3_000u32 {
            leases.record(
                &i.to_be_bytes(),
                7,
                &store_decision(true, 1, 10),
                10_000_001,
            );
        }
        assert!(leases.held() <= SHARDS);
        let q = quota();
        assert!(
            leases
                .decide(&0u32.to_be_bytes(), ask(&q, 1), 10_000_002)
                .is_none()
        );
    }
}
