//! Shadow quotas count but never deny.

use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::{Clock, Limiter, ManualClock, Quota, Rate, Source, Store};

use super::{Control, ControlViolation, T0, build, configure, namespace, one_store};
use crate::StoreFactory;

/// Where [`shadow_quotas`] left a shadow quota's state, for a check of the
/// stored bytes themselves (a Redis test reads the key).
#[derive(Debug, Clone)]
pub struct ShadowReport {
    /// The key the limiter gave the store: `<namespace>~<caller>`.
    pub key: Vec<u8>,
    /// The shadow quota: a fixed window of 2 per minute named `new`.
    pub quota: Quota,
    /// The cost it has counted in its window: 2.
    pub charged: u64,
    /// The instant (µs since the epoch) of every call: the store's window
    /// is the one holding it.
    pub at: u64,
}

fn named(q: Result<Quota, ratelimit_core::ConfigError>, name: &str) -> Quota {
    q.and_then(|q| q.named(name)).expect("valid quota")
}

fn fail(message: String) -> ControlViolation {
    ControlViolation::new(Control::Shadow, message)
}

/// Shadow quotas count but never deny, on this store (one store from the
/// factory, on a [`ManualClock`] that stands still at [`T0`]).
///
/// 1. An enforced fixed window of 10 per minute (`current`) and a shadow
///    one of 2 (`new`): 10 calls are all admitted, the first 2 with source
///    `Store`, the other 8 `Shadow`; 8 shadow denials are counted; no
///    header names `new` (and `RateLimit-Policy` names `current`), none
///    says `Retry-After`. The 11th call is denied by `current`. The store's
///    state then shows `new` charged: a limiter with the roles swapped
///    (`new` enforced, `current` in shadow mode) on the same keys is denied
///    by `new`, with the exact wait to the end of the minute.
/// 2. The same enforced quota with a shadow sliding window of 30 (`wide`):
///    12 calls, 10 admitted, 2 denied. The store counted exactly the 10
///    admitted calls in `wide` (and not the denied ones): with the roles
///    swapped, a cost of 21 under `wide` is denied, then a cost of 20
///    admitted with nothing left.
/// 3. A limiter whose only quota is a shadow fixed window of 1 (`trial`):
///    both calls admitted, the second with source `Shadow`, no
///    `retry_after`, no headers; the store's state shows `trial` charged
///    (enforcing it on the same keys is denied).
///
/// The state is read through a limiter with the same set of quotas because
/// a store may keep a caller's state under several quotas apart from its
/// single-quota state (the in-process store does). Returns where phase 1
/// left `new`'s state.
pub async fn shadow_quotas(factory: &dyn StoreFactory) -> Result<ShadowReport, ControlViolation> {
    let clock = ManualClock::new(T0);
    let store = one_store(factory, &clock, Control::Shadow).await?;
    let current = named(Quota::fixed_window(Rate::per_minute(10)), "current");
    let new = named(Quota::fixed_window(Rate::per_minute(2)), "new");

    // 1. Counted, never denying, never in the headers.
    let ns = namespace("shadow");
    let l = limiter(
        &store,
        &[current.clone(), new.clone()],
        &[false, true],
        &ns,
        &clock,
    )?;
    let mut sources = Vec::new();
    for i in 0..10 {
        let v = l.check_all("c", 1).await.expect("cost 1 is valid");
        if !v.allowed() {
            return Err(fail(format!(
                "call {i} of 10 was denied, with the enforced quota at 10 per minute: {v:?}"
            )));
        }
        sources.push(v.decision.source);
        let h = l.headers_all(&v);
        if h.iter().any(|(_, value)| value.contains("\"new\"")) {
            return Err(fail(format!("a header names the shadow policy: {h:?}")));
        }
        if !h
            .get("RateLimit-Policy")
            .is_some_and(|p| p.contains("\"current\""))
        {
            return Err(fail(format!(
                "RateLimit-Policy does not name the enforced policy: {h:?}"
            )));
        }
        if h.get("Retry-After").is_some() {
            return Err(fail(format!("an admitted call has a Retry-After: {h:?}")));
        }
    }
    let expected: Vec<Source> = (0..10)
        .map(|i| if i < 2 { Source::Store } else { Source::Shadow })
        .collect();
    if sources != expected {
        return Err(fail(format!(
            "sources {sources:?}, expected 2 from the store, then 8 admitted only because `new` \
             is in shadow mode"
        )));
    }
    if l.stats().shadow_denials != 8 {
        return Err(fail(format!(
            "{} shadow denials counted, expected 8: {:?}",
            l.stats().shadow_denials,
            l.stats()
        )));
    }
    let v = l.check_all("c", 1).await.expect("cost 1 is valid");
    if v.allowed() || v.decision.source != Source::Store || v.binding != 0 {
        return Err(fail(format!(
            "the 11th call passes the enforced quota of 10, or is denied by another: {v:?}"
        )));
    }
    // The same quotas with the roles swapped read the state the store kept
    // for this set of quotas (a store may keep it apart from single-quota
    // state, as the in-process one does). A denial writes nothing.
    let probe = limiter(
        &store,
        &[current.clone(), new.clone()],
        &[true, false],
        &ns,
        &clock,
    )?;
    let v = probe.check_all("c", 1).await.expect("cost 1 is valid");
    let minute = Duration::from_secs(60);
    let d = &v.quotas[1];
    if v.allowed() || d.allowed || d.source != Source::Store || d.retry_after != Some(minute) {
        return Err(fail(format!(
            "the store does not show the shadow quota `new` charged 2 of 2 this minute: \
             enforcing it (and `current` in shadow mode) on the same keys gives {v:?} (expected \
             `new` to deny with retry_after {minute:?})"
        )));
    }
    let mut key = ns.clone().into_bytes();
    key.push(ratelimit_core::limiter::NAMESPACE_SEPARATOR);
    key.push(b'c');
    let report = ShadowReport {
        key,
        quota: new,
        charged: 2,
        at: clock.now(),
    };

    // 2. Exactly the admitted calls are counted in the shadow quota.
    let wide = named(Quota::sliding_window(Rate::per_minute(30)), "wide");
    let ns = namespace("shadow");
    let l = limiter(
        &store,
        &[current.clone(), wide.clone()],
        &[false, true],
        &ns,
        &clock,
    )?;
    let mut admitted = 0;
    for _ in 0..12 {
        let v = l.check_all("c", 1).await.expect("cost 1 is valid");
        if v.decision.source != Source::Store {
            return Err(fail(format!(
                "a shadow quota that admits changed the source: {v:?}"
            )));
        }
        admitted += u64::from(v.allowed());
    }
    if admitted != 10 || l.stats().shadow_denials != 0 {
        return Err(fail(format!(
            "{admitted} of 12 admitted under an enforced 10 per minute, {} shadow denials from \
             a shadow quota of 30",
            l.stats().shadow_denials
        )));
    }
    let probe = limiter(
        &store,
        &[current, wide.clone()],
        &[true, false],
        &ns,
        &clock,
    )?;
    let over = probe.check_costs("c", &[1, 21]).await.expect("valid costs");
    let exact = probe.check_costs("c", &[1, 20]).await.expect("valid costs");
    if over.allowed()
        || over.quotas[1].allowed
        || !exact.allowed()
        || !exact.quotas[1].allowed
        || exact.quotas[1].remaining != 0
    {
        return Err(fail(format!(
            "the shadow quota `wide` (30 per minute) did not count exactly the 10 admitted \
             calls: enforcing it (and `current` in shadow mode) on the same keys, a cost of 21 \
             gives {over:?}, then a cost of 20 gives {exact:?} (expected `wide` to deny, then \
             to admit with nothing left)"
        )));
    }

    // 3. A limiter whose only quota is in shadow mode.
    let trial = named(Quota::fixed_window(Rate::per_minute(1)), "trial");
    let ns = namespace("shadow");
    let only = limiter(&store, std::slice::from_ref(&trial), &[true], &ns, &clock)?;
    let first = only.check("c").await;
    let d = only.check("c").await;
    if !first.allowed
        || first.source != Source::Store
        || !d.allowed
        || d.source != Source::Shadow
        || d.retry_after.is_some()
    {
        return Err(fail(format!(
            "a shadow-only limiter of 1 per minute answered {first:?}, then {d:?} (expected \
             admitted by the store, then admitted as Shadow with no retry_after)"
        )));
    }
    let h = only.headers(&d);
    if h.iter().count() != 0 {
        return Err(fail(format!("a shadow-only limiter sent headers: {h:?}")));
    }
    let probe = limiter(&store, std::slice::from_ref(&trial), &[false], &ns, &clock)?;
    let d = probe.check("c").await;
    if d.allowed || d.source != Source::Store {
        return Err(fail(format!(
            "the store does not show the shadow-only quota charged: enforcing it gives {d:?}"
        )));
    }
    Ok(report)
}

fn limiter(
    store: &Arc<dyn Store>,
    quotas: &[Quota],
    shadow: &[bool],
    namespace: &str,
    clock: &ManualClock,
) -> Result<Limiter, ControlViolation> {
    build(
        configure(
            Limiter::builder_arc(Arc::clone(store)),
            quotas,
            shadow,
            namespace,
            clock,
        ),
        Control::Shadow,
    )
}
