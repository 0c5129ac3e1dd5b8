//! A stalled store under load: calls the limiter answered by its failure
//! policy must never be counted once the store serves again.
//!
//! [`answered_by_policy_counts_nothing`] runs concurrent callers through two
//! limiters over one store (one failing open, one failing closed; 20 ms
//! timeout, no circuit breaker, so every call during the stall is sent),
//! stalls the store for a while (a `SIGSTOP`ped `redis-server`), lets it
//! serve again, and then reads each caller's count back from the store.
//!
//! Every call is classified by what the limiter answered:
//!
//! - answered by the store: admitted calls are counted, and only these
//!   must be;
//! - answered by policy, **started after the stall began and past its
//!   deadline before the stall ended**: the store could not have run it in
//!   time, so it must count nothing, whenever the backlog runs;
//! - the other policy answers (in flight when the stall began, or whose
//!   deadline fell after it ended): the store may have run them just in time
//!   with the reply arriving late, which no protocol can rule out; they may
//!   be counted.
//!
//! The check: `store-admitted <= counted <= store-admitted + ambiguous`,
//! with hundreds of calls of the second kind (so a store that runs its
//! backlog fails by a wide margin).
//!
//! The store must decide on an injected clock that stands still (a
//! `ManualClock` nobody advances), so that each caller's count is exact
//! whatever the wall clock does; deadlines use real time (they are about
//! when the caller stopped waiting).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratelimit_core::{FailurePolicy, Limiter, Quota, Rate, Source, Store};

/// The limiters' timeout.
pub const TIMEOUT: Duration = Duration::from_millis(20);

/// Concurrent callers per limiter.
const TASKS: usize = 4;

/// Load before the stall and after the store serves again.
const SETTLE: Duration = Duration::from_millis(300);

/// The limit of the quota: far above what the run can spend.
const LIMIT: u64 = 1_000_000;

/// One limiter's calls, classified (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Calls the store answered and admitted.
    pub store_admitted: u64,
    /// Calls the store answered and denied.
    pub store_denied: u64,
    /// Policy answers that must count nothing.
    pub late: u64,
    /// Policy answers that may have been counted.
    pub ambiguous: u64,
    /// The count read back from the store at the end.
    pub counted: u64,
}

/// What [`answered_by_policy_counts_nothing`] saw, per failure policy.
#[derive(Debug, Clone, Default)]
pub struct StallReport {
    /// The fail-open limiter.
    pub open: Tally,
    /// The fail-closed limiter.
    pub closed: Tally,
}

impl Tally {
    /// The check of the module docs, as a message on failure.
    pub fn check(&self, policy: &str) -> Result<(), String> {
        if self.late < 50 {
            return Err(format!(
                "{policy}: only {} calls were answered by policy within the stall; the test proves nothing ({self:?})",
                self.late
            ));
        }
        if self.counted < self.store_admitted {
            return Err(format!(
                "{policy}: the store counted {} calls but admitted {} ({self:?})",
                self.counted, self.store_admitted
            ));
        }
        let extra = self.counted - self.store_admitted;
        if extra > self.ambiguous {
            return Err(format!(
                "{policy}: {extra} calls counted beyond the {} the store admitted, more than the {} that may have run in time: calls answered by policy were counted later ({self:?})",
                self.store_admitted, self.ambiguous
            ));
        }
        Ok(())
    }
}

/// One call as the limiter answered it.
struct Call {
    start: Instant,
    source: Source,
    allowed: bool,
}

fn limiter(store: Arc<dyn Store>, policy: FailurePolicy, namespace: &str) -> Limiter {
    Limiter::builder_arc(store)
        .quota(Quota::fixed_window(Rate::per_hour(LIMIT)).expect("valid quota"))
        .failure_policy(policy)
        .timeout(TIMEOUT)
        .no_circuit_breaker()
        .namespace(namespace)
        .expect("valid namespace")
        .build()
        .expect("valid limiter")
}

/// Runs the scenario of the module docs: load, `stall()`, wait `pause`,
/// `resume()`, load until the store answers again; returns the tallies
/// (check each with [`Tally::check`]). The store must use an injected
/// clock that does not move. Panics if the store never answers again
/// within 10 s of `resume()`.
pub async fn answered_by_policy_counts_nothing(
    store: Arc<dyn Store>,
    pause: Duration,
    stall: impl FnOnce(),
    resume: impl FnOnce(),
) -> StallReport {
    let ns = format!("stall{}", rand::random::<u32>());
    let open = limiter(store.clone(), FailurePolicy::FailOpen, &format!("{ns}o"));
    let closed = limiter(store.clone(), FailurePolicy::FailClosed, &format!("{ns}c"));
    // Warm up: scripts loaded, the server's clock learnt. These calls are
    // counted: they are tallied below.
    for l in [&open, &closed] {
        let d = l.check("caller").await;
        assert_eq!(
            (d.source, d.allowed),
            (Source::Store, true),
            "the store does not answer before the stall"
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for l in [&open, &closed] {
        for _ in 0..TASKS {
            let (l, stop) = (l.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut calls = Vec::new();
                // Bounded: the run stops itself after 60 s at most.
                let give_up = Instant::now() + Duration::from_secs(60);
                while !stop.load(Ordering::Relaxed) && Instant::now() < give_up {
                    let start = Instant::now();
                    let d = l.check("caller").await;
                    calls.push(Call {
                        start,
                        source: d.source,
                        allowed: d.allowed,
                    });
                    tokio::task::yield_now().await;
                }
                calls
            }));
        }
    }
    tokio::time::sleep(SETTLE).await;
    stall();
    let stalled = Instant::now();
    tokio::time::sleep(pause).await;
    let resumed = Instant::now();
    resume();
    // Until the store answers again, then a little more load.
    let back = Instant::now() + Duration::from_secs(10);
    let mut serving = false;
    while Instant::now() < back {
        if open.check("probe").await.source == Source::Store {
            serving = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(serving, "the store did not answer within 10 s of resuming");
    tokio::time::sleep(SETTLE).await;
    stop.store(true, Ordering::Relaxed);
    let mut per = [Vec::new(), Vec::new()];
    for (i, t) in tasks.into_iter().enumerate() {
        per[i / TASKS].extend(t.await.expect("load task"));
    }
    let mut report = StallReport::default();
    for ((l, calls), tally) in [&open, &closed]
        .into_iter()
        .zip(per)
        .zip([&mut report.open, &mut report.closed])
    {
        // The warm-up call.
        tally.store_admitted += 1;
        for c in &calls {
            match c.source {
                Source::Store if c.allowed => tally.store_admitted += 1,
                Source::Store => tally.store_denied += 1,
                _ if c.start >= stalled && c.start + TIMEOUT < resumed => tally.late += 1,
                _ => tally.ambiguous += 1,
            }
        }
        // Read the count back: one more call, answered by the store.
        let mut read = None;
        for _ in 0..100 {
            let d = l.check("caller").await;
            if d.source == Source::Store {
                read = Some(d);
                break;
            }
        }
        let d = read.expect("the store answers the final read");
        assert!(d.allowed, "the final read was denied: {d:?}");
        tally.counted = LIMIT - d.remaining - 1;
    }
    report
}
