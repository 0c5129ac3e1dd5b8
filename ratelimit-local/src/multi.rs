//! Several quotas of one caller, decided all or nothing under one lock.
//!
//! A limiter with several quotas asks for one decision over all of them
//! ([`ratelimit_core::Store::decide_all`]). The store keeps such a caller's
//! states together, in one entry of their own map keyed by the caller, so
//! the read, the model step over every quota and the write happen under one
//! shard lock: a denied call is counted in no quota, and no other call on
//! the caller can come in between.
//!
//! These states are kept apart from the single-quota maps: a policy used
//! both by a limiter with several quotas and, under the same namespace and
//! name, by a limiter with one, counts separately in each.

use std::sync::Arc;

use ratelimit_core::model::{self, Charge, State};
use ratelimit_core::{AlgorithmKind, Decision, Micros, Result};

use crate::shards::{Budget, Key, Mode, ShardedMap, Walk};

/// One quota's state within a caller's entry.
struct Slot {
    name: Arc<str>,
    kind: AlgorithmKind,
    state: State,
    expires_at: Micros,
}

/// A caller's states under the quotas it was checked against together.
#[derive(Default)]
struct Slots {
    slots: Vec<Slot>,
    /// The latest expiry of any slot: the entry is idle after it.
    expires_at: Micros,
}

/// The map of callers checked against several quotas at once (keyed by
/// the caller alone: each entry names its quotas).
pub(crate) struct MultiMap {
    map: ShardedMap<Slots>,
}

impl Default for MultiMap {
    fn default() -> Self {
        Self {
            map: ShardedMap::new(false),
        }
    }
}

impl MultiMap {
    pub(crate) fn decide_all(
        &self,
        key: &[u8],
        charges: &[Charge<'_>],
        now: Micros,
    ) -> Result<Vec<Decision>> {
        for c in charges {
            c.quota.check_cost(c.cost)?;
        }
        // Read, decide and write under the caller's one shard lock.
        let step = |slots: &mut Slots| -> Result<Vec<Decision>> {
            let find = |slots: &[Slot], c: &Charge<'_>| {
                slots
                    .iter()
                    .position(|s| s.kind == c.quota.kind() && *s.name == *c.quota.name())
            };
            let states = charges
                .iter()
                .map(|c| {
                    find(&slots.slots, c)
                        .map(|i| &slots.slots[i])
                        .filter(|s| s.expires_at > now)
                        .map(|s| s.state.clone())
                })
                .collect();
            let step = model::decide_all(charges, states, now)?;
            for (c, write) in charges.iter().zip(step.writes) {
                let Some((state, ttl)) = write else { continue };
                let expires_at = now.saturating_add(ttl);
                match find(&slots.slots, c) {
                    Some(i) => {
                        let s = &mut slots.slots[i];
                        s.state = state;
                        s.expires_at = expires_at;
                    }
                    None => slots.slots.push(Slot {
                        name: Arc::from(c.quota.name()),
                        kind: c.quota.kind(),
                        state,
                        expires_at,
                    }),
                }
                slots.expires_at = slots.expires_at.max(expires_at);
            }
            Ok(step.decisions)
        };
        let key = Key::unnamed(key);
        if let Some(mut slots) = self.map.get_mut(key) {
            return step(&mut slots);
        }
        // A new caller: the insert re-checks under the shard lock, as
        // another call may have inserted the key in the meantime.
        self.map.update_or_insert(key, step, || {
            let mut slots = Slots::default();
            let out = step(&mut slots);
            ((!slots.slots.is_empty()).then_some(slots), out)
        })
    }

    /// One bounded slice of a sweep over shard `shard` (see
    /// [`ShardedMap::sweep_shard`]): drops the slots that expired by `now`,
    /// and the callers left with none.
    pub(crate) fn sweep_shard(
        &self,
        shard: usize,
        from: usize,
        budget: &mut Budget,
        mode: Mode,
        now: Micros,
    ) -> Option<Walk> {
        self.map.sweep_shard(shard, from, budget, mode, |s| {
            s.slots.retain(|slot| slot.expires_at > now);
            s.expires_at > now && !s.slots.is_empty()
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.map.capacity()
    }

    pub(crate) fn walk_len(&self) -> usize {
        self.map.walk_len()
    }
}
