//! The control checks must prove they can fail: each is run against the
//! in-process store with one deliberate flaw, and must reject it; the same
//! store without the flaw passes every check.
//!
//! The deny-cache check's own self-test (`deny_cache_check_can_fail`,
//! flawed caches in front of a correct store) runs against every real
//! store, in each store crate's `tests/controls.rs`; here it runs once more
//! on the in-process store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ratelimit_core::model::Charge;
use ratelimit_core::store::{Answer, Capabilities, Decisions, Request};
use ratelimit_core::{Decision, ManualClock, Result, Store, StoreExt, SystemClock};
use ratelimit_local::LocalStore;
use ratelimit_testkit::controls::{self, Control};
use ratelimit_testkit::{StoreFactory, SuiteConfig};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Flaw {
    /// None: the control.
    None,
    /// Each instance keeps its own map (the factory's instances share nothing).
    PerInstanceState,
    /// Shadow charges are decided from a fresh state and never written.
    ShadowNotCounted,
    /// `retry_after` doubled.
    RetryDoubled,
    /// Every denied unit is owed: the next calls after a denial are denied
    /// until the debt is paid (a reservation that outlives its caller).
    DenialsReserve,
}

#[derive(Debug)]
struct Wrong {
    inner: Arc<dyn Store>,
    flaw: Flaw,
    debt: Mutex<HashMap<Vec<u8>, u64>>,
}

impl Wrong {
    fn new(inner: Arc<dyn Store>, flaw: Flaw) -> Self {
        Self {
            inner,
            flaw,
            debt: Mutex::default(),
        }
    }

    /// Applies the decision-level flaws to one decision.
    fn bend(&self, key: &[u8], cost: u64, mut d: Decision) -> Decision {
        match self.flaw {
            Flaw::RetryDoubled => d.retry_after = d.retry_after.map(|r| r * 2),
            Flaw::DenialsReserve => {
                let mut debt = self.debt.lock().unwrap();
                let owed = debt.entry(key.to_vec()).or_default();
                if !d.allowed {
                    *owed += cost;
                } else if *owed > 0 {
                    *owed = owed.saturating_sub(cost);
                    d.allowed = false;
                    d.retry_after = Some(Duration::from_millis(1));
                }
            }
            _ => {}
        }
        d
    }
}

impl Wrong {
    async fn answer(&self, request: Request<'_>) -> Result<Decisions> {
        let (key, charges) = (request.key, request.charges);
        if self.flaw != Flaw::ShadowNotCounted || charges.len() == 1 {
            let ds = self.inner.decide(request).await?;
            return Ok(charges
                .iter()
                .zip(ds)
                .map(|(c, d)| self.bend(key, c.cost, d))
                .collect());
        }
        let enforced: Vec<Charge<'_>> = charges.iter().filter(|c| !c.shadow).copied().collect();
        let mut decided = self
            .inner
            .decide(Request::new(key, &enforced).with_deadline(request.deadline))
            .await?
            .into_iter();
        let fresh = LocalStore::with_clock(ManualClock::new(controls::T0));
        let mut out = Decisions::default();
        for c in charges {
            out.push(if c.shadow {
                fresh.decide_one(b"fresh", c.quota, c.cost).await?
            } else {
                decided.next().expect("one decision per enforced charge")
            });
        }
        Ok(out)
    }
}

impl Store for Wrong {
    fn decide<'a>(&'a self, request: Request<'a>) -> Answer<'a> {
        Answer::pending(self.answer(request))
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities().in_process(false)
    }
}

struct Factory(Flaw);

#[async_trait]
impl StoreFactory for Factory {
    async fn stores(&self, n: usize, clock: Option<ManualClock>) -> Vec<Arc<dyn Store>> {
        let map = |clock: &Option<ManualClock>| -> Arc<dyn Store> {
            match clock {
                Some(c) => Arc::new(LocalStore::with_clock(c.clone())),
                None => Arc::new(LocalStore::with_clock(SystemClock)),
            }
        };
        let shared = map(&clock);
        (0..n)
            .map(|_| {
                let inner = if self.0 == Flaw::PerInstanceState {
                    map(&clock)
                } else {
                    Arc::clone(&shared)
                };
                Arc::new(Wrong::new(inner, self.0)) as Arc<dyn Store>
            })
            .collect()
    }
}

fn rejected<T: std::fmt::Debug>(
    r: std::result::Result<T, controls::ControlViolation>,
    flaw: Flaw,
    control: Control,
    says: &str,
) {
    match r {
        Err(v) => {
            println!("{flaw:?} rejected: {v}\n");
            assert_eq!(v.control, control, "{v}");
            assert!(
                v.message.contains(says),
                "{flaw:?}: expected {says:?} in: {v}"
            );
        }
        Ok(x) => panic!("the check accepted a store with the flaw {flaw:?}: {x:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_flawless_store_passes_every_control_check() {
    controls::run_controls(&Factory(Flaw::None), &SuiteConfig::in_process())
        .await
        .unwrap_or_else(|v| panic!("{v}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shadow_quota_that_is_not_counted_is_rejected() {
    let r = controls::shadow_quotas(&Factory(Flaw::ShadowNotCounted)).await;
    rejected(r, Flaw::ShadowNotCounted, Control::Shadow, "sources");
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_over_separate_state_are_rejected() {
    let r = controls::acquire_shares_one_quota(
        &Factory(Flaw::PerInstanceState),
        &SuiteConfig::in_process(),
    )
    .await;
    rejected(r, Flaw::PerInstanceState, Control::Acquire, "over the");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_doubled_retry_after_is_rejected_by_the_pacing_check() {
    let r = controls::acquire_paces_one_worker(&Factory(Flaw::RetryDoubled)).await;
    rejected(r, Flaw::RetryDoubled, Control::Acquire, "20 acquires");
}

#[tokio::test(flavor = "multi_thread")]
async fn denials_that_reserve_are_rejected_by_the_cancellation_check() {
    let r = controls::acquire_cancel_safe(&Factory(Flaw::DenialsReserve)).await;
    rejected(
        r,
        Flaw::DenialsReserve,
        Control::Acquire,
        "counted or reserved",
    );
}

#[cfg(feature = "deny-cache")]
#[tokio::test(flavor = "multi_thread")]
async fn the_deny_cache_check_rejects_every_flawed_cache() {
    let rejected =
        controls::deny_cache_check_can_fail(&Factory(Flaw::None), &SuiteConfig::in_process())
            .await
            .unwrap_or_else(|v| panic!("{v}"));
    assert_eq!(rejected.len(), controls::Flaw::ALL.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_lease_check_rejects_every_flawed_lease_and_passes_the_limiters_own() {
    let rejected = controls::lease_check_can_fail(&Factory(Flaw::None), &SuiteConfig::in_process())
        .await
        .unwrap_or_else(|v| panic!("{v}"));
    for (flaw, why) in &rejected {
        println!("leases that {flaw:?}: rejected: {why}\n");
    }
    assert_eq!(rejected.len(), controls::LeaseFlaw::ALL.len());
    let report =
        controls::leases_follow_their_rules(&Factory(Flaw::None), &SuiteConfig::in_process())
            .await
            .unwrap_or_else(|v| panic!("{v}"));
    println!("{report:?}");
    assert!(
        report.leased_admitted > 0 && report.leased > report.leased_admitted,
        "the replays admitted and denied from leases: {report:?}"
    );
}
