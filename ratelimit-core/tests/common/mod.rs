//! A model-backed store for the limiter's tests: atomic over several
//! quotas, with a switch that makes it fail, and a call counter.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ratelimit_core::model::{self, Charge, State};
use ratelimit_core::store::{Answer, Capabilities, Decisions, Request};
use ratelimit_core::{Clock, Quota, Result, Store, StoreError};

/// Per (key, policy name, algorithm): the state and when it expires.
type Slots = HashMap<(Vec<u8>, String, &'static str), (State, u64)>;

#[derive(Debug)]
pub struct ModelStore {
    clock: Arc<dyn Clock>,
    state: Mutex<Slots>,
    pub calls: AtomicU64,
    pub down: AtomicBool,
    /// Whether it answers in place (as an in-process store does), so the
    /// limiter takes its synchronous path.
    pub sync: bool,
}

impl ModelStore {
    pub fn new(clock: impl Clock + 'static) -> Self {
        Self::with_sync(clock, false)
    }

    /// A store that answers in place when `sync` is set.
    pub fn with_sync(clock: impl Clock + 'static, sync: bool) -> Self {
        Self {
            clock: Arc::new(clock),
            state: Mutex::default(),
            calls: AtomicU64::new(0),
            down: AtomicBool::new(false),
            sync,
        }
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn slot(key: &[u8], q: &Quota) -> (Vec<u8>, String, &'static str) {
        (key.to_vec(), q.name().to_owned(), q.kind().code())
    }
}

impl Store for ModelStore {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        if self.sync {
            return Answer::ready(self.decide_all_now(request.key, request.charges));
        }
        Answer::pending(async move { self.decide_all_now(request.key, request.charges) })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .atomic(true)
            .in_process(self.sync)
            .shared_clock(Some(self.clock.clone()))
    }
}

impl ModelStore {
    fn decide_all_now(&self, key: &[u8], charges: &[Charge<'_>]) -> Result<Decisions> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::message("connection refused", true));
        }
        for c in charges {
            c.quota.check_cost(c.cost)?;
        }
        let now = self.clock.now();
        let mut map = self.state.lock().unwrap();
        let states = charges
            .iter()
            .map(|c| {
                map.get(&Self::slot(key, c.quota))
                    .filter(|(_, exp)| *exp > now)
                    .map(|(s, _)| s.clone())
            })
            .collect();
        let step = model::decide_all(charges, states, now)?;
        for (c, w) in charges.iter().zip(step.writes) {
            if let Some((s, ttl)) = w {
                map.insert(Self::slot(key, c.quota), (s, now + ttl));
            }
        }
        Ok(step.decisions.into())
    }
}
