//! Contract 9: many tasks on many store instances, one key.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratelimit_core::{AlgorithmKind, Clock, ManualClock, Quota, Rate, Store, SystemClock};

use super::scenario::{T0, case_prefix, describe};
use super::{Contract, StoreFactory, SuiteConfig, Violation};

const LIMIT: u64 = 50;

fn quota(kind: AlgorithmKind, window: Duration) -> Quota {
    let rate = Rate::new(LIMIT, window);
    match kind {
        AlgorithmKind::FixedWindow => Quota::fixed_window(rate),
        AlgorithmKind::SlidingWindow => Quota::sliding_window(rate),
        AlgorithmKind::SlidingLog => Quota::sliding_log(rate),
        // Capacity L, refilling one token per window: nothing refills during a run.
        _ => Quota::token_bucket(Rate::new(1, window), LIMIT),
    }
    .expect("valid quota")
}

struct Tally {
    admitted: u64,
    attempts: u64,
    errors: u64,
    first_error: Option<String>,
}

/// Hammers one key from `instances × tasks` tasks until `max_attempts`
/// decisions were made or `duration` passed.
async fn hammer(
    stores: &[Arc<dyn Store>],
    tasks: usize,
    quota: &Quota,
    key: &[u8],
    max_attempts: u64,
    duration: Duration,
) -> Tally {
    let admitted = Arc::new(AtomicU64::new(0));
    let attempts = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
    let deadline = Instant::now() + duration;
    let mut handles = Vec::new();
    for store in stores {
        for _ in 0..tasks {
            let (store, quota, key) = (store.clone(), quota.clone(), key.to_vec());
            let (admitted, attempts, errors, first_error) = (
                admitted.clone(),
                attempts.clone(),
                errors.clone(),
                first_error.clone(),
            );
            handles.push(tokio::spawn(async move {
                while attempts.fetch_add(1, Ordering::SeqCst) < max_attempts
                    && Instant::now() < deadline
                {
                    match store.decide(&key, &quota, 1).await {
                        Ok(d) if d.allowed => {
                            admitted.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(_) => {}
                        Err(e) => {
                            errors.fetch_add(1, Ordering::SeqCst);
                            first_error
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert(e.to_string());
                        }
                    }
                }
            }));
        }
    }
    for h in handles {
        let _ = h.await;
    }
    let first_error = first_error.lock().unwrap_or_else(|p| p.into_inner()).take();
    Tally {
        admitted: admitted.load(Ordering::SeqCst),
        attempts: attempts.load(Ordering::SeqCst).min(max_attempts),
        errors: errors.load(Ordering::SeqCst),
        first_error,
    }
}

/// Any store error during a concurrency run is a violation in itself.
fn no_errors(t: &Tally, q: &Quota, stores: usize, tasks: usize, on: &str) -> Result<(), Violation> {
    if t.errors == 0 {
        return Ok(());
    }
    Err(violation(
        q,
        stores,
        tasks,
        format!(
            "{} of {} calls failed{on}; first error: {}",
            t.errors,
            t.attempts,
            t.first_error.clone().unwrap_or_default()
        ),
    ))
}

fn violation(quota: &Quota, stores: usize, tasks: usize, message: String) -> Violation {
    Violation {
        contract: Contract::Concurrency,
        message,
        sequence: format!(
            "  quota: {}\n  {stores} store instances × {tasks} tasks, one key, cost 1 per call",
            describe(quota)
        ),
    }
}

/// Contract 9 on a frozen injected clock: `instances × tasks` concurrent
/// callers on one key admit **exactly** L (no time passes, so no more can be
/// admitted, and with enough attempts no fewer).
pub async fn concurrency(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    for kind in AlgorithmKind::ALL {
        let q = quota(kind, Duration::from_secs(60));
        let clock = ManualClock::new(T0 + 17);
        let stores = factory.stores(config.instances, Some(clock)).await;
        let key = case_prefix();
        let t = hammer(
            &stores,
            config.tasks_per_instance,
            &q,
            &key,
            LIMIT * 8,
            config.concurrency_duration * 4,
        )
        .await;
        no_errors(&t, &q, stores.len(), config.tasks_per_instance, "")?;
        if t.admitted > LIMIT {
            return Err(violation(
                &q,
                stores.len(),
                config.tasks_per_instance,
                format!(
                    "admitted {} of {} calls at one instant, but the limit is {LIMIT}: concurrent calls over-admitted",
                    t.admitted, t.attempts
                ),
            ));
        }
        if t.attempts >= LIMIT && t.admitted < LIMIT {
            return Err(violation(
                &q,
                stores.len(),
                config.tasks_per_instance,
                format!(
                    "admitted only {} of {} calls at one instant; the limit {LIMIT} should all be admitted",
                    t.admitted, t.attempts
                ),
            ));
        }
    }
    Ok(())
}

/// Contract 9 on the stores' own clock (Redis `TIME`, or the system clock):
/// windows of one hour (a token bucket refilling one token per hour), so the
/// bound is L; a fixed or sliding window that crosses a calendar boundary
/// during the run may admit one more window's worth.
pub async fn concurrency_server_clock(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<(), Violation> {
    let hour = Duration::from_secs(3600);
    for kind in AlgorithmKind::ALL {
        let q = quota(kind, hour);
        let stores = factory.stores(config.instances, None).await;
        let key = case_prefix();
        let start = SystemClock.now();
        let t = hammer(
            &stores,
            config.tasks_per_instance,
            &q,
            &key,
            LIMIT * 20,
            config.concurrency_duration,
        )
        .await;
        let end = SystemClock.now();
        // Allow 5 s of skew between this machine's clock and the store's.
        let slack = 5_000_000;
        let w = 3_600_000_000;
        let crossed = (start.saturating_sub(slack)) / w != (end + slack) / w;
        let bound = match (kind, crossed) {
            (AlgorithmKind::FixedWindow, true) => 2 * LIMIT,
            (AlgorithmKind::SlidingWindow, true) => LIMIT + 1,
            (AlgorithmKind::TokenBucket, _) => LIMIT + 1,
            _ => LIMIT,
        };
        no_errors(
            &t,
            &q,
            stores.len(),
            config.tasks_per_instance,
            " on the server clock",
        )?;
        if t.admitted > bound {
            return Err(violation(
                &q,
                stores.len(),
                config.tasks_per_instance,
                format!(
                    "admitted {} of {} calls within {:?} on the server clock, but at most {bound} may pass",
                    t.admitted,
                    t.attempts,
                    Duration::from_micros(end - start)
                ),
            ));
        }
    }
    Ok(())
}
