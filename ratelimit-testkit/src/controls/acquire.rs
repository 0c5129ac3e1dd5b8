//! `Limiter::acquire` over a real store: pacing, deadlines, a shared quota,
//! cancellation.

use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::{
    AcquireError, Algorithm, AlgorithmKind, Clock, Limiter, ManualClock, Micros, Quota, Rate,
    Source, Store, Verdict,
};

use super::{ClockTimer, Control, ControlViolation, T0, build, configure, namespace, one_store};
use crate::{StoreFactory, SuiteConfig};

fn fail(message: String) -> ControlViolation {
    ControlViolation::new(Control::Acquire, message)
}

fn limiter(
    store: Arc<dyn Store>,
    quota: &Quota,
    namespace: &str,
    clock: &ManualClock,
    timer: &ClockTimer,
) -> Result<Limiter, ControlViolation> {
    build(
        configure(
            Limiter::builder_arc(store),
            std::slice::from_ref(quota),
            &[false],
            namespace,
            clock,
        )
        .timer(timer.clone()),
        Control::Acquire,
    )
}

/// An admitted verdict from the store, or why not.
fn admitted(what: &str, v: &Verdict) -> Result<(), ControlViolation> {
    if v.allowed() && v.decision.source == Source::Store {
        Ok(())
    } else {
        Err(fail(format!(
            "{what}: acquire returned a verdict that is not an admission by the store: {v:?}"
        )))
    }
}

/// One worker's `acquire`s on this store are paced by the exact
/// `retry_after`, and deadlines are honoured.
///
/// A token bucket of 10 per second, burst 1, on a [`ManualClock`] moved
/// only by the limiter's [`ClockTimer`]: 20 `acquire`s in a row are each
/// admitted by the store, at least 100 ms apart and all within 19 × 125 ms
/// (the exact wait plus at most a quarter of jitter). Then, with the bucket
/// empty, a deadline of 10 ms (shorter than the 100 ms wait) is
/// `AcquireError::Deadline` with `next` = 100 ms, at once (the clock has not
/// moved); a deadline of 200 ms is admitted 100-125 ms later; a cost the
/// bucket can never hold is `AcquireError::Cost`.
pub async fn acquire_paces_one_worker(factory: &dyn StoreFactory) -> Result<(), ControlViolation> {
    let clock = ManualClock::new(T0);
    let timer = ClockTimer::new(clock.clone());
    let store = one_store(factory, &clock, Control::Acquire).await?;
    let quota = Quota::token_bucket(Rate::per_second(10), 1)
        .and_then(|q| q.named("pace"))
        .expect("valid quota");
    let l = limiter(store, &quota, &namespace("pace"), &clock, &timer)?;
    let mut times = Vec::new();
    for i in 0..20 {
        let v = l
            .acquire("worker", 1, Duration::from_secs(5))
            .await
            .map_err(|e| fail(format!("acquire #{i} with a deadline of 5 s: {e}")))?;
        admitted(&format!("acquire #{i}"), &v)?;
        times.push(clock.now() - T0);
    }
    let too_fast = times.windows(2).any(|w| w[1] - w[0] < 100_000);
    if times[0] != 0 || too_fast || times[19] > 19 * 125_000 {
        return Err(fail(format!(
            "20 acquires on 10 per second, burst 1, admitted at {times:?} µs: expected the first \
             at once, then at least 100,000 µs apart, the last by 2,375,000 µs"
        )));
    }

    let before = clock.now();
    match l.acquire("worker", 1, Duration::from_millis(10)).await {
        Err(AcquireError::Deadline {
            next: Some(next), ..
        }) if next == Duration::from_millis(100) && clock.now() == before => {}
        other => {
            return Err(fail(format!(
                "with the bucket empty, acquire with a deadline of 10 ms gave {other:?} after \
                 {} µs (expected AcquireError::Deadline with next = 100 ms, at once)",
                clock.now() - before
            )));
        }
    }
    let v = l
        .acquire("worker", 1, Duration::from_millis(200))
        .await
        .map_err(|e| fail(format!("acquire with a deadline of 200 ms: {e}")))?;
    admitted("acquire with a deadline of 200 ms", &v)?;
    let waited = clock.now() - before;
    if !(100_000..=125_000).contains(&waited) {
        return Err(fail(format!(
            "acquire with a deadline of 200 ms waited {waited} µs for a token due in 100,000 µs"
        )));
    }
    match l.acquire("worker", 2, Duration::from_secs(5)).await {
        Err(AcquireError::Cost(_)) => Ok(()),
        other => Err(fail(format!(
            "acquire of cost 2 on a bucket of 1 gave {other:?}, expected AcquireError::Cost"
        ))),
    }
}

/// The most cost `quota` lets one key admit in the span `[a, b]`, counting
/// a fresh state at `a`: a bound the store must respect whatever the order
/// of the calls.
fn admissible(quota: &Quota, a: Micros, b: Micros) -> u64 {
    match quota.algorithm() {
        // Contracts 2 and 3: at most L per calendar window.
        Algorithm::FixedWindow(w) | Algorithm::SlidingWindow(w) => {
            let width = w.window_micros();
            (b / width - a / width + 1) * w.limit()
        }
        // Contract 4: at most L in every trailing window.
        Algorithm::SlidingLog(w) => ((b - a) / w.window_micros() + 1) * w.limit(),
        // Contract 5: at most capacity + rate × (b - a).
        Algorithm::TokenBucket(t) => {
            let refilled = u128::from(b - a) * u128::from(t.refill()) / u128::from(t.unit());
            t.capacity() + u64::try_from(refilled).unwrap_or(u64::MAX)
        }
    }
}

/// A quota of 10 per second (a token bucket: 10 per second, burst 5).
fn ten_per_second(kind: AlgorithmKind, name: &str) -> Quota {
    let rate = Rate::per_second(10);
    match kind {
        AlgorithmKind::FixedWindow => Quota::fixed_window(rate),
        AlgorithmKind::SlidingWindow => Quota::sliding_window(rate),
        AlgorithmKind::SlidingLog => Quota::sliding_log(rate),
        _ => Quota::token_bucket(rate, 5),
    }
    .and_then(|q| q.named(name))
    .expect("valid quota")
}

/// One algorithm's run of [`acquire_shares_one_quota`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedQuotaRun {
    /// The algorithm.
    pub kind: AlgorithmKind,
    /// The cost the workers acquired together.
    pub acquired: u64,
    /// What the store still admitted at the end.
    pub left: u64,
    /// What the quota allows over the span: `acquired + left` is at most this.
    pub bound: u64,
    /// The span of the injected clock from the first call to the last, in µs.
    pub span_micros: u64,
    /// The denials the workers waited out.
    pub denials: u64,
}

/// Acquires each worker makes in [`acquire_shares_one_quota`].
const ACQUIRES_PER_WORKER: u64 = 6;

/// Workers sharing one quota through `acquire` get no more than the quota
/// allows, and all get what they asked.
///
/// For each algorithm (10 per second; a token bucket of 10 per second,
/// burst 5): `config.instances` workers (at least 2), each with its own
/// limiter on its own store instance, all on one [`ManualClock`] moved only
/// by their [`ClockTimer`] (each worker a [`super::Participant`]: sleepers
/// wake one after another, in order, as they would in real time), run as
/// concurrent tasks. Each makes 6 `acquire`s of cost 1 or 2
/// (alternating) on one caller with a deadline of 30 s. Every `acquire` must
/// be admitted by the store (not by a failure policy, not past its
/// deadline); the workers together must have been denied at least once
/// (they needed more than the quota gives at once). Then the store's own
/// state is read at the end of the span: what it still admits (one more
/// call's `remaining` + 1) plus what the workers got must not exceed what
/// the quota allows from the first call to the last on the injected clock
/// (at most L per calendar window; per trailing window for a sliding log;
/// capacity + rate × span for a token bucket). Returns each algorithm's
/// numbers.
pub async fn acquire_shares_one_quota(
    factory: &dyn StoreFactory,
    config: &SuiteConfig,
) -> Result<Vec<SharedQuotaRun>, ControlViolation> {
    let workers = config.instances.max(2);
    let mut runs = Vec::new();
    for kind in AlgorithmKind::ALL {
        let quota = ten_per_second(kind, "shared");
        let clock = ManualClock::new(T0);
        let timer = ClockTimer::new(clock.clone());
        let stores = factory.stores(workers, Some(clock.clone())).await;
        if stores.len() != workers {
            return Err(fail(format!(
                "the factory returned {} stores, {workers} were asked for",
                stores.len()
            )));
        }
        let ns = namespace("shared");
        let mut tasks = Vec::new();
        for (w, store) in stores.iter().enumerate() {
            let l = limiter(Arc::clone(store), &quota, &ns, &clock, &timer)?;
            let participant = timer.participant();
            tasks.push(tokio::spawn(async move {
                let _participant = participant;
                let mut got = Vec::new();
                for j in 0..ACQUIRES_PER_WORKER {
                    let cost = 1 + (w as u64 + j) % 2;
                    let r = l.acquire("pool", cost, Duration::from_secs(30)).await;
                    got.push((cost, r));
                }
                (got, l.stats().denied)
            }));
        }
        let (mut total, mut denied) = (0u64, 0u64);
        for (w, task) in tasks.into_iter().enumerate() {
            let (got, d) = task
                .await
                .map_err(|e| fail(format!("{kind}: worker {w} panicked: {e}")))?;
            denied += d;
            for (j, (cost, r)) in got.into_iter().enumerate() {
                let v = r.map_err(|e| {
                    fail(format!(
                        "{kind}: worker {w}, acquire #{j} of cost {cost} with a deadline of 30 s: {e}"
                    ))
                })?;
                admitted(&format!("{kind}: worker {w}, acquire #{j}"), &v)?;
                total += cost;
            }
        }
        let end = clock.now();
        let probe = limiter(Arc::clone(&stores[0]), &quota, &ns, &clock, &timer)?;
        let d = probe.check("pool").await;
        if !matches!(d.source, Source::Store) {
            return Err(fail(format!(
                "{kind}: the store did not decide the final check: {d:?}"
            )));
        }
        let left = if d.allowed { d.remaining + 1 } else { 0 };
        let bound = admissible(&quota, T0, end);
        if total + left > bound {
            return Err(fail(format!(
                "{kind}, {} per {:?}: {workers} workers acquired {total} and the store still \
                 admits {left}, over the {bound} the quota allows in the {} µs from the first \
                 call to the last",
                quota.limit(),
                quota.window(),
                end - T0
            )));
        }
        if denied == 0 || total <= quota.limit() {
            return Err(fail(format!(
                "{kind}: {workers} workers acquired {total} with {denied} denials: the quota \
                 never made them wait, nothing was checked"
            )));
        }
        runs.push(SharedQuotaRun {
            kind,
            acquired: total,
            left,
            bound,
            span_micros: end - T0,
            denials: denied,
        });
    }
    Ok(runs)
}

/// Cancelled `acquire`s count nothing, wherever they are cancelled.
///
/// For each algorithm (4 per second; a token bucket of 4 per second,
/// burst 4), on a [`ManualClock`] standing still: 4 calls use the quota
/// up. The limiter's [`ClockTimer`] then holds every wait. 4 `acquire`s
/// (costs 1 to 4) are started and cancelled once all 4 are waiting; 4 more
/// are cancelled at once or after a few task switches (before, during or
/// after their store call). None may have returned. After 2 s (the quota
/// has refilled), exactly 4 calls of cost 1 are admitted and the fifth is
/// denied: nothing was counted, and nothing was reserved, for the
/// cancelled ones.
pub async fn acquire_cancel_safe(factory: &dyn StoreFactory) -> Result<(), ControlViolation> {
    for kind in AlgorithmKind::ALL {
        let rate = Rate::per_second(4);
        let quota = match kind {
            AlgorithmKind::FixedWindow => Quota::fixed_window(rate),
            AlgorithmKind::SlidingWindow => Quota::sliding_window(rate),
            AlgorithmKind::SlidingLog => Quota::sliding_log(rate),
            _ => Quota::token_bucket(rate, 4),
        }
        .and_then(|q| q.named("cancel"))
        .expect("valid quota");
        let clock = ManualClock::new(T0);
        let timer = ClockTimer::new(clock.clone());
        let store = one_store(factory, &clock, Control::Acquire).await?;
        let l = limiter(store, &quota, &namespace("cancel"), &clock, &timer)?;
        for i in 0..4 {
            let d = l.check("w").await;
            if !d.allowed || d.source != Source::Store {
                return Err(fail(format!(
                    "{kind}: call {i} of 4 on a fresh quota of 4: {d:?}"
                )));
            }
        }
        timer.hold(true);
        let spawn = |cost: u64| {
            let l = l.clone();
            tokio::spawn(async move { l.acquire("w", cost, Duration::from_secs(30)).await })
        };
        let waiting: Vec<_> = (1..=4).map(spawn).collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while timer.held() < 4 {
            if std::time::Instant::now() > deadline {
                return Err(fail(format!(
                    "{kind}: 4 acquires on a used-up quota did not all start waiting within 10 \
                     s ({} did)",
                    timer.held()
                )));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let mut handles = Vec::new();
        for h in waiting {
            h.abort();
            handles.push(h);
        }
        for k in 0..4 {
            let h = spawn(1 + k);
            for _ in 0..k {
                tokio::task::yield_now().await;
            }
            h.abort();
            handles.push(h);
        }
        for h in handles {
            match h.await {
                Err(e) if e.is_cancelled() => {}
                other => {
                    return Err(fail(format!(
                        "{kind}: an acquire on a used-up quota, on a clock standing still, \
                         returned instead of waiting: {other:?}"
                    )));
                }
            }
        }
        timer.hold(false);
        clock.advance(Duration::from_secs(2));
        let mut got = Vec::new();
        for _ in 0..5 {
            let d = l.check("w").await;
            if d.source != Source::Store {
                return Err(fail(format!("{kind}: the store did not decide: {d:?}")));
            }
            got.push(d.allowed);
        }
        if got != [true, true, true, true, false] {
            return Err(fail(format!(
                "{kind}: after 8 cancelled acquires and a refill, 5 calls of cost 1 on a quota \
                 of 4 gave {got:?}: the cancelled acquires counted or reserved something"
            )));
        }
    }
    Ok(())
}
