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

use dashmap::DashMap;
use ratelimit_core::model::{self, Charge, State};
use ratelimit_core::{AlgorithmKind, Decision, Micros, Result};

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

/// The map of callers checked against several quotas at once.
#[derive(Default)]
pub(crate) struct MultiMap {
    map: DashMap<Box<[u8]>, Slots, foldhash::fast::RandomState>,
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
        let mut entry = match self.map.get_mut(key) {
            Some(e) => e,
            None => self.map.entry(Box::from(key)).or_default(),
        };
        let slots = entry.value_mut();
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
    }

    /// Drops callers whose every state has expired; returns how many.
    pub(crate) fn sweep(&self, now: Micros) -> usize {
        let before = self.map.len();
        self.map.retain(|_, s| {
            s.slots.retain(|slot| slot.expires_at > now);
            s.expires_at > now && !s.slots.is_empty()
        });
        before.saturating_sub(self.map.len())
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn shrink_to_fit(&self) {
        self.map.shrink_to_fit();
    }
}
